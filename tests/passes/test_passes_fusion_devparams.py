"""Device parameters of the fusion reward: micro-benchmarks through the JIT, their conversion
to `DeviceParams`, and their caching in the tuning cache."""

from __future__ import annotations

import pytest

from nfc.codegen import devbench
from nfc.codegen.devbench import Timing, params_from
from nfc.passes.fusion.device import DEFAULT_DEVICE
from nfc.passmanager import build_pipeline


def test_params_from_timings():
    t = {"stream": Timing("stream", {"bytes": 3_000_000_000}, 0.2),
         "gemm": Timing("gemm", {"flops": 2 * 512 ** 3}, 2 * 512 ** 3 / 100e9),
         "launch": Timing("launch", {}, 3e-9), "region": Timing("region", {}, 2.5e-6)}
    p = params_from(t, cache_kib=1024)
    assert (p.bandwidth_gbs, p.peak_gflops, p.launch_us, p.region_us, p.cache_kib) == (
        15.0, 100.0, 0.003, 2.5, 1024)
    assert params_from({}, cache_kib=7).bandwidth_gbs == DEFAULT_DEVICE.bandwidth_gbs
    # the printed options are what the pass reads back
    (fuse,) = build_pipeline(f"fuse{{{p.pipeline_options()}}}")
    assert fuse.device() == p


def test_micro_benchmarks_run():
    small = devbench.bench_bandwidth(elements=1 << 16)
    assert small.seconds > 0 and small.spec["bytes"] == 3 * 4 << 16
    assert 0 < devbench.bench_launch().seconds < 1e-5
    assert devbench.bench_region(calls=100).seconds >= 0
    assert devbench.l2_kib() > 0


def test_device_params_cached(tmp_path, monkeypatch):
    from nfc.runtime import device_params as devparams_mod

    calls = []

    def fake(name, seconds):
        def run():
            calls.append(name)
            return Timing(name, {"bytes": 10**9, "flops": 10**9}, seconds)
        return run

    monkeypatch.setattr(devbench, "BENCHMARKS", {"stream": fake("stream", 0.1),
                                                 "gemm": fake("gemm", 0.01)})
    db = tmp_path / "tuning.sqlite"
    first = devparams_mod.device_params(db)
    assert calls == ["stream", "gemm"]
    assert first.bandwidth_gbs == 10.0 and first.peak_gflops == 100.0
    again = devparams_mod.device_params(db)
    assert again == first and calls == ["stream", "gemm"]  # from the cache
    # --refresh measures again and keeps the new timing
    monkeypatch.setattr(devbench, "BENCHMARKS", {"stream": fake("stream", 0.5),
                                                 "gemm": fake("gemm", 0.01)})
    assert devparams_mod.device_params(db, refresh=True).bandwidth_gbs == pytest.approx(2.0)
    assert devparams_mod.device_params(db).bandwidth_gbs == pytest.approx(2.0)
