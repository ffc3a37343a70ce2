"""Horizontal fusion (nfc.codegen.lowering.horizontal): independent stages of a group share one
loop nest, dependent ones do not; results are bit for bit those without it (`NFC_HFUSE=0`) and
match the interpreter, on the host's code path and the AVX2 one; a model's train step through
the artifact (whose groups are compiled stage by stage, fused stages as one kernel) gives the
same parameters."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from codegen_lib import assert_matches, compute, inputs_of, ld, random_inputs, tensor

from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.jit import compile_kernel
from nfc.codegen.loops import print_loops
from nfc.codegen.lower import lower
from nfc.ir import Block, Call, Const, KernelOp, YieldOp

ROOT = Path(__file__).resolve().parents[2]
#: What `NFC_CPU_FEATURES` appends to force the AVX2 path on an AVX-512 host.
AVX2_ONLY = ",-avx512f,-avx512bw,-avx512dq,-avx512vl,-avx512bf16,-avx512vnni"


def _targets() -> list:
    h = host_target()
    return [pytest.param(h, id="host"),
            pytest.param(CpuTarget(h.cpu, h.features + AVX2_ONLY, h.triple), id="avx2")]


def bn_backward(n: int, c: int, h: int, w: int) -> KernelOp:
    """The batch-norm backward's sums per channel: `s1 = sum(dy)` and `s2 = sum(dy * xh)`
    (independent), and `s3`, which reads `s1` (dependent)."""
    dy, xh = tensor("dy", (n, c, h, w)), tensor("xh", (n, c, h, w))
    r = {"n": n, "h": h, "w": w}
    s1 = compute({"c": c}, ld(dy, "n", "c", "h", "w"), reduce="sum", raxes=r, name="s1")
    s2 = compute({"c": c}, ld(dy, "n", "c", "h", "w") * ld(xh, "n", "c", "h", "w"),
                 reduce="sum", raxes=r, name="s2")
    s3 = compute({"c": c}, ld(dy, "n", "c", "h", "w") - ld(s1.result, "c") * ld(
        xh, "n", "c", "h", "w"), reduce="sum", raxes=r, name="s3")
    return KernelOp(Block([s1, s2, s3, YieldOp([s2.result, s3.result])]))


def siblings(n: int, m: int) -> KernelOp:
    """Two elementwise outputs over the same (ragged) domain reading common inputs (of other
    types than the outputs': neither can be written over them)."""
    x, y = tensor("x", (n, m + 1)), tensor("y", (m,))
    a = compute({"i": n, "j": m}, Call("tanh", (ld(x, "i", "j"),)) * ld(y, "j"), name="a")
    b = compute({"i": n, "j": m}, ld(x, "i", "j") * Const(0.5) + ld(y, "j"), name="b")
    return KernelOp(Block([a, b, YieldOp([a.result, b.result])]))


def _outer_loops(text: str) -> list[str]:
    """The outermost loops of a printed kernel (below its global allocations)."""
    loops = [x for x in text.splitlines()[1:] if x.strip().startswith(("for ", "parallel "))]
    depth = min(len(x) - len(x.lstrip()) for x in loops)
    return [x.strip() for x in loops if len(x) - len(x.lstrip()) == depth]


def _stores_per_nest(text: str) -> list[set[str]]:
    """Per outermost nest, the buffers it stores into."""
    lines = text.splitlines()[1:]
    outer = _outer_loops(text)
    depth = min(len(x) - len(x.lstrip()) for x in lines if x.strip().startswith(
        ("for ", "parallel ")))
    nests: list[set[str]] = []
    for line in lines:
        if len(line) - len(line.lstrip()) == depth and line.strip().startswith(
                ("for ", "parallel ")):
            nests.append(set())
        m = re.match(r"^\s*(\w+)\[.*\] (\+)?= ", line)
        if m and nests:
            nests[-1].add(m.group(1))
    assert len(nests) == len(outer)
    return nests


def test_independent_sums_share_a_parallel_nest(monkeypatch):
    op = bn_backward(8, 64, 16, 16)
    monkeypatch.setenv("NFC_HFUSE", "0")
    off = print_loops(lower(op))
    monkeypatch.setenv("NFC_HFUSE", "1")
    on = print_loops(lower(op))
    assert _outer_loops(off) == ["parallel c in 0..64 {"] * 3
    assert _outer_loops(on) == ["parallel c in 0..64 {"] * 2  # one region fewer
    # s1 and s2 (stored as `out`) in one nest; s3 (`out1`) reads s1: a nest of its own
    assert _stores_per_nest(on) == [{"acc", "acc_1", "red", "red_1", "s1", "out"},
                                    {"acc_2", "red_2", "out1"}]


def test_dependent_and_in_place_stages_stay_apart(monkeypatch):
    monkeypatch.setenv("NFC_HFUSE", "1")
    # b reads a: dependent
    x = tensor("x", (64, 48))
    a = compute({"i": 64, "j": 48}, Call("exp", (ld(x, "i", "j"),)), name="a")
    b = compute({"i": 64}, ld(a.result, "i", "j"), reduce="sum", raxes={"j": 48}, name="b")
    c = compute({"i": 64}, ld(x, "i", "j"), reduce="max", raxes={"j": 48}, name="c")
    text = print_loops(lower(KernelOp(Block([a, b, c, YieldOp([a.result, b.result,
                                                               c.result])]))))
    nests = _stores_per_nest(text)
    assert not any({"out", "out1"} <= s for s in nests)  # a and b apart
    assert any({"out", "out2"} <= s for s in nests)  # c joins a (independent)
    # ... but not when c comes first: a's output may then be written over `x` (in place:
    # its only other reader came before it), which c reads
    text = print_loops(lower(KernelOp(Block([c, a, b, YieldOp([a.result, b.result,
                                                               c.result])]))))
    assert len(_outer_loops(text)) == 3
    # an output that may be written in place over an input of its type (an optimizer's
    # update) is not fused with a stage reading such an input
    p, g, m = tensor("p", (64,)), tensor("g", (64,)), tensor("m", (64,))
    u = compute({"i": 64}, ld(p, "i") - ld(g, "i") * Const(0.1), name="u")
    v = compute({"i": 64}, ld(m, "i") * Const(0.9) + ld(g, "i"), name="v")
    text = print_loops(lower(KernelOp(Block([u, v, YieldOp([u.result, v.result])]))))
    assert len(_outer_loops(text)) == 2


def _run_both(op, target, monkeypatch, seed=0):
    ins = random_inputs(inputs_of(op), seed)
    outs = []
    for flag in ("0", "1"):
        monkeypatch.setenv("NFC_HFUSE", flag)
        got = compile_kernel(op, target=target)(*ins)
        outs.append(list(got) if isinstance(got, tuple) else [got])
    return ins, outs


@pytest.mark.parametrize("target", _targets())
@pytest.mark.parametrize("make", [lambda: bn_backward(4, 13, 5, 19), lambda: bn_backward(
    8, 64, 16, 16), lambda: siblings(37, 203)], ids=["bn-ragged", "bn", "elementwise-ragged"])
def test_bit_identical_and_matches_interpreter(make, target, monkeypatch):
    op = make()
    monkeypatch.setenv("NFC_HFUSE", "1")
    loops = print_loops(lower(op))
    monkeypatch.setenv("NFC_HFUSE", "0")
    assert len(_outer_loops(loops)) < len(_outer_loops(print_loops(lower(op))))
    ins, (off, on) = _run_both(op, target, monkeypatch)
    for a, b in zip(off, on, strict=True):
        assert a.tobytes() == b.tobytes()
    assert_matches(op, ins, on)


def _train_twice(src: Path, flag: str, monkeypatch):
    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load
    from nfc.runtime.train import synthetic_train_step

    monkeypatch.setenv("NFC_HFUSE", flag)
    built = compile_model(src, use_cache=False)  # the library cache's key lacks the switch
    model = load(built.path)
    bound = synthetic_train_step(model)
    losses = [float(bound()["loss"]) for _ in range(2)]
    fused = sum(isinstance(c[2], tuple) for comp in built.artifact.kernel_set.composites.values()
                for c in comp.calls)
    return losses, {k: np.array(v) for k, v in model.state_dict().items()}, fused


def test_train_step_parameters_bit_identical(monkeypatch):
    src = ROOT / "examples" / "resnet_block.nf"
    l0, s0, f0 = _train_twice(src, "0", monkeypatch)
    l1, s1, f1 = _train_twice(src, "1", monkeypatch)
    assert f0 == 0 and f1 > 0  # batch-norm sums compiled as shared nests
    assert l0 == l1
    assert s0.keys() == s1.keys()
    for k in s0:
        assert s0[k].tobytes() == s1[k].tobytes(), k


GROUP = """
nf.module @groups {
  nf.func @step(%x: tensor<8x16xf32> {nf.role = "input"},
                %y: tensor<8x16xf32> {nf.role = "input"})
      -> (tensor<8xf32>, tensor<8xf32>) attributes {nf.results = ["z", "w"]} {
    %z, %w = nf.kernel {
      %s1 = nf.compute [n: 8] sum [k: 16] (%x[n, k]) : tensor<8xf32>
      %m = nf.compute [n: 8] max [k: 16] (%y[n, k]) : tensor<8xf32>
      %s2 = nf.compute [n: 8] sum [k: 16] (%y[n, k] * %s1[n]) : tensor<8xf32>
      %s3 = nf.compute [n: 8] sum [k: 16] (%x[n, k] * %y[n, k]) : tensor<8xf32>
      %z1 = nf.compute [n: 8] (%s2[n] - %m[n] + %s3[n]) : tensor<8xf32>
      nf.yield %z1, %s3 : tensor<8xf32>, tensor<8xf32>
    } : tensor<8xf32>, tensor<8xf32>
    nf.return %z, %w : tensor<8xf32>, tensor<8xf32>
  }
}
"""


def test_artifact_calls_fused_stages_once(tmp_path, monkeypatch):
    """In the artifact, the group's independent sums (s1, m, s3; s2 reads s1) are one kernel
    the composite calls once, with its results at their places in the workspace and
    outputs."""
    from nfc.codegen.artifact import build_artifact
    from nfc.interp import run as interp_run
    from nfc.irparser import parse_module
    from nfc.runtime.loader import load

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("NFC_HFUSE", "1")
    module = parse_module(GROUP)
    art = build_artifact(module, split=1)
    (comp,) = art.kernel_set.composites.values()
    assert [len(c[2]) if isinstance(c[2], tuple) else 1 for c in comp.calls] == [3, 1, 1]
    lib = str(tmp_path / "g.so")
    art.write_shared(lib)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((8, 16)).astype(np.float32) for n in ("x", "y")}
    out = load(lib).functions["step"](**feeds)
    want = interp_run(module.funcs[0], dict(feeds), module=module)
    np.testing.assert_allclose(out["z"], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["w"], want[1], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("inner,fused", [(500, True), (1000, False), (2000, True)])
def test_parallel_loops_fuse_without_making_a_region(inner, fused):
    """Two independent parallel loops of 64 iterations: fused when both stay below the
    emitter's threshold together (serial either way) or both are regions already; not when
    each alone runs serially but together they would start threads."""
    from nfc.codegen.llvm.parallel import PARALLEL_MIN_WORK, parallel_work
    from nfc.codegen.loops import Buffer, BufLoad, For, LoopKind, Store
    from nfc.codegen.lowering.horizontal import StageInfo, plan_groups
    from nfc.ir import DType, Index

    def nest(name: str) -> For:
        buf = Buffer(name, (64, inner), DType.F32)
        src = Buffer("x", (64, inner), DType.F32)
        at = (Index("i"), Index("j"))
        return For("i", Const(64), LoopKind.PARALLEL, For("j", Const(inner), LoopKind.SERIAL,
                                                          Store(buf, at, BufLoad(src, at))))

    a, b = nest("a"), nest("b")
    work = 64 * parallel_work(a.body, {"i": (0, 63)})
    assert (work < PARALLEL_MIN_WORK <= 2 * work) == (inner == 1000)
    infos = [StageInfo(frozenset({1}), frozenset({2}), a), StageInfo(frozenset({1}),
                                                                     frozenset({3}), b)]
    assert plan_groups(infos) == ([[0, 1]] if fused else [[0], [1]])


def test_library_cache_keeps_builds_with_and_without_apart(tmp_path, monkeypatch):
    """`NFC_HFUSE` decides the code, so the library cache (nfc.runtime.build) keys on it: a
    build without horizontal fusion is not served the fused library cached before it."""
    from nfc.irparser import parse_module
    from nfc.runtime.build import build_library

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))
    paths = {}
    for flag in ("1", "0", "1"):
        monkeypatch.setenv("NFC_HFUSE", flag)
        built = build_library(parse_module(GROUP))
        paths.setdefault(flag, set()).add(built.path)
    assert len(paths["1"]) == 1 and paths["0"].isdisjoint(paths["1"])
