"""Integer linear algebra, quasi-affine normal forms and access inversion, checked by brute
force against enumeration."""

from __future__ import annotations

import itertools
import operator
import random
from fractions import Fraction

import numpy as np
import pytest

from nfc.ir import Axis, Binary, Const, Expr, Index, Unary
from nfc.passes.autodiff.indexsolve import invert_access
from nfc.passes.autodiff.intlinalg import (
    RatAffine,
    echelon_basis,
    hermite_columns,
    solve_integer,
)
from nfc.passes.autodiff.qa import QACtx, const, to_expr, var
from nfc.printer import format_expr


def _in_lattice(vectors: list[list[int]], d: list[int]) -> bool:
    if not vectors:
        return all(x == 0 for x in d)
    a = np.array(vectors, dtype=float).T
    t = np.linalg.lstsq(a, np.array(d, dtype=float), rcond=None)[0]
    return bool(np.allclose(a @ t, d) and np.allclose(t, np.round(t)))


def test_hermite_and_solve_random():
    rnd = random.Random(0)
    for _ in range(400):
        m, n = rnd.randint(0, 4), rnd.randint(1, 5)
        mat = [[rnd.randint(-6, 6) for _ in range(n)] for _ in range(m)]
        h, u, piv = hermite_columns(mat, n)
        for i in range(m):
            for k in range(n):
                assert sum(mat[i][j] * u[j][k] for j in range(n)) == h[i][k]
        assert abs(round(np.linalg.det(np.array(u, dtype=float)))) == 1
        for k, row in enumerate(piv):
            assert h[row][k] > 0 and all(h[i][k] == 0 for i in range(row))
        assert all(h[i][k] == 0 for k in range(len(piv), n) for i in range(m))
        # every integer solution is the particular one plus a lattice vector
        us = [rnd.randint(-5, 5) for _ in range(n)]
        rhs = [RatAffine.of({}, Fraction(sum(mat[i][j] * us[j] for j in range(n))))
               for i in range(m)]
        sol = solve_integer(mat, rhs, n)
        assert not sol.zero and not sol.integral
        diff = [us[i] - int(sol.particular[i].const) for i in range(n)]
        assert _in_lattice([list(v) for v in sol.kernel], diff)
        order = list(range(n))
        rnd.shuffle(order)
        eb = echelon_basis([list(v) for v in sol.kernel], order)
        assert len(eb) == len(sol.kernel)
        for v in sol.kernel:
            assert _in_lattice(eb, list(v))


def test_symbolic_rhs_gives_divisibility_conditions():
    # 2 p + 2 r = z: solvable only for even z
    sol = solve_integer([[2, 2]], [RatAffine.of({"z": Fraction(1)}, Fraction(0))], 2)
    assert len(sol.integral) >= 1 and len(sol.kernel) == 1


def _ev(q, env):
    total = q.const
    for a, c in q.terms:
        name = type(a).__name__
        if name == "Var":
            v = env[a.name]
        elif name == "Div":
            v = _ev(a.x, env) // a.c
        else:
            v = _ev(a.x, env) % a.c
        total += c * v
    return total


def test_quasi_affine_rules_and_fuzz():
    ranges = {"z": (0, 11), "s": (0, 1), "w": (0, 23)}
    cx = QACtx(ranges)
    z, w = var("z"), var("w")
    assert format_expr(to_expr(cx.sub(z, cx.scale(cx.floordiv(z, 2), 2)))) == "z % 2"
    assert format_expr(to_expr(cx.add(cx.scale(cx.floordiv(w, 4), 4), cx.mod(w, 4)))) == "w"
    assert format_expr(to_expr(cx.floordiv(cx.floordiv(w, 2), 3))) == "w // 6"
    assert format_expr(to_expr(cx.mod(cx.mod(w, 6), 3))) == "w % 3"
    assert format_expr(to_expr(cx.sub(cx.floordiv(w, 2), cx.scale(cx.floordiv(w, 4), 2)))) \
        == "w // 2 % 2"
    rnd = random.Random(1)

    def build(d):
        if d == 0 or rnd.random() < 0.3:
            ch = rnd.choice(["z", "s", "w", "c"])
            if ch == "c":
                k = rnd.randint(-5, 5)
                return const(k), (lambda env, k=k: k)
            return var(ch), (lambda env, ch=ch: env[ch])
        op = rnd.choice(["+", "-", "*", "//", "%"])
        a, fa = build(d - 1)
        if op in "+-":
            b, fb = build(d - 1)
            if op == "+":
                return cx.add(a, b), (lambda env: fa(env) + fb(env))
            return cx.sub(a, b), (lambda env: fa(env) - fb(env))
        k = rnd.randint(1, 5)
        if op == "*":
            return cx.scale(a, k), (lambda env: fa(env) * k)
        if op == "//":
            return cx.floordiv(a, k), (lambda env: fa(env) // k)
        return cx.mod(a, k), (lambda env: fa(env) % k)

    for _ in range(1500):
        q, f = build(4)
        iv = cx.interval(q)
        for _ in range(8):
            env = {n: rnd.randint(*r) for n, r in ranges.items()}
            assert _ev(q, env) == f(env)
            if iv is not None:
                assert iv[0] <= f(env) <= iv[1]


_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "//": operator.floordiv,
        "%": operator.mod, "<": operator.lt, "<=": operator.le, "==": operator.eq,
        "and": lambda a, b: a and b}


def _eval(e: Expr, env: dict[str, int]) -> int:
    if isinstance(e, Const):
        return int(e.value)
    if isinstance(e, Index):
        return env[e.name]
    if isinstance(e, Unary):
        return -_eval(e.x, env)
    assert isinstance(e, Binary)
    return _OPS[e.op](_eval(e.a, env), _eval(e.b, env))


def _x(n: str) -> Expr:
    return Index(n)


INVERSIONS = [
    ("strided conv", [("p", 5), ("r", 3)], [_x("p") * 2 + _x("r")], [11], 2),
    ("padded strided", [("p", 5), ("r", 3)], [_x("p") * 2 + _x("r") - 1], [9], 2),
    ("dilated", [("p", 6), ("r", 3)], [_x("p") + _x("r") * 2], [10], 3),
    ("matmul dW", [("n", 3), ("j", 4), ("k", 5)], [_x("k"), _x("j")], [5, 4], 3),
    ("reshape", [("i", 4), ("j", 6)],
     [(_x("i") * 6 + _x("j")) // 8, (_x("i") * 6 + _x("j")) % 8], [3, 8], 1),
    ("depth2space", [("c", 2), ("h", 6), ("w", 4)],
     [_x("c") * 4 + (_x("h") % 2) * 2 + _x("w") % 2, _x("h") // 2, _x("w") // 2],
     [8, 3, 2], 1),
    ("upsample", [("h", 8)], [_x("h") // 2], [4], 2),
    ("pool", [("p", 4), ("r", 2)], [_x("p") * 2 + _x("r")], [8], 1),
    ("broadcast", [("h", 3), ("c", 4)], [_x("h"), Const(0)], [3, 2], 4),
    ("channel shuffle", [("c", 12)], [(_x("c") % 3) * 4 + _x("c") // 3], [12], 1),
    ("stride+dilation", [("p", 4), ("r", 3)], [_x("p") * 2 + _x("r") * 2], [12], 3),
    ("stride3 dilation2", [("p", 4), ("r", 3)], [_x("p") * 3 + _x("r") * 2 - 2], [12], 1),
    ("diagonal", [("i", 4)], [_x("i"), _x("i")], [4, 4], 1),
    ("reshape two", [("a", 3), ("b", 4), ("c", 2)],
     [(_x("a") * 8 + _x("b") * 2 + _x("c")) // 6,
      ((_x("a") * 8 + _x("b") * 2 + _x("c")) // 2) % 3, _x("c")], [4, 3, 2], 1),
]


@pytest.mark.parametrize("name,fwd,idx,shape,max_work", INVERSIONS,
                         ids=[c[0] for c in INVERSIONS])
def test_inversion_matches_enumeration(name, fwd, idx, shape, max_work):
    fwd_axes = [Axis(n, e) for n, e in fwd]
    zd = [Axis(f"z{i}", s) for i, s in enumerate(shape)]
    inv = invert_access(fwd_axes, idx, zd)
    expect: dict[tuple, list] = {}
    for pt in itertools.product(*[range(a.extent) for a in fwd_axes]):
        env = {a.name: v for a, v in zip(fwd_axes, pt, strict=True)}
        z = tuple(_eval(e, env) for e in idx)
        if all(0 <= zi < s for zi, s in zip(z, shape, strict=True)):
            expect.setdefault(z, []).append(pt)
    got: dict[tuple, list] = {}
    assert inv is not None
    for z in itertools.product(*[range(s) for s in shape]):
        for sp in itertools.product(*[range(a.extent) for a in inv.axes]):
            env = {a.name: v for a, v in zip(zd, z, strict=True)}
            env |= {a.name: v for a, v in zip(inv.axes, sp, strict=True)}
            if all(_eval(g, env) for g in inv.guards):
                got.setdefault(z, []).append(tuple(_eval(inv.subst[a.name], env)
                                                   for a in fwd_axes))
    assert {k: sorted(v) for k, v in expect.items()} == {k: sorted(v) for k, v in got.items()}
    # the reduction space per gradient element is tight (counts from ceil(extent / step))
    assert np.prod([a.extent for a in inv.axes]) <= max_work


def test_inversion_of_unreachable_constant_index():
    # A[h, 5] of a tensor whose last dimension has 3 elements: never read
    assert invert_access([Axis("h", 3)], [_x("h"), Const(5)],
                         [Axis("z0", 3), Axis("z1", 3)]) is None
