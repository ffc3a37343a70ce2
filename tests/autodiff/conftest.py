"""Helpers for the autodiff tests: finite-difference gradient checks through the interpreter."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pytest

from nfc.ir import Axis, ComputeOp, Func, Index, Load, Module, TensorType, Value
from nfc.irparser import parse_module


def parse(text: str) -> Module:
    """A module from IR text."""
    return parse_module(text, "<test>")


def scalar_loss(func: Func, results: Sequence[int] | None = None) -> Func:
    """A copy of `func` whose only result is `sum_i sum(y_i * %ct_i)` over its float results
    `y_i` (those listed in `results`, by default all of them).

    Each cotangent `%ct<i>` is a new argument, so random cotangents check the full Jacobian
    product instead of only the sum of outputs.
    """

    f = func.clone(func.name + "_loss")
    if results is None:
        results = [i for i, v in enumerate(f.ret.values) if v.dtype.is_float]
    dtype = f.ret.values[results[0]].dtype
    parts = []
    for i in results:
        y = f.ret.values[i]
        ct = Value(y.type, f"ct{i}")
        f.args.append(ct)
        f.arg_attrs.append({})
        axes = tuple(Axis(f"a{j}", n) for j, n in enumerate(y.shape))
        idx = tuple(Index(a.name) for a in axes)
        op = ComputeOp(TensorType((), dtype), (), Load(y, idx) * Load(ct, idx),
                       reduce="sum" if axes else None, raxes=axes, name=f"part{i}")
        f.body.ops.insert(len(f.body.ops) - 1, op)
        parts.append(Load(op.result, ()))
    total = parts[0]
    for p in parts[1:]:
        total = total + p
    op = ComputeOp(TensorType((), dtype), (), total, name="loss")
    f.body.ops.insert(len(f.body.ops) - 1, op)
    f.ret.values = [op.result]
    f.attrs.pop("nf.results", None)
    return f


def _loss_value(func: Func, args: Mapping[str, np.ndarray], module: Module | None) -> float:
    from nfc.interp import run

    return float(run(func, dict(args), module=module)[0])


def gradcheck(func: Func, inputs: Mapping[str, np.ndarray], wrt: Sequence[str], *,
              results: Sequence[int] | None = None, module: Module | None = None, seed: int = 0,
              directions: int = 3, elementwise: int = 40, eps: float = 1e-6,
              rtol: float = 1e-6, verify: bool = True) -> dict[str, np.ndarray]:
    """Check the symbolic gradients of `func`'s results (see `scalar_loss`) against central
    differences.

    Float64 throughout. Every argument in `wrt` is checked along `directions` random
    directions, and element by element when it has at most `elementwise` elements. The
    relative error `|num - sym| / max(|num|, |sym|, 1e-3)` must stay below `rtol`. Returns the
    symbolic gradients by name.
    """
    from nfc.interp import run
    from nfc.passes.autodiff.graph import grad_func
    from nfc.verifier import verify_func

    rng = np.random.default_rng(seed)
    f = scalar_loss(func, results)
    args = dict(inputs)
    for a in f.args[len(func.args):]:
        args[a.name] = rng.standard_normal(a.shape)
    g = grad_func(f, list(wrt))
    if verify:
        verify_func(g, module)
    outs = run(g, dict(args), module=module)
    grads = {n: np.asarray(o) for n, o in zip(wrt, outs[1:], strict=True)}
    for name in wrt:
        x = np.asarray(args[name], dtype=np.float64)
        sym = grads[name]
        dirs = [rng.standard_normal(x.shape) for _ in range(directions)]
        if x.size <= elementwise:
            for i in range(x.size):
                e = np.zeros(x.size)
                e[i] = 1.0
                dirs.append(e.reshape(x.shape))
        for d in dirs:
            plus = dict(args, **{name: x + eps * d})
            minus = dict(args, **{name: x - eps * d})
            num = (_loss_value(f, plus, module) - _loss_value(f, minus, module)) / (2 * eps)
            ana = float(np.sum(sym * d))
            err = abs(num - ana) / max(abs(num), abs(ana), 1e-3)
            assert err <= rtol, (f"gradient of %{name} along a direction: finite differences "
                                 f"{num!r}, symbolic {ana!r}, relative error {err:.2e}")
    return grads


def conv_ir(n: int, c: int, h: int, o: int, k: int, stride: int, dil: int, pad: int,
             groups: int = 1) -> tuple[str, int]:
    """IR text of `@f(%x, %w) -> %y`, a 2-d convolution (NCHW, square) with zero padding as
    a guard, and the output size."""
    out = (h + 2 * pad - dil * (k - 1) - 1) // stride + 1
    cg = c // groups
    og = o // groups
    ih = f"i * {stride} + r * {dil} - {pad}"
    jw = f"j * {stride} + s * {dil} - {pad}"
    guard = f"0 <= {ih} and {ih} < {h} and 0 <= {jw} and {jw} < {h}"
    chan = f"(q // {og}) * {cg} + c" if groups > 1 else "c"
    text = f"""
nf.module @m {{
  nf.func @f(%x: tensor<{n}x{c}x{h}x{h}xf64>, %w: tensor<{o}x{cg}x{k}x{k}xf64>)
      -> (tensor<{n}x{o}x{out}x{out}xf64>) {{
    %y = nf.compute [b: {n}, q: {o}, i: {out}, j: {out}] sum [c: {cg}, r: {k}, s: {k}]
      (select({guard}, %x[b, {chan}, {ih}, {jw}], 0.0) * %w[q, c, r, s])
      : tensor<{n}x{o}x{out}x{out}xf64>
    nf.return %y : tensor<{n}x{o}x{out}x{out}xf64>
  }}
}}
"""
    return text, out


@pytest.fixture(name="conv_ir")
def conv_ir_fixture():  # noqa: ANN201
    """`conv_ir(n, c, h, o, k, stride, dil, pad, groups=1)` (see the function)."""
    return conv_ir


@pytest.fixture(name="scalar_loss")
def scalar_loss_fixture():  # noqa: ANN201
    """`scalar_loss(func, results=None)` (see the function)."""
    return scalar_loss


@pytest.fixture(name="gradcheck")
def gradcheck_fixture():  # noqa: ANN201 - returns the helper
    """`gradcheck(func, inputs, wrt, ...)` (see the function of that name)."""
    return gradcheck


@pytest.fixture(name="parse")
def parse_fixture():  # noqa: ANN201
    """`parse(text)` -> Module."""
    return parse


@pytest.fixture
def rng() -> np.random.Generator:
    """A seeded generator, so failures reproduce."""
    return np.random.default_rng(20261122)
