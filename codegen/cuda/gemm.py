"""GPU lowering of contractions: tiled GEMMs through shared memory, on CUDA cores or Tensor Cores.

The compute is a contraction over single axes (`nfc.contraction`; a contraction over runs of
axes arrives here as its flattened view): `out[batch.., i, j] = sum_(kouter.., k) A * B`. Each
block owns one `block_m x block_n` tile of one GEMM of the batch (the block index is split into
batch coordinates, the M tile and the N tile, N fastest so neighbouring blocks share A rows).
For every outer reduction index and every K step the block

1. stages `A[m0 : m0 + block_m, k0 : k0 + block_k]` and `B[k0 : .., n0 : ..]` in shared memory,
   each thread copying elements `tx, tx + threads, ...` in the order of the operand's contiguous
   axis (coalesced reads); elements past the end of M, N or K are stored as zeros, so the
   inner product needs no guards;
2. `__syncthreads()`;
3. multiplies the tiles: on the FMA path each thread keeps a `thread_m x thread_n` register tile
   (rows `tr, tr + block_m/thread_m, ...`, columns likewise strided: conflict-free shared reads
   and coalesced stores), loading a column of A and a row of B into registers per k; on the
   WMMA path each warp keeps `frag_m x frag_n` accumulator fragments and loads matrix_a/matrix_b
   fragments from the shared tiles (rows padded so every fragment corner is 32-byte aligned);
4. `__syncthreads()` before the next step overwrites the tiles.

The result is written with guards at the M/N edges: FMA threads store their registers; WMMA
warps store each fragment to a per-warp `m x (n + 4)` f32 scratch tile in shared memory,
`__syncwarp()`, and the 32 lanes copy its 256 elements out (8 each), converting to the
output's type (`m x n` the schedule's `wmma_shape`: 16x16, 32x8 or 8x32).

The copies and the K loop come from nfc.codegen.cuda.gemm_tiles, which implements the knobs
`vector_width` (vector global loads) and `double_buffer` (two shared stages, one barrier per K
step). With `swap` the operands exchange roles here (B's tile on the block's M side, i and j
exchanged), and the result is stored transposed through the same output index map. With
`pack` the tiles of a packed operand are read from its tile-contiguous temporary, which a
kernel of nfc.codegen.cuda.gemm_pack wrote before this one (`packed`: role -> temporary).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping

from nfc.codegen.cuda.gemm_pack import PackedSrc, packed_operands, packed_src
from nfc.codegen.cuda.gemm_tiles import TileSrc, copy_tile, k_loop, tile_stages, vector_problem
from nfc.codegen.cuda.gpuir import FragFill, FragLoad, Fragment, FragMma, FragStore
from nfc.codegen.cuda.lower import (
    Names,
    acc_type,
    add,
    bind_coords,
    c,
    kernel_shell,
    lets,
    lt,
    mul,
    v,
)
from nfc.codegen.cuda.schedule import GemmSchedule, GpuScheduleError
from nfc.codegen.loops import (
    Allocate,
    Barrier,
    Buffer,
    BufLoad,
    For,
    LoopKind,
    Scope,
    Seq,
    Stmt,
    Store,
)
from nfc.codegen.lowering.tails import conjunction as conj
from nfc.codegen.lowering.tails import guarded as guard
from nfc.contraction import match_contraction, plain_names
from nfc.ir import Axis, Binary, ComputeOp, Const, DType, Expr, Index

#: Static shared memory one block may declare (`__shared__` arrays; more needs dynamic shared
#: memory and an opt-in attribute, which this backend does not use yet).
STATIC_SHARED_LIMIT = 48 * 1024
#: Shared-memory row padding (elements): fragment corners stay 32-byte aligned and `ldm` a
#: multiple of 16 bytes (WMMA's rules); one f32/f64 element on the FMA path breaks the bank
#: pattern of column-wise stores.
PAD = {"f16": 8, "bf16": 8, "tf32": 4, "fma": 1}
_IN_TYPE = {"f16": DType.F16, "bf16": DType.BF16, "tf32": DType.F32}
#: The multiply of one K step, given the shared stage index (() with one stage).
Inner = Callable[[tuple[Expr, ...]], Stmt]


def _faster(load_names: list[str], a: str, b: str) -> bool:
    """Whether axis `a` is more contiguous than `b` in an operand indexed by `load_names`."""
    return load_names.index(a) > load_names.index(b)


def shared_bytes(s: GemmSchedule, dtype: DType) -> int:
    """Shared memory of a GEMM block: the A and B tiles (padded rows; two stages of each when
    double buffered) and, on the WMMA path, an m x (n + 4) f32 scratch tile per warp."""
    item = (_IN_TYPE.get(s.precision) or acc_type(dtype)).itemsize
    pad = PAD[s.precision]
    tiles = (s.block_m * (s.block_k + pad) + s.block_k * (s.block_n + pad)) * item
    scratch = s.warps_m * s.warps_n * s.mnk[0] * (s.mnk[1] + 4) * 4 if s.wmma else 0
    return tiles * tile_stages(s) + scratch


def lower_gemm(op: ComputeOp, s: GemmSchedule, out: Buffer, bufs: dict[int, Buffer],
               names: Names, packed: Mapping[str, Buffer] | None = None
               ) -> tuple[Stmt, int, int]:
    """(body, grid, block) of a contraction over single axes (see the module docstring);
    `packed`: the temporaries of the operands `s.pack` names (`lower_packs`)."""
    cont = match_contraction(op)
    assert cont is not None and cont.is_gemm, "lower_gemm needs a flattened contraction"
    ext = {a.name: a.extent for a in op.all_axes}
    i, j, k = cont.i[0], cont.j[0], cont.k[0]
    a_load, b_load = cont.a, cont.b
    if s.swap:  # C^T = B^T A^T: B's tile on the M side, the result stored transposed
        i, j, a_load, b_load = j, i, cont.b, cont.a
    m_, n_, k_ = ext[i], ext[j], ext[k]
    dt = out.dtype
    if s.wmma and not dt.is_float:
        raise GpuScheduleError(f"tensor cores multiply floats, not {dt}")
    why = vector_problem(op, s)
    if why is not None:
        raise GpuScheduleError(f"vector width {s.vector_width}: {why}")
    bm, bn, bk, t = s.block_m, s.block_n, s.block_k, s.threads
    mt, nt, kt = -(-m_ // bm), -(-n_ // bn), -(-k_ // bk)
    batch = [Axis(b, ext[b]) for b in cont.batch]
    grid = mt * nt * math.prod(a.extent for a in batch)
    bx, tx = names.fresh("bx"), names.fresh("tx")

    # block coordinates: batch.., M tile, N tile (N fastest)
    mname, nname = (h + "_" * sum(b.startswith(h) for b in cont.batch) for h in ("mtile", "ntile"))
    tiles = [*batch, Axis(mname, mt), Axis(nname, nt)]
    pairs, benv = bind_coords(names, tiles, Index(bx))
    m0 = mul(benv[mname], bm)
    n0 = mul(benv[nname], bn)
    env: dict[str, Expr] = {a.name: benv[a.name] for a in batch}

    in_dt = _IN_TYPE.get(s.precision, acc_type(dt))
    pad = PAD[s.precision]
    st = (2,) if s.double_buffer else ()
    a_s = Buffer(names.fresh("As"), (*st, bm, bk + pad), in_dt, Scope.SHARED)
    b_s = Buffer(names.fresh("Bs"), (*st, bk, bn + pad), in_dt, Scope.SHARED)
    shared = [a_s, b_s]

    # the K loop: outer reduction axes, then K steps of block_k
    k0 = names.fresh("k0")
    kouter = {r: names.fresh(r) for r in cont.kouter}
    kenv = env | {r: Index(x) for r, x in kouter.items()}
    zero = Const(0.0 if dt.is_float else 0)
    na, nb = plain_names(a_load), plain_names(b_load)
    assert na is not None and nb is not None
    vw = s.vector_width
    packs = {p.k_rows: p for p in packed_operands(op, s)}  # by side: False M, True N
    pk = dict(packed or {})
    if set(s.packed) != set(pk):
        raise GpuScheduleError(f"pack '{s.pack}' needs the packed temporaries of "
                               f"{', '.join(s.packed)} (lower_packs)")

    def copies(ktile: Expr, stage: tuple[Expr, ...]) -> Stmt:
        kbase = mul(ktile, bk)
        src_a: TileSrc | PackedSrc = TileSrc(a_load, kenv, bufs, i, m0, m_, k, kbase, k_,
                                             _faster(na, i, k))
        src_b: TileSrc | PackedSrc = TileSrc(b_load, kenv, bufs, k, kbase, k_, j, n0, n_,
                                             _faster(nb, k, j))
        if False in packs:
            src_a = packed_src(packs[False], pk[packs[False].role], kenv, benv[mname],
                               ktile)
        if True in packs:
            src_b = packed_src(packs[True], pk[packs[True].role], kenv, benv[nname],
                               ktile)
        return Seq((copy_tile(a_s, stage, bm, bk, src_a, zero, vw, t, tx, names),
                    copy_tile(b_s, stage, bk, bn, src_b, zero, vw, t, tx, names)))

    def out_store(m: Expr, n: Expr, value: Expr) -> Stmt:
        idx = tuple((env | {i: m, j: n})[a.name] for a in op.dims)
        cond = conj([lt(m, m_)] * bool(m_ % bm) + [lt(n, n_)] * bool(n_ % bn))
        return guard(cond, Store(out, idx, value))

    if s.wmma:
        inner, init, epilogue, extra, thread_pairs = _wmma(s, a_s, b_s, m0, n0, tx, names,
                                                           out_store)
        shared += extra
    else:
        inner, init, epilogue, thread_pairs = _fma(s, a_s, b_s, m0, n0, tx, names, out_store,
                                                   acc_type(dt))
    kloop = k_loop(k0, kt, copies, inner, s.double_buffer)
    for r in reversed(cont.kouter):
        kloop = For(kouter[r], c(ext[r]), LoopKind.SERIAL, kloop)
    body = lets([*pairs, *thread_pairs], init(Seq((kloop, epilogue))))
    nbytes = sum(b.nbytes for b in shared)
    if nbytes > STATIC_SHARED_LIMIT:
        raise GpuScheduleError(f"the gemm tiles need {nbytes} bytes of shared memory, over the "
                               f"{STATIC_SHARED_LIMIT} bytes of static shared memory per block")
    return kernel_shell(grid, t, shared, body, bx, tx), grid, t


def _unroll(n: int, limit: int) -> LoopKind:
    return LoopKind.UNROLLED if n <= limit else LoopKind.SERIAL


def _fma(s: GemmSchedule, a_s: Buffer, b_s: Buffer, m0: Expr, n0: Expr, tx: str,
         names: Names, out_store: Callable[[Expr, Expr, Expr], Stmt], adt: DType
         ) -> tuple[Inner, Callable[[Stmt], Stmt], Stmt, list[tuple[Buffer, Expr]]]:
    """CUDA-core inner product: a register tile per thread."""
    tm, tn = s.thread_m, s.thread_n
    rows, cols = s.block_m // tm, s.block_n // tn  # threads along M and N
    tr, tc = names.scalar("trow"), names.scalar("tcol")
    pairs = [(tr, Binary("//", Index(tx), c(cols))), (tc, Binary("%", Index(tx), c(cols)))]
    acc = Buffer(names.fresh("acc"), (tm, tn), adt, Scope.REGISTER)
    ar = Buffer(names.fresh("a"), (tm,), adt, Scope.REGISTER)
    br = Buffer(names.fresh("b"), (tn,), adt, Scope.REGISTER)
    x, y, kk = names.fresh("x"), names.fresh("y"), names.fresh("kk")
    u = LoopKind.UNROLLED

    def tile(body: Stmt) -> Stmt:
        return For(x, c(tm), u, For(y, c(tn), u, body))

    row = add(v(tr), mul(Index(x), rows))
    col = add(v(tc), mul(Index(y), cols))
    zero = Const(0.0 if adt.is_float else 0)

    def inner(st: tuple[Expr, ...]) -> Stmt:
        return For(kk, c(s.block_k), _unroll(s.block_k, 16), Seq((
            For(x, c(tm), u, Store(ar, (Index(x),), BufLoad(a_s, (*st, row, Index(kk))))),
            For(y, c(tn), u, Store(br, (Index(y),), BufLoad(b_s, (*st, Index(kk), col)))),
            tile(Store(acc, (Index(x), Index(y)),
                       Binary("*", BufLoad(ar, (Index(x),)), BufLoad(br, (Index(y),))),
                       "sum")))))
    epilogue = tile(out_store(add(m0, row), add(n0, col), BufLoad(acc, (Index(x), Index(y)))))

    def init(rest: Stmt) -> Stmt:
        return Allocate(acc, Allocate(ar, Allocate(br, Seq((
            tile(Store(acc, (Index(x), Index(y)), zero)), rest)))))
    return inner, init, epilogue, pairs


def _wmma(s: GemmSchedule, a_s: Buffer, b_s: Buffer, m0: Expr, n0: Expr, tx: str,
          names: Names, out_store: Callable[[Expr, Expr, Expr], Stmt]
          ) -> tuple[Inner, Callable[[Stmt], Stmt], Stmt, list[Buffer],
                     list[tuple[Buffer, Expr]]]:
    """Tensor-core inner product: accumulator fragments per warp."""
    fm, fn = s.frag_m, s.frag_n
    mnk = s.mnk
    fr, fc_, kstep = mnk  # fragment rows and columns (the scratch row: 16-byte multiple)
    nwarps = s.warps_m * s.warps_n
    warp, wm, wn, lane = (names.scalar(h) for h in ("warp", "wm", "wn", "lane"))
    pairs = [(warp, Binary("//", Index(tx), c(32))),
             (wm, Binary("//", v(warp), c(s.warps_n))), (wn, Binary("%", v(warp), c(s.warps_n))),
             (lane, Binary("%", Index(tx), c(32)))]
    frag = Scope.FRAGMENT
    fa = Fragment(names.fresh("fa"), (fm,), a_s.dtype, frag, "matrix_a", mnk, s.precision)
    fb = Fragment(names.fresh("fb"), (fn,), b_s.dtype, frag, "matrix_b", mnk, s.precision)
    fc = Fragment(names.fresh("fc"), (fm, fn), DType.F32, frag, "accumulator", mnk, "f32")
    scratch = Buffer(names.fresh("Cs"), (nwarps, fr, fc_ + 4), DType.F32, Scope.SHARED)
    x, y, kk, e = names.fresh("x"), names.fresh("y"), names.fresh("kk"), names.fresh("e")
    u = LoopKind.UNROLLED
    wrow = add(mul(v(wm), fm * fr), mul(Index(x), fr))
    wcol = add(mul(v(wn), fn * fc_), mul(Index(y), fc_))
    xi, yi = (Index(x),), (Index(y),)

    def inner(st: tuple[Expr, ...]) -> Stmt:
        return For(kk, c(s.block_k // kstep), u, Seq((
            For(x, c(fm), u, FragLoad(fa, xi, a_s, (*st, wrow, mul(Index(kk), kstep)))),
            For(y, c(fn), u, FragLoad(fb, yi, b_s, (*st, mul(Index(kk), kstep), wcol))),
            For(x, c(fm), u, For(y, c(fn), u,
                                 FragMma(fc, (Index(x), Index(y)), fa, xi, fb, yi))))))
    q, r, col = names.scalar("q"), names.scalar("r"), names.scalar("c")
    copy_out = For(e, c(8), u, lets(
        [(q, add(mul(Index(e), 32), v(lane))), (r, Binary("//", v(q), c(fc_))),
         (col, Binary("%", v(q), c(fc_)))],
        out_store(add(m0, wrow, v(r)), add(n0, wcol, v(col)),
                  BufLoad(scratch, (v(warp), v(r), v(col))))))
    epilogue = For(x, c(fm), u, For(y, c(fn), u, Seq((
        FragStore(scratch, (v(warp), c(0), c(0)), fc, (Index(x), Index(y))),
        Barrier("warp"), copy_out, Barrier("warp")))))

    def init(rest: Stmt) -> Stmt:
        fill = For(x, c(fm), u, For(y, c(fn), u, FragFill(fc, (Index(x), Index(y)),
                                                          Const(0.0, DType.F32))))
        return Allocate(fa, Allocate(fb, Allocate(fc, Seq((fill, rest)))))
    return inner, init, epilogue, [scratch], pairs


__all__ = ["PAD", "STATIC_SHARED_LIMIT", "lower_gemm", "shared_bytes"]
