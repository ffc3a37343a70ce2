"""numpy implementations that need more than one numpy call, and numpy imported on first use.

The operator table holds numpy functions, but importing it must not import numpy (`nfc --help`
and the verifier do not need it): rows refer to `np`, a stand-in that imports numpy when one
of its attributes is first read.
"""

from __future__ import annotations

import functools
import math
from typing import Any


class _Numpy:
    """numpy, imported on first attribute access (each attribute is then kept here)."""

    def __getattr__(self, name: str) -> Any:
        import numpy

        value = getattr(numpy, name)
        setattr(self, name, value)
        return value


np: Any = _Numpy()

# ---------------------------------------------------------------------------------------------
# erf: Taylor expansions around the points k/16 of [0, 6], coefficients from the derivatives
# erf^(n)(c) = 2/sqrt(pi) * (-1)^(n-1) * H_{n-1}(c) * exp(-c^2), with erf(c) itself from
# math.erf. |x - c| <= 1/32 keeps the neglected terms below 1e-17 relative; measured error
# against math.erf is below 2 ulp.

_ERF_STEPS = 16
_ERF_XMAX = 6.0  # erf(x) rounds to 1.0 in float64 from 5.93 on
_ERF_TERMS = 16


@functools.cache
def _erf_table() -> Any:
    ks = int(_ERF_XMAX * _ERF_STEPS) + 1
    tab = np.zeros((_ERF_TERMS + 1, ks))
    for k in range(ks):
        c = k / _ERF_STEPS
        tab[0, k] = math.erf(c)
        scale = 2.0 / math.sqrt(math.pi) * math.exp(-c * c)
        h_prev, h = 0.0, 1.0  # H_{m-1}(c)/(m-1)!, H_m(c)/m! for m = 0
        for n in range(1, _ERF_TERMS + 1):
            tab[n, k] = scale * (-1) ** (n - 1) * h / n
            h_prev, h = h, (2 * c * h - 2 * h_prev) / n
    return tab


def erf(x: Any) -> Any:
    """The error function in float64, vectorised, within 2 ulp of math.erf."""
    table = _erf_table()
    x = np.asarray(x, dtype=np.float64)
    a = np.abs(x)
    a = np.where(np.isnan(a), 0.0, np.minimum(a, _ERF_XMAX))
    k = np.floor(a * _ERF_STEPS + 0.5).astype(np.intp)
    h = a - k / _ERF_STEPS  # exact: a and k/16 are close
    acc = table[_ERF_TERMS][k]
    for n in range(_ERF_TERMS - 1, -1, -1):
        acc = acc * h + table[n][k]
    acc = np.where(a >= _ERF_XMAX, 1.0, acc)
    return np.where(np.isnan(x), np.nan, np.copysign(acc, x))


def sigmoid(v: Any) -> Any:
    """1 / (1 + e**-v) in the dtype of `v`."""
    return np.reciprocal(v.dtype.type(1) + np.exp(-v))


def softplus(v: Any) -> Any:
    """log(1 + e**v) in the dtype of `v`, without overflow: max(v, 0) + log1p(e**-|v|)."""
    return np.logaddexp(v.dtype.type(0), v)


def philox(key: Any, counter: Any) -> Any:
    """The `philox` intrinsic (nfc.philox), float64 in [0, 1)."""
    from nfc.philox import philox_uniform

    return philox_uniform(key, counter)


def scalar_softplus(x: float) -> float:
    """softplus of a Python float (compile-time constants)."""
    return max(x, 0.0) + math.log1p(math.exp(-abs(x)))
