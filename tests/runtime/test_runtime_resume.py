"""Resuming training from checkpoints with every optimizer the autodiff pass builds (SGD plain,
with momentum, Nesterov, dampening, weight decay and clipping; Adam with and without weight
decay; AdamW): the resumed run is bit-identical to an uninterrupted one. And `nfc train` /
`nfc run --checkpoint` from the command line with Adam (its scalar step counter), and bad
checkpoints as user errors (exit 1), never internal ones."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from runtime_lib import MLP_DIGITS, built_library

from nfc.cli import main
from nfc.runtime import checkpoint as ckpt
from nfc.runtime.train import TrainConfig, TrainError, TrainResult, train

TINY = str(Path(__file__).parent / "models" / "tiny.nf")

#: (settings, optimizer-state tensors the variant must have). tiny.nf says
#: sgd(lr = 0.1, momentum = 0.5); `opt.name=` another optimizer starts from its defaults.
OPTIMIZERS = {
    "sgd": (("opt.momentum=0",), set()),
    "momentum": ((), {"w_mom", "b_mom"}),
    "nesterov": (("opt.momentum=0.9", "opt.nesterov=true"), {"w_mom", "b_mom"}),
    "sgd-decay-dampening": (("opt.weight_decay=0.01", "opt.dampening=0.1"), {"w_mom"}),
    "sgd-clip": (("opt.clip_norm=0.5",), {"w_mom"}),
    "adam": (("opt.name=adam",), {"w_m", "w_v", "b_m", "b_v", "step"}),
    "adam-decay": (("opt.name=adam", "opt.weight_decay=0.01"), {"w_m", "w_v", "step"}),
    "adamw": (("opt.name=adamw",), {"w_m", "w_v", "step"}),
    "adamw-clip": (("opt.name=adamw", "opt.clip_norm=1.0"), {"w_m", "w_v", "step"}),
}

#: tiny.nf has batch 16: 89 batches an epoch on digits, so the run crosses an epoch boundary
#: and the checkpoint it resumes from lies mid-epoch.
TOTAL, SPLIT, EVERY = 120, 50, 7


def _run(lib: str, d: Path, max_steps: int, resume: bool = False,
         log: list[str] | None = None, overwrite: bool = False) -> TrainResult:
    logs = log if log is not None else []
    return train(TrainConfig(source=lib, data="digits", epochs=10, seed=3, max_steps=max_steps,
                             checkpoint=str(d), every=EVERY, resume=resume, threads=1,
                             evaluate=False, progress=False, log=logs.append,
                             overwrite=overwrite))


def _assert_identical(a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert a[name].tobytes() == b[name].tobytes(), name


@pytest.mark.parametrize("variant", sorted(OPTIMIZERS))
def test_resume_is_bit_identical_with_every_optimizer(variant: str, tmp_path: Path) -> None:
    settings, opt_state = OPTIMIZERS[variant]
    lib = built_library(TINY, settings)
    ref = _run(lib, tmp_path / "ref", TOTAL)
    roles = {n: s.role for n, s in ref.model.specs.items()}
    assert opt_state <= {n for n, r in roles.items() if r == "opt_state"}, roles
    first = _run(lib, tmp_path / "run", SPLIT)
    assert first.steps == SPLIT
    log: list[str] = []
    resumed = _run(lib, tmp_path / "run", TOTAL, resume=True, log=log)
    assert any(f"(step {SPLIT}," in x and "resumed from" in x for x in log), log
    assert resumed.steps == TOTAL and resumed.losses == ref.losses[SPLIT:]
    _assert_identical(ref.model.tensors, resumed.model.tensors)
    if "step" in opt_state:  # the scalar counter continued instead of restarting
        assert resumed.model.tensors["step"].shape == () and int(
            resumed.model.tensors["step"]) == TOTAL
    # and what the checkpoints hold is what the models hold
    last = ckpt.load_latest(tmp_path / "run", warn=pytest.fail)
    assert last is not None and last.step == TOTAL
    _assert_identical(last.tensors, ref.model.tensors)


@pytest.fixture(scope="module")
def adam_digits() -> str:
    return built_library(str(MLP_DIGITS), ("opt.name=adam",))


def _train_cli(lib: str, d: Path, steps: int, *extra: str) -> list[str]:
    return ["train", lib, "--data", "digits", "--max-steps", str(steps), "--every", "10",
            "--checkpoint", str(d), "--threads", "1", "--quiet", *extra]


def test_adam_train_resume_and_run_from_the_command_line(adam_digits: str, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]
                                                         ) -> None:
    """The reported failure: `tensor 'step' must be int64[], got int64[1]`."""
    assert main(_train_cli(adam_digits, tmp_path / "ref", 40)) == 0
    assert main(_train_cli(adam_digits, tmp_path / "A", 20)) == 0
    capsys.readouterr()
    assert main(_train_cli(adam_digits, tmp_path / "A", 40, "--resume")) == 0
    out, err = capsys.readouterr()
    assert "resumed from" in err and "(step 20," in err, err
    a = ckpt.load_latest(tmp_path / "ref", warn=pytest.fail)
    b = ckpt.load_latest(tmp_path / "A", warn=pytest.fail)
    assert a is not None and b is not None and a.step == b.step == 40
    _assert_identical(a.tensors, b.tensors)
    acc = float(out.split("test accuracy: ")[1].split("%")[0])
    assert main(["run", adam_digits, "--data", "digits", "--checkpoint", str(tmp_path / "A"),
                 "--json"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert abs(res["accuracy"] * 100 - acc) < 0.006  # printed with two decimals
    # the model compiled with its own optimizer (SGD momentum) evaluates the Adam checkpoint:
    # evaluation reads parameters, not optimizer state
    sgd = built_library(str(MLP_DIGITS))
    assert main(["run", sgd, "--data", "digits", "--json", "--checkpoint",
                 str(tmp_path / "A" / "ckpt-000000040.json")]) == 0
    assert json.loads(capsys.readouterr().out)["accuracy"] == res["accuracy"]


def _user_error(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "internal error" not in err and "Traceback" not in err, err
    return err


def test_bad_checkpoints_are_user_errors(adam_digits: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    d = tmp_path / "ck"
    assert main(_train_cli(adam_digits, d, 30)) == 0
    capsys.readouterr()
    # another optimizer's model: a clear mismatch, not a fallback to older checkpoints
    sgd = built_library(str(MLP_DIGITS))
    err = _user_error(_train_cli(sgd, d, 40, "--resume"), capsys)
    assert "does not fit this model" in err and "'w1_mom'" in err and "warning" not in err
    # every checkpoint's npz damaged: each named with its problem, no intact one
    for npz in d.glob("ckpt-*.npz"):
        raw = bytearray(npz.read_bytes())
        raw[len(raw) // 2] ^= 0x10
        npz.write_bytes(bytes(raw))
    err = _user_error(_train_cli(adam_digits, d, 40, "--resume"), capsys)
    assert "no intact checkpoint" in err and "does not match the hash" in err
    assert "ckpt-000000030.npz" in err and "ckpt-000000010.npz" in err
    err = _user_error(["run", adam_digits, "--data", "digits", "--checkpoint",
                       str(d / "ckpt-000000030.json")], capsys)
    assert "ckpt-000000030.npz' does not match the hash" in err
    # latest.json pointing outside: refused, and with nothing intact, an error
    (d / "latest.json").write_text(json.dumps({"checkpoint": "../../../etc/passwd"}))
    err = _user_error(["run", adam_digits, "--data", "digits", "--checkpoint", str(d)], capsys)
    assert "outside the checkpoint directory" in err
    _user_error(["run", adam_digits, "--checkpoint", str(tmp_path / "nothing")], capsys)
    _user_error(["train", adam_digits, "--keep", "-1", "--checkpoint", str(d)], capsys)


def test_fresh_run_into_a_used_directory_is_refused(tmp_path: Path) -> None:
    lib = built_library(TINY)
    _run(lib, tmp_path / "ck", 30)
    before = sorted((tmp_path / "ck").iterdir())
    with pytest.raises(TrainError, match="--overwrite-checkpoints"):
        _run(lib, tmp_path / "ck", 10)
    assert sorted((tmp_path / "ck").iterdir()) == before


def test_fresh_run_into_a_used_directory_with_overwrite_warns_and_replaces(
        tmp_path: Path) -> None:
    lib = built_library(TINY)
    _run(lib, tmp_path / "ck", 30)
    log: list[str] = []
    _run(lib, tmp_path / "ck", 10, log=log, overwrite=True)
    assert any("already holds checkpoints" in x for x in log), log
    names = sorted(p.name for p in (tmp_path / "ck").glob("ckpt-*.json"))
    assert names == ["ckpt-000000007.json", "ckpt-000000010.json"], names
