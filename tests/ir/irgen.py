"""Hypothesis strategies for random IR: expressions, attributes, locations, whole modules.

The modules are printable, not necessarily valid (the verifier is not the point): values are
used only where in scope, and calls, returns and yields declare the types of their operands,
which is all the parser checks.
"""

from __future__ import annotations

import math

from hypothesis import strategies as st

from nfc.ir import (
    INTRINSICS,
    Axis,
    Binary,
    Block,
    Call,
    CallOp,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Loc,
    Module,
    ReturnOp,
    Select,
    TensorType,
    Unary,
    Value,
    YieldOp,
)

KEYWORDS = {"and", "or", "not", "true", "false", "inf", "nan"}
BINOPS = ["or", "and", "<", "<=", ">", ">=", "==", "!=", "+", "-", "*", "/", "//", "%"]

_LOWER = "abcdefghijklmnopqrstuvwxyz"
index_names = st.text(_LOWER + "_0123456789", min_size=1, max_size=5).filter(
    lambda s: not s[0].isdigit() and s not in KEYWORDS)
symbols = st.text(_LOWER + _LOWER.upper() + "0123456789_.$-", min_size=1, max_size=8)
hints = st.none() | st.text(_LOWER + "XY0123456789_", min_size=1, max_size=5) | st.sampled_from(
    ["x", "y", "x_1", "0", "1"])
dtypes = st.sampled_from(list(DType))
text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=8)
tensor_types = st.builds(TensorType, st.lists(st.integers(1, 64), max_size=3).map(tuple), dtypes)


@st.composite
def consts(draw: st.DrawFn) -> Const:
    """A literal: int, float (nan, inf, -0.0 included) or bool, weakly or strongly typed."""
    value = draw(st.integers(-10**20, 10**20) | st.floats() | st.booleans())
    if isinstance(value, bool):
        return Const(value, draw(st.none() | st.just(DType.I1)))
    return Const(value, draw(st.none() | dtypes))


def _call(fn: str):  # noqa: ANN202 - a builder for st.builds
    return lambda *args: Call(fn, args)


def _load(v: Value):  # noqa: ANN202 - a builder for st.builds
    return lambda *ix: Load(v, ix)


def exprs(values: list[Value], max_leaves: int = 24) -> st.SearchStrategy[Expr]:
    """Scalar expression trees over index variables, literals and loads of `values`."""
    base = consts() | st.builds(Index, index_names)
    if any(v.type.rank == 0 for v in values):
        base |= st.sampled_from([Load(v, ()) for v in values if v.type.rank == 0])

    def extend(kids: st.SearchStrategy[Expr]) -> st.SearchStrategy[Expr]:
        # one `builds` per intrinsic and per tensor: flatmap here would make hypothesis build
        # exponentially large reprs of the recursive strategy
        options = [st.builds(Unary, st.sampled_from(["neg", "not"]), kids),
                   st.builds(Binary, st.sampled_from(BINOPS), kids, kids),
                   st.builds(Select, kids, kids, kids),
                   st.builds(Cast, dtypes, kids)]
        options += [st.builds(_call(fn), *[kids] * n) for fn, n in sorted(INTRINSICS.items())]
        options += [st.builds(_load(v), *[kids] * v.type.rank) for v in values]
        return st.one_of(options)

    return st.recursive(base, extend, max_leaves=max_leaves)


attr_values = st.recursive(
    st.integers(-10**30, 10**30) | st.floats() | st.booleans() | text,
    lambda kids: st.lists(kids, max_size=3) | st.dictionaries(text, kids, max_size=3),
    max_leaves=8)
attr_dicts = st.dictionaries(
    st.sampled_from(["nf.role", "a", "a.b.c", "_x1", "true", "sum"]) | text, attr_values,
    max_size=3)
locs = st.none() | st.builds(Loc, text, st.integers(0, 10**6), st.integers(0, 10**6),
                             st.none() | st.integers(0, 10**6))


# Bodies are drawn over placeholder tensors of each rank, then bound to values in scope:
# building a recursive strategy per scope would make generation the slowest part of the test.
_PLACEHOLDERS = [Value(TensorType((2,) * r, DType.F32), f"p{r}") for r in range(4)]
_BODIES = exprs(_PLACEHOLDERS, 12)


@st.composite
def computes(draw: st.DrawFn, scope: list[Value]) -> ComputeOp:
    """A compute reading values of `scope`."""
    body = draw(_BODIES)
    mapping = {}
    for p in _PLACEHOLDERS:
        same = [v for v in scope if v.type.rank == p.type.rank]
        mapping[p] = draw(st.sampled_from(same)) if same else None

    def bind(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor in mapping:
            target = mapping[e.tensor]
            return Const(0) if target is None else Load(target, e.indices)
        return None
    body = body.map(bind)
    rank = draw(st.integers(0, 2))
    dims = tuple(Axis(draw(index_names), draw(st.integers(1, 64))) for _ in range(rank))
    reduce = draw(st.none() | st.sampled_from(["sum", "max", "min", "prod"]))
    raxes = tuple(Axis(draw(index_names), draw(st.integers(1, 9)))
                  for _ in range(draw(st.integers(1, 2)) if reduce else 0))
    return ComputeOp(draw(tensor_types), dims, body, reduce=reduce,
                     raxes=raxes, loc=draw(locs), attrs=draw(attr_dicts), name=draw(hints))


@st.composite
def blocks(draw: st.DrawFn, scope: list[Value], terminator: type, depth: int = 0) -> Block:
    """Ops over `scope` (extended as they define values), ended by `terminator`."""
    scope = list(scope)
    ops = []
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.sampled_from(["compute", "compute", "call", "kernel"] if depth < 2
                                    else ["compute", "call"]))
        if kind == "compute":
            op = draw(computes(scope))
        elif kind == "call":
            args = draw(st.lists(st.sampled_from(scope), max_size=3)) if scope else []
            rtypes = draw(st.lists(tensor_types, max_size=2))
            op = CallOp(draw(symbols), args, rtypes, loc=draw(locs), attrs=draw(attr_dicts),
                        names=[draw(hints) for _ in rtypes])
        else:
            body = draw(blocks(scope, YieldOp, depth + 1))
            attrs = draw(attr_dicts)
            op = KernelOp(body, loc=draw(locs), attrs=attrs,
                          names=[draw(hints) for _ in body.ops[-1].values])
        ops.append(op)
        scope += op.results
    vals = draw(st.lists(st.sampled_from(scope), max_size=3)) if scope else []
    ops.append(terminator(vals, loc=draw(locs)))
    return Block(ops)


@st.composite
def funcs(draw: st.DrawFn) -> Func:
    """A function with random arguments (and attributes) and body."""
    args = [Value(draw(tensor_types), draw(hints)) for _ in range(draw(st.integers(0, 3)))]
    body = draw(st.just(Block()) | blocks(args, ReturnOp))
    return Func(draw(symbols), args, body, arg_attrs=[draw(attr_dicts) for _ in args],
                attrs=draw(attr_dicts), loc=draw(locs))


@st.composite
def modules(draw: st.DrawFn) -> Module:
    """A module of up to three functions with distinct names."""
    fs = draw(st.lists(funcs(), max_size=3, unique_by=lambda f: f.name))
    return Module(draw(symbols), fs, attrs=draw(attr_dicts))


def same_expr(a: Expr, b: Expr) -> bool:
    """Structural equality where nan equals nan and 0.0 differs from -0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, Const):
        assert isinstance(b, Const)
        if type(a.value) is not type(b.value) or a.dtype != b.dtype:
            return False
        if isinstance(a.value, float):
            if math.isnan(a.value):
                return math.isnan(b.value)
            return a.value == b.value and math.copysign(1, a.value) == math.copysign(1, b.value)
        return a.value == b.value
    if isinstance(a, Index):
        return a.name == b.name  # type: ignore[attr-defined]
    if isinstance(a, Load) and a.tensor is not b.tensor:  # type: ignore[attr-defined]
        return False
    for attr in ("op", "fn", "dtype"):
        if getattr(a, attr, None) != getattr(b, attr, None):
            return False
    ka, kb = a.children(), b.children()
    return len(ka) == len(kb) and all(same_expr(x, y) for x, y in zip(ka, kb, strict=True))


def _foldable(c: Expr) -> bool:
    return (isinstance(c, Const) and c.dtype is None and not isinstance(c.value, bool)
            and c.value == c.value and not (isinstance(c.value, int) and c.value == 0)
            and math.copysign(1, c.value) > 0)


def normalize(e: Expr) -> Expr:
    """What the parser makes of the printed `e`: `-literal` folds into the literal, a cast
    of a (possibly negated) literal is a typed literal, and a bool literal is i1."""
    def fn(x: Expr) -> Expr | None:
        if isinstance(x, Const) and isinstance(x.value, bool) and x.dtype is None:
            return Const(x.value, DType.I1)
        if isinstance(x, Const) and isinstance(x.value, bool) and x.dtype != DType.I1:
            return Const(x.value, DType.I1)
        if isinstance(x, Unary) and x.op == "neg" and _foldable(x.x):
            return Const(-x.x.value)  # type: ignore[attr-defined]
        if isinstance(x, Cast) and isinstance(x.x, Const) and x.x.dtype is None \
                and not isinstance(x.x.value, bool):
            return Const(x.x.value, x.dtype)
        return None
    return e.map(fn)
