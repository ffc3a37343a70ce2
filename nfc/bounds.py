"""Static bounds checking of the loads of a compute.

Every axis `x: n` of a compute ranges over [0, n-1]. A load `%t[e0, e1, ...]` is in bounds when
each `ei` provably lies in [0, size_i - 1]. Proofs use `nfc.affine.interval`, refined by the
guards of the selects that enclose the load: inside the first branch of `select(c, a, b)` the
condition `c` is known true, inside the second it is known false.

Guards give facts of the form `lo <= L <= hi` about a linear form `L`:
- a comparison `e1 cmp e2` of integer expressions gives a fact about `e1 - e2` (`<`, `<=`,
  `>`, `>=`, `==` when true; their negations when false; `!=` only when false);
- `a and b` when true, `a or b` when false, `not a` give the facts of their parts; `a or b`
  when true and `a and b` when false give none;
- sub-expressions that are not affine (`(h - r) // 2`, `%ids[n]`, `i * j`) act as variables
  ("atoms") of the linear forms, so a guard `0 <= (h - r) // 2 < H` bounds the index
  `(h - r) // 2` exactly as a guard on `h - 1` bounds `h - 1`.
A fact about a single variable tightens that variable's range; any other fact bounds every
expression whose linear form is a multiple of it, up to a constant. Contradictory facts make a
branch dead, and loads in dead branches are not checked.

Conditions are evaluated in full (no short-circuit): the loads inside a guard's condition are
checked under the facts of the enclosing branches only, which matches the interpreter.

Data-dependent indices (an index that contains a load, e.g. an embedding `%E[%ids[n], d]`):
- an index that is exactly a load of an integer tensor (possibly under an integer cast) is
  accepted: the caller guarantees that the ids are in range, and `nfc.interp` raises at run
  time when they are not;
- when the op's attributes contain a true `nf.assume_inbounds`, every data-dependent index is
  accepted in the same way;
- other data-dependent indices are checked with the load bounded by its dtype's range
  (`[0, 1]` for i1), refined by guards, e.g. `select(%ids[n] < 9, %E[%ids[n] + 1], 0.0)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from nfc.affine import (
    Affine,
    Interval,
    affine_interval,
    intersect,
    interval,
    is_int_valued,
    to_affine,
)
from nfc.ir import Binary, Cast, ComputeOp, Const, DType, Expr, Index, Load, Select, Unary

#: Stand-ins for -inf and +inf: exact integer arithmetic keeps working on them.
_NEG = -(1 << 200)
_POS = 1 << 200

_DTYPE_RANGE: dict[DType, Interval] = {
    DType.I1: (0, 1),
    DType.I32: (-(1 << 31), (1 << 31) - 1),
    DType.I64: (-(1 << 63), (1 << 63) - 1),
}

_NEGATED = {"<": ">=", "<=": ">", ">": "<=", ">=": "<", "==": "!=", "!=": "=="}


@dataclass(frozen=True)
class BoundsViolation:
    """Index `dim` of `load` can take values in [lo, hi], outside [0, size - 1].

    `lo` and `hi` are None when the index could not be bounded at all.
    """

    load: Load
    dim: int
    lo: int | None
    hi: int | None
    size: int

    def message(self) -> str:
        """A diagnostic text: `access '%x' dimension 2 can reach 30 but the tensor has ...`."""
        name = f"%{self.load.tensor.name or '?'}"
        head = f"access '{name}' dimension {self.dim}"
        if self.lo is None or self.hi is None:
            return (f"{head} cannot be bounded (the tensor has size {self.size}); guard it "
                    "with a select or mark the op nf.assume_inbounds")
        if self.hi > self.size - 1 and self.lo < 0:
            return (f"{head} ranges over [{self.lo}, {self.hi}] but the tensor has size "
                    f"{self.size}")
        if self.hi > self.size - 1:
            return f"{head} can reach {self.hi} but the tensor has size {self.size}"
        return f"{head} can reach {self.lo} but indices start at 0 (size {self.size})"


@dataclass
class _Atoms:
    """Names for the non-affine integer sub-expressions of one compute."""

    names: dict[Expr, str] = field(default_factory=dict)

    def __call__(self, e: Expr) -> str | None:
        if isinstance(e, Const | Index) or not is_int_valued(e):
            return None
        if isinstance(e, Binary) and e.op in ("<", "<=", ">", ">=", "==", "!=", "and", "or"):
            return None
        if isinstance(e, Unary) and e.op == "not":
            return None
        name = self.names.get(e)
        if name is None:
            name = self.names[e] = f"${len(self.names)}"
        return name


def _normalise(aff: Affine) -> tuple[Affine, int]:
    """`aff.linear() == k * key` with key's first coefficient positive and gcd 1."""
    g = math.gcd(*(c for _, c in aff.coeffs))
    k = g if aff.coeffs[0][1] > 0 else -g
    return Affine(tuple((n, c // k) for n, c in aff.coeffs)), k


def _div_range(lo: int, hi: int, k: int) -> Interval:
    """{x : lo <= k*x <= hi} as an integer interval (k != 0)."""
    if k < 0:
        lo, hi, k = -hi, -lo, -k
    return -((-lo) // k), hi // k


@dataclass
class _Context:
    """What is known at a point of the body: variable ranges and facts on linear forms."""

    ranges: dict[str, Interval]
    facts: dict[Affine, Interval]
    atoms: _Atoms
    dead: bool = False

    def assume(self, cond: Expr, truth: bool) -> _Context:
        """The context inside a branch where `cond` has the value `truth`."""
        new = _Context(dict(self.ranges), dict(self.facts), self.atoms, self.dead)
        for aff, lo, hi in _facts(cond, truth, self.atoms):
            new._add(aff, lo, hi)
        new._check_feasible()
        return new

    def _add(self, aff: Affine, lo: int, hi: int) -> None:
        if aff.is_const:
            if not lo <= aff.const <= hi:
                self.dead = True
            return
        key, k = _normalise(aff)
        r = _div_range(lo - aff.const, hi - aff.const, k)
        if len(key.coeffs) == 1:
            name = key.coeffs[0][0]
            self.ranges[name] = intersect(self.ranges.get(name), r)  # type: ignore[assignment]
        else:
            self.facts[key] = intersect(self.facts.get(key), r)  # type: ignore[assignment]

    def _check_feasible(self) -> None:
        for lo, hi in self.ranges.values():
            if lo > hi:
                self.dead = True
        for key, (lo, hi) in self.facts.items():
            r = intersect((lo, hi), affine_interval(key, self.ranges))
            if r is not None and r[0] > r[1]:
                self.dead = True

    def refine(self, e: Expr) -> Interval | None:
        """Bounds of `e` known from facts (and dtype ranges for loads)."""
        if isinstance(e, Const | Index):
            return None
        out: Interval | None = None
        if isinstance(e, Load):
            out = _DTYPE_RANGE.get(e.tensor.dtype)
        aff = to_affine(e, self.atoms)
        if aff is None or aff.is_const:
            return out
        if len(aff.coeffs) == 1 and aff.coeffs[0][0].startswith("$"):
            r = self.ranges.get(aff.coeffs[0][0])
            if r is not None:
                c = aff.coeffs[0][1]
                lo, hi = sorted((c * r[0], c * r[1]))
                out = intersect(out, (lo + aff.const, hi + aff.const))
        if len(aff.coeffs) > 1:
            key, k = _normalise(aff)
            f = self.facts.get(key)
            if f is not None:
                lo, hi = sorted((k * f[0], k * f[1]))
                out = intersect(out, (lo + aff.const, hi + aff.const))
            exact = affine_interval(aff, self.ranges)
            if exact is not None:
                out = intersect(out, exact)
        return out


def _facts(cond: Expr, truth: bool, atoms: _Atoms) -> list[tuple[Affine, int, int]]:
    """Facts `lo <= aff <= hi` implied by `cond` having the value `truth`."""
    if isinstance(cond, Unary) and cond.op == "not":
        return _facts(cond.x, not truth, atoms)
    if isinstance(cond, Const) and isinstance(cond.value, bool | int):
        # a constant condition: the branch it rules out is dead
        return [] if bool(cond.value) == truth else [(Affine.constant(0), 1, 1)]
    if not isinstance(cond, Binary):
        return []
    if cond.op in ("and", "or"):
        if (cond.op == "and") == truth:
            return _facts(cond.a, truth, atoms) + _facts(cond.b, truth, atoms)
        return []
    op = cond.op if truth else _NEGATED.get(cond.op)
    if op is None or op == "!=":
        return []
    if not (is_int_valued(cond.a) and is_int_valued(cond.b)):
        return []
    a = to_affine(cond.a, atoms)
    b = to_affine(cond.b, atoms)
    if a is None or b is None:
        return []
    d = a - b
    return {
        "<": [(d, _NEG, -1)], "<=": [(d, _NEG, 0)], ">": [(d, 1, _POS)], ">=": [(d, 0, _POS)],
        "==": [(d, 0, 0)],
    }.get(op, [])


def _is_id_load(e: Expr) -> bool:
    while isinstance(e, Cast) and e.dtype.is_int:
        e = e.x
    return isinstance(e, Load) and e.tensor.dtype in (DType.I32, DType.I64)


def check_bounds(op: ComputeOp) -> list[BoundsViolation]:
    """Every load index of `op` that cannot be proven to stay inside its tensor."""
    ranges = {a.name: (0, a.extent - 1) for a in op.all_axes}
    ctx = _Context(ranges, {}, _Atoms())
    ctx._check_feasible()
    assume = bool(op.attrs.get("nf.assume_inbounds", False))
    out: list[BoundsViolation] = []
    _walk(op.body, ctx, assume, out)
    seen: set[tuple[int, int, int | None, int | None, Load]] = set()
    unique = []
    for v in out:
        key = (id(v.load.tensor), v.dim, v.lo, v.hi, v.load)
        if key not in seen:
            seen.add(key)
            unique.append(v)
    return unique


def _walk(e: Expr, ctx: _Context, assume: bool, out: list[BoundsViolation]) -> None:
    if ctx.dead:
        return
    if isinstance(e, Select):
        _walk(e.cond, ctx, assume, out)
        _walk(e.a, ctx.assume(e.cond, True), assume, out)
        _walk(e.b, ctx.assume(e.cond, False), assume, out)
        return
    if isinstance(e, Load):
        _check_load(e, ctx, assume, out)
    for c in e.children():
        _walk(c, ctx, assume, out)


def _check_load(ld: Load, ctx: _Context, assume: bool, out: list[BoundsViolation]) -> None:
    shape = ld.tensor.shape
    if len(ld.indices) != len(shape):
        return  # an arity error, reported by the verifier
    for dim, (idx, size) in enumerate(zip(ld.indices, shape, strict=True)):
        data_dependent = any(isinstance(n, Load) for n in idx.walk())
        if data_dependent and (assume or _is_id_load(idx)):
            continue
        r = interval(idx, ctx.ranges, refine=ctx.refine)
        if r is None:
            out.append(BoundsViolation(ld, dim, None, None, size))
            continue
        lo, hi = r
        if lo > hi:
            continue  # contradictory facts: this point is never reached
        if lo < 0 or hi > size - 1:
            out.append(BoundsViolation(ld, dim, None if lo <= _NEG // 2 else lo,
                                       None if hi >= _POS // 2 else hi, size))
