"""scripts/memory_table.py --batch-search: the binary search over batches, per memory option
(docs/memory.md "Batch doubling under a budget"), with a fake plan (no build)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import SimpleNamespace

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("memory_table", ROOT / "scripts/memory_table.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_batch_search_finds_the_largest_fitting_batch_of_every_option(tmp_path, monkeypatch,
                                                                     capsys):
    from nfc.diagnostics import CompileError, Diagnostic

    mt = _script()
    model = tmp_path / "m.nf"
    model.write_text("model m(batch = 16, width = 4) {\n}\n")
    #: bytes per sample of each option's (fake) plan; the budget is 16 samples of the default
    per_sample = {"": 1000, "remat": 800, "compress-activations,remat": 700}
    calls = []

    def fake_plan_of(path, middle, params=None):
        batch = params["batch"]
        calls.append((middle, batch))
        key = middle.split("{peak=")[0]
        if key == "remat" and batch == 20:  # a budget remat cannot meet is an error
            raise CompileError([Diagnostic("error", "memory budget cannot be met")])
        return SimpleNamespace(total=per_sample[key] * batch), 0.0, None

    monkeypatch.setattr(mt, "plan_of", fake_plan_of)
    mt.batch_search(str(model), 2.0)
    out = capsys.readouterr().out
    largest = {ln.split(f"{model} ")[1].split(":")[0]: int(ln.split("budget ")[1].split()[0])
               for ln in out.splitlines() if "largest batch within the budget" in ln}
    # 16,000 bytes: default 16; remat 20 would fit (20 * 800) but fails to build, so 19;
    # masks + remat 22 (22 * 700)
    assert largest == {"default": 16, "remat": 19, "masks+remat": 22}
    assert all(m.endswith("{peak=16000}") for m, _ in calls if m)  # the budget is passed
    assert max(b for _, b in calls) <= 32  # --max-factor 2


def test_batch_search_rejects_a_model_without_a_batch_parameter(tmp_path):
    mt = _script()
    model = tmp_path / "m.nf"
    model.write_text("model m(width = 4) {\n}\n")
    with pytest.raises(SystemExit, match="no `batch = N` parameter"):
        mt.batch_search(str(model), 2.0)
