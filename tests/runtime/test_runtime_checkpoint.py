"""Checkpoint files (nfc.runtime.checkpoint): exact round trips of every dtype and shape the
trainer persists, verification of damaged and foreign files, confinement to the directory,
pruning and stale temporaries. No model is compiled here: see test_runtime_resume.py and
tests/fault for training runs."""

from __future__ import annotations

import hashlib
import io
import json
import os
import tempfile
import time
from pathlib import Path

import hypothesis.extra.numpy as hnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfc import fsutil
from nfc.runtime import checkpoint as ckpt
from nfc.runtime.loader import _DTYPES

#: Every dtype a model tensor can have (the loader's table: f16, f32, f64, i1, i32, i64).
TRAINER_DTYPES = sorted({np.dtype(t) for t in _DTYPES.values()}, key=str)

_names = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_.:]{0,12}", fullmatch=True),
    # keywords of np.savez, which used to swallow tensors named like them
    st.sampled_from(["file", "allow_pickle", "args", "kwds", "step", "x.npy"]))


@st.composite
def _tensor(draw: st.DrawFn) -> np.ndarray:
    dtype = draw(st.sampled_from(TRAINER_DTYPES))
    shape = draw(hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=4))
    arr = draw(hnp.arrays(dtype, shape))  # NaNs, infinities, -0.0 and subnormals included
    if arr.ndim >= 2 and draw(st.booleans()):
        arr = arr.T  # not C-contiguous, as a view of a model tensor could be
    return arr


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    """Identical dtype, shape and bytes (NaN payloads and signed zeros included)."""
    return (a.dtype == b.dtype and a.shape == b.shape
            and np.ascontiguousarray(a).tobytes() == np.ascontiguousarray(b).tobytes())


@settings(max_examples=150, deadline=None)
@given(st.dictionaries(_names, _tensor(), min_size=0, max_size=5),
       st.integers(0, 10**10))
def test_save_load_round_trip_is_exact(tensors: dict[str, np.ndarray], step: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = ckpt.save(tmp, step, tensors, {"seed": 1, "order": {"pos": 3}})
        expect = {k: (v.shape, v.dtype) for k, v in tensors.items()}
        got, info = ckpt.load(path, expect)
        assert got.keys() == tensors.keys()
        for k, v in tensors.items():
            assert _same(got[k], v), (k, v.dtype, v.shape, got[k].dtype, got[k].shape)
        assert info["step"] == step and info["seed"] == 1 and info["order"] == {"pos": 3}
        found = ckpt.load_latest(tmp, expect, warn=pytest.fail)
        assert found is not None and found.path == path and found.step == step


def test_scalars_stay_scalars() -> None:
    """Adam's step counter is an i64 scalar; a 1-d one does not fit the model."""
    t = {"step": np.array(7, np.int64), "lr": np.array(0.5, np.float32)}
    data = ckpt.npz_bytes(t)
    with np.load(io.BytesIO(data)) as z:
        assert z["step"].shape == () and z["lr"].shape == ()
    assert data == ckpt.npz_bytes({k: v.copy() for k, v in t.items()}), "deterministic bytes"


def _small(tmp_path: Path, steps: tuple[int, ...] = (1, 2, 3), keep: int = 3
           ) -> dict[int, dict[str, np.ndarray]]:
    saved = {}
    for s in steps:
        saved[s] = {"w": np.full((2, 3), s, np.float32), "step": np.array(s, np.int64)}
        ckpt.save(tmp_path, s, saved[s], {"seed": 0}, keep=keep)
    return saved


def test_every_single_bit_flip_of_the_json_is_detected(tmp_path: Path) -> None:
    _small(tmp_path, (1,))
    path = tmp_path / "ckpt-000000001.json"
    good = path.read_bytes()
    for pos in range(len(good)):
        for bit in range(8):
            bad = bytearray(good)
            bad[pos] ^= 1 << bit
            path.write_bytes(bytes(bad))
            with pytest.raises(ckpt.CheckpointCorrupt, match="ckpt-000000001"):
                ckpt.load(path)
    path.write_bytes(good)
    assert ckpt.load(path)[1]["step"] == 1


@pytest.mark.parametrize("cut", [0, 1, 100, -1])
def test_truncated_files_are_reported_with_their_names(tmp_path: Path, cut: int) -> None:
    _small(tmp_path, (1,))
    for name, match in (("ckpt-000000001.npz", "does not match the hash"),
                        ("ckpt-000000001.json", "not valid JSON")):
        f = tmp_path / name
        good = f.read_bytes()
        f.write_bytes(good[:cut])
        with pytest.raises(ckpt.CheckpointCorrupt, match=match) as exc:
            ckpt.load(tmp_path / "ckpt-000000001.json")
        assert name in str(exc.value)
        f.write_bytes(good)


def test_npz_bit_flips_are_detected(tmp_path: Path) -> None:
    _small(tmp_path, (1,))
    npz = tmp_path / "ckpt-000000001.npz"
    good = npz.read_bytes()
    g = np.random.default_rng(0)
    for pos in g.choice(len(good), size=min(200, len(good)), replace=False):
        bad = bytearray(good)
        bad[pos] ^= 1 << int(g.integers(8))
        npz.write_bytes(bytes(bad))
        with pytest.raises(ckpt.CheckpointCorrupt, match="does not match the hash"):
            ckpt.load(tmp_path / "ckpt-000000001.json")


def _rehash(path: Path, meta: dict) -> None:
    """Rewrite a checkpoint JSON with a valid own hash (a crafted or buggy file)."""
    meta.pop("meta_sha256", None)
    meta["meta_sha256"] = hashlib.sha256(ckpt._canonical(meta)).hexdigest()
    path.write_text(json.dumps(meta))


def test_consistent_but_wrong_files_are_refused(tmp_path: Path) -> None:
    """Files whose hashes match but whose content is not what a checkpoint holds."""
    _small(tmp_path, (1,))
    path = tmp_path / "ckpt-000000001.json"
    npz = tmp_path / "ckpt-000000001.npz"
    meta = json.loads(path.read_text())
    # the JSON records another shape than the npz holds
    bad = json.loads(json.dumps(meta))
    bad["tensors"][0]["shape"] = [3, 2]
    _rehash(path, bad)
    with pytest.raises(ckpt.CheckpointCorrupt, match=r"holds 'w' as float32\[2, 3\]"):
        ckpt.load(path)
    # an npz that is no zip archive, and one holding a pickled object, with matching hashes
    buf = io.BytesIO()
    np.save(buf, np.array([{"a": 1}], dtype=object), allow_pickle=True)
    for payload in (b"not a zip archive", buf.getvalue()):
        npz.write_bytes(payload)
        bad = json.loads(json.dumps(meta))
        bad["sha256"] = hashlib.sha256(payload).hexdigest()
        _rehash(path, bad)
        with pytest.raises(ckpt.CheckpointCorrupt, match="not a readable npz"):
            ckpt.load(path)
    # a JSON whose step is not its name's
    bad = json.loads(json.dumps(meta))
    bad["step"] = 2
    _rehash(path, bad)
    with pytest.raises(ckpt.CheckpointCorrupt, match="records step 2"):
        ckpt.load(path)


@pytest.mark.parametrize("target,why", [
    ("../../../etc/passwd", "outside the checkpoint directory"),
    ("/etc/passwd", "outside the checkpoint directory"),
    ("..", "outside the checkpoint directory"),
    ("sub/ckpt-000000001.json", "outside the checkpoint directory"),
    ("ckpt-1.npz", "not a checkpoint file name"),
    (7, "names no checkpoint")])
def test_latest_json_is_confined_to_the_directory(tmp_path: Path, target: object,
                                                  why: str) -> None:
    d = tmp_path / "ck"
    _small(d, (1, 2))
    (d / "sub").mkdir()
    (d / "sub" / "ckpt-000000001.json").write_text("{}")
    (d / "latest.json").write_text(json.dumps({"checkpoint": target}))
    with pytest.raises(ckpt.CheckpointCorrupt, match="latest.json") as exc:
        ckpt.latest(d)
    assert why in str(exc.value)
    warnings: list[str] = []
    found = ckpt.load_latest(d, warn=warnings.append)
    assert found is not None and found.step == 2, "falls back to the newest intact one"
    assert why in warnings[0] and "latest.json" in warnings[0], warnings
    assert any("falling back" in w for w in warnings)


def test_npz_name_is_confined_and_links_out_are_refused(tmp_path: Path) -> None:
    d = tmp_path / "ck"
    _small(d, (1,))
    path = d / "ckpt-000000001.json"
    meta = json.loads(path.read_text())
    outside = tmp_path / "outside.npz"
    outside.write_bytes((d / "ckpt-000000001.npz").read_bytes())
    for name in ("../outside.npz", str(outside)):
        _rehash(path, dict(meta, npz=name))
        with pytest.raises(ckpt.CheckpointCorrupt, match="outside the checkpoint directory"):
            ckpt.load(path)
    _rehash(path, dict(meta))
    (d / "ckpt-000000001.npz").unlink()
    (d / "ckpt-000000001.npz").symlink_to(outside)
    with pytest.raises(ckpt.CheckpointCorrupt, match="is a link to"):
        ckpt.load(path)


def test_fallback_order_and_no_intact_checkpoint(tmp_path: Path) -> None:
    saved = _small(tmp_path, (1, 2, 3))
    (tmp_path / "ckpt-000000003.npz").write_bytes(b"")
    (tmp_path / "ckpt-000000002.json").write_text("{")
    warnings: list[str] = []
    found = ckpt.load_latest(tmp_path, warn=warnings.append)
    assert found is not None and found.step == 1
    assert np.array_equal(found.tensors["w"], saved[1]["w"])
    assert "ckpt-000000003.npz" in warnings[0] and "ckpt-000000002.json" in warnings[1]
    assert "falling back" in warnings[2] and "ckpt-000000001.json" in warnings[2]
    (tmp_path / "ckpt-000000001.npz").write_bytes(b"junk")
    with pytest.raises(ckpt.CheckpointCorrupt, match="no intact checkpoint") as exc:
        ckpt.load_latest(tmp_path, warn=lambda s: None)
    for s in (1, 2, 3):  # every problem is named
        assert f"ckpt-00000000{s}" in str(exc.value)
    assert ckpt.load_latest(tmp_path / "nothing") is None


def test_model_mismatch_is_not_a_fallback(tmp_path: Path) -> None:
    _small(tmp_path, (1, 2))
    expect = {"w": ((2, 3), np.dtype(np.float32)), "step": ((), np.dtype(np.int64))}
    assert ckpt.load_latest(tmp_path, expect, warn=pytest.fail) is not None
    for bad, match in ((dict(expect, w=((3, 2), np.dtype(np.float32))),
                        r"'w' must be float32\[3, 2\], the checkpoint has float32\[2, 3\]"),
                       (dict(expect, step=((1,), np.dtype(np.int64))), r"'step' must be"),
                       (dict(expect, w_m=((2, 3), np.dtype(np.float32))), "lacks 'w_m'"),
                       ({"w": expect["w"]}, "holds 'step', which this model does not have")):
        with pytest.raises(ckpt.CheckpointMismatch, match=match):
            ckpt.load_latest(tmp_path, bad, warn=pytest.fail)
    # what evaluation asks: optional optimizer state, extra tensors ignored
    tensors, _ = ckpt.load(tmp_path / "ckpt-000000002.json",
                           {"w": expect["w"], "w_mom": expect["w"]}, extra_ok=True,
                           optional={"w_mom"})
    assert set(tensors) == {"w", "step"}


def test_format_1_checkpoints_still_load_with_their_scalars(tmp_path: Path) -> None:
    """What nfc wrote before format 2: np.savez (0-d arrays saved 1-d), no JSON hash."""
    t = {"w": np.arange(6, dtype=np.float32).reshape(2, 3), "step": np.array(4, np.int64)}
    buf = io.BytesIO()
    np.savez(buf, **{k: np.ascontiguousarray(v) for k, v in t.items()})
    data = buf.getvalue()
    (tmp_path / "ckpt-000000004.npz").write_bytes(data)
    meta = {"format": 1, "step": 4, "npz": "ckpt-000000004.npz", "seed": 0,
            "sha256": hashlib.sha256(data).hexdigest(),
            "tensors": [{"name": k, "shape": list(v.shape), "dtype": str(v.dtype)}
                        for k, v in t.items()]}
    (tmp_path / "ckpt-000000004.json").write_text(json.dumps(meta))
    (tmp_path / "latest.json").write_text(json.dumps({"checkpoint": "ckpt-000000004.json"}))
    found = ckpt.load_latest(tmp_path, {k: (v.shape, v.dtype) for k, v in t.items()})
    assert found is not None and found.tensors["step"].shape == ()
    assert all(_same(found.tensors[k], v) for k, v in t.items())


def test_pruning_keeps_the_newest_and_drops_superseded(tmp_path: Path) -> None:
    _small(tmp_path, (1, 2, 3, 4), keep=2)
    steps = sorted(int(p.name[5:14]) for p in tmp_path.glob("ckpt-*.json"))
    assert steps == [3, 4] and len(list(tmp_path.glob("ckpt-*.npz"))) == 2
    # a run started again (or resumed past damaged ones) replaces what came after it,
    # so `keep=1` never leaves only a newer, damaged checkpoint
    (tmp_path / "ckpt-000000009.npz").write_bytes(b"orphan of a killed writer")
    ckpt.save(tmp_path, 2, {"w": np.zeros(2, np.float32)}, keep=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "ckpt-000000002.json", "ckpt-000000002.npz", "latest.json"]
    _small(tmp_path, (5, 6, 7), keep=0)  # 0 keeps all
    assert len(list(tmp_path.glob("ckpt-*.json"))) == 4


def test_stale_temporaries_are_removed_when_saving(tmp_path: Path) -> None:
    fresh = tmp_path / ".ckpt-000000001.npz.abc123.nfctmp"
    old = [tmp_path / ".latest.json.x1y2z3.nfctmp", tmp_path / ".latest.json.4242.tmp",
           tmp_path / ".ckpt-000000003.npz.4242.tmp"]
    keep = tmp_path / "notes.tmp"
    for p in [fresh, keep, *old]:
        p.write_bytes(b"partial")
    past = time.time() - ckpt.STALE_TMP_S - 10
    for p in [keep, *old]:
        os.utime(p, (past, past))
    _small(tmp_path, (1,))
    assert fresh.exists(), "a live writer's temporary stays"
    assert keep.exists(), "files nfc did not create stay"
    assert not any(p.exists() for p in old)


def test_save_uses_unique_temporaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every file goes through nfc.fsutil (mkstemp names), never `<name>.<pid>.tmp`."""
    written: list[str] = []
    real = fsutil.atomic_write

    def spy(path: os.PathLike[str], data: bytes, mode: int = 0o644) -> None:
        written.append(Path(path).name)
        real(path, data, mode)

    monkeypatch.setattr(fsutil, "atomic_write", spy)
    _small(tmp_path, (1,))
    assert written == ["ckpt-000000001.npz", "ckpt-000000001.json", "latest.json"]


def test_unwritable_directory_is_a_checkpoint_error(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(ckpt.CheckpointError, match="cannot write checkpoint"):
        ckpt.save(blocker / "ck", 1, {"w": np.zeros(1, np.float32)})
    with pytest.raises(ckpt.CheckpointError, match="not a checkpoint directory"):
        ckpt.load_latest(blocker)
