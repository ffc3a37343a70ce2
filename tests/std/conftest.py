"""Helpers for the stdlib tests: compile one std.nn op alone and run it in the interpreter."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

import numpy as np
import pytest

import nfc.std
from nfc.ir import DType, Module, TensorType

#: The stdlib source under test.
STD_NN = Path(nfc.std.__file__).parent / "nn.nf"

_DTYPES = {np.dtype("float64"): DType.F64, np.dtype("float32"): DType.F32,
           np.dtype("int32"): DType.I32, np.dtype("int64"): DType.I64}


def compile_std(name: str, arg_types: list[TensorType],
                params: Mapping[str, int | float | bool] | None = None) -> Module:
    """The module holding std.nn's `name` instantiated for `arg_types`, verified."""
    from nfc.frontend import compile_op
    from nfc.verifier import verify
    module = compile_op(str(STD_NN), name, arg_types, dict(params or {}))
    verify(module)
    return module


def tensor_type(a: np.ndarray) -> TensorType:
    """The IR type of a numpy array."""
    return TensorType(tuple(a.shape), _DTYPES[a.dtype])


def run_std(name: str, *args: np.ndarray,
            params: Mapping[str, int | float | bool] | None = None) -> list[np.ndarray]:
    """Compile std.nn's `name` for the arrays' types and run it; every result, in order."""
    from nfc.interp import run
    module = compile_std(name, [tensor_type(a) for a in args], params)
    func = module.func(name) if module.has_func(name) else module.funcs[0]
    return [np.asarray(r) for r in run(func, list(args), module=module)]


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator, so failures reproduce."""
    return np.random.default_rng(20261122)


@pytest.fixture
def std_compile() -> Callable[..., Module]:
    """`std_compile(name, arg_types, params)` -> the compiled module (see compile_std)."""
    return compile_std


@pytest.fixture
def std() -> Callable[..., list[np.ndarray]]:
    """`std(name, *arrays, params=...)` -> the op's results (see run_std)."""
    return run_std


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float = 1e-10,
                 atol: float = 1e-12) -> None:
    """Same shape, same dtype kind and values within tolerance (f64 defaults)."""
    actual = np.asarray(actual)
    expected = np.asarray(expected)
    assert actual.shape == expected.shape, f"shape {actual.shape} != {expected.shape}"
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)


@pytest.fixture
def close() -> Callable[..., None]:
    """`close(actual, expected, rtol=1e-10, atol=1e-12)` (see assert_close)."""
    return assert_close
