"""Batch slices (nfc.codegen.lowering.slices): a convolution's column gradient and its col2im,
fused into one kernel, run per batch element with a one-image column gradient.

Checked, with the size threshold lowered so the small convolutions here are sliced: the loop
IR (a serial batch loop around both nests, the temporary one image large); the group compiled
as one function bit for bit against the whole-batch group and against the interpreter
(strided, padded, dilated and 1 x 1 strided convolutions); whole training steps compiled
(the artifact's composite calls the one-image stage kernels in a loop) bit for bit against the
build without slices, with a smaller workspace. Run again on the AVX2 path with
NFC_CPU_FEATURES=-avx512f,... (other tiles and panel widths)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from codegen_lib import assert_matches, inputs_of, random_inputs

from nfc.codegen.jit import compile_kernel, lower_kernel
from nfc.codegen.loops import Allocate, For, LoopKind, print_loops
from nfc.codegen.lowering import slices
from nfc.ir import (
    Axis,
    Block,
    ComputeOp,
    Index,
    KernelOp,
    Load,
    TensorType,
    YieldOp,
    substitute_values,
)
from nfc.runtime.build import build_module

MODEL = """
import std.nn

model convs(batch = 3) {
  input  x: f32[batch, 3, 11, 11]
  input  y: i32[batch]
  param  k0: f32[4, 3, 3, 3] = he_normal
  param  k1: f32[8, 4, 3, 3] = he_normal
  param  k2: f32[8, 8, 3, 3] = he_normal
  param  k3: f32[5, 8, 1, 1] = he_normal
  param  w: f32[45, 4] = glorot_uniform
  param  b: f32[4] = zeros
  h0 = relu_4d(conv2d<padding = 1>(x, k0))                 # 4 x 11 x 11
  h1 = relu_4d(conv2d<stride = 2, padding = 1>(h0, k1))    # 8 x 6 x 6
  h2 = relu_4d(conv2d<padding = 2, dilation = 2>(h1, k2))  # 8 x 6 x 6
  h3 = conv2d<stride = 2>(h2, k3)                          # 5 x 3 x 3, a strided 1 x 1
  loss = softmax_cross_entropy(linear(reshape<[batch, 45]>(h3), w, b), y)
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
"""
BASE = "im2col{implicit=false},training-functions,inline,canonicalize,cse,dce"


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    p = tmp_path_factory.mktemp("slices") / "convs.nf"
    p.write_text(MODEL, encoding="utf-8")
    return p


def _pairs(source: Path) -> list[KernelOp]:
    """Each input gradient of the step's convolutions over columns as a group of two: the
    column gradient (a sum read only by the next compute) and its col2im."""
    module, _ = build_module(str(source), {}, {}, BASE)
    ops = [op for op in module.func("train_step").body.ops if isinstance(op, ComputeOp)]
    out = []
    for a in ops:
        readers = [op for op in ops if a.result in op.operands]
        if not (a.reduce == "sum" and len(readers) == 1 and "_cols" in (a.result.name or "")
                and len(a.dims) == 6):
            continue
        b = readers[0]
        a1 = ComputeOp(a.result.type, a.dims, a.body, reduce=a.reduce, raxes=a.raxes,
                       name=a.result.name)
        b1 = ComputeOp(b.result.type, b.dims, substitute_values(b.body, {a.result: a1.result}),
                       reduce=b.reduce, raxes=b.raxes, name=b.result.name)
        out.append(KernelOp(Block([a1, b1, YieldOp([b1.result])])))
    return out


def test_the_step_has_column_gradients(source):
    # the input gradients of the three convolutions after the first (the first one's is dead)
    assert len(_pairs(source)) == 3


@pytest.mark.parametrize("which", [0, 1, 2], ids=["dilated", "strided-padded", "one-by-one"])
def test_sliced_groups_are_bit_identical(source, monkeypatch, which):
    kop = _pairs(source)[which]
    cols = kop.body.ops[0].result
    ins = random_inputs(inputs_of(kop), seed=4)
    monkeypatch.setattr(slices, "SLICE_BYTES", 1 << 62)
    whole = lower_kernel(kop)
    assert "nb" not in print_loops(whole.loops)
    want = compile_kernel(kop)(*ins)
    monkeypatch.setattr(slices, "SLICE_BYTES", 0)
    info = lower_kernel(kop)
    body = info.loops.body
    assert isinstance(body, Allocate) and body.buffer.shape == (1, *cols.shape[1:])
    assert isinstance(body.body, For) and body.body.kind is LoopKind.SERIAL
    assert body.body.extent.value == cols.shape[0]  # type: ignore[attr-defined]
    assert info.workspace_bytes < whole.workspace_bytes
    got = compile_kernel(kop)(*ins)
    assert np.array_equal(got, want)
    assert_matches(kop, ins, [got])


def test_a_temporary_read_elsewhere_is_not_sliced(source, monkeypatch):
    # the column gradient as an output of the group: kept whole
    kop = _pairs(source)[1]
    a, b = kop.body.ops[0], kop.body.ops[1]
    a1 = ComputeOp(a.result.type, a.dims, a.body, reduce=a.reduce, raxes=a.raxes, name="c")
    b1 = ComputeOp(b.result.type, b.dims, substitute_values(b.body, {a.result: a1.result}),
                   reduce=b.reduce, raxes=b.raxes, name="dx")
    both = KernelOp(Block([a1, b1, YieldOp([a1.result, b1.result])]))
    monkeypatch.setattr(slices, "SLICE_BYTES", 0)
    assert "nb" not in print_loops(lower_kernel(both).loops)
    assert any(isinstance(e, Load) for e in b1.body.walk())


def _trained(source: Path, tag: str, tmp: Path, steps: int = 2):
    from nfc.runtime.build import build_library
    from nfc.runtime.loader import load

    module, _ = build_module(str(source), {}, {}, f"{BASE},fuse")
    (tmp / tag).mkdir()
    built = build_library(module, str(tmp / tag / "m.so"), use_cache=False,
                          functions=["train_step"])
    model = load(built.path)
    model.set_num_threads(2)
    model.init(seed=7)
    rng = np.random.default_rng(2)
    for _ in range(steps):
        inputs = {s.name: (rng.standard_normal(s.shape).astype(s.dtype) if s.dtype.kind == "f"
                           else rng.integers(0, 4, s.shape).astype(s.dtype))
                  for s in model.functions["train_step"].inputs}
        model.train_step(**inputs)
    return {k: np.array(v) for k, v in model.state_dict().items()}, built


def test_sliced_training_steps_are_bit_identical(source, monkeypatch, tmp_path):
    # the artifact runs a fused group's stages as kernels of their own (a composite): the
    # sliced stages are one-image kernels called in a loop over the batch
    monkeypatch.setattr(slices, "SLICE_BYTES", 1 << 62)
    want, whole = _trained(source, "whole", tmp_path)
    monkeypatch.setattr(slices, "SLICE_BYTES", 0)
    got, sliced = _trained(source, "sliced", tmp_path)
    loops = [c.slices for c in sliced.artifact.kernel_set.composites.values() if c.slices]
    assert loops and not [c for c in whole.artifact.kernel_set.composites.values() if c.slices]
    peaks = [b.artifact.plans["train_step"].memory_report().total for b in (whole, sliced)]
    assert peaks[1] <= peaks[0]
    assert got.keys() == want.keys()
    differ = [k for k, v in want.items() if not np.array_equal(got[k], v)]
    assert not differ, differ
    assert any(not np.array_equal(v, 0) for v in got.values())


def test_a_stage_between_the_pair_is_run_after_it(source, monkeypatch):
    # fuse may put another stage between the column gradient and its col2im (CapsNet at batch
    # 20: the weight gradient): the col2im moves up when it reads nothing that stage makes
    kop = _pairs(source)[1]
    a, b = kop.body.ops[0], kop.body.ops[1]
    dy = next(v for v in a.operands if len(v.shape) == 4)
    a1 = ComputeOp(a.result.type, a.dims, a.body, reduce=a.reduce, raxes=a.raxes, name="c")
    mid = ComputeOp(TensorType(dy.shape[1:2], dy.dtype), (Axis("o", dy.shape[1]),),
                    Load(dy, (Index("m"), Index("o"), Index("i"), Index("j"))), reduce="sum",
                    raxes=tuple(Axis(x, e) for x, e in zip("mij", (dy.shape[0], *dy.shape[2:]),
                                                           strict=True)), name="mid")
    b1 = ComputeOp(b.result.type, b.dims, substitute_values(b.body, {a.result: a1.result}),
                   reduce=b.reduce, raxes=b.raxes, name="dx")
    group = KernelOp(Block([a1, mid, b1, YieldOp([mid.result, b1.result])]))
    ins = random_inputs(inputs_of(group), seed=6)
    monkeypatch.setattr(slices, "SLICE_BYTES", 1 << 62)
    want = compile_kernel(group)(*ins)
    monkeypatch.setattr(slices, "SLICE_BYTES", 0)
    text = print_loops(lower_kernel(group).loops)
    assert text.index("for nb in") < text.index(" out[")  # `mid`, the first output
    got = compile_kernel(group)(*ins)
    assert all(np.array_equal(g, w) for g, w in zip(got, want, strict=True))
    assert_matches(group, ins, got)
