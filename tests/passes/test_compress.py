"""Compressed saved activations (passes/compress.py, docs/memory.md): ReLU masks give the same
bits, bf16 storage changes the gradients by what bf16 rounding allows and not the loss, the
saved bytes and the arena go down, and the pass never keeps a change the memory model finds
worse. Golden tests: tests/golden/compress/; the compiled steps:
tests/runtime/test_runtime_memory_compress.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np

from nfc.passes.memplan import memory_report

ROOT = Path(__file__).resolve().parents[2]
LENET = ROOT / "examples" / "lenet5.nf"
BEFORE_FUSION = "im2col,training-functions,inline,canonicalize,cse,dce"


def _module(pipeline: str, source: Path = LENET, **params):
    from nfc.runtime.build import build_module

    return build_module(str(source), params or {"batch": 4}, {}, pipeline)


def _run(module, seed: int = 0):
    from nfc.interp import run

    f = module.func("train_step")
    rng = np.random.default_rng(seed)
    args = []
    for a in f.args:
        if a.dtype.is_float:
            args.append((0.5 * rng.standard_normal(a.shape)).astype(a.dtype.numpy))
        else:
            args.append(rng.integers(0, 2, a.shape).astype(a.dtype.numpy))
    outs = run(f, list(args), module=module)
    names = f.attrs["nf.results"]
    before = {f"{attrs.get('nf.role')}:{a.name}": x
              for a, attrs, x in zip(f.args, f.arg_attrs, args, strict=True)}
    return dict(zip(names, (np.asarray(o) for o in outs), strict=True)), before


def test_masks_lower_the_saved_bytes_and_keep_the_bits():
    m0, _ = _module(BEFORE_FUSION)
    m1, ctx = _module(BEFORE_FUSION + ",compress-activations")
    f0, f1 = m0.func("train_step"), m1.func("train_step")
    note = f1.attrs["nf.compress"]
    assert note["masks"] >= 2 and note["narrow"] == 0  # the ReLUs of lenet5
    masks = [op for op in f1.body.ops if op.attrs.get("nf.compress") == "bits"]
    assert len(masks) == note["masks"] and all(str(op.result.dtype) == "i32" for op in masks)
    r0, r1 = memory_report(f0), memory_report(f1)
    assert r1.saved_total < r0.saved_total and r1.lower_bound < r0.lower_bound
    assert note["arena_after"] <= note["arena_before"]
    assert "masks" in ctx.remarks["compress-activations"]
    a, _ = _run(m0)
    b, _ = _run(m1)
    for k in a:
        assert np.array_equal(a[k], b[k]), k  # the same comparisons, made earlier


def test_bf16_storage_changes_the_gradients_by_rounding_only():
    m0, _ = _module(BEFORE_FUSION)
    m1, _ = _module(BEFORE_FUSION + ",compress-activations{dtype=bf16}")
    f1 = m1.func("train_step")
    assert f1.attrs["nf.compress"]["narrow"] >= 1
    assert any(str(op.result.dtype) == "bf16" for op in f1.body.ops)
    a, before = _run(m0)
    b, _ = _run(m1)
    assert np.array_equal(a["loss"], b["loss"])  # the forward pass is untouched
    changed = 0
    for k in a:
        if k not in before:
            continue
        da, db = a[k] - before[k], b[k] - before[k]  # each parameter's update
        scale = float(np.max(np.abs(da)))
        # bf16 keeps 8 significant bits: the updates move by a few 2^-8 of their size
        assert float(np.max(np.abs(da - db))) <= 0.05 * scale + 1e-7, k
        changed += not np.array_equal(da, db)
    assert changed  # and the rounding does show


def test_never_kept_when_the_model_says_worse():
    from nfc.passes.compress import CompressActivations
    from nfc.passmanager import Context

    m, _ = _module(BEFORE_FUSION)
    text = m.func("train_step").body.ops

    def punishing(func):
        rep = memory_report(func)
        n = sum(1 for op in func.body.ops if op.attrs.get("nf.compress"))
        return replace(rep, arena=rep.arena + 10_000_000 * n)

    ctx = Context()
    ctx.memory_model = punishing
    n_ops = len(text)
    CompressActivations().apply(ctx, m)
    f = m.func("train_step")
    assert "nf.compress" not in f.attrs and len(f.body.ops) == n_ops
    assert "not kept" in ctx.remarks["compress-activations"]


def test_compression_flag_pipelines():
    from nfc.passes.compress import with_compression

    base = "im2col,training-functions,inline,canonicalize,cse,dce,apply-tuning,fuse"
    assert with_compression(base) == base.replace("dce,", "dce,compress-activations,")
    both = "im2col,training-functions,inline,canonicalize,cse,dce,remat,fuse"
    assert with_compression(both, "bf16") == both.replace(
        "dce,", "dce,compress-activations{dtype=bf16},")
    try:
        with_compression(base, "int4")
    except ValueError as exc:
        assert "int4" in str(exc)
    else:
        raise AssertionError("a bad mode was accepted")


def test_bits_take_an_eighth_of_the_bytes():
    m1, _ = _module(BEFORE_FUSION + ",compress-activations{bits=false}")
    m2, _ = _module(BEFORE_FUSION + ",compress-activations")
    f1, f2 = m1.func("train_step"), m2.func("train_step")
    byte_masks = {op.result.name.removesuffix("_mask"): op.result.type.nbytes
                  for op in f1.body.ops if op.attrs.get("nf.compress") == "mask"}
    bit_masks = {op.result.name.removesuffix("_bits"): op.result.type.nbytes
                 for op in f2.body.ops if op.attrs.get("nf.compress") == "bits"}
    assert byte_masks and byte_masks.keys() == bit_masks.keys()
    for k, n in byte_masks.items():  # one byte an element -> one bit, rounded up to words
        assert n // 8 <= bit_masks[k] <= n // 8 + 4 * max(1, n // 32 // 8), (k, n, bit_masks[k])
    assert memory_report(f2).saved_total < memory_report(f1).saved_total
    a, _ = _run(m1)
    b, _ = _run(m2)
    for k in a:
        assert np.array_equal(a[k], b[k]), k


def _relu_step(shape: tuple[int, ...], cmp: str = ">") -> str:
    dims = ", ".join(f"i{j}: {n}" for j, n in enumerate(shape))
    idx = ", ".join(f"i{j}" for j in range(len(shape)))
    t = "x".join(map(str, shape)) + "xf32"
    back = '{nf.phase = "backward"}'
    return f"""nf.func @train_step(%x: tensor<{t}>, %y: tensor<{t}>) -> (tensor<{t}>) {{
  %a = nf.compute [{dims}] (%x[{idx}] * 2.0) : tensor<{t}>
  %h = nf.compute [{dims}] (max(%a[{idx}], 0.0)) : tensor<{t}>
  %s = nf.compute [] sum [{dims}] (%h[{idx}]) : tensor<f32>
  %t = nf.compute [{dims}] (%y[{idx}] * %s[]) {back} : tensor<{t}>
  %d = nf.compute [{dims}] (select(%a[{idx}] {cmp} 0.0, %t[{idx}], -1.0)) {back} : tensor<{t}>
  nf.return %d : tensor<{t}>
}}"""


def test_bit_masks_of_odd_shapes_agree_in_the_interpreter():
    """Shapes whose element count is no multiple of 32 (and ones that are), values with
    exact zeros on the comparison's edge: the packed masks read back the same comparisons."""
    from nfc.interp import run
    from nfc.irparser import parse_module
    from nfc.passes.compress import compress_func

    rng = np.random.default_rng(7)
    shapes = [(1,), (3,), (31,), (33,), (5, 7), (64, 3), (2, 3, 5), (4, 1, 9, 2), (3, 32)]
    for shape in shapes:
        for cmp in (">", "<=", "!="):
            plain = parse_module(_relu_step(shape, cmp)).func("train_step")
            packed = parse_module(_relu_step(shape, cmp)).func("train_step")
            stats = compress_func(packed)
            assert stats["masks"] == 1, (shape, cmp)
            bits = [op for op in packed.body.ops if op.attrs.get("nf.compress") == "bits"]
            assert len(bits) == 1 and str(bits[0].result.dtype) == "i32"
            size = int(np.prod(shape))
            assert bits[0].result.type.nbytes <= 4 * size  # never more than the f32 value
            x = rng.integers(-2, 3, shape).astype(np.float32)  # zeros on the edge
            y = rng.standard_normal(shape).astype(np.float32)
            a = np.asarray(run(plain, [x, y])[0])
            b = np.asarray(run(packed, [x, y])[0])
            assert np.array_equal(a, b), (shape, cmp)
