"""Rematerialisation and compressed masks change where values live, not what is computed:
compiled, a ResNet-18 (quick sizes) trained 3 steps with `remat`, and with
`compress-activations,remat`, ends with every parameter, optimizer and batch-norm state bit
for bit equal to the default build's (docs/memory.md, "Batch doubling under a budget").

The options change how `fuse` groups kernels, so one reduction is lowered in stages of
different shapes: at these sizes a batch-norm gradient sum `sum(n, h, w) -d_xc` reads a stored
`x - mean` in one build and recomputes it in the other, whose default schedule is then scalar
instead of vectorized over the channels. Before float sums were emitted without `reassoc`
(nfc.codegen.llvm.emitter, `combine`), LLVM reordered the scalar accumulation and every
tensor differed after 3 steps. (At ResNet-18's full sizes, and at these sizes on an AVX2
target, the default schedules themselves still differ in order for some sums, docs/memory.md:
a known open defect of issue 18, so this check is opt-in, `NFC_REMAT_BITS=1`, until the
default build's sum schedules are reused by option builds.)"""

from __future__ import annotations

import os

import numpy as np
import pytest
from runtime_lib import ROOT, scratch

pytestmark = pytest.mark.skipif(
    os.environ.get("NFC_REMAT_BITS") != "1",
    reason="bit equality of remat builds holds on AVX-512 hosts but not on AVX2 yet "
           "(docs/memory.md); set NFC_REMAT_BITS=1 to check")

BASE = "im2col,training-functions,inline,canonicalize,cse,dce"
REST = "apply-tuning,fuse"
RESNET = ROOT / "examples" / "models" / "resnet18.nf"
QUICK = {"batch": 2, "image": 8, "width": 4}


def _trained(middle: str, tag: str, steps: int = 3) -> tuple[dict[str, np.ndarray], set[str]]:
    """The state after `steps` steps of the build with `middle` between the cleanup and
    tuning (as benchmarks/batch_doubling.py), and the memory attributes its step holds."""
    from nfc.runtime.build import build_library, build_module
    from nfc.runtime.loader import load

    pipeline = ",".join(p for p in (BASE, middle, REST) if p)
    module, _ = build_module(str(RESNET), QUICK, {}, pipeline)
    marks = {key for op in module.func("train_step").body.walk()
             for key in ("nf.remat", "nf.compress") if op.attrs.get(key)}
    built = build_library(module, str(scratch(f"remat-bits-{tag}") / "m.so"),
                          use_cache=False, functions=["train_step"])
    model = load(built.path)
    model.set_num_threads(1)
    model.init(seed=7)
    rng = np.random.default_rng(2)
    for _ in range(steps):
        inputs = {s.name: (rng.standard_normal(s.shape).astype(s.dtype) if s.dtype.kind == "f"
                           else rng.integers(0, 10, s.shape).astype(s.dtype))
                  for s in model.functions["train_step"].inputs}
        model.train_step(**inputs)
    return {k: np.array(v) for k, v in model.state_dict().items()}, marks


@pytest.fixture(scope="module")
def default_state() -> dict[str, np.ndarray]:
    state, marks = _trained("", "default")
    assert not marks
    return state


@pytest.mark.parametrize("middle, marks", [
    ("remat", {"nf.remat"}),
    ("compress-activations,remat", {"nf.remat", "nf.compress"}),
], ids=["remat", "masks-remat"])
def test_memory_options_train_to_the_same_bits(default_state, middle, marks):
    state, got = _trained(middle, middle.replace(",", "-"))
    assert got == marks  # the option did something: recomputed values (and packed masks)
    assert state.keys() == default_state.keys()
    differ = [k for k, v in default_state.items() if not np.array_equal(state[k], v)]
    assert not differ, f"{len(differ)} of {len(state)} tensors differ: {differ[:6]}"
