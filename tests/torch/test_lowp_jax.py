"""f16 and bf16 through nfc.jax: value and custom_vjp gradients of `.nf` ops under jax.jit,
against the interpreter at the 16-bit error bound, on the AVX-512 BF16 path and the forced
AVX2 path (lowp_cases.py). Skipped without JAX (an optional dependency)."""

from __future__ import annotations

import numpy as np
import pytest
from lowp_cases import CASES, DTYPES, Case, arguments, check, cpu_path, ir_function, upstream

__all__ = ["cpu_path"]  # the fixture, imported for pytest

jax = pytest.importorskip("jax", reason="jax is not installed (optional test dependency)")
import jax.numpy as jnp  # noqa: E402

import nfc.jax  # noqa: E402


@pytest.mark.parametrize("dtype", list(DTYPES))
@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_jax_value_and_vjp_under_jit(case: Case, dtype: str, cpu_path: str) -> None:
    dt, npdt = DTYPES[dtype]
    op = nfc.jax.load_op(case.source, case.op, case.params)
    args = arguments(case, npdt, seed=11)
    jargs = [jnp.asarray(a) for a in args]
    outs, pullback = jax.vjp(jax.jit(op), *jargs)
    outs = outs if isinstance(outs, tuple) else (outs,)
    got = [np.asarray(o) for o in outs]
    check(ir_function(case, dt), args, got, f"{case.name} forward")
    ups = upstream([(g.shape, g.dtype) for g in got], seed=12)
    grads = pullback(tuple(jnp.asarray(u) for u in ups) if len(ups) > 1
                     else jnp.asarray(ups[0]))
    assert [g.dtype for g in grads] == [npdt] * len(args)
    wrt = tuple(range(len(args)))
    check(ir_function(case, dt, wrt), [*args, *ups], [np.asarray(g) for g in grads],
          f"{case.name} custom_vjp")


def test_jax_grad_of_a_bf16_loss(cpu_path: str) -> None:
    """jax.grad through an f32 loss of a bf16 op: the cotangent arrives in bf16 and the
    gradient leaves in bf16, the same as the native vjp on that cotangent."""
    case = CASES[2]  # lltm_cell: two results, one used
    _, npdt = DTYPES["bf16"]
    op = nfc.jax.load_op(case.source, case.op, case.params)
    args = [jnp.asarray(a) for a in arguments(case, npdt, seed=13)]
    dw = jax.jit(jax.grad(lambda w: op(*args[:3], w, args[4])[0].astype(jnp.float32)
                          .sum()))(args[3])
    assert dw.dtype == jnp.bfloat16
    ones = np.ones(case.shapes[1], npdt)
    native = op.native.vjp([np.asarray(a) for a in args], [ones, np.zeros_like(ones)], (3,))
    np.testing.assert_array_equal(np.asarray(dw).view(np.int16), native[0].view(np.int16))
