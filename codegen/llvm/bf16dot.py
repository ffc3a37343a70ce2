"""bf16 dot products on AVX-512 BF16 (`vdpbf16ps`) inside GEMM micro-kernels.

A micro-kernel of a contraction with bf16 operands (nfc.passes.precision) has, innermost,
an unrolled k loop around a register tile:

    unrolled k.2 in 0..4 {
      unrolled i.2 in 0..6 { unrolled j.1 in 0..4 { vectorized j.2 in 0..16 {
        acc[i.2, j.1, j.2] += f32(A[.., k, i.2]) * f32(B[.., k, 16 * j.1 + j.2])
      } } } }

Emitted as written, every product widens its operands (a shift each) and costs an FMA. With
AVX-512 BF16, `vdpbf16ps acc, a, b` adds `a[2l] * b[2l] + a[2l+1] * b[2l+1]` to f32 lane `l`:
two k steps per instruction. `emit_pairs` emits the loop so when it matches exactly that
shape (an even trip count, one reducing store into an f32 register tile of the product of
two widened bf16 loads, one uniform across the lanes and one contiguous; or the same in a
bf16 model, whose register tiles are f32 too): for each pair
(k, k + 1), the uniform operand's two elements become one 32-bit word broadcast to every
lane, the contiguous operand's two vectors are interleaved (one `vpermt2w`), and the tile
is updated by `llvm.x86.avx512bf16.dpbf16ps`. The products are exact in f32 either way; the
instruction rounds after each of its two additions (and treats bf16 subnormals as zero), so
results differ from the FMA chain by f32 rounding only. Anything else (odd trips, guards,
other bodies) returns False and is emitted the ordinary way.
"""

from __future__ import annotations

import itertools
from typing import TYPE_CHECKING

from llvmlite import ir

from nfc.codegen.llvm import intrinsics as M
from nfc.codegen.loops import Buffer, BufLoad, For, LoopKind, Scope, Stmt, Store
from nfc.ir import Binary, Cast, DType, Expr, Index

if TYPE_CHECKING:
    from nfc.codegen.llvm.emitter import FuncEmitter

#: Vector widths (f32 lanes) with a `dpbf16ps` form: 512, 256 and 128 bits.
_WIDTHS = {16: "512", 8: "256", 4: "128"}


def _bf16_load(e: Expr) -> BufLoad | None:
    """`f32(B[...])` or `B[...]` of a bf16 tensor: its load (a bf16 product is an exact f32
    product in registers either way)."""
    if isinstance(e, Cast) and e.dtype is DType.F32:
        e = e.x
    if (isinstance(e, BufLoad) and e.buffer.dtype is DType.BF16
            and e.buffer.scope is Scope.GLOBAL):
        return e
    return None


def _chunk(width: int) -> int | None:
    """f32 lanes per `dpbf16ps` for a tile row of `width` lanes (a bf16 model's tiles are 32
    wide: two instructions), None when no form fits."""
    if width in _WIDTHS:
        return width
    return 16 if width % 16 == 0 else None


def _match(s: For) -> tuple[list[For], For, Store] | None:
    """The unrolled loops, the vectorized loop and the store of a pairable k loop body."""
    outer: list[For] = []
    st: Stmt = s.body
    while isinstance(st, For) and st.kind is LoopKind.UNROLLED and st.const_extent:
        outer.append(st)
        st = st.body
    if not (isinstance(st, For) and st.kind is LoopKind.VECTORIZED and st.const_extent
            and _chunk(st.const_extent) and isinstance(st.body, Store)):
        return None
    store = st.body
    v = store.value
    # an f32 tile (mixed precision), or a bf16 one, which registers hold as f32 (storage)
    if not (store.reduce == "sum" and store.buffer.scope is Scope.REGISTER
            and store.buffer.dtype in (DType.F32, DType.BF16) and isinstance(v, Binary)
            and v.op == "*" and _bf16_load(v.a) is not None and _bf16_load(v.b) is not None):
        return None
    if any(isinstance(x, Index) and x.name == s.var for i in store.indices for x in i.walk()):
        return None  # the tile must not move with k
    return outer, st, store


def emit_pairs(em: FuncEmitter, s: For) -> bool:
    """Emit the unrolled loop `s` with `vdpbf16ps` when it has the shape above and the target
    has AVX-512 BF16; False (nothing emitted) otherwise."""
    c = s.const_extent
    if not (em.target.has("avx512bf16") and em.lane is None and s.kind is LoopKind.UNROLLED
            and c is not None and c >= 2 and c % 2 == 0):
        return False
    found = _match(s)
    if found is None:
        return False
    outer, vloop, store = found
    la, lb = _bf16_load(store.value.a), _bf16_load(store.value.b)  # type: ignore[attr-defined]
    assert la is not None and lb is not None
    width = vloop.const_extent
    assert width is not None
    em.lane, em.width = vloop.var, width
    em.ranges[vloop.var] = (0, width - 1)
    lanes_a, lanes_b = em.lane_dependent(la), em.lane_dependent(lb)
    ok = False
    if lanes_a != lanes_b and em.mask is None:
        off, clamps = em.address((lb if lanes_b else la).buffer, (lb if lanes_b else la).indices)
        ok = not clamps and em.lane_coeff(off) == 1
    em.lane, em.width = None, 1
    em.ranges.pop(vloop.var, None)
    if not ok:
        return False
    uni, vec = (la, lb) if lanes_b else (lb, la)
    saved = {f.var: em.env.get(f.var) for f in (s, *outer, vloop)}
    for k in range(0, c, 2):
        for combo in itertools.product(*(range(f.const_extent or 0) for f in outer)):
            for f, x in zip(outer, combo, strict=True):
                em.env[f.var] = ir.Constant(M.I64, x)
                em.ranges[f.var] = (x, x)
            _pair(em, s.var, k, vloop, store, uni, vec)
    for var, old in saved.items():
        em._forget(var, old)
    return True


def _pair(em: FuncEmitter, kvar: str, k: int, vloop: For, store: Store, uni: BufLoad,
          vec: BufLoad) -> None:
    """acc[...] += A[k] B[k] + A[k+1] B[k+1] for every lane, in one `vdpbf16ps`."""
    b = em.b
    width = vloop.const_extent
    assert width is not None
    em.lane, em.width = vloop.var, width
    em.ranges[vloop.var] = (0, width - 1)
    words, vecs = [], []
    for kk in (k, k + 1):
        em.env[kvar] = ir.Constant(M.I64, kk)
        em.ranges[kvar] = (kk, kk)
        off, _ = em.address(uni.buffer, uni.indices)
        words.append(b.load(em.gep(uni.buffer, em.int_value(off, 0)), typ=M.I16))
        vecs.append(_vload(em, vec.buffer, vec.indices, ir.VectorType(M.I16, width)))
    lo, hi = (b.zext(w, M.I32) for w in words)
    word = b.or_(lo, b.shl(hi, ir.Constant(M.I32, 16)))  # element 2l = k, 2l + 1 = k + 1
    n = _chunk(width)
    assert n is not None
    em.width = n
    a = b.bitcast(em.vec(word), ir.VectorType(M.BF16, 2 * n))
    em.width = width
    vt = ir.VectorType(M.F32, n)
    bt = ir.VectorType(M.BF16, 2 * n)
    fn = M.declare(em.module, f"llvm.x86.avx512bf16.dpbf16ps.{_WIDTHS[n]}", vt, [vt, bt, bt])
    p = em.gep(store.buffer, em.scalar_at_lane0(em.address(store.buffer, store.indices)[0]))
    for h in range(0, width, n):  # lanes h .. h + n - 1 of the tile row
        inter = [x for lane in range(h, h + n) for x in (lane, lane + width)]
        bv = b.bitcast(b.shuffle_vector(vecs[0], vecs[1], ir.Constant(
            ir.VectorType(M.I32, 2 * n), inter)), bt)
        ph = p if h == 0 else b.gep(p, [ir.Constant(M.I64, h)], source_etype=M.F32)
        acc = b.load(ph, typ=vt, align=4)
        b.store(b.call(fn, [acc, a, bv]), ph, align=4)
    em.lane, em.width = None, 1
    em.ranges.pop(vloop.var, None)


def _vload(em: FuncEmitter, buf: Buffer, indices: tuple[Expr, ...], vt: ir.VectorType
           ) -> ir.Value:
    """The raw 16-bit elements of a lane-contiguous access (no widening)."""
    off, _ = em.address(buf, indices)
    return em.b.load(em.gep(buf, em.scalar_at_lane0(off)), typ=vt, align=2)
