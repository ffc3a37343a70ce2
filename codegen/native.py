"""Ahead-of-time compilation: LLVM module to object file to shared library.

`emit_object(module)` optimises an llvmlite module for the target and returns the object code;
`link_shared(objects, path)` links objects with the system `cc` into a shared library
(`-lgomp` for parallel loops, `-lm` for libm calls). `build_shared(kernels, path)` does both
for a few kernels, for tests and small tools; the whole-model artifact builder uses the first
two with its own entry functions in the same module.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from nfc.codegen.cpu import CpuTarget, target_machine
from nfc.codegen.jit import KernelInfo, emit_kernel, new_module, optimize


class LinkError(RuntimeError):
    """The system C compiler could not link the object code."""


def emit_object(module: Any, target: CpuTarget | None = None) -> bytes:
    """Optimised native object code (ELF) of an llvmlite module."""
    ref = optimize(module, target)
    return target_machine(target).emit_object(ref)


def emit_assembly(module: Any, target: CpuTarget | None = None) -> str:
    """Optimised assembly text of an llvmlite module (for inspection and tests)."""
    ref = optimize(module, target)
    return target_machine(target).emit_assembly(ref)


def find_cc() -> str:
    """The system C compiler (`$CC`, else cc, gcc or clang)."""
    for cand in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cand and shutil.which(cand):
            return cand
    raise LinkError("no C compiler found (set CC, or install gcc)")


def link_shared(objects: Sequence[bytes | str], path: str, *,
                libs: Sequence[str] = ("gomp", "m")) -> str:
    """Link object code (bytes, or paths of .o files) into the shared library `path`."""
    with tempfile.TemporaryDirectory(prefix="nfc-link-") as tmp:
        files = []
        for n, obj in enumerate(objects):
            if isinstance(obj, bytes):
                f = os.path.join(tmp, f"k{n}.o")
                with open(f, "wb") as fh:
                    fh.write(obj)
                files.append(f)
            else:
                files.append(obj)
        out = os.path.abspath(path)
        partial = out + ".tmp"
        cmd = [find_cc(), "-shared", "-o", partial, *files, *(f"-l{x}" for x in libs)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise LinkError(f"{' '.join(cmd)} failed:\n{res.stderr}")
        os.replace(partial, out)  # never leave a half-written library behind
    return out


def build_shared(kernels: Mapping[str, Any], path: str, *,
                 schedules: Mapping[str, Any] | None = None,
                 target: CpuTarget | None = None) -> dict[str, KernelInfo]:
    """Compile computes (`name -> op`) into one shared library exporting `void name(void**)`
    each; returns the kernels' buffer layouts."""
    module = new_module("nfc_kernels", target)
    infos = {name: emit_kernel(module, name, op, (schedules or {}).get(name), target=target)
             for name, op in kernels.items()}
    link_shared([emit_object(module, target)], path)
    return infos
