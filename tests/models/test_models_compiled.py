"""The models compiled by the CPU backend (`nfc compile`'s path: frontend, build pipeline,
artifact, `cc`) against their PyTorch twins, over 3 SGD steps of the native `train_step`.

Two comparisons, neither with a tolerance taken from one machine's results:
- float64: the model's IR widened (`nfc.testing.widen`) and built, against the twin in double;
  they agree to `F64_RTOL` of each tensor's scale (its change, for parameters), whatever the
  kernels' summation order (vector width, blocking, threads);
- float32 (the build users run): the native results lie within the probable float32 error
  bound of the computation (`nfc.testing.run_bounded(..., probable=True)`: the interpreter in
  float64 with rounding errors propagated through the three steps), which covers the f32-only
  code (the vectorised exp/log/tanh approximations, 16-lane vectors).

Building a model takes LLVM seconds to a minute, so by default two small models run;
NFC_TEST_COMPILED_ALL=1 checks every model (a few minutes on two cores).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from models_lib import CASES, ROOT, Case, by_name, load_benchmark, perturbed

from nfc.testing import as_f64, assert_within_bounds, run_bounded, widen
from nfc.testing import assert_close_f64 as assert_close

torch = pytest.importorskip("torch", reason="torch is not installed (optional test dependency)")
pytest.importorskip("nfc.runtime.build", reason="the CPU backend is not available")

QUICK = ("mlp3", "sublstm")
ALL = os.environ.get("NFC_TEST_COMPILED_ALL") == "1"
STEPS = 3

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def private_caches(tmp_path_factory: pytest.TempPathFactory,
                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A private build cache, so the test neither reads nor fills the user's."""
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path_factory.mktemp("nfc-cache")))


def skip_unless_selected(case: Case) -> None:
    if not ALL and case.name not in QUICK:
        pytest.skip("slow LLVM build; set NFC_TEST_COMPILED_ALL=1 to check every model")


def setup(case: Case, wide: bool) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The twin, initial parameters and state (constant initializers perturbed) and inputs;
    in double and float64 arrays when `wide`."""
    tm = load_benchmark("torch_models")
    torch.manual_seed(0)
    twin = tm.TWINS[case.name](**case.params)
    rng = np.random.default_rng(0)
    init = perturbed(twin.arrays(), twin.inits, rng)
    inputs = twin.make_inputs(rng)
    if wide:
        twin.double()
        init, inputs = as_f64(init), as_f64(inputs)
    twin.load(init)
    return twin, init, inputs


def build_f64(case: Case, out: Path) -> Any:
    """The model built like `nfc compile` (without tuned schedules), every f32 made f64."""
    from nfc.runtime.build import build_library, frontend_module, pipeline_for, run_pipeline
    from nfc.runtime.loader import load

    path = ROOT / case.path
    module = widen(frontend_module(path, dict(case.params)))
    run_pipeline(module, pipeline_for(path, tuning=False))
    return load(build_library(module, str(out), use_cache=False).path)


@pytest.mark.parametrize("case", by_name(CASES))
def test_compiled_float64_matches_torch(case: Case, tmp_path: Path) -> None:
    skip_unless_selected(case)
    twin, init, inputs = setup(case, wide=True)
    model = build_f64(case, tmp_path / "model.so")
    model.set_num_threads(1)
    start = {n: init[n] if n in init else np.zeros_like(a) for n, a in model.tensors.items()}
    assert all(a.dtype == np.float64 for a in model.tensors.values() if a.dtype.kind == "f")
    model.load_state_dict(start)   # optimizer state (momentum buffers) starts at zero
    twin.train()
    with torch.no_grad():
        expected = twin(**twin.torch_inputs(inputs))["loss"].numpy()
    twin.load(init)                # the forward moved torch's running statistics
    assert_close(model.forward(**inputs)["loss"], expected, "forward loss")

    model.load_state_dict(start)
    for i in range(STEPS):
        loss = model.train_step(**inputs)["loss"]
        assert_close(loss, np.float64(twin.train_step(inputs)), f"loss at step {i}")
    after = twin.arrays()
    for name, value in init.items():
        assert_close(model.tensors[name], after[name], name,
                     scale=float(np.abs(after[name] - value).max(initial=0.0)))


@pytest.mark.parametrize("case", by_name(CASES))
def test_compiled_float32_within_error_bound(case: Case) -> None:
    skip_unless_selected(case)
    from nfc.runtime.build import load_model, model_module

    _, init, inputs = setup(case, wide=False)
    settings = [f"{k}={v}" for k, v in case.params.items()]
    model = load_model(ROOT / case.path, settings=settings)
    model.set_num_threads(1)
    oracle = model_module(ROOT / case.path, dict(case.params), im2col=False)
    step = oracle.func("train_step")
    start = {n: init[n] if n in init else np.zeros_like(a) for n, a in model.tensors.items()}
    model.load_state_dict(start)
    ref = {**as_f64(start), **inputs}   # the exact values (float64) and their error bounds
    errors: dict[str, np.ndarray] = {}
    names = step.attrs["nf.results"]
    checked = 0
    for i in range(STEPS):
        got = model.train_step(**inputs)
        bounds = run_bounded(step, {a.name: ref[a.name] for a in step.args}, errors=errors,
                             module=oracle, probable=True)
        for name, (v, e) in zip(names, bounds, strict=True):
            key = name.split(":", 1)[-1]
            ours = model.tensors[key] if ":" in name else got[name]
            unchecked = assert_within_bounds(ours, v, e, name=f"step {i} {name}")
            checked += np.size(ours) - unchecked
            if ":" in name:
                ref[key], errors[key] = v, e
    if case.name in QUICK:  # no batch norm, max-pool ties or zero gradients: all checked
        total = sum(np.size(v) for n, (v, _) in zip(names, bounds, strict=True)) * STEPS
        assert checked == total, f"only {checked} of {total} elements had a finite bound"
