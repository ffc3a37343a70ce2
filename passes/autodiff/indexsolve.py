"""Inverting an access `A[f(x, r)]`: every `(x, r)` of a compute's domain with `f(x, r) = z`.

`invert_access` returns the set as new reduction axes `s`, an expression of every forward index
in terms of `(z, s)`, and guards: the points of the box `s` that satisfy the guards are exactly
the forward points that read `A[z]`. The steps (see docs/autodiff.md for a worked example):

1. Flatten each index component to an affine form over the forward indices and fresh pairs
   `(q, m)` standing for `e // c` and `e % c`, with the equation `e = c*q + m`, `0 <= m < c`
   (one pair per distinct `(e, c)`: a `//` and a `%` of the same `e` share it, an unpaired one
   leaves its partner free). Components that are not quasi-affine (data-dependent indices)
   become equality guards.
2. Solve the system over the integers (Hermite normal form): a particular solution, a lattice of
   free directions, divisibility and consistency conditions.
3. Put the lattice basis in echelon form with the unknowns ordered by extent, smallest first,
   and give each free variable the range of its most constraining unknown: `t = lo(z) + s`,
   `s` in `[0, ceil(E / a))` for an unknown stepping by `a` per unit of `t` with extent `E`.
   A count of one fixes the variable (reshapes and depth2space need no reduction at all); a
   stride-2 window of 3 iterates over 2 values, not 3.
4. Every bound of a ranged unknown that the ranges of `(z, s)` cannot prove becomes a guard.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction

from nfc.affine import Affine, affine_interval
from nfc.ir import Axis, Binary, Cast, Const, Expr, Index, Unary, substitute_indices
from nfc.passes.autodiff.intlinalg import RatAffine, echelon_basis, solve_integer
from nfc.passes.autodiff.qa import QA, QACtx, const, to_expr, var


@dataclass(frozen=True)
class Inversion:
    """The forward points reading `A[z]`: `for s in axes: if all(guards): x = subst(z, s)`."""

    axes: tuple[Axis, ...]
    subst: dict[str, Expr]
    guards: tuple[Expr, ...]


class _Flattener:
    """Turns quasi-affine index expressions into affine forms with (q, m) pair unknowns."""

    def __init__(self) -> None:
        self.pairs: dict[tuple[Affine, int], tuple[str, str]] = {}

    def __call__(self, e: Expr) -> Affine | None:
        if isinstance(e, Const) and not e.is_float and (e.dtype is None or e.dtype.is_int):
            return Affine.constant(int(e.value))
        if isinstance(e, Index):
            return Affine.var(e.name)
        if isinstance(e, Unary) and e.op == "neg":
            x = self(e.x)
            return None if x is None else -x
        if isinstance(e, Cast) and e.dtype.is_int and e.dtype.value != "i1":
            return self(e.x)
        if not (isinstance(e, Binary) and e.op in ("+", "-", "*", "//", "%")):
            return None
        a, b = self(e.a), self(e.b)
        if a is None or b is None:
            return None
        if e.op == "+":
            return a + b
        if e.op == "-":
            return a - b
        if e.op == "*":
            if a.is_const:
                return b.scale(a.const)
            return a.scale(b.const) if b.is_const else None
        if not b.is_const or b.const <= 0:
            return None
        c = b.const
        if all(k % c == 0 for _, k in a.coeffs):
            # (c*y + k) // c = y + k // c exactly; no pair needed
            lin = Affine(tuple((n, k // c) for n, k in a.coeffs))
            return lin + a.const // c if e.op == "//" else Affine.constant(a.const % c)
        key = (a, c)
        if key not in self.pairs:
            i = len(self.pairs)
            self.pairs[key] = (f"$q{i}", f"$m{i}")
        q, m = self.pairs[key]
        return Affine.var(q if e.op == "//" else m)


def _rat(aff: Affine) -> RatAffine:
    return RatAffine.of({n: Fraction(c) for n, c in aff.coeffs}, Fraction(aff.const))


def _qa_of_rat(cx: QACtx, r: RatAffine) -> QA:
    coeffs, k, d = r.scaled_to_int()
    num = cx.add(const(k), *(cx.scale(var(n), c) for n, c in coeffs.items()))
    return cx.floordiv(num, d) if d != 1 else num


def _count(b: tuple[int, int] | None, step: int) -> int:
    """How many values of a free variable keep an unknown moving by `step` inside `b`."""
    assert b is not None
    return -(-(b[1] - b[0] + 1) // step)


def _greedy_basis(kernel: list[list[int]], unknowns: list[str],
                  bounds: dict[str, tuple[int, int] | None]) -> list[list[int]]:
    """An echelon basis of the lattice whose pivots are picked greedily: each next pivot is
    the ranged unknown leaving its free variable the fewest values (extent / gcd of steps)."""
    chosen: list[int] = []
    rest = sorted(range(len(unknowns)), key=lambda i: (bounds[unknowns[i]] is None, i))
    while len(chosen) < len(kernel):
        eb = echelon_basis(kernel, chosen + [i for i in rest if i not in chosen])
        rem = eb[len(chosen):]
        best: tuple[tuple[int, int, int, int], int] | None = None
        for i in rest:
            b = bounds[unknowns[i]]
            if i in chosen or b is None:
                continue
            g = math.gcd(*(v[i] for v in rem))
            if g == 0:
                continue
            key = (_count(b, g), g != 1, int(unknowns[i].startswith("$")), i)
            if best is None or key < best[0]:
                best = (key, i)
        assert best is not None, "a free direction moves no ranged unknown"
        chosen.append(best[1])
    basis = echelon_basis(kernel, chosen + [i for i in rest if i not in chosen])
    # Size reduction: adding multiples of later vectors keeps the echelon structure (they
    # vanish on every earlier pivot) and makes the substituted indices read naturally
    # (`c = z // 4` instead of `z // 2 + -(z // 2) // 2`).
    for lv in range(len(basis) - 2, -1, -1):
        for w in basis[lv + 1:]:
            vec = basis[lv]
            ww = sum(x * x for x in w)
            k0 = round(-sum(x * y for x, y in zip(vec, w, strict=True)) / ww)
            best_k, best_n = 0, sum(map(abs, vec))
            for k in (k0 - 1, k0, k0 + 1):
                n = sum(abs(x + k * y) for x, y in zip(vec, w, strict=True))
                if n < best_n:
                    best_k, best_n = k, n
            if best_k:
                basis[lv] = [x + best_k * y for x, y in zip(vec, w, strict=True)]
    return basis


def _fresh(base: str, used: set[str]) -> str:
    name, n = base, 1
    while name in used:
        n += 1
        name = f"{base}_{n}"
    used.add(name)
    return name


def invert_access(fwd_axes: Sequence[Axis], indices: Sequence[Expr], zdims: Sequence[Axis],
                  reserved: set[str] | None = None) -> Inversion | None:
    """Invert the access `A[indices]` of a compute with axes `fwd_axes` (output + reduction).

    `zdims` names the gradient's output indices (one per dimension of `A`, extents = shape).
    Returns None when no forward point reads any element (e.g. an index fixed to a constant
    outside the tensor, or a parity that never holds).
    """
    flat = _Flattener()
    forms: list[Affine | None] = [flat(e) for e in indices]
    # every unknown's range; quotients get the range implied by their dividend (never
    # guarded: it follows from the others), which lets `(c % 3) * 4 + c // 3` invert exactly
    bounds: dict[str, tuple[int, int] | None] = {a.name: (0, a.extent - 1) for a in fwd_axes}
    guarded = set(bounds)
    for (e, c), (q, m) in flat.pairs.items():
        r = affine_interval(e, bounds)  # type: ignore[arg-type]
        bounds[q] = None if r is None else (r[0] // c, r[1] // c)
        bounds[m] = (0, c - 1)
        guarded.add(m)
    unknowns = list(bounds)
    col = {n: i for i, n in enumerate(unknowns)}
    rows: list[list[int]] = []
    rhs: list[RatAffine] = []
    for form, z in zip(forms, zdims, strict=True):
        if form is None:
            continue
        row = [0] * len(unknowns)
        for n, k in form.coeffs:
            row[col[n]] = k
        rows.append(row)
        rhs.append(RatAffine.of({z.name: Fraction(1)}, Fraction(-form.const)))
    for (e, c), (q, m) in flat.pairs.items():
        row = [0] * len(unknowns)
        for n, k in e.coeffs:
            row[col[n]] += k
        row[col[q]] -= c
        row[col[m]] -= 1
        rows.append(row)
        rhs.append(RatAffine.of({}, Fraction(-e.const)))
    sol = solve_integer(rows, rhs, len(unknowns))

    used = {z.name for z in zdims} | set(reserved or ())
    cx = QACtx({z.name: (0, z.extent - 1) for z in zdims})
    guards: list[Expr] = []

    def require_zero_mod(num: QA, d: int) -> bool:
        """Guard `num % d == 0` (d > 1) or `num == 0`; False when it can never hold."""
        r = cx.mod(num, d) if d > 1 else num
        iv = cx.interval(r)
        if iv is not None and (iv[0] > 0 or iv[1] < 0):
            return False
        if iv != (0, 0):
            guards.append(Binary("==", to_expr(r), Const(0)))
        return True

    for z in sol.zero:
        coeffs, k, _ = z.scaled_to_int()
        num = cx.add(const(k), *(cx.scale(var(n), c) for n, c in coeffs.items()))
        if not require_zero_mod(num, 1):
            return None
    for r in sol.integral:
        coeffs, k, d = r.scaled_to_int()
        num = cx.add(const(k), *(cx.scale(var(n), c) for n, c in coeffs.items()))
        if not require_zero_mod(num, d):
            return None

    basis = _greedy_basis([list(v) for v in sol.kernel], unknowns, bounds)
    cur: list[QA] = [_qa_of_rat(cx, p) for p in sol.particular]
    axes: list[Axis] = []
    for lvec_i, vec in enumerate(basis):
        later = basis[lvec_i + 1:]
        cands = [i for i in range(len(unknowns)) if vec[i] != 0
                 and bounds[unknowns[i]] is not None and all(w[i] == 0 for w in later)]
        assert cands, "a free direction moves no ranged unknown"

        def count(i: int, vec: list[int] = vec) -> int:
            return _count(bounds[unknowns[i]], abs(vec[i]))

        best = min(cands, key=lambda i: (count(i), abs(vec[i]) != 1,
                                          unknowns[i].startswith("$"), i))
        a = vec[best]
        if a < 0:
            vec = [-v for v in vec]
            a = -a
        n_vals = count(best)
        lo_b = bounds[unknowns[best]][0]  # type: ignore[index]
        # lo_b <= cur[best] + a*t  <=>  t >= -floor((cur[best] - lo_b) / a)
        lo = cx.scale(cx.floordiv(cx.add(cur[best], const(-lo_b)), a), -1)
        if n_vals == 1:
            t = lo
        else:
            base = unknowns[best] if not unknowns[best].startswith("$") else "s"
            if a != 1 or not lo.is_const or lo.const != 0:
                base += "_"
            name = _fresh(base, used)
            axes.append(Axis(name, n_vals))
            cx.ranges[name] = (0, n_vals - 1)
            t = cx.add(lo, var(name))
        cur = [cx.add(cur[i], cx.scale(t, vec[i])) if vec[i] else cur[i]
               for i in range(len(unknowns))]

    for i, name in enumerate(unknowns):
        b = bounds[name]
        if name not in guarded or b is None:
            continue
        r = cx.interval(cur[i])
        e = to_expr(cur[i])
        if r is not None and (r[1] < b[0] or r[0] > b[1]):
            return None
        if r is None or r[0] < b[0]:
            guards.append(Binary("<=", Const(b[0]), e))
        if r is None or r[1] > b[1]:
            guards.append(Binary("<", e, Const(b[1] + 1)))
    subst = {a.name: to_expr(cur[col[a.name]]) for a in fwd_axes}
    for form, idx, z in zip(forms, indices, zdims, strict=True):
        if form is None:
            guards.append(Binary("==", substitute_indices(idx, subst), Index(z.name)))
    return Inversion(tuple(axes), subst, tuple(guards))
