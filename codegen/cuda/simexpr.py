"""The simulator's state and its expressions: loop-IR expressions compiled to numpy closures.

A *wave* is a set of blocks run together; its lanes are their threads, block-major (lane
`b * threads + t`), so a value is a numpy array of one element per lane, or a numpy scalar when
it is the same in every lane. A closure takes the wave and the mask of active lanes (None: all
lanes) and returns the value in the compute type the CUDA renderer uses for the node
(`nfc.codegen.cuda.types`), so simulated arithmetic is the arithmetic of the generated code:
f16/bf16 in f32, `max`/`min` ignoring NaN like `fmaxf`, weak literals in their context's type.
Loads of lanes that are switched off (the untaken side of a `select`, a guard) are not made.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nfc.codegen.cuda.types import (
    BF16,
    F16,
    I1,
    I32,
    Types,
    compute_type,
    const_value,
    numpy_dtype,
    round_to,
)
from nfc.codegen.loops import Buffer, BufLoad, Clamp, Scope
from nfc.ir import Binary, Cast, Const, DType, Expr, Index, Select, Unary
from nfc.ops import find

Mask = np.ndarray | None
Fn = Callable[["Wave", Mask], Any]
#: Where the CUDA spelling differs from the interpreter's numpy semantics (fmaxf ignores NaN).
FLOAT_OVERRIDES: dict[str, Callable[..., Any]] = {"max": np.fmax, "min": np.fmin}


class SimError(RuntimeError):
    """The simulated kernel did something a GPU would not do correctly."""


class BoundsError(SimError):
    """An index out of a buffer's range."""


class RaceError(SimError):
    """Two threads touch one address with no barrier between them."""


class DivergenceError(SimError):
    """A barrier, shuffle or fragment operation not reached by all threads that must."""


@dataclass
class Track:
    """Who touched each address of a shared buffer since the last barrier of its block."""

    writer: np.ndarray
    """[blocks, size] thread that last wrote, -1: none since the barrier."""
    wepoch: np.ndarray
    """The writer's warp epoch (`__syncwarp` count) at the write."""
    rlo: np.ndarray
    """Smallest and largest reader threads since the barrier (-1: none)."""
    rhi: np.ndarray
    repoch: np.ndarray

    @staticmethod
    def new(blocks: int, size: int) -> Track:
        """No accesses yet."""
        full = np.full((blocks, size), -1, np.int32)
        return Track(full, np.zeros_like(full), full.copy(), full.copy(), np.zeros_like(full))

    def reset(self, blocks: np.ndarray) -> None:
        """A barrier in `blocks` (wave-local indices)."""
        for a in (self.writer, self.rlo, self.rhi):
            a[blocks] = -1


@dataclass
class Wave:
    """The blocks being simulated together and their memory."""

    kernel: str
    where: str
    blocks: np.ndarray
    """Block indices of the wave."""
    threads: int
    env: dict[str, Any] = field(default_factory=dict)
    local: dict[str, np.ndarray] = field(default_factory=dict)
    """Thread-private buffers: [lanes, size]; shared buffers: [blocks, size]."""
    tracks: dict[str, Track] = field(default_factory=dict)
    frags: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self) -> None:
        n = len(self.blocks)
        self.lanes = n * self.threads
        self.lane = np.arange(self.lanes)
        self.lblock = self.lane // self.threads
        self.thread = (self.lane % self.threads).astype(np.int32)
        self.block = self.blocks[self.lblock].astype(np.int32)
        self.gthread = self.block.astype(np.int64) * self.threads + self.thread
        self.warps = max(1, self.lanes // 32)
        self.wepoch = np.zeros(self.warps, np.int64)
        self.all = np.ones(self.lanes, bool)

    def who(self, lane: int) -> str:
        """`thread t of block b`."""
        return f"thread {int(self.thread[lane])} of block {int(self.block[lane])}"


@dataclass
class Globals:
    """The kernel's global buffers (flat arrays) and, per buffer written, each address's
    writer (global thread id, -1: none) in this kernel."""

    arrays: dict[str, np.ndarray]
    writers: dict[str, np.ndarray] = field(default_factory=dict)


def active(w: Wave, m: Mask) -> np.ndarray:
    """The mask as a bool array (do not modify it)."""
    return w.all if m is None else m


def lanes_of(x: Any, w: Wave) -> np.ndarray:
    """`x` as one value per lane."""
    return np.broadcast_to(np.asarray(x), (w.lanes,))


def to_storage(x: Any, dt: DType) -> Any:
    """Compute-type values converted to how `dt` is held in memory (bf16: rounded f32)."""
    if dt is BF16:
        return round_to(x, "bf16")
    return np.asarray(x).astype(numpy_dtype(dt))


def storage_dtype(dt: DType) -> np.dtype:
    """The numpy dtype of a buffer of `dt`."""
    return numpy_dtype(dt)


def fill_value(dt: DType) -> Any:
    """What uninitialised memory holds in the simulator: NaN, or a conspicuous integer."""
    if dt.is_float:
        return np.nan
    return False if dt is I1 else -123456789


class ExprCompiler:
    """Compiles the expressions of one kernel."""

    def __init__(self, glob: Globals) -> None:
        self.types = Types()
        self.glob = glob

    def expr(self, e: Expr, want: DType | None) -> Fn:
        """A closure computing `e` in compute type `want` (its own type when None)."""
        t = self.types.result(e, want)
        fn = self._node(e, want, t)
        if want is not None and want != t:
            nd = numpy_dtype(want)

            def conv(w: Wave, m: Mask) -> Any:
                return np.asarray(fn(w, m)).astype(nd)
            return conv
        return fn

    def _node(self, e: Expr, want: DType | None, t: DType) -> Fn:
        nd = numpy_dtype(t)
        if isinstance(e, Const):
            val = nd.type(const_value(e, t))
            return lambda w, m: val
        if isinstance(e, Index):
            name = e.name
            if t is I32:
                return lambda w, m: w.env[name]
            return lambda w, m: np.asarray(w.env[name]).astype(nd)
        if isinstance(e, BufLoad):
            return self.load(e.buffer, [self.expr(i, I32) for i in e.indices])
        if isinstance(e, Clamp):
            x, hi = self.expr(e.x, t), nd.type(e.hi)
            return lambda w, m: np.minimum(x(w, m), hi)
        if isinstance(e, Cast):
            x = self.expr(e.x, None)
            if e.dtype in (F16, BF16):
                prec = e.dtype.value
                return lambda w, m: round_to(x(w, m), prec)

            def cast(w: Wave, m: Mask) -> Any:
                return np.asarray(x(w, m)).astype(nd)
            return cast
        opt = self.types.operand(e, want)
        if isinstance(e, Select):
            return self._select(e, opt)
        if isinstance(e, Unary):
            x = self.expr(e.x, opt)
            return (lambda w, m: np.negative(x(w, m))) if e.op == "neg" else \
                (lambda w, m: np.logical_not(x(w, m)))
        if isinstance(e, Binary) and e.op in ("and", "or"):
            return self._logical(e)
        row = find(e)
        if row is None or row.numpy is None:
            raise SimError(f"the simulator cannot evaluate {e!r}")
        fn = FLOAT_OVERRIDES.get(row.name, row.numpy) if opt.is_float else row.numpy
        args = [self.expr(a, opt) for a in e.children()]

        if len(args) == 1:
            (a0,) = args
            return lambda w, m: np.asarray(fn(a0(w, m))).astype(nd, copy=False)
        if len(args) == 2:
            a0, a1 = args
            return lambda w, m: np.asarray(fn(a0(w, m), a1(w, m))).astype(nd, copy=False)
        return lambda w, m: np.asarray(fn(*(a(w, m) for a in args))).astype(nd, copy=False)

    def _select(self, e: Select, opt: DType) -> Fn:
        cond, a, b = self.expr(e.cond, I1), self.expr(e.a, opt), self.expr(e.b, opt)
        zero = np.zeros((), numpy_dtype(opt))

        def sel(w: Wave, m: Mask) -> Any:
            c = cond(w, m)
            if np.ndim(c) == 0:
                return a(w, m) if c else b(w, m)
            act = active(w, m)
            ma, mb = act & c, act & ~c
            va = a(w, ma) if ma.any() else zero
            vb = b(w, mb) if mb.any() else zero
            return np.where(c, va, vb)
        return sel

    def _logical(self, e: Binary) -> Fn:
        """`&&` and `||` evaluate their right side only where C would."""
        a, b = self.expr(e.a, I1), self.expr(e.b, I1)
        is_and = e.op == "and"

        def logic(w: Wave, m: Mask) -> Any:
            x = a(w, m)
            if np.ndim(x) == 0:
                if bool(x) != is_and:
                    return x
                return b(w, m)
            act = active(w, m)
            rest = act & (x if is_and else ~x)
            if not rest.any():
                return x
            y = lanes_of(b(w, rest), w)
            return (x & y) if is_and else (x | y)
        return logic

    # -- memory ------------------------------------------------------------------------------

    def offset(self, b: Buffer, idx: list[Fn], what: str) -> Fn:
        """A closure giving the flat offset of `b[idx]` in the active lanes (0 elsewhere);
        BoundsError when an active lane's index leaves its dimension."""
        dims = list(zip(idx, b.shape, b.strides, strict=True))

        def offset(w: Wave, m: Mask) -> Any:
            off: Any = 0
            for n, (fn, size, stride) in enumerate(dims):
                x = fn(w, m)
                if np.ndim(x) == 0:
                    if not 0 <= x < size:
                        act = active(w, m)
                        raise self._bounds(b, n, int(x), w, int(np.argmax(act)), what)
                    off = off + int(x) * stride
                    continue
                act = active(w, m)
                bad = ((x < 0) | (x >= size)) & act
                if bad.any():
                    lane = int(np.argmax(bad))
                    raise self._bounds(b, n, int(x[lane]), w, lane, what)
                if m is not None:
                    x = np.where(m, x, 0)
                off = off + x.astype(np.int64) * stride
            return off
        return offset

    def _bounds(self, b: Buffer, dim: int, value: int, w: Wave, lane: int,
                what: str) -> BoundsError:
        return BoundsError(
            f"kernel '{w.kernel}'{w.where}: {what} of {b.scope.value} buffer '{b.name}' "
            f"{list(b.shape)} with index {value} in dimension {dim} by {w.who(lane)}")

    def load(self, b: Buffer, idx: list[Fn]) -> Fn:
        """A closure reading `b[idx]`, converted to the buffer's compute type."""
        ct = numpy_dtype(compute_type(b.dtype))
        conv = b.dtype in (F16, BF16)
        offset = self.offset(b, idx, "read")

        def read(w: Wave, m: Mask) -> Any:
            off = offset(w, m)
            if b.scope is Scope.GLOBAL:
                val = self.glob.arrays[b.name][off]
                writers = self.glob.writers.get(b.name)
                if writers is not None:
                    check_global_read(w, m, b, writers, off)
            elif b.scope is Scope.SHARED:
                check_shared_read(w, m, b, off)
                val = w.local[b.name][w.lblock, off]
            else:
                data = w.local[b.name]
                val = data[:, off] if np.ndim(off) == 0 else data[w.lane, off]
            return val.astype(ct) if conv else val
        return read


def check_global_read(w: Wave, m: Mask, b: Buffer, writers: np.ndarray, off: Any) -> None:
    """A read of a global address another thread wrote in this kernel is a race."""
    act = active(w, m)
    who = writers[lanes_of(off, w)]
    bad = act & (who >= 0) & (who != w.gthread)
    if bad.any():
        lane = int(np.argmax(bad))
        raise RaceError(f"kernel '{w.kernel}'{w.where}: {w.who(lane)} reads element "
                        f"{int(lanes_of(off, w)[lane])} of global buffer '{b.name}', which "
                        f"global thread {int(who[lane])} wrote in the same kernel")


def check_shared_read(w: Wave, m: Mask, b: Buffer, off: Any) -> None:
    """Record reads of shared memory; a read of what another thread wrote since the last
    barrier is a race."""
    tr = w.tracks[b.name]
    lanes = w.lane if m is None else np.nonzero(m)[0]
    addr = lanes_of(off, w)[lanes]
    key = w.lblock[lanes] * b.size + addr
    me = w.thread[lanes]
    writer = tr.writer.reshape(-1)[key]
    bad = _conflict_at(w, lanes, writer, tr.wepoch.reshape(-1)[key], me)
    if bad.any():
        n = int(np.argmax(bad))
        raise RaceError(
            f"kernel '{w.kernel}'{w.where}: shared-memory race on '{b.name}' element "
            f"{int(addr[n])} of block {int(w.block[lanes[n]])}: thread {int(me[n])} reads what "
            f"thread {int(writer[n])} wrote, with no barrier between")
    rlo, rhi = tr.rlo.reshape(-1), tr.rhi.reshape(-1)
    lo = rlo[key]
    rlo[key] = np.where(lo < 0, me, np.minimum(lo, me))
    rhi[key] = np.maximum(rhi[key], me)
    tr.repoch.reshape(-1)[key] = w.wepoch[lanes // 32]


def _conflict_at(w: Wave, lanes: np.ndarray, other: np.ndarray, epoch: np.ndarray,
                 me: np.ndarray) -> np.ndarray:
    """Accesses by thread `other` (-1: none) that no barrier separates from thread `me` (the
    thread of `lanes`): another thread, in another warp or in the same warp with no
    `__syncwarp` since."""
    hit = (other >= 0) & (other != me)
    if not hit.any():
        return hit
    other_warp = (w.lblock[lanes] * w.threads + np.maximum(other, 0)) // 32
    synced = (other_warp == lanes // 32) & (epoch != w.wepoch[other_warp])
    return hit & ~synced


def check_shared_write(w: Wave, lanes: np.ndarray, b: Buffer, addr: np.ndarray,
                       me: np.ndarray) -> None:
    """Record writes of shared memory by `lanes` (each with its thread id `me`): two threads
    writing one address, or a write of what another thread read, since the last barrier is a
    race."""
    tr = w.tracks[b.name]
    key = w.lblock[lanes] * b.size + addr
    if len(key) > 1:
        srt = np.sort(key)
        dup = srt[1:] == srt[:-1]
        if dup.any():
            k = srt[1:][np.argmax(dup)]
            pair = np.nonzero(key == k)[0][:2]
            raise RaceError(
                f"kernel '{w.kernel}'{w.where}: shared-memory race on '{b.name}' element "
                f"{int(addr[pair[0]])} of block {int(w.block[lanes[pair[0]]])}: threads "
                f"{int(me[pair[0]])} and {int(me[pair[1]])} write it in the same statement")
    writer = tr.writer.reshape(-1)
    old = writer[key]
    bad = _conflict_at(w, lanes, old, tr.wepoch.reshape(-1)[key], me)
    kind = "writes what thread {o} wrote"
    if not bad.any():
        lo, hi = tr.rlo.reshape(-1)[key], tr.rhi.reshape(-1)[key]
        other = np.where(lo != me, lo, np.where(hi != me, hi, -1))
        bad = _conflict_at(w, lanes, other, tr.repoch.reshape(-1)[key], me)
        old = other
        kind = "writes what thread {o} read"
    if bad.any():
        n = int(np.argmax(bad))
        raise RaceError(
            f"kernel '{w.kernel}'{w.where}: shared-memory race on '{b.name}' element "
            f"{int(addr[n])} of block {int(w.block[lanes[n]])}: thread {int(me[n])} "
            + kind.format(o=int(old[n])) + ", with no barrier between")
    writer[key] = me
    tr.wepoch.reshape(-1)[key] = w.wepoch[lanes // 32]


__all__ = ["BoundsError", "DivergenceError", "ExprCompiler", "Globals", "RaceError",
           "SimError", "Track", "Wave", "active", "check_shared_write", "fill_value",
           "lanes_of", "storage_dtype", "to_storage"]
