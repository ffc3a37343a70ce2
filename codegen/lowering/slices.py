"""Batch slices: two stages of a group run per batch element, so that the temporary between
them is one element large.

The input gradient of a convolution over im2col columns is a column GEMM and the scatter
back to the image (col2im), fused into one kernel:

    %dcols = nf.compute [n, c, r, s, i, j] sum [o] (%dy[n, o, i, j] * %k[o, c, r, s])
    %dx    = nf.compute [n, c, h, w] sum [r_, s_] (select(..., %dcols[n, c, .., .., .., ..]))

`%dcols` is the columns' size (CapsNet's primary capsules: 91 MiB at batch 32), and nothing
but `%dx` reads it. Both stages are indexed by the batch `n` outermost, and every element of
either reads only element `n` of the batch-indexed tensors, so the group can run
`for n: dcols = GEMM(image n); dx[n] = col2im(dcols)` with a one-image `%dcols`
(`slice_stages`). Each sliced stage is the stage with its batch axis of extent 1 (`one_image`)
and its full-batch schedule (which must not split that axis), so every sum adds the same terms
in the same order: the results are bit for bit those of the whole stages. In the loop IR the
sliced nests are wrapped in a serial loop over the batch and their loads and stores of batch
tensors offset by it (`lower_slice`); the artifact's composite calls the one-image stage
kernels in that loop with pointers into the batch tensors (nfc.codegen.artifact.kernels).

Only temporaries of at least `SLICE_BYTES` are sliced: smaller groups lower exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

from nfc.codegen.loops import (
    Allocate,
    Buffer,
    BufLoad,
    For,
    If,
    LoopKind,
    Seq,
    Stmt,
    Store,
    unique_name,
)
from nfc.codegen.lowering.axes import ScheduleError
from nfc.codegen.schedule import Schedule
from nfc.ir import Axis, Binary, ComputeOp, Const, Expr, Index, Load, TensorType, Value

__all__ = ["SLICE_BYTES", "BatchSlice", "lower_slice", "slice_stages"]

#: Temporaries between two stages of at least this many bytes are computed per batch element
#: when the stages allow it (module docstring).
SLICE_BYTES = 16 << 20


@dataclass
class BatchSlice:
    """Stages run per batch element: the one-image stages with their schedules, the batch
    extent, and the full tensor each one-image value is a slice of (by id of the one-image
    value; the temporaries between the stages are not slices)."""

    extent: int
    stages: list[tuple[ComputeOp, Schedule]]
    sliced: dict[int, Value] = field(default_factory=dict)
    whole: list[tuple[ComputeOp, Schedule]] = field(default_factory=list)
    """The stages as they are, whole batch."""


def slice_stages(stages: Sequence[tuple[ComputeOp, Schedule]], outputs: Sequence[Value]
                 ) -> list[tuple[ComputeOp, Schedule] | BatchSlice]:
    """`stages` (each with its resolved schedule) with every pair that can run per batch
    element (module docstring) replaced by its `BatchSlice`, at the first stage's place (the
    second moves up to it: no stage between them makes what it reads, and none reads what it
    makes, as they come before it)."""
    out_ids = {id(v) for v in outputs}
    rest = list(stages)
    items: list[tuple[ComputeOp, Schedule] | BatchSlice] = []
    while rest:
        first = rest.pop(0)
        readers = [j for j, (st, _) in enumerate(rest) if first[0].result in st.operands]
        if len(readers) == 1:
            j = readers[0]
            made = {id(st.result) for st, _ in rest[:j]}
            bs = None if any(id(v) in made for v in rest[j][0].operands) else _pair(
                first, rest[j], out_ids)
            if bs is not None:
                items.append(bs)
                del rest[j]
                continue
        items.append(first)
    return items


def _pair(first: tuple[ComputeOp, Schedule], second: tuple[ComputeOp, Schedule],
          out_ids: set[int]) -> BatchSlice | None:
    (a, sa), (b, sb) = first, second
    t = a.result
    if id(t) in out_ids or t.type.nbytes < SLICE_BYTES or not a.dims or not b.dims:
        return None
    n = a.dims[0].extent
    if n < 2 or b.dims[0].extent != n:
        return None
    for op, s in ((a, sa), (b, sb)):
        ax = op.dims[0].name
        if any(sp.axis == ax for sp in s.splits) or s.parallel_reduce:
            return None
    ta = _batch_tensors(a)
    tb = _batch_tensors(b)
    if ta is None or tb is None or id(t) not in tb:
        return None
    bs = BatchSlice(n, [], whole=[first, second])
    slices: dict[int, Value] = {}

    def piece(v: Value) -> Value:
        if id(v) not in slices:
            one = Value(TensorType((1, *v.shape[1:]), v.type.dtype), v.name)
            slices[id(v)] = one
            bs.sliced[id(one)] = v
        return slices[id(v)]
    a1 = one_image(a, {id(v): piece(v) for v in ta.values()}, None)
    b1 = one_image(b, {**{id(v): piece(v) for v in tb.values() if v is not t},
                       id(t): a1.result}, piece(b.result))
    bs.stages = [(a1, sa), (b1, sb)]
    return bs


def _batch_tensors(op: ComputeOp) -> dict[int, Value] | None:
    """The tensors `op` reads at its batch index (its first axis, as the plain first index of
    every load, and nowhere else), by id; None when a tensor is read otherwise as well."""
    ax = op.dims[0].name
    n = op.dims[0].extent
    batch: dict[int, Value] = {}
    other: set[int] = set()
    for ld in op.body.walk():
        if not isinstance(ld, Load):
            continue
        names = [{x.name for x in ix.walk() if isinstance(x, Index)} for ix in ld.indices]
        if not any(ax in s for s in names):
            other.add(id(ld.tensor))
            continue
        if (ld.indices[0] != Index(ax) or any(ax in s for s in names[1:])
                or ld.tensor.shape[0] != n):
            return None
        batch[id(ld.tensor)] = ld.tensor
    return None if other & set(batch) else batch


def one_image(op: ComputeOp, pieces: dict[int, Value], result: Value | None) -> ComputeOp:
    """`op` with its batch axis of extent 1, reading `pieces[id(v)]` for each batch tensor
    `v`; its result value is `result` when given (a slice of `op`'s), else a new one."""
    dims = (Axis(op.dims[0].name, 1), *op.dims[1:])

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and id(e.tensor) in pieces:
            return Load(pieces[id(e.tensor)], e.indices)
        return None
    new = ComputeOp(TensorType((1, *op.result.shape[1:]), op.result.type.dtype), dims,
                    op.body.map(fn), reduce=op.reduce, raxes=op.raxes, loc=op.loc,
                    attrs={k: v for k, v in op.attrs.items() if k != "nf.schedule"},
                    name=op.result.name)
    if result is not None:
        new.results[0] = result
    return new


def lower_slice(bs: BatchSlice, bufs: dict[int, Buffer], temps: list[Buffer], used: set[str],
                lower_one: Callable[[ComputeOp, Schedule, dict[int, Buffer]], Stmt]) -> Stmt:
    """The loop IR of a batch slice: a serial loop over the batch around the one-image
    stages' nests (`lower_one(stage, schedule, bufs)`), whose accesses to the batch tensors'
    buffers are offset by the loop. `bufs` gains the buffers of the stages' results (the
    temporaries join `temps`). Raises ScheduleError when a nest reads a slice in a shape
    the offset cannot follow."""
    var = unique_name("nb", used, "nb")
    full: dict[str, Buffer] = {}
    local = dict(bufs)

    def view(vid: int, v: Value) -> None:
        full[bufs[id(v)].name] = bufs[id(v)]
        local[vid] = replace(bufs[id(v)], shape=(1, *v.shape[1:]))
    for vid, v in bs.sliced.items():
        if id(v) in bufs:  # an input of the slice, or an output of the group
            view(vid, v)
    stmts = []
    for st, s in bs.stages:
        res = st.result
        if id(res) not in local:  # a group temporary: whole, or the one-image one
            v = bs.sliced.get(id(res), res)
            tb = Buffer(unique_name(v.name or "tmp", used, "tmp"), v.shape, v.type.dtype)
            temps.append(tb)
            bufs[id(v)] = tb
            if v is res:
                local[id(res)] = tb
            else:
                view(id(res), v)
        stmts.append(_offset(lower_one(st, s, local), full, Index(var)))
    return For(var, Const(bs.extent), LoopKind.SERIAL, Seq(tuple(stmts)))


def _offset(s: Stmt, full: dict[str, Buffer], nb: Expr) -> Stmt:
    """`s` with every access to a one-image view of a buffer in `full` made an access to the
    whole buffer at batch element `nb`."""
    def acc(buf: Buffer, idx: tuple[Expr, ...]) -> tuple[Buffer, tuple[Expr, ...]]:
        whole = full.get(buf.name)
        if whole is None:
            return buf, idx
        per = whole.size // whole.shape[0]
        if buf.shape and buf.shape[0] == 1 and buf.size == per:
            return replace(buf, shape=(whole.shape[0], *buf.shape[1:])), (
                Binary("+", nb, idx[0]), *idx[1:])
        if len(buf.shape) == 1 and buf.size == per:
            return replace(buf, shape=(whole.size,)), (
                Binary("+", Binary("*", nb, Const(per)), idx[0]),)
        raise ScheduleError(f"a batch slice reads '{buf.name}' as {buf.shape}")

    def ex(e: Expr) -> Expr:
        def fn(x: Expr) -> Expr | None:
            if isinstance(x, BufLoad):
                buf, idx = acc(x.buffer, tuple(ex(i) for i in x.indices))
                return BufLoad(buf, idx)
            return None
        return e.map(fn)

    def st(s: Stmt) -> Stmt:
        if isinstance(s, Seq):
            return Seq(tuple(st(c) for c in s.body))
        if isinstance(s, For):
            return For(s.var, ex(s.extent), s.kind, st(s.body))
        if isinstance(s, Store):
            buf, idx = acc(s.buffer, tuple(ex(i) for i in s.indices))
            return Store(buf, idx, ex(s.value), s.reduce)
        if isinstance(s, If):
            return If(ex(s.cond), st(s.then), None if s.orelse is None else st(s.orelse))
        if isinstance(s, Allocate):
            if s.buffer.name in full:
                raise ScheduleError(f"a batch slice allocates '{s.buffer.name}'")
            return Allocate(s.buffer, st(s.body))
        return s
    return st(s)
