"""Contractions: computes `out[..] = sum A[..] * B[..]` over plain loads, seen as batched GEMMs.

A compute is a *contraction* when its body is the product of two loads of distinct tensors,
each indexed by distinct axes only (`A[n, o, y, x]`, no arithmetic; a dimension of extent 1
may be indexed by the constant 0, as canonicalization leaves a 1 x 1 convolution's window
axes: such a dimension is dropped from the view, `squeezed`; a load of an f16/bf16 tensor
may be widened by a cast, `f32(%a16[i, k])`, as nfc.passes.precision writes mixed-precision
products: `widened_load`), and every reduction axis indexes both. Its axes then fall into roles:

- `j`: the trailing run of output axes that only B indexes (B is the operand holding the
  output's last axis), adjacent and in the same order in B;
- `i`: a run of output axes that only A indexes, adjacent and in the same order in the output
  and in A (the longest; the later of equals);
- `k`: a run of reduction axes adjacent and in the same order in A and in B (the longest);
- `kouter`: the other reduction axes, `batch`: the other output axes (indexing A, B or both).

Because the tensors are row-major, a run of adjacent dimensions is one dimension of a reshaped
view, so a contraction is a batch of GEMMs `C[m, n] += sum_k A[m, k] * B[k, n]` (m = the `i`
run flattened, n = the `j` run, k = the `k` run) accumulated over `kouter`. `flatten` builds
that view: the same compute over merged axes and reshaped operands, which the code generator
lowers with its GEMM template and the fusion pass protects. A convolution becomes one once its
input is gathered into columns (nfc.passes.im2col): forward, weight and input gradients alike.

With `implicit=True` (the CPU code generator asks for it), in a compute marked `nf.implicit`
(nfc.passes.im2col marks the GEMMs it substitutes implicit columns into; other direct
convolutions keep the loop template), one factor may instead be a *gather*:
an elementwise expression of loads through affine indices, such as a convolution's window read
`select(guard, %x[n, c, 2*i + r - 1, 2*j + s - 1], 0.0)`. It is matched as a load of a virtual
operand, a `GatherView` whose dimensions are the axes it reads, ordered as nfc.passes.im2col
orders its columns (output axes the other factor also reads, the gather's own output axes
outside their longest run, the reduction axes in the other factor's order, that run), whose
element is the expression: the im2col columns, never materialised (an `nf.implicit` attribute
listing the axes in another order, as nfc.passes.im2col leaves on the GEMMs it substitutes
columns into, gives the order: theirs). The code generator packs
its GEMM panels straight from the image (nfc.codegen.lowering.packing) or, unpacked, reads the
expression in place.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from nfc.ir import (
    Axis,
    Binary,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Index,
    Load,
    TensorType,
    Value,
    index_names,
    substitute_indices,
)

__all__ = ["Contraction", "FlatContraction", "GatherView", "flatten", "gather_views",
           "longest_run", "match_contraction", "plain_names", "squeezed_names",
           "widened_load"]


class GatherView(Value):
    """A virtual operand of an implicit contraction (module docstring): element
    `[names...]` is `expr`, an elementwise expression over the axis names `names` (the view's
    dimensions, in order). Never stored: the code generator evaluates `element` where it would
    load, in the fill of its panels or in place."""

    __slots__ = ("expr", "inner", "names")

    def __init__(self, type: TensorType, names: Sequence[str], expr: Expr,
                 name: str | None = None, inner: Sequence[int] | None = None) -> None:
        super().__init__(type, name)
        self.names = tuple(names)
        self.expr = expr
        self.inner = tuple(inner) if inner is not None else type.shape
        """Per dimension, the extent of the innermost axis merged into it (a dimension
        `gn` of the runs `[i, j]` is split as `gn // J`, `gn % J`: J), else its extent."""

    def element(self, indices: Sequence[Expr]) -> Expr:
        """The expression of the element at `indices` (one per dimension)."""
        return substitute_indices(self.expr, dict(zip(self.names, indices, strict=True)))


def gather_views(op: ComputeOp) -> list[GatherView]:
    """The virtual operands `op` reads (those of a flattened implicit contraction)."""
    return [v for v in op.operands if isinstance(v, GatherView)]


@dataclass(frozen=True)
class Contraction:
    """The roles of the axes of a contraction (see the module docstring)."""

    a: Load
    b: Load
    i: tuple[str, ...]
    j: tuple[str, ...]
    k: tuple[str, ...]
    kouter: tuple[str, ...]
    batch: tuple[str, ...]
    squeezed: bool = False
    """Whether a load indexes a dimension of extent 1 by the constant 0 (the view drops it)."""

    @property
    def is_gemm(self) -> bool:
        """Whether every role is a single axis already and no dimension is squeezed (no view
        needed)."""
        return len(self.i) == len(self.j) == len(self.k) == 1 and not self.squeezed


def plain_names(e: Expr) -> list[str] | None:
    """The axis names of a load indexed by distinct plain axes, else None."""
    if not isinstance(e, Load) or not all(isinstance(x, Index) for x in e.indices):
        return None
    names = [x.name for x in e.indices if isinstance(x, Index)]
    return names if len(set(names)) == len(names) else None


def _squeeze_names(e: Expr) -> tuple[list[str], bool] | None:
    """The axis names of a load indexed by distinct plain axes, where dimensions of extent 1
    may be indexed by the constant 0 (skipped), and whether any was; else None."""
    if not isinstance(e, Load):
        return None
    names: list[str] = []
    squeezed = False
    for x, n in zip(e.indices, e.tensor.type.shape, strict=True):
        if isinstance(x, Index):
            names.append(x.name)
        elif isinstance(x, Const) and not x.is_float and x.value == 0 and n == 1:
            squeezed = True
        else:
            return None
    return (names, squeezed) if len(set(names)) == len(names) else None


def squeezed_names(e: Expr) -> list[str] | None:
    """The axis names of a load indexed by distinct plain axes, dimensions of extent 1 indexed
    by the constant 0 skipped (a 1-channel convolution's weight after canonicalization,
    `%k[o, 0, r, s]`), else None."""
    sq = _squeeze_names(e)
    return None if sq is None else sq[0]


def widened_load(e: Expr) -> Expr:
    """The load of a 16-bit float tensor widened by a cast (`cast<f32>(%a16[i, k])`, the
    operands nfc.passes.precision gives a contraction: f32 accumulation of f16/bf16 data),
    else `e` itself. A contraction's loads may be wrapped so."""
    if (isinstance(e, Cast) and isinstance(e.x, Load) and e.dtype in (DType.F32, DType.F64)
            and e.x.tensor.dtype in (DType.F16, DType.BF16)):
        return e.x
    return e


def _runs(seq: list[str], ok: set[str], other: list[str] | None) -> list[tuple[str, ...]]:
    """Maximal runs of adjacent members of `ok` in `seq` that are also adjacent, in the same
    order, in `other` (when given)."""
    out: list[tuple[str, ...]] = []
    cur: list[str] = []
    for name in seq:
        if name in ok and cur and (other is None or (
                other.index(name) == other.index(cur[-1]) + 1)):
            cur.append(name)
            continue
        if cur:
            out.append(tuple(cur))
        cur = [name] if name in ok else []
    if cur:
        out.append(tuple(cur))
    return out


def longest_run(seq: list[str], members: set[str], other: list[str] | None = None
                ) -> tuple[str, ...]:
    """The longest run of `_runs(seq, members, other)` (of equals, the later); () if none."""
    best: tuple[str, ...] = ()
    for r in _runs(seq, members, other):
        if len(r) >= len(best):
            best = r
    return best


def match_contraction(op: ComputeOp, *, implicit: bool = False) -> Contraction | None:
    """The roles of `op`'s axes when it is a contraction (module docstring), else None. With
    `implicit`, one factor of a compute marked `nf.implicit` may be a gather (matched as a
    load of a `GatherView`)."""
    if op.reduce != "sum" or not op.dims or not op.raxes:
        return None
    body = op.body
    if not (isinstance(body, Binary) and body.op == "*"):
        return None
    la, lb = widened_load(body.a), widened_load(body.b)
    sqa, sqb = _squeeze_names(la), _squeeze_names(lb)
    if implicit and (sqa is None) != (sqb is None) and op.attrs.get("nf.implicit"):
        gather, other = (body.a, lb) if sqa is None else (body.b, la)
        view = _gather_view(op, gather, other)
        if view is None:
            return None
        names = (list(view.tensor.names), False)  # type: ignore[attr-defined]
        if sqa is None:
            la, sqa = view, names
        else:
            lb, sqb = view, names
    if sqa is None or sqb is None:
        return None
    (na, qa), (nb, qb) = sqa, sqb
    assert isinstance(la, Load) and isinstance(lb, Load)
    if la.tensor is lb.tensor:
        return None
    dims = [a.name for a in op.dims]
    red = [a.name for a in op.raxes]
    sa, sb = set(na), set(nb)
    if any(r not in sa or r not in sb for r in red) or any(d not in sa | sb for d in dims):
        return None
    last = dims[-1]
    if last in sa and last in sb:
        return None
    if last in sa:
        la, lb, na, nb, sa, sb = lb, la, nb, na, sb, sa
    j = [last]
    for d in reversed(dims[:-1]):
        p = nb.index(j[0])
        if d in sb and d not in sa and p > 0 and nb[p - 1] == d:
            j.insert(0, d)
        else:
            break
    a_only = (sa - sb) - set(j)
    i = longest_run(dims, a_only, na)
    if not i:
        return None
    k = longest_run(na, set(red), nb)
    assert k
    kouter = tuple(r for r in red if r not in k)
    batch = tuple(d for d in dims if d not in i and d not in j)
    return Contraction(la, lb, i, tuple(j), k, kouter, batch, qa or qb)


def _gather_view(op: ComputeOp, gather: Expr, other: Expr) -> Load | None:
    """A plain load of the `GatherView` of factor `gather` (the other factor a plain load
    `other`), or None when `gather` is no gather: it must read at least one tensor, only
    through indices over `op`'s axes without loads, and not be `other`'s tensor."""
    sq = _squeeze_names(other)
    if sq is None:
        return None
    assert isinstance(other, Load)
    loads = [e for e in gather.walk() if isinstance(e, Load)]
    if not loads or any(ld.tensor is other.tensor for ld in loads):
        return None
    if any(isinstance(x, Load) for ld in loads for ix in ld.indices for x in ix.walk()):
        return None
    ext = {a.name: a.extent for a in op.all_axes}
    names = index_names(gather)
    if not names <= set(ext):
        return None
    wn = sq[0]
    dims = [a.name for a in op.dims]
    red = [a.name for a in op.raxes]
    if any(r not in names for r in red) or any(n not in wn and n not in dims for n in names):
        return None
    shared = [d for d in dims if d in names and d in wn]
    own = [d for d in dims if d in names and d not in wn]
    run = longest_run(dims, set(own))
    order = shared + [d for d in own if d not in run] + [r for r in wn if r in red] + list(run)
    given = op.attrs.get("nf.implicit")  # the order of the columns it replaces (im2col)
    if isinstance(given, list | tuple) and sorted(given) == sorted(names):
        order = [str(n) for n in given]
    if set(order) != names:
        return None
    dtype = gather.dtype if isinstance(gather, Cast) else loads[0].tensor.dtype
    gv = GatherView(TensorType(tuple(ext[n] for n in order), dtype), order, gather,
                    name=f"{loads[0].tensor.name or 'x'}_view")
    return Load(gv, tuple(Index(n) for n in order))


@dataclass(frozen=True)
class FlatContraction:
    """A contraction over reshaped views: `op` computes the same elements as the original
    into the original's memory; `values` maps id(original value) to its view (result, A, B)."""

    op: ComputeOp
    values: dict[int, Value]
    """id(original value) -> its view; a gather's view (a `GatherView` operand of `op`) is
    not in it."""
    names: tuple[str, str, str]
    """The merged axes (m, n, k) of the runs; a run of one axis keeps its name."""


def _fresh(base: str, used: set[str]) -> str:
    name, n = base, 1
    while name in used:
        name, n = f"{base}_{n}", n + 1
    used.add(name)
    return name


def flatten(op: ComputeOp, c: Contraction | None = None, *,
            implicit: bool = False) -> FlatContraction | None:
    """The view of a contraction whose runs are merged into single axes, or None when `op`
    is no contraction or already has single-axis runs and no gather. With `implicit`, a
    gather factor (module docstring) becomes a `GatherView` of the merged axes, whose element
    splits them again (`gk` of `[c, r, s]` runs is `c = gk // 9`, `r = gk // 3 % 3`, ...)."""
    c = c if c is not None else match_contraction(op, implicit=implicit)
    gathered = c is not None and (isinstance(c.a.tensor, GatherView) or isinstance(
        c.b.tensor, GatherView))
    if c is None or (c.is_gemm and not gathered):
        return None
    ext = {a.name: a.extent for a in op.all_axes}
    used = set(ext)
    merged: dict[tuple[str, ...], str] = {}
    names = []
    for run, base in ((c.i, "gm"), (c.j, "gn"), (c.k, "gk")):
        merged[run] = run[0] if len(run) == 1 else _fresh(base, used)
        names.append(merged[run])
        ext[merged[run]] = math.prod(ext[a] for a in run)

    def merge(seq: list[str]) -> list[str]:
        out: list[str] = []
        skip: set[str] = set()
        for n in seq:
            if n in skip:
                continue
            run = next((r for r in merged if r[0] == n), None)
            if run is not None and len(run) > 1 and list(seq[seq.index(n):][:len(run)]) == (
                    list(run)):
                out.append(merged[run])
                skip.update(run)
            else:
                out.append(n)
        return out

    split: dict[str, Expr] = {}  # an axis of a merged run as an expression of the run
    for run, name in merged.items():
        if len(run) > 1:
            for t, a in enumerate(run):
                inner = math.prod(ext[x] for x in run[t + 1:])
                e: Expr = Index(name) if inner == 1 else Binary("//", Index(name), Const(inner))
                split[a] = e if t == 0 else Binary("%", e, Const(ext[a]))

    def view(ld: Load) -> Load:
        sq = _squeeze_names(ld)
        assert sq is not None
        idx = merge(sq[0])
        v = ld.tensor
        shape = tuple(ext[n] for n in idx)
        if isinstance(v, GatherView):
            runs = {merged[r]: r for r in merged if len(r) > 1}
            inner = [ext[runs[n][-1]] if n in runs else ext[n] for n in idx]
            fv: Value = GatherView(TensorType(shape, v.dtype), idx,
                                   substitute_indices(v.expr, split), v.name, inner)
        else:
            fv = Value(TensorType(shape, v.dtype), v.name)
        return Load(fv, tuple(Index(n) for n in idx))

    fa, fb = view(c.a), view(c.b)
    body = op.body
    assert isinstance(body, Binary)
    def wrap(orig: Expr, flat: Load) -> Expr:  # keep a widening cast around its load
        return Cast(orig.dtype, flat) if widened_load(orig) is not orig and isinstance(
            orig, Cast) else flat

    if widened_load(body.a) is c.a or widened_load(body.b) is c.b:
        new_body = Binary("*", wrap(body.a, fa), wrap(body.b, fb))
    else:
        new_body = Binary("*", wrap(body.a, fb), wrap(body.b, fa))
    dims = merge([a.name for a in op.dims])
    red = [*c.kouter, merged[c.k]]
    fop = ComputeOp(TensorType(tuple(ext[d] for d in dims), op.result.dtype),
                    tuple(Axis(d, ext[d]) for d in dims), new_body, reduce="sum",
                    raxes=tuple(Axis(r, ext[r]) for r in red), name=op.result.name)
    values = {id(op.result): fop.result}
    for ld, fl in ((c.a, fa), (c.b, fb)):
        if not isinstance(ld.tensor, GatherView):  # a gather's view has no memory of its own
            values[id(ld.tensor)] = fl.tensor
    return FlatContraction(fop, values, (names[0], names[1], names[2]))
