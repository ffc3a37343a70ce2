"""The CUDA artifact (`nfc compile --target cuda -o model.so`): one sealed file, checked before
use, opened by `nfc.load` as a CudaModel (on the simulator here: no GPU on these machines)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nfc.codegen.artifact.container import CUDA_MAGIC, FOOTER, read_artifact
from nfc.codegen.cuda.artifact import read_payload
from nfc.runtime.loader import ArtifactError, load, read_metadata
from nfc.testing import assert_close_f64, widen

MLP = str(Path(__file__).resolve().parents[2] / "examples" / "mlp.nf")


def _nvrtc_or_skip() -> None:
    from nfc.codegen.cuda import nvrtc

    pytest.importorskip("cuda.bindings.nvrtc")
    try:
        nvrtc.nvrtc_version()
    except nvrtc.CudaToolchainError as exc:
        pytest.skip(str(exc))


def _driver_present() -> bool:
    from nfc.codegen.cuda.driver import Device, NoDriverError
    from nfc.codegen.cuda.nvrtc import CudaToolchainError

    try:
        Device().close()
    except (NoDriverError, CudaToolchainError):
        return False
    return True


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """The MLP (batch 4) widened to f64, as a CUDA artifact file, and its module."""
    _nvrtc_or_skip()
    from nfc.runtime.cuda_load import build_cuda_module, cuda_artifact

    module = widen(build_cuda_module(MLP, ["batch=4"]))
    art = cuda_artifact(module)
    path = tmp_path_factory.mktemp("cuda-art") / "mlp.so"
    art.write(str(path))
    return path, module, art


def test_the_file_is_sealed_with_images_step_and_metadata(built):
    path, _, art = built
    sealed = read_artifact(path)
    assert sealed.kind == "cuda" and sealed.elf.startswith(CUDA_MAGIC)
    payload = read_payload(sealed.elf)
    assert set(payload.images) == {"sm_80", "sm_90", "ptx"}
    assert payload.images["sm_80"].startswith(b"\x7fELF")  # cubins are ELF images
    assert payload.images["sm_90"].startswith(b"\x7fELF")
    assert b".target sm_90" in payload.images["ptx"]
    assert payload.step == json.loads(json.dumps(art.step.to_json()))
    meta = read_metadata(path)  # the CPU artifact's metadata reader, unchanged
    assert meta["target"]["kind"] == "cuda"
    assert set(meta["functions"]) >= {"forward", "train_step"}
    assert meta == sealed.metadata == json.loads(json.dumps(art.metadata))


@pytest.mark.parametrize("where", ["simulator", "gpu"])
def test_round_trip_trains_like_the_cpu(built, monkeypatch, tmp_path, where):
    from nfc.runtime.build import build_library
    from nfc.runtime.cuda_model import CudaModel

    path, module, _ = built
    if where == "simulator":
        monkeypatch.setenv("NFC_CUDA_SIMULATE", "1")
    elif not _driver_present():
        pytest.skip("no NVIDIA driver on this machine (scripts/gpu_check.sh runs it on one)")
    else:
        monkeypatch.delenv("NFC_CUDA_SIMULATE", raising=False)
    gpu = load(path)
    assert isinstance(gpu, CudaModel) and gpu.path == str(path)
    cpu_path = tmp_path / "cpu.so"
    build_library(module, str(cpu_path), use_cache=False)
    cpu = load(cpu_path)
    gpu.init(0)
    cpu.init(0)
    start = cpu.state_dict()
    init = gpu.state_dict()
    for k, v in start.items():  # the same initialisers (the host's, within rounding)
        assert_close_f64(init[k], v, k)
    gpu.load_state_dict(start)  # then exactly the same start
    rng = np.random.default_rng(0)
    for _ in range(2):
        x = rng.standard_normal((4, 784))
        y = rng.integers(0, 10, 4).astype(np.int32)
        g, c = gpu.train_step(x=x, y=y), cpu.train_step(x=x, y=y)
        assert_close_f64(g["loss"], c["loss"], "loss")
        assert_close_f64(g["logits"], c["logits"], "logits")
    assert gpu.step == cpu.step == 2
    end_g, end_c = gpu.state_dict(), cpu.state_dict()
    for k, v in end_c.items():
        moved = float(np.abs(v - start[k]).max())
        assert moved > 0, k  # every parameter and momentum moved
        assert_close_f64(end_g[k], v, k, scale=moved)
    gpu.close()


def _corrupt(src: Path, dst: Path, how: str) -> Path:
    data = bytearray(src.read_bytes())
    if how == "truncated":
        data = data[: len(data) // 2]
    elif how == "footer-cut":
        data = data[:-FOOTER.size // 2]
    else:  # a flipped bit in the middle of the payload (inside an image)
        data[len(data) // 2] ^= 0x10
    dst.write_bytes(bytes(data))
    return dst


@pytest.mark.parametrize("how", ["truncated", "footer-cut", "flipped"])
def test_a_damaged_artifact_is_refused_before_use(built, tmp_path, monkeypatch, how):
    import nfc.runtime.cuda_load as cl

    path, _, _ = built
    bad = _corrupt(path, tmp_path / "bad.so", how)
    used = []
    monkeypatch.setattr(cl, "open_step", lambda *a, **k: used.append(1))
    monkeypatch.setenv("NFC_CUDA_SIMULATE", "1")
    with pytest.raises(ArtifactError, match="truncated or damaged"):
        load(bad)
    assert not used


def test_without_a_gpu_loading_says_so(built, monkeypatch):
    if _driver_present():
        pytest.skip("a GPU driver is present")
    monkeypatch.delenv("NFC_CUDA_SIMULATE", raising=False)
    from nfc.runtime.cuda_load import CudaUnavailable

    with pytest.raises(CudaUnavailable, match="no NVIDIA driver") as info:
        load(built[0])
    assert "NFC_CUDA_SIMULATE=1" in str(info.value)


def test_a_step_that_does_not_rebuild_is_not_simulated(built, monkeypatch, tmp_path):
    from nfc.codegen.cuda.artifact import CudaArtifact, CudaPayload

    path, _, art = built
    payload = read_payload(read_artifact(path).elf)
    edited = CudaPayload(payload.step, payload.images,
                         payload.module.replace("0.1", "0.2", 1) if "0.1" in payload.module
                         else payload.module + "\n", payload.schedules)
    other = tmp_path / "other.so"
    CudaArtifact(art.step, edited).write(str(other))
    monkeypatch.setenv("NFC_CUDA_SIMULATE", "1")
    with pytest.raises(ArtifactError, match="differ from the ones in the file|cannot rebuild"):
        load(other)
