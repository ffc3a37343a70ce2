"""Parameter initialisation: a seeded, reproducible generator, native and in numpy.

The generator (version 1) fills element `i` (row-major) of tensor `name` from the Philox-4x32-10
words (nfc/philox.py) of

    key     = (seed mod 2**32) | (fnv1a32(name) << 32)      (k0 = seed, k1 = name hash)
    counter = i                                             (c0 = low word, c1 = high word)

giving words x0, x1 (x2, x3 unused), then in float64:

    u  = x0 * 2**-32                 in [0, 1)        uniform(lo, hi) = lo + (hi - lo) * u
    u1 = (x0 + 1) * 2**-32           in (0, 1]
    u2 = x1 * 2**-32                 in [0, 1)
    z  = sqrt(-2 log u1) * cos(2 pi u2)               normal(mean, std) = mean + std * z

rounded to the tensor's dtype (round to nearest). `glorot_uniform` is uniform(-l, l) with
l = sqrt(6 / (fan_in + fan_out)); `he_normal` is normal(0, sqrt(2 / fan_in)). Fans follow the
layouts of std.nn: a rank-2 weight is [in, out] (`linear`: x[n, k] * w[k, m]); rank >= 3 is
[out, in, *window] (`conv2d`: k[o, c, kh, kw]) with the window size multiplying both fans;
rank 1 has fan_in = fan_out = its size; a scalar has 1. `zeros`, `ones`, `const(v)` fill.

Keying by name, not position, keeps a parameter's values when others are added or removed.
The native `nfc_init` (emitted here into the artifact) and `reference_init` (numpy) agree to
the last bit except where libm and numpy round log/cos differently (one f64 ulp, which only
very rarely changes the rounded f32).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from nfc.blocked import is_blocked, pack
from nfc.ir import DType
from nfc.philox import philox4x32

GENERATOR_VERSION = 1
GENERATOR = ("philox4x32-10 v1: key = seed mod 2^32 | fnv1a32(name) << 32, counter = element "
             "index; normal by Box-Muller on (x0 + 1) * 2^-32 and x1 * 2^-32 in float64")

_INIT_RE = re.compile(r"^\s*([a-z_]+)\s*(?:\(\s*(.*?)\s*\))?\s*$")
_ARITY = {"normal": 2, "uniform": 2, "const": 1, "zeros": 0, "ones": 0, "glorot_uniform": 0,
          "he_normal": 0}


@dataclass(frozen=True)
class InitSpec:
    """A parsed initializer: `kind` is "fill", "uniform" or "normal" with two parameters
    (fill: value, unused; uniform: lo, hi; normal: mean, std)."""

    kind: str
    a: float
    b: float = 0.0


def fnv1a32(text: str) -> int:
    """The 32-bit FNV-1a hash of `text`'s UTF-8 bytes."""
    h = 0x811C9DC5
    for byte in text.encode():
        h = ((h ^ byte) * 0x01000193) & 0xFFFFFFFF
    return h


def fans(shape: tuple[int, ...]) -> tuple[int, int]:
    """(fan_in, fan_out) of a weight of `shape` (see the module doc)."""
    if not shape:
        return 1, 1
    if len(shape) == 1:
        return shape[0], shape[0]
    if len(shape) == 2:
        return shape[0], shape[1]
    window = math.prod(shape[2:])
    return shape[1] * window, shape[0] * window


def parse_init(text: str, shape: tuple[int, ...]) -> InitSpec:
    """The initializer `text` (`normal(0.0, 0.1)`, `he_normal`, ...) for a tensor of `shape`;
    raises ValueError for an unknown one."""
    m = _INIT_RE.match(text or "zeros")
    if not m or m.group(1) not in _ARITY:
        raise ValueError(f"unknown initializer {text!r} (known: {', '.join(_ARITY)})")
    name, rest = m.group(1), m.group(2)
    vals = [float(x) for x in rest.split(",")] if rest else []
    if len(vals) != _ARITY[name]:
        raise ValueError(f"initializer {name} takes {_ARITY[name]} arguments: {text!r}")
    fan_in, fan_out = fans(shape)
    if name == "zeros":
        return InitSpec("fill", 0.0)
    if name == "ones":
        return InitSpec("fill", 1.0)
    if name == "const":
        return InitSpec("fill", vals[0])
    if name == "uniform":
        return InitSpec("uniform", vals[0], vals[1])
    if name == "normal":
        return InitSpec("normal", vals[0], vals[1])
    if name == "glorot_uniform":
        lim = math.sqrt(6.0 / (fan_in + fan_out))
        return InitSpec("uniform", -lim, lim)
    return InitSpec("normal", 0.0, math.sqrt(2.0 / fan_in))


def init_key(seed: int, name: str) -> int:
    """The Philox key of tensor `name` for `seed`, as an unsigned 64-bit integer."""
    return (int(seed) & 0xFFFFFFFF) | (fnv1a32(name) << 32)


def reference_init(name: str, init: str, shape: tuple[int, ...], dtype: DType,
                   seed: int) -> np.ndarray:
    """The tensor the generator gives (numpy; the oracle of the native `nfc_init`)."""
    spec = parse_init(init, shape)
    size = math.prod(shape)
    if spec.kind == "fill":
        return np.full(shape, spec.a, dtype=dtype.numpy)
    if not dtype.is_float:
        raise ValueError(f"a random initializer for the integer tensor '{name}'")
    key = init_key(seed, name)
    i = np.arange(size, dtype=np.uint64)
    x0, x1, _, _ = philox4x32((i & np.uint64(0xFFFFFFFF), i >> np.uint64(32), 0, 0),
                              (key & 0xFFFFFFFF, key >> 32))
    if spec.kind == "uniform":
        u = x0.astype(np.float64) * 2.0 ** -32
        val = spec.a + (spec.b - spec.a) * u
    else:
        u1 = (x0.astype(np.float64) + 1.0) * 2.0 ** -32
        u2 = x1.astype(np.float64) * 2.0 ** -32
        z = np.sqrt(-2.0 * np.log(u1)) * np.cos((2.0 * math.pi) * u2)
        val = spec.a + spec.b * z
    if dtype in (DType.F16, DType.BF16):  # through f32 and rounded, like the native code
        val = val.astype(np.float32)
        if dtype is DType.BF16:
            u = val.view(np.uint32).astype(np.uint64)
            val = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(
                np.float32)
    return val.astype(dtype.numpy).reshape(shape)


def emit_init_loop(b, module, ptr, name: str, init: str, shape: tuple[int, ...], dtype: DType,
                   seed, view: tuple[int, int, int] | None = None,
                   perm: list[tuple[int, int, int, int]] | None = None) -> None:
    """Emit, at `b`'s position, code filling the tensor at `ptr` (llvmlite values; `seed` is
    an i64): a call of one of a few generic fill functions of the module (`_helper`), with
    this tensor's size, key and parameters as arguments. One loop per tensor, specialised to
    its constants, made `nfc_init` of a 164-tensor model take 4 s of LLVM optimisation; the
    helpers do the same arithmetic on the same values, so the numbers are the same.

    `view = (inner, row, base)` fills a part of a laid-out parameter (`part_view`): element
    `i` of the part goes to element `base + (i // inner) * row + i % inner` of the buffer at
    `ptr`, drawn exactly as the part alone would be. `perm` (`nfc.blocked.blocked_index_map`)
    stores element `i` of the logical tensor where a blocked layout (the `layout` pass) keeps
    it, drawn exactly as the logical tensor would be."""
    from llvmlite import ir

    from nfc.codegen.llvm import intrinsics
    from nfc.codegen.llvm.exprs import memtype

    spec = parse_init(init, shape)
    size = math.prod(shape)
    et = memtype(dtype)
    if size == 0:
        return
    n = ir.Constant(intrinsics.I64, size)
    extra: list = []
    strided: bool | tuple[tuple[int, int, int, int], ...] = (
        tuple(perm) if perm is not None else view is not None and view[0] != view[1])
    if view is not None:
        ptr = b.gep(ptr, [ir.Constant(intrinsics.I64, view[2])], source_etype=et)
        if strided is True:
            extra = [ir.Constant(intrinsics.I64, view[0]), ir.Constant(intrinsics.I64, view[1])]
    if spec.kind == "fill":
        if dtype in (DType.F16, DType.BF16):  # stored as 16-bit patterns
            val = ir.Constant(et, _half_bits(spec.a, dtype))
        else:
            val = ir.Constant(et, spec.a) if dtype.is_float else ir.Constant(et, int(spec.a))
        b.call(_helper(module, "fill", et, dtype, strided), [ptr, n, val, *extra])
        return
    if not dtype.is_float:
        raise ValueError(f"a random initializer for the integer tensor '{name}'")
    high = fnv1a32(name) << 32
    key = b.or_(b.and_(seed, ir.Constant(intrinsics.I64, 0xFFFFFFFF)),
                ir.Constant(intrinsics.I64, high - (1 << 64) if high >= 1 << 63 else high))
    # uniform: lo + (hi - lo) * u; normal: mean + std * z (parameters as doubles)
    p1, p2 = (spec.a, spec.b - spec.a) if spec.kind == "uniform" else (spec.a, spec.b)
    b.call(_helper(module, spec.kind, et, dtype, strided),
           [ptr, n, key, ir.Constant(intrinsics.F64, p1), ir.Constant(intrinsics.F64, p2),
            *extra])


def _half_bits(value: float, dtype: DType) -> int:
    """The f16/bf16 bit pattern of `value` (rounded to nearest even, like the kernels)."""
    from nfc.codegen.llvm.exprs import round_literal

    x = np.asarray(round_literal(value, dtype), np.float32)
    if dtype is DType.F16:
        return int(x.astype(np.float16).view(np.uint16))
    return int(x.view(np.uint32)) >> 16


def _helper(module, kind: str, et, dtype: DType | None = None,
            strided: bool | tuple[tuple[int, int, int, int], ...] = False):  # -> ir.Function
    """The module's internal, never inlined `void nfc_init_<kind>_<type>(ptr, i64 n, ...)`:
    fill (value), uniform (key, lo, hi - lo) or normal (key, mean, std) of n elements;
    `strided`: two more arguments `inner, row`, element i stored at
    `(i / inner) * row + i % inner`; a tuple of `nfc.blocked.blocked_index_map` terms: a
    helper of its own storing element i where that blocked layout keeps it."""
    from llvmlite import ir

    from nfc.codegen.llvm import intrinsics
    from nfc.codegen.llvm.emitter import set_attributes

    fname = f"nfc_init_{kind}_{dtype or et}" + (
        "_strided" if strided is True else
        "_blocked_" + "_".join(f"{d}x{m}x{q}x{st}".replace("-", "m")
                               for d, m, q, st in strided) if strided else "")
    fn = module.globals.get(fname)
    if fn is not None:
        return fn
    i64, f64 = intrinsics.I64, intrinsics.F64
    args = [ir.PointerType(), i64] + ([et] if kind == "fill" else [i64, f64, f64]) + (
        [i64, i64] if strided is True else [])
    fn = ir.Function(module, ir.FunctionType(ir.VoidType(), args), name=fname)
    fn.linkage = "internal"
    set_attributes(fn, ("nounwind", "noinline"))
    ptr, size = fn.args[0], fn.args[1]
    entry = fn.append_basic_block("entry")
    loop = fn.append_basic_block("loop")
    done = fn.append_basic_block("done")
    b = ir.IRBuilder(entry)
    b.cbranch(b.icmp_signed(">", size, ir.Constant(intrinsics.I64, 0)), loop, done)
    b.position_at_end(loop)
    i = b.phi(intrinsics.I64, name="i")
    i.add_incoming(ir.Constant(intrinsics.I64, 0), entry)
    if kind == "fill":
        val: ir.Value = fn.args[2]
    else:
        key, p1, p2 = fn.args[2], fn.args[3], fn.args[4]
        words = intrinsics.philox4x32(b, key, i)
        scale = ir.Constant(intrinsics.F64, 2.0 ** -32)
        if kind == "uniform":
            u = b.fmul(b.uitofp(words[0], intrinsics.F64), scale)
            d = b.fadd(p1, b.fmul(p2, u))
        else:
            one = ir.Constant(intrinsics.F64, 1.0)
            u1 = b.fmul(b.fadd(b.uitofp(words[0], intrinsics.F64), one), scale)
            u2 = b.fmul(b.uitofp(words[1], intrinsics.F64), scale)
            lg = intrinsics.intrinsic(b, "log", [u1])
            r = intrinsics.intrinsic(b, "sqrt", [b.fmul(ir.Constant(intrinsics.F64, -2.0), lg)])
            c = intrinsics.intrinsic(b, "cos",
                                     [b.fmul(ir.Constant(intrinsics.F64, 2.0 * math.pi), u2)])
            d = b.fadd(p1, b.fmul(p2, b.fmul(r, c)))
        if dtype is DType.F16:  # through f32, like the kernels (never a libcall)
            val = intrinsics.f32_to_half(b, b.fptrunc(d, intrinsics.F32))
        elif dtype is DType.BF16:
            val = intrinsics.f32_to_bf16(b, b.fptrunc(d, intrinsics.F32), native=False)
        else:
            val = d if et == intrinsics.F64 else b.fptrunc(d, et)
    at: ir.Value = i
    if strided is True:
        inner, row = fn.args[-2], fn.args[-1]
        at = b.add(b.mul(b.udiv(i, inner), row), b.urem(i, inner))
    elif strided:
        def c(v: int):
            return ir.Constant(i64, v)
        at = c(0)
        for div, mod, q, stride in strided:
            digit = b.urem(b.udiv(i, c(div)), c(mod))
            digit = b.udiv(digit, c(q)) if q > 0 else b.urem(digit, c(-q))
            at = b.add(at, b.mul(digit, c(stride)))
    b.store(val, b.gep(ptr, [at], source_etype=et))
    nxt = b.add(i, ir.Constant(intrinsics.I64, 1))
    i.add_incoming(nxt, loop)
    b.cbranch(b.icmp_signed("<", nxt, size), loop, done)
    b.position_at_end(done)
    b.ret_void()
    return fn


def part_view(shape: tuple[int, ...], axis: int, offset: int, size: int) -> tuple[int, int, int]:
    """`(inner, row, base)` of the part `[offset, offset + size)` along `axis` of a buffer of
    `shape` (row-major): the part's rows of `inner` elements start `row` elements apart, the
    first at `base`."""
    after = math.prod(shape[axis + 1:])
    return size * after, shape[axis] * after, offset * after


def layout_parts(shape: tuple[int, ...], layout: dict) -> list[tuple[str, str, tuple[int, ...],
                                                                     int, int]]:
    """Per part of a laid-out parameter (`nf.layout` of the parallel-fusion pass): its name,
    initializer, shape, offset and size along the layout's axis."""
    axis = int(layout["axis"])
    offsets = [int(o) for o in layout["offsets"]]
    if not 0 <= axis < len(shape):
        raise ValueError(f"nf.layout axis {axis} is not a dimension of {list(shape)}")
    if not (len(layout["parts"]) == len(layout["inits"]) == len(offsets) >= 1):
        raise ValueError("nf.layout needs as many parts, offsets and inits, at least one")
    ends = offsets[1:] + [shape[axis]]
    if offsets[0] != 0 or any(a >= b for a, b in zip(offsets, ends, strict=True)):
        raise ValueError(f"nf.layout offsets {offsets} do not split dimension {axis} of "
                         f"{list(shape)} into non-empty parts")
    out = []
    for name, init, off, end in zip(layout["parts"], layout["inits"], offsets, ends,
                                    strict=True):
        pshape = tuple(end - off if k == axis else n for k, n in enumerate(shape))
        out.append((str(name), str(init), pshape, off, end - off))
    return out


def reference_init_layout(layout: dict, shape: tuple[int, ...], dtype: DType,
                          seed: int) -> np.ndarray:
    """A laid-out parameter as the generator fills it: every part drawn by its own name and
    initializer (`reference_init`), so it equals the unfused parts; a blocked one (the
    `layout` pass, with its `name` and `init` as the metadata gives them) drawn logical and
    packed."""
    if is_blocked(layout):
        logical = reference_init(str(layout["name"]), str(layout["init"]),
                                 tuple(int(n) for n in layout["shape"]), dtype, seed)
        return pack(logical, layout).reshape(shape)
    out = np.empty(shape, dtype=dtype.numpy)
    axis = int(layout["axis"])
    for name, init, pshape, off, size in layout_parts(shape, layout):
        sl = tuple(slice(off, off + size) if k == axis else slice(None)
                   for k in range(len(shape)))
        out[sl] = reference_init(name, init, pshape, dtype, seed)
    return out
