"""Running compiled kernels on an NVIDIA GPU through `cuda.bindings.driver`.

    dev = Device()                                  # cuInit, device 0, its primary context
    compiled = compile_program(program, dev.arch)   # nfc.codegen.cuda.program (NVRTC)
    outputs = run_program(dev, program, compiled, inputs)

`Device()` raises `NoDriverError` ("no NVIDIA driver: ...") where the driver library cannot be
loaded (`cuInit` raises `DynamicLibNotFoundError`) or no device is present: building,
rendering, compiling with NVRTC and simulating all work without one. `run_program` allocates
one device buffer per parameter and temporary, copies the inputs (bf16 as its 16-bit pattern),
launches the kernels in order on the default stream, synchronises and copies the outputs back.

Not here yet: one allocation for a whole static memory plan, streams, CUDA Graph capture of a
training step, timing. docs/cuda.md says what is checked on a device and how (scripts/
gpu_check.sh).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
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

    def __init__(self, ordinal: int = 0) -> None:
        d = self.d = _driver()
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
               shared_bytes: int = 0) -> None:
        """`cuLaunchKernel` with device pointers as the arguments, on the default stream."""
        values = np.array(pointers, dtype=np.uint64)
        # kernelParams: an array of pointers, each to one argument's value
        params = np.array([values.ctypes.data + 8 * n for n in range(len(values))],
                          dtype=np.uint64)
        _check(self.d, self.d.cuLaunchKernel(function, grid, 1, 1, block, 1, 1, shared_bytes,
                                             0, params.ctypes.data, 0), "cuLaunchKernel")

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
