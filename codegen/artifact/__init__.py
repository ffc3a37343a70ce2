"""Whole-model artifacts: every function of a module compiled into one shared library.

- `assemble`: kernels, one C-ABI entry per function, `nfc_init`, embedded JSON metadata;
- `plan`: where each tensor lives (caller buffers or the static arena) and the copies;
- `metadata`: the JSON metadata both the CPU library and the CUDA step embed;
- `initgen`: the seeded parameter-initialisation generator (native and numpy).

`build_artifact(module)` returns an `Artifact`; `Artifact.write_shared(path)` links it.
See docs/runtime.md for the ABI and the metadata.
"""

from nfc.codegen.artifact.assemble import Artifact, build_artifact
from nfc.codegen.artifact.metadata import (
    ABI_VERSION,
    PERSISTENT_ROLES,
    TensorInfo,
    persistent_tensors,
)

__all__ = ["ABI_VERSION", "PERSISTENT_ROLES", "Artifact", "TensorInfo", "build_artifact",
           "persistent_tensors"]
