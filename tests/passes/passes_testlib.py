"""Helpers of the pass tests: parse, run a pass, verify, and compare numerically through the
interpreter (the oracle) on random inputs."""

from __future__ import annotations

import numpy as np

from nfc.interp import run
from nfc.ir import ComputeOp, DType, Func, Module, Op
from nfc.irparser import parse_module
from nfc.passmanager import Context, ModulePass
from nfc.printer import print_module
from nfc.verifier import verify


def apply(module: Module, *passes: ModulePass) -> Module:
    """Run `passes` in order on `module`, verifying after each; returns the module."""
    for p in passes:
        p.apply(Context(), module)
        verify(module)
    return module


def random_inputs(func: Func, seed: int = 0) -> list[np.ndarray]:
    """One array per argument: normal floats, small non-negative integers, random booleans."""
    rng = np.random.default_rng(seed)
    out = []
    for a in func.args:
        if a.dtype.is_float:
            out.append(rng.standard_normal(a.shape).astype(a.dtype.numpy))
        elif a.dtype == DType.I1:
            out.append(rng.random(a.shape) < 0.5)
        else:
            out.append(rng.integers(0, 4, a.shape).astype(a.dtype.numpy))
    return out


def run_func(module: Module, name: str, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The results of `@name` of `module` on `inputs`."""
    return run(module.func(name), inputs, module=module)


def check_pass(text: str, *passes: ModulePass, func: str = "forward", seeds: int = 2,
               rtol: float = 1e-6) -> Module:
    """Parse `text`, verify it, run `passes`, and check that `@func` computes the same results
    before and after on random inputs; returns the transformed module."""
    before = parse_module(text, "test.nfir")
    verify(before)
    after = apply(parse_module(text, "test.nfir"), *passes)
    f = before.func(func)
    for seed in range(seeds):
        inputs = random_inputs(f, seed)
        want = run_func(before, func, inputs)
        got = run_func(after, func, inputs)
        assert len(want) == len(got)
        for w, g in zip(want, got, strict=True):
            assert w.dtype == g.dtype and w.shape == g.shape
            np.testing.assert_allclose(g, w, rtol=rtol, atol=rtol)
    return after


def computes(module: Module, func: str = "forward") -> list[ComputeOp]:
    """Every compute of `@func`, nested ones included, in order."""
    return [op for op in module.func(func).walk() if isinstance(op, ComputeOp)]


def ops_named(module: Module, opname: str, func: str = "forward") -> list[Op]:
    """Every op of `@func` with the given `opname` (e.g. "nf.call")."""
    return [op for op in module.func(func).walk() if op.opname == opname]


def text(module: Module) -> str:
    """The module printed without locations."""
    return print_module(module, locs=False)
