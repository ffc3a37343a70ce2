"""benchmarks/cuda_step.py (the GPU training-step benchmark of scripts/gpu_check.sh) checked
without a GPU: on the simulator its nfc and PyTorch first losses agree, and without a driver it
says so and exits 1 instead of failing somewhere later."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="torch is not installed (optional test dependency)")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "cuda_step.py"


def _script():
    spec = importlib.util.spec_from_file_location("cuda_step_bench", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_simulated_step_matches_pytorch(tmp_path, capsys):
    out = tmp_path / "rec.json"
    assert _script().main(["mlp3", "--simulate", "--quick", "--json", str(out)]) == 0
    (rec,) = json.loads(out.read_text())
    assert rec["loss_agrees"] and rec["model"] == "mlp3"
    assert abs(rec["nfc_first_loss"] - rec["torch_first_loss"]) <= 1e-4 * rec["torch_first_loss"]
    assert "nfc_ms" not in rec  # no timing on the simulator
    assert "agree" in capsys.readouterr().out


def test_without_a_driver_it_says_so(capsys):
    from nfc.codegen.cuda.driver import Device, NoDriverError

    try:
        Device().close()
    except NoDriverError:
        pass
    else:
        pytest.skip("a GPU is present")
    assert _script().main(["mlp3"]) == 1
    assert "no NVIDIA driver" in capsys.readouterr().out
