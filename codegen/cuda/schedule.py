"""GPU schedules as data: how a compute is mapped onto blocks, warps and threads.

Three templates, one per kind of compute (`nfc.codegen.cuda.space.classify`), each a frozen
dataclass with `to_dict`/`from_dict` (checked against `GPU_SCHEDULE_VERSION`) so the tuner and
the tuning cache can store and replay it, like the CPU's `nfc.codegen.schedule`:

- `ElementwiseSchedule` (no reduction): the output elements, flattened, are bound to
  `blockIdx.x * threads + threadIdx.x`; each thread does `items` of them, `grid * threads`
  apart (coalesced), and a guard drops the tail.
- `ReduceSchedule` (a reduction that is not a contraction): `strategy` `thread` (one output per
  thread, a serial loop over the reduction axes), `warp` (one output per warp: the lanes stride
  over the flattened reduction, then butterfly `__shfl_xor_sync` steps) or `block` (one output
  per block: the threads stride, then a tree in shared memory with barriers, finished by warp
  shuffles when `shuffle`).
- `GemmSchedule` (a contraction, `nfc.contraction`): a block computes a `block_m x block_n`
  tile of each GEMM of the batch, staging `block_m x block_k` of A and `block_k x block_n` of B
  in shared memory per K step between two `__syncthreads()`. `precision` picks the inner
  product: `fma` (CUDA cores in the operands' type; each thread a `thread_m x thread_n`
  register tile) or WMMA on Tensor Cores with `f16`, `bf16` (m16n16k16) or `tf32` (m16n16k8)
  inputs and f32 accumulation (`warps_m x warps_n` warps, each `frag_m x frag_n` fragments;
  `wmma_shape` picks f16/bf16's other legal fragment shapes `32x8x16` and `8x32x16`).
  Knobs of both paths: `double_buffer` (two shared stages, the next tile's copy before the
  current tile's multiply), `vector_width` (2 or 4 elements per global load of the tiles) and
  `swap` (compute the transposed product) and `pack` (copy operand A, B or both into a
  tile-contiguous temporary before the GEMM, `nfc.codegen.cuda.gemm_pack`). Their defaults are
  the plain kernel, so records written before they existed read back as the same schedule.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar

#: Version of the GPU schedule format; records of another version are never reused.
GPU_SCHEDULE_VERSION = "nfc-cuda-sched-1"
#: The precisions of `GemmSchedule`: CUDA-core FMA, or Tensor Core inputs.
PRECISIONS = ("fma", "f16", "bf16", "tf32")
#: The strategies of `ReduceSchedule`.
STRATEGIES = ("thread", "warp", "block")
#: The vector widths of `GemmSchedule`'s global loads.
VECTOR_WIDTHS = (1, 2, 4)
#: The values of `GemmSchedule.pack`: which of the contraction's operands (A, B) are packed.
PACKS = ("none", "a", "b", "ab")
#: The legal values of `GemmSchedule.wmma_shape` per WMMA precision ("" is the first one).
WMMA_SHAPE_CHOICES = {"f16": ("16x16x16", "32x8x16", "8x32x16"),
                      "bf16": ("16x16x16", "32x8x16", "8x32x16"), "tf32": ("16x16x8",)}


def wmma_mnk(precision: str, shape: str = "") -> tuple[int, int, int]:
    """The `(m, n, k)` of a WMMA shape `MxNxK` ("": the precision's default, m16n16k*)."""
    m, n, k = (int(x) for x in (shape or WMMA_SHAPE_CHOICES[precision][0]).split("x"))
    return m, n, k


class GpuScheduleError(ValueError):
    """A GPU schedule that does not fit its compute or breaks a hardware rule."""


@dataclass(frozen=True)
class _Data:
    kind: ClassVar[str] = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict; `gpu_schedule_from_dict` inverts it."""
        return {"kind": self.kind, "version": GPU_SCHEDULE_VERSION, **asdict(self)}

    @classmethod
    def _from(cls, d: dict[str, Any]) -> Any:
        names = {f.name: f.type for f in fields(cls)}
        unknown = set(d) - set(names) - {"kind", "version"}
        if unknown:
            raise GpuScheduleError(f"unknown {cls.kind} schedule fields {sorted(unknown)}")
        return cls(**{k: (v if isinstance(v, bool | str) else int(v))
                      for k, v in d.items() if k in names})


@dataclass(frozen=True)
class ElementwiseSchedule(_Data):
    """Flattened outputs over `blockIdx.x x threadIdx.x`, `items` per thread."""

    kind: ClassVar[str] = "elementwise"
    threads: int = 256
    """Threads per block (a multiple of 32, at most 1024)."""
    items: int = 1
    """Outputs per thread, `grid * threads` apart (unrolled)."""

    def problem(self) -> str | None:
        """Why the schedule is invalid, None if it is fine."""
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            return f"threads {self.threads} is not a multiple of 32 in 32..1024"
        if not 1 <= self.items <= 16:
            return f"items {self.items} is not in 1..16"
        return None


@dataclass(frozen=True)
class ReduceSchedule(_Data):
    """One output per thread, per warp or per block (see the module docstring)."""

    kind: ClassVar[str] = "reduce"
    strategy: str = "thread"
    threads: int = 256
    """Threads per block (a multiple of 32, at most 1024; a power of two for `block`)."""
    shuffle: bool = True
    """`block`: finish the tree with warp shuffles instead of shared-memory steps."""

    def problem(self) -> str | None:
        """Why the schedule is invalid, None if it is fine."""
        if self.strategy not in STRATEGIES:
            return f"unknown reduction strategy '{self.strategy}'"
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            return f"threads {self.threads} is not a multiple of 32 in 32..1024"
        if self.strategy == "block" and self.threads & (self.threads - 1):
            return f"a block reduction needs a power-of-two thread count, not {self.threads}"
        return None


@dataclass(frozen=True)
class GemmSchedule(_Data):
    """A tiled GEMM (see the module docstring); `block_m`/`block_n` follow from the warps and
    fragments on the WMMA path and from the thread tile and thread count on the FMA path."""

    kind: ClassVar[str] = "gemm"
    precision: str = "fma"
    block_m: int = 64
    block_n: int = 64
    block_k: int = 16
    thread_m: int = 4
    """FMA: rows of the thread's register tile."""
    thread_n: int = 4
    """FMA: columns of the thread's register tile."""
    warps_m: int = 2
    """WMMA: warps along M."""
    warps_n: int = 2
    """WMMA: warps along N."""
    double_buffer: bool = False
    """Two shared-memory stages: the next K tile is copied while the current one is
    multiplied, one `__syncthreads()` per K step (`nfc.codegen.cuda.gemm_tiles`)."""
    vector_width: int = 1
    """Elements per global load of the operand tiles (1, 2 or 4; at most 16 bytes): each needs
    the operand's contiguous extent and the tile's extent along it to be multiples."""
    swap: bool = False
    """Compute the transposed product `C^T[j, i] = sum_k B[j, k] A[k, i]`: the operands swap
    roles (B's tile on the block's M side), the result is written transposed."""
    pack: str = "none"
    """Operands of the contraction (`a`, `b`, `ab`; `none`) a kernel of their own copies into
    a tile-contiguous global temporary, zero-padded, before the GEMM, which then loads them
    without guards (`nfc.codegen.cuda.gemm_pack`)."""
    wmma_shape: str = ""
    """WMMA: the fragment shape `MxNxK` (`WMMA_SHAPE_CHOICES`; "" the precision's first)."""

    @property
    def packed(self) -> tuple[str, ...]:
        """The packed operands, `a` and/or `b` (of the contraction, before any swap)."""
        return () if self.pack == "none" else tuple(self.pack)

    @property
    def wmma(self) -> bool:
        """Whether the Tensor Core path is used."""
        return self.precision != "fma"

    @property
    def mnk(self) -> tuple[int, int, int]:
        """The WMMA shape."""
        return wmma_mnk(self.precision, self.wmma_shape)

    @property
    def frag_m(self) -> int:
        """WMMA: accumulator fragments per warp along M."""
        return self.block_m // (self.mnk[0] * self.warps_m)

    @property
    def frag_n(self) -> int:
        """WMMA: accumulator fragments per warp along N."""
        return self.block_n // (self.mnk[1] * self.warps_n)

    @property
    def threads(self) -> int:
        """Threads per block."""
        if self.wmma:
            return 32 * self.warps_m * self.warps_n
        return (self.block_m // self.thread_m) * (self.block_n // self.thread_n)

    def problem(self) -> str | None:
        """Why the schedule is invalid (for any compute), None if it is fine."""
        if self.precision not in PRECISIONS:
            return f"unknown precision '{self.precision}' (one of {', '.join(PRECISIONS)})"
        if self.wmma:
            legal = WMMA_SHAPE_CHOICES[self.precision]
            if self.wmma_shape and self.wmma_shape not in legal:
                return (f"WMMA shape '{self.wmma_shape}' is not one of {', '.join(legal)} "
                        f"for {self.precision}")
            fm, fn, step = self.mnk
            if self.block_m % (fm * self.warps_m) or self.block_n % (fn * self.warps_n):
                return (f"block {self.block_m}x{self.block_n} is not a whole number of "
                        f"{fm}x{fn} fragments per warp over {self.warps_m}x{self.warps_n} warps")
            if not 1 <= self.frag_m * self.frag_n <= 4:
                return f"{self.frag_m}x{self.frag_n} fragments per warp (1 to 4 allowed)"
            if fn * 2 % 32 and self.warps_n * self.frag_n > 1:  # 16-bit inputs
                return (f"{self.wmma_shape} matrix_b fragments {fn} columns apart are not "
                        f"32-byte aligned in shared memory (one fragment column only)")
            if self.block_k % step or self.block_k > 64:
                return f"block_k {self.block_k} is not a multiple of {step} up to 64"
        else:
            if self.wmma_shape:
                return f"WMMA shape '{self.wmma_shape}' on the fma path (Tensor Cores only)"
            if self.block_m % self.thread_m or self.block_n % self.thread_n:
                return (f"thread tile {self.thread_m}x{self.thread_n} does not divide block "
                        f"{self.block_m}x{self.block_n}")
            if self.thread_m * self.thread_n > 64:
                return f"thread tile {self.thread_m}x{self.thread_n} has over 64 accumulators"
            if not 1 <= self.block_k <= 64:
                return f"block_k {self.block_k} is not in 1..64"
        if self.threads % 32 or not 32 <= self.threads <= 1024:
            return f"{self.threads} threads per block (a multiple of 32 in 32..1024 needed)"
        if self.vector_width not in VECTOR_WIDTHS:
            return f"vector width {self.vector_width} is not one of {VECTOR_WIDTHS}"
        if self.pack not in PACKS:
            return f"pack '{self.pack}' is not one of {', '.join(PACKS)}"
        return None


GpuSchedule = ElementwiseSchedule | ReduceSchedule | GemmSchedule
_KINDS: dict[str, type[_Data]] = {c.kind: c for c in (ElementwiseSchedule, ReduceSchedule,
                                                      GemmSchedule)}


def gpu_schedule_from_dict(d: dict[str, Any]) -> GpuSchedule:
    """The schedule `to_dict` produced; GpuScheduleError on another version or kind."""
    v = d.get("version", GPU_SCHEDULE_VERSION)
    if v != GPU_SCHEDULE_VERSION:
        raise GpuScheduleError(f"GPU schedule version '{v}' is not '{GPU_SCHEDULE_VERSION}'")
    cls = _KINDS.get(d.get("kind", ""))
    if cls is None:
        raise GpuScheduleError(f"unknown GPU schedule kind '{d.get('kind')}'")
    return cls._from(d)  # type: ignore[no-any-return]
