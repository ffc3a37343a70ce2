"""Categories: everything outside the kernel that a measured time depends on.

A category is a flat JSON-able dict; its canonical JSON is hashed into the id the cache keys
records by, so a record measured on another CPU, GPU, driver or nfc schedule-space version is
never returned. Probes here read only what the operating system tells without side effects.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from pathlib import Path
from typing import Any

from nfc.runtime.tuning.model import canonical_json, category_id

__all__ = ["SCHEDULE_SPACE_VERSION", "canonical_json", "category_id", "cpu_category",
           "cuda_category", "default_category", "describe_category", "schedule_space_version"]

SCHEDULE_SPACE_VERSION = "unknown"
"""Stand-in for the schedule-space version when `nfc.codegen.schedule` cannot be imported."""


def schedule_space_version() -> str:
    """The code generator's schedule version (`nfc.codegen.schedule.SCHEDULE_VERSION`); the
    code generator bumps it when a schedule's meaning changes, which retires every record
    measured before (they are kept but never returned)."""
    try:
        from nfc.codegen.schedule import SCHEDULE_VERSION
    except ImportError:
        return SCHEDULE_SPACE_VERSION
    return str(SCHEDULE_VERSION)


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpuinfo() -> dict[str, str]:
    info: dict[str, str] = {}
    try:
        text = Path("/proc/cpuinfo").read_text(errors="replace")
    except OSError:
        return info
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        name = name.strip()
        if sep and name and name not in info:  # the first processor stands for all
            info[name] = value.strip()
    return info


def cpu_category(*, backend: str = "llvm", schedule_space: str | None = None,
                 **extra: Any) -> dict[str, Any]:
    """The category of kernels compiled for and run on this machine's CPU: device name,
    architecture, feature flags, core count, the schedule-space version (default: the code
    generator's) and, for the LLVM backend, the llvmlite version.

    `extra` adds fields the caller's timings also depend on.
    """
    info = _cpuinfo()
    name = info.get("model name") or info.get("Model") or platform.processor() or "unknown"
    flags = (info.get("flags") or info.get("Features") or "").split()
    cat: dict[str, Any] = {
        "backend": backend,
        "device": name,
        "machine": platform.machine(),
        "features": sorted(set(flags)),
        "cores": os.cpu_count() or 1,
        "schedule_space": schedule_space or schedule_space_version(),
    }
    if backend == "llvm":
        cat["llvmlite"] = _version("llvmlite")
    cat.update(extra)
    return cat


def cuda_category(*, device: str, compute_capability: tuple[int, int] | str,
                  driver_version: str, runtime_version: str, schedule_space: str,
                  **extra: Any) -> dict[str, Any]:
    """The category of CUDA kernels; the caller probes the values (this module imports no
    CUDA library) and names the CUDA schedule space's version."""
    cc = compute_capability
    cat: dict[str, Any] = {
        "backend": "cuda",
        "device": device,
        "compute_capability": cc if isinstance(cc, str) else f"{cc[0]}.{cc[1]}",
        "driver": str(driver_version),
        "runtime": str(runtime_version),
        "schedule_space": schedule_space,
    }
    cat.update(extra)
    return cat


def default_category() -> dict[str, Any]:
    """The category of 'this machine' (the CPU backend); the CLI checks imports against it,
    so the CPU tuner should record under exactly this category."""
    return cpu_category()


def describe_category(cat: dict[str, Any]) -> str:
    """A one-line summary for listings: backend, device, schedule-space version."""
    parts = [str(cat.get("backend", "?")), str(cat.get("device", "?"))]
    if "compute_capability" in cat:
        parts.append(f"sm {cat['compute_capability']}")
    parts.append(f"schedule space {cat.get('schedule_space', '?')}")
    return ", ".join(parts)

