"""Loop-IR golden prints, groups, AOT shared libraries, GOMP threads, AVX-512 emission and
the tuner's builder."""

from __future__ import annotations

import ctypes
import json
import re

import numpy as np
import pytest
from codegen_lib import (
    F32,
    assert_matches,
    check,
    compute,
    ld,
    matmul,
    random_inputs,
    tensor,
)

from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.jit import (
    compile_kernel,
    emit_kernel,
    get_num_threads,
    new_module,
    set_num_threads,
)
from nfc.codegen.kernel_spec import build, kernel_spec, space
from nfc.codegen.kernel_spec import reference as tuning_reference
from nfc.codegen.loops import print_loops
from nfc.codegen.lower import lower
from nfc.codegen.native import build_shared, emit_assembly
from nfc.codegen.schedule import Schedule, Split
from nfc.ir import Block, Call, Const, KernelOp, YieldOp

GOLDEN_EW = """\
kernel @k(out: f32[4, 10] out, x: f32[4, 10] in) {
  parallel i in 0..4 {
    for j.0 in 0..1 {
      vectorized j.1 in 0..8 {
        out[i, 8 * j.0 + j.1] = exp(x[i, 8 * j.0 + j.1]) + 1.0
      }
    }
    for j.0 in 0..1 {
      vectorized j.1 in 0..8 {
        if 8 * (j.0 + 1) + j.1 < 10 {
          out[i, 8 * (j.0 + 1) + j.1] = exp(x[i, clamp(8 * (j.0 + 1) + j.1, 9)]) + 1.0
        }
      }
    }
  }
}
"""

GOLDEN_SUM = """\
kernel @k(out: f32[6] out, x: f32[6, 16] in) {
  for i in 0..6 {
    alloc acc: f32[4] register {
      vectorized k.1 in 0..4 {
        acc[k.1] = f32(0.0)
      }
      for k.0 in 0..4 {
        vectorized k.1 in 0..4 {
          acc[k.1] += x[i, 4 * k.0 + k.1]
        }
      }
      alloc red: f32[] register {
        red[] = f32(0.0)
        vectorized k.1 in 0..4 {
          red[] += acc[k.1]
        }
        out[i] = red[]
      }
    }
  }
}
"""


def test_golden_elementwise_loops():
    x = tensor("x", (4, 10))
    op = compute({"i": 4, "j": 10}, Call("exp", (ld(x, "i", "j"),)) + Const(1.0))
    s = Schedule(splits=(Split("j", (8,)),), order=("i", "j.0", "j.1"), vectorize="j.1",
                 parallel=("i",))
    assert print_loops(lower(op, s, name="k")) == GOLDEN_EW


def test_golden_rfactor_sum_loops():
    x = tensor("x", (6, 16))
    op = compute({"i": 6}, ld(x, "i", "k"), reduce="sum", raxes={"k": 16})
    s = Schedule(splits=(Split("k", (4,)),), order=("i", "k.0", "k.1"), vectorize="k.1")
    assert print_loops(lower(op, s, name="k")) == GOLDEN_SUM


def test_group_kernel_inlines_producers():
    x, b = tensor("x", (16, 24)), tensor("b", (24,))
    c1 = compute({"i": 16, "j": 24}, ld(x, "i", "j") + ld(b, "j"), name="h")
    c2 = compute({"i": 16, "j": 24}, Call("max", (ld(c1.result, "i", "j"), Const(0.0))),
                 name="r")
    c3 = compute({"i": 16}, ld(c2.result, "i", "j"), reduce="sum", raxes={"j": 24}, name="s")
    kop = KernelOp(Block([c1, c2, c3, YieldOp([c2.result, c3.result])]))
    loops = lower(kop)
    text = print_loops(loops)
    assert "h[" not in text  # the bias add was inlined into the relu
    assert "out1[" in text and loops.n_outputs == 2
    check(kop)


def test_aot_shared_library(tmp_path):
    ops = {"mm": matmul(33, 20, 17), "ew": compute(
        {"i": 5, "j": 19}, Call("tanh", (ld(tensor("x", (5, 19)), "i", "j"),))),
        "par": compute({"i": 6, "j": 30000}, Call("exp", (ld(tensor("y", (6, 30000)), "i", "j"),)))}
    path = str(tmp_path / "k.so")
    infos = build_shared(ops, path)
    assert "parallel" in print_loops(infos["par"].loops)
    lib = ctypes.CDLL(path)
    set_num_threads(2)
    for name, op in ops.items():
        info = infos[name]
        ins = random_inputs(info.inputs, 3)
        outs = [np.empty(v.shape, v.dtype.numpy) for v in info.outputs]
        ws = np.empty(info.workspace_bytes + 64, np.uint8)
        ptrs = [a.ctypes.data for a in outs + ins]
        if info.workspace_bytes:
            ptrs.append(ws.ctypes.data + (-ws.ctypes.data) % 64)
        getattr(lib, name)((ctypes.c_void_p * len(ptrs))(*ptrs))
        assert_matches(op, ins, outs)


def test_gomp_parallel_two_threads():
    op = matmul(300, 64, 96)
    assert default_parallel(op)
    kernel = compile_kernel(op)
    assert "nfc_parallel" in kernel.ir_text  # nfc.codegen.llvm.threadpool
    before = get_num_threads()
    ins = random_inputs(kernel.info.inputs, 1)
    try:
        for n in (1, 2):
            set_num_threads(n)
            assert_matches(op, ins, [kernel(*ins)])
    finally:
        set_num_threads(before)


def default_parallel(op):
    from nfc.codegen.space import default_schedule

    return bool(default_schedule(op).parallel)


def test_avx512_emission_uses_zmm():
    host = host_target()
    feats = host.features.replace("-avx512f", "+avx512f").replace("-avx512vl", "+avx512vl")
    feats = feats.replace("-avx512bw", "+avx512bw").replace("-avx512dq", "+avx512dq")
    t512 = CpuTarget("skylake-avx512", feats, host.triple)
    assert t512.vector_bits == 512 and t512.lanes(F32) == 16
    m = new_module("t", t512)
    emit_kernel(m, "mm", matmul(64, 64, 64), target=t512)
    assert '"prefer-vector-width"="512"' in str(m)
    asm = emit_assembly(m, t512)
    assert "zmm" in asm and "vfmadd" in asm


def test_host_kernels_use_vectors_and_fma():
    m = new_module("t")
    emit_kernel(m, "mm", matmul(64, 64, 64))
    asm = emit_assembly(m)
    reg = {512: "zmm", 256: "ymm", 128: "xmm"}[host_target().vector_bits]
    assert reg in asm
    if host_target().fma:
        assert "vfmadd" in asm


def test_tuning_builder_roundtrip():
    op = matmul(24, 40, 16)
    spec = kernel_spec(op)
    spec = json.loads(json.dumps(spec))
    sp = space(spec)
    cfg = {**sp.default(), "pack_b": 1}  # B packed: the kernel has a workspace
    ins = random_inputs(op.operands, 5)
    run = build(spec, cfg)
    ref = tuning_reference(spec)
    assert_matches(op, ins, [run(ins)])
    assert_matches(op, ins, [ref(ins)])
    assert run.workspace_bytes > 0
    other = dict(cfg, mr=2, nv=1, ku=1)
    assert sp.is_valid(other)
    assert_matches(op, ins, [build(spec, other)(ins)])


@pytest.mark.parametrize("n", [1, 3])
def test_small_parallel_extents(n):
    # fewer iterations than threads
    x = tensor("x", (n, 40000))
    check(compute({"i": n, "j": 40000}, ld(x, "i", "j") * Const(2.0)))


def test_schedule_attribute_and_group_spec():
    op = matmul(20, 24, 12)
    op.attrs["nf.schedule"] = Schedule(splits=(Split("j", (8,)),),
                                       order=("i", "k", "j.0", "j.1"), vectorize="j.1",
                                       cache_write="j.0").to_dict()
    kernel = check(op, atol=1e-4)
    assert "vectorized j.1" in print_loops(kernel.loops)
    x = tensor("x", (8, 16))
    c1 = compute({"i": 8, "j": 16}, Call("exp", (ld(x, "i", "j"),)), name="e")
    c2 = compute({"i": 8}, ld(c1.result, "i", "j"), reduce="sum", raxes={"j": 16}, name="s")
    kop = KernelOp(Block([c1, c2, YieldOp([c2.result])]))
    spec = json.loads(json.dumps(kernel_spec(kop)))
    ins = random_inputs([x], 2)
    assert_matches(kop, ins, [build(spec, None)(ins)])


@pytest.mark.parametrize("bits", [256, 512])
def test_default_schedules_follow_the_given_target(bits):
    # a kernel emitted for an explicit target gets that target's default schedule (vector
    # width, micro-tile), not the host's: cross-compiling and the forced-feature test path
    host = host_target()
    avx512 = ",+avx512f,+avx512vl,+avx512bw,+avx512dq" if bits == 512 else \
        ",-avx512f,-avx512vl,-avx512bw,-avx512dq"
    t = CpuTarget("skylake-avx512" if bits == 512 else "haswell", host.features + avx512,
                  host.triple)
    assert t.vector_bits == bits
    m = new_module("t", t)
    emit_kernel(m, "mm", matmul(64, 64, 64), target=t)
    widths = {int(w) for w in re.findall(r"<(\d+) x float>", str(m))}
    assert max(widths) == t.lanes(F32), widths
