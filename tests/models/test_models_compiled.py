"""The models compiled by the CPU backend (default pipeline and schedules, `nfc compile`'s
path) against their PyTorch twins: the same loss, and the same parameters after 3 SGD steps of
the native `train_step` (float32, rtol 1e-4).

Building a model takes LLVM seconds to a minute, so by default two small models run;
NFC_TEST_COMPILED_ALL=1 checks every model (about two minutes on two cores).
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from models_lib import CASES, ROOT, Case, by_name, load_benchmark, perturbed

torch = pytest.importorskip("torch", reason="torch is not installed (optional test dependency)")
pytest.importorskip("nfc.runtime.build", reason="the CPU backend is not available")

QUICK = ("mlp3", "sublstm")
ALL = os.environ.get("NFC_TEST_COMPILED_ALL") == "1"
STEPS = 3

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def cache_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A private build cache, so the test neither reads nor fills the user's."""
    return str(tmp_path_factory.mktemp("nfc-cache"))


@pytest.mark.parametrize("case", by_name(CASES))
def test_compiled_matches_torch(case: Case, cache_dir: str,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    if not ALL and case.name not in QUICK:
        pytest.skip("slow LLVM build; set NFC_TEST_COMPILED_ALL=1 to check every model")
    from nfc.runtime.build import load_model

    monkeypatch.setenv("NFC_CACHE_DIR", cache_dir)
    tm = load_benchmark("torch_models")
    torch.manual_seed(0)
    twin = tm.TWINS[case.name](**case.params)
    rng = np.random.default_rng(0)
    init = perturbed(twin.arrays(), twin.inits, rng)
    twin.load(init)
    inputs = twin.make_inputs(rng)

    model = load_model(ROOT / case.path, settings=[f"{k}={v}" for k, v in case.params.items()])
    model.set_num_threads(1)
    start = {n: init[n] if n in init else np.zeros_like(a) for n, a in model.tensors.items()}
    model.load_state_dict(start)   # optimizer state (momentum buffers) starts at zero
    twin.train()
    with torch.no_grad():
        expected = float(twin(**twin.torch_inputs(inputs))["loss"])
    twin.load(init)                # the forward moved torch's running statistics
    np.testing.assert_allclose(model.forward(**inputs)["loss"], expected, rtol=1e-4)

    model.load_state_dict(start)
    for i in range(STEPS):
        loss = model.train_step(**inputs)["loss"]
        np.testing.assert_allclose(loss, twin.train_step(inputs), rtol=1e-4, err_msg=f"step {i}")
    after = twin.arrays()
    for name, value in init.items():
        ours, theirs = model.tensors[name], after[name]
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6, err_msg=name)
        err = np.abs((ours - value) - (theirs - value)).max()
        assert err <= 2e-3 * np.abs(theirs - value).max() + 1e-6, f"{name}: update differs"
