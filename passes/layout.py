"""The `layout` pass: NeoFlow's layout transformation (section 4), blocked channels.

Convolutions are found by their access pattern and their activations are stored blocked
along the channel: `NCHW -> NCHW[c]c`, `x[n, c, h, w]` at `x'[n, c // b, h, w, c % b]`. The
layout then propagates to every compute that reads a blocked tensor with a plain axis at the
blocked channel (ReLU, bias and batch-norm arithmetic, pooling, batch-norm statistics, the
next convolution's reduction), so a conversion happens only at the boundaries: a blocked
value read by something other than a compute (a function result) is unpacked once, and a
reader whose index at the channel is not a plain axis (a flatten) reads the blocked tensor
through `// b` and `% b`. Parameters whose every access becomes blocked (a convolution
weight `OIHW -> O/b I/b H W [i] [o]`, a depthwise weight `C/b 1 H W [c]`) are stored so
(weight pre-transformation, `weights=true`): the argument takes the blocked shape with
`nf.layout = {kind = "blocked", shape, dims, block}`, the optimizer updates the blocked form
and the artifact shows and checkpoints it under its own name and logical shape.

    Before:  %y = nf.compute [n: 8, o: 16, i: 6, j: 6] sum [c: 16, r: 3, s: 3]
                 (%x[n, c, i + r, j + s] * %k[o, c, r, s])          (%x blocked already)
             %z = nf.compute [n: 8, c: 16, h: 6, w: 6] (max(%y[n, c, h, w], 0.0))
    After:   %x_cols = nf.compute [n: 8, i: 6, j: 6, c_o: 1, r: 3, s: 3, c_i: 16]
                 (%x[n, c_o, i + r, j + s, c_i])
             %y = nf.compute [n: 8, o_o: 1, i: 6, j: 6, o_i: 16] sum [c_o: 1, c_i: 16, r: 3, s: 3]
                 (%x_cols[n, i, j, c_o, r, s, c_i] * %k[o_o, c_o, r, s, c_i, o_i])
             %z = nf.compute [n: 8, c_o: 1, h: 6, w: 6, c_i: 16] (max(%y[n, c_o, h, w, c_i], 0.0))

A blocked convolution gets its own im2col columns with the channel block innermost (a batched
GEMM over them, see `_columns`); a dense weight read with its rows split is split in place
(`W[C, M] -> W[C/b, b, M]`), so it stays a plain GEMM operand.

Gradients need nothing of their own: run before `training-functions`, autodiff
differentiates the blocked forward, so the backward computes read and write the blocked
layout too. Splitting `c` as `c_o * b + c_i` keeps the order of a sum in the interpreter; the
compiled GEMMs sum in their own order (results equal within rounding). docs/passes-builtin.md
has the rules, the measurements and why the vector-width block does not pay on the GEMM path.
"""

from __future__ import annotations

import functools
import hashlib
import os
import sys
from dataclasses import dataclass
from typing import ClassVar

from nfc.blocked import BLOCKED, blocked_shape
from nfc.ir import (
    Axis,
    Binary,
    ComputeOp,
    Const,
    Expr,
    Func,
    Index,
    Load,
    Module,
    TensorType,
    Value,
    index_names,
    substitute_indices,
)
from nfc.passmanager import Context, ModulePass
from nfc.simplify import simplify

__all__ = ["Layout", "auto_decision", "block_func", "default_block", "module_digest"]

#: Optimizers that update every element on its own, so a parameter stored blocked follows the
#: same trajectory element by element (as for `parallel-fusion{layout=true}`).
ELEMENTWISE_OPTIMIZERS = frozenset({"sgd", "adam", "adamw"})


@functools.cache
def default_block() -> int:
    """f32 lanes of the host's vector registers: 16 with AVX-512, 8 with AVX (the features
    LLVM reports, with `NFC_CPU_FEATURES` appended as the code generator reads them)."""
    try:
        import llvmlite.binding as llvm

        llvm.initialize_native_target()
        feats = llvm.get_host_cpu_features().flatten()
    except Exception:  # noqa: BLE001 - no LLVM: the narrowest common vector
        feats = ""
    extra = os.environ.get("NFC_CPU_FEATURES")
    if extra:
        feats += "," + extra
    state: dict[str, bool] = {}
    for item in feats.split(","):
        if item[:1] in "+-" and len(item) > 1:
            state[item[1:]] = item[0] == "+"
    if state.get("avx512f"):
        return 16
    return 8 if state.get("avx") else 4


@dataclass(frozen=True)
class Layout(ModulePass):
    """Store convolution activations blocked along the channel (`NCHW[c]c`) and propagate
    the layout through elementwise ops and reductions; convert at the boundaries only.

    With `weights=true` (before `training-functions`, elementwise optimizer) a parameter
    whose every access is blocked is stored blocked (`nf.layout = {kind = "blocked", ...}`);
    with `weights=false` such a parameter is packed by a compute at the start of each
    function instead (every step).
    """

    name: ClassVar[str] = "layout"

    block: str = "auto"
    """The block (the innermost, vectorised dimension): `auto` is the f32 lanes of the
    host's vector registers (16 with AVX-512, 8 with AVX2), or a positive integer."""
    weights: bool = True
    """Store a parameter read only in the blocked layout blocked across steps (weight
    pre-transformation); false: pack it every step."""
    min_channels: int = 0
    """Block only convolutions with at least this many output channels (0: the block)."""
    when: str = "always"
    """`always`: block what matches; `never`: do nothing; `auto` (the default build
    pipeline's): the choice `nfc tune` recorded for this model on this CPU (the
    `nfc.layout_choice` provider: off, or a block when `block=auto`), else the rule of
    `auto_decision` (measured: docs/passes-builtin.md)."""
    explain: bool = False
    """Print the decision of `when=auto` and its reasons to stderr."""
    db: str = ""
    """`when=auto`: the tuning cache holding `nfc tune`'s layout choices (empty: nfc's)."""

    def option_problem(self) -> tuple[str, str] | None:
        """(option, message) of a bad `when` or `block`, else None (reported at the option
        when the pipeline is read, `ModulePass.from_options`)."""
        if self.when not in WHEN:
            return "when", f"layout: when must be one of {', '.join(WHEN)}, got '{self.when}'"
        if self.block != "auto" and not (self.block.isdigit() and int(self.block) >= 1):
            return "block", (f"layout: block must be 'auto' or a positive integer, got "
                             f"'{self.block}'")
        return None

    def apply(self, ctx: Context, module: Module) -> None:
        """Block the convolutions of every function (see the module docstring); the remark
        says what was decided and why (printed to stderr with `explain=true`)."""
        bad = self.option_problem()  # (an instance made in Python, not from a pipeline)
        if bad is not None:
            ctx.error(bad[1])
            return
        ctx.remarks[self.name] = remark = self._run(module)
        if self.explain:
            print(f"layout: {remark}", file=sys.stderr)

    def _run(self, module: Module) -> str:
        b = default_block() if self.block == "auto" else int(self.block)
        if self.when == "never":
            return "when=never: nothing blocked"
        why = ""
        if self.when == "auto":
            b, why = self._decide(module, b)
            if b == 0:
                return why if why.startswith("off:") else f"off: {why}"
        if b == 1:
            return "block 1: nothing to do"
        total = 0
        for func in module.funcs:
            total += block_func(func, b, max(self.min_channels, b))
        laid: list[str] = []
        packed: list[str] = []
        if total:
            laid, packed = block_params(module, b, self.weights)
        return (f"block {b}: {total} computes blocked; parameters stored blocked: "
                f"{', '.join(laid) or 'none'}; packed per step: {', '.join(packed) or 'none'}"
                + (f" ({why})" if why else ""))

    def _decide(self, module: Module, b: int) -> tuple[int, str]:
        """`when=auto`: (the block, or 0 for off; why). A choice `nfc tune` recorded for this
        module wins (with `block=auto`; an explicit block only turns it on or off), else
        `auto_decision`."""
        tuned = tuned_choice(module, self.db or None)
        if tuned is not None:
            if tuned == "off":
                return 0, "nfc tune measured the model fastest without the layout"
            return (int(tuned) if self.block == "auto" else b,
                    f"nfc tune measured block {tuned} fastest for this model")
        on, why = auto_decision(module, b, max(self.min_channels, b))
        return (b if on else 0), why


@dataclass(frozen=True)
class ConvInfo:
    """A convolution of `@forward` as the rule of `when=auto` sees it."""

    name: str
    out_channels: int
    in_channels: int
    """The extent of the reduction axis at the input's channel (0: none, depthwise)."""
    macs: int
    """Multiply-adds: the result's size times the reduction's."""
    gemm: bool
    """A dense convolution with a window (im2col makes it a GEMM with K = C*R*S); false for
    1x1, grouped and depthwise ones."""
    from_arg: bool
    """Its input is a function argument (the image), which the pass never blocks."""


def conv_census(module: Module) -> list[ConvInfo]:
    """The convolutions of `@forward` (the first function when there is none), in order."""
    if not module.funcs:
        return []
    func = module.func("forward") if module.has_func("forward") else module.funcs[0]
    args = set(func.args)
    out: list[ConvInfo] = []
    for op in func.body.ops:
        if not isinstance(op, ComputeOp):
            continue
        body = simplify(op.body, _ranges(op.all_axes))
        if not _is_conv(op, body, 1, 0):
            continue
        macs = 1
        for a in op.all_axes:
            macs *= a.extent
        o = op.dims[1].name
        red = {a.name: a.extent for a in op.raxes}
        window, grouped, cin, from_arg = 1, False, 0, False
        for ld in _loads(body):
            if len(ld.indices) == 4 and ld.indices[0] == Index(o):  # the weight
                names = index_names(ld.indices[1])
                grouped = o in names or not isinstance(ld.indices[1], Index)
                for e in ld.indices[2:]:
                    for n in index_names(e):
                        window *= red.get(n, 1)
            elif len(ld.indices) >= 2:  # the input
                e = ld.indices[1]
                cin = red.get(e.name, 0) if isinstance(e, Index) else 0
                from_arg = from_arg or ld.tensor in args
        out.append(ConvInfo(op.result.name or "?", op.dims[1].extent, cin, macs,
                            window > 1 and not grouped, from_arg))
    return out


#: `when=auto`'s thresholds, fitted to the seed models' measurements (docs/passes-builtin.md,
#: "layout"): the share of convolution multiply-adds above which the layout is not chosen.
PARTIAL_SHARE = 0.05
"""... in convolutions whose output channels are no multiple of the block (left NCHW, so the
layout converts between them and their blocked neighbours: LeNet-5's 6 channels, ShuffleNet's
8-channel grouped convolution)."""
BLOCKED_GEMM_SHARE = 0.75
"""... in dense windowed convolutions whose input would be blocked too: the blocked im2col
GEMM (`_columns`) whose N is the channel block, where the NCHW GEMM vectorises along the
image (ResNet-18)."""


def auto_decision(module: Module, b: int, min_channels: int | None = None
                  ) -> tuple[bool, str]:
    """The rule of `when=auto` without a tuned choice: (block or not, why). See
    `PARTIAL_SHARE` and `BLOCKED_GEMM_SHARE`; on otherwise (pooling, batch norm,
    concatenations, depthwise and 1x1 convolutions and short or odd feature maps, where the
    blocked layout vectorises along 16 contiguous channels)."""
    convs = conv_census(module)
    if not convs:
        return False, "off: no convolution"
    total = sum(c.macs for c in convs) or 1
    lim = b if min_channels is None else max(min_channels, b)
    ok = [c.out_channels % b == 0 and c.out_channels >= lim for c in convs]
    partial = sum(c.macs for c, k in zip(convs, ok, strict=True) if not k) / total
    gemm = sum(c.macs for c, k in zip(convs, ok, strict=True)
               if k and c.gemm and not c.from_arg and c.in_channels % b == 0) / total
    facts = (f"block {b}, {len(convs)} convolutions; multiply-adds in ones with channels no "
             f"multiple of {b}: {partial:.0%}, in blocked im2col GEMMs: {gemm:.0%}")
    if partial > PARTIAL_SHARE:
        return False, f"off: {facts} (over {PARTIAL_SHARE:.0%}: mixed layouts)"
    if gemm > BLOCKED_GEMM_SHARE:
        return False, f"off: {facts} (over {BLOCKED_GEMM_SHARE:.0%}: GEMM-bound)"
    return True, f"on: {facts}"


#: The values of `when`.
WHEN = ("auto", "always", "never")

#: Entry-point group of the functions `(module digest) -> "off" | "<block>" | None` that look
#: up a layout choice recorded by `nfc tune` (nfc.runtime registers the tuning cache's lookup;
#: passes may not import the runtime).
CHOICE_PROVIDERS_GROUP = "nfc.layout_choice"


def module_digest(module: Module) -> str:
    """The SHA-256 of `module` printed without locations: the key of its recorded choice."""
    from nfc.printer import print_module

    return hashlib.sha256(print_module(module, locs=False).encode()).hexdigest()


def tuned_choice(module: Module, db: str | None = None) -> str | None:
    """The layout choice recorded for `module` on this machine (in the tuning cache `db`,
    None: nfc's) by the first provider that has one (`off` or a block), else None (also when
    a provider fails)."""
    from importlib.metadata import entry_points

    eps = sorted(entry_points(group=CHOICE_PROVIDERS_GROUP), key=lambda e: e.name)
    if not eps:
        return None
    digest = module_digest(module)
    for ep in eps:
        try:
            found = ep.load()(digest, db)
        except Exception:  # noqa: BLE001 - a lookup never fails a build: the rule decides
            found = None
        if isinstance(found, str) and (found == "off" or found.isdigit()):
            return found
    return None


# ---------------------------------------------------------------------------------------------
# activations


def _is_conv(op: ComputeOp, body: Expr, b: int, min_channels: int) -> bool:
    """A convolution (or a depthwise one) with a blockable output channel: a sum over a
    4-d result `[n, o, i, j]` with `o` a multiple of `b`, reading a 4-d tensor (the
    weight) with `o` as its first index and a 4-d tensor at a reduction axis or `o` as its
    channel (the input)."""
    if op.reduce != "sum" or len(op.dims) != 4 or not op.raxes:
        return False
    o = op.dims[1]
    if o.extent % b or o.extent < min_channels:
        return False
    red = {a.name for a in op.raxes}
    weight = inp = False
    for ld in _loads(body):
        if len(ld.indices) == 4 and ld.indices[0] == Index(o.name):
            weight = True
        elif len(ld.indices) >= 2 and isinstance(ld.indices[1], Index) and (
                ld.indices[1].name in red or ld.indices[1].name == o.name):
            inp = True
    return weight and inp


def _loads(e: Expr) -> list[Load]:
    return [x for x in e.walk() if isinstance(x, Load)]


def _fresh(base: str, taken: set[str]) -> str:
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}{k}"
    taken.add(name)
    return name


def _ranges(axes: tuple[Axis, ...]) -> dict[str, tuple[int, int]]:
    return {a.name: (0, a.extent - 1) for a in axes}


def blocked_load(ld: Load, new: Value, dim: int, b: int) -> Load:
    """`ld` of the logical tensor as a load of its blocked form `new` (blocked at `dim`)."""
    idx = list(ld.indices)
    e = idx[dim]
    idx[dim] = Binary("//", e, Const(b))
    idx.append(Binary("%", e, Const(b)))
    return Load(new, tuple(idx))


def unpack_op(new: Value, shape: tuple[int, ...], dim: int, b: int, loc: object,
              name: str | None) -> ComputeOp:
    """`nf.compute [d0.., dk..] (%new[d0, .., dk // b, .., dk % b])`: the logical tensor."""
    dims = tuple(Axis(f"d{k}", n) for k, n in enumerate(shape))
    ld = Load(new, tuple(Index(a.name) for a in dims))
    body = simplify(blocked_load(ld, new, dim, b), _ranges(dims))
    return ComputeOp(TensorType(tuple(shape), new.dtype), dims, body,
                     loc=loc, name=name)  # type: ignore[arg-type]


def _block_guards(body: Expr, b: int, rng: dict[str, tuple[int, int]]) -> Expr:
    """Comparisons `e < K` and `e >= K` with `K` a multiple of `b` as `e // b < K / b` (the
    same for every integer `e`) where `e // b` has no division left: a concatenation's guard
    `16 * c_o + c_i < 64` becomes `c_o < 4`, which the bounds proof of the parts needs."""

    def fn(e: Expr) -> Expr | None:
        if (isinstance(e, Binary) and e.op in ("<", ">=") and isinstance(e.b, Const)
                and isinstance(e.b.value, int) and not isinstance(e.b.value, bool)
                and e.b.value % b == 0 and not isinstance(e.a, Const)):
            q = simplify(Binary("//", e.a, Const(b)), rng)
            if not any(isinstance(x, Binary) and x.op in ("//", "%") for x in q.walk()):
                return Binary(e.op, q, Const(e.b.value // b))
        return None

    return body.map(fn)


#: The largest column tensor `_columns` makes (as nfc.passes.im2col's default).
MAX_COLUMNS = 1 << 26


def _columns(func: Func, body: Expr, dims: tuple[Axis, ...], raxes: tuple[Axis, ...],
             inner: list[str], op: ComputeOp) -> tuple[ComputeOp, Expr] | None:
    """For a blocked convolution `sum (F * %w[..])` (its input channel split, `inner` the
    split axes' inner parts): the columns `%cols[n, i, j, c_o, r, s, c_i] = F` and the new
    body `%cols[..] * %w[..]`, a batched GEMM (M = the spatial axes, K = the reduction in
    the weight's blocked order, N = the output channel block) whose columns are gathered
    with the channel block innermost, as the activations are stored. nfc.passes.im2col would
    order them `[n, c_o, c_i, r, s, i, j]` instead, a transposing gather from `NCHW[c]c`
    (and a transposing scatter in the gradient). None when `body` is not such a product."""
    if not isinstance(body, Binary) or body.op != "*":
        return None
    args = set(func.args)
    for w_first in (True, False):
        w, f = (body.a, body.b) if w_first else (body.b, body.a)
        if isinstance(w, Load) and w.tensor in args:
            break
    else:
        return None
    if any(not isinstance(e, (Index, Const, Binary)) or _loads(e) for e in w.indices):
        return None
    if isinstance(f, Load) and all(isinstance(e, (Index, Const)) for e in f.indices):
        return None  # plain already (a 1x1 convolution, a dense layer): a GEMM as it is
    fn, wn = index_names(f), index_names(w)
    red = [a.name for a in raxes]
    if any(r not in fn or r not in wn for r in red):
        return None
    out = [a for a in dims if a.name in fn]
    if any(a.name in wn for a in out):
        return None  # a grouped or depthwise convolution: no GEMM
    order: list[str] = []
    for e in w.indices:
        for name in sorted(index_names(e) & set(red), key=red.index):
            if name not in inner and name not in order:
                order.append(name)
    order += [n for n in inner if n not in order]
    order += [n for n in red if n not in order]
    by_name = {a.name: a for a in raxes}
    cdims = tuple(out) + tuple(by_name[n] for n in order)
    size = 1
    for a in cdims:
        size *= a.extent
    if size > MAX_COLUMNS:
        return None
    name = f"{f_name(f)}_cols"
    cols = ComputeOp(TensorType(tuple(a.extent for a in cdims), op.result.dtype), cdims, f,
                     loc=op.loc, attrs={"nf.im2col": True}, name=name)
    ld = Load(cols.result, tuple(Index(a.name) for a in cdims))
    return cols, (Binary("*", w, ld) if w_first else Binary("*", ld, w))


def f_name(f: Expr) -> str:
    """The name of the first tensor `f` loads (for the columns' name)."""
    lds = _loads(f)
    return (lds[0].tensor.name or "x") if lds else "x"


def block_func(func: Func, b: int, min_channels: int | None = None) -> int:
    """Block the convolutions of `func`'s top-level block and propagate the layout; the
    number of computes whose result is blocked."""
    min_channels = b if min_channels is None else min_channels
    blocked: dict[Value, tuple[Value, int]] = {}  # old value -> (blocked value, dim)
    replaced: list[tuple[ComputeOp, ComputeOp]] = []
    ops = list(func.body.ops)
    for op in ops:
        if not isinstance(op, ComputeOp):
            continue
        reads = [ld for ld in _loads(op.body) if ld.tensor in blocked]
        # (the frontend's grouped-convolution indices, `o // 16 * 6 + c`, simplified)
        sbody = simplify(op.body, _ranges(op.all_axes))
        out_dim = None
        if _is_conv(op, sbody, b, min_channels):
            out_dim = 1
        else:
            names = [a.name for a in op.dims]
            for ld in reads:
                nv, dim = blocked[ld.tensor]
                e = ld.indices[dim]
                if isinstance(e, Index) and e.name in names:
                    d = names.index(e.name)
                    if op.dims[d].extent % b == 0:
                        out_dim = d
                        break
        if out_dim is None and not reads:
            continue
        reads = [ld for ld in _loads(sbody) if ld.tensor in blocked]
        # the axes to split: the blocked output axis and every reduction axis read plainly
        # at a blocked channel
        split: set[str] = set()
        if out_dim is not None:
            split.add(op.dims[out_dim].name)
        red = {a.name: a for a in op.raxes}
        for ld in reads:
            e = ld.indices[blocked[ld.tensor][1]]
            if isinstance(e, Index) and e.name in red and red[e.name].extent % b == 0:
                split.add(e.name)
        taken = {a.name for a in op.all_axes} | index_names(sbody)
        subst: dict[str, Expr] = {}
        pieces: dict[str, tuple[Axis, Axis]] = {}
        for a in op.all_axes:
            if a.name in split:
                ao = Axis(_fresh(f"{a.name}_o", taken), a.extent // b)
                ai = Axis(_fresh(f"{a.name}_i", taken), b)
                pieces[a.name] = (ao, ai)
                subst[a.name] = Binary("+", Binary("*", Index(ao.name), Const(b)),
                                       Index(ai.name))
        dims: list[Axis] = []
        for a in op.dims:
            dims.append(pieces[a.name][0] if a.name in pieces else a)
        if out_dim is not None:
            dims.append(pieces[op.dims[out_dim].name][1])
        raxes: list[Axis] = []
        for a in op.raxes:
            raxes.extend(pieces.get(a.name, (a,)))
        body = substitute_indices(sbody, subst) if subst else sbody

        def relayout(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.tensor in blocked:
                nv, dim = blocked[e.tensor]
                inner = Load(nv, tuple(x.map(relayout) for x in e.indices))
                return blocked_load(inner, nv, dim, b)
            return None

        rng = _ranges(tuple(dims) + tuple(raxes))
        body = _block_guards(simplify(body.map(relayout), rng), b, rng)
        if out_dim is None and not pieces:
            op.body = body  # only its loads change
            continue
        inner = [pieces[a.name][1].name for a in op.raxes if a.name in pieces]
        cols = _columns(func, body, tuple(dims), tuple(raxes), inner, op) \
            if op.reduce == "sum" and inner else None
        if cols is not None:
            func.body.insert_before(cols[0], op)
            body = cols[1]
        shape = tuple(a.extent for a in dims)
        new = ComputeOp(TensorType(shape, op.result.dtype), tuple(dims), body,
                        reduce=op.reduce, raxes=tuple(raxes), loc=op.loc,
                        attrs=dict(op.attrs), name=op.result.name)
        func.body.insert_before(new, op)
        replaced.append((op, new))
        if out_dim is not None:
            blocked[op.result] = (new.result, out_dim)
        else:  # reduction axes split, the result keeps its layout
            op.result.replace_all_uses_with(new.result)
    # what still reads an old value (function results, calls) reads it unpacked
    olds = {old for old, _ in replaced}
    for old, new in replaced:
        if old.result in blocked and any(u not in olds for u in old.result.uses):
            _, dim = blocked[old.result]
            un = unpack_op(new.result, old.result.shape, dim, b, old.loc, old.result.name)
            func.body.insert_after(un, new)
            old.result.replace_uses_with_if(un.result, lambda u: u not in olds)
    for old, _ in reversed(replaced):
        func.body.erase(old)
    return sum(1 for old, _ in replaced if old.result in blocked)


# ---------------------------------------------------------------------------------------------
# parameters


def _optimizer_ok(module: Module) -> bool:
    opt = module.attrs.get("nf.optimizer")
    if opt is None:
        return True
    return isinstance(opt, dict) and str(opt.get("name", "")).lower() in ELEMENTWISE_OPTIMIZERS


def _param_dims(arg: Value, funcs: list[Func], b: int) -> tuple[list[int], list[int]] | None:
    """The dims of parameter `arg` (by name in `funcs`) that every load reads blocked (its
    index `// b` and `% b` simplify to no division): those whose inner index is an output
    axis of the reading compute (a convolution's output channel, the vectorised axis) move
    their inner block to the end; those read by a reduction axis (an input channel, a dense
    weight's rows) are split in place, so the operand stays a plain GEMM operand (`W[K, M]`
    as `W[K/b, b, M]`). None when no dim is read blocked. (Blocking a vector `[C]` as
    `[C/b, b]` moves nothing in memory, but its gradient then is computed over the split
    axes, reading the blocked activations without a division.)"""
    users: list[tuple[ComputeOp, Load]] = []
    for f in funcs:
        a = next((x for x in f.args if x.name == arg.name), None)
        if a is None:
            continue
        for op in a.uses:
            if not isinstance(op, ComputeOp) or op.parent is not f.body:
                return None
            users += [(op, ld) for ld in _loads(op.body) if ld.tensor is a]
    if not users:
        return None
    moved: list[int] = []
    split: list[int] = []
    for d, n in enumerate(arg.shape):
        if n % b:
            continue
        kinds = set()
        for op, ld in users:
            rng = _ranges(op.all_axes)
            q = simplify(Binary("//", ld.indices[d], Const(b)), rng)
            r = simplify(Binary("%", ld.indices[d], Const(b)), rng)
            if any(isinstance(x, Binary) and x.op in ("//", "%") for e in (q, r)
                   for x in e.walk()):
                kinds.add("bad")
                break
            out = {a.name for a in op.dims}
            kinds.add("out" if index_names(r) & out else "red")
        if kinds == {"out"}:
            moved.append(d)
        elif kinds == {"red"}:
            split.append(d)
    if not moved and not split:
        return None
    # an input channel followed by window axes (a convolution weight `[O, C, R, S]`): its
    # block moves to the end too, next to the output channel's (`O/b C/b R S [c] [o]`),
    # the order in which `_columns` gathers the reduction
    op, ld = users[0]
    red = {a.name for a in op.raxes}
    for d in list(split):
        if any(index_names(ld.indices[k]) & red for k in range(d + 1, len(ld.indices))):
            split.remove(d)
            moved.append(d)

    def by_reduction(d: int) -> tuple[int, int]:
        r = simplify(Binary("%", ld.indices[d], Const(b)), _ranges(op.all_axes))
        return (0 if index_names(r) & red else 1, d)

    return sorted(moved, key=by_reduction), split


def _blocked_param_load(ld: Load, new: Value, dims: list[int], split: list[int],
                        b: int) -> Load:
    idx: list[Expr] = []
    for k, e in enumerate(ld.indices):
        if k in dims:
            idx.append(Binary("//", e, Const(b)))
        elif k in split:
            idx += [Binary("//", e, Const(b)), Binary("%", e, Const(b))]
        else:
            idx.append(e)
    idx += [Binary("%", ld.indices[d], Const(b)) for d in dims]
    return Load(new, tuple(idx))


def _reload(func: Func, old: Value, new: Value, dims: list[int], split: list[int],
            b: int) -> None:
    """Every load of `old` in `func` as a load of its blocked form `new`."""
    for op in list(old.uses):
        if not isinstance(op, ComputeOp):
            continue
        rng = _ranges(op.all_axes)
        op.body = simplify(op.body.map(
            lambda e: _blocked_param_load(e, new, dims, split, b)
            if isinstance(e, Load) and e.tensor is old else None), rng)


def block_params(module: Module, b: int, store: bool) -> tuple[list[str], list[str]]:
    """Lay out the parameters every access of which is blocked: stored blocked (`store`,
    before `training-functions` with an elementwise optimizer) or packed by a compute at the
    start of each function. The names stored and the names packed."""
    funcs = list(module.funcs)
    if not funcs:
        return [], []
    can_store = (store and not module.has_func("train_step") and module.has_func("forward")
                 and _optimizer_ok(module))
    first = module.func("forward") if module.has_func("forward") else funcs[0]
    laid: list[str] = []
    packed: list[str] = []
    for arg, attrs in zip(list(first.args), list(first.arg_attrs), strict=True):
        if attrs.get("nf.role") != "param" or "nf.layout" in attrs or not arg.name:
            continue
        found = _param_dims(arg, funcs, b)
        if found is None:
            continue
        dims, split = found
        shape = blocked_shape(arg.shape, dims, b, split)
        if can_store and attrs.get("nf.trainable", True) is not False:
            layout: dict[str, object] = {"kind": BLOCKED, "shape": list(arg.shape),
                                         "dims": dims, "block": b}
            if split:
                layout["split"] = split
            for f in funcs:
                pos = next((k for k, x in enumerate(f.args) if x.name == arg.name), None)
                if pos is None:
                    continue
                old = f.args[pos]
                new = Value(TensorType(shape, old.dtype), old.name)
                _reload(f, old, new, dims, split, b)
                f.args = [*f.args[:pos], new, *f.args[pos + 1:]]
                at = dict(f.arg_attrs[pos])
                at["nf.layout"] = dict(layout)
                f.arg_attrs = [*f.arg_attrs[:pos], at, *f.arg_attrs[pos + 1:]]
            laid.append(arg.name)
            continue
        for f in funcs:
            old = next((x for x in f.args if x.name == arg.name), None)
            if old is None or not old.has_uses:
                continue
            if not dims:
                continue  # split in place only: a reshape, nothing to pack
            pk = _pack_op(old, dims, b, f.loc)
            _reload(f, old, pk.result, dims, [], b)
            f.body.insert_before(pk, f.body.ops[0])
        packed.append(arg.name)
    return laid, packed


def _pack_op(old: Value, dims: list[int], b: int, loc: object) -> ComputeOp:
    """`%p' = nf.compute [..] (%p[..])`: the parameter in its blocked layout."""
    shape = blocked_shape(old.shape, dims, b)
    axes = tuple(Axis(f"d{k}", n) for k, n in enumerate(shape))
    idx: list[Expr] = []
    inner = {d: len(old.shape) + j for j, d in enumerate(dims)}
    for k in range(len(old.shape)):
        if k in dims:
            idx.append(Binary("+", Binary("*", Index(axes[k].name), Const(b)),
                              Index(axes[inner[k]].name)))
        else:
            idx.append(Index(axes[k].name))
    return ComputeOp(TensorType(shape, old.dtype), axes,
                     simplify(Load(old, tuple(idx)), _ranges(axes)),
                     loc=loc, name=f"{old.name}_packed")  # type: ignore[arg-type]


#: What `with_layout` puts before the model pipeline (the pass simplifies the bodies it
#: matches itself: a cleanup before it would keep `im2col` from a 1-channel convolution).
LAYOUT_PIPELINE = "layout"


def with_layout(pipeline: str, options: str = "") -> str:
    """`pipeline` with `LAYOUT_PIPELINE` (the pass with `options`, e.g. `block=16`; `when`
    defaults to `always`) before its first `im2col` or `training-functions`, whichever comes
    first; a `layout` pass it runs already (the default build pipeline's `layout{when=auto}`)
    is replaced in place; unchanged when it has none of these passes."""
    from nfc.passmanager import build_pipeline, format_pipeline

    passes = build_pipeline(pipeline)
    names = [p.name for p in passes]
    extra = build_pipeline(LAYOUT_PIPELINE + (f"{{{options}}}" if options else ""))
    if "layout" in names:
        return format_pipeline([extra[0] if p.name == "layout" else p for p in passes])
    at = [names.index(n) for n in ("im2col", "training-functions") if n in names]
    if not at:
        return pipeline
    k = min(at)
    return format_pipeline([*passes[:k], *extra, *passes[k:]])
