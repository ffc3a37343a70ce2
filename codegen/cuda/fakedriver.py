"""A stand-in for `cuda.bindings.driver` that runs kernels on the simulator.

    fake = FakeDriver(step.kernels)          # symbol -> GpuKernel (nfc.codegen.cuda.lower)
    dev = Device(driver=fake)                # nfc.codegen.cuda.driver: the real code path
    ...
    fake.counters["mem_alloc"], fake.counters["graph_launch"], fake.counters["h2d_bytes"]

It implements the subset of the driver API that `nfc.codegen.cuda.driver.Device` calls, with
the same signatures and the same returns (a tuple of a `CUresult` and the values), using the
real enum and handle types of `cuda.bindings.driver` when cuda-python is installed
(`CUresult`, `CUstream`, `CUdeviceptr`, ...; tiny stand-ins otherwise), handle numbers unique
in the process (a handle of another FakeDriver is `CUDA_ERROR_INVALID_HANDLE`). Device
memory is numpy byte arrays at fake addresses (fresh memory is 0xFF bytes: NaN in floats, so
a read of what no one wrote shows). `cuLaunchKernel` decodes its
`kernelParams` (the address of an array of pointers, each to one 8-byte argument, read with
ctypes), finds each pointer's allocation, and runs the kernel's loop IR with
`nfc.codegen.cuda.sim.simulate_kernel` on numpy views of that memory (shape and dtype from the
kernel's parameters; bf16, 16-bit on the device, is widened to the simulator's f32 and back).
The launch shape must be the kernel's (the simulator cannot run another one).

Like the driver: a pointer outside every allocation, or a buffer running past the end of
its allocation, is `CUDA_ERROR_ILLEGAL_ADDRESS`, sticky (every later call fails with it);
`cuStreamBeginCapture` records the launches, copies and memsets of the stream (and of the
streams that join it through events) instead of running them, copies with pageable host
memory during a capture are `CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED` (and invalidate it),
capturing the default stream is refused, and `cuGraphLaunch` replays the recorded work. The
simulator's own checks (races, out-of-bounds indices, unwritten outputs) raise its
`SimError`s. Work runs at the call, in program order; the streams' ordering contract (events,
`cuStreamWaitEvent`, synchronisation) is checked on the side by `nfc.codegen.cuda.fakestreams`
(which also holds the stream, event, graph and pinned-memory calls): two streams touching the
same bytes unordered raise its `StreamOrderError`. Events record the host's clock.

`counters` (a Counter) counts what tests assert: `mem_alloc`, `mem_free`, `launches` (kernels
run), `launches_captured`, `stream_capture`, `graph_instantiate`, `graph_launch`, `h2d_calls`,
`h2d_bytes`, `d2h_calls`, `d2h_bytes` (the pinned part also in `pinned_h2d_bytes`,
`pinned_d2h_bytes`), `d2d_bytes`, `memset_bytes`, `host_alloc`, `host_free`.
"""

from __future__ import annotations

import bisect
import ctypes
import enum
import itertools
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from nfc.codegen.cuda.fakestreams import StreamOrder, StreamsMixin
from nfc.codegen.cuda.lower import GpuKernel
from nfc.codegen.cuda.sim import simulate_kernel
from nfc.codegen.cuda.simexpr import storage_dtype
from nfc.codegen.cuda.types import round_to
from nfc.codegen.loops import Store

__all__ = ["FakeDriver"]

#: Handle numbers, unique in the process (a handle of one FakeDriver is none of another's).
_NUMBERS = itertools.count(1)


#: Added to pinned host addresses in the streams' access log (device addresses are fake).
HOST_TAG = 1 << 64

#: The handle type of each kind of driver object in cuda-python.
HANDLE_TYPES = {"context": "CUcontext", "module": "CUmodule", "function": "CUfunction",
                "stream": "CUstream", "event": "CUevent", "graph": "CUgraph",
                "graph_exec": "CUgraphExec"}


def _real() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError:
        return None
    return driver


def _enums() -> dict[str, Any]:
    """The enum types the driver code uses: cuda-python's, or stand-ins with the same names
    and values."""
    real = _real()
    if real is not None:
        return {n: getattr(real, n) for n in ("CUresult", "CUdevice_attribute",
                                               "CUstream_flags", "CUstreamCaptureMode",
                                               "CUevent_flags")}
    return {
        "CUresult": enum.IntEnum("CUresult", {
            "CUDA_SUCCESS": 0, "CUDA_ERROR_INVALID_VALUE": 1, "CUDA_ERROR_NO_DEVICE": 100,
            "CUDA_ERROR_INVALID_HANDLE": 400, "CUDA_ERROR_NOT_FOUND": 500,
            "CUDA_ERROR_ILLEGAL_ADDRESS": 700, "CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED": 900,
            "CUDA_ERROR_STREAM_CAPTURE_INVALIDATED": 901,
            "CUDA_ERROR_STREAM_CAPTURE_UNMATCHED": 903,
            "CUDA_ERROR_STREAM_CAPTURE_UNJOINED": 904,
            "CUDA_ERROR_STREAM_CAPTURE_ISOLATION": 905,
            "CUDA_ERROR_STREAM_CAPTURE_IMPLICIT": 906}),
        "CUdevice_attribute": enum.IntEnum("CUdevice_attribute", {
            "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR": 75,
            "CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR": 76}),
        "CUstream_flags": enum.IntEnum("CUstream_flags", {
            "CU_STREAM_DEFAULT": 0, "CU_STREAM_NON_BLOCKING": 1}),
        "CUstreamCaptureMode": enum.IntEnum("CUstreamCaptureMode", {
            "CU_STREAM_CAPTURE_MODE_GLOBAL": 0, "CU_STREAM_CAPTURE_MODE_THREAD_LOCAL": 1,
            "CU_STREAM_CAPTURE_MODE_RELAXED": 2}),
        "CUevent_flags": enum.IntEnum("CUevent_flags", {"CU_EVENT_DEFAULT": 0,
                                                        "CU_EVENT_DISABLE_TIMING": 2}),
    }


class _Fault(Exception):
    """A driver error inside the fake (its CUresult name)."""

    def __init__(self, name: str, detail: str = "") -> None:
        super().__init__(detail)
        self.name = name


@dataclass(eq=False)
class _Handle:
    """The state of a driver object (module, function, stream, event, graph, ...); callers
    hold cuda-python's handle type of the same number (`CUstream(n)`, ...), or this object
    itself without cuda-python."""

    kind: str
    number: int
    data: Any = None
    """A module's image, a function's kernel, a stream's capture (fakestreams.Capture, None
    when not capturing), a graph's work, an event's [time, clock, capture]."""

    def __int__(self) -> int:
        return self.number


@dataclass
class _Memory:
    base: list[int] = field(default_factory=list)
    """Allocation addresses, sorted."""
    blocks: dict[int, np.ndarray] = field(default_factory=dict)


class FakeDriver(StreamsMixin):
    """`cuda.bindings.driver` on the simulator (module doc)."""

    BASE = 0x7F00_0000_0000
    #: A gap between allocations, so that an address just past one is in none.
    GUARD = 1 << 20

    def __init__(self, kernels: Mapping[str, GpuKernel], *, arch: tuple[int, int] = (9, 0),
                 name: str = "nfc simulator (FakeDriver)", **sim_options: Any) -> None:
        for k, v in _enums().items():
            setattr(self, k, v)
        self.kernels = dict(kernels)
        self.arch = arch
        self.name = name
        self.sim_options = sim_options
        self.counters: Counter[str] = Counter()
        self.launched: list[str] = []
        """Symbols of the kernels run, in order."""
        self._mem = _Memory()
        self._next_address = self.BASE
        self._objects: dict[int, _Handle] = {}
        real = _real()
        self._types = {k: getattr(real, v) for k, v in HANDLE_TYPES.items()} if real else {}
        self._pointer = real.CUdeviceptr if real else int
        self._device = real.CUdevice if real else int
        self._sticky: str | None = None
        self.order = StreamOrder()
        self._pinned: dict[int, np.ndarray] = {}
        self._writes: dict[int, tuple[GpuKernel, frozenset[str]]] = {}

    # -- plumbing ------------------------------------------------------------------------------

    def _ok(self, *values: Any) -> tuple[Any, ...]:
        return (self.CUresult.CUDA_SUCCESS, *values)  # type: ignore[attr-defined]

    def _err(self, name: str, n_values: int = 0) -> tuple[Any, ...]:
        return (getattr(self.CUresult, name), *([None] * n_values))  # type: ignore[attr-defined]

    def _handle(self, kind: str, data: Any = None) -> Any:
        """A new object: the handle callers get (cuda-python's type when installed)."""
        n = next(_NUMBERS)
        h = self._objects[n] = _Handle(kind, n, data)
        return self._types[kind](h.number) if self._types else h

    def _obj(self, handle: Any, kind: str) -> _Handle | None:
        """The state behind a handle of `kind` (None: no such object, or 0)."""
        try:
            h = self._objects.get(int(handle)) if handle is not None else None
        except TypeError:
            return None
        return h if h is not None and h.kind == kind else None

    def _guard(self, n_values: int = 0) -> tuple[Any, ...] | None:
        return self._err(self._sticky, n_values) if self._sticky else None

    def _view(self, ptr: int, nbytes: int) -> np.ndarray:
        """The bytes [ptr, ptr + nbytes) of one allocation; _Fault when they are not."""
        ptr = int(ptr)
        k = bisect.bisect_right(self._mem.base, ptr) - 1
        if k >= 0:
            base = self._mem.base[k]
            block = self._mem.blocks[base]
            if ptr + nbytes <= base + block.size:
                return block[ptr - base:ptr - base + nbytes]
        raise _Fault("CUDA_ERROR_ILLEGAL_ADDRESS",
                     f"{nbytes} bytes at {ptr:#x} are not inside one allocation")

    def _run(self, op: tuple[Any, ...], stream: int) -> None:
        """Execute one unit of work (a launch, a copy, a memset) of `stream`, after checking
        its place in the streams' order (fakestreams.StreamOrder)."""
        kind = op[0]
        if kind == "launch":
            kernel, pointers = op[1], op[2]
            writes = self._written(kernel)
            self.order.access(stream, [(int(p), int(p) + b.nbytes, b.name in writes)
                                       for b, p in zip(kernel.func.params, pointers,
                                                       strict=True)],
                              f"kernel {kernel.func.name}")
            self._launch(kernel, pointers)
        elif kind == "d2d":
            _, dst, src, n = op
            self.order.access(stream, [(dst, dst + n, True), (src, src + n, False)],
                              "a device copy")
            self._view(dst, n)[:] = self._view(src, n)
            self.counters["d2d_bytes"] += n
        elif kind == "memset":
            _, dst, value, n = op
            self.order.access(stream, [(dst, dst + n, True)], "a memset")
            self._view(dst, n)[:] = value
            self.counters["memset_bytes"] += n
        elif kind in ("h2d", "d2h"):
            _, dst, src, n = op
            ranges = []  # pinned host memory is tracked too, apart from device addresses
            for ptr, write, device in ((dst, True, kind == "h2d"), (src, False, kind == "d2h")):
                if device or self.pinned(ptr, n):
                    lo = int(ptr) + (0 if device else HOST_TAG)
                    ranges.append((lo, lo + n, write))
            self.order.access(stream, ranges, "a host-to-device copy" if kind == "h2d"
                              else "a device-to-host copy")
            (self._h2d if kind == "h2d" else self._d2h)(dst, src, n)

    def _written(self, kernel: GpuKernel) -> frozenset[str]:
        """Names of the parameters a kernel stores to (cached per kernel object, which the
        cache keeps alive: a tuner may load several kernels of one name)."""
        hit = self._writes.get(id(kernel))
        if hit is None:
            hit = self._writes[id(kernel)] = (kernel, frozenset(
                s.buffer.name for s in kernel.func.body.walk() if isinstance(s, Store)))
        return hit[1]

    def _call(self, fn: Any, n_values: int = 0) -> tuple[Any, ...]:
        """`fn()` as a driver call: its faults become error codes (an illegal address sticks)."""
        try:
            values = fn()
        except _Fault as f:
            if f.name == "CUDA_ERROR_ILLEGAL_ADDRESS":
                self._sticky = f.name
            return self._err(f.name, n_values)
        return self._ok(*(() if values is None else values))

    def _launch(self, kernel: GpuKernel, pointers: list[int]) -> None:
        arrays: dict[str, np.ndarray] = {}
        widened: list[tuple[np.ndarray, np.ndarray]] = []
        for b, ptr in zip(kernel.func.params, pointers, strict=True):
            raw = self._view(ptr, b.nbytes)
            if b.dtype.value == "bf16":
                bits = raw.view(np.uint16)
                wide = (bits.astype(np.uint32) << np.uint32(16)).view(np.float32)
                widened.append((bits, wide))
                arrays[b.name] = wide
            else:
                arrays[b.name] = raw.view(storage_dtype(b.dtype))
        simulate_kernel(kernel, arrays, **self.sim_options)
        for bits, wide in widened:
            bits[:] = (round_to(wide, "bf16").view(np.uint32) >> np.uint32(16)).astype(np.uint16)
        self.counters["launches"] += 1
        self.launched.append(kernel.func.name)

    # -- device and context ----------------------------------------------------------------------

    def cuInit(self, flags: int) -> tuple[Any, ...]:  # noqa: N802 - the driver's names
        return self._ok()

    def cuDeviceGetCount(self) -> tuple[Any, ...]:  # noqa: N802
        return self._ok(1)

    def cuDeviceGet(self, ordinal: int) -> tuple[Any, ...]:  # noqa: N802
        return self._ok(self._device(int(ordinal))) if int(ordinal) == 0 else self._err(
            "CUDA_ERROR_INVALID_VALUE", 1)

    def cuDevicePrimaryCtxRetain(self, dev: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._ok(self._handle("context"))

    def cuDevicePrimaryCtxRelease(self, dev: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._ok()

    def cuCtxSetCurrent(self, ctx: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._ok()

    def cuDeviceGetAttribute(self, attrib: Any, dev: Any) -> tuple[Any, ...]:  # noqa: N802
        name = getattr(attrib, "name", str(attrib))
        if name.endswith("COMPUTE_CAPABILITY_MAJOR"):
            return self._ok(self.arch[0])
        if name.endswith("COMPUTE_CAPABILITY_MINOR"):
            return self._ok(self.arch[1])
        return self._err("CUDA_ERROR_INVALID_VALUE", 1)

    def cuDeviceGetName(self, length: int, dev: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._ok(self.name.encode()[:length - 1])

    def cuCtxSynchronize(self) -> tuple[Any, ...]:  # noqa: N802
        if (g := self._guard()) is not None:
            return g
        self.order.sync()
        return self._ok()

    def cuGetErrorName(self, error: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._ok(getattr(error, "name", str(error)).encode())

    def cuGetErrorString(self, error: Any) -> tuple[Any, ...]:  # noqa: N802
        text = {"CUDA_ERROR_ILLEGAL_ADDRESS": "an illegal memory access was encountered"}
        name = getattr(error, "name", str(error))
        return self._ok(text.get(name, name.lower().replace("_", " ")).encode())

    # -- modules ---------------------------------------------------------------------------------

    def cuModuleLoadData(self, image: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._guard(1) or self._ok(self._handle("module", bytes(image)))

    def cuModuleUnload(self, module: Any) -> tuple[Any, ...]:  # noqa: N802
        return self._ok()

    def cuModuleGetFunction(self, module: Any, name: bytes) -> tuple[Any, ...]:  # noqa: N802
        sym = name.decode() if isinstance(name, bytes) else str(name)
        if sym not in self.kernels:
            return self._err("CUDA_ERROR_NOT_FOUND", 1)
        return self._ok(self._handle("function", self.kernels[sym]))

    # -- memory ------------------------------------------------------------------------------------

    def cuMemAlloc(self, bytesize: int) -> tuple[Any, ...]:  # noqa: N802
        if self._sticky:
            return self._err(self._sticky, 1)
        n = max(1, int(bytesize))
        ptr = self._next_address
        self._next_address += -(-n // 256) * 256 + self.GUARD
        bisect.insort(self._mem.base, ptr)
        self._mem.blocks[ptr] = np.full(n, 0xFF, np.uint8)
        self.counters["mem_alloc"] += 1
        return self._ok(self._pointer(ptr))

    def cuMemFree(self, dptr: Any) -> tuple[Any, ...]:  # noqa: N802
        ptr = int(dptr)
        if ptr not in self._mem.blocks:
            return self._err("CUDA_ERROR_INVALID_VALUE")
        del self._mem.blocks[ptr]
        self._mem.base.remove(ptr)
        self.counters["mem_free"] += 1
        return self._ok()

    @property
    def allocations(self) -> dict[int, int]:
        """Live allocations: address -> bytes."""
        return {p: b.size for p, b in self._mem.blocks.items()}

    def _host(self, host: Any, nbytes: int) -> np.ndarray:
        """A host buffer (an array or an address) as `nbytes` writable bytes."""
        if isinstance(host, int):
            return np.ctypeslib.as_array((ctypes.c_uint8 * nbytes).from_address(host))
        arr = np.asarray(host)
        if not arr.flags.c_contiguous or arr.nbytes < nbytes:
            raise _Fault("CUDA_ERROR_INVALID_VALUE", "host buffer too small or not contiguous")
        return arr.reshape(-1).view(np.uint8)[:nbytes]

    def _h2d(self, dst: Any, src: Any, n: int) -> None:
        self._view(int(dst), n)[:] = self._host(src, n)
        self.counters["h2d_calls"] += 1
        self.counters["h2d_bytes"] += n
        if self.pinned(src, n):
            self.counters["pinned_h2d_bytes"] += n

    def _d2h(self, dst: Any, src: Any, n: int) -> None:
        out = self._host(dst, n)
        out[:] = self._view(int(src), n)
        self.counters["d2h_calls"] += 1
        self.counters["d2h_bytes"] += n
        if self.pinned(dst, n):
            self.counters["pinned_d2h_bytes"] += n

    def _host_copy(self, stream: Any, op: tuple[Any, ...], host: Any, sync: bool = False
                   ) -> tuple[Any, ...]:
        """A copy between the host and the device: pinned memory on a capturing stream is
        captured, pageable memory is refused there (it invalidates the capture)."""
        if self._sticky:
            return self._err(self._sticky)
        cap = self._capture_of(stream)
        if cap is not None and not self.pinned(host, op[3]):
            cap.invalid = "a copy with pageable host memory during the capture"
            return self._err("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
        result = self._submit(stream, op)
        if sync:  # synchronous with the host
            self.order.sync(dict(self.order.clock(self._number(stream))))
        return result

    def cuMemcpyHtoD(self, dstDevice: Any, srcHost: Any, ByteCount: int  # noqa: N802, N803
                     ) -> tuple[Any, ...]:
        return self._host_copy(0, ("h2d", int(dstDevice), srcHost, int(ByteCount)), srcHost,
                               True)

    def cuMemcpyDtoH(self, dstHost: Any, srcDevice: Any, ByteCount: int  # noqa: N802, N803
                     ) -> tuple[Any, ...]:
        return self._host_copy(0, ("d2h", dstHost, int(srcDevice), int(ByteCount)), dstHost,
                               True)

    def cuMemcpyHtoDAsync(self, dstDevice: Any, srcHost: Any, ByteCount: int,  # noqa: N802, N803
                          hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._host_copy(hStream, ("h2d", int(dstDevice), srcHost, int(ByteCount)),
                               srcHost)

    def cuMemcpyDtoHAsync(self, dstHost: Any, srcDevice: Any, ByteCount: int,  # noqa: N802, N803
                          hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._host_copy(hStream, ("d2h", dstHost, int(srcDevice), int(ByteCount)),
                               dstHost)

    def cuMemcpyDtoDAsync(self, dstDevice: Any, srcDevice: Any, ByteCount: int,  # noqa: N802, N803
                          hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._guard() or self._submit(
            hStream, ("d2d", int(dstDevice), int(srcDevice), int(ByteCount)))

    def cuMemsetD8Async(self, dstDevice: Any, uc: int, N: int,  # noqa: N802, N803
                        hStream: Any) -> tuple[Any, ...]:  # noqa: N803
        return self._guard() or self._submit(hStream, ("memset", int(dstDevice), int(uc),
                                                       int(N)))

    # -- launches --------------------------------------------------------------------------------

    def cuLaunchKernel(self, f: Any, gridDimX: int, gridDimY: int, gridDimZ: int,  # noqa: N802, N803
                       blockDimX: int, blockDimY: int, blockDimZ: int,  # noqa: N803
                       sharedMemBytes: int, hStream: Any, kernelParams: Any,  # noqa: N803
                       extra: Any) -> tuple[Any, ...]:
        if self._sticky:
            return self._err(self._sticky)
        fn = self._obj(f, "function")
        if fn is None:
            return self._err("CUDA_ERROR_INVALID_HANDLE")
        kernel: GpuKernel = fn.data
        if ((int(gridDimX), int(gridDimY), int(gridDimZ), int(blockDimX), int(blockDimY),
             int(blockDimZ)) != (kernel.grid, 1, 1, kernel.block, 1, 1)
                or int(sharedMemBytes) != 0 or not isinstance(kernelParams, int)):
            # the simulator runs the kernel's own launch shape only; no dynamic shared memory
            return self._err("CUDA_ERROR_INVALID_VALUE")
        n = len(kernel.func.params)
        slots = (ctypes.c_uint64 * n).from_address(kernelParams)  # the void*[] of arguments
        pointers = [int(ctypes.c_uint64.from_address(int(p)).value) for p in slots]
        return self._submit(hStream, ("launch", kernel, pointers))

    # -- streams, graphs, events: fakestreams.StreamsMixin ------------------------------------

    def _destroy(self, handle: Any, kind: str) -> tuple[Any, ...]:
        if self._obj(handle, kind) is None:
            return self._err("CUDA_ERROR_INVALID_HANDLE")
        del self._objects[int(handle)]
        return self._ok()
