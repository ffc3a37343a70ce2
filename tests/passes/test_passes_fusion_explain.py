"""fuse{explain=true} prints every decision with R, ΔT, ΔC, ΔK; fuse{params=measured} takes the
measured device parameters (a provider's), explicit options winning."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

import nfc.passes.fusion as fusion
from nfc.irparser import parse_module
from nfc.passes.fusion import Fuse
from nfc.passes.fusion.device import DEFAULT_DEVICE, DeviceParams
from nfc.passmanager import Context

SRC = """
nf.func @forward(%x: tensor<256x256xf32>, %b: tensor<256xf32>) -> (tensor<256x256xf32>) {
  %y = nf.compute [n: 256, m: 256] sum [k: 256] (%x[n, k] * %x[k, m]) : tensor<256x256xf32>
  %z = nf.compute [n: 256, m: 256] (%y[n, m] + %b[m]) : tensor<256x256xf32>
  %r = nf.compute [n: 256, m: 256] (max(%z[n, m], 0.0)) : tensor<256x256xf32>
  nf.return %r : tensor<256x256xf32>
}
"""
LINE = re.compile(r"^fuse: @(\w+): #(\d+) (take|reject|skip|veto|force) (merge|recompute) "
                  r"((?:%\w+ ?)+): "
                  r"R=([-+][0-9.]+)us dT=([-+][0-9]+)B dC=([-+][0-9]+)FLOP "
                  r"dK=([-+][0-9]+) kernels ([-+][0-9]+) regions$")


def test_explain_lines_are_structured(tmp_path: Path) -> None:
    f = tmp_path / "m.nfir"
    f.write_text(SRC)
    out = subprocess.run([sys.executable, "-m", "nfc", "opt", str(f), "-p",
                          "fuse{explain=true}"], capture_output=True, text=True, check=True)
    lines = [ln for ln in out.stderr.splitlines() if ln.startswith("fuse: ")]
    assert lines[0] == "fuse: @forward: device parameters: built-in constants"
    steps = [LINE.match(ln) for ln in lines[1:]]
    assert steps and all(steps), lines
    assert [int(m.group(2)) for m in steps if m] == list(range(len(steps)))
    taken = [m for m in steps if m and m.group(3) == "take"]
    assert taken and all(float(m.group(6)) > 0 for m in taken)
    assert all(float(m.group(6)) <= 0 for m in steps if m and m.group(3) == "reject")
    assert {n for m in taken for n in m.group(5).split()} >= {"%y", "%z", "%r"}


def test_measured_params_replace_defaults_only(monkeypatch: pytest.MonkeyPatch) -> None:
    measured = DeviceParams(bandwidth_gbs=7.0, peak_gflops=33.0, launch_us=0.5)
    monkeypatch.setattr(fusion, "measured_device_params", lambda: measured)
    dev, source = Fuse(params="measured", peak_gflops=99.0).resolve_device()
    assert source == "measured"
    assert (dev.bandwidth_gbs, dev.peak_gflops, dev.launch_us) == (7.0, 99.0, 0.5)
    assert Fuse().resolve_device() == (DEFAULT_DEVICE, "built-in constants")
    assert Fuse(params="builtin").resolve_device() == (DEFAULT_DEVICE, "built-in constants")
    ctx = Context()
    Fuse(params="measured").apply(ctx, parse_module(SRC, "m.nfir"))
    assert ctx.remarks["fuse"].startswith("device parameters: measured (bandwidth-gbs=7.0")
    # what the build gives in the context wins over the provider; `builtin` ignores both
    given = DeviceParams(bandwidth_gbs=3.0)
    ctx = Context(device_params=given)
    assert Fuse().resolve_device(ctx) == (given, "measured")
    assert Fuse(params="measured").resolve_device(ctx) == (given, "measured")
    assert Fuse(params="builtin").resolve_device(ctx) == (DEFAULT_DEVICE, "built-in constants")


def test_nothing_measured_falls_back(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fusion, "measured_device_params", lambda: None)
    dev, source = Fuse(params="measured").resolve_device()
    assert dev == DEFAULT_DEVICE and source == (
        "built-in constants (nothing measured on this machine)")
    dev, source = Fuse(params="measured", launch_us=1.0).resolve_device()
    assert dev.launch_us == 1.0 and source == "options (nothing measured on this machine)"


def test_cached_provider_reads_only_the_cache(tmp_path: Path) -> None:
    from nfc.runtime.device_params import cached_device_params

    assert cached_device_params(tmp_path / "none.sqlite") is None


def test_cached_provider_reads_the_device_category(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    # timings stored as `python -m nfc.runtime.device_params` stores them, under this machine's
    # category; then `fuse{params=measured}` takes them through the entry point
    from nfc.codegen.devbench import BENCH_VERSION
    from nfc.runtime.device_params import cached_device_params
    from nfc.runtime.tuning import TuningCache, cpu_category

    db = tmp_path / "tuning.sqlite"
    category = cpu_category(purpose="device-parameters")
    specs = {"stream": ({"bytes": 2e9}, 0.1), "gemm": ({"flops": 5e9}, 0.1),
             "elementwise": ({"flops": 3e8}, 0.1), "launch": ({}, 3e-9),
             "region": ({}, 4e-6)}
    cache = TuningCache(db)
    for name, (spec, seconds) in list(specs.items())[:-1]:
        cache.put(category, f"{BENCH_VERSION}:{name}", spec, seconds, desc=name)
    cache.close()
    assert cached_device_params(db) is None  # one benchmark missing: nothing measured
    cache = TuningCache(db)
    cache.put(category, f"{BENCH_VERSION}:region", {}, 4e-6, desc="region")
    cache.close()
    got = cached_device_params(db)
    assert got is not None and (got.bandwidth_gbs, got.peak_gflops, got.region_us) == (
        20.0, 50.0, 4.0)
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path))
    dev, source = Fuse(params="measured").resolve_device()
    assert source == "measured" and dev.bandwidth_gbs == 20.0
