"""The artifact: a whole training step in one native call, checked against the interpreter;
metadata, init, profiling, ABI and CPU-feature checks."""

from __future__ import annotations

import json
import subprocess

import numpy as np
import pytest
from runtime_lib import (
    ROOT,
    assert_close,
    built_library,
    digits_batch,
    interp_step,
    scratch,
    training_module,
)

from nfc.codegen.artifact.initgen import fans, parse_init, reference_init
from nfc.codegen.native import find_cc
from nfc.ir import DType
from nfc.runtime.loader import ArtifactError, check_cpu, load

TINY = str(ROOT / "tests" / "runtime" / "models" / "tiny.nf")


@pytest.fixture(scope="module")
def model():
    m = load(built_library())
    m.init(seed=7)
    return m


def test_train_step_matches_interpreter(model):
    module = training_module()
    x, y = digits_batch()
    before = model.state_dict()
    ref = interp_step(module, "train_step", {**before, "x": x, "y": y})
    out = model.train_step(x=x, y=y)
    assert_close(out["loss"], ref["loss"], what="loss")
    assert_close(out["logits"], ref["logits"], what="logits")
    for name, value in ref.items():
        if ":" in name:
            tensor = name.split(":", 1)[1]
            assert_close(model.tensors[tensor], value, what=name)
            if name.startswith("param:"):  # the step really moved the parameters
                assert not np.array_equal(model.tensors[tensor], before[tensor])
    model.load_state_dict(before)


def test_forward_and_eval_match_interpreter(model):
    module = training_module()
    x, y = digits_batch(seed=1)
    for fn in ("forward", "eval"):
        args = {a.name for a in module.func(fn).args}
        feeds = {k: v for k, v in model.tensors.items() if k in args}
        ref = interp_step(module, fn, {**feeds, "x": x, "y": y})
        out = model.functions[fn](x, y)
        assert_close(out["logits"], ref["logits"], what=f"{fn} logits")
        assert_close(out["loss"], ref["loss"], what=f"{fn} loss")


def test_parameters_are_updated_in_place_zero_copy(model):
    w1 = model.tensors["w1"]
    addr = w1.ctypes.data
    before = w1.copy()
    x, y = digits_batch(seed=2)
    model.train_step(x=x, y=y)
    assert model.tensors["w1"].ctypes.data == addr
    assert not np.array_equal(w1, before)
    assert addr % 64 == 0


def test_native_init_matches_reference_generator(model):
    model.init(seed=123)
    meta = {t["name"]: t for t in model.metadata["tensors"]}
    for name, arr in model.tensors.items():
        t = meta[name]
        ref = reference_init(name, t["init"], tuple(t["shape"]), DType(t["dtype"]), 123)
        np.testing.assert_allclose(arr, ref, rtol=1e-6, atol=1e-7, err_msg=name)
    # seeded: the same seed again gives the same bits, another seed other values
    w = model.tensors["w1"].copy()
    model.init(seed=123)
    assert np.array_equal(model.tensors["w1"], w)
    model.init(seed=124)
    assert not np.array_equal(model.tensors["w1"], w)
    # statistics: he_normal of a 64-input layer has std sqrt(2/64)
    model.init(seed=5)
    assert abs(float(model.tensors["w1"].std()) - np.sqrt(2 / 64)) < 0.01
    assert np.all(model.tensors["b1"] == 0) and np.all(model.tensors["w1_mom"] == 0)
    lim = np.sqrt(6 / (64 + 10))
    assert np.abs(model.tensors["w3"]).max() <= lim


def test_initializer_parsing_and_fans():
    assert fans((784, 256)) == (784, 256)
    assert fans((32, 3, 5, 5)) == (75, 800)
    assert parse_init("normal(0.0, 0.1)", (3,)).kind == "normal"
    assert parse_init("const(2.5)", (3,)).a == 2.5
    with pytest.raises(ValueError, match="unknown initializer"):
        parse_init("orthogonal", (3, 3))


def test_metadata_describes_the_model(model):
    meta = model.metadata
    assert meta["abi_version"] == 1 and meta["model"] == "mlp_digits"
    step = meta["functions"]["train_step"]
    roles = {a["name"]: a["role"] for a in step["args"]}
    assert roles["x"] == "input" and roles["w1"] == "param" and roles["w1_mom"] == "opt_state"
    inplace = {r["name"]: r["inplace"] for r in step["results"]}
    assert inplace["param:w1"] == "w1" and inplace["loss"] is None
    assert 0 < step["arena_bytes"] <= step["naive_bytes"]
    assert step["copies"] == 0  # every update lands in its parameter directly
    assert meta["target"]["features"] and "nf.optimizer" in meta["attributes"]


def _patched(path: str, old: bytes, new: bytes, name: str) -> str:
    """A copy of the artifact at `path` whose metadata (in the library and in the trailer)
    has `old` replaced by `new`, sealed again so that its hash is right."""
    from nfc.codegen.artifact.container import metadata_bytes, read_artifact, seal

    assert len(old) == len(new)
    sealed = read_artifact(path)
    meta = metadata_bytes(sealed.metadata)
    assert meta.count(old) == 1 and sealed.elf.count(old) == 1, old
    elf = sealed.elf.replace(old, new)
    d = scratch(name)
    out = d / "patched.so"
    out.write_bytes(seal(elf, json.loads(meta.replace(old, new))))
    return str(out)


def test_abi_mismatch_in_metadata_is_a_clear_error():
    path = _patched(built_library(), b'"abi_version": 1', b'"abi_version": 7', "abi")
    with pytest.raises(ArtifactError, match="ABI version 7"):
        load(path)


def test_missing_cpu_feature_is_a_clear_error():
    path = built_library()
    meta = load(path, check_cpu_features=False).metadata
    feat = next(f for f in meta["target"]["features"] if len(f) >= 4)
    fake = ("q" * len(feat)).encode()
    patched = _patched(path, f'"{feat}"'.encode(), b'"' + fake + b'"', "cpu")
    with pytest.raises(ArtifactError, match=f"features this host lacks: {fake.decode()}"):
        load(patched)
    with pytest.raises(ArtifactError, match="avx512f"):
        check_cpu({"target": {"cpu": "x", "features": ["avx512f", "sse2"]}}, "m.so",
                  host={"sse2"})


def test_not_an_artifact_and_bad_calls(model, tmp_path):
    src = tmp_path / "other.c"
    src.write_text("int other(void) { return 1; }\n")
    lib = tmp_path / "libother.so"
    subprocess.run([find_cc(), "-shared", "-fPIC", "-o", str(lib), str(src)], check=True)
    with pytest.raises(ArtifactError, match="not an nfc artifact"):
        load(lib)
    with pytest.raises(ArtifactError, match="no such file"):
        load(tmp_path / "missing.so")
    x, y = digits_batch()
    with pytest.raises(ArtifactError, match=r"shape \[64, 64\]"):
        model.train_step(x=x[:10], y=y)
    with pytest.raises(ArtifactError, match="missing input 'y'"):
        model.train_step(x=x)
    with pytest.raises(ArtifactError, match="unknown input"):
        model.train_step(x=x, y=y, z=y)


def test_profiled_build_records_every_kernel():
    m = load(built_library(TINY, profile=True))
    m.init(0)
    x, y = digits_batch(16)
    m.train_step(x=x, y=y)
    ev = m.train_step.profile_events()
    kernels = m.metadata["functions"]["train_step"]["kernels"]
    assert ev.shape == (len(kernels), 2)
    assert np.all(ev[:, 1] >= ev[:, 0]) and np.all(ev[1:, 0] >= ev[:-1, 1])
    assert all(k["flops"] >= 0 and k["bytes"] > 0 for k in kernels)
    from nfc.runtime.profile import Profiler

    prof = Profiler(kernels)
    prof.add(ev, 0)
    assert "GFLOP/s" in prof.table()
    trace = prof.chrome_trace()
    assert sum(1 for e in trace["traceEvents"] if e.get("ph") == "X") == len(kernels) + 1
    json.dumps(trace)


def test_state_rng_and_adam_step_match_interpreter():
    """Batch-norm running statistics (state, in place), dropout (the rng argument) and Adam's
    integer step counter, over two steps, against the interpreter."""
    source = str(ROOT / "tests" / "runtime" / "models" / "bn_dropout.nf")
    module = training_module(source)
    m = load(built_library(source))
    m.init(seed=2)
    g = np.random.default_rng(4)
    for step in range(2):
        x = g.standard_normal((16, 64)).astype(np.float32)
        y = g.integers(0, 10, 16).astype(np.int32)
        rng = np.array([9, step], np.int64)
        ref = interp_step(module, "train_step", {**m.state_dict(), "x": x, "y": y, "rng": rng})
        out = m.train_step(x=x, y=y, rng=rng)
        for r in m.train_step.results:
            got = m.tensors[r["inplace"]] if r["inplace"] else out[r["name"]]
            assert_close(got, ref[r["name"]], what=f"step {step} {r['name']}")
    assert int(m.tensors["step"]) == 2
    assert not np.allclose(m.tensors["rm"], 0) and not np.allclose(m.tensors["rv"], 1)
    # eval was compiled with training off: running statistics, no dropout, deterministic
    x = g.standard_normal((16, 64)).astype(np.float32)
    a = m.eval(x=x, y=np.zeros(16, np.int32), rng=(1, 1))["logits"]
    b = m.eval(x=x, y=np.zeros(16, np.int32), rng=(2, 7))["logits"]
    assert np.array_equal(a, b)
    ref = interp_step(module, "eval", {**{k: v for k, v in m.tensors.items()
                                          if k in {a.name for a in module.func("eval").args}},
                                       "x": x, "y": np.zeros(16, np.int32),
                                       "rng": np.zeros(2, np.int64)})
    assert_close(a, ref["logits"], what="eval logits")


def test_library_cache_key_names_the_functions_built():
    from runtime_lib import MLP_DIGITS

    from nfc.runtime.build import model_module, module_key

    m = model_module(MLP_DIGITS)
    full = module_key(m, profile=False, target_key="t")
    fwd = module_key(m, profile=False, target_key="t", functions=["forward"])
    both = module_key(m, profile=False, target_key="t", functions=["forward", "eval"])
    assert len({full, fwd, both}) == 3  # a library of some entries is not the whole one
    assert both == module_key(m, profile=False, target_key="t", functions=["eval", "forward"])
