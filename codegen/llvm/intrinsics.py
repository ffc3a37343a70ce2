"""Math intrinsics in LLVM IR that work on scalars and vectors alike.

f32 `exp`, `log`, `tanh`, `erf` (and `sigmoid`, `softplus`, `log1p`, `expm1`, `pow` through
them) are inline polynomial or rational approximations (Cephes `expf`/`logf`; the rational
`tanh`/`erf` of Eigen/XLA), a few ulp from libm, so a vectorized loop stays vectorized: LLVM
would otherwise scalarise `llvm.exp.v8f32` into eight `expf` calls. f64 uses libm through LLVM
intrinsics (accurate to 1e-15 as the f64 tests need), lane by lane in vector code, as does
`atan2` in both precisions. `philox` is Philox-4x32-10 on 32-bit lanes computed in 64-bit
integers (nfc/philox.py is the reference).

f16 and bf16 are storage formats: in memory an element is 16 bits (an `i16`, so masked loads,
gathers and stores need nothing special), in registers an f32. `half_to_f32`/`f32_to_half`
and `bf16_to_f32`/`f32_to_bf16` convert between the two: f16 by LLVM's `fpext`/`fptrunc`
(F16C's `vcvtph2ps`/`vcvtps2ph`), bf16 by a 16-bit shift on the way in and, on the way out,
round-to-nearest-even either by LLVM's `fptrunc` to `bfloat` (AVX-512 BF16's
`vcvtneps2bf16`; `native=True`) or by integer arithmetic that vectorises everywhere (LLVM
would otherwise call `__truncsfbf2` once per element).
"""

from __future__ import annotations

import math

from llvmlite import ir

F32 = ir.FloatType()
F64 = ir.DoubleType()
I1 = ir.IntType(1)
I32 = ir.IntType(32)
I64 = ir.IntType(64)
I16 = ir.IntType(16)
F16 = ir.HalfType()


class BFloatType(ir.types._BaseFloatType):
    """LLVM's `bfloat` (llvmlite has no such type); used only as a conversion target."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self) -> str:
        return "bfloat"

    def format_constant(self, value: float) -> str:
        raise NotImplementedError("bfloat constants are never emitted (registers hold f32)")


BFloatType._create_instance()
BF16 = BFloatType()


def lanes(t: ir.Type) -> int | None:
    """Vector width of `t`, None for a scalar."""
    return t.count if isinstance(t, ir.VectorType) else None


def elem(t: ir.Type) -> ir.Type:
    """Element type of a vector type, or the type itself."""
    return t.element if isinstance(t, ir.VectorType) else t


def like(t: ir.Type, e: ir.Type) -> ir.Type:
    """`e` with the shape (scalar or vector) of `t`."""
    n = lanes(t)
    return e if n is None else ir.VectorType(e, n)


def const(t: ir.Type, v: float | int) -> ir.Constant:
    """A scalar constant, or a splat vector constant, of type `t`."""
    n = lanes(t)
    if n is None:
        return ir.Constant(t, v)
    return ir.Constant(t, [ir.Constant(t.element, v)] * n)


def type_suffix(t: ir.Type) -> str:
    """LLVM's overload suffix of a type: `f32`, `v8f32`, `i64`, `v4i1`."""
    e = elem(t)
    base = {"float": "f32", "double": "f64"}.get(str(e), str(e))
    n = lanes(t)
    return base if n is None else f"v{n}{base}"


def declare(module: ir.Module, name: str, ret: ir.Type, args: list[ir.Type]) -> ir.Function:
    """The function `name` of `module`, declared if missing."""
    fn = module.globals.get(name)
    if fn is None:
        fn = ir.Function(module, ir.FunctionType(ret, args), name=name)
    return fn


def intrinsic(b: ir.IRBuilder, name: str, args: list[ir.Value], *,
              ret: ir.Type | None = None, overload: ir.Type | None = None,
              fastmath: tuple[str, ...] = ()) -> ir.Value:
    """Call the overloaded LLVM intrinsic `llvm.<name>.<suffix of overload or args[0]>`."""
    t = overload or args[0].type
    rt = ret or args[0].type
    fn = declare(b.module, f"llvm.{name}.{type_suffix(t)}", rt, [a.type for a in args])
    return b.call(fn, args, fastmath=fastmath)


def fma(b: ir.IRBuilder, x: ir.Value, y: ir.Value, z: ir.Value) -> ir.Value:
    """x*y + z with one rounding."""
    return intrinsic(b, "fma", [x, y, z])


def _poly(b: ir.IRBuilder, x: ir.Value, coeffs: list[float]) -> ir.Value:
    """Horner: coeffs[0]*x^n + ... + coeffs[n], with FMAs."""
    acc = const(x.type, coeffs[0])
    for c in coeffs[1:]:
        acc = fma(b, acc, x, const(x.type, c))
    return acc


def _fmin(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.fcmp_ordered("<", x, y), x, y)


def _fmax(b: ir.IRBuilder, x: ir.Value, y: ir.Value) -> ir.Value:
    return b.select(b.fcmp_ordered(">", x, y), x, y)


def _keep_nan(b: ir.IRBuilder, x: ir.Value, r: ir.Value) -> ir.Value:
    return b.select(b.fcmp_unordered("uno", x, x), x, r)


def exp_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e**x in f32: range reduction by ln 2 and a degree-6 polynomial (Cephes expf)."""
    t = x.type
    xc = _fmax(b, _fmin(b, x, const(t, 88.72283905206835)), const(t, -103.97))
    n = intrinsic(b, "floor", [fma(b, xc, const(t, 1.44269504088896341), const(t, 0.5))])
    r = fma(b, n, const(t, -0.693359375), xc)
    r = fma(b, n, const(t, 2.12194440e-4), r)
    z = b.fmul(r, r)
    p = _poly(b, r, [1.9875691500e-4, 1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2,
                     1.6666665459e-1, 5.0000001201e-1])
    y = b.fadd(fma(b, p, z, r), const(t, 1.0))
    # scale by 2**n in two halves, so 2**128 and the subnormal results stay representable
    it = like(t, I32)
    ni = b.fptosi(n, it)
    n1 = b.ashr(ni, const(it, 1))
    for part in (n1, b.sub(ni, n1)):
        bits = b.shl(b.add(part, const(it, 127)), const(it, 23))
        y = b.fmul(y, b.bitcast(bits, t))
    y = b.select(b.fcmp_ordered(">", x, const(t, 88.72283905206835)), const(t, math.inf), y)
    y = b.select(b.fcmp_ordered("<", x, const(t, -103.97)), const(t, 0.0), y)
    return _keep_nan(b, x, y)


def log_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Natural log in f32 (Cephes logf); 0 gives -inf, negatives NaN, inf inf."""
    t = x.type
    it = like(t, I32)
    bits = b.bitcast(x, it)
    e = b.sub(b.and_(b.lshr(bits, const(it, 23)), const(it, 0xFF)), const(it, 126))
    m = b.bitcast(b.or_(b.and_(bits, const(it, 0x807FFFFF)), const(it, 0x3F000000)), t)
    small = b.fcmp_ordered("<", m, const(t, 0.707106781186547524))
    e = b.sub(e, b.zext(small, it))
    m = b.fsub(b.select(small, b.fadd(m, m), m), const(t, 1.0))
    ef = b.sitofp(e, t)
    z = b.fmul(m, m)
    p = _poly(b, m, [7.0376836292e-2, -1.1514610310e-1, 1.1676998740e-1, -1.2420140846e-1,
                     1.4249322787e-1, -1.6668057665e-1, 2.0000714765e-1, -2.4999993993e-1,
                     3.3333331174e-1])
    y = b.fmul(b.fmul(p, m), z)
    y = fma(b, ef, const(t, -2.12194440e-4), y)
    y = fma(b, z, const(t, -0.5), y)
    r = fma(b, ef, const(t, 0.693359375), b.fadd(m, y))
    r = b.select(b.fcmp_ordered("==", x, const(t, math.inf)), x, r)
    r = b.select(b.fcmp_ordered("==", x, const(t, 0.0)), const(t, -math.inf), r)
    r = b.select(b.fcmp_ordered("<", x, const(t, 0.0)), const(t, math.nan), r)
    return _keep_nan(b, x, r)


def tanh_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """tanh in f32: an odd/even rational approximation on [-7.9, 7.9] (Eigen)."""
    t = x.type
    c = 7.90531110763549805
    xc = _fmax(b, _fmin(b, x, const(t, c)), const(t, -c))
    x2 = b.fmul(xc, xc)
    p = b.fmul(xc, _poly(b, x2, [-2.76076847742355e-16, 2.00018790482477e-13,
                                 -8.60467152213735e-11, 5.12229709037114e-08,
                                 1.48572235717979e-05, 6.37261928875436e-04,
                                 4.89352455891786e-03]))
    q = _poly(b, x2, [1.19825839466702e-06, 1.18534705686654e-04, 2.26843463243900e-03,
                      4.89352518554385e-03])
    r = b.fdiv(p, q)
    tiny = b.fcmp_ordered("<", intrinsic(b, "fabs", [x]), const(t, 0.0004))
    return _keep_nan(b, x, b.select(tiny, x, r))


def erf_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """erf in f32: an odd/even rational approximation on [-4, 4] (Eigen/XLA)."""
    t = x.type
    xc = _fmax(b, _fmin(b, x, const(t, 4.0)), const(t, -4.0))
    x2 = b.fmul(xc, xc)
    p = b.fmul(xc, _poly(b, x2, [-2.72614225801306e-10, 2.77068142495902e-08,
                                 -2.10102402082508e-06, -5.69250639462346e-05,
                                 -7.34990630326855e-04, -2.95459980854025e-03,
                                 -1.60960333262415e-02]))
    q = _poly(b, x2, [-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03,
                      -7.37332916720468e-03, -1.42647390514189e-02])
    return _keep_nan(b, x, b.fdiv(p, q))


def libm_lanes(b: ir.IRBuilder, name: str, args: list[ir.Value]) -> ir.Value:
    """Call the libm function `name` (double or `name`f for float) lane by lane."""
    t = args[0].type
    e = elem(t)
    fname = name + ("f" if e == F32 else "")
    fn = declare(b.module, fname, e, [e] * len(args))
    n = lanes(t)
    if n is None:
        return b.call(fn, args)
    out = ir.Constant(t, ir.Undefined)
    for i in range(n):
        idx = ir.Constant(I32, i)
        r = b.call(fn, [b.extract_element(a, idx) for a in args])
        out = b.insert_element(out, r, idx)
    return out


def exp(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e**x."""
    return exp_f32(b, x) if elem(x.type) == F32 else intrinsic(b, "exp", [x])


def log(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Natural logarithm."""
    return log_f32(b, x) if elem(x.type) == F32 else intrinsic(b, "log", [x])


def tanh(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Hyperbolic tangent."""
    return tanh_f32(b, x) if elem(x.type) == F32 else libm_lanes(b, "tanh", [x])


def erf(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """The error function."""
    return erf_f32(b, x) if elem(x.type) == F32 else libm_lanes(b, "erf", [x])


def sigmoid(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1 / (1 + e**-x)."""
    one = const(x.type, 1.0)
    return b.fdiv(one, b.fadd(one, exp(b, b.fneg(x))))


def sqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """Square root (a vector instruction)."""
    return intrinsic(b, "sqrt", [x])


def rsqrt(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """1 / sqrt(x), correctly rounded division (not the 12-bit rsqrtps estimate)."""
    return b.fdiv(const(x.type, 1.0), sqrt(b, x))


def log1p_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + x) in f32 with the inline `log`: log(u) * x / (u - 1) for u = 1 + x (Goldberg,
    "What every computer scientist should know about floating-point arithmetic", thm. 4:
    u - 1 is exact, so the quotient corrects the rounding of 1 + x)."""
    t = x.type
    one = const(t, 1.0)
    u = b.fadd(one, x)
    r = b.fmul(log_f32(b, u), b.fdiv(x, b.fsub(u, one)))
    r = b.select(b.fcmp_ordered("==", u, one), x, r)  # |x| below half an ulp of 1
    return b.select(b.fcmp_ordered("==", u, const(t, math.inf)), u, r)


def expm1_f32(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e**x - 1 in f32 with the inline `exp` and `log`: (u - 1) * x / log(u) for u = e**x
    (Kahan's trick: the quotient x / log(u) corrects the rounding of u)."""
    t = x.type
    one = const(t, 1.0)
    u = exp_f32(b, x)
    um1 = b.fsub(u, one)
    r = b.fmul(um1, b.fdiv(x, log_f32(b, u)))
    r = b.select(b.fcmp_ordered("==", u, one), x, r)  # |x| below half an ulp of 1
    r = b.select(b.fcmp_ordered("==", um1, const(t, -1.0)), um1, r)  # e**x below an ulp of 1
    return b.select(b.fcmp_ordered("==", u, const(t, math.inf)), u, r)


def log1p(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + x), accurate for small x."""
    return log1p_f32(b, x) if elem(x.type) == F32 else libm_lanes(b, "log1p", [x])


def expm1(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """e**x - 1, accurate for small x."""
    return expm1_f32(b, x) if elem(x.type) == F32 else libm_lanes(b, "expm1", [x])


def softplus(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """log(1 + e**x) as max(x, 0) + log1p(e**-|x|): no overflow, and e**x for very negative
    x to the last bits (NaN propagates through the second term)."""
    t = x.type
    tail = log1p(b, exp(b, b.fneg(intrinsic(b, "fabs", [x]))))
    return b.fadd(_fmax(b, x, const(t, 0.0)), tail)


def atan2(b: ir.IRBuilder, y: ir.Value, x: ir.Value) -> ir.Value:
    """The angle of (x, y) in [-pi, pi]: libm's `atan2f`/`atan2`, lane by lane."""
    return libm_lanes(b, "atan2", [y, x])


def isfinite(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """i1: |x| is ordered and not infinite (one compare, scalar or vector)."""
    return b.fcmp_ordered("!=", intrinsic(b, "fabs", [x]), const(x.type, math.inf))


def pow_(b: ir.IRBuilder, x: ir.Value, y: ir.Value, y_const: float | None) -> ir.Value:
    """x**y; small integer and half-integer constant exponents become multiplications and
    square roots (exact and vectorisable), others call libm `pow`."""
    if y_const is not None:
        if y_const == 0.5:
            return sqrt(b, x)
        if float(y_const).is_integer() and abs(y_const) <= 16:
            k = int(abs(y_const))
            acc: ir.Value = const(x.type, 1.0)
            base = x
            while k:
                if k & 1:
                    acc = base if isinstance(acc, ir.Constant) else b.fmul(acc, base)
                k >>= 1
                if k:
                    base = b.fmul(base, base)
            return b.fdiv(const(x.type, 1.0), acc) if y_const < 0 else acc
    return intrinsic(b, "pow", [x, y])


# ---------------------------------------------------------------------------------------------
# philox

_M0, _M1 = 0xD2511F53, 0xCD9E8D57
_W0, _W1 = 0x9E3779B9, 0xBB67AE85


def philox4x32(b: ir.IRBuilder, key: ir.Value, counter: ir.Value) -> list[ir.Value]:
    """The four output words (i64 values holding 32 bits) of Philox-4x32-10 for a 64-bit key
    (k0 = low word, k1 = high word) and a 64-bit counter (c0 = low, c1 = high, c2 = c3 = 0)."""
    t = key.type
    mask = const(t, 0xFFFFFFFF)
    k0 = b.and_(key, mask)
    k1 = b.lshr(key, const(t, 32))
    c = [b.and_(counter, mask), b.lshr(counter, const(t, 32)), const(t, 0), const(t, 0)]
    for rnd in range(10):
        if rnd:
            k0 = b.and_(b.add(k0, const(t, _W0)), mask)
            k1 = b.and_(b.add(k1, const(t, _W1)), mask)
        p0 = b.mul(c[0], const(t, _M0))
        p1 = b.mul(c[2], const(t, _M1))
        hi0, lo0 = b.lshr(p0, const(t, 32)), b.and_(p0, mask)
        hi1, lo1 = b.lshr(p1, const(t, 32)), b.and_(p1, mask)
        c = [b.xor(b.xor(hi1, c[1]), k0), lo1, b.xor(b.xor(hi0, c[3]), k1), lo0]
    return c


# ---------------------------------------------------------------------------------------------
# 16-bit float formats: i16 in memory, f32 in registers (see the module docstring)


def half_to_f32(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The f32 value of f16 bit patterns (exact)."""
    return b.fpext(b.bitcast(bits, like(bits.type, F16)), like(bits.type, F32))


def f32_to_half(b: ir.IRBuilder, x: ir.Value) -> ir.Value:
    """f32 values rounded to f16 (nearest even), as bit patterns."""
    return b.bitcast(b.fptrunc(x, like(x.type, F16)), like(x.type, I16))


def bf16_to_f32(b: ir.IRBuilder, bits: ir.Value) -> ir.Value:
    """The f32 value of bf16 bit patterns (exact: the upper half of an f32)."""
    w = b.zext(bits, like(bits.type, I32))
    return b.bitcast(b.shl(w, const(w.type, 16)), like(bits.type, F32))


def f32_to_bf16(b: ir.IRBuilder, x: ir.Value, *, native: bool) -> ir.Value:
    """f32 values rounded to bf16 (nearest even; NaN stays a quiet NaN), as bit patterns:
    `vcvtneps2bf16` when `native`, else integer arithmetic (which keeps f32 subnormals,
    while the instruction flushes them to zero: both within the format's bound)."""
    if native:
        return b.bitcast(b.fptrunc(x, like(x.type, BF16)), like(x.type, I16))
    it = like(x.type, I32)
    bits = b.bitcast(x, it)
    hi = b.lshr(bits, const(it, 16))
    up = b.add(b.add(bits, const(it, 0x7FFF)), b.and_(hi, const(it, 1)))
    nan = b.fcmp_unordered("uno", x, x)
    return b.trunc(b.select(nan, b.or_(hi, const(it, 0x40)), b.lshr(up, const(it, 16))),
                   like(x.type, I16))
