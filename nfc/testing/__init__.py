"""Helpers for tests that compare nfc with an oracle (the interpreter, PyTorch, JAX).

Floating-point results of two correct implementations differ by rounding, and how much depends
on the summation order each one picked (blocking, vector width, threads), so a fixed relative
tolerance on float32 results is either loose enough to hide bugs or tight enough to fail on
another machine. Two ways out, both here:

- `widen(module)`: the same IR with every f32 made f64. Compared with a float64 twin, results
  agree to a few thousand ulp of float64 whatever the summation order, so a tolerance like
  `F64_RTOL` is machine independent and still a billion times smaller than a real bug.
- `nfc.testing.errbound` (`run_bounded`): the interpreter in float64 together with a bound on the
  rounding error of any float32 evaluation order, for comparing float32 backend results.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from nfc.ir import DType, Module
from nfc.testing.errbound import (
    INTRINSIC_ULPS,
    INTRINSIC_ULPS_F64,
    LAMBDA,
    SLACK,
    U32,
    U64,
    assert_within_bounds,
    bound_violations,
    run_bounded,
)

__all__ = ["F64_RTOL", "INTRINSIC_ULPS", "INTRINSIC_ULPS_F64", "LAMBDA", "SLACK", "U32", "U64",
           "VALUE_FLOOR", "as_f64", "assert_close_f64", "assert_matches_oracle",
           "assert_within_bounds", "bound_violations", "run_bounded", "widen"]


#: Relative tolerance of float64 comparisons between two correct implementations:
#: u64 times 2^22 (about 4e6) covers reductions of up to a few thousand terms, amplified by
#: the condition of the computation (batch norm divides by small deviations, three SGD steps
#: feed the errors back) by a further factor of a thousand: 4.7e-10. A bug that changes one
#: gradient by 1% is 2e7 times larger.
F64_RTOL = U64 * 2.0 ** 22

_F32 = re.compile(r"(?:(?<=\dx)|(?<=<)|(?<![\w%@\"./-]))f32\b")


def widen(module: Module) -> Module:
    """A copy of `module` with every f32 (tensor types, casts, typed constants) made f64.

    Goes through the printer and parser (which round-trip exactly), so every kind of type
    annotation is covered; asserts that no f32 survives."""
    from nfc.irparser import parse_module
    from nfc.printer import print_module

    text = _F32.sub("f64", print_module(module))
    wide = parse_module(text, f"<{module.name} in f64>")
    left = [v for f in wide.funcs for v in list(f.args) + [r for op in f.walk()
            for r in getattr(op, "results", ())] if v.dtype == DType.F32]
    assert not left, f"f32 values left after widening: {left[:3]}"
    return wide


#: Rounding of a value itself, relative to its tensor's largest element: a few dozen float64
#: roundings (a running statistic whose update is pure rounding moves by ~1e-17).
VALUE_FLOOR = 2.0 ** 10 * U64


def assert_close_f64(ours: Any, theirs: Any, name: str, scale: float | None = None) -> None:
    """Two float64 results of the same computation agree: |ours - theirs| <= F64_RTOL x
    `scale` + VALUE_FLOOR x max |theirs|. `scale` defaults to the tensor's largest magnitude
    (an element's rounding error is relative to the terms that formed it, not to the element
    itself); for a parameter after training steps, pass how far it moved, so that a small
    learning rate cannot hide a wrong gradient."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.dtype == np.float64 and theirs.dtype == np.float64, \
        f"{name}: {ours.dtype} and {theirs.dtype}, expected float64"
    assert ours.shape == theirs.shape, f"{name}: shape {ours.shape} != {theirs.shape}"
    size = float(np.abs(theirs).max(initial=0.0))
    scale = size if scale is None else scale
    err = float(np.abs(ours - theirs).max(initial=0.0))
    assert err <= F64_RTOL * scale + VALUE_FLOOR * size, \
        f"{name}: differs by {err:.3g} (scale {scale:.3g}, tolerance {F64_RTOL:.2g} relative)"


def as_f64(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float arrays converted to float64 (exactly, from float32), others unchanged."""
    return {k: (np.asarray(v, np.float64) if np.asarray(v).dtype.kind == "f" else v)
            for k, v in arrays.items()}


def assert_matches_oracle(func: Any, inputs: Any, got: Any, *, module: Module | None = None,
                          rtol: float = 1e-4, atol: float = 1e-5, probable: bool = False
                          ) -> int:
    """The results `got` of a compiled `func` on `inputs` against the oracle: within the error
    bound of `run_bounded` (float64 reference, SLACK times the bound of any evaluation order);
    where the float32 interpreter gives inf or NaN, the same value; elements without a finite
    bound (a division by a value whose error covers zero) within `rtol`/`atol` of the
    interpreter; integers and booleans equal. Returns the number of fallback elements."""
    from nfc.interp import run

    want = run(func, inputs, module=module)
    bounds = run_bounded(func, inputs, module=module, probable=probable)
    fallback = 0
    for n, (g, w, (v, e)) in enumerate(zip(got, want, bounds, strict=True)):
        g = np.asarray(g)
        assert g.shape == w.shape and g.dtype == w.dtype, (n, g.shape, w.shape, g.dtype,
                                                           w.dtype)
        if g.dtype.kind != "f":
            np.testing.assert_array_equal(g, w, err_msg=f"result {n}")
            continue
        special = ~np.isfinite(w)
        np.testing.assert_array_equal(g[special], w[special], err_msg=f"result {n}: inf/NaN")
        e = np.where(special, np.inf, e)
        assert_within_bounds(g, v, e, name=f"result {n}")
        loose = ~special & ~(np.isfinite(v) & np.isfinite(e))
        if loose.any():
            fallback += int(loose.sum())
            np.testing.assert_allclose(g[loose], w[loose], rtol=rtol, atol=atol,
                                       err_msg=f"result {n} (no finite error bound)")
    return fallback

