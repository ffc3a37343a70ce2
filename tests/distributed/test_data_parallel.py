"""Data-parallel training over MPI (nfc.runtime.distributed, the data-parallel pass): R local
ranks with batch B/R each compute the parameters of one process with batch B (a batch-norm
model too, with `--bn sync`); a checkpoint written on 2 ranks resumes on 1. The models are
f64, so the comparison is `assert_close_f64` (whatever the order of the sums) against how far
the parameters moved.

One `mpiexec -n 2` launch (module fixture) trains both models: MPI start-up is the cost."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from nfc.runtime.distributed import have_mpi, mpiexec
from nfc.testing import assert_close_f64

pytest.importorskip("sklearn", reason="the tests train on scikit-learn's digits")
if not have_mpi() or mpiexec() is None:
    pytest.skip("the distributed extra is not installed (pip install 'nfc[distributed]': "
                "mpich and mpi4py)", allow_module_level=True)

HERE = Path(__file__).parent
MODELS = [str(HERE / "mlp64.nf"), str(HERE / "conv64.nf")]
BN = str(HERE / "bn64.nf")
B = 16
STEPS = 5


def _train_one(src: str, batch: int, steps: int, ckpt: Path | None = None,
               resume: bool = False) -> dict[str, np.ndarray]:
    from nfc.runtime.train import TrainConfig, train

    res = train(TrainConfig(source=src, data="digits", batch=batch, max_steps=steps, seed=0,
                            checkpoint=str(ckpt) if ckpt else None, resume=resume,
                            evaluate=False, progress=False, threads=1))
    assert res.model.step == steps
    return {k: v.copy() for k, v in res.model.tensors.items()}


def _initial(src: str, batch: int) -> dict[str, np.ndarray]:
    from nfc.runtime.build import load_model

    m = load_model(src, settings=[f"batch={batch}"])
    m.init(0)
    return {k: v.copy() for k, v in m.tensors.items()}


def _checkpoint(path: Path) -> tuple[int, dict[str, np.ndarray]]:
    from nfc.runtime.checkpoint import load_latest

    loaded = load_latest(str(path), None)
    assert loaded is not None, f"no checkpoint in {path}"
    return loaded.step, dict(loaded.tensors)


def _assert_same(ours: dict[str, np.ndarray], ref: dict[str, np.ndarray],
                 init: dict[str, np.ndarray], what: str) -> None:
    assert set(ours) == set(ref)
    for k in ref:
        if ref[k].dtype.kind != "f":  # Adam's step counter
            assert np.array_equal(ours[k], ref[k]), f"{what} {k}"
            continue
        moved = float(np.abs(ref[k] - init[k]).max()) if k in init else None
        assert_close_f64(ours[k], ref[k], f"{what} {k}", scale=moved or None)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dp2")
    env = dict(os.environ, OMP_NUM_THREADS="1")
    runs = [f"{m},local,{STEPS}" for m in MODELS] + [f"{BN},sync,{STEPS}", f"{BN},local,{STEPS}"]
    cmd = [mpiexec() or "mpiexec", "-n", "2", sys.executable, str(HERE / "_dp_ranks.py"),
           str(out), str(B // 2), *runs]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


@pytest.mark.parametrize("src", MODELS, ids=["mlp", "conv"])
def test_two_ranks_equal_one_process(two_ranks: Path, src: str) -> None:
    step, got = _checkpoint(two_ranks / f"{Path(src).stem}-local")
    assert step == STEPS
    ref = _train_one(src, B, STEPS)
    init = _initial(src, B)
    # the test can fail: the parameters did move, and a rank training alone (no all-reduce)
    # lands elsewhere
    assert any(np.abs(ref[k] - init[k]).max() > 1e-3 for k in init)
    _assert_same(got, ref, init, "2 ranks x B/2 vs 1 x B:")


def test_checkpoint_of_two_ranks_resumes_on_one(two_ranks: Path, tmp_path: Path) -> None:
    import shutil

    src = MODELS[0]
    ck = tmp_path / "ck"
    shutil.copytree(two_ranks / f"{Path(src).stem}-local", ck)
    resumed = _train_one(src, B, STEPS + 2, ck, resume=True)
    ref = _train_one(src, B, STEPS + 2)
    _assert_same(resumed, ref, _initial(src, B), "resumed on 1 rank:")


def test_resume_refuses_another_global_batch(two_ranks: Path, tmp_path: Path) -> None:
    import shutil

    from nfc.runtime.train import TrainError

    src = MODELS[0]
    ck = tmp_path / "ck"
    shutil.copytree(two_ranks / f"{Path(src).stem}-local", ck)
    with pytest.raises(TrainError, match="batch 16"):
        _train_one(src, B // 2, STEPS + 1, ck, resume=True)


def test_synced_batch_norm_two_ranks_equal_one_process(two_ranks: Path) -> None:
    """`--bn sync` is synchronised batch norm: every rank normalises with the statistics of
    the global batch, so after 5 steps the parameters, running statistics and optimizer state
    of 2 ranks x B/2 equal those of 1 process x B. `local` (each rank its half's statistics,
    PyTorch DDP without SyncBatchNorm) lands elsewhere: the test can fail."""
    ref = _train_one(BN, B, STEPS)
    init = _initial(BN, B)
    moved = {k: float(np.abs(ref[k] - init[k]).max()) for k in init}
    assert all(moved[k] > 1e-3 for k in ("k1", "g1", "m1", "v1"))
    step, synced = _checkpoint(two_ranks / "bn64-sync")
    assert step == STEPS
    _assert_same(synced, ref, init, "bn=sync, 2 ranks x B/2 vs 1 x B:")
    _, local = _checkpoint(two_ranks / "bn64-local")
    for k in ("k1", "g1", "m1", "v1"):
        assert float(np.abs(local[k] - ref[k]).max()) > 1e-4 * moved[k], f"local {k}"
