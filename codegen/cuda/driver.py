"""Running compiled kernels on an NVIDIA GPU through `cuda.bindings.driver`.

    dev = Device()                                  # cuInit, device 0, its primary context
    compiled = compile_program(program, dev.arch)   # nfc.codegen.cuda.program (NVRTC)
    outputs = run_program(dev, program, compiled, inputs)

`Device()` raises `NoDriverError` ("no NVIDIA driver: ...") where the driver library cannot be
loaded (`cuInit` raises `DynamicLibNotFoundError`) or no device is present: building,
rendering, compiling with NVRTC and simulating all work without one. `run_program` allocates
one device buffer per parameter and temporary, copies the inputs (bf16 as its 16-bit pattern),
launches the kernels in order on the default stream, synchronises and copies the outputs back.

The whole-step runtime (nfc.runtime.cuda_model.CudaModel) uses the rest of `Device`: a
non-default stream (`stream`), asynchronous copies and launches on it, the capture of a
function call into a CUDA Graph (`capture`, then `graph_launch`), and event timing; activation
offload (nfc.codegen.cuda.offload) adds pinned host memory (`host_alloc`), copies between it and
the device on a second stream (`to_host_async`, `to_device_async`) and the events ordering the
two streams (`record`, `wait`), which also fork and join a capture across them. `Device`
takes any object with the `cuda.bindings.driver` functions it calls (`driver=`), so that
`nfc.codegen.cuda.fakedriver.FakeDriver` runs the same code on the simulator. docs/cuda.md
says what is checked on a device and how (scripts/gpu_check.sh).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from nfc.codegen.cuda.lower import GpuProgram
from nfc.codegen.cuda.nvrtc import CompiledModule, CudaToolchainError
from nfc.codegen.cuda.types import round_to
from nfc.codegen.loops import Buffer

__all__ = ["CudaDriverError", "Device", "NoDriverError", "from_device_layout", "host_buffer",
           "run_program", "to_device_layout"]


class NoDriverError(RuntimeError):
    """There is no NVIDIA driver (or no device) on this machine."""


class CudaDriverError(RuntimeError):
    """A CUDA driver call failed."""


def _driver() -> Any:
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise CudaToolchainError(f"running on a GPU needs cuda-python ({exc}); install it with "
                                 "pip install 'nfc[cuda]'") from None
    return driver


def _is_missing_library(exc: BaseException) -> bool:
    try:
        from cuda.pathfinder import DynamicLibNotFoundError
    except ImportError:
        return type(exc).__name__ == "DynamicLibNotFoundError"
    return isinstance(exc, DynamicLibNotFoundError)


def _check(d: Any, result: Any, what: str) -> Any:
    """The values after the CUresult of a driver call; CudaDriverError if it failed."""
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != d.CUresult.CUDA_SUCCESS:
        _, name = d.cuGetErrorName(err)
        _, text = d.cuGetErrorString(err)
        raise CudaDriverError(f"{what} failed: {_str(name)}: {_str(text)}")
    return rest[0] if len(rest) == 1 else tuple(rest)


def _str(x: Any) -> str:
    return x.decode(errors="replace") if isinstance(x, bytes) else str(x)


class Device:
    """One GPU with its primary context made current."""

    def __init__(self, ordinal: int = 0, driver: Any = None) -> None:
        d = self.d = driver if driver is not None else _driver()
        try:
            result = d.cuInit(0)
        except Exception as exc:
            if _is_missing_library(exc):
                raise NoDriverError(f"no NVIDIA driver: cuInit could not load the driver "
                                    f"library ({exc})") from None
            raise
        (err,) = result
        if err == d.CUresult.CUDA_ERROR_NO_DEVICE:
            raise NoDriverError("no NVIDIA driver: the driver reports no CUDA device")
        _check(d, result, "cuInit")
        count = _check(d, d.cuDeviceGetCount(), "cuDeviceGetCount")
        if ordinal >= count:
            raise NoDriverError(f"no CUDA device {ordinal} ({count} present)")
        self.device = _check(d, d.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = _check(d, d.cuDevicePrimaryCtxRetain(self.device),
                              "cuDevicePrimaryCtxRetain")
        _check(d, d.cuCtxSetCurrent(self.context), "cuCtxSetCurrent")
        attr = d.CUdevice_attribute
        major = _check(d, d.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, self.device), "attribute")
        minor = _check(d, d.cuDeviceGetAttribute(
            attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, self.device), "attribute")
        self.arch = f"sm_{major}{minor}"
        self.name = _str(_check(d, d.cuDeviceGetName(256, self.device), "cuDeviceGetName")
                         ).rstrip("\0 ")
        self._modules: list[Any] = []

    def close(self) -> None:
        """Unload modules and release the primary context."""
        for m in self._modules:
            self.d.cuModuleUnload(m)
        self._modules.clear()
        self.d.cuDevicePrimaryCtxRelease(self.device)

    def __enter__(self) -> Device:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def load(self, compiled: CompiledModule) -> Any:
        """`cuModuleLoadData` of a cubin (or PTX, which the driver compiles)."""
        image = compiled.image if compiled.kind == "cubin" else compiled.image.rstrip(b"\0") + b"\0"
        module = _check(self.d, self.d.cuModuleLoadData(image), "cuModuleLoadData")
        self._modules.append(module)
        return module

    def function(self, module: Any, name: str) -> Any:
        """A kernel of a loaded module."""
        return _check(self.d, self.d.cuModuleGetFunction(module, name.encode()),
                      f"cuModuleGetFunction({name})")

    def alloc(self, nbytes: int) -> int:
        """A device allocation (at least one byte); its address."""
        return int(_check(self.d, self.d.cuMemAlloc(max(1, nbytes)), "cuMemAlloc"))

    def free(self, ptr: int) -> None:
        """Free an allocation."""
        _check(self.d, self.d.cuMemFree(ptr), "cuMemFree")

    def upload(self, ptr: int, host: np.ndarray) -> None:
        """Copy a contiguous host array to the device."""
        host = np.ascontiguousarray(host)
        _check(self.d, self.d.cuMemcpyHtoD(ptr, host, host.nbytes), "cuMemcpyHtoD")

    def download(self, host: np.ndarray, ptr: int) -> None:
        """Copy device memory into a contiguous host array."""
        assert host.flags.c_contiguous
        _check(self.d, self.d.cuMemcpyDtoH(host, ptr, host.nbytes), "cuMemcpyDtoH")

    def launch(self, function: Any, grid: int, block: int, pointers: Sequence[int],
               shared_bytes: int = 0, stream: Any = 0) -> None:
        """`cuLaunchKernel` with device pointers as the arguments, on `stream` (0: the
        default stream)."""
        values = np.array(pointers, dtype=np.uint64)
        # kernelParams: an array of pointers, each to one argument's value (the driver copies
        # the values at the call, so the arrays may go right after)
        params = np.array([values.ctypes.data + 8 * n for n in range(len(values))],
                          dtype=np.uint64)
        _check(self.d, self.d.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared_bytes,
                                             stream, params.ctypes.data, 0), "cuLaunchKernel")

    # -- streams, asynchronous copies, graphs, events (the whole-step runtime) ---------------

    def stream(self) -> Any:
        """A new non-blocking stream (`cuStreamCreate`)."""
        flags = self.d.CUstream_flags.CU_STREAM_NON_BLOCKING
        return _check(self.d, self.d.cuStreamCreate(int(flags)), "cuStreamCreate")

    def destroy_stream(self, stream: Any) -> None:
        """`cuStreamDestroy`."""
        _check(self.d, self.d.cuStreamDestroy(stream), "cuStreamDestroy")

    def upload_async(self, ptr: int, host: np.ndarray, stream: Any) -> None:
        """Copy a contiguous host array to the device on `stream` (keep `host` alive until
        the stream is synchronised)."""
        assert host.flags.c_contiguous
        _check(self.d, self.d.cuMemcpyHtoDAsync(ptr, host, host.nbytes, stream),
               "cuMemcpyHtoDAsync")

    def download_async(self, host: np.ndarray, ptr: int, stream: Any) -> None:
        """Copy device memory into a contiguous host array on `stream`."""
        assert host.flags.c_contiguous
        _check(self.d, self.d.cuMemcpyDtoHAsync(host, ptr, host.nbytes, stream),
               "cuMemcpyDtoHAsync")

    def copy_async(self, dst: int, src: int, nbytes: int, stream: Any) -> None:
        """A device-to-device copy on `stream`."""
        _check(self.d, self.d.cuMemcpyDtoDAsync(dst, src, nbytes, stream), "cuMemcpyDtoDAsync")

    def sync(self, stream: Any) -> None:
        """Wait for `stream`; a kernel fault surfaces here."""
        _check(self.d, self.d.cuStreamSynchronize(stream), "cuStreamSynchronize")

    def capture(self, stream: Any, enqueue: Callable[[], None]) -> Any:
        """The executable CUDA Graph of what `enqueue()` puts on `stream` (captured, not run:
        `cuStreamBeginCapture`, `cuStreamEndCapture`, `cuGraphInstantiate`)."""
        d = self.d
        mode = d.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
        _check(d, d.cuStreamBeginCapture(stream, mode), "cuStreamBeginCapture")
        try:
            enqueue()
        except BaseException:
            # end the capture so the stream is usable again, and drop what it captured
            result = d.cuStreamEndCapture(stream)
            if result[0] == d.CUresult.CUDA_SUCCESS and result[1] is not None:
                d.cuGraphDestroy(result[1])
            raise
        graph = _check(d, d.cuStreamEndCapture(stream), "cuStreamEndCapture")
        try:
            return _check(d, d.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        finally:
            d.cuGraphDestroy(graph)

    def graph_launch(self, graph_exec: Any, stream: Any) -> None:
        """Replay an instantiated graph on `stream`."""
        _check(self.d, self.d.cuGraphLaunch(graph_exec, stream), "cuGraphLaunch")

    def destroy_graph(self, graph_exec: Any) -> None:
        """`cuGraphExecDestroy`."""
        _check(self.d, self.d.cuGraphExecDestroy(graph_exec), "cuGraphExecDestroy")

    def event(self, timing: bool = True) -> Any:
        """An event (`cuEventCreate`): a timing one, or (`timing=False`) one only ordering
        streams (`CU_EVENT_DISABLE_TIMING`, cheaper)."""
        flags = self.d.CUevent_flags
        flag = flags.CU_EVENT_DEFAULT if timing else flags.CU_EVENT_DISABLE_TIMING
        return _check(self.d, self.d.cuEventCreate(int(flag)), "cuEventCreate")

    def wait(self, stream: Any, event: Any) -> None:
        """Work enqueued on `stream` from now on waits for `event`'s last record
        (`cuStreamWaitEvent`); inside a capture this forks or joins the captured streams."""
        _check(self.d, self.d.cuStreamWaitEvent(stream, event, 0), "cuStreamWaitEvent")

    def host_alloc(self, nbytes: int) -> int:
        """Page-locked (pinned) host memory (`cuMemHostAlloc`); its address. Copies to and
        from it are truly asynchronous and may be captured into a graph."""
        return int(_check(self.d, self.d.cuMemHostAlloc(max(1, nbytes), 0), "cuMemHostAlloc"))

    def host_free(self, ptr: int) -> None:
        """`cuMemFreeHost`."""
        _check(self.d, self.d.cuMemFreeHost(ptr), "cuMemFreeHost")

    def to_host_async(self, host_ptr: int, ptr: int, nbytes: int, stream: Any) -> None:
        """Copy device memory to pinned host memory (an address) on `stream`."""
        _check(self.d, self.d.cuMemcpyDtoHAsync(host_ptr, ptr, nbytes, stream),
               "cuMemcpyDtoHAsync")

    def to_device_async(self, ptr: int, host_ptr: int, nbytes: int, stream: Any) -> None:
        """Copy pinned host memory (an address) to the device on `stream`."""
        _check(self.d, self.d.cuMemcpyHtoDAsync(ptr, host_ptr, nbytes, stream),
               "cuMemcpyHtoDAsync")

    def record(self, event: Any, stream: Any) -> None:
        """`cuEventRecord`."""
        _check(self.d, self.d.cuEventRecord(event, stream), "cuEventRecord")

    def elapsed_ms(self, start: Any, end: Any) -> float:
        """Milliseconds between two recorded events (waits for `end`)."""
        _check(self.d, self.d.cuEventSynchronize(end), "cuEventSynchronize")
        return float(_check(self.d, self.d.cuEventElapsedTime(start, end),
                            "cuEventElapsedTime"))

    def destroy_event(self, event: Any) -> None:
        """`cuEventDestroy`."""
        _check(self.d, self.d.cuEventDestroy(event), "cuEventDestroy")

    def synchronize(self) -> None:
        """Wait for the device; a kernel fault surfaces here."""
        _check(self.d, self.d.cuCtxSynchronize(), "cuCtxSynchronize")


def to_device_layout(x: Any, b: Buffer) -> np.ndarray:
    """A host array as the flat bytes a kernel reads for `b` (bf16 as its 16-bit pattern)."""
    a = np.asarray(x)
    if a.shape != b.shape:
        raise ValueError(f"input '{b.name}' has shape {a.shape}, expected {b.shape}")
    if b.dtype.value == "bf16":
        bits = round_to(a.astype(np.float32), "bf16").view(np.uint32) >> np.uint32(16)
        return bits.astype(np.uint16).reshape(-1)
    return np.ascontiguousarray(a, dtype=b.dtype.numpy).reshape(-1)


def host_buffer(b: Buffer) -> np.ndarray:
    """An uninitialised flat host array in the device layout of `b`."""
    return np.empty(b.size, np.uint16 if b.dtype.value == "bf16" else b.dtype.numpy)


def from_device_layout(a: np.ndarray, b: Buffer) -> np.ndarray:
    """A flat array in the device layout of `b` as a host array of its shape (bf16 as f32)."""
    if b.dtype.value == "bf16":
        a = (a.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return a.reshape(b.shape)


def run_program(device: Device, program: GpuProgram, compiled: CompiledModule,
                inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
    """Run `program` (compiled into `compiled`) on `device`; its outputs."""
    ins = program.params[program.n_outputs:]
    values = [inputs[b.name] for b in ins] if isinstance(inputs, Mapping) else list(inputs)
    if len(values) != len(ins):
        raise ValueError(f"{len(values)} inputs for {len(ins)} parameters")
    module = device.load(compiled)
    ptrs: dict[str, int] = {}
    try:
        for b in (*program.params, *program.temps):
            ptrs[b.name] = device.alloc(b.nbytes)
        for b, x in zip(ins, values, strict=True):
            device.upload(ptrs[b.name], to_device_layout(x, b))
        for k in program.kernels:
            fn = device.function(module, k.func.name)
            device.launch(fn, k.grid, k.block, [ptrs[b.name] for b in k.func.params])
        device.synchronize()
        outs = []
        for b in program.params[:program.n_outputs]:
            host = host_buffer(b)
            device.download(host, ptrs[b.name])
            outs.append(from_device_layout(host, b))
        return outs
    finally:
        for p in ptrs.values():
            device.free(p)
