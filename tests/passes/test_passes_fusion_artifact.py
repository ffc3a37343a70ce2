"""Fused training steps in the compiled artifact: one native kernel per `nf.kernel`, the
optimizer's in-place updates still written straight into the parameters (no copies), and the
same results as the interpreter running the unfused step."""

from __future__ import annotations

import numpy as np
from fusion_testlib import EXAMPLES, SMALL_MLP, step_inputs, train_module

from nfc.interp import run
from nfc.ir import KernelOp

SETTINGS = [f"{k}={v}" for k, v in SMALL_MLP.items()]


def test_fused_mlp_artifact_matches_interpreter(tmp_path, monkeypatch):
    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path))
    fused = compile_model(EXAMPLES / "mlp.nf", str(tmp_path / "f.so"), settings=SETTINGS,
                          tuning=False, use_cache=False)
    plain = compile_model(EXAMPLES / "mlp.nf", str(tmp_path / "p.so"), settings=SETTINGS,
                          tuning=False, use_cache=False, fuse=False)
    step_f = fused.module.func("train_step")
    assert any(isinstance(op, KernelOp) for op in step_f.body.ops)
    mf, mp = load(fused.path), load(plain.path)
    meta_f = mf.metadata["functions"]["train_step"]
    meta_p = mp.metadata["functions"]["train_step"]
    assert len(meta_f["kernels"]) < len(meta_p["kernels"]) / 3
    assert meta_f["copies"] == 0 == meta_p["copies"]  # in-place updates kept
    ref = train_module("mlp.nf", SMALL_MLP)
    f0 = ref.func("train_step")
    for m in (mf, mp):
        m.init(seed=3)
    for seed in range(2):  # two steps: the second starts from in-place updated parameters
        feeds = {a.name: x for a, x in zip(f0.args, step_inputs(f0, seed), strict=True)}
        before = mf.state_dict()
        want = dict(zip(f0.attrs["nf.results"],
                        run(f0, {**feeds, **before}, module=ref), strict=True))
        w1 = mf.tensors["w1"].ctypes.data
        got = mf.train_step(x=feeds["x"], y=feeds["y"])
        mp.train_step(x=feeds["x"], y=feeds["y"])
        assert mf.tensors["w1"].ctypes.data == w1
        np.testing.assert_allclose(got["loss"], want["loss"], rtol=1e-4)
        for name, value in want.items():
            if ":" in name:
                tensor = name.split(":", 1)[1]
                np.testing.assert_allclose(mf.tensors[tensor], value, rtol=1e-4, atol=1e-6)
                np.testing.assert_allclose(mf.tensors[tensor], mp.tensors[tensor],
                                           rtol=1e-4, atol=1e-6)
