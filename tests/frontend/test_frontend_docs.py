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
