"""NVRTC: CUDA C to cubin (or PTX) through `cuda.bindings.nvrtc`, with resource checks and a cache.

- `compile_cuda(source, arch)` compiles for `sm_80` or `sm_90` (`ptx=True`: PTX for
  `compute_XX` instead) with `--ptxas-options=-v`, and parses that log into `Resources` per
  kernel (registers, static shared memory, spills, stack, barriers). No GPU is needed.
- Headers (`mma.h`, `cuda_fp16.h`, `cuda_bf16.h`) are looked up only when the source includes
  something: `$NFC_CUDA_INCLUDE`, the CUDA toolkit that `cuda.pathfinder` finds, `$CUDA_HOME`
  or `$CUDA_PATH`, `/usr/local/cuda/include`; the first directory holding `mma.h` and
  `cuda_fp16.h` wins, and an error lists where it looked.
- A compile error is an `NvrtcError` whose message quotes NVRTC's diagnostics followed by the
  generated source line each one points at.
- `check_resources(kernel, resources, arch)` lists what breaks the target's limits (registers
  x threads over the 64K registers of an SM, static shared memory over 48 KiB, shared memory
  over the SM's 164 KiB (sm_80) or 228 KiB (sm_90), spills); `compile_program` raises
  `ResourceError` with them.
- Compiled images are cached on disk (`$NFC_CACHE_DIR/cuda`, default `~/.cache/nfc/cuda`, a
  private directory; `NFC_CUDA_CACHE=0` turns it off), keyed by the SHA-256 of the source,
  the options and the NVRTC and cuda-python versions. An entry holds its own SHA-256 over key
  and content; one that fails the check is deleted and compiled afresh.

cuda-python is an optional dependency (`pip install 'nfc[cuda]'`): it is imported on first use
and its absence is a `CudaToolchainError` that says what to install.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nfc.fsutil import atomic_write, private_dir

#: Magic of a cache entry: then the SHA-256 of key + payload, the header length, header, image.
MAGIC = b"NFCCUDA1"
_HEAD = struct.Struct("<8s32sI")


@dataclass(frozen=True)
class Arch:
    """Limits of a GPU architecture that a kernel's resources are checked against."""

    name: str
    smem_per_sm: int
    """Shared memory of one SM (bytes), the most one block can opt in to plus 1 KiB."""
    regs_per_sm: int = 65536
    regs_per_thread: int = 255
    static_smem: int = 48 * 1024
    """Static (`__shared__`) memory one block may declare."""
    threads_per_block: int = 1024


ARCHS: dict[str, Arch] = {"sm_80": Arch("sm_80", 164 * 1024), "sm_90": Arch("sm_90", 228 * 1024)}


class CudaToolchainError(RuntimeError):
    """cuda-python, NVRTC or the CUDA headers are missing."""


class NvrtcError(RuntimeError):
    """NVRTC rejected the generated source; the message quotes the source lines."""


class ResourceError(ValueError):
    """A kernel exceeds the limits of its target."""


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one kernel."""

    registers: int = 0
    shared_bytes: int = 0
    spill_stores: int = 0
    spill_loads: int = 0
    stack_bytes: int = 0
    barriers: int = 0


@dataclass(frozen=True)
class CompiledModule:
    """A compiled translation unit."""

    arch: str
    kind: str
    """`cubin` or `ptx`."""
    image: bytes
    log: str
    resources: dict[str, Resources] = field(default_factory=dict)
    """Per kernel (cubin only)."""
    cached: bool = False
    key: str = ""


def _nvrtc() -> Any:
    try:
        from cuda.bindings import nvrtc
    except ImportError as exc:
        raise CudaToolchainError(
            f"the CUDA backend needs cuda-python ({exc}); install it with "
            "pip install 'nfc[cuda]' (cuda-python and nvidia-cuda-nvrtc)") from None
    return nvrtc


def _check(result: Any, what: str) -> None:
    nvrtc = _nvrtc()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        _, msg = nvrtc.nvrtcGetErrorString(result)
        raise CudaToolchainError(f"NVRTC {what} failed: {msg.decode(errors='replace')}")


def nvrtc_version() -> tuple[int, int]:
    """(major, minor) of the NVRTC library; CudaToolchainError when it cannot be loaded."""
    nvrtc = _nvrtc()
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as exc:  # noqa: BLE001 - the library loader's own error types
        raise CudaToolchainError(
            f"cannot load the NVRTC library ({type(exc).__name__}: {exc}); install "
            "nvidia-cuda-nvrtc (pip install 'nfc[cuda]')") from None
    _check(err, "version query")
    return int(major), int(minor)


def _bindings_version() -> str:
    try:
        import cuda.bindings

        return str(getattr(cuda.bindings, "__version__", "?"))
    except ImportError:
        return "none"


def include_candidates() -> list[str]:
    """Directories searched for the CUDA headers, in order."""
    out: list[str] = []
    env = os.environ.get("NFC_CUDA_INCLUDE")
    if env:
        out.append(env)
    try:
        from cuda.pathfinder import find_nvidia_header_directory

        found = find_nvidia_header_directory("cudart")
        if found:
            out.append(str(found))
    except Exception:  # noqa: BLE001 - pathfinder absent or unable: fall back to the paths
        pass
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            out.append(os.path.join(os.environ[var], "include"))
    out.append("/usr/local/cuda/include")
    return list(dict.fromkeys(out))


def include_dir() -> str:
    """The first candidate directory holding `mma.h` and `cuda_fp16.h`."""
    cands = include_candidates()
    for d in cands:
        if all(os.path.isfile(os.path.join(d, h)) for h in ("mma.h", "cuda_fp16.h")):
            return d
    raise CudaToolchainError(
        "no CUDA headers: mma.h and cuda_fp16.h are in none of " + ", ".join(cands)
        + "; install the CUDA toolkit headers or set NFC_CUDA_INCLUDE to their directory")


def options(arch: str, *, ptx: bool, source: str) -> list[str]:
    """NVRTC options for `arch` (headers only when the source includes some)."""
    if arch not in ARCHS:
        raise ValueError(f"unknown CUDA architecture '{arch}' (one of {', '.join(ARCHS)})")
    target = arch.replace("sm_", "compute_") if ptx else arch
    # 177/550: a variable or parameter set but never read (a grid of one block never reads
    # blockIdx.x): harmless in generated code, noise in the log
    opts = [f"--gpu-architecture={target}", "--std=c++17", "--fmad=true",
            "--diag-suppress=177,550"]
    if not ptx:
        opts.append("--ptxas-options=-v")
    if "#include" in source:
        opts.append(f"-I{include_dir()}")
    return opts


def cache_dir() -> Path | None:
    """Where compiled images are cached; None when caching is off."""
    if os.environ.get("NFC_CUDA_CACHE", "1") == "0":
        return None
    base = os.environ.get("NFC_CACHE_DIR") or os.path.join(Path.home(), ".cache", "nfc")
    return Path(base) / "cuda"


def cache_key(source: str, opts: list[str]) -> str:
    """SHA-256 naming a compile: the source, the options, NVRTC and cuda-python versions."""
    major, minor = nvrtc_version()
    text = json.dumps({"source": source, "options": opts, "nvrtc": [major, minor],
                       "bindings": _bindings_version(), "format": MAGIC.decode()})
    return hashlib.sha256(text.encode()).hexdigest()


def _entry(key: str, header: dict[str, Any], image: bytes) -> bytes:
    head = json.dumps(header).encode()
    body = head + image
    digest = hashlib.sha256(key.encode() + body).digest()
    return _HEAD.pack(MAGIC, digest, len(head)) + body


def _read_entry(path: Path, key: str) -> tuple[dict[str, Any], bytes] | None:
    """The header and image of a cache entry that passes its check; a damaged one is deleted."""
    try:
        data = path.read_bytes()
    except OSError:
        return None
    ok = len(data) >= _HEAD.size
    if ok:
        magic, digest, hlen = _HEAD.unpack_from(data)
        body = data[_HEAD.size:]
        ok = (magic == MAGIC and hlen <= len(body)
              and hashlib.sha256(key.encode() + body).digest() == digest)
    if not ok:
        path.unlink(missing_ok=True)
        return None
    return json.loads(body[:hlen]), body[hlen:]


def compile_cuda(source: str, arch: str = "sm_80", *, ptx: bool = False,
                 name: str = "nfc_kernels.cu", use_cache: bool = True) -> CompiledModule:
    """Compile `source` to a cubin for `arch` (or PTX); NvrtcError on a compile error."""
    opts = options(arch, ptx=ptx, source=source)
    kind = "ptx" if ptx else "cubin"
    key = cache_key(source, opts)
    cdir = cache_dir() if use_cache else None
    if cdir is not None:
        hit = _read_entry(cdir / f"{key}.nfcu", key)
        if hit is not None and hit[0].get("kind") == kind:
            return CompiledModule(arch, kind, hit[1], hit[0]["log"], parse_ptxas(hit[0]["log"]),
                                  True, key)
    image, log = _run_nvrtc(source, opts, kind, name)
    if cdir is not None:
        private_dir(cdir)
        atomic_write(cdir / f"{key}.nfcu", _entry(key, {"kind": kind, "log": log}, image), 0o600)
    return CompiledModule(arch, kind, image, log, parse_ptxas(log), False, key)


def _run_nvrtc(source: str, opts: list[str], kind: str, name: str) -> tuple[bytes, str]:
    nvrtc = _nvrtc()
    nvrtc_version()  # a missing library is a toolchain error, not a crash below
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], [])
    _check(err, "program creation")
    try:
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        err, size = nvrtc.nvrtcGetProgramLogSize(prog)
        _check(err, "log query")
        buf = b" " * size
        (err,) = nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(explain_log(log, source, name))
        get_size, get = ((nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if kind == "cubin"
                         else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX))
        err, size = get_size(prog)
        _check(err, f"{kind} size query")
        image = b" " * size
        (err,) = get(prog, image)
        _check(err, f"{kind} retrieval")
        return image, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_DIAG = re.compile(r"^(?P<file>[^\s(]+)\((?P<line>\d+)\): (?P<what>.*)$")


def explain_log(log: str, source: str, name: str) -> str:
    """NVRTC's log with the source line after each diagnostic that names one."""
    lines = source.splitlines()
    out = [f"NVRTC could not compile the generated CUDA C ({name}):"]
    quoted = re.search(r"^\s*\d+ \| ", log, re.M) is not None  # NVRTC 12.8+ quotes itself
    for text in log.splitlines():
        out.append(text)
        m = _DIAG.match(text.strip())
        if m and m.group("file") == name and not quoted:
            n = int(m.group("line"))
            if 1 <= n <= len(lines):
                out.append(f"  {n:5d} | {lines[n - 1]}")
    return "\n".join(out)


_ENTRY = re.compile(r"Compiling entry function '(?P<name>[^']+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")
_SMEM = re.compile(r"(\d+) bytes smem")
_BARS = re.compile(r"used (\d+) barriers")


def parse_ptxas(log: str) -> dict[str, Resources]:
    """Resources per kernel from a `--ptxas-options=-v` log."""
    found: dict[str, dict[str, int]] = {}
    cur: dict[str, int] | None = None
    for line in log.splitlines():
        m = _ENTRY.search(line)
        if m:
            cur = found.setdefault(m.group("name"), {})
            continue
        if cur is None:
            continue
        m = _FRAME.search(line)
        if m:
            cur.update(stack_bytes=int(m.group(1)), spill_stores=int(m.group(2)),
                       spill_loads=int(m.group(3)))
        m = _USED.search(line)
        if m:
            cur["registers"] = int(m.group(1))
            sm, bars = _SMEM.search(line), _BARS.search(line)
            cur["shared_bytes"] = int(sm.group(1)) if sm else 0
            cur["barriers"] = int(bars.group(1)) if bars else 0
    return {k: Resources(**v) for k, v in found.items()}


def check_resources(threads: int, res: Resources, arch: str) -> list[str]:
    """What a kernel of `threads` per block with `res` breaks on `arch` (empty: nothing)."""
    a = ARCHS[arch]
    out = []
    if threads > a.threads_per_block:
        out.append(f"{threads} threads per block (at most {a.threads_per_block})")
    if res.registers * threads > a.regs_per_sm:
        out.append(f"{res.registers} registers x {threads} threads = "
                   f"{res.registers * threads} registers, over the {a.regs_per_sm} of an SM")
    if res.shared_bytes > a.static_smem:
        out.append(f"{res.shared_bytes} bytes of static shared memory (at most {a.static_smem})")
    if res.shared_bytes > a.smem_per_sm:
        out.append(f"{res.shared_bytes} bytes of shared memory, over the {a.smem_per_sm} of an "
                   f"{arch} SM")
    if res.spill_stores or res.spill_loads:
        out.append(f"register spills ({res.spill_stores} bytes stored, {res.spill_loads} "
                   "loaded)")
    return out
