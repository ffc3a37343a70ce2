"""`nfc compile|train|tune --target cuda` without a GPU: the artifact, training and tuning on
the simulator, and the clear errors where a GPU would be needed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from nfc.cli import main

MLP = str(Path(__file__).resolve().parents[2] / "examples" / "mlp.nf")


def _no_driver() -> bool:
    from nfc.codegen.cuda.driver import Device, NoDriverError
    from nfc.codegen.cuda.nvrtc import CudaToolchainError

    try:
        Device().close()
    except (NoDriverError, CudaToolchainError):
        return True
    return False


needs_no_gpu = pytest.mark.skipif(not _no_driver(), reason="a GPU driver is present")


def _nvrtc_or_skip() -> None:
    from nfc.codegen.cuda import nvrtc

    pytest.importorskip("cuda.bindings.nvrtc")
    try:
        nvrtc.nvrtc_version()
    except nvrtc.CudaToolchainError as exc:
        pytest.skip(str(exc))


def _first_losses(path: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in path.read_text().splitlines()
            if json.loads(line).get("event") == "step"]


def test_compile_writes_a_cuda_artifact_and_simulates_a_step(tmp_path, capsys, monkeypatch):
    _nvrtc_or_skip()
    out = tmp_path / "mlp.so"
    assert main(["compile", MLP, "--target", "cuda", "--set", "batch=4", "-o", str(out),
                 "--simulate"]) == 0
    cap = capsys.readouterr()
    assert f"wrote {out} (CUDA:" in cap.err and "sm_80" in cap.err and "ptx" in cap.err
    assert "simulated train_step (seed 0, random inputs): loss " in cap.out
    from nfc.runtime.loader import read_metadata

    assert read_metadata(out)["target"]["kind"] == "cuda"
    assert main(["run", str(out), "--info"]) == 0
    assert "CUDA sm_80, sm_90" in capsys.readouterr().out
    assert main(["compile", str(out), "--emit=header"]) == 1
    assert "is a CUDA artifact: it has no C ABI" in capsys.readouterr().err
    # the file trains like a model file (on the simulator)
    monkeypatch.chdir(tmp_path)
    assert main(["train", str(out), "--simulate", "--max-steps", "1", "--no-eval",
                 "--quiet"]) == 0
    assert "loss: " in capsys.readouterr().out


def test_train_on_the_simulator_matches_the_cpu(tmp_path, capsys):
    gpu_m, cpu_m = tmp_path / "gpu.jsonl", tmp_path / "cpu.jsonl"
    common = [MLP, "--batch", "4", "--max-steps", "3", "--no-eval", "--quiet"]
    assert main(["train", *common, "--target", "cuda", "--simulate", "--metrics",
                 str(gpu_m), "--checkpoint", str(tmp_path / "ck"), "--every", "2"]) == 0
    out = capsys.readouterr().out
    assert "loss: " in out and "steps: 3 " in out
    assert main(["train", *common, "--metrics", str(cpu_m)]) == 0
    g, c = _first_losses(gpu_m), _first_losses(cpu_m)
    assert len(g) == len(c) == 3
    # f32 on both, different summation orders: within a few float32 roundings of the loss
    for a, b in zip(g, c, strict=True):
        assert abs(a - b) <= 1e-5 * max(1.0, abs(b)), (g, c)
    assert any((tmp_path / "ck").glob("*2*")), "checkpoint at step 2"


@needs_no_gpu
def test_tune_without_a_gpu_is_a_clear_error(capsys, tmp_path):
    db = tmp_path / "t.sqlite"
    assert main(["tune", MLP, "--target", "cuda", "--set", "batch=4", "--db", str(db)]) == 1
    err = capsys.readouterr().err
    assert err.startswith("nfc: error: no NVIDIA driver: ") and "--simulate" in err
    assert "Traceback" not in err and not db.exists()
    assert main(["train", MLP, "--target", "cuda", "--batch", "4", "--max-steps", "1"]) == 1
    err = capsys.readouterr().err
    assert "no NVIDIA driver: " in err and "--simulate" in err and "Traceback" not in err


def test_tune_simulated_searches_and_stores_nothing(capsys, tmp_path):
    db = tmp_path / "t.sqlite"
    report = tmp_path / "r.json"
    assert main(["tune", MLP, "--target", "cuda", "--simulate", "--set", "batch=4",
                 "--function", "forward", "--trials", "5", "--population", "4",
                 "--patience", "1", "--db", str(db), "--report", str(report),
                 "--quiet"]) == 0
    cap = capsys.readouterr()
    assert "nothing was written to the tuning cache" in cap.err
    assert "gemm" in cap.out and "model us" in cap.out
    assert not db.exists()
    rep = json.loads(report.read_text())
    assert rep["simulated"] and rep["schedules"]
    assert all(k["failed"] == 0 and k["evaluated"] >= 1 for k in rep["kernels"]
               if k["schedule"] is not None)
    # the chosen schedules drive build_cuda_step, and that step computes what the CPU does
    from nfc.runtime.cuda_load import build_cuda_module, cuda_artifact

    module = build_cuda_module(MLP, ["batch=4"])
    art = cuda_artifact(module, functions=["forward"], schedules=rep["schedules"],
                        compile=False)
    used = {json.dumps(k.schedule.to_dict(), sort_keys=True) for k in art.step.kernels.values()}
    chosen = {json.dumps(s, sort_keys=True) for s in rep["schedules"].values()}
    assert used & chosen  # at least the GEMMs' (groups of fused kernels keep defaults)
    assert art.payload.schedules == rep["schedules"]


@pytest.mark.parametrize("argv, message", [
    (["tune", MLP, "--simulate"], "--simulate applies to --target cuda"),
    (["tune", MLP, "--arch", "sm_90"], "--arch applies to --target cuda"),
    (["compile", MLP, "--simulate"], "--simulate applies to --target cuda"),
    (["train", MLP, "--simulate"], "--simulate applies to --target cuda"),
    (["compile", MLP, "--target", "cuda", "--emit=loops"], "--target cuda writes a CUDA"),
    (["tune", MLP, "--target", "cuda", "--simulate", "--cluster", "tcp://x:1"],
     "not supported with --target cuda"),
    (["train", MLP, "--target", "cuda", "--profile"], "not supported with --target cuda"),
])
def test_bad_combinations_are_usage_errors(argv, message, capsys):
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_bad_source_is_a_located_diagnostic(tmp_path, capsys):
    bad = tmp_path / "bad.nf"
    bad.write_text("model m {\n  param w: f32[4] = zeros\n  forward(x: f32[4]) {\n"
                   "    return x + undefined_name\n  }\n}\n")
    for cmd in (["compile", str(bad), "--target", "cuda", "-o", str(tmp_path / "b.so")],
                ["train", str(bad), "--target", "cuda", "--simulate"]):
        assert main(cmd) == 1
        err = capsys.readouterr().err
        assert "bad.nf:" in err and "Traceback" not in err, err
    assert not (tmp_path / "b.so").exists()


def test_a_cpu_library_is_not_a_cuda_model(tmp_path, capsys):
    lib = tmp_path / "cpu.so"
    assert main(["compile", MLP, "--set", "batch=4", "-o", str(lib)]) == 0
    capsys.readouterr()
    assert main(["train", str(lib), "--target", "cuda", "--simulate", "--max-steps", "1"]) == 1
    assert "is a CPU library" in capsys.readouterr().err


TINY = """import std.nn

model tiny(batch = 2, inputs = 8, classes = 4) {
  input  x: f32[batch, inputs]
  input  y: i32[batch]
  param  w: f32[inputs, classes] = glorot_uniform
  param  b: f32[classes] = zeros
  logits = linear(x, w, b)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
"""


def test_tune_on_a_device_records_under_its_category_and_compile_uses_it(
        tmp_path, capsys, monkeypatch):
    """The GPU path end to end, with the simulator behind the driver API (FakeDriver) as the
    device: NVRTC, resource checks, event timing, records in the cache under the device's
    category, and `nfc compile --target cuda` taking them. (The fake's times are the
    simulator's wall times: plumbing, not a benchmark.)"""
    _nvrtc_or_skip()
    import nfc.codegen.cuda.driver as drv
    from nfc.codegen.cuda.fakedriver import FakeDriver
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.gpu import cuda_device_category

    real = drv.Device
    monkeypatch.setattr(drv, "Device", lambda ordinal=0: real(ordinal, driver=FakeDriver({})))
    src = tmp_path / "tiny.nf"
    src.write_text(TINY)
    db = tmp_path / "t.sqlite"
    assert main(["tune", str(src), "--target", "cuda", "--function", "forward", "--trials",
                 "2", "--population", "2", "--patience", "1", "--db", str(db),
                 "--quiet"]) == 0
    cap = capsys.readouterr()
    assert "time us" in cap.out and "nfc simulator (FakeDriver), sm 9.0" in cap.err
    category = cuda_device_category(drv.Device())
    assert category["backend"] == "cuda" and category["compute_capability"] == "9.0"
    assert category["runtime"].startswith("nvrtc ")
    with TuningCache(db) as cache:
        from nfc.runtime.tuning.driver import build_model
        from nfc.runtime.tuning.gpu import gpu_schedule_choices

        chosen = gpu_schedule_choices(build_model(src), cache, category, ["forward"])
        assert len(chosen) >= 5  # every single compute of forward has a record
        assert not gpu_schedule_choices(build_model(src), cache,
                                        {**category, "device": "another GPU"}, ["forward"])
    out = tmp_path / "tiny.so"
    assert main(["compile", str(src), "--target", "cuda", "-o", str(out), "--db",
                 str(db)]) == 0
    err = capsys.readouterr().err
    assert "tuned for nfc simulator (FakeDriver)" in err
    from nfc.codegen.artifact.container import read_artifact
    from nfc.codegen.cuda.artifact import read_payload

    payload = read_payload(read_artifact(out).elf)
    assert payload.schedules  # stored with the file, and used by its kernels:
    stored = {json.dumps(s, sort_keys=True) for s in payload.schedules.values()}
    from nfc.runtime.cuda_load import build_cuda_module, cuda_artifact

    art = cuda_artifact(build_cuda_module(src), schedules=payload.schedules, compile=False)
    assert art.step.to_json() == json.loads(json.dumps(payload.step))
    used = {json.dumps(k.schedule.to_dict(), sort_keys=True)
            for k in art.step.kernels.values()}
    assert used & stored


@pytest.mark.skipif(_no_driver(), reason="no NVIDIA driver (scripts/gpu_check.sh runs it)")
def test_tune_on_the_gpu_records_measured_times(tmp_path, capsys):
    src = tmp_path / "tiny.nf"
    src.write_text(TINY)
    db = tmp_path / "t.sqlite"
    assert main(["tune", str(src), "--target", "cuda", "--function", "forward", "--trials",
                 "3", "--population", "3", "--patience", "1", "--db", str(db),
                 "--quiet"]) == 0
    assert "time us" in capsys.readouterr().out and db.exists()
    out = tmp_path / "tiny.so"
    assert main(["compile", str(src), "--target", "cuda", "-o", str(out), "--db",
                 str(db)]) == 0
    assert " tuned for " in capsys.readouterr().err
    assert main(["train", str(out), "--max-steps", "3", "--no-eval", "--quiet",
                 "--data", "synthetic"]) == 0
    assert "loss: " in capsys.readouterr().out


def test_checkpoints_resume_bit_exactly_on_the_simulator(tmp_path, capsys):
    src = tmp_path / "tiny.nf"
    src.write_text(TINY)
    common = [str(src), "--target", "cuda", "--simulate", "--data", "synthetic", "--no-eval",
              "--quiet"]
    whole, resumed, ck = tmp_path / "w.jsonl", tmp_path / "r.jsonl", tmp_path / "ck"
    assert main(["train", *common, "--max-steps", "4", "--metrics", str(whole)]) == 0
    assert main(["train", *common, "--max-steps", "2", "--checkpoint", str(ck),
                 "--every", "1"]) == 0
    assert main(["train", *common, "--max-steps", "4", "--checkpoint", str(ck), "--every",
                 "1", "--resume", "--metrics", str(resumed)]) == 0
    capsys.readouterr()
    assert _first_losses(whole)[2:] == _first_losses(resumed)  # steps 3 and 4, same bits
