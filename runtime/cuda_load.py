"""CUDA models from files and model sources: what `nfc.load`, `nfc compile --target cuda` and
`nfc train --target cuda` use.

    model = nfc.load("model.so")     # a CUDA artifact: a CudaModel on the GPU
    NFC_CUDA_SIMULATE=1              # ... on the kernel simulator instead (no GPU needed)

`load_cuda` opens a checked CUDA artifact (nfc.codegen.cuda.artifact): on a GPU through the
driver (nfc.runtime.cuda_model.CudaModel with the file's cubins and PTX); without a GPU or
driver it raises `CudaUnavailable` ("no NVIDIA driver: ..."), an ArtifactError, so every
command reports it as a one-line error. With `simulate` (or `NFC_CUDA_SIMULATE=1`) the file's
printed module is parsed again, the step rebuilt with the stored schedules, and used only if
it equals the stored step exactly; its kernels then run on the simulator (slow: for small
models and a few steps, like Triton's `TRITON_INTERPRET=1`).

`build_cuda_module` runs the build pipeline of a model source for the GPU and
`open_step` opens a step on the GPU or the simulator without writing a file.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from nfc.runtime.loader import ArtifactError

__all__ = ["SIMULATE_ENV", "CudaUnavailable", "build_cuda_module", "cuda_artifact",
           "load_cuda", "open_step", "simulate_requested", "tuned_gpu_schedules"]

#: Set to 1 to run CUDA models on the kernel simulator.
SIMULATE_ENV = "NFC_CUDA_SIMULATE"


class CudaUnavailable(ArtifactError):
    """A CUDA model cannot run here: no NVIDIA driver or GPU, or no cuda-python."""


def simulate_requested(simulate: bool | None = None) -> bool:
    """`simulate` when given, else whether NFC_CUDA_SIMULATE=1."""
    return os.environ.get(SIMULATE_ENV, "") == "1" if simulate is None else bool(simulate)


def _unavailable(exc: BaseException, what: str) -> CudaUnavailable:
    return CudaUnavailable(f"{exc}: {what} needs an NVIDIA GPU; {SIMULATE_ENV}=1 (or "
                           "--simulate) runs it on the kernel simulator instead")


def open_step(step: Any, images: Mapping[str, bytes] | None = None, *, simulate: bool = False,
              what: str = "the CUDA model") -> Any:
    """A CudaModel of `step` (a CudaStep with its kernels): on the simulator, or on the GPU
    with `images` (compiled by NVRTC when not given)."""
    from nfc.codegen.cuda.driver import CudaDriverError, NoDriverError
    from nfc.codegen.cuda.nvrtc import CudaToolchainError
    from nfc.runtime.cuda_model import CudaModel, simulated_model

    if simulate:
        return simulated_model(step)
    try:
        from nfc.codegen.cuda.driver import Device

        Device().close()  # no NVIDIA driver: say so before compiling anything
        return CudaModel(step, images if images is not None else step.compile())
    except (NoDriverError, CudaToolchainError) as exc:
        raise _unavailable(exc, what) from None
    except CudaDriverError as exc:
        raise ArtifactError(f"{what}: {exc}") from None


def _rebuilt_step(payload: Any, path: str) -> Any:
    """The stored step with its kernels, rebuilt from the stored module (checked equal)."""
    from nfc.codegen.cuda.step import build_cuda_step
    from nfc.diagnostics import CompileError
    from nfc.irparser import parse_module
    from nfc.runtime.tuning.gpu import gpu_schedule_for

    if not payload.module:
        raise ArtifactError(f"'{path}' holds no module to simulate (written without one)")
    try:
        module = parse_module(payload.module, "<cuda artifact>")
        names = set(payload.step.get("funcs", {}))  # in the module's order, as when built
        step = build_cuda_step(module, [f.name for f in module.funcs if f.name in names],
                               schedule_for=gpu_schedule_for(payload.schedules))
    except CompileError as exc:
        raise ArtifactError(f"'{path}': cannot rebuild its kernels for the simulator: "
                            f"{str(exc).splitlines()[0]}") from None
    if json.dumps(step.to_json(), sort_keys=True) != json.dumps(payload.step, sort_keys=True):
        raise ArtifactError(f"'{path}': the kernels rebuilt for the simulator differ from the "
                            "ones in the file (compiled by another nfc version?); recompile "
                            "it with `nfc compile --target cuda`")
    return step


def load_cuda(path: str, sealed: Any, *, simulate: bool | None = None) -> Any:
    """The CudaModel of a checked CUDA artifact (see the module doc)."""
    from nfc.codegen.cuda.artifact import CudaArtifactError, read_payload
    from nfc.codegen.cuda.step import CudaStep

    try:
        payload = read_payload(sealed.elf, path)
    except CudaArtifactError as exc:
        raise ArtifactError(str(exc)) from None
    what = f"'{path}' (a CUDA model)"
    if simulate_requested(simulate):
        model = open_step(_rebuilt_step(payload, path), simulate=True, what=what)
    else:
        try:
            step = CudaStep.from_json(payload.step)
        except (ValueError, KeyError, TypeError) as exc:
            raise ArtifactError(f"'{path}': unreadable CUDA step ({exc})") from None
        model = open_step(step, payload.images, what=what)
    model.path = path
    return model


def build_cuda_module(source: str | Path, settings: Sequence[str] = (), *,
                      pipeline: str | None = None, model: str | None = None,
                      **pass_manager: Any) -> Any:
    """The module of a model source after the build pipeline (what `build_cuda_step`
    takes); its CPU tuning attributes are ignored by the CUDA backend."""
    from nfc.runtime.build import build_module, parse_settings, pipeline_for

    params, opt = parse_settings(list(settings))
    text = pipeline if pipeline is not None else pipeline_for(source, target="cuda")
    return build_module(source, params, opt, text, model=model, **pass_manager)[0]


def cuda_artifact(module: Any, *, functions: Sequence[str] | None = None,
                  schedules: Mapping[str, Any] | None = None, compile: bool = True) -> Any:
    """nfc.codegen.cuda.artifact.build_cuda_artifact with the tuned `schedules` (kernel key
    -> GpuSchedule or dict) as its `schedule_for`."""
    from nfc.codegen.cuda.artifact import build_cuda_artifact
    from nfc.runtime.tuning.gpu import gpu_schedule_for

    chosen = dict(schedules or {})
    return build_cuda_artifact(module, functions=functions,
                               schedule_for=gpu_schedule_for(chosen), schedules=chosen,
                               compile=compile)


def tuned_gpu_schedules(module: Any, db: str | None = None) -> tuple[dict[str, Any], str]:
    """(GPU schedules by kernel key, a note for the user): this GPU's records in the tuning
    cache `db` (default: nfc's; written by `nfc tune --target cuda`); none without a GPU,
    since the records are per GPU (nfc.runtime.tuning.gpu.cuda_device_category)."""
    from nfc.codegen.cuda.driver import CudaDriverError, Device, NoDriverError
    from nfc.codegen.cuda.nvrtc import CudaToolchainError
    from nfc.runtime.tuning.gpu import cuda_device_category, gpu_schedule_choices
    from nfc.runtime.tuning.kernels import open_cache

    try:
        device = Device()
    except (NoDriverError, CudaToolchainError, CudaDriverError):
        return {}, "GPU schedules: defaults (no GPU here to choose this GPU's tuned records)"
    try:
        category = cuda_device_category(device)
    finally:
        device.close()
    cache = open_cache(db)
    if cache is None:
        return {}, "GPU schedules: defaults (no tuning cache)"
    with cache:
        choices = gpu_schedule_choices(module, cache, category)
    return choices, (f"GPU schedules: {len(choices)} tuned for {category['device']} "
                     "(nfc tune --target cuda), the rest defaults")
