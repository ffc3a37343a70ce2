"""The character-level LSTM language model learns from real text through the interpreter's
`@train_step`, starting from the model's own declared initializers."""

from __future__ import annotations

import numpy as np
import pytest
from models_lib import ROOT, char_corpus, run_named

pytest.importorskip("nfc.passes.autodiff.train", reason="the autodiff pass is not available")


def test_lstm_lm_loss_falls_on_python_docs() -> None:
    from nfc.codegen.artifact.initgen import reference_init
    from nfc.passes.autodiff.train import build_training_module

    batch, steps = 8, 8
    module = build_training_module(str(ROOT / "examples/models/lstm_lm.nf"),
                                   {"batch": batch, "steps": steps, "embed": 16, "hidden": 32})
    step = module.func("train_step")
    args = {}
    for a, attrs in zip(step.args, step.arg_attrs, strict=True):
        if attrs["nf.role"] in ("param", "opt_state"):
            args[a.name] = reference_init(a.name, attrs["nf.init"], a.shape, a.dtype, seed=1)
    text = char_corpus()
    assert text.max() < 128 and len(text) > 100_000
    rng = np.random.default_rng(0)
    losses = []
    for _ in range(20):
        starts = rng.integers(0, len(text) - steps - 1, size=batch)
        windows = np.stack([text[s:s + steps + 1] for s in starts])
        args["ids"], args["targets"] = windows[:, :-1], windows[:, 1:]
        res = run_named(step, module, args)
        for name, value in res.items():
            if ":" in name:
                args[name.split(":", 1)[1]] = value
        losses.append(float(res["loss"]))
    assert np.isfinite(losses).all()
    assert losses[0] == pytest.approx(np.log(128), abs=0.2)   # uniform over the vocabulary
    assert np.mean(losses[-5:]) < np.mean(losses[:3]) - 0.4, losses
