"""The complete example of docs/language.md compiles, verifies and runs."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

from nfc.frontend import compile_source
from nfc.interp import run
from nfc.verifier import verify

DOC = Path(__file__).resolve().parents[2] / "docs" / "language.md"


def example() -> str:
    text = DOC.read_text()
    part = text[text.index("## A complete example"):]
    return re.search(r"```\n(.*?)```", part, re.S).group(1)  # type: ignore[union-attr]


def test_language_doc_example_compiles_and_runs() -> None:
    src = example()
    train = compile_source(src, "tiny.nf")
    verify(train)
    f = train.func("forward")
    assert f.attrs["nf.results"] == ["loss", "logits", "state:mean"]
    rng = np.random.default_rng(0)
    inputs = {a.name: (rng.standard_normal(a.shape).astype(np.float32) if a.dtype.is_float
                       else rng.integers(0, 3, a.shape).astype(a.dtype.numpy))
              for a in f.args}
    inputs["rng"] = np.array([5, 0], np.int64)
    loss, logits, mean = run(f, inputs)
    assert np.isfinite(loss) and logits.shape == (32, 3) and mean.shape == (64,)
    infer = compile_source(src, "tiny.nf", training=False)
    verify(infer)
    assert len(infer.func("forward").body.ops) < len(f.body.ops)


def _section(title: str) -> str:
    text = DOC.read_text()
    part = text[text.index(title):]
    return re.search(r"```\n(.*?)```", part, re.S).group(1)  # type: ignore[union-attr]


def test_min_max_subscript_example_runs_and_differentiates() -> None:
    """The example of "`min` and `max` in subscripts": values as its comments say, and the
    gradient of the parameter equals central differences (float64)."""
    from nfc.passes.autodiff.graph import grad_func

    src = _section("### `min` and `max` in subscripts").replace("f32", "f64")
    module = compile_source(src, "clamp.nf")
    verify(module)
    f = module.func("forward")
    from nfc.printer import print_module

    assert "[min(i + 2, 5)]" in print_module(module)  # as the doc says the IR prints it
    rng = np.random.default_rng(1)
    args = {"x": rng.standard_normal(6), "z": rng.standard_normal((2, 4)),
            "s": rng.standard_normal(6)}
    loss, a, p = run(f, args)
    xs = args["x"] * args["s"]
    np.testing.assert_allclose(a, xs[[2, 3, 4, 5, 5, 5]])
    np.testing.assert_allclose(p, args["z"][:, [0, 0, 1, 2, 3, 3]])
    g = grad_func(f, ["s", "x"])
    _, ds, dx = run(g, args)

    def loss_at(name: str, k: int, eps: float) -> float:
        moved = {n: v.copy() for n, v in args.items()}
        moved[name][k] += eps
        return float(run(f, moved)[0])

    for name, grad in (("s", ds), ("x", dx)):
        fd = [(loss_at(name, k, 1e-6) - loss_at(name, k, -1e-6)) / 2e-6 for k in range(6)]
        np.testing.assert_allclose(grad, fd, rtol=1e-6, atol=1e-8)
    assert ds[0] == 0.0 and ds[1] == 0.0  # elements the shift never reads
