"""Integer linear algebra for inverting index maps: Hermite normal form and integer solving.

The gradient of `B[x] = R_r F(A[f(x, r)])` with respect to `A` needs every `(x, r)` with
`f(x, r) = z`. For affine `f` this is the integer linear system `M u = b(z)`: its solutions are
a particular solution plus a lattice `u0(z) + K t`, `t` integer. The column-style Hermite
normal form `M U = [H | 0]` (U unimodular, H lower echelon) gives both: `u = U y`, the first
`rank` entries of `y` are fixed by forward substitution in `H y = b`, the rest are free and the
last columns of `U` span the lattice.

Right-hand sides are affine forms in symbols (the gradient's own indices), so solutions are
rational affine forms; a solution is integral only under divisibility conditions, which the
caller turns into guards. Everything is exact (Python integers and Fractions).
"""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from math import lcm

Matrix = list[list[int]]


def identity(n: int) -> Matrix:
    """The n x n identity matrix."""
    return [[int(i == j) for j in range(n)] for i in range(n)]


def _col_op(mats: list[Matrix], j: int, k: int, a: int, b: int, c: int, d: int) -> None:
    """Replace columns (j, k) by (a*col_j + b*col_k, c*col_j + d*col_k) in every matrix."""
    for m in mats:
        for row in m:
            x, y = row[j], row[k]
            row[j], row[k] = a * x + b * y, c * x + d * y


def _swap_cols(mats: list[Matrix], j: int, k: int) -> None:
    for m in mats:
        for row in m:
            row[j], row[k] = row[k], row[j]


def hermite_columns(m: Matrix, ncols: int | None = None) -> tuple[Matrix, Matrix, list[int]]:
    """Column-style Hermite normal form.

    Returns `(H, U, pivots)` with `m @ U == H`, `U` unimodular, and `H` in lower column
    echelon form: column `k < rank` has its first nonzero entry, positive, in row
    `pivots[k]` (increasing), entries left of a pivot reduced into `[0, pivot)`, and the
    columns from `rank` on are zero. `ncols` gives the width when `m` has no rows.
    """
    n = len(m[0]) if m else (ncols or 0)
    h = [list(row) for row in m]
    u = identity(n)
    pivots: list[int] = []
    k = 0
    for i in range(len(h)):
        if k >= n:
            break
        # Euclid on row i over columns k.. with unimodular column operations
        while True:
            nz = [j for j in range(k, n) if h[i][j] != 0]
            if not nz:
                break
            jmin = min(nz, key=lambda j: abs(h[i][j]))
            if jmin != k:
                _swap_cols([h, u], jmin, k)
            done = True
            for j in range(k + 1, n):
                if h[i][j] != 0:
                    q = h[i][j] // h[i][k]
                    _col_op([h, u], j, k, 1, -q, 0, 1)  # col_j -= q * col_k
                    if h[i][j] != 0:
                        done = False
            if done:
                break
        if h[i][k] == 0:
            continue
        if h[i][k] < 0:
            _negate_col([h, u], k)
        pivots.append(i)
        # reduce the entries left of the pivot into [0, pivot)
        p = h[i][k]
        for j in range(k):
            q = h[i][j] // p
            if q:
                _col_op([h, u], j, k, 1, -q, 0, 1)
        k += 1
    return h, u, pivots


def _negate_col(mats: list[Matrix], k: int) -> None:
    for m in mats:
        for row in m:
            row[k] = -row[k]


@dataclass(frozen=True)
class RatAffine:
    """A rational affine form `sum(c * s for s, c in coeffs) + const` over named symbols."""

    coeffs: tuple[tuple[str, Fraction], ...]
    const: Fraction

    @staticmethod
    def of(terms: dict[str, Fraction], const: Fraction) -> RatAffine:
        """A form from a symbol -> coefficient map (zeros dropped, names sorted)."""
        return RatAffine(tuple(sorted((s, c) for s, c in terms.items() if c != 0)),
                         Fraction(const))

    def scaled_to_int(self) -> tuple[dict[str, int], int, int]:
        """`(coeffs, const, d)` with integer coefficients such that `self == (...) / d`."""
        d = lcm(*(c.denominator for _, c in self.coeffs), self.const.denominator)
        return ({s: int(c * d) for s, c in self.coeffs}, int(self.const * d), d)


def _lin_comb(forms: list[tuple[Fraction, RatAffine]]) -> RatAffine:
    acc: dict[str, Fraction] = {}
    const = Fraction(0)
    for k, f in forms:
        if k == 0:
            continue
        for s, c in f.coeffs:
            acc[s] = acc.get(s, Fraction(0)) + k * c
        const += k * f.const
    return RatAffine.of(acc, const)


@dataclass(frozen=True)
class IntSolution:
    """All integer solutions of `M u = b`: `u = particular + sum_l t_l * kernel[l]`.

    `particular[i]` is a rational affine form in the right-hand side's symbols; it is an
    integer exactly when every form in `integral` is (each a form that must be an integer),
    and the system is consistent exactly when every form in `zero` vanishes.
    """

    particular: tuple[RatAffine, ...]
    kernel: tuple[tuple[int, ...], ...]
    integral: tuple[RatAffine, ...]
    zero: tuple[RatAffine, ...]


def solve_integer(m: Matrix, rhs: list[RatAffine], n: int) -> IntSolution:
    """Solve `m @ u = rhs` over the integers (`n` unknowns, rows of `m` have length n)."""
    h, u, pivots = hermite_columns(m, n)
    rank = len(pivots)
    y: list[RatAffine] = []
    zero: list[RatAffine] = []
    col_of_row = {row: k for k, row in enumerate(pivots)}
    for i in range(len(m)):
        acc = _lin_comb([(Fraction(1), rhs[i])] +
                        [(Fraction(-h[i][j]), y[j]) for j in range(len(y))])
        if i in col_of_row:
            k = col_of_row[i]
            assert k == len(y)
            y.append(_lin_comb([(Fraction(1, h[i][k]), acc)]))
        elif acc.coeffs or acc.const != 0:
            zero.append(acc)
    part = tuple(_lin_comb([(Fraction(u[i][k]), y[k]) for k in range(rank)])
                 for i in range(n))
    integral = tuple(p for p in part if any(c.denominator != 1 for _, c in p.coeffs)
                     or p.const.denominator != 1)
    kernel = tuple(tuple(u[i][k] for i in range(n)) for k in range(rank, n))
    return IntSolution(part, kernel, integral, tuple(zero))


def echelon_basis(vectors: list[list[int]], order: list[int]) -> list[list[int]]:
    """A basis of the lattice spanned by `vectors`, in echelon form along `order`.

    `order` lists coordinate positions; in the result, basis vector `l` is zero on the first
    `order`-positions where an earlier pivot sits and its own first nonzero entry (positive)
    comes strictly later than the previous vector's. Returned vectors use the original
    coordinate positions.
    """
    if not vectors:
        return []
    # rows of the transposed, permuted matrix are the coordinates in `order`
    t = [[v[pos] for v in vectors] for pos in order]
    h, _, pivots = hermite_columns(t, len(vectors))
    out = []
    for k in range(len(pivots)):
        vec = [0] * len(vectors[0])
        for r, pos in enumerate(order):
            vec[pos] = h[r][k]
        out.append(vec)
    return out
