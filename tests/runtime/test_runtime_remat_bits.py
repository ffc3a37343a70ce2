"""Rematerialisation and compressed masks change where values live, not what is computed:
compiled, a ResNet-18 (quick sizes) trained 3 steps with `compress-activations` (masks), and
(opt-in) with `remat` and `compress-activations,remat`, ends with every parameter, optimizer
and batch-norm state bit for bit equal to the default build's (docs/memory.md, "Batch
doubling under a budget").

The options change how `fuse` groups kernels, and a stage's default schedule (the order in
which a float sum adds) is chosen from its body after inlining: on the forced AVX2 path, at
these sizes, every one of the 164 tensors differed after 3 steps with masks alone until the
build scheduled the option's float sums as the build without it does
(nfc.runtime.sum_orders). The masks build takes about 15 s; the `remat` builds measure their
candidates with the memory model (about a minute each), so they run with `NFC_REMAT_BITS=1`.
Check both CPU paths: NFC_CPU_FEATURES=-avx512f,-avx512bw,-avx512dq,-avx512vl,-avx512bf16,
-avx512vnni runs the AVX2 one on an AVX-512 host."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from runtime_lib import ROOT, scratch

BASE = "im2col,training-functions,inline,canonicalize,cse,dce"
REST = "apply-tuning,fuse"
RESNET = ROOT / "examples" / "models" / "resnet18.nf"
QUICK = {"batch": 2, "image": 8, "width": 4}
LONG = pytest.mark.skipif(os.environ.get("NFC_REMAT_BITS") != "1",
                          reason="remat builds take about a minute each; NFC_REMAT_BITS=1")


def _trained(middle: str, tag: str, steps: int = 3
             ) -> tuple[dict[str, np.ndarray], set[str], str]:
    """The state after `steps` steps of the build with `middle` between the cleanup and
    tuning (as benchmarks/batch_doubling.py), the memory attributes its step holds and the
    build's sum-orders summary."""
    from nfc.runtime.build import build_library, build_module
    from nfc.runtime.loader import load

    pipeline = ",".join(p for p in (BASE, middle, REST) if p)
    module, ctx = build_module(str(RESNET), QUICK, {}, pipeline)
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
    state = {k: np.array(v) for k, v in model.state_dict().items()}
    return state, marks, ctx.remarks.get("sum-orders", "")


@pytest.fixture(scope="module")
def default_state() -> dict[str, np.ndarray]:
    state, marks, orders = _trained("", "default")
    assert not marks and not orders  # the build without options is left alone
    return state


@pytest.mark.parametrize("middle, marks", [
    ("compress-activations", {"nf.compress"}),
    pytest.param("remat", {"nf.remat"}, marks=LONG),
    pytest.param("compress-activations,remat", {"nf.remat", "nf.compress"}, marks=LONG),
], ids=["masks", "remat", "masks-remat"])
def test_memory_options_train_to_the_same_bits(default_state, middle, marks):
    state, got, orders = _trained(middle, middle.replace(",", "-"))
    assert got == marks  # the option did something: recomputed values (and packed masks)
    # every float sum of the build was found in the reference and took its schedule
    m = re.match(r"sum orders: (\d+) of (\d+) float sums", orders)
    assert m and int(m[2]) > 0 and "could not be" not in orders, orders
    assert state.keys() == default_state.keys()
    differ = [k for k, v in default_state.items() if not np.array_equal(state[k], v)]
    assert not differ, f"{len(differ)} of {len(state)} tensors differ: {differ[:6]}"
