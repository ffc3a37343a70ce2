"""Compiled steps with the memory passes (docs/memory.md): compressed activations (ReLU masks,
bf16 storage) and rematerialisation under a budget, against the interpreter of the same
module; `nfc compile --memory-budget` and `--compress-activations` on the command line."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from runtime_lib import MLP_DIGITS, ROOT, assert_close, interp_step, scratch

BASE = "im2col,training-functions,inline,canonicalize,cse,dce"


def _compiled_vs_interpreter(source, passes: str, name: str):
    from nfc.codegen.artifact import build_artifact
    from nfc.passmanager import Context, PassManager, build_pipeline
    from nfc.runtime.build import frontend_module
    from nfc.runtime.loader import load

    def built(pipeline):  # the IR level memory model: no artifact built per measurement
        module, ctx = frontend_module(str(source)), Context()
        PassManager(build_pipeline(pipeline)).run(module, ctx)
        return module, ctx

    ref_module, ctx = built(f"{BASE},{passes}")
    module, _ = built(f"{BASE},{passes},fuse")
    art = build_artifact(module, functions=["train_step"])
    path = str(scratch("memory-" + name) / "m.so")
    art.write_shared(path)
    model = load(path)
    model.init(seed=3)
    state = model.state_dict()
    rng = np.random.default_rng(0)
    inputs = {}
    for s in model.functions["train_step"].inputs:
        inputs[s.name] = (rng.standard_normal(s.shape).astype(s.dtype) if s.dtype.kind == "f"
                          else rng.integers(0, 2, s.shape).astype(s.dtype))
    ref = interp_step(ref_module, "train_step", {**state, **inputs})
    out = model.train_step(**inputs)
    assert_close(out["loss"], ref["loss"], what="loss")
    for key, value in ref.items():
        if ":" in key:
            assert_close(model.tensors[key.split(":", 1)[1]], value, what=key)
    return ref_module, ctx


@pytest.mark.parametrize("mode", ["masks", "bf16"])
def test_compressed_step_matches_the_interpreter(mode):
    from nfc.passes.compress import with_compression

    passes = with_compression("", mode)
    module, ctx = _compiled_vs_interpreter(MLP_DIGITS, passes, mode)
    note = module.func("train_step").attrs["nf.compress"]
    assert note["masks"] >= 1 and (note["narrow"] >= 1) == (mode == "bf16")
    kinds = {str(op.result.dtype) for op in module.func("train_step").body.ops
             if op.attrs.get("nf.compress")}
    assert "i32" in kinds and ("bf16" in kinds) == (mode == "bf16")  # masks packed in i32 words


def test_remat_with_reductions_matches_the_interpreter():
    module, _ = _compiled_vs_interpreter(ROOT / "examples" / "resnet_block.nf",
                                         "remat{reductions=true}", "remat-red")
    assert module.func("train_step").attrs["nf.remat"]["values"] >= 1


def test_memory_budget_on_the_command_line(tmp_path):
    out = tmp_path / "m.so"
    ok = subprocess.run([sys.executable, "-m", "nfc", "compile", str(MLP_DIGITS), "-o", str(out),
                         "--function", "train_step", "--memory-budget", "100%",
                         "--compress-activations"], capture_output=True, text=True, timeout=600)
    assert ok.returncode == 0, ok.stderr
    assert "memory: peak" in ok.stderr
    bad = subprocess.run([sys.executable, "-m", "nfc", "compile", str(MLP_DIGITS), "-o", str(out),
                          "--memory-budget", "10KB"], capture_output=True, text=True, timeout=600)
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "cannot be met" in bad.stderr and "smallest feasible budget is" in bad.stderr
    assert "mlp_digits.nf:" in bad.stderr  # located at the model
    usage = subprocess.run([sys.executable, "-m", "nfc", "compile", str(MLP_DIGITS),
                            "--memory-budget", "lots"], capture_output=True, text=True,
                           timeout=600)
    assert usage.returncode != 0 and "not a memory budget" in usage.stderr
    assert "Traceback" not in usage.stderr


@pytest.mark.parametrize("source", [MLP_DIGITS, ROOT / "examples" / "lenet5.nf"],
                         ids=["mlp_digits", "lenet5"])
def test_bit_masks_train_to_the_same_bits(source):
    """Three compiled steps with ReLU masks packed in bits, in bytes, and without compression
    leave every parameter with the same bits (the masks are exact)."""
    from nfc.codegen.artifact import build_artifact
    from nfc.passmanager import Context, PassManager, build_pipeline
    from nfc.runtime.build import frontend_module
    from nfc.runtime.loader import load

    params = {"batch": 4} if source.name == "lenet5.nf" else {}
    finals = {}
    for name, passes in (("none", ""), ("bytes", "compress-activations{bits=false},"),
                         ("bits", "compress-activations{bits=true},")):
        module, ctx = frontend_module(str(source), params), Context()
        PassManager(build_pipeline(f"{BASE},{passes}".rstrip(","))).run(module, ctx)
        f = module.func("train_step")
        kinds = {str(op.result.dtype) for op in f.body.ops if op.attrs.get("nf.compress")}
        assert kinds == {"none": set(), "bytes": {"i1"}, "bits": {"i1", "i32"}}[name], name
        if name != "none":
            assert f.attrs["nf.compress"]["bits"] == (name == "bits")
        PassManager(build_pipeline("fuse")).run(module, ctx)
        path = str(scratch(f"bits-{source.stem}-{name}") / "m.so")
        build_artifact(module, functions=["train_step"]).write_shared(path)
        model = load(path)
        model.init(seed=5)
        rng = np.random.default_rng(1)
        for _ in range(3):
            inputs = {}
            for s in model.functions["train_step"].inputs:
                inputs[s.name] = (rng.standard_normal(s.shape).astype(s.dtype)
                                  if s.dtype.kind == "f"
                                  else rng.integers(0, 2, s.shape).astype(s.dtype))
            model.train_step(**inputs)
        finals[name] = {k: np.array(v) for k, v in model.state_dict().items()}
    for name in ("bytes", "bits"):
        assert finals[name].keys() == finals["none"].keys()
        for k, v in finals["none"].items():
            assert np.array_equal(finals[name][k], v), (name, k)
