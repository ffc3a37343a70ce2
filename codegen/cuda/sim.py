"""The GPU simulator: GPU loop-IR kernels executed on the CPU with numpy, with GPU semantics.

`simulate(program, inputs)` runs a `GpuProgram`'s kernels in order and returns its outputs.
A kernel runs a *wave* of blocks at a time (`wave_blocks`, default as many as fit in
`max_lanes` threads; 1 gives GPU.md's one block at a time), blocks in natural, shuffled or
reversed order (`order`). Inside a wave every thread runs the statements together: a register
is a numpy array with one element per thread (`nfc.codegen.cuda.simexpr`), a condition that
differs between threads masks them, and a loop whose extent differs runs to the largest.

What it checks, each a `SimError` naming the kernel, its source location, the buffer and the
threads:

- **races** (`RaceError`): shared memory accesses are recorded per address since the last
  `__syncthreads()` of the block: a thread reading what another wrote, writing what another
  read or wrote, is a race unless both are in one warp and a `__syncwarp()` came between.
  Fragment loads and stores count as accesses by their warp. In global memory, two threads
  writing one element, or reading one another thread wrote, in one kernel is a race (the CUDA
  lowering never relies on ordering between threads through global memory).
- **bounds** (`BoundsError`): every index of every access made by an active thread is checked
  per dimension, for global, shared and register arrays alike (no wrapping).
- **divergence** (`DivergenceError`): `__syncthreads()` reached by only part of a block;
  warp shuffles and WMMA operations by part of a warp, or with operands that differ between
  its lanes; WMMA pointers not 32-byte aligned, leading dimensions not a multiple of 16 bytes.
- **coverage**: every element of every kernel output written (else `SimError`), and nothing
  read from memory no one wrote (uninitialised registers and shared memory are NaN, so that
  shows in the results).

WMMA fragments are per-warp arrays: `load_matrix_sync` rounds the tile to the fragment's
precision (f16, bf16, tf32), `mma_sync` is an f32 numpy matmul, so the simulated error has the
hardware's order of magnitude (not its exact bits). Arithmetic follows the generated CUDA C
(f16/bf16 computed in f32 and rounded when stored, `fmaxf` ignoring NaN), not the interpreter:
comparing the two tests the lowering.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from nfc.codegen.cuda.gpuir import (
    FragFill,
    FragLoad,
    Fragment,
    FragMma,
    FragStore,
    VecLoad,
    WarpShuffle,
)
from nfc.codegen.cuda.lower import GpuKernel, GpuProgram
from nfc.codegen.cuda.simexpr import (
    BoundsError,
    DivergenceError,
    ExprCompiler,
    Globals,
    Mask,
    RaceError,
    SimError,
    Track,
    Wave,
    active,
    check_shared_write,
    fill_value,
    lanes_of,
    storage_dtype,
    to_storage,
)
from nfc.codegen.cuda.types import F32, I32, compute_type, numpy_dtype, round_to
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
from nfc.ir import DType

Run = Callable[[Wave, Mask], None]
#: Lanes (threads of all blocks of a wave) simulated together by default.
MAX_LANES = 1 << 13

__all__ = ["BoundsError", "DivergenceError", "RaceError", "SimError", "simulate",
           "simulate_kernel"]


def _combine(reduce: str, old: Any, new: Any, dt: DType) -> Any:
    if reduce == "sum":
        return old + new
    if reduce == "prod":
        return old * new
    if dt.is_float:
        return np.fmax(old, new) if reduce == "max" else np.fmin(old, new)
    return np.maximum(old, new) if reduce == "max" else np.minimum(old, new)


class KernelSim:
    """One kernel compiled to closures, run wave by wave."""

    def __init__(self, kernel: GpuKernel, glob: Globals) -> None:
        self.kernel = kernel
        self.glob = glob
        self.ex = ExprCompiler(glob)
        self.where = f" ({kernel.loc})" if kernel.loc is not None else ""
        body = kernel.func.body
        if not (isinstance(body, For) and body.kind is LoopKind.BLOCK_X):
            raise SimError(f"kernel '{kernel.func.name}' does not start with a blockIdx.x loop")
        self.bx = body.var
        self.shared: list[Buffer] = []
        inner = body.body
        while isinstance(inner, Allocate) and inner.buffer.scope is Scope.SHARED:
            self.shared.append(inner.buffer)
            inner = inner.body
        if not (isinstance(inner, For) and inner.kind is LoopKind.THREAD_X):
            raise SimError(f"kernel '{kernel.func.name}': only shared allocations may sit "
                           "between the blockIdx.x and threadIdx.x loops")
        self.tx = inner.var
        self.run_body = self.stmt(inner.body)

    def fail(self, cls: type[SimError], w: Wave, msg: str) -> SimError:
        """An error naming the kernel and its location."""
        return cls(f"kernel '{w.kernel}'{w.where}: {msg}")

    # -- statements --------------------------------------------------------------------------

    def stmt(self, s: Stmt) -> Run:
        """A closure running statement `s`."""
        if isinstance(s, Seq):
            parts = [self.stmt(x) for x in s.body]

            def seq(w: Wave, m: Mask) -> None:
                for p in parts:
                    p(w, m)
            return seq
        if isinstance(s, For):
            return self._for(s)
        if isinstance(s, If):
            return self._if(s)
        if isinstance(s, Allocate):
            return self._allocate(s)
        if isinstance(s, Store):
            return self._store(s)
        if isinstance(s, Barrier):
            return self._barrier(s)
        if isinstance(s, WarpShuffle):
            return self._shuffle(s)
        if isinstance(s, FragFill | FragLoad | FragMma | FragStore):
            return self._fragment(s)
        if isinstance(s, VecLoad):
            return self._vecload(s)
        raise SimError(f"the simulator cannot run {type(s).__name__}")

    def _for(self, s: For) -> Run:
        if s.kind.is_gpu:
            raise SimError(f"kernel '{self.kernel.func.name}': nested {s.kind.value} loop")
        ext, body, var = self.ex.expr(s.extent, I32), self.stmt(s.body), s.var

        def loop(w: Wave, m: Mask) -> None:
            n = ext(w, m)
            if np.ndim(n) == 0:
                for i in range(int(n)):
                    w.env[var] = np.int32(i)
                    body(w, m)
            else:
                act = active(w, m)
                top = int(n[act].max()) if act.any() else 0
                for i in range(top):
                    w.env[var] = np.int32(i)
                    mi = act & (i < n)
                    if mi.any():
                        body(w, mi)
            w.env.pop(var, None)
        return loop

    def _if(self, s: If) -> Run:
        cond = self.ex.expr(s.cond, DType.I1)
        then = self.stmt(s.then)
        orelse = self.stmt(s.orelse) if s.orelse is not None else None

        def branch(w: Wave, m: Mask) -> None:
            c = cond(w, m)
            if np.ndim(c) == 0:
                if c:
                    then(w, m)
                elif orelse is not None:
                    orelse(w, m)
                return
            act = active(w, m)
            mt = act & c
            if mt.any():
                then(w, mt)
            if orelse is not None:
                mf = act & ~c
                if mf.any():
                    orelse(w, mf)
        return branch

    def _allocate(self, s: Allocate) -> Run:
        b, body = s.buffer, self.stmt(s.body)
        if b.scope is Scope.SHARED:
            raise SimError(f"kernel '{self.kernel.func.name}': shared buffer '{b.name}' inside "
                           "the thread loop")
        if b.scope is Scope.GLOBAL:
            raise SimError("kernel workspace buffers are not supported by the CUDA backend")
        if isinstance(b, Fragment):
            def frag(w: Wave, m: Mask) -> None:
                w.frags[b.name] = np.full((w.warps, *b.shape, *b.tile), np.nan, np.float32)
                body(w, m)
                del w.frags[b.name]
            return frag
        nd, fill = storage_dtype(b.dtype), fill_value(b.dtype)

        def alloc(w: Wave, m: Mask) -> None:
            w.local[b.name] = np.full((w.lanes, max(1, b.size)), fill, nd)
            body(w, m)
            del w.local[b.name]
        return alloc

    def _store(self, s: Store) -> Run:
        b = s.buffer
        ct = compute_type(b.dtype)
        idx = [self.ex.expr(i, I32) for i in s.indices]
        value = self.ex.expr(s.value, ct)
        old = self.ex.load(b, idx) if s.reduce else None
        reduce = s.reduce
        name = b.name
        offset = self.ex.offset(b, idx, "write")
        nd = storage_dtype(b.dtype)
        bf16 = b.dtype.value == "bf16"

        def store(w: Wave, m: Mask) -> None:
            v = value(w, m)
            if old is not None:
                assert reduce is not None
                v = _combine(reduce, old(w, m), v, ct)
            v = round_to(v, "bf16") if bf16 else np.asarray(v).astype(nd, copy=False)
            off = offset(w, m)
            if b.scope is Scope.REGISTER or b.scope is Scope.LOCAL:
                data = w.local[name]
                if m is None and np.ndim(off) == 0:
                    data[:, off] = v
                else:
                    act = active(w, m)
                    data[w.lane[act], lanes_of(off, w)[act]] = lanes_of(v, w)[act]
                return
            lanes = np.nonzero(active(w, m))[0]
            addr, vals = lanes_of(off, w)[lanes], lanes_of(v, w)[lanes]
            if b.scope is Scope.SHARED:
                check_shared_write(w, lanes, b, addr, w.thread[lanes])
                w.local[name][w.lblock[lanes], addr] = vals
            else:
                self._global_write(w, b, lanes, addr)
                self.glob.arrays[name][addr] = vals
        return store

    def _global_write(self, w: Wave, b: Buffer, lanes: np.ndarray, addr: np.ndarray) -> None:
        writers = self.glob.writers.setdefault(b.name, np.full(b.size, -1, np.int64))
        me = w.gthread[lanes]
        uniq, counts = np.unique(addr, return_counts=True)
        prev = writers[addr]
        bad = (prev >= 0) & (prev != me)
        if (counts > 1).any() or bad.any():
            if (counts > 1).any():
                a = uniq[np.argmax(counts > 1)]
                two = me[addr == a][:2]
                other, n = int(two[1]), int(np.argmax(addr == a))
            else:
                n = int(np.argmax(bad))
                other = int(prev[n])
            raise self.fail(RaceError, w, f"global buffer '{b.name}' element {int(addr[n])} is "
                            f"written by global threads {int(me[n])} and {other}")
        writers[addr] = me

    def _barrier(self, s: Barrier) -> Run:
        def sync(w: Wave, m: Mask) -> None:
            act = active(w, m)
            if s.scope == "warp":
                per = act.reshape(w.warps, -1)
                part = per.any(1) & ~per.all(1)
                if part.any():
                    lane = int(np.argmax(np.repeat(part, 32) & ~act))
                    raise self.fail(DivergenceError, w, f"__syncwarp() not reached by "
                                    f"{w.who(lane)} while other lanes of its warp reach it")
                w.wepoch[per.all(1)] += 1
                return
            per = act.reshape(len(w.blocks), w.threads)
            part = per.any(1) & ~per.all(1)
            if part.any():
                b = int(np.argmax(part))
                missing = int(np.argmax(~per[b]))
                raise self.fail(DivergenceError, w, f"__syncthreads() reached by "
                                f"{int(per[b].sum())} of {w.threads} threads of block "
                                f"{int(w.blocks[b])} (thread {missing} does not reach it)")
            blocks = np.nonzero(per.all(1))[0]
            for tr in w.tracks.values():
                tr.reset(blocks)
        return sync

    def _warps(self, w: Wave, m: Mask, what: str) -> np.ndarray:
        """Warps executing a warp-collective operation (all their lanes active)."""
        act = active(w, m)
        per = act.reshape(w.warps, -1)
        if per.shape[1] != 32:
            raise self.fail(DivergenceError, w, f"{what} in a block of {w.threads} threads (not "
                            "a multiple of 32)")
        part = per.any(1) & ~per.all(1)
        if part.any():
            lane = int(np.argmax(np.repeat(part, 32) & ~act))
            raise self.fail(DivergenceError, w, f"{what} is not executed by {w.who(lane)} "
                            "while other lanes of its warp execute it")
        return np.nonzero(per.all(1))[0]

    def _uniform(self, w: Wave, warps: np.ndarray, x: Any, what: str) -> np.ndarray:
        """The per-warp value of an operand that must be the same in all 32 lanes."""
        if np.ndim(x) == 0:
            return np.full(len(warps), int(x))
        per = np.asarray(x).reshape(w.warps, 32)[warps]
        bad = (per != per[:, :1]).any(1)
        if bad.any():
            lane = int(warps[np.argmax(bad)]) * 32
            raise self.fail(DivergenceError, w, f"{what} differs between the lanes of the "
                            f"warp of {w.who(lane)}")
        return per[:, 0].astype(np.int64)

    def _shuffle(self, s: WarpShuffle) -> Run:
        dt = compute_type(s.dst.dtype)
        value = self.ex.expr(s.value, dt)
        idx = [self.ex.expr(i, I32) for i in s.index]
        name, off = s.dst.name, s.offset
        at = self.ex.offset(s.dst, idx, "write")
        if s.dst.scope not in (Scope.REGISTER, Scope.LOCAL):
            raise SimError("a shuffle writes a register")

        def shfl(w: Wave, m: Mask) -> None:
            warps = self._warps(w, m, "__shfl_xor_sync")
            v = lanes_of(value(w, m), w)
            src = w.lane ^ off
            lanes = (warps[:, None] * 32 + np.arange(32)).ravel()
            w.local[name][lanes, lanes_of(at(w, m), w)[lanes]] = to_storage(v[src[lanes]],
                                                                         s.dst.dtype)
        return shfl

    def _vecload(self, s: VecLoad) -> Run:
        """`width` element loads, after checking that the first is `width`-aligned."""
        from nfc.ir import Binary, Const

        *lead, last = s.index
        parts = [self._store(Store(s.dst, (Const(u),), BufLoad(
            s.src, (*lead, Binary("+", last, Const(u)))))) for u in range(s.width)]
        flat = self.ex.offset(s.src, [self.ex.expr(i, I32) for i in s.index], "read")

        def vload(w: Wave, m: Mask) -> None:
            off = np.asarray(flat(w, m))
            bad = (off % s.width != 0) & active(w, m)
            if bad.any():
                lane = int(np.argmax(bad))
                raise self.fail(SimError, w, f"a {s.width}-element vector load of '{s.src.name}' "
                                f"at element {int(lanes_of(off, w)[lane])} by {w.who(lane)} is "
                                "not aligned")
            for p in parts:
                p(w, m)
        return vload

    def _fragment(self, s: Stmt) -> Run:
        ix = self.ex

        def index(idx: Sequence[Any], w: Wave, m: Mask, warps: np.ndarray) -> tuple[Any, ...]:
            return tuple(self._uniform(w, warps, f(w, m), "a fragment index") for f in idx)

        if isinstance(s, FragFill):
            fi, val = [ix.expr(i, I32) for i in s.index], ix.expr(s.value, F32)

            def fill(w: Wave, m: Mask) -> None:
                warps = self._warps(w, m, "wmma::fill_fragment")
                w.frags[s.frag.name][(warps, *index(fi, w, m, warps))] = np.float32(val(w, m))
            return fill
        if isinstance(s, FragMma):
            ci, ai, bi = ([ix.expr(i, I32) for i in idx] for idx in (s.acc_index, s.a_index,
                                                                       s.b_index))

            def mma(w: Wave, m: Mask) -> None:
                warps = self._warps(w, m, "wmma::mma_sync")
                acc, a, b = (w.frags[f.name] for f in (s.acc, s.a, s.b))
                at = (warps, *index(ci, w, m, warps))
                prod = np.matmul(a[(warps, *index(ai, w, m, warps))],
                                 b[(warps, *index(bi, w, m, warps))])
                acc[at] = acc[at] + prod.astype(np.float32)
            return mma
        if isinstance(s, FragLoad):
            return self._tile(s.src, s.origin, s.frag, s.index, load=True)
        assert isinstance(s, FragStore)
        return self._tile(s.dst, s.origin, s.frag, s.index, load=False)

    def _tile(self, buf: Buffer, origin: Sequence[Any], frag: Fragment, index: Sequence[Any],
              load: bool) -> Run:
        """`load_matrix_sync` / `store_matrix_sync` between a fragment and `buf`."""
        org = [self.ex.expr(i, I32) for i in origin]
        fidx = [self.ex.expr(i, I32) for i in index]
        rows, cols = frag.tile
        ld = buf.shape[-1]
        item = buf.dtype.itemsize
        what = "wmma::load_matrix_sync" if load else "wmma::store_matrix_sync"
        grid = (np.arange(rows)[:, None] * ld + np.arange(cols)[None, :]).ravel()

        def tile(w: Wave, m: Mask) -> None:
            warps = self._warps(w, m, what)
            lane0 = warps * 32
            corner = [self._uniform(w, warps, f(w, m), f"the {what} pointer") for f in org]
            base = np.zeros(len(warps), np.int64)
            for n, (x, size, stride) in enumerate(zip(corner, buf.shape, buf.strides,
                                                       strict=True)):
                if ((x < 0) | (x >= size)).any():
                    raise self.fail(BoundsError, w, f"{what} at index {int(x.max())} of "
                                    f"dimension {n} of '{buf.name}' {list(buf.shape)}")
                base = base + x * stride
            if (base * item % 32).any() or (ld * item) % 16:
                raise self.fail(SimError, w, f"{what} on '{buf.name}' needs a 32-byte aligned "
                                f"pointer and a leading dimension of a multiple of 16 bytes "
                                f"(offset {int(base[0]) * item} bytes, ldm {ld * item} bytes)")
            if (corner[-1] + cols > buf.shape[-1]).any() or \
                    (base + grid[-1] >= buf.size).any():
                raise self.fail(BoundsError, w, f"{what} tile {rows}x{cols} runs past the end "
                                f"of '{buf.name}' {list(buf.shape)}")
            addr = base[:, None] + grid[None, :]
            f_at = (warps, *(self._uniform(w, warps, f(w, m), "a fragment index")
                             for f in fidx))
            blk = w.lblock[lane0]
            if load:
                if buf.scope is Scope.SHARED:
                    data = w.local[buf.name][blk[:, None], addr]
                    self._tile_reads(w, buf, warps, addr)
                else:
                    data = self.glob.arrays[buf.name][addr]
                vals = data.astype(np.float32).reshape(len(warps), rows, cols)
                if frag.precision in ("f16", "bf16", "tf32"):
                    vals = round_to(vals, frag.precision)
                w.frags[frag.name][f_at] = vals
                return
            vals = to_storage(w.frags[frag.name][f_at].reshape(len(warps), -1), buf.dtype)
            if buf.scope is Scope.SHARED:
                for n, warp in enumerate(warps):
                    lanes = np.full(rows * cols, warp * 32)
                    check_shared_write(w, lanes, buf, addr[n], w.thread[lanes])
                w.local[buf.name][blk[:, None], addr] = vals
            else:
                raise SimError(f"{what} to global memory is not used by the CUDA lowering")
        return tile

    def _tile_reads(self, w: Wave, buf: Buffer, warps: np.ndarray, addr: np.ndarray) -> None:
        """A fragment load reads as its whole warp: what any thread wrote since the last
        barrier (its own warp: since the last `__syncwarp`) is a race."""
        tr = w.tracks[buf.name]
        for n, warp in enumerate(warps):
            b = int(w.lblock[warp * 32])
            who, ep = tr.writer[b, addr[n]], tr.wepoch[b, addr[n]]
            other_warp = (b * w.threads + np.maximum(who, 0)) // 32
            synced = (other_warp == warp) & (ep != w.wepoch[warp])
            bad = (who >= 0) & ~synced
            if bad.any():
                k = int(np.argmax(bad))
                raise self.fail(RaceError, w, f"shared-memory race on '{buf.name}' element "
                                f"{int(addr[n][k])} of block {int(w.blocks[b])}: warp "
                                f"{warp % (w.threads // 32)} loads a fragment over what thread "
                                f"{int(who[k])} wrote, with no barrier between")
            me = (warp * 32) % w.threads  # the warp's reads are recorded as its lane 0's
            a = addr[n]
            lo = tr.rlo[b, a]
            tr.rlo[b, a] = np.where(lo < 0, me, np.minimum(lo, me))
            tr.rhi[b, a] = np.maximum(tr.rhi[b, a], me)
            tr.repoch[b, a] = w.wepoch[warp]

    # -- running -----------------------------------------------------------------------------

    def run(self, order: np.ndarray, wave_blocks: int) -> None:
        """Run the blocks in `order`, `wave_blocks` at a time."""
        name = self.kernel.func.name
        for start in range(0, len(order), wave_blocks):
            w = Wave(name, self.where, order[start:start + wave_blocks], self.kernel.block)
            w.env[self.bx] = w.block
            w.env[self.tx] = w.thread
            for b in self.shared:
                w.local[b.name] = np.full((len(w.blocks), b.size), fill_value(b.dtype),
                                          storage_dtype(b.dtype))
                w.tracks[b.name] = Track.new(len(w.blocks), b.size)
            self.run_body(w, None)


def simulate_kernel(kernel: GpuKernel, arrays: dict[str, np.ndarray], *,
                    order: str = "natural", seed: int = 0, wave_blocks: int | None = None,
                    max_lanes: int = MAX_LANES) -> None:
    """Run one kernel on flat global `arrays` (buffer name -> array in storage type), in
    place; SimError when it breaks a rule (module docstring)."""
    glob = Globals(arrays)
    sim = KernelSim(kernel, glob)
    blocks = np.arange(kernel.grid)
    if order == "shuffled":
        blocks = np.random.default_rng(seed).permutation(kernel.grid)
    elif order == "reversed":
        blocks = blocks[::-1].copy()
    elif order != "natural":
        raise ValueError(f"unknown block order '{order}'")
    per = wave_blocks or max(1, max_lanes // kernel.block)
    with np.errstate(all="ignore"):  # integer wrap-around and IEEE results are the semantics
        sim.run(blocks, per)
    f = kernel.func
    for out in f.params[:f.n_outputs]:
        written = glob.writers.get(out.name)
        missing = out.size if written is None else int((written < 0).sum())
        if missing:
            first = 0 if written is None else int(np.argmax(written < 0))
            raise SimError(f"kernel '{f.name}' leaves {missing} of {out.size} elements of "
                           f"'{out.name}' unwritten (the first at flat index {first})")


def _storage_array(x: Any, b: Buffer) -> np.ndarray:
    a = np.asarray(x)
    if a.shape != b.shape:
        raise ValueError(f"input '{b.name}' has shape {a.shape}, expected {b.shape}")
    if b.dtype.value == "bf16":
        return round_to(a.astype(np.float32), "bf16").reshape(-1)
    return np.ascontiguousarray(a, dtype=storage_dtype(b.dtype)).reshape(-1).copy()


def simulate(program: GpuProgram, inputs: Sequence[Any] | Mapping[str, Any], *,
             order: str = "natural", seed: int = 0, wave_blocks: int | None = None,
             max_lanes: int = MAX_LANES) -> list[np.ndarray]:
    """The outputs of `program` on `inputs` (in its input order, or by name), computed by
    simulating its kernels in order (see `simulate_kernel` for the options)."""
    ins = program.params[program.n_outputs:]
    if isinstance(inputs, Mapping):
        values = [inputs[b.name] for b in ins]
    else:
        values = list(inputs)
        if len(values) != len(ins):
            raise ValueError(f"{len(values)} inputs for {len(ins)} parameters")
    arrays = {b.name: _storage_array(x, b) for b, x in zip(ins, values, strict=True)}
    for b in (*program.params[:program.n_outputs], *program.temps):
        arrays[b.name] = np.full(b.size, fill_value(b.dtype), storage_dtype(b.dtype))
    for k in program.kernels:
        simulate_kernel(k, arrays, order=order, seed=seed, wave_blocks=wave_blocks,
                        max_lanes=max_lanes)
    outs = []
    for b in program.params[:program.n_outputs]:
        a = arrays[b.name].reshape(b.shape)
        outs.append(a.astype(numpy_dtype(F32)) if b.dtype.value == "bf16" else a)
    return outs
