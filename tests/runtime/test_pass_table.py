"""benchmarks/pass_table.py: the pass on/off table of issue 12 runs end to end on a tiny model
with one pass, skips a pass that is not registered (saying so), refuses a malformed pass list
with a located message, and builds each variant's pipeline as the pass is meant to be used."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "pass_table.py"


def _script():  # noqa: ANN202
    spec = importlib.util.spec_from_file_location("pass_table", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pass_table", mod)  # dataclasses look their module up there
    spec.loader.exec_module(sys.modules["pass_table"])
    return sys.modules["pass_table"]


def _run(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True,
                          cwd=ROOT, timeout=timeout)


def test_variant_pipelines() -> None:
    from nfc.passes.parallel_fusion import with_param_layout
    from nfc.runtime.build import BUILD_PIPELINE

    said: list[str] = []
    vs = _script().variants("swap-operands,param-layout,parallel-fusion{max-width=2},"
                            "no-such-pass", BUILD_PIPELINE, said.append)
    by = {v.name: v.pipeline for v in vs}
    assert list(by) == ["default", "swap-operands", "param-layout",
                        "parallel-fusion{max-width=2}", "all"]
    assert by["default"] == BUILD_PIPELINE
    assert by["swap-operands"] == BUILD_PIPELINE.replace("apply-tuning",
                                                         "swap-operands,apply-tuning")
    assert by["param-layout"] == with_param_layout(BUILD_PIPELINE)
    assert "dce,parallel-fusion{max-width=2},canonicalize,cse,dce,apply-tuning" in \
        by["parallel-fusion{max-width=2}"]
    assert all(p in by["all"] for p in ("swap-operands", "parallel-fusion{layout=true}",
                                        "parallel-fusion{max-width=2}"))
    assert any("skipping 'no-such-pass'" in s and "not registered" in s for s in said)


def test_one_tiny_model_one_pass(tmp_path: Path) -> None:
    """MLP-3 at its smoke size, swap-operands on and off, one thread; the baselines' times
    read from an `nfc bench --json` file (PyTorch eager's given, JAX's missing)."""
    out = tmp_path / "table.jsonl"
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"model": "mlp3", "framework": "torch", "threads": 1,
                                 "status": "ok", "step_ms": 7.5}) + "\n"
                     + json.dumps({"model": "mlp3", "framework": "nfc", "threads": 1,
                                   "status": "ok", "step_ms": 1.0}) + "\n")
    r = _run("mlp3", "--quick", "--threads", "1", "--frameworks", "torch,jax", "--baselines",
             str(bench), "--passes", "swap-operands", "--rounds", "2", "--min-time", "0.05",
             "--warmup", "0", "--json", str(out))
    assert r.returncode == 0, r.stderr[-2000:]
    assert "| model | threads | default (ms) | swap-operands | PyTorch eager | JAX |" in r.stdout
    recs = [json.loads(line) for line in out.read_text().splitlines()]
    by = {rec["variant"]: rec for rec in recs}
    assert set(by) == {"default", "swap-operands", "torch", "jax"}  # one pass: no "all"
    for rec in (by["default"], by["swap-operands"]):
        assert rec["status"] == "ok" and rec["step_ms"] > 0 and rec["steps"] >= 2
    assert by["jax"]["status"] == "missing"
    row = next(line for line in r.stdout.splitlines() if line.startswith("| mlp3 | 1 |"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[4] == f"{7.5 / by['default']['step_ms']:.2f}" and cells[5] == "missing"
    # both builds start from the same state and inputs: the first step's loss agrees
    assert by["swap-operands"]["first_loss"] == pytest.approx(by["default"]["first_loss"],
                                                              rel=1e-4)
    assert "swap-operands,apply-tuning" in by["swap-operands"]["pipeline"]


def test_unregistered_pass_is_skipped_and_bad_syntax_refused() -> None:
    r = _run("no-such-model", "--passes", "no-such-pass")
    assert r.returncode == 1 and "no-such-model" in r.stderr and "Traceback" not in r.stderr
    r = _run("mlp3", "--passes", "swap-operands{", "--frameworks", "none")
    assert r.returncode == 1 and "--passes" in r.stderr and "Traceback" not in r.stderr
    assert "expected" in r.stderr
