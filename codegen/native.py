"""Ahead-of-time compilation: LLVM module to object file to shared library.

`emit_object(module)` optimises an llvmlite module for the target and returns the object code;
`link_bytes(objects)` links objects with the system `cc` into a shared library (with nfc's
thread pool, nfc.codegen.llvm.threadpool, `-lgomp -lpthread` for parallel loops, `-lm` for
libm calls) and returns its bytes; `link_shared(objects, path)` writes
those to `path` atomically. `build_shared(kernels, path)` emits, compiles and links a few
kernels, for tests and small tools; the whole-model artifact builder uses `emit_object` and
`link_bytes` with its own entry functions, then seals the library with its metadata
(nfc.codegen.artifact.container)."""

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


def link_bytes(objects: Sequence[bytes | str], *,
               libs: Sequence[str] = ("gomp", "m")) -> bytes:
    """Link object code (bytes, or paths of .o files) into a shared library; returns its
    bytes. Everything happens in a private temporary directory, so concurrent links never
    share a file."""
    if "gomp" in libs:  # parallel loops: nfc's thread pool, one per library (hidden symbols)
        from nfc.codegen.llvm.threadpool import runtime_object

        objects = [*objects, runtime_object()]
        libs = [*libs, "pthread"]
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
        out = os.path.join(tmp, "out.so")
        cmd = [find_cc(), "-shared", "-o", out, *files, *(f"-l{x}" for x in libs)]
        res = subprocess.run(cmd, capture_output=True, text=True)
        if res.returncode != 0:
            raise LinkError(f"{' '.join(cmd)} failed:\n{res.stderr}")
        with open(out, "rb") as fh:
            return fh.read()


def link_shared(objects: Sequence[bytes | str], path: str, *,
                libs: Sequence[str] = ("gomp", "m")) -> str:
    """Link object code into the shared library `path`, written atomically (a unique
    temporary name, then a rename: never half a library, even with concurrent writers)."""
    from nfc.codegen.artifact.container import default_mode
    from nfc.fsutil import atomic_write

    out = os.path.abspath(path)
    atomic_write(out, link_bytes(objects, libs=libs), default_mode())
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
