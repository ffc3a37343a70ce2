"""GPU schedule spaces: the default rule per kind of compute and the enumerable space of each.

`classify(op)`: `gemm` for a contraction (`nfc.contraction.match_contraction`, the same matcher
the CPU backend uses), `reduce` for other reductions, `elementwise` otherwise (gathers
included). `default_gpu_schedule(op)` is the heuristic choice; `gpu_space(op)` gives a
`GpuSpace` with `params` (name -> candidates), `default()`, `is_valid(cfg)`,
`to_schedule(cfg)` and `candidates()` (every valid schedule, deduplicated), the interface of
the CPU's schedule spaces. Nothing here is measured yet: the defaults follow the usual CUDA
practice (256-thread blocks, 64x64 GEMM tiles with 4x4 register tiles or 2x2 warps of 2x2
fragments) and wait for a tuner run on a device.

Lossy precisions are never chosen silently: f32 contractions default to `fma` and their space
holds only `fma` unless `precisions` admits `tf32`, `f16` or `bf16`. The GEMM space also holds
`double_buffer`, `vector_width` and `swap` (nfc.codegen.cuda.gemm_tiles) and `pack`
(nfc.codegen.cuda.gemm_pack); the default rule turns on only `swap`, where the operands'
layouts favour the transposed product (`prefer_swap`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from nfc.codegen.cuda.schedule import (
    WMMA_SHAPE_CHOICES,
    ElementwiseSchedule,
    GemmSchedule,
    GpuSchedule,
    ReduceSchedule,
    wmma_mnk,
)
from nfc.contraction import match_contraction
from nfc.ir import ComputeOp, DType


def classify(op: ComputeOp) -> str:
    """`gemm`, `reduce` or `elementwise`."""
    if match_contraction(op) is not None:
        return "gemm"
    return "reduce" if op.reduce is not None else "elementwise"


def _pow2_at_least(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _threads_for(n: int, most: int = 256) -> int:
    """A block of `most` threads, fewer (a multiple of 32) when there is less work."""
    return min(most, max(32, -(-n // 32) * 32))


def _gemm_sizes(op: ComputeOp) -> tuple[int, int, int]:
    cont = match_contraction(op)
    assert cont is not None
    ext = {a.name: a.extent for a in op.all_axes}
    return (math.prod(ext[a] for a in cont.i), math.prod(ext[a] for a in cont.j),
            math.prod(ext[a] for a in cont.k))


def default_precision(dtype: DType) -> str:
    """f16/bf16 contractions on Tensor Cores, everything else on CUDA cores (exact)."""
    return {DType.F16: "f16", DType.BF16: "bf16"}.get(dtype, "fma")


def default_gpu_schedule(op: ComputeOp, precision: str | None = None) -> GpuSchedule:
    """The heuristic schedule of `op` (see the module docstring); for a contraction,
    `precision` (default: the exact one of its dtype, `default_precision`) picks the inner
    product, so `"tf32"`, `"f16"` or `"bf16"` asks for the Tensor Core tiles explicitly."""
    kind = classify(op)
    n_out = op.result.type.size
    if kind == "elementwise":
        return ElementwiseSchedule(threads=_threads_for(n_out),
                                   items=4 if n_out >= 1 << 22 else 1)
    if kind == "reduce":
        r = math.prod(a.extent for a in op.raxes)
        if r <= 32:
            return ReduceSchedule("thread", _threads_for(n_out))
        if n_out >= 2048 or r <= 2048:
            return ReduceSchedule("warp", _threads_for(32 * n_out))
        return ReduceSchedule("block", 1024 if r >= 1 << 16 else 256, True)
    from nfc.codegen.cuda.gemm_tiles import prefer_swap

    m, n, k = _gemm_sizes(op)
    swap = prefer_swap(op)
    if swap:
        m, n = n, m
    precision = precision or default_precision(op.result.dtype)
    if precision == "fma":
        bm, bn = (min(64, max(16, _pow2_at_least(x))) for x in (m, n))
        return GemmSchedule("fma", bm, bn, min(16, _pow2_at_least(k)),
                            4 if bm >= 32 else 2, 4 if bn >= 32 else 2, swap=swap)
    (wm, fm), (wn, fn) = (((1, 1) if x <= 16 else (2, 1) if x <= 32 else (2, 2))
                          for x in (m, n))
    step = 8 if precision == "tf32" else 16
    bk = 2 * step if k >= 2 * step else step
    return GemmSchedule(precision, 16 * wm * fm, 16 * wn * fn, bk, warps_m=wm, warps_n=wn,
                        swap=swap)


#: Candidate values of the GEMM template's parameters.
GEMM_PARAMS: dict[str, tuple[Any, ...]] = {
    "block_m": (16, 32, 64, 128), "block_n": (16, 32, 64, 128), "block_k": (8, 16, 32, 64),
    "thread_m": (1, 2, 4, 8), "thread_n": (1, 2, 4, 8),
    "warps_m": (1, 2, 4), "warps_n": (1, 2, 4), "frag_m": (1, 2, 4), "frag_n": (1, 2, 4),
    "double_buffer": (False, True), "vector_width": (1, 2, 4), "swap": (False, True),
    "pack": ("none", "a", "b", "ab"), "wmma_shape": ("", "32x8x16", "8x32x16"),
}
#: The knobs both GEMM paths have (nfc.codegen.cuda.gemm_tiles, gemm_pack); their first
#: values are the plain kernel.
GEMM_KNOBS = ("double_buffer", "vector_width", "swap", "pack")
FMA_KEYS = ("block_m", "block_n", "block_k", "thread_m", "thread_n", *GEMM_KNOBS)
WMMA_KEYS = ("warps_m", "warps_n", "frag_m", "frag_n", "block_k", *GEMM_KNOBS, "wmma_shape")
ELEMENTWISE_PARAMS: dict[str, tuple[int, ...]] = {"threads": (64, 128, 256, 512, 1024),
                                                  "items": (1, 2, 4, 8)}
REDUCE_PARAMS: dict[str, tuple[Any, ...]] = {"strategy": ("thread", "warp", "block"),
                                             "threads": (64, 128, 256, 512, 1024),
                                             "shuffle": (True, False)}


@dataclass
class GpuSpace:
    """The schedule space of one compute (see the module docstring)."""

    op: ComputeOp
    kind: str
    params: dict[str, tuple[Any, ...]]

    def default(self) -> dict[str, Any]:
        """The parameters of `default_gpu_schedule`."""
        return to_params(default_gpu_schedule(self.op))

    def to_schedule(self, cfg: dict[str, Any]) -> GpuSchedule:
        """The schedule of a parameter dict."""
        if self.kind == "elementwise":
            return ElementwiseSchedule(int(cfg["threads"]), int(cfg["items"]))
        if self.kind == "reduce":
            return ReduceSchedule(str(cfg["strategy"]), int(cfg["threads"]),
                                  bool(cfg["shuffle"]))
        p = str(cfg["precision"])
        knobs = {"double_buffer": bool(cfg.get("double_buffer", False)),
                 "vector_width": int(cfg.get("vector_width", 1)),
                 "swap": bool(cfg.get("swap", False)), "pack": str(cfg.get("pack", "none"))}
        if p == "fma":
            return GemmSchedule(p, int(cfg["block_m"]), int(cfg["block_n"]),
                                int(cfg["block_k"]), int(cfg["thread_m"]),
                                int(cfg["thread_n"]), **knobs)
        wm, wn = int(cfg["warps_m"]), int(cfg["warps_n"])
        shape = str(cfg.get("wmma_shape", ""))
        if shape and shape not in WMMA_SHAPE_CHOICES.get(p, ()):
            return GemmSchedule(p, warps_m=wm, warps_n=wn, wmma_shape=shape, **knobs)
        fr, fc, _ = wmma_mnk(p, shape)
        return GemmSchedule(p, fr * wm * int(cfg["frag_m"]), fc * wn * int(cfg["frag_n"]),
                            int(cfg["block_k"]), warps_m=wm, warps_n=wn, wmma_shape=shape,
                            **knobs)

    def problem(self, cfg: dict[str, Any]) -> str | None:
        """Why `cfg` is not a schedule of this compute (None: it is)."""
        s = self.to_schedule(cfg)
        why = s.problem()
        if why is not None:
            return why
        if isinstance(s, GemmSchedule):
            from nfc.codegen.cuda.gemm import STATIC_SHARED_LIMIT, shared_bytes

            nbytes = shared_bytes(s, self.op.result.dtype)
            if nbytes > STATIC_SHARED_LIMIT:
                return f"{nbytes} bytes of shared memory (static limit {STATIC_SHARED_LIMIT})"
            if s.wmma and not self.op.result.dtype.is_float:
                return "tensor cores need float operands"
            if s.vector_width > 1:
                from nfc.codegen.cuda.gemm_tiles import vector_problem

                why = vector_problem(self.op, s)
                if why is not None:
                    return f"vector width {s.vector_width}: {why}"
            if s.packed:
                from nfc.codegen.cuda.gemm_pack import pack_problem

                why = pack_problem(self.op, s)
                if why is not None:
                    return f"pack '{s.pack}': {why}"
        return None

    def is_valid(self, cfg: dict[str, Any]) -> bool:
        """Whether `cfg` gives a schedule of this compute."""
        return self.problem(cfg) is None

    def candidates(self) -> Iterator[GpuSchedule]:
        """Every valid schedule of the space, each once."""
        seen: set[GpuSchedule] = set()
        groups = [list(self.params)]
        if self.kind == "gemm":
            groups = [["precision", *(FMA_KEYS if p == "fma" else WMMA_KEYS)]
                      for p in self.params["precision"]]
        for n, keys in enumerate(groups):
            choices = [self.params[k] if k != "precision" or self.kind != "gemm"
                       else (self.params[k][n],) for k in keys]
            for values in itertools.product(*choices):
                cfg = dict(zip(keys, values, strict=True))
                if not self.is_valid(cfg):
                    continue
                s = self.to_schedule(cfg)
                if s not in seen:
                    seen.add(s)
                    yield s


def to_params(s: GpuSchedule) -> dict[str, Any]:
    """The space parameters of a schedule."""
    if isinstance(s, GemmSchedule):
        d: dict[str, Any] = {"precision": s.precision, "block_k": s.block_k}
        knobs = {k: getattr(s, k) for k in GEMM_KNOBS}
        if s.wmma:
            return d | {"warps_m": s.warps_m, "warps_n": s.warps_n, "frag_m": s.frag_m,
                        "frag_n": s.frag_n} | knobs | {"wmma_shape": s.wmma_shape}
        return d | {"block_m": s.block_m, "block_n": s.block_n, "thread_m": s.thread_m,
                    "thread_n": s.thread_n} | knobs
    return {k: x for k, x in s.to_dict().items() if k not in ("kind", "version")}


def gpu_space(op: ComputeOp, precisions: Sequence[str] | None = None) -> GpuSpace:
    """The schedule space of `op`; for a contraction, `precisions` (default: the exact one of
    its dtype) lists the inner products to try."""
    kind = classify(op)
    if kind == "elementwise":
        return GpuSpace(op, kind, dict(ELEMENTWISE_PARAMS))
    if kind == "reduce":
        return GpuSpace(op, kind, dict(REDUCE_PARAMS))
    precs = tuple(precisions or (default_precision(op.result.dtype),))
    params: dict[str, tuple[Any, ...]] = {"precision": precs, **GEMM_PARAMS}
    return GpuSpace(op, kind, params)
