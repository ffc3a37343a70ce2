"""The collective the native step calls at its `nf.allreduce` ops.

A library built with the `data-parallel` pass exports `nfc_set_collective`; `Collective`
registers a ctypes callback there. The step calls it twice per bucket (nfc.codegen.artifact
.collective): at the `nf.allreduce` op (phase 0, start) with the bucket's result and operand
buffers, and before the first kernel that reads a result (phase 1, wait).

- start packs the operands into the bucket's flat buffer (adding the error-feedback residual
  and rounding to fp16/bf16 when the bucket is compressed) and hands it to the communication
  thread, which runs the blocking MPI collective while the step goes on with the rest of the
  backward (mpi4py releases the GIL in MPI calls, the step runs without it): the overlap of
  PyTorch DDP's buckets. With `overlap=False` the collective runs right there instead.
- wait blocks until the bucket is reduced and writes the mean into the result buffers.

Uncompressed buckets are summed with `MPI_Allreduce` in f32. Compressed ones are 16-bit codes
(numpy casts; bf16 rounds to nearest even), all-gathered and summed on every rank in rank
order in f32 (MPI has no portable 16-bit float sum); the rounding error of each rank's
gradient is kept and added to its next gradient (error feedback), so nothing is lost over
the steps, only delayed.
"""

from __future__ import annotations

import ctypes
import queue
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from nfc.runtime.distributed.comm import Comm, DistributedError

HOOK = ctypes.CFUNCTYPE(None, ctypes.c_int64, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p))
_DTYPES = {"f32": np.float32, "f64": np.float64}


def to_bf16(x: np.ndarray) -> np.ndarray:
    """The bf16 codes (uint16) of f32 `x`, rounded to nearest even."""
    u = x.astype(np.float32, copy=False).view(np.uint32)
    return ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))
            >> np.uint32(16)).astype(np.uint16)


def from_bf16(c: np.ndarray) -> np.ndarray:
    """f32 values of bf16 codes."""
    return (c.astype(np.uint32) << np.uint32(16)).view(np.float32)


def encode(x: np.ndarray, kind: str) -> np.ndarray:
    """16-bit codes of `x` (fp16 or bf16)."""
    return x.astype(np.float16).view(np.uint16) if kind == "fp16" else to_bf16(x)


def decode(c: np.ndarray, kind: str) -> np.ndarray:
    """f32 values of 16-bit codes."""
    return c.view(np.float16).astype(np.float32) if kind == "fp16" else from_bf16(c)


@dataclass
class _Bucket:
    spec: Mapping[str, Any]
    sizes: list[int]
    shapes: list[tuple[int, ...]]
    dtype: Any
    flat: np.ndarray
    compress: str
    residual: np.ndarray | None
    codes: np.ndarray | None
    gathered: np.ndarray | None
    done: threading.Event


class Collective:
    """The all-reduce of one function's `nf.allreduce` buckets over `comm` (see the module
    doc); `close()` unregisters it and stops the communication thread."""

    def __init__(self, model: Any, comm: Comm, function: str = "train_step", *,
                 overlap: bool = True, compress: str | None = None) -> None:
        self.comm = comm
        self.overlap = overlap
        self.error: BaseException | None = None
        specs: Sequence[Mapping[str, Any]] = \
            model.metadata["functions"][function].get("collectives", [])
        if not specs:
            raise DistributedError(f"@{function} has no nf.allreduce: build it with the "
                                   "data-parallel pass")
        self.buckets = [self._bucket(s, compress) for s in specs]
        self.seconds = 0.0
        """Time the step spent waiting for collectives (phase 1), in seconds."""
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="nfc-allreduce", daemon=True)
        if overlap:
            self._thread.start()
        self._hook = HOOK(self._call)  # kept alive as long as the library may call it
        self._set = model.symbol("nfc_set_collective")
        self._set.argtypes = [ctypes.c_void_p]
        self._set(ctypes.cast(self._hook, ctypes.c_void_p))

    def _bucket(self, spec: Mapping[str, Any], compress: str | None) -> _Bucket:
        kinds = {t["dtype"] for t in spec["tensors"]}
        if len(kinds) != 1 or next(iter(kinds)) not in _DTYPES:
            raise DistributedError(f"an nf.allreduce bucket of {sorted(kinds)}: one float "
                                   "dtype (f32 or f64) per bucket")
        dtype = _DTYPES[next(iter(kinds))]
        shapes = [tuple(t["shape"]) for t in spec["tensors"]]
        sizes = [int(np.prod(s, dtype=np.int64)) for s in shapes]
        n = sum(sizes)
        kind = compress if compress is not None else str(spec.get("compress", "none"))
        if spec.get("what", "gradients") != "gradients":
            kind = "none"  # batch and running statistics are averaged exactly
        if kind != "none" and dtype is not np.float32:
            raise DistributedError(f"{kind} compression of {next(iter(kinds))} gradients")
        comp = kind != "none"
        return _Bucket(spec, sizes, shapes, dtype, np.zeros(n, dtype), kind,
                       np.zeros(n, dtype) if comp else None,
                       np.zeros(n, np.uint16) if comp else None,
                       np.zeros((self.comm.size, n), np.uint16) if comp else None,
                       threading.Event())

    def _views(self, b: _Bucket, ptrs: Any, first: int) -> list[np.ndarray]:
        out = []
        ctype = ctypes.c_float if b.dtype is np.float32 else ctypes.c_double
        for k, size in enumerate(b.sizes):
            addr = ptrs[first + k]
            arr = np.ctypeslib.as_array((ctype * size).from_address(addr))
            out.append(arr)
        return out

    def _call(self, cid: int, phase: int, ptrs: Any) -> None:
        try:
            b = self.buckets[cid]
            n = len(b.sizes)
            if phase == 0:
                at = 0
                for src, size in zip(self._views(b, ptrs, n), b.sizes, strict=True):
                    b.flat[at:at + size] = src
                    at += size
                b.done.clear()
                if self.overlap:
                    self._queue.put(cid)
                else:
                    self._reduce(b)
            else:
                import time

                t0 = time.perf_counter()
                b.done.wait()
                self.seconds += time.perf_counter() - t0
                at = 0
                for dst, size in zip(self._views(b, ptrs, 0), b.sizes, strict=True):
                    dst[:] = b.flat[at:at + size]
                    at += size
        except BaseException as exc:  # noqa: BLE001 - cannot propagate through C; see check()
            if self.error is None:
                self.error = exc
            for bk in self.buckets:
                bk.done.set()

    def _reduce(self, b: _Bucket) -> None:
        try:
            if b.residual is None:
                self.comm.allreduce_sum(b.flat)
            else:
                assert b.codes is not None and b.gathered is not None
                x = b.flat + b.residual
                b.codes[:] = encode(x, b.compress)
                np.subtract(x, decode(b.codes, b.compress), out=b.residual)
                self.comm.allgather(b.codes, b.gathered)
                b.flat[:] = 0
                for r in range(self.comm.size):  # rank order: the same sum on every rank
                    b.flat += decode(b.gathered[r], b.compress)
            b.flat *= b.dtype(1.0 / self.comm.size)
        except BaseException as exc:  # noqa: BLE001
            if self.error is None:
                self.error = exc
        finally:
            b.done.set()

    def _serve(self) -> None:
        while True:
            cid = self._queue.get()
            if cid is None:
                return
            self._reduce(self.buckets[cid])

    def check(self) -> None:
        """Raise what went wrong in a collective of the latest step."""
        if self.error is not None:
            exc, self.error = self.error, None
            raise DistributedError(f"the gradient all-reduce failed: {exc}") from exc

    def close(self) -> None:
        self._set(None)
        if self.overlap and self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
