"""Every command that fuses gives the `fuse` pass this machine's device parameters: measured
at first use (here a fake measurement: no timing), kept in the tuning cache under the device
category, looked up by later builds; `--device-params builtin` (or NFC_DEVICE_PARAMS=builtin)
chooses the built-in constants. `nfc tune` tunes the computes before fusion: it has no fuse
pass (its pipeline stops at apply-tuning), so nothing is given there."""

from __future__ import annotations

from pathlib import Path

import pytest

from nfc.cli import main
from nfc.codegen import devbench
from nfc.codegen.devbench import Timing
from nfc.passes.fusion import Fuse
from nfc.passes.fusion.device import DEFAULT_DEVICE, DeviceParams

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "runtime" / "models" / "tiny.nf")

#: What the fake benchmarks give: far from every built-in constant.
FAKE = {"stream": ({"bytes": 10**9}, 0.01), "gemm": ({"flops": 10**9}, 0.002),
        "elementwise": ({"flops": 10**6}, 0.0005), "launch": ({}, 7e-8),
        "region": ({}, 3.25e-6)}


@pytest.fixture
def fake_machine(tmp_path, monkeypatch):
    """A fresh tuning cache, fake device benchmarks counting their runs, and a record of the
    parameters every fuse pass resolves."""
    runs: list[str] = []
    seen: list[tuple[DeviceParams, str]] = []

    def bench(name):
        def run():
            runs.append(name)
            spec, seconds = FAKE[name]
            return Timing(name, spec, seconds)
        return run

    monkeypatch.setattr(devbench, "BENCHMARKS", {n: bench(n) for n in FAKE})
    monkeypatch.setattr(devbench, "l2_kib", lambda: 333)
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NFC_DEVICE_PARAMS", "measured")  # the default outside the test suite
    original = Fuse.resolve_device

    def resolve(self, ctx=None):
        got = original(self, ctx)
        seen.append(got)
        return got

    monkeypatch.setattr(Fuse, "resolve_device", resolve)
    return runs, seen


def _expected() -> DeviceParams:
    return DeviceParams(bandwidth_gbs=100.0, peak_gflops=500.0, elementwise_gflops=2.0,
                        launch_us=0.07, region_us=3.25, cache_kib=333)


def _check(seen, runs):
    assert seen, "no fuse pass ran"
    want = _expected()
    for dev, source in seen:
        assert source == "measured"
        assert dev.bandwidth_gbs == want.bandwidth_gbs and dev.peak_gflops == want.peak_gflops
        assert (dev.launch_us, dev.region_us, dev.cache_kib) == (0.07, 3.25, 333)
    assert sorted(runs) == sorted(FAKE)  # each benchmark measured once, at the first build


def test_compile_measures_once_then_reads_the_cache(fake_machine, tmp_path, capsys):
    runs, seen = fake_machine
    assert main(["compile", TINY, "-o", str(tmp_path / "a.so")]) == 0
    _check(seen, runs)
    assert "fuse: device parameters: measured (bandwidth-gbs=100.0" in capsys.readouterr().err
    seen.clear()
    assert main(["compile", TINY, "-o", str(tmp_path / "b.so")]) == 0
    _check(seen, runs)  # not measured again: from the tuning cache
    # the timings are under the device category of the tuning cache
    from nfc.runtime.tuning import TuningCache, cpu_category

    with TuningCache(tmp_path / "cache" / "tuning.sqlite") as cache:
        entry = cache.best(cpu_category(purpose="device-parameters"), "nfc-devbench-1:stream")
    assert entry is not None and entry.time == pytest.approx(0.01)


def test_train_fuses_with_the_measurement(fake_machine, tmp_path):
    runs, seen = fake_machine
    assert main(["train", TINY, "--data", "synthetic", "--max-steps", "1", "--quiet"]) == 0
    _check(seen, runs)


def test_bench_worker_fuses_with_the_measurement(fake_machine, tmp_path):
    from nfc.runtime.bench.worker import compile_case

    runs, seen = fake_machine
    rec = compile_case({"source": TINY, "settings": ["batch=4"], "out": str(tmp_path / "b")})
    _check(seen, runs)
    assert rec["fuse"].startswith("device parameters: measured (bandwidth-gbs=100.0")


def test_tune_has_no_fuse_pass(capsys):
    assert main(["tune", TINY, "--print-pipeline"]) == 0
    assert "fuse" not in capsys.readouterr().out


@pytest.mark.parametrize("how", ["flag", "env"])
def test_builtin_constants_on_request(fake_machine, tmp_path, monkeypatch, capsys, how):
    runs, seen = fake_machine
    argv = ["compile", TINY, "-o", str(tmp_path / "a.so")]
    if how == "flag":
        argv.append("--device-params=builtin")
    else:
        monkeypatch.setenv("NFC_DEVICE_PARAMS", "builtin")
    assert main(argv) == 0
    assert runs == [] and seen and all(s == (DEFAULT_DEVICE, "built-in constants")
                                       for s in seen)
    assert "fuse: device parameters: built-in constants" in capsys.readouterr().err


def test_a_bad_choice_is_an_error_not_a_traceback(fake_machine, monkeypatch, capsys):
    monkeypatch.setenv("NFC_DEVICE_PARAMS", "fastest")
    assert main(["compile", TINY, "--emit=ir"]) == 1
    err = capsys.readouterr().err
    assert "NFC_DEVICE_PARAMS" in err and "'fastest'" in err and "Traceback" not in err


def test_a_failing_measurement_falls_back(fake_machine, tmp_path, monkeypatch, capsys):
    runs, seen = fake_machine

    def broken():
        raise OSError("no compiler")

    monkeypatch.setattr(devbench, "BENCHMARKS", {"stream": broken})
    assert main(["compile", TINY, "-o", str(tmp_path / "a.so")]) == 0
    assert seen and all(s == (DEFAULT_DEVICE, "built-in constants") for s in seen)
    assert "measuring the device parameters failed (no compiler)" in capsys.readouterr().err


def test_nfc_opt_keeps_the_built_in_constants(fake_machine, tmp_path, capsys):
    # `nfc opt -p fuse` is no build: it measures nothing; fuse{params=measured} reads the
    # cache (empty here: built-in constants, said so)
    runs, seen = fake_machine
    f = tmp_path / "m.nfir"
    f.write_text("nf.func @f(%x: tensor<64xf32>) -> (tensor<64xf32>) {\n"
                 "  %y = nf.compute [i: 64] (%x[i] * 2.0) : tensor<64xf32>\n"
                 "  %z = nf.compute [i: 64] (%y[i] + 1.0) : tensor<64xf32>\n"
                 "  nf.return %z : tensor<64xf32>\n}\n")
    assert main(["opt", str(f), "-p", "fuse"]) == 0
    assert main(["opt", str(f), "-p", "fuse{params=measured}"]) == 0
    assert runs == [] and [s for _, s in seen] == [
        "built-in constants", "built-in constants (nothing measured on this machine)"]
