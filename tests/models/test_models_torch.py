"""Each benchmark model against its PyTorch twin (benchmarks/torch_models.py): the same initial
parameters and inputs give the same loss and outputs, in training and evaluation mode, and the
same parameters, running statistics and losses over 3 SGD steps of the interpreter's
`@train_step` (float32 on both sides, rtol 1e-4)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from models_lib import CASES, Case, arg_roles, by_name, load_benchmark, perturbed, run_named
from models_lib import training_module as build

torch = pytest.importorskip("torch", reason="torch is not installed (optional test dependency)")
pytest.importorskip("nfc.passes.autodiff.train", reason="the autodiff pass is not available")

STEPS = 3

# One thread: these are tiny tensors, and torch's worker threads only contend with the other
# tests running on the same cores.
torch.set_num_threads(1)


def setup(case: Case) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The twin, the initial parameters and state (from the twin's initializers, constant ones
    perturbed) and the inputs, all seeded."""
    tm = load_benchmark("torch_models")
    torch.manual_seed(0)
    twin = tm.TWINS[case.name](**case.params)
    rng = np.random.default_rng(0)
    init = perturbed(twin.arrays(), twin.inits, rng)
    twin.load(init)
    return twin, init, twin.make_inputs(rng)


def test_twins_mirror_every_case() -> None:
    assert set(load_benchmark("torch_models").TWINS) == {c.name for c in CASES}


@pytest.mark.parametrize("case", by_name(CASES))
def test_same_parameter_names_and_shapes(case: Case) -> None:
    twin, init, inputs = setup(case)
    func = build(case).func("forward")
    types = {a.name: (a.shape, attrs.get("nf.role")) for a, attrs in
             zip(func.args, func.arg_attrs, strict=True)}
    nf_vars = {n: shape for n, (shape, role) in types.items() if role in ("param", "state")}
    assert nf_vars == {n: a.shape for n, a in init.items()}
    assert {n: shape for n, (shape, role) in types.items() if role == "input"} == \
        {n: a.shape for n, a in inputs.items()}
    buffers = {n for n, _ in twin.named_buffers()}
    assert buffers == {n for n, (_, role) in types.items() if role == "state"}


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", by_name(CASES))
def test_forward_matches_torch(case: Case, training: bool) -> None:
    twin, init, inputs = setup(case)
    module = build(case)
    func = module.func("forward" if training else "eval")
    res = run_named(func, module, {**init, **inputs})
    twin.train(training)
    with torch.no_grad():
        out = twin(**twin.torch_inputs(inputs))
    np.testing.assert_allclose(res["loss"], out["loss"].numpy(), rtol=1e-4)
    for name, value in out.items():
        np.testing.assert_allclose(res[name], value.numpy(), rtol=1e-4, atol=1e-5,
                                   err_msg=name)
    after = twin.arrays()   # torch updated its running statistics in place
    for name in [n for n in res if n.startswith("state:")]:
        key = name[len("state:"):]
        np.testing.assert_allclose(res[name], after[key], rtol=1e-4, atol=1e-6, err_msg=name)


@pytest.mark.parametrize("case", by_name(CASES))
def test_three_sgd_steps_match_torch(case: Case) -> None:
    twin, init, inputs = setup(case)
    module = build(case)
    step = module.func("train_step")
    args = {**init, **inputs}
    for a, role in zip(step.args, arg_roles(step).values(), strict=True):
        if role == "opt_state":
            args[a.name] = np.zeros(a.shape, a.dtype.numpy)
    for i in range(STEPS):
        res = run_named(step, module, args)
        torch_loss = twin.train_step(inputs)
        np.testing.assert_allclose(res["loss"], torch_loss, rtol=1e-4, err_msg=f"step {i}")
        for name, value in res.items():
            if ":" in name:   # param:w, state:m, opt_state:w_mom replace their argument
                args[name.split(":", 1)[1]] = value
    after = twin.arrays()
    for name, start in init.items():
        np.testing.assert_allclose(args[name], after[name], rtol=1e-4, atol=1e-6, err_msg=name)
        # the change itself, so that a small learning rate cannot hide a wrong gradient
        ours, theirs = args[name] - start, after[name] - start
        err = np.abs(ours - theirs).max()
        assert err <= 2e-3 * np.abs(theirs).max() + 1e-6, \
            f"{name}: update differs by {err:.3g} (largest update {np.abs(theirs).max():.3g})"
    moved = [n for n in init if n in dict(twin.named_parameters())
             and not np.array_equal(args[n], init[n])]
    assert moved, "training changed no parameter"
