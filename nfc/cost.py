"""FLOP and byte counts of computes, functions and modules.

Counting rules (per point of a compute's iteration space, output axes times reduction axes):

- each operator on floats counts the `flops` of its row in the operator table (`nfc.ops`):
  one per `+ - * /` (and float `//`, `%`), per comparison, per `max`/`min`/`abs`/`isfinite`,
  and per transcendental intrinsic (`exp`, `softplus`, `atan2`, ... count one each, like an
  FMA counts two); negation, casts, loads, literals, `philox` and all integer (index)
  arithmetic count zero;
- one FLOP per point for combining a float reduction (`sum` adds, `prod` multiplies, `max`
  and `min` compare);
- selects count what is taken, honestly: a condition on indices only (a guard such as
  `0 <= h - r and h - r < 7`) is evaluated exactly over the iteration space, so each branch
  counts in proportion to the points where it is taken, and points where a reduction's body
  is a literal zero (a guarded-out term of a gather-form gradient) cost no combine either: a
  backend turns index-only guards into loop bounds. A data-dependent condition (a relu mask)
  counts its own FLOPs plus the dearer branch (an upper bound);
- bytes are the compulsory traffic: every tensor read, once, in full, plus the result written.

Fractions of guards come from exact enumeration over the variables a condition mentions,
split into independent groups of conjuncts; a group with more than `ENUM_LIMIT` points is
sampled (seeded, so counts are reproducible).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from nfc import ops
from nfc.ir import Binary, Cast, ComputeOp, Const, Expr, Func, Index, Load, Module, Select, Unary

#: Largest number of index points a guard is evaluated on exactly.
ENUM_LIMIT = 1 << 22
_SAMPLES = 1 << 17


@dataclass(frozen=True)
class ComputeCost:
    """The cost of one compute: iteration points, FLOPs and compulsory bytes."""

    name: str
    phase: str
    shape: tuple[int, ...]
    points: int
    flops: float
    bytes: int

    @property
    def intensity(self) -> float:
        """FLOPs per byte."""
        return self.flops / self.bytes if self.bytes else 0.0


def _index_only(e: Expr) -> bool:
    return not any(isinstance(n, Load) for n in e.walk()) and not _has_float(e)


def _has_float(e: Expr) -> bool:
    return any(isinstance(n, Const) and n.is_float for n in e.walk())


def _eval_index(e: Expr, env: dict[str, np.ndarray]) -> np.ndarray:
    """Evaluate an index-only expression on integer arrays (the operator table's numpy)."""
    if isinstance(e, Const):
        return np.asarray(e.value)
    if isinstance(e, Index):
        return env[e.name]
    args = [_eval_index(k, env) for k in e.children()]
    if isinstance(e, Cast):
        return args[0]
    row = ops.find(e)
    assert row is not None and row.numpy is not None, e
    with np.errstate(divide="ignore"):
        return row.numpy(*args)


def _conjuncts(conds: Iterable[tuple[Expr, bool]]) -> list[Expr]:
    out: list[Expr] = []
    for c, truth in conds:
        if truth:
            stack = [c]
            while stack:
                x = stack.pop()
                if isinstance(x, Binary) and x.op == "and":
                    stack += [x.a, x.b]
                else:
                    out.append(x)
        else:
            out.append(Unary("not", c))
    return out


class _Fractions:
    """Exact (or sampled) fractions of an iteration space where index conditions hold."""

    def __init__(self, extents: dict[str, int]) -> None:
        self.extents = extents
        self.memo: dict[tuple, float] = {}

    def __call__(self, path: tuple[tuple[Expr, bool], ...]) -> float:
        if not path:
            return 1.0
        if path not in self.memo:
            self.memo[path] = self._fraction(_conjuncts(path))
        return self.memo[path]

    def _fraction(self, conds: list[Expr]) -> float:
        # group conjuncts that share variables; independent groups multiply
        groups: list[tuple[set[str], list[Expr]]] = []
        for c in conds:
            names = {n.name for n in c.walk() if isinstance(n, Index)}
            merged = [g for g in groups if g[0] & names]
            for g in merged:
                groups.remove(g)
                names |= g[0]
            groups.append((names, [c] + [x for g in merged for x in g[1]]))
        frac = 1.0
        for names, cs in groups:
            frac *= self._group(sorted(names), cs)
        return frac

    def _group(self, names: list[str], conds: list[Expr]) -> float:
        size = math.prod(self.extents[n] for n in names)
        if size <= ENUM_LIMIT:
            grids = np.meshgrid(*(np.arange(self.extents[n]) for n in names), indexing="ij")
            env = dict(zip(names, grids, strict=True))
            n_total = size
        else:
            rng = np.random.default_rng(0)
            env = {n: rng.integers(0, self.extents[n], _SAMPLES) for n in names}
            n_total = _SAMPLES
        ok = np.ones(() if not names else env[names[0]].shape, bool)
        for c in conds:
            ok = ok & np.asarray(_eval_index(c, env), bool)
        return float(np.count_nonzero(ok)) / n_total if names else float(bool(ok))


def _flops(e: Expr, path: tuple, frac: _Fractions, typer: ops.Typer) -> float:
    """Expected FLOPs of evaluating `e` at one point: each operator's `flops` (its row of the
    operator table) when it computes on floats."""
    if isinstance(e, Const | Index | Load):
        return 0.0
    if isinstance(e, Select):
        if _index_only(e.cond):
            return (_flops(e.a, path + ((e.cond, True),), frac, typer)
                    + _flops(e.b, path + ((e.cond, False),), frac, typer))
        return _flops(e.cond, path, frac, typer) + max(_flops(e.a, path, frac, typer),
                                                       _flops(e.b, path, frac, typer))
    row = ops.find(e)
    own = row.flops if row is not None and ops.is_float(typer.kinds(e)[0]) else 0.0
    kids = sum(_flops(k, path, frac, typer) for k in e.children())
    return own * frac(path) + kids


def _identity(reduce: str | None) -> float | None:
    return {"sum": 0.0, "prod": 1.0}.get(reduce or "")


def _nonidentity(e: Expr, ident: float | None, path: tuple, frac: _Fractions) -> float:
    """Fraction of points where `e` is not the reduction's identity literal."""
    if ident is not None and isinstance(e, Const) and not isinstance(e.value, bool) \
            and e.value == ident:
        return 0.0
    if isinstance(e, Select) and _index_only(e.cond):
        return (_nonidentity(e.a, ident, path + ((e.cond, True),), frac)
                + _nonidentity(e.b, ident, path + ((e.cond, False),), frac))
    return frac(path)


def compute_cost(op: ComputeOp, name: str = "") -> ComputeCost:
    """The cost of one compute (see the module docstring for the rules)."""
    extents = {a.name: a.extent for a in op.all_axes}
    points = math.prod(extents.values())
    frac = _Fractions(extents)
    per_point = _flops(op.body, (), frac, ops.Typer())
    if op.reduce is not None and op.result.dtype.is_float:
        per_point += _nonidentity(op.body, _identity(op.reduce), (), frac)
    nbytes = sum(v.type.nbytes for v in op.operands) + op.result.type.nbytes
    phase = str(op.attrs.get("nf.phase", "forward"))
    return ComputeCost(name or (op.result.name or "?"), phase, op.result.shape, points,
                       per_point * points, nbytes)


def func_cost(func: Func) -> list[ComputeCost]:
    """The cost of every compute of `func` (inside kernels too), in order."""
    from nfc.printer import Namer

    namer = Namer()
    for a in func.args:
        namer.add(a)
    for op in func.walk():
        for r in op.results:
            namer.add(r)
    return [compute_cost(op, namer(op.result)) for op in func.walk()
            if isinstance(op, ComputeOp)]


def phase_totals(costs: Iterable[ComputeCost]) -> dict[str, tuple[float, int]]:
    """(FLOPs, bytes) summed per phase (forward, backward, update)."""
    out: dict[str, tuple[float, int]] = {}
    for c in costs:
        f, b = out.get(c.phase, (0.0, 0))
        out[c.phase] = (f + c.flops, b + c.bytes)
    return out


def module_cost(module: Module) -> dict[str, list[ComputeCost]]:
    """`func_cost` of every function, by name."""
    return {f.name: func_cost(f) for f in module.funcs}
