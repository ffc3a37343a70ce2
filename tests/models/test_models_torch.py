"""Each benchmark model against its PyTorch twin (benchmarks/torch_models.py): the same initial
parameters and inputs give the same loss and outputs, in training and evaluation mode, and the
same parameters, running statistics and losses over 3 SGD steps of the interpreter's
`@train_step`.

Both sides run in float64: nfc's IR with every f32 made f64 (`nfc.testing.widen`, the same
graph, autodiff included), the twin in double. In float32 the two sides sum in different
orders (numpy's pairwise sums in the interpreter, PyTorch's blocked and vectorised kernels,
which depend on the CPU), batch norm divides by small deviations and three steps feed the
differences back: on an AVX-512 host one element of ResNet-18's stem_b differed by 1.8e-4
relative, while each side was within ~3e-5 (of the largest update of stem_b) of the float64
result, so a fixed float32 tolerance is either machine dependent or too loose to see a wrong
gradient. In float64 the same amplification leaves differences below 1e-13 of each tensor's
scale, against a tolerance of `F64_RTOL` (4.7e-10), and a gradient off by 1% still fails
(test_a_one_percent_gradient_error_fails).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
from models_lib import CASES, Case, arg_roles, by_name, load_benchmark, perturbed, run_named
from models_lib import training_module as build

from nfc.ir import Module
from nfc.testing import as_f64, widen
from nfc.testing import assert_close_f64 as assert_close

torch = pytest.importorskip("torch", reason="torch is not installed (optional test dependency)")
pytest.importorskip("nfc.passes.autodiff.train", reason="the autodiff pass is not available")

STEPS = 3

# One thread: these are tiny tensors, and torch's worker threads only contend with the other
# tests running on the same cores.
torch.set_num_threads(1)

_WIDE: dict[str, Module] = {}


def wide(case: Case) -> Module:
    """The training module of `case` in float64 (cached)."""
    if case.name not in _WIDE:
        _WIDE[case.name] = widen(build(case))
    return _WIDE[case.name]


def setup(case: Case) -> tuple[Any, dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The twin in double, the initial parameters and state (from the twin's initializers,
    constant ones perturbed) and the inputs, all seeded; float arrays are float64 holding
    float32 values."""
    tm = load_benchmark("torch_models")
    torch.manual_seed(0)
    twin = tm.TWINS[case.name](**case.params)
    rng = np.random.default_rng(0)
    init = as_f64(perturbed(twin.arrays(), twin.inits, rng))
    inputs = as_f64(twin.make_inputs(rng))
    twin.double()
    twin.load(init)
    return twin, init, inputs


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
    module = wide(case)
    func = module.func("forward" if training else "eval")
    res = run_named(func, module, {**init, **inputs})
    twin.train(training)
    with torch.no_grad():
        out = twin(**twin.torch_inputs(inputs))
    for name, value in out.items():
        assert_close(res[name], value.numpy(), name)
    after = twin.arrays()   # torch updated its running statistics in place
    for name in [n for n in res if n.startswith("state:")]:
        key = name[len("state:"):]
        assert_close(res[name], after[key], name, scale=float(np.abs(after[key] - init[key])
                                                               .max(initial=0.0)))


def train_both(case: Case, tamper: Callable[[dict[str, np.ndarray], int], None] | None = None
               ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """STEPS steps of nfc's `@train_step` and of the twin, the losses compared at each step;
    `tamper(args, step)` may change nfc's state after each step. Returns (initial values,
    nfc's values, torch's values) of the parameters and state."""
    twin, init, inputs = setup(case)
    module = wide(case)
    step = module.func("train_step")
    args = {**init, **inputs}
    for a, role in zip(step.args, arg_roles(step).values(), strict=True):
        if role == "opt_state":
            args[a.name] = np.zeros(a.shape, a.dtype.numpy)
    for i in range(STEPS):
        res = run_named(step, module, args)
        torch_loss = twin.train_step(inputs)
        assert_close(res["loss"], np.float64(torch_loss), f"loss at step {i}")
        for name, value in res.items():
            if ":" in name:   # param:w, state:m, opt_state:w_mom replace their argument
                args[name.split(":", 1)[1]] = value
        if tamper is not None:
            tamper(args, i)
    return init, {n: args[n] for n in init}, twin.arrays()


def compare_states(init: dict[str, np.ndarray], ours: dict[str, np.ndarray],
                   theirs: dict[str, np.ndarray]) -> None:
    """Every parameter and state tensor, relative to how far it moved: a small learning rate
    cannot hide a wrong gradient."""
    for name, start in init.items():
        assert_close(ours[name], theirs[name], name,
                     scale=float(np.abs(theirs[name] - start).max(initial=0.0)))


@pytest.mark.parametrize("case", by_name(CASES))
def test_three_sgd_steps_match_torch(case: Case) -> None:
    init, ours, theirs = train_both(case)
    compare_states(init, ours, theirs)
    moved = [n for n in init if not np.array_equal(ours[n], init[n])]
    assert moved, "training changed no parameter"


def test_a_one_percent_gradient_error_fails() -> None:
    """The comparison above sees a gradient that is 1% off in one small tensor (ResNet-18's
    stem_b, the tensor that broke the old float32 comparison): with plain SGD the update is
    -lr x gradient, so scaling the last step's update of stem_b by 1.01 is that error (an
    error in an earlier step already shows in the next step's loss)."""
    case = next(c for c in CASES if c.name == "resnet18")
    before: dict[str, np.ndarray] = {}

    def tamper(args: dict[str, np.ndarray], step: int) -> None:
        if step == STEPS - 2:
            before["stem_b"] = args["stem_b"].copy()
        if step == STEPS - 1:
            args["stem_b"] = before["stem_b"] + 1.01 * (args["stem_b"] - before["stem_b"])

    init, ours, theirs = train_both(case)
    compare_states(init, ours, theirs)
    with pytest.raises(AssertionError, match="stem_b"):
        init, ours, theirs = train_both(case, tamper)
        compare_states(init, ours, theirs)
