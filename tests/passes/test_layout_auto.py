"""`layout{when=auto}` in the default build pipeline: the rule's decision per model, the
choice `nfc tune` records in the tuning cache and later builds use, the fallbacks, the
flags and located option errors.

The rule's two decisions are checked on models whose verdict does not depend on the host's
vector width (block 8 or 16): LeNet-5 (6-channel convolution: off) and the matrix capsule
network (one 32-channel convolution of the image: on). Tuned choices are recorded from
injected timings (`tune_layout(timer=...)`), so nothing here depends on machine speed.
"""

from __future__ import annotations

import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from laid_out_lib import check_laid_out_build

from nfc.blocked import is_blocked
from nfc.diagnostics import CompileError
from nfc.ir import Module
from nfc.passes.layout import auto_decision, conv_census, default_block
from nfc.passmanager import build_pipeline
from nfc.runtime import build
from nfc.runtime.build import build_module, frontend_module, load_model, pipeline_for
from nfc.runtime.tuning.layout import (
    cached_layout_choice,
    candidates,
    layout_category,
    layout_key,
    module_digest,
    tune_layout,
)

ROOT = Path(__file__).resolve().parents[2]
EX = ROOT / "examples"
LENET = (EX / "lenet5.nf", {"batch": 2})
CAPS = (EX / "capsule.nf", {"batch": 2})
#: The default pipeline up to (not including) apply-tuning: what decides the layout.
UP_TO_TUNING = "layout{when=auto},im2col,training-functions,inline,canonicalize,cse,dce"


def _blocked_params(module: Module) -> dict[str, Any]:
    f = module.func("train_step")
    return {a.name: at["nf.layout"] for a, at in zip(f.args, f.arg_attrs, strict=True)
            if is_blocked(at.get("nf.layout"))}


def _build(model: tuple[Path, dict[str, int]], pipeline: str = UP_TO_TUNING) -> tuple[Module,
                                                                                       Any]:
    return build_module(model[0], model[1], {}, pipeline)


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nfc", *args], capture_output=True,
                          text=True, check=False, cwd=ROOT, timeout=300)


def test_default_pipeline_decides_the_layout_first() -> None:
    assert build.BUILD_PIPELINE == ("layout{when=auto},im2col,training-functions,inline,"
                                    "canonicalize,cse,dce,apply-tuning,fuse")
    src = EX / "lenet5.nf"
    assert pipeline_for(src) == build.BUILD_PIPELINE
    assert pipeline_for(src, layout=False) == build.BUILD_PIPELINE.split(",", 1)[1]
    # off where the rule was not measured: CUDA builds, .nfir modules, --no-im2col
    assert not pipeline_for(src, target="cuda").startswith("layout")
    assert not pipeline_for("m.nfir").startswith("layout")
    assert not pipeline_for(src, im2col=False).startswith("layout")
    # an explicit -p keeps its layout pass
    assert pipeline_for(src, "layout{block=8},im2col", target="cuda") == "layout{block=8},im2col"
    r = _cli("compile", str(src), "--print-pipeline")
    assert r.returncode == 0 and r.stdout == build.BUILD_PIPELINE + "\n"
    r = _cli("train", str(src), "--print-pipeline", "--no-layout")
    assert r.returncode == 0 and not r.stdout.startswith("layout") and "im2col" in r.stdout
    r = _cli("compile", str(src), "--print-pipeline", "--target", "cuda")
    assert r.returncode == 0 and "layout" not in r.stdout


def test_the_rule_blocks_the_capsule_network_and_not_lenet5() -> None:
    lenet, _ = _build(LENET)
    caps, ctx = _build(CAPS)
    assert _blocked_params(lenet) == {}
    blocked = _blocked_params(caps)
    assert blocked and all(v["block"] == default_block() for v in blocked.values())
    assert ctx.remarks["layout"].startswith(f"block {default_block()}:")
    on, why = auto_decision(frontend_module(*CAPS), default_block())
    assert on and why.startswith("on:")
    on, why = auto_decision(frontend_module(*LENET), default_block())
    assert not on and "no multiple of" in why and "mixed layouts" in why
    # the same modules with the pass forced on and off
    assert _blocked_params(_build(LENET, UP_TO_TUNING.replace("when=auto", "block=8"))[0])
    assert not _blocked_params(_build(CAPS, UP_TO_TUNING.replace("auto", "never"))[0])


def test_rule_thresholds_on_census() -> None:
    """The census the rule reads: LeNet-5's two convolutions (6 and 16 channels, both dense
    windowed GEMMs on unblocked inputs); no convolution in an MLP: off."""
    convs = conv_census(frontend_module(*LENET))
    assert [c.out_channels for c in convs] == [6, 16]
    assert all(c.gemm for c in convs) and convs[0].from_arg and not convs[1].from_arg
    on, why = auto_decision(frontend_module(EX / "mlp.nf", {"batch": 2}), 16)
    assert not on and "no convolution" in why


def test_explain_prints_the_decision(tmp_path: Path) -> None:
    r = _cli("opt", str(EX / "lenet5.nf"), "--set", "batch=2", "-p",
             "layout{when=auto,explain=true}", "-o", str(tmp_path / "out.nfir"))
    assert r.returncode == 0, r.stderr
    assert "layout: off:" in r.stderr and "mixed layouts" in r.stderr


@pytest.mark.parametrize(("option", "needle"), [
    ("when=sometimes", "when must be one of auto, always, never"),
    ("block=wide", "block must be 'auto' or a positive integer"),
])
def test_bad_options_are_located_errors(option: str, needle: str) -> None:
    text = f"inline,layout{{{option}}}"
    with pytest.raises(CompileError, match=needle) as info:
        build_pipeline(text)
    loc = info.value.diagnostics[0].loc
    assert loc is not None and loc.col == text.index(option) + 1
    r = _cli("compile", str(EX / "lenet5.nf"), "-p", text, "--print-pipeline")
    assert r.returncode == 1 and needle in r.stderr and "Traceback" not in r.stderr
    assert f"1:{text.index(option) + 1}:" in r.stderr


def _fake_timer(fastest: str):
    """Timings in which `fastest` wins (the others 2x slower): a measurement injected."""
    return lambda choice, _round: 1e-3 if choice == fastest else 2e-3


def test_a_tuned_choice_is_recorded_and_used_by_later_builds(tmp_path: Path) -> None:
    db = tmp_path / "tuning.sqlite"
    settings = ["batch=2"]
    # the rule would block the capsule network; the (injected) measurement says off
    won, medians = tune_layout(CAPS[0], settings, db=db, timer=_fake_timer("off"), rounds=3)
    assert won == "off" and set(medians) == set(candidates())
    auto_db = UP_TO_TUNING.replace("when=auto", f"when=auto,db={db}")
    caps, ctx = _build(CAPS, auto_db)
    assert _blocked_params(caps) == {} and "nfc tune measured" in ctx.remarks["layout"]
    # LeNet-5 is off by the rule; a recorded block 8 turns it on with that block
    won, _ = tune_layout(LENET[0], settings, db=db, timer=_fake_timer("8"), rounds=3)
    assert won == "8"
    lenet, _ = _build(LENET, auto_db)
    blocked = _blocked_params(lenet)
    assert blocked and {v["block"] for v in blocked.values()} == {8}
    # an explicit block is kept: the record only turns the pass on or off
    lenet, _ = _build(LENET, auto_db.replace("when=auto", "when=auto,block=16"))
    assert {v["block"] for v in _blocked_params(lenet).values()} == {16}
    # another size of the model is another module: the rule again
    other, _ = build_module(LENET[0], {"batch": 3}, {}, auto_db)
    assert _blocked_params(other) == {}
    # the record is the cache's, under this CPU's category and the module's digest
    from nfc.runtime.tuning.cache import TuningCache

    with TuningCache(db) as cache:
        best = cache.best(layout_category(), layout_key(module_digest(frontend_module(*LENET))))
    assert best is not None and best.schedule == {"layout": 8}


def test_damaged_or_absent_records_fall_back_to_the_rule(tmp_path: Path) -> None:
    from nfc.runtime.tuning.cache import TuningCache

    db = tmp_path / "tuning.sqlite"
    auto_db = UP_TO_TUNING.replace("when=auto", f"when=auto,db={db}")
    # absent: no cache file
    assert _blocked_params(_build(CAPS, auto_db)[0])
    # an entry that is no valid choice (a block this nfc never offers, a foreign field)
    key = layout_key(module_digest(frontend_module(*CAPS)))
    with TuningCache(db) as cache:
        cache.put(layout_category(), key, {"layout": 7}, 1e-6)
        cache.put(layout_category(), key + "x", {"layout": "off"}, 1e-6)
    caps, ctx = _build(CAPS, auto_db)
    assert _blocked_params(caps) and "nfc tune" not in ctx.remarks["layout"]
    with TuningCache(db) as cache:
        cache.put(layout_category(), key, {"layout": "off", "extra": 1}, 1e-7)
    assert _blocked_params(_build(CAPS, auto_db)[0])
    # a valid record is read (the fastest: off) ...
    with TuningCache(db) as cache:
        cache.put(layout_category(), key, {"layout": "off"}, 1e-8)
    assert not _blocked_params(_build(CAPS, auto_db)[0])
    assert cached_layout_choice(key.split(":", 1)[1], db) == "off"
    # ... but not from a damaged file: the build goes on with the rule
    con = sqlite3.connect(db)
    con.execute("PRAGMA journal_mode=DELETE")
    con.close()
    for p in tmp_path.glob("tuning.sqlite-*"):
        p.unlink()
    data = bytearray(db.read_bytes())
    data[100:4096] = b"\xff" * (4096 - 100)
    db.write_bytes(bytes(data))
    assert cached_layout_choice(key.split(":", 1)[1], db) is None
    assert _blocked_params(_build(CAPS, auto_db)[0])


def test_blocked_default_build_matches_the_interpreter(tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The default build of the capsule network (blocked by the rule) against the
    interpreter, and checkpoints exchanged with the `--no-layout` build."""
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))  # no recorded choice
    settings = ["batch=2", "opt.lr=0.05"]
    laid = load_model(CAPS[0], settings=settings)
    plain = load_model(CAPS[0], settings=settings, layout=False)
    assert any(v.get("kind") == "blocked" for v in laid.metadata.get("views", []))
    assert not any(v.get("kind") == "blocked" for v in plain.metadata.get("views", []))
    opt = {"lr": 0.05}
    lmod, _ = build_module(CAPS[0], CAPS[1], opt, UP_TO_TUNING)
    pmod, _ = build_module(CAPS[0], CAPS[1], opt, pipeline_for(CAPS[0], layout=False,
                                                               tuning=False, fuse=False))
    assert _blocked_params(lmod) and not _blocked_params(pmod)
    f = lmod.func("train_step")
    rng = np.random.default_rng(3)
    inputs = [a for a, at in zip(f.args, f.arg_attrs, strict=True)
              if at.get("nf.role") == "input"]
    batches = []
    for _ in range(3):
        bt = {}
        for a in inputs:
            if np.dtype(a.dtype.numpy).kind in "iu":
                bt[a.name] = rng.integers(0, 2, a.shape).astype(a.dtype.numpy)
            else:
                bt[a.name] = rng.standard_normal(a.shape).astype(np.float32)
        batches.append(bt)
    laid.init(1)
    plain.init(1)
    check_laid_out_build(laid, plain, lmod, pmod, batches, tmp_path)


def test_nfc_tune_records_the_layout_choice(tmp_path: Path) -> None:
    """`nfc tune --layout only` measures every candidate and records each (the winner is
    whatever this machine measured: only its presence is checked); a model without a
    convolution has nothing to choose (a usage error, no traceback)."""
    from nfc.runtime.tuning.cache import TuningCache

    db = tmp_path / "t.sqlite"
    r = _cli("tune", str(CAPS[0]), "--set", "batch=2", "--layout", "only", "--db", str(db))
    assert r.returncode == 0, r.stderr
    assert "recorded:" in r.stderr
    key = layout_key(module_digest(frontend_module(*CAPS)))
    with TuningCache(db) as cache:
        entries = cache.entries(layout_category(), key, include_pruned=True)
    assert {str(e.schedule["layout"]) for e in entries} == set(candidates())
    assert cached_layout_choice(key.split(":", 1)[1], db) in candidates()
    r = _cli("tune", str(EX / "mlp.nf"), "--layout", "only", "--db", str(db))
    assert r.returncode == 1 and "no convolution" in r.stderr and "Traceback" not in r.stderr
    r = _cli("tune", str(CAPS[0]), "--no-layout", "--print-pipeline")
    assert r.returncode == 0 and r.stdout.startswith("im2col,")
