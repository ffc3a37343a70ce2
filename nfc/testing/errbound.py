"""Running error analysis: the interpreter in float64 with a bound on the float32 error of
any evaluation order (`run_bounded`), and the comparisons against it (see nfc.testing)."""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nfc.ir import (
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
    Module,
    ReturnOp,
    Select,
    Unary,
    YieldOp,
)
from nfc.ops.lattice import WEAK_FLOAT, WEAK_INT, TypeClash, is_float, join, raise_clash

#: Unit roundoff of float64 and float32 (half an ulp of 1.0).
U64 = 2.0 ** -53
U32 = 2.0 ** -24
#: Unit roundoff of the 16-bit formats: f16 (11-bit significand) and bf16 (8 bits). Every
#: operation in these types, accumulation included, is charged this much: that covers both
#: nfc.interp (f16 rounded after every operation, sums accumulated in f32) and the backends
#: (f32 arithmetic rounded at stores and casts).
U16 = 2.0 ** -11
UBF16 = 2.0 ** -8


# `run_bounded` evaluates a function like `nfc.interp.run`, but every float value is computed
# in float64 (from float32 inputs, exactly representable) and carries `err`, a bound on
# |x_f32 - x| for the value x_f32 that *any* correct float32 evaluation can produce: any
# summation order, blocking, FMA contraction, vector width or thread split. The rules are the
# classic ones (Higham, Accuracy and Stability of Numerical Algorithms, ch. 3-4):
#
#   a op b (+ - *)   |a|eb + |b|ea + ea eb, then one rounding: u (|r| + that) + eta
#   a / b            (|a| eb + |b| ea) / (|b| (|b| - eb)), unbounded when |b| <= eb
#   sum of K terms   sum e_i + gamma(K - 1) sum (|t_i| + e_i) + K eta, gamma(n) = nu/(1 - nu),
#                    which holds for every summation tree (pairwise, blocked, vector lanes)
#   prod of K terms  prod (|t_i| + e_i) (1 + u)^(K - 1) - prod |t_i|
#   max, min, abs    the largest input error (they are 1-Lipschitz and exact)
#   f monotone       max |f(x +- e) - f(x)| (exact propagation), plus the approximation error
#                    of the backend's f: INTRINSIC_ULPS[f] u |f(x)|
#   select           the taken branch; where a float condition is within its error of flipping,
#                    a bound that covers both branches (`==` between values equal in the
#                    reference counts as sure: the argmax pattern `y == max(y)`)
#
# u is the unit roundoff of the value's dtype, eta = the smallest normal number (flush-to-zero
# and subnormal results). Rounding of the float64 reference itself is below 1e-9 of these
# bounds and ignored. An element whose bound is infinite (a division by a value whose error
# covers zero, a log of an interval reaching zero, an overflow) cannot be checked.

#: Accuracy of the float32 math functions of the CPU backend (codegen/llvm/intrinsics.py), in
#: units of u32: Cephes expf/logf and the Eigen rational tanh/erf are "a few ulp" (documented,
#: measured below 4e-7 relative = 7 u); sigmoid and rsqrt add a division and an addition; pow
#: by an integer constant up to 16 is up to 8 multiplications and a division. Twice those.
INTRINSIC_ULPS = {"exp": 16, "log": 16, "tanh": 16, "erf": 16, "sigmoid": 20, "sqrt": 2,
                  "rsqrt": 4, "pow": 20, "softplus": 24, "log1p": 16, "expm1": 16}
#: The same for float64 (libm, correctly rounded or within 1 ulp; pow by multiplications).
INTRINSIC_ULPS_F64 = {"exp": 4, "log": 4, "tanh": 4, "erf": 4, "sigmoid": 8, "sqrt": 2,
                      "rsqrt": 4, "pow": 20, "softplus": 8, "log1p": 4, "expm1": 4}

#: The probable mode (`run_bounded(..., probable=True)`) treats rounding errors as independent
#: with standard deviation at most u |result| (Higham and Mary, "A new approach to
#: probabilistic rounding error analysis", 2019): errors add in quadrature, a sum of K terms
#: gains u sqrt(K) sum |t_i| instead of K u sum |t_i|. The bound it returns is LAMBDA standard
#: deviations; for a Gaussian, 8 sigma is exceeded with probability 1e-15 per element.
#: Worst-case bounds grow with the product of the layers' norms and are useless past a few
#: layers; these stay within a small factor of the errors actually seen.
LAMBDA = 8.0

_UNIT = {DType.F32: U32, DType.F64: U64, DType.F16: U16, DType.BF16: UBF16}
_ETA = {DType.F32: 2.0 ** -126, DType.F64: 2.0 ** -1022, DType.F16: 2.0 ** -14,
        DType.BF16: 2.0 ** -126}


def _gamma(n: Any, u: float) -> Any:
    nu = np.asarray(n, np.float64) * u
    return np.where(nu < 0.5, nu / (1.0 - np.minimum(nu, 0.5)), np.inf)


_is_float = is_float  # the operator table's lattice (nfc.ops.lattice): one typing rule


def _unit(k: Any) -> float:
    # weak floats (literal arithmetic) are charged like float32: the backend may fold them
    # in either precision
    return _UNIT.get(k, U32) if _is_float(k) else 0.0


def _eta(k: Any) -> float:
    return _ETA.get(k, _ETA[DType.F32]) if _is_float(k) else 0.0


def _rounding_to(v: Any, dt: DType) -> Any:
    """|dt(v) - v|: the error of storing the float64 value `v` as `dt`."""
    v = np.asarray(v, np.float64)
    with np.errstate(all="ignore"):
        if dt == DType.BF16:  # float32 (numpy's stand-in) to bf16: nearest even
            x = np.array(v, dtype=np.float32)  # keeps 0-d shapes
            u = x.view(np.uint32).astype(np.uint64)
            r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(
                np.float32).reshape(x.shape)
            return np.abs(np.where(np.isnan(x), x, r).astype(np.float64) - v)
        return np.abs(v.astype(dt.numpy).astype(np.float64) - v)


class _BV:
    """A bounded value: float64 (or integer/bool) value, kind, error bound (for integers and
    booleans: > 0 where the value is uncertain)."""

    __slots__ = ("v", "k", "e")

    def __init__(self, v: Any, k: Any, e: Any = 0.0) -> None:
        self.v, self.k, self.e = v, k, e


def _convert(x: _BV, to: DType) -> _BV:
    """Give the weak value `x` the type `to`."""
    if to.is_float:
        v = np.asarray(x.v, np.float64)
        return _BV(v, to, x.e + (_rounding_to(v, to) if to != DType.F64 else 0.0))
    if x.k == WEAK_FLOAT:
        raise ValueError(f"a weak float meets an integer operand of type {to}")
    return _BV(np.asarray(x.v).astype(to.numpy), to, x.e)


def _unify(a: _BV, b: _BV) -> tuple[_BV, _BV, Any]:
    """The operands in their common kind (the lattice's join), weak ones converted."""
    try:
        k = join("operation", a.k, b.k, raise_clash)
    except TypeClash as exc:
        raise ValueError(str(exc)) from None
    if isinstance(k, DType):
        a = a if isinstance(a.k, DType) else _convert(a, k)
        b = b if isinstance(b.k, DType) else _convert(b, k)
    return a, b, k


def _monotone(fn: Any, v: Any, e: Any, lo_ok: float | None, lam: float
               ) -> tuple[Any, Any]:
    """f(v) and max |f(v +- lam e) - f(v)| / lam for a monotone f; infinite where v - lam e
    leaves the domain (lo_ok: the smallest argument allowed, None for all reals)."""
    lo, hi = v - lam * e, v + lam * e
    r = fn(v)
    if lo_ok is not None:
        bad = lo < lo_ok
        lo = np.where(bad, v, lo)
    prop = np.maximum(np.abs(fn(lo) - r), np.abs(fn(hi) - r))
    if lo_ok is not None:
        prop = np.where(bad, np.inf, prop)
    return r, prop / lam


def _sqrt_domain(v: Any, e: Any, lam: float) -> tuple[Any, Any]:
    # sqrt is fine down to 0 when the exact argument is >= 0 and its computed value cannot go
    # negative (sqrt(abs(x)), sqrt(x*x + c)): clamp the interval at 0 instead of giving up
    lo = np.maximum(v - lam * e, 0.0)
    r = np.sqrt(np.maximum(v, 0.0))
    prop = np.maximum(np.abs(np.sqrt(lo) - r), np.abs(np.sqrt(v + lam * e) - r))
    return np.where(v < 0, np.nan, r), prop / lam


def _sigmoid(v: Any) -> Any:
    return 1.0 / (1.0 + np.exp(-v))


_MONOTONE = {
    "exp": (np.exp, None), "tanh": (np.tanh, None), "sigmoid": (_sigmoid, None),
    "log": (np.log, 0.0), "rsqrt": (lambda v: 1.0 / np.sqrt(v), 0.0),
    "softplus": (lambda v: np.logaddexp(0.0, v), None), "log1p": (np.log1p, -1.0),
    "expm1": (np.expm1, None),
}


class _Bounded:
    """Evaluation of one chunk of a compute's body with error bounds (see run_bounded)."""

    def __init__(self, env: dict[int, tuple[np.ndarray, np.ndarray]],
                 grids: dict[str, np.ndarray], probable: bool) -> None:
        self.env = env
        self.grids = grids
        self.probable = probable
        self.lam = LAMBDA if probable else 1.0

    def comb(self, *errs: Any) -> Any:
        """The error of a sum of independent error terms: their sum, or in the probable mode
        the square root of the sum of their squares."""
        if self.probable:
            return np.sqrt(sum(np.square(x) for x in errs))
        return sum(errs)

    def rounded(self, r: Any, prop: Any, k: Any, ulps: float = 1.0) -> Any:
        """The propagated error `prop` plus the rounding (or approximation) of result r."""
        return self.comb(prop, ulps * _unit(k) * (np.abs(r) + prop)) + _eta(k)

    def eval(self, x: Expr) -> _BV:
        if isinstance(x, Const):
            if x.dtype is not None:
                if x.dtype.is_float:
                    v = np.float64(x.value)
                    return _BV(v, x.dtype, _rounding_to(v, x.dtype))
                return _BV(np.asarray(x.value, dtype=x.dtype.numpy), x.dtype)
            if isinstance(x.value, bool):
                return _BV(np.asarray(x.value), DType.I1)
            return _BV(x.value, WEAK_FLOAT if x.is_float else WEAK_INT)
        if isinstance(x, Index):
            return _BV(self.grids[x.name], WEAK_INT)
        if isinstance(x, Load):
            return self._load(x)
        if isinstance(x, Unary):
            a = self.eval(x.x)
            if x.op == "not":
                return _BV(np.logical_not(a.v), DType.I1, a.e)
            return _BV(-a.v, a.k, a.e)
        if isinstance(x, Binary):
            return self._binary(x)
        if isinstance(x, Select):
            return self._select(x)
        if isinstance(x, Cast):
            return self._cast(x)
        if isinstance(x, Call):
            return self._call(x)
        raise ValueError(f"unknown expression {x!r}")

    def _load(self, x: Load) -> _BV:
        arr, err = self.env[id(x.tensor)]
        idxs, unsure = [], 0.0
        for d, ie in enumerate(x.indices):
            i = self.eval(ie)
            idxs.append(np.clip(np.asarray(i.v).astype(np.int64), 0, arr.shape[d] - 1))
            unsure = unsure + i.e
        e = err[tuple(idxs)]
        if np.any(unsure):  # an index computed from floats that may round the other way
            e = np.where(np.asarray(unsure) > 0, np.inf, e)
        return _BV(arr[tuple(idxs)], x.tensor.dtype, e)

    def _binary(self, x: Binary) -> _BV:
        a, b = self.eval(x.a), self.eval(x.b)
        if x.op in ("and", "or"):
            ua, ub = np.asarray(a.e) > 0, np.asarray(b.e) > 0
            va, vb = np.asarray(a.v, bool), np.asarray(b.v, bool)
            if x.op == "and":
                unsure = (ua & (vb | ub)) | (ub & (va | ua))
                return _BV(va & vb, DType.I1, unsure.astype(np.float64))
            unsure = (ua & (~vb | ub)) | (ub & (~va | ua))
            return _BV(va | vb, DType.I1, unsure.astype(np.float64))
        a, b, k = _unify(a, b)
        ea, eb = a.e, b.e
        if x.op in _COMPARE:
            v = _COMPARE[x.op](a.v, b.v)
            if _is_float(k):
                unsure = ((np.asarray(ea + eb) > 0)
                          & (np.abs(a.v - b.v) <= self.lam * (ea + eb)))
                if x.op in ("==", "!="):
                    # values equal in the reference are taken to be the same computed value:
                    # the argmax pattern `y == max(y)` (max-pool and cross-entropy gradients);
                    # a near tie with another element still makes that one unsure
                    unsure &= a.v != b.v
            else:
                unsure = np.asarray(ea + eb) > 0
            return _BV(v, DType.I1, unsure.astype(np.float64))
        if not _is_float(k):
            v = {"+": np.add, "-": np.subtract, "*": np.multiply, "//": np.floor_divide,
                 "%": np.remainder}[x.op](a.v, b.v)
            e = ea + eb if x.op in "+-" else np.where(np.asarray(ea + eb) > 0, np.inf, 0.0)
            return _BV(v, k, e)
        u = _unit(k)
        va, vb = np.asarray(a.v, np.float64), np.asarray(b.v, np.float64)
        if x.op in ("+", "-"):
            v = va + vb if x.op == "+" else va - vb
            prop = self.comb(ea, eb)
        elif x.op == "*":
            v = va * vb
            prop = self.comb(np.abs(va) * eb, np.abs(vb) * ea) + ea * eb
        elif x.op == "/":
            v = va / vb
            room = np.abs(vb) - self.lam * eb
            prop = np.where(room > 0, self.comb(np.abs(va) * eb, np.abs(vb) * ea)
                            / (np.abs(vb) * np.where(room > 0, room, 1.0)), np.inf)
        else:  # float // and %: exact unless the quotient may round across an integer
            q = va / vb
            room = np.abs(vb) - self.lam * eb
            qe = np.where(room > 0, (np.abs(va) * eb + np.abs(vb) * ea)
                          / (np.abs(vb) * np.where(room > 0, room, 1.0)), np.inf)
            qe = self.lam * qe + 2 * u * np.abs(q)
            fq = np.floor(q)
            unsure = (q - fq <= qe) | (fq + 1 - q <= qe)
            if x.op == "//":
                return _BV(fq, k, np.where(unsure, np.inf, 0.0))
            v = va - vb * fq
            prop = np.where(unsure, np.inf, ea + np.abs(fq) * eb + 2 * u * np.abs(vb * fq))
        return _BV(v, k, self.rounded(v, prop, k))

    def _select(self, x: Select) -> _BV:
        c = self.eval(x.cond)
        a, b, k = _unify(self.eval(x.a), self.eval(x.b))
        cv = np.asarray(c.v, bool)
        v = np.where(cv, a.v, b.v)
        e = np.where(cv, a.e, b.e)
        if np.any(c.e):  # either branch may be taken where the condition is unsure
            if _is_float(k):
                both = np.maximum(np.abs(v - a.v) + a.e, np.abs(v - b.v) + b.e)
            else:
                both = np.where(v != np.where(cv, b.v, a.v), np.inf, np.maximum(a.e, b.e))
            e = np.where(np.asarray(c.e) > 0, np.maximum(e, both), e)
        return _BV(v, k, e)

    def _cast(self, x: Cast) -> _BV:
        a = self.eval(x.x)
        to = x.dtype
        if to.is_float:
            if _is_float(a.k):
                v = np.asarray(a.v, np.float64)
                narrows = a.k != to and (to == DType.F32 or to in (DType.F16, DType.BF16))
                e = a.e + (_unit(to) * (np.abs(v) + a.e) if narrows else 0.0)
                return _BV(v, to, e)
            v = np.asarray(a.v).astype(np.float64)
            return _BV(v, to, a.e + _rounding_to(v, to))
        if to == DType.I1:
            v = np.asarray(a.v) != 0
            return _BV(v, to, (np.abs(np.asarray(a.v, np.float64)) <= a.e).astype(np.float64)
                       * (np.asarray(a.e) > 0))
        if _is_float(a.k):
            v = np.asarray(a.v, np.float64)
            t = np.trunc(v)
            le = self.lam * a.e
            e = np.maximum(np.abs(np.trunc(v - le) - t), np.abs(np.trunc(v + le) - t))
            return _BV(t.astype(to.numpy), to, e)
        return _BV(np.asarray(a.v).astype(to.numpy), to, a.e)

    def _call(self, x: Call) -> _BV:
        from nfc.interp import erf
        from nfc.philox import philox_uniform

        args = [self.eval(a) for a in x.args]
        fn = x.fn
        if fn == "philox":
            key, ctr = (np.asarray(a.v).astype(np.int64) for a in args)
            unsure = np.asarray(args[0].e + args[1].e) > 0
            return _BV(philox_uniform(key, ctr), WEAK_FLOAT, np.where(unsure, np.inf, 0.0))
        if fn in ("max", "min"):
            a, b, k = _unify(args[0], args[1])
            v = (np.maximum if fn == "max" else np.minimum)(a.v, b.v)
            return _BV(v, k, np.maximum(a.e, b.e))
        if fn == "pow":
            return self._pow(*args)
        if fn not in _MONOTONE and fn not in ("abs", "sqrt", "erf"):
            return self._unknown(fn, args)
        (a,) = args
        if fn == "abs":
            return _BV(np.abs(a.v), a.k, a.e)
        k = a.k if isinstance(a.k, DType) else WEAK_FLOAT
        v = np.asarray(a.v, np.float64)
        if fn == "sqrt":
            r, prop = _sqrt_domain(v, a.e, self.lam)
        elif fn == "erf":
            r, prop = _monotone(erf, v, a.e, None, self.lam)
        else:
            f, lo = _MONOTONE[fn]
            r, prop = _monotone(f, v, a.e, lo, self.lam)
        ulps = (INTRINSIC_ULPS_F64 if k == DType.F64 else INTRINSIC_ULPS)[fn]
        return _BV(r, k, self.rounded(r, prop, k, ulps))

    def _unknown(self, fn: str, args: list[_BV]) -> _BV:
        """An intrinsic without an error rule here (from the operator table or a plugin): its
        value from the table's numpy function, no bound (the elements are not checked)."""
        from nfc import ops

        row = ops.get(fn)
        if row is None or row.numpy is None:
            raise ValueError(f"unknown intrinsic '{fn}'")
        floats = [_is_float(a.k) for a in args]
        vals = [np.asarray(a.v, np.float64) if f else np.asarray(a.v)
                for a, f in zip(args, floats, strict=True)]
        v = np.asarray(row.numpy(*vals))
        k = next((a.k for a in args if isinstance(a.k, DType)), WEAK_FLOAT)
        if v.dtype == np.bool_:
            return _BV(v, DType.I1, np.ones(v.shape))
        return _BV(v.astype(np.float64), k, np.full(v.shape, np.inf))

    def _pow(self, a: _BV, b: _BV) -> _BV:
        a, b, k = _unify(a, b)
        if not _is_float(k):
            a, b, k = _convert(a, DType.F64), _convert(b, DType.F64), WEAK_FLOAT
        va, vb = np.asarray(a.v, np.float64), np.asarray(b.v, np.float64)
        r = np.power(va, vb)
        ea, eb = self.lam * a.e, self.lam * b.e
        lo, hi = va - ea, va + ea
        if np.all(eb == 0) and np.all(vb == np.round(vb)) and np.all(vb >= 0):
            # |x^n - y^n| <= (|y| + d)^n - |y|^n for integers n >= 0 and any sign
            prop = np.power(np.abs(va) + ea, vb) - np.power(np.abs(va), vb)
        else:  # a positive base: monotone in each argument, extremes at the corners
            corners = [np.power(p, q) for p in (lo, hi) for q in (vb - eb, vb + eb)]
            prop = np.max([np.abs(c - r) for c in corners], axis=0)
            prop = np.where(lo > 0, prop, np.inf)
        ulps = (INTRINSIC_ULPS_F64 if k == DType.F64 else INTRINSIC_ULPS)["pow"]
        return _BV(r, k, self.rounded(r, prop / self.lam, k, ulps))


_COMPARE = {"<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
            "==": np.equal, "!=": np.not_equal}


def _compute_bounded(op: ComputeOp, env: dict[int, tuple[np.ndarray, np.ndarray]],
                     probable: bool) -> tuple[np.ndarray, np.ndarray]:
    """(value, error bound) of a compute, evaluated in chunks like nfc.interp."""
    from nfc.interp import _chunks

    rt = op.result.type
    dt = rt.dtype
    axes = op.all_axes
    nd = len(op.dims)
    extents = [a.extent for a in axes]
    red = op.reduce
    nred = int(np.prod(extents[nd:], dtype=np.int64)) if red else 1
    vdt = np.float64 if dt.is_float else dt.numpy
    value = np.zeros(rt.shape, vdt)
    # per output element: the error sum (sum), sum of |terms| + errors (sum); the products of
    # |terms| + errors and of |terms| (prod); the largest error (max, min, elementwise)
    acc_e = np.zeros(rt.shape)
    acc_a = np.zeros(rt.shape)
    k, block = _chunks(extents) if extents else (0, 1)
    prefix = [range(x) for x in extents[:k]]
    with np.errstate(all="ignore"):
        for pre in itertools.product(*prefix):
            for start in range(0, extents[k] if extents else 1, block):
                starts = (list(pre) + [start] + [0] * len(extents))[:len(extents)]
                stops = [s + 1 for s in pre]
                if extents:
                    stops += [min(start + block, extents[k])] + extents[k + 1:]
                stops = stops[:len(extents)]
                shape = tuple(t - s for s, t in zip(starts, stops, strict=True))
                grids = {a.name: np.arange(s, t, dtype=np.int64).reshape(
                    [1] * j + [t - s] + [1] * (len(axes) - j - 1))
                    for j, (a, s, t) in enumerate(zip(axes, starts, stops, strict=True))}
                r = _Bounded(env, grids, probable).eval(op.body)
                if isinstance(r.k, str):  # a weak body takes the result's type
                    r = _convert(r, dt)
                v = np.broadcast_to(np.asarray(r.v).astype(vdt), shape)
                e = np.broadcast_to(np.asarray(r.e, np.float64), shape)
                sl = tuple(slice(s, t) for s, t in zip(starts[:nd], stops[:nd], strict=True))
                first = all(s == 0 for s in starts[nd:])
                raxes = tuple(range(nd, len(axes)))
                if red is None:
                    value[sl], acc_e[sl] = v, e
                elif red == "sum":
                    part = (v.sum(axis=raxes), (e * e if probable else e).sum(axis=raxes),
                            (np.abs(v) + e).sum(axis=raxes))
                    if first:
                        value[sl], acc_e[sl], acc_a[sl] = part
                    else:
                        value[sl] += part[0]
                        acc_e[sl] += part[1]
                        acc_a[sl] += part[2]
                elif red == "prod":
                    part = (v.prod(axis=raxes), (np.abs(v) + e).prod(axis=raxes),
                            np.abs(v).prod(axis=raxes))
                    if first:
                        value[sl], acc_e[sl], acc_a[sl] = part
                    else:
                        value[sl] *= part[0]
                        acc_e[sl] *= part[1]
                        acc_a[sl] *= part[2]
                else:
                    fn = np.max if red == "max" else np.min
                    part = (fn(v, axis=raxes), e.max(axis=raxes))
                    if first:
                        value[sl], acc_e[sl] = part
                    else:
                        value[sl] = (np.maximum if red == "max" else np.minimum)(value[sl],
                                                                                part[0])
                        acc_e[sl] = np.maximum(acc_e[sl], part[1])
        if red == "sum" and dt.is_float and probable:
            # sequential summation's error is sum_j delta_j s_j over K - 1 partial sums
            # |s_j| <= sum |t_i|, with independent |delta_j| <= u
            err = (np.hypot(np.sqrt(acc_e), _unit(dt) * np.sqrt(nred - 1) * acc_a)
                   + nred * _eta(dt))
        elif red == "sum" and dt.is_float:
            err = acc_e + _gamma(nred - 1, _unit(dt)) * acc_a + nred * _eta(dt)
        elif red == "prod" and dt.is_float:
            err = acc_e * (1.0 + _unit(dt)) ** (nred - 1) - acc_a + nred * _eta(dt)
        elif red in ("sum", "prod"):
            err = np.where(acc_e > 0, np.inf, 0.0) if red == "prod" else acc_e
        else:
            err = acc_e
        if red in ("sum", "prod") and dt in (DType.F16, DType.BF16):
            err = err + _unit(dt) * (np.abs(value) + err)  # accumulated wider, then stored
    return value, np.where(np.isnan(err), np.inf, err)


def run_bounded(func: Func, inputs: Sequence[Any] | Mapping[str, Any], *,
                errors: Mapping[str, Any] | None = None, module: Module | None = None,
                probable: bool = False) -> list[tuple[np.ndarray, np.ndarray]]:
    """Run `func` like `nfc.interp.run`, in float64, with error bounds: for each result, its
    value and a bound on how far any correct evaluation in the function's own float types
    may be from it (see the comment above). `errors` gives inputs known only to within a
    bound, by argument name (the parameters after an earlier training step, say).

    `probable`: the statistical bound instead of the worst case, for deep computations (see
    LAMBDA)."""
    values = ([inputs[a.name] for a in func.args] if isinstance(inputs, Mapping)
              else list(inputs))
    lam = LAMBDA if probable else 1.0
    env: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for a, x in zip(func.args, values, strict=True):
        arr = np.asarray(x)
        assert arr.shape == a.shape, (a.name, arr.shape, a.shape)
        e = np.asarray((errors or {}).get(a.name, 0.0), np.float64) / lam
        env[id(a)] = (arr.astype(np.float64) if a.dtype.is_float else arr,
                      np.broadcast_to(e, arr.shape))
    outs = _run_block_bounded(func.body, env, module, probable)
    return [(v, e * lam if v.dtype.kind == "f" else e) for v, e in outs]


def _run_block_bounded(block: Block, env: dict[int, tuple[np.ndarray, np.ndarray]],
                       module: Module | None, probable: bool
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
    for op in block.ops:
        if isinstance(op, ReturnOp | YieldOp):
            return [env[id(v)] for v in op.values]
        if isinstance(op, ComputeOp):
            env[id(op.result)] = _compute_bounded(op, env, probable)
        elif isinstance(op, CallOp):
            assert module is not None, "nf.call needs module="
            callee = module.func(op.callee)
            sub = {id(a): env[id(v)] for a, v in zip(callee.args, op.args, strict=True)}
            outs = _run_block_bounded(callee.body, sub, module, probable)
            env.update({id(r): o for r, o in zip(op.results, outs, strict=True)})
        elif isinstance(op, KernelOp):
            outs = _run_block_bounded(op.body, env, module, probable)
            env.update({id(r): o for r, o in zip(op.results, outs, strict=True)})
        else:
            raise ValueError(f"cannot evaluate {op.opname}")
    raise ValueError("a block ends without nf.return")


#: Factor between the bound and an accepted difference. The bounds are rigorous to first
#: order for the program as written; the pipeline may legitimately add a rounding per
#: operation (a division by a constant done as a multiplication by its reciprocal), at most
#: doubling them.
SLACK = 2.0


def bound_violations(got: Any, value: np.ndarray, error: np.ndarray, *,
                     slack: float = SLACK) -> tuple[np.ndarray, int]:
    """(mask of elements of `got` outside `slack` x their bound, number of elements that
    cannot be checked: non-finite reference or bound). Integers must match exactly where
    their bound is 0."""
    got = np.asarray(got)
    value, error = np.broadcast_arrays(np.asarray(value), np.asarray(error, np.float64))
    if got.shape != value.shape:
        raise AssertionError(f"shape {got.shape}, expected {value.shape}")
    if got.dtype.kind not in "fc":
        sure = error == 0
        return sure & (got != value), int((~sure).sum())
    ok = np.isfinite(value) & np.isfinite(error)
    with np.errstate(all="ignore"):
        diff = np.abs(got.astype(np.float64) - value)
        bad = ok & ~(diff <= slack * error)
    return bad, int((~ok).sum())


def assert_within_bounds(got: Any, value: np.ndarray, error: np.ndarray, *, name: str = "",
                         slack: float = SLACK) -> int:
    """Fail, naming the worst element, where `got` leaves the bound; returns how many
    elements could not be checked."""
    bad, unchecked = bound_violations(got, value, error, slack=slack)
    if bad.any():
        got = np.asarray(got, np.float64)
        diff = np.abs(got - value)
        ratio = np.where(bad, diff / np.maximum(slack * np.broadcast_to(error, bad.shape),
                                                1e-300), 0)
        i = np.unravel_index(int(np.argmax(ratio)), bad.shape)
        raise AssertionError(
            f"{name or 'result'}: {int(bad.sum())} of {bad.size} elements outside the error "
            f"bound; worst at {tuple(int(j) for j in i)}: got {got[i]!r}, reference "
            f"{np.broadcast_to(value, bad.shape)[i]!r}, bound {slack} x "
            f"{np.broadcast_to(error, bad.shape)[i]:.3g}")
    return unchecked
