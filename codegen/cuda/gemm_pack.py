"""GEMM operand packing: the `pack` knob of `GemmSchedule` (the GPU form of the CPU's panel
packing and of blocked GEMM operands).

With `pack` `a`, `b` or `ab`, a kernel of its own runs before the GEMM kernel of the program
and copies each chosen operand of the contraction into a global temporary
(`GpuProgram.temps`) laid out tile by tile in the order the GEMM's tile copies read it:

    operand on the block's M side (A, or B when swapped), tile (i: block_m, k: block_k):
        packed[lead.., i / block_m, k / block_k, block_m, block_k]
    operand on the block's N side (B, or A when swapped), tile (k: block_k, j: block_n):
        packed[lead.., j / block_n, k / block_k, block_k, block_n]

`lead` are the operand's other axes (batch and outer reduction axes), in its order. Tiles past
a ragged M, N or K edge are padded with zeros, so every tile of the temporary is one contiguous
run of `rows x cols` elements in the shared tile's own row order: the GEMM copies it with
consecutive threads on consecutive elements (coalesced whatever the operand's layout was),
without bounds guards, and with vector loads whenever the tile's row (`block_k` for the M
side, `block_n` for the N side) is a multiple of the vector width and the vector fits 16
bytes (`vector_problem` in nfc.codegen.cuda.gemm_tiles). The values in shared memory are the
ones the unpacked kernel stores, so the multiply, and on the FMA path its bits, are unchanged.

The packing kernel is elementwise over the temporary (one element per thread, consecutive
threads writing consecutive elements; reads are strided where the operand's contiguous axis
is the tile's row axis). It runs on every call: packing pays where an operand's tile is read
by many blocks (A by every N tile, B by every M tile) from a layout the plain copy reads
badly. `pack_problem` refuses a temporary past 32-bit indexing or over `PACK_GROWTH` times the
operand (padding of small operands by large tiles); `pack_notes` names packs that are legal
but copy an operand that is already tile-contiguous.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from nfc.codegen.cuda.lower import (
    MAX_ELEMENTS,
    GpuKernel,
    Names,
    add,
    bind_coords,
    body_expr,
    kernel_shell,
    let,
    lets,
    lt,
    mul,
    v,
)
from nfc.codegen.cuda.schedule import ElementwiseSchedule, GemmSchedule, GpuScheduleError
from nfc.codegen.loops import Buffer, BufLoad, LoopFunc, Store, unique_name
from nfc.codegen.lowering.tails import conjunction as conj
from nfc.codegen.lowering.tails import guarded as guard
from nfc.contraction import flatten, match_contraction, plain_names
from nfc.ir import Axis, ComputeOp, Const, Expr, Index, Load, Select

#: Largest packed temporary, in multiples of the operand's own size (zero padding included).
PACK_GROWTH = 4
#: Threads per block of a packing kernel.
PACK_THREADS = 256


@dataclass(frozen=True)
class PackedOperand:
    """Where one packed operand's tiles come from and how the temporary is laid out."""

    role: str
    """`a` or `b`: the contraction's operand (before any swap)."""
    load: Load
    """The operand in the flattened view of the contraction."""
    lead: tuple[tuple[str, int], ...]
    """Its other axes (name, extent), in its order."""
    row_axis: str
    col_axis: str
    rows: int
    """The tile: `rows x cols` (block_m x block_k on the M side, block_k x block_n on N)."""
    cols: int
    row_n: int
    col_n: int
    k_rows: bool
    """The K axis is the tile's row axis (the operand is on the block's N side)."""

    @property
    def tiles(self) -> tuple[int, int]:
        """Tiles along the operand's non-K axis and along K."""
        rt, ct = -(-self.row_n // self.rows), -(-self.col_n // self.cols)
        return (ct, rt) if self.k_rows else (rt, ct)

    @property
    def shape(self) -> tuple[int, ...]:
        """`(lead.., outer tiles, K tiles, rows, cols)`."""
        return (*(e for _, e in self.lead), *self.tiles, self.rows, self.cols)

    @property
    def size(self) -> int:
        """Elements of the temporary."""
        n = 1
        for e in self.shape:
            n *= e
        return n

    @property
    def what(self) -> str:
        """`operand A` or `operand B`."""
        return f"operand {self.role.upper()}"


def gemm_view(op: ComputeOp) -> ComputeOp:
    """The contraction over single axes the GEMM lowering sees (`op` or its flattened view)."""
    cont = match_contraction(op)
    if cont is None:
        raise GpuScheduleError("a gemm schedule for a compute that is not a contraction")
    view = flatten(op, cont)
    return op if view is None else view.op


def packed_operands(op: ComputeOp, s: GemmSchedule) -> list[PackedOperand]:
    """The operands `s.pack` packs, for a contraction over single axes (`gemm_view`)."""
    cont = match_contraction(op)
    assert cont is not None and cont.is_gemm, "packed_operands needs a flattened contraction"
    ext = {a.name: a.extent for a in op.all_axes}
    i, j, k = cont.i[0], cont.j[0], cont.k[0]
    if s.swap:
        i, j = j, i
    out = []
    for role in s.packed:
        load = cont.a if role == "a" else cont.b
        names = plain_names(load)
        assert names is not None
        m_side = (role == "a") != s.swap
        row, col = (i, k) if m_side else (k, j)
        rows, cols = (s.block_m, s.block_k) if m_side else (s.block_k, s.block_n)
        lead = tuple((x, ext[x]) for x in names if x not in (row, col))
        out.append(PackedOperand(role, load, lead, row, col, rows, cols, ext[row], ext[col],
                                 not m_side))
    return out


def pack_problem(op: ComputeOp, s: GemmSchedule) -> str | None:
    """Why `s.pack` cannot pack the operands of contraction `op` (None: it can, or there is
    nothing to pack)."""
    if not s.packed:
        return None
    for p in packed_operands(gemm_view(op), s):
        size = p.size
        own = max(1, p.load.tensor.type.size)
        if size > MAX_ELEMENTS:
            return (f"packed {p.what} would have {size} elements; the CUDA backend indexes "
                    f"with 32 bits (at most {MAX_ELEMENTS})")
        if size > PACK_GROWTH * own:
            return (f"packed {p.what} would have {size} elements, over {PACK_GROWTH} times "
                    f"its {own} (zero padding of the {p.rows}x{p.cols} tiles)")
    return None


def pack_notes(op: ComputeOp, s: GemmSchedule) -> list[str]:
    """Packs of `s` that are legal but pointless: the operand is already laid out tile by
    tile (its axes in the packed order, no padding, one tile along its contiguous axis), so
    the packing kernel copies it unchanged."""
    notes = []
    for p in packed_operands(gemm_view(op), s) if s.packed else ():
        names = plain_names(p.load)
        if (names == [*(x for x, _ in p.lead), p.row_axis, p.col_axis]
                and p.row_n % p.rows == 0 and p.col_n == p.cols):
            notes.append(f"{p.what} is already tile-contiguous: packing copies it unchanged")
    return notes


@dataclass(frozen=True)
class PackedSrc:
    """A tile of a packed temporary, for nfc.codegen.cuda.gemm_tiles.copy_tile: element
    (r, col) of the tile at (outer tile, K tile); always inside (zero padded), and
    contiguous along the tile's rows."""

    buffer: Buffer
    lead: tuple[Expr, ...]
    outer: Expr
    ktile: Expr
    fast_rows: bool = False

    def expr(self, r: Expr, col: Expr) -> Expr:
        """The element at tile position (r, col)."""
        return BufLoad(self.buffer, (*self.lead, self.outer, self.ktile, r, col))

    def cond(self, r: Expr, col: Expr, rows: int, cols: int) -> Expr | None:
        """Never a guard: the padding is in the temporary."""
        return None


def packed_src(p: PackedOperand, buf: Buffer, env: dict[str, Expr], outer: Expr,
               ktile: Expr) -> PackedSrc:
    """The tile source of packed operand `p` (temporary `buf`) at block tile `outer` and K
    tile `ktile`; `env` gives the lead axes (batch and outer reduction indices)."""
    return PackedSrc(buf, tuple(env[x] for x, _ in p.lead), outer, ktile)


def _pack_kernel(p: PackedOperand, dst: Buffer, bufs: dict[int, Buffer], used: set[str],
                 name: str, op: ComputeOp) -> GpuKernel:
    """The elementwise kernel writing temporary `dst` (see the module docstring)."""
    src = bufs[id(p.load.tensor)]
    names = Names(set(used) | {dst.name, src.name})
    n = dst.size
    t = min(PACK_THREADS, max(32, -(-n // 32) * 32))
    grid = max(1, -(-n // t))
    bx, tx = names.fresh("bx"), names.fresh("tx")
    flat = names.scalar("i")
    keys: set[str] = {x for x, _ in p.lead}
    tile, kt, r, col = (unique_name(h, keys, h) for h in ("tile", "ktile", "row", "col"))
    outer_n, k_n = p.tiles
    axes = [*(Axis(x, e) for x, e in p.lead), Axis(tile, outer_n), Axis(kt, k_n),
            Axis(r, p.rows), Axis(col, p.cols)]
    pairs, env = bind_coords(names, axes, v(flat))
    rtile, ctile = (env[kt], env[tile]) if p.k_rows else (env[tile], env[kt])
    rpos, cpos = add(mul(rtile, p.rows), env[r]), add(mul(ctile, p.cols), env[col])
    value = body_expr(p.load, {x: env[x] for x, _ in p.lead} | {p.row_axis: rpos,
                                                                   p.col_axis: cpos}, bufs)
    cond = conj([lt(rpos, p.row_n)] * bool(p.row_n % p.rows)
                + [lt(cpos, p.col_n)] * bool(p.col_n % p.cols))
    zero = Const(0.0 if dst.dtype.is_float else 0)
    store = Store(dst, tuple(env[a.name] for a in axes),
                  value if cond is None else Select(cond, value, zero))
    body = let(flat, add(mul(Index(bx), t), Index(tx)),
               guard(lt(v(flat), n) if grid * t != n else None, lets(pairs, store)))
    func = LoopFunc(name, (dst, src), 1, kernel_shell(grid, t, (), body, bx, tx))
    source = (f"pack {p.what} ('{src.name}') into {p.rows}x{p.cols} tiles "
              f"[{', '.join(str(e) for e in dst.shape)}]")
    return GpuKernel(func, grid, t, ElementwiseSchedule(t, 1), "elementwise", source, op.loc)


def lower_packs(op: ComputeOp, s: GemmSchedule, bufs: dict[int, Buffer], used: set[str],
                name: str) -> tuple[list[Buffer], list[GpuKernel], dict[str, Buffer]]:
    """For a GEMM stage `op` scheduled with `s.pack`: the packed temporaries (their names
    join `used`), the packing kernels (run them before the GEMM) and role -> temporary, for
    `lower_stage`'s `packed`."""
    why = s.problem()
    if why is not None:
        raise GpuScheduleError(f"invalid gemm schedule: {why}")
    cont = match_contraction(op)
    if cont is None:
        raise GpuScheduleError("a gemm schedule for a compute that is not a contraction")
    why = pack_problem(op, s)
    if why is not None:
        raise GpuScheduleError(why)
    view = flatten(op, cont)
    vop, vbufs = op, bufs
    if view is not None:  # the same memory seen in the view's shapes (as lower_stage does)
        vop, vbufs = view.op, dict(bufs)
        for vid, fv in view.values.items():
            vbufs[id(fv)] = replace(bufs[vid], shape=fv.shape)
    temps, kernels, packed = [], [], {}
    for p in packed_operands(vop, s):
        src = vbufs[id(p.load.tensor)]
        tb = Buffer(unique_name(f"{src.name}_packed", used, "packed"), p.shape, src.dtype)
        used.add(f"{name}_pack_{p.role}")
        kernels.append(_pack_kernel(p, tb, vbufs, used, f"{name}_pack_{p.role}", op))
        temps.append(tb)
        packed[p.role] = tb
    return temps, kernels, packed


__all__ = ["PACK_GROWTH", "PackedOperand", "PackedSrc", "gemm_view", "lower_packs",
           "pack_notes", "pack_problem", "packed_operands", "packed_src"]
