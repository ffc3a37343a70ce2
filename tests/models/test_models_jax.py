"""Each benchmark model against its JAX twin (benchmarks/jax_models.py): the same loss in
both modes and the same parameters and running statistics after 3 SGD steps of the
interpreter's `@train_step`, from parameters drawn by nfc's own initializers. Needs no torch.

Both sides run in float64 (nfc's IR widened by `nfc.testing.widen`, JAX with x64 enabled), for
the reason test_models_torch.py gives: float32 results of two correct implementations differ
by their summation orders, amplified by batch norm and the training steps, so no fixed float32
tolerance is both machine independent and tight. In float64 they agree to `F64_RTOL` of each
tensor's scale (the change of a parameter, for the parameters).

XLA compiles every model twice (forward, training step), which takes minutes for the whole
set, so by default only one cheap recurrent model runs; NFC_TEST_JAX_ALL=1 checks all of them.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from models_lib import CASES, Case, arg_roles, by_name, load_benchmark, run_named
from models_lib import training_module as build

from nfc.ir import Module
from nfc.testing import as_f64, widen
from nfc.testing import assert_close_f64 as assert_close

jax = pytest.importorskip("jax", reason="jax is not installed (optional test dependency)")
pytest.importorskip("nfc.passes.autodiff.train", reason="the autodiff pass is not available")

STEPS = 3
QUICK = ("lltm",)
ALL = os.environ.get("NFC_TEST_JAX_ALL") == "1"


def x64():  # type: ignore[no-untyped-def]
    """JAX's float64 mode, as a context manager (jax.enable_x64 from 0.4.36, else the
    experimental one)."""
    ctx = getattr(jax, "enable_x64", None)
    if ctx is None:
        from jax.experimental import enable_x64 as ctx
    return ctx(True)


def setup(case: Case) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray],
                               dict[str, np.ndarray]]:
    """(params, state, inputs): the model's declared initializers (seed 3), perturbed where
    constant, and integer inputs in {0, 1} (valid labels and token ids everywhere)."""
    from nfc.codegen.artifact.initgen import reference_init

    func = build(case).func("forward")
    rng = np.random.default_rng(5)
    params, state, inputs = {}, {}, {}
    for a, attrs in zip(func.args, func.arg_attrs, strict=True):
        role, dt = attrs["nf.role"], a.dtype.numpy
        if role in ("param", "state"):
            v = reference_init(a.name, attrs["nf.init"], a.shape, a.dtype, seed=3)
            if attrs["nf.init"] == "ones":
                v = v + 0.3 * np.abs(rng.standard_normal(a.shape)).astype(dt)
            elif attrs["nf.init"] == "zeros":
                v = v + 0.1 * rng.standard_normal(a.shape).astype(dt)
            (params if role == "param" else state)[a.name] = v
        elif a.dtype.is_int:
            inputs[a.name] = rng.integers(0, 2, size=a.shape).astype(dt)
        else:
            inputs[a.name] = rng.standard_normal(a.shape).astype(dt)
    return as_f64(params), as_f64(state), as_f64(inputs)


@pytest.mark.parametrize("case", by_name(CASES))
def test_jax_matches(case: Case) -> None:
    if not ALL and case.name not in QUICK:
        pytest.skip("slow XLA compilation; set NFC_TEST_JAX_ALL=1 to compare every model")
    with x64():
        compare(case)


def compare(case: Case) -> None:
    jm = load_benchmark("jax_models")
    params, state, inputs = setup(case)
    module: Module = widen(build(case))
    for training in (True, False):
        res = run_named(module.func("forward" if training else "eval"), module,
                        {**params, **state, **inputs})
        loss, outs, new_state = jm.make_forward(case.name, case.params, training)(
            params, state, inputs)
        assert_close(res["loss"], loss, f"loss, training={training}")
        for name, value in outs.items():
            assert_close(res[name], value, name)
        for name, value in new_state.items():
            assert_close(res["state:" + name], value, "state:" + name,
                         scale=float(np.abs(np.asarray(value) - state[name]).max()))

    step = module.func("train_step")
    args = {**params, **state, **inputs}
    for a, role in zip(step.args, arg_roles(step).values(), strict=True):
        if role == "opt_state":
            args[a.name] = np.zeros(a.shape, a.dtype.numpy)
    jstep = jm.make_train_step(case.name, case.params)
    p, s, buf = dict(params), dict(state), {k: np.zeros_like(v) for k, v in params.items()}
    for i in range(STEPS):
        res = run_named(step, module, args)
        p, s, buf, loss = jstep(p, s, buf, inputs)
        assert_close(res["loss"], loss, f"loss at step {i}")
        for name, value in res.items():
            if ":" in name:
                args[name.split(":", 1)[1]] = value
    for name, value in {**p, **s}.items():
        start = {**params, **state}[name]
        # relative to how far the tensor moved: a small learning rate cannot hide a wrong
        # gradient
        assert_close(args[name], value, name,
                     scale=float(np.abs(np.asarray(value) - start).max(initial=0.0)))
