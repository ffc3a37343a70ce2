"""The CUDA artifact: `nfc compile model.nf --target cuda -o model.so`, one sealed file.

    art = build_cuda_artifact(module)            # after the build pipeline; NVRTC runs here
    art.write("model.so")                        # atomically (nfc.fsutil)
    model = nfc.load("model.so")                 # a CudaModel (nfc.runtime.cuda_load)

The file is the CPU artifact's container (nfc.codegen.artifact.container): payload, metadata
JSON, the 64-byte footer with the SHA-256 of both, checked before anything is used. The
payload is data, not an ELF image:

    +----------+-----------+--------------------+------------------------------------------+
    | NFCGPU01 | u64 index | index JSON (UTF-8) | images: cubin sm_80, cubin sm_90, PTX    |
    |          |  length   |                    | (the index gives each one's offset/size) |
    +----------+-----------+--------------------+------------------------------------------+

The index holds `format`, `images` (name -> [offset, length] after the index), `step` (the
`CudaStep.to_json()` of nfc.codegen.cuda.step: the translation unit, launches on the static
memory plan, metadata), `module` (the printed IR the step was built from) and `schedules`
(kernel key -> GPU schedule chosen by `nfc tune --target cuda`). The metadata is the step's
(the CPU artifact's entries, target kind `cuda`), so `nfc run --info` and `read_metadata` read
it unchanged. The printed module lets the simulator run the file without a GPU
(`NFC_CUDA_SIMULATE=1`): the loader re-parses it, rebuilds the step's kernels and uses them
only if the rebuilt step equals the stored one.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nfc.codegen.artifact.container import CUDA_MAGIC, default_mode, seal
from nfc.ir import Module, Op

__all__ = ["ARTIFACT_FORMAT", "CudaArtifact", "CudaPayload", "build_cuda_artifact",
           "canonical_module", "read_payload"]

#: Version of the payload index; readers refuse another.
ARTIFACT_FORMAT = 1
_LEN = struct.Struct("<Q")
#: Images a CUDA artifact carries by default: cubins for these, PTX of the newest.
DEFAULT_ARCHS = ("sm_80", "sm_90")


class CudaArtifactError(ValueError):
    """A CUDA payload that cannot be read (a file this nfc did not write)."""


def canonical_module(module: Module) -> tuple[Module, str]:
    """(module, text): the module re-parsed from its printed IR, and that text. Building the
    step from the re-parsed module makes it reproducible from the text the file stores
    (printing names values that the pipeline left anonymous)."""
    from nfc.irparser import parse_module
    from nfc.printer import print_module

    text = print_module(module)
    return parse_module(text, "<cuda artifact>"), text


@dataclass
class CudaPayload:
    """The content of a CUDA artifact's payload."""

    step: dict[str, Any]
    """`CudaStep.to_json()`."""
    images: dict[str, bytes]
    """`sm_80`, `sm_90` (cubins), `ptx`."""
    module: str = ""
    """The printed module the step was built from."""
    schedules: dict[str, Any] = field(default_factory=dict)
    """Kernel key -> GPU schedule dict (tuned choices; the rest are defaults)."""

    def to_bytes(self) -> bytes:
        """`CUDA_MAGIC`, the index length, the index JSON, the images."""
        offsets: dict[str, list[int]] = {}
        blobs = []
        at = 0
        for name in sorted(self.images):
            blob = bytes(self.images[name])
            offsets[name] = [at, len(blob)]
            blobs.append(blob)
            at += len(blob)
        index = json.dumps({"format": ARTIFACT_FORMAT, "images": offsets, "step": self.step,
                            "module": self.module, "schedules": self.schedules},
                           sort_keys=True).encode()
        return b"".join((CUDA_MAGIC, _LEN.pack(len(index)), index, *blobs))


def read_payload(payload: bytes, name: str = "artifact") -> CudaPayload:
    """Parse a payload (already checked by its footer's hash); CudaArtifactError when it is
    not one this nfc writes."""
    head = len(CUDA_MAGIC) + _LEN.size
    if not payload.startswith(CUDA_MAGIC) or len(payload) < head:
        raise CudaArtifactError(f"'{name}' is not a CUDA artifact")
    (n,) = _LEN.unpack_from(payload, len(CUDA_MAGIC))
    if head + n > len(payload):
        raise CudaArtifactError(f"'{name}': the CUDA payload index runs past its end")
    try:
        index = json.loads(payload[head:head + n].decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CudaArtifactError(f"'{name}': unreadable CUDA payload index ({exc})") from None
    if not isinstance(index, dict) or index.get("format") != ARTIFACT_FORMAT:
        got = index.get("format") if isinstance(index, dict) else None
        raise CudaArtifactError(f"'{name}' is a CUDA artifact of format {got!r}; this nfc "
                                f"reads format {ARTIFACT_FORMAT}: recompile it")
    blobs = payload[head + n:]
    images: dict[str, bytes] = {}
    for key, span in dict(index.get("images") or {}).items():
        try:
            off, size = (int(x) for x in span)
        except (TypeError, ValueError):
            raise CudaArtifactError(f"'{name}': bad image entry {key!r}") from None
        if off < 0 or size < 0 or off + size > len(blobs):
            raise CudaArtifactError(f"'{name}': image {key!r} lies outside the payload")
        images[str(key)] = blobs[off:off + size]
    step = index.get("step")
    if not isinstance(step, dict):
        raise CudaArtifactError(f"'{name}': the CUDA payload has no step")
    return CudaPayload(step, images, str(index.get("module") or ""),
                       dict(index.get("schedules") or {}))


@dataclass
class CudaArtifact:
    """A built CUDA artifact: the step (with its kernels' loop IR), images, metadata."""

    step: Any
    """nfc.codegen.cuda.step.CudaStep (with `kernels`)."""
    payload: CudaPayload

    @property
    def metadata(self) -> dict[str, Any]:
        """The CPU artifact's metadata entries, target kind `cuda`."""
        return dict(self.step.metadata)

    def to_bytes(self) -> bytes:
        """The sealed file."""
        return seal(self.payload.to_bytes(), self.metadata)

    def write(self, path: str) -> None:
        """Write the sealed file atomically (nfc.fsutil.atomic_write)."""
        from nfc.fsutil import atomic_write

        atomic_write(path, self.to_bytes(), default_mode(executable=False))


def build_cuda_artifact(module: Module, *, functions: Sequence[str] | None = None,
                        schedule_for: Callable[[Op], Any] | None = None,
                        schedules: Mapping[str, Any] | None = None,
                        archs: Sequence[str] = DEFAULT_ARCHS, ptx: bool = True,
                        compile: bool = True) -> CudaArtifact:
    """The CUDA artifact of a module after the build pipeline: the step
    (nfc.codegen.cuda.step.build_cuda_step with `schedule_for`), compiled by NVRTC into a
    cubin per arch and PTX (`compile=False`: no images, for tests of the container alone).
    `schedules` (kernel key -> GpuSchedule or its dict: the tuned choices `schedule_for`
    answers from, nfc.runtime.tuning.gpu.gpu_schedule_for) is stored so that the loader can
    rebuild the same kernels. CompileError for what the backend cannot emit;
    CudaToolchainError without NVRTC."""
    from nfc.codegen.cuda.step import build_cuda_step

    mod, text = canonical_module(module)
    stored = {k: (s if isinstance(s, Mapping) else s.to_dict())
              for k, s in (schedules or {}).items() if s is not None}
    step = build_cuda_step(mod, functions, schedule_for=schedule_for)
    images = step.compile(tuple(archs), ptx=ptx) if compile else {}
    return CudaArtifact(step, CudaPayload(step.to_json(), images, text, stored))
