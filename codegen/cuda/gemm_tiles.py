"""GEMM tile copies and the K loop: scalar or vector global loads, one or two shared stages.

`lower_gemm` (nfc.codegen.cuda.gemm) builds the multiply; this module builds how the operand
tiles reach shared memory, per the schedule's `vector_width` and `double_buffer`:

- **Copies.** Threads copy a `rows x cols` tile, consecutive threads taking consecutive
  elements along the operand's contiguous axis (coalesced). With `vector_width` w > 1 a thread
  takes w consecutive elements in one `VecLoad` (a 64- or 128-bit load) into registers and
  stores them to shared memory. That needs the operand's contiguous extent (the row length of
  the buffer, so every row starts aligned) and the tile's extent along that axis to be
  multiples of w, and w elements to fit 16 bytes (`vector_problem`); then a vector lies wholly
  inside or wholly past a ragged edge, so one guard per vector (zeros past it) suffices.
  Buffers are at least 64-byte aligned (the memory plan, `cudaMalloc`); the simulator checks
  the alignment of every vector load. A packed operand's tiles (nfc.codegen.cuda.gemm_pack)
  are contiguous runs along the tile's rows with no edge: the same copy, without guards.
- **The K loop.** Single stage: per K step `copy; __syncthreads(); multiply; __syncthreads()`.
  Double buffered (two shared stages, NeoFlow's overlap of the next tile's loads with the
  current tile's MMAs):

      copy tile 0 -> stage 0; __syncthreads()
      for k0: if k0 + 1 < steps: copy tile k0 + 1 -> stage (k0 + 1) % 2
              multiply stage k0 % 2; __syncthreads()

  One barrier per step: the copy in step k0 overwrites the stage read in step k0 - 1 (a
  barrier ended that step) and is read in step k0 + 1 (after this step's barrier). The loads
  of the next tile are issued before the multiply, so their latency hides behind it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from nfc.codegen.cuda.gpuir import VecLoad
from nfc.codegen.cuda.lower import Names, add, body_expr, c, let, lets, lt, mul, v
from nfc.codegen.cuda.schedule import GemmSchedule
from nfc.codegen.cuda.types import compute_type
from nfc.codegen.loops import (
    Allocate,
    Barrier,
    Buffer,
    BufLoad,
    For,
    If,
    LoopKind,
    Scope,
    Seq,
    Stmt,
    Store,
)
from nfc.codegen.lowering.tails import conjunction as conj
from nfc.codegen.lowering.tails import guarded as guard
from nfc.contraction import flatten, match_contraction, plain_names
from nfc.ir import Binary, ComputeOp, Const, Expr, Index, Select

if TYPE_CHECKING:
    from nfc.codegen.cuda.gemm_pack import PackedSrc

#: Tile-copy loops with at most this many steps per thread are unrolled.
UNROLL_COPY = 8
#: The widest global load (bytes).
VECTOR_BYTES = 16


def _unroll(n: int, limit: int = UNROLL_COPY) -> LoopKind:
    return LoopKind.UNROLLED if n <= limit else LoopKind.SERIAL


@dataclass(frozen=True)
class TileSrc:
    """Where a tile comes from: operand `load` at rows `row0 + r` of axis `row_axis` (extent
    `row_n`) and columns `col0 + c` of `col_axis`; `fast_rows`: the operand's contiguous axis
    is the row axis."""

    load: Expr
    env: dict[str, Expr]
    bufs: dict[int, Buffer]
    row_axis: str
    row0: Expr
    row_n: int
    col_axis: str
    col0: Expr
    col_n: int
    fast_rows: bool

    def expr(self, r: Expr, col: Expr) -> Expr:
        """The operand's element at tile position (r, col)."""
        return body_expr(self.load, self.env | {self.row_axis: add(self.row0, r),
                                                self.col_axis: add(self.col0, col)}, self.bufs)

    def cond(self, r: Expr, col: Expr, rows: int, cols: int) -> Expr | None:
        """Whether (r, col) is inside the operand (None: always, the tiles divide it)."""
        return conj([lt(add(self.row0, r), self.row_n)] * bool(self.row_n % rows)
                    + [lt(add(self.col0, col), self.col_n)] * bool(self.col_n % cols))


def copy_tile(dst: Buffer, stage: tuple[Expr, ...], rows: int, cols: int,
              src: TileSrc | PackedSrc,
              zero: Expr, width: int, threads: int, tx: str, names: Names) -> Stmt:
    """Threads copy a `rows x cols` tile of `src` into `dst[stage..][r][c]` (zeros outside the
    operand), `width` elements per load along the operand's contiguous axis."""
    fr = src.fast_rows
    vr, vc = (rows // width, cols) if fr else (rows, cols // width)  # the tile in vectors
    total = vr * vc
    steps = -(-total // threads)
    s, e = names.fresh("s"), names.scalar("e")
    ri, ci = names.scalar("row"), names.scalar("col")
    r = Binary("%", v(e), c(vr)) if fr else Binary("//", v(e), c(vc))
    col = Binary("//", v(e), c(vr)) if fr else Binary("%", v(e), c(vc))
    if fr:
        r = mul(r, width)
    else:
        col = mul(col, width)
    if width == 1:
        x, cond = src.expr(v(ri), v(ci)), src.cond(v(ri), v(ci), rows, cols)
        body: Stmt = Store(dst, (*stage, v(ri), v(ci)),
                           x if cond is None else Select(cond, x, zero))
    else:
        body = _vector_copy(dst, stage, src, rows, cols, v(ri), v(ci), width, names)
    body = lets([(ri, r), (ci, col)], body)
    inner = let(e, add(mul(Index(s), threads), Index(tx)),
                guard(lt(v(e), total) if steps * threads != total else None, body))
    return For(s, c(steps), _unroll(steps), inner)


def _vector_copy(dst: Buffer, stage: tuple[Expr, ...], src: TileSrc | PackedSrc, rows: int,
                 cols: int,
                 r: Expr, col: Expr, width: int, names: Names) -> Stmt:
    """One vector: a `VecLoad` into registers (zeros past the operand's end), then `width`
    stores to shared memory along the contiguous axis."""
    x = src.expr(r, col)
    found: list[BufLoad] = []
    x.map(lambda n: found.append(n)  # type: ignore[func-returns-value]
          if isinstance(n, BufLoad) and n.buffer.scope is Scope.GLOBAL else None)
    assert len(found) == 1, "a vector of a load"
    gl = found[0]
    ct = compute_type(gl.buffer.dtype)
    reg = Buffer(names.fresh("vec"), (width,), ct, Scope.REGISTER)
    zero = Const(0.0 if ct.is_float else 0)
    load: Stmt = VecLoad(reg, gl.buffer, gl.indices, width)
    cond = src.cond(r, col, rows, cols)
    if cond is not None:
        load = If(cond, load, Seq(tuple(Store(reg, (c(u),), zero) for u in range(width))))
    stores = []
    for u in range(width):
        el = BufLoad(reg, (c(u),))
        value = x.map(lambda n, el=el: el if isinstance(n, BufLoad) and n == gl else None)
        at = (add(r, c(u)), col) if src.fast_rows else (r, add(col, c(u)))
        stores.append(Store(dst, (*stage, *at), value))
    return Allocate(reg, Seq((load, *stores)))


def k_loop(kvar: str, steps: int, copies: Callable[[Expr, tuple[Expr, ...]], Stmt],
           inner: Callable[[tuple[Expr, ...]], Stmt], double: bool) -> Stmt:
    """The K loop over `steps` tiles (module docstring). `copies(tile, stage)` stores tile
    `tile` in shared stage `stage` (() with one stage); `inner(stage)` multiplies a stage."""
    k0 = Index(kvar)
    if not double:
        return For(kvar, c(steps), LoopKind.SERIAL,
                   Seq((copies(k0, ()), Barrier(), inner(()), Barrier())))
    step: list[Stmt] = []
    if steps > 1:
        nxt = add(k0, c(1))
        step.append(If(lt(nxt, steps), copies(nxt, (Binary("%", nxt, c(2)),))))
    step += [inner((Binary("%", k0, c(2)),)), Barrier()]
    return Seq((copies(c(0), (c(0),)), Barrier(),
                For(kvar, c(steps), LoopKind.SERIAL, Seq(tuple(step)))))


def _operand_problem(what: str, load: Expr, axes: tuple[str, str], ext: dict[str, int],
                     tile: dict[str, int], width: int) -> str | None:
    names = plain_names(load)
    if names is None:
        return f"operand {what} is not a plain load"
    last = names[-1]
    if last not in axes:
        return (f"operand {what}'s contiguous axis '{last}' is not one of its tile's axes "
                f"{axes[0]}, {axes[1]}")
    if ext[last] % width:
        return (f"operand {what}'s contiguous extent {ext[last]} is not a multiple of the "
                f"vector width {width}")
    if tile[last] % width:
        return (f"the {tile[last]}-element tile side of operand {what} along its contiguous "
                f"axis is not a multiple of the vector width {width}")
    return None


def vector_problem(op: ComputeOp, s: GemmSchedule) -> str | None:
    """Why `s.vector_width` cannot load the operand tiles of contraction `op` (None: it can,
    or the width is 1). Checked on the flattened view the lowering uses. A packed operand
    (`s.pack`, nfc.codegen.cuda.gemm_pack) needs only its tile's rows to be a multiple of the
    width: the temporary is zero padded and contiguous along them."""
    w = s.vector_width
    if w == 1:
        return None
    cont = match_contraction(op)
    if cont is None:
        return "not a contraction"
    view = flatten(op, cont)
    if view is not None:
        op = view.op
        cont = match_contraction(op)
        assert cont is not None
    ext = {a.name: a.extent for a in op.all_axes}
    i, j, k = cont.i[0], cont.j[0], cont.k[0]
    a, b = cont.a, cont.b
    if s.swap:
        i, j, a, b = j, i, b, a
    for load in (a, b):
        if w * load.tensor.dtype.itemsize > VECTOR_BYTES:
            return (f"{w} {load.tensor.dtype} elements of '{load.tensor.name}' exceed a "
                    f"{VECTOR_BYTES}-byte load")
    tile = {i: s.block_m, j: s.block_n, k: s.block_k}
    roles = ("b", "a") if s.swap else ("a", "b")
    for role, load, axes in ((roles[0], a, (i, k)), (roles[1], b, (k, j))):
        what = role.upper()
        if role in s.packed:  # tile rows are contiguous in the packed temporary
            if tile[axes[1]] % w:
                return (f"the {tile[axes[1]]}-element rows of packed operand {what}'s tiles "
                        f"are not a multiple of the vector width {w}")
            continue
        why = _operand_problem(what, load, axes, ext, tile, w)
        if why is not None:
            return why
    return None


def prefer_swap(op: ComputeOp) -> bool:
    """The default rule of `GemmSchedule.swap`: whether the transposed product has more of
    its three memory streams along their fast direction. A tile copy is coalesced either way
    (threads follow the operand's contiguous axis), but it is conflict-free in shared memory
    and keeps its vector stores when the operand's contiguous axis is the tile's column axis
    (A: k, B: n), and the epilogue's consecutive threads write consecutive n, so the output is
    best contiguous along n. Plain `A[i, k] B[k, j]` scores 3 and is never swapped; `A[k, i]
    B[j, k]` scores 1, its transposed product 2. Narrow shapes alone (the CPU pass's rule) do
    not swap: the GPU tiles take 16 to 128 per side, and a swapped narrow GEMM would write its
    output with a stride."""
    cont = match_contraction(op)
    if cont is None:
        return False
    view = flatten(op, cont)
    if view is not None:
        op = view.op
        cont = match_contraction(op)
        assert cont is not None
    i, j, k = cont.i[0], cont.j[0], cont.k[0]
    la, lb = plain_names(cont.a), plain_names(cont.b)
    if la is None or lb is None:
        return False
    last_out = op.dims[-1].name
    plain = (la[-1] == k) + (lb[-1] == j) + (last_out == j)
    swapped = (lb[-1] == k) + (la[-1] == i) + (last_out == i)
    return swapped > plain


def tile_stages(s: GemmSchedule) -> int:
    """Shared-memory stages of the operand tiles."""
    return 2 if s.double_buffer else 1


__all__ = ["TileSrc", "copy_tile", "k_loop", "prefer_swap", "tile_stages", "vector_problem"]
