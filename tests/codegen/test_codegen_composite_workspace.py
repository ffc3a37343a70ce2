"""A composite's workspace (nfc.codegen.artifact.kernels.composite_layout) and running gradient
sums (nfc.passes.fusion.accumulate): intermediates whose lifetimes do not overlap share bytes,
live ones never do, results match the interpreter on the host's code path and the AVX2 one;
a gradient summed over the unrolled steps of an RNN is accumulated as it goes, with the same
parameters bit for bit and a smaller planned step."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfc.codegen.cpu import CpuTarget, host_target

ROOT = Path(__file__).resolve().parents[2]
#: What `NFC_CPU_FEATURES` appends to force the AVX2 path on an AVX-512 host.
AVX2_ONLY = ",-avx512f,-avx512bw,-avx512dq,-avx512vl,-avx512bf16,-avx512vnni"


def _targets() -> list:
    h = host_target()
    return [pytest.param(h, id="host"),
            pytest.param(CpuTarget(h.cpu, h.features + AVX2_ONLY, h.triple), id="avx2")]


# four products in a chain: each stage reads only the one before (and the inputs), so the
# group's intermediates t0, t1, t2 need two intermediates' bytes, not three
CHAIN = """
nf.module @chain {
  nf.func @step(%x: tensor<48x40xf32> {nf.role = "input"},
                %y: tensor<40x40xf32> {nf.role = "input"})
      -> (tensor<48x40xf32>) attributes {nf.results = ["z"]} {
    %z = nf.kernel {
      %t0 = nf.compute [i: 48, j: 40] sum [k: 40] (%x[i, k] * %y[k, j]) : tensor<48x40xf32>
      %t1 = nf.compute [i: 48, j: 40] sum [k: 40] (%t0[i, k] * %y[k, j]) : tensor<48x40xf32>
      %t2 = nf.compute [i: 48, j: 40] sum [k: 40] (%t1[i, k] * %y[j, k]) : tensor<48x40xf32>
      %t3 = nf.compute [i: 48, j: 40] sum [k: 40] (%t2[i, k] * %y[k, j]) : tensor<48x40xf32>
      nf.yield %t3 : tensor<48x40xf32>
    } : tensor<48x40xf32>
    nf.return %z : tensor<48x40xf32>
  }
}
"""


def _lifetimes(comp) -> dict[int, tuple[int, int, int]]:
    """Intermediate value id -> (first call, last call, bytes), from the calls themselves."""
    outer = {id(v) for v in (*comp.info.outputs, *comp.info.inputs)}
    live: dict[int, list[int]] = {}
    for k, (_, si, _) in enumerate(comp.calls):
        for v in si.outputs:
            if id(v) not in outer:
                live.setdefault(id(v), [k, k, v.type.nbytes])
        for v in si.inputs:
            if id(v) in live:
                live[id(v)][1] = k
    return {key: (a, b, n) for key, (a, b, n) in live.items()}


@pytest.mark.parametrize("target", _targets())
def test_dead_intermediates_share_the_workspace(target, tmp_path, monkeypatch):
    from nfc.codegen.artifact import build_artifact
    from nfc.codegen.artifact.kernels import composite_layout
    from nfc.interp import run as interp_run
    from nfc.irparser import parse_module
    from nfc.runtime.loader import load

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))
    module = parse_module(CHAIN)
    art = build_artifact(module, split=1, target=target)
    (comp,) = art.kernel_set.composites.values()
    offsets, _, need = composite_layout(comp)
    live = _lifetimes(comp)
    assert set(offsets) == set(live) and len(live) == 3
    # no two intermediates live at the same call overlap in bytes
    for a, (s0, e0, n0) in live.items():
        for b, (s1, e1, n1) in live.items():
            if a < b and s0 <= e1 and s1 <= e0:
                assert (offsets[a] + n0 <= offsets[b]
                        or offsets[b] + n1 <= offsets[a]), (a, b)
    values = sum(-(-n // 64) * 64 for _, _, n in live.values())
    assert comp.info.workspace_bytes == need < values  # t0 and t2 share their bytes
    assert need < comp.info.loops.workspace_bytes  # the group's loop IR holds all three
    plan = art.plans["step"]
    assert [b.size for b in plan.buffers if b.key[0] == "ws"] == [need]
    lib = str(tmp_path / "c.so")
    art.write_shared(lib)
    rng = np.random.default_rng(5)
    feeds = {"x": rng.standard_normal((48, 40)).astype(np.float32),
             "y": (0.2 * rng.standard_normal((40, 40))).astype(np.float32)}
    out = load(lib).functions["step"](**feeds)
    (want,) = interp_run(module.funcs[0], dict(feeds), module=module)
    np.testing.assert_allclose(out["z"], want, rtol=1e-4, atol=1e-4)


SUM = """
nf.module @acc {
  nf.func @step(%a: tensor<8x512xf32> {nf.role = "input"},
                %b: tensor<8x512xf32> {nf.role = "input"})
      -> (tensor<512x512xf32>) attributes {nf.results = ["g"]} {
@TERMS@
    %g = nf.compute [i: 512, j: 512] (@SUM@) : tensor<512x512xf32>
    nf.return %g : tensor<512x512xf32>
  }
}
"""


def _sum_module(terms: int):
    from nfc.irparser import parse_module

    lines = []
    for t in range(terms):
        lines.append(f"    %e{t} = nf.compute [n: 8, j: 512] (%a[n, j] * {t + 1}.0) "
                     ": tensor<8x512xf32>")
        lines.append(f"    %c{t} = nf.compute [i: 512, j: 512] sum [n: 8] "
                     f"(%e{t}[n, i] * %b[n, j]) : tensor<512x512xf32>")
    body = " + ".join(f"%c{t}[i, j]" for t in range(terms))
    return parse_module(SUM.replace("@TERMS@", "\n".join(lines)).replace("@SUM@", body))


def test_running_sum_same_order_and_never_one_kernel():
    from nfc.passes.fusion import fuse_func
    from nfc.passes.fusion.accumulate import ACCUMULATE_ATTR, split_sums
    from nfc.passes.fusion.device import DEFAULT_DEVICE
    from nfc.passes.fusion.reward import CostModel

    func = _sum_module(8).funcs[0]
    assert split_sums(func, chunk=2) == 1
    accs = [op for op in func.body.ops if ACCUMULATE_ATTR in op.attrs]
    assert len(accs) == 4  # partial sums of c0..c2, ..c4, ..c6, and the final compute
    text = [str(op.body) for op in accs]
    assert all(t.count("+") == 2 for t in text[:3]) and text[3].count("+") == 1
    # each partial sum comes right after the producer of its last term
    ops = func.body.ops
    for op in accs[:-1]:
        last = max(ops.index(ld.owner) for ld in op.operands if ld.owner is not None)
        assert ops.index(op) == last + 1
    func2 = _sum_module(8).funcs[0]
    fuse_func(func2, CostModel(DEFAULT_DEVICE))
    for k in func2.body.ops:
        inner = getattr(k, "body", None)
        if inner is not None and hasattr(inner, "ops"):
            tags = [op.attrs[ACCUMULATE_ATTR] for op in inner.ops
                    if ACCUMULATE_ATTR in getattr(op, "attrs", {})]
            assert len(tags) == len(set(tags)), "two steps of one running sum in one kernel"


def _train(src: Path, chunk: int, monkeypatch, settings):
    from nfc.passes.fusion import accumulate
    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load
    from nfc.runtime.train import synthetic_train_step

    monkeypatch.setattr(accumulate, "CHUNK", chunk)
    built = compile_model(src, settings=settings, use_cache=False)  # the key lacks CHUNK
    model = load(built.path)
    bound = synthetic_train_step(model)
    losses = [float(bound()["loss"]) for _ in range(2)]
    report = built.artifact.plans["train_step"].memory_report()
    return losses, {k: np.array(v) for k, v in model.state_dict().items()}, report


def test_mi_lstm_gradients_accumulate_as_they_go(monkeypatch):
    """MI-LSTM over 6 steps with hidden 256: `u`'s gradient (1 MiB) gets 6 contributions.
    Summed in one compute (CHUNK above the count: no split) all are live at once; as a
    running sum the planned arena is smaller, and the parameters after two steps are the
    same bit for bit (same additions, same order)."""
    src = ROOT / "examples" / "models" / "mi_lstm.nf"
    settings = ["batch=4", "steps=6", "inputs=16", "hidden=256"]
    l0, s0, r0 = _train(src, 100, monkeypatch, settings)
    l1, s1, r1 = _train(src, 2, monkeypatch, settings)
    assert l0 == l1
    for k in s0:
        assert s0[k].tobytes() == s1[k].tobytes(), k
    assert r1.lower_bound < r0.lower_bound and r1.arena < r0.arena, (r0, r1)


def _fake_composite(data):
    """A composite of random stages (each reads some earlier values, some with their own
    workspace, some in a batch-slice loop), built from plain objects: what
    `composite_layout` reads."""
    from types import SimpleNamespace as NS

    n = data.draw(st.integers(2, 9))
    inp = NS(type=NS(nbytes=64))
    vals, calls = [], []
    for _ in range(n):
        v = NS(type=NS(nbytes=data.draw(st.integers(1, 5000))))
        reads = data.draw(st.lists(st.sampled_from(vals), max_size=3, unique_by=id)
                          if vals else st.just([]))
        si = NS(outputs=(v,), inputs=(inp, *reads),
                workspace_bytes=data.draw(st.sampled_from([0, 0, 100, 3000])))
        calls.append(("s", si, NS(result=v)))
        vals.append(v)
    last = vals[-1]
    slices = []
    if n >= 4 and data.draw(st.booleans()):
        first = data.draw(st.integers(0, n - 3))
        slices.append((first, 2, NS(sliced={})))
    return NS(info=NS(outputs=(last,), inputs=(inp,)), calls=calls, slices=slices)


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_layout_never_overlaps_live_intermediates(data):
    """On random stage graphs: intermediates (and stage workspaces) live at one call never
    share bytes, the size is between the busiest call's bytes and their sum."""
    from nfc.codegen.artifact.kernels import composite_layout

    comp = _fake_composite(data)
    offsets, call_ws, need = composite_layout(comp)
    span = {}
    for first, count, _ in comp.slices:
        span.update({first + j: (first, first + count - 1) for j in range(count)})
    bufs = []  # (start, end, offset, size)
    out = id(comp.info.outputs[0])
    for k, (_, si, sts) in enumerate(comp.calls):
        lo, hi = span.get(k, (k, k))
        v = sts.result
        if id(v) != out:
            end = max([hi] + [span.get(j, (j, j))[1] for j, (_, sj, _) in
                              enumerate(comp.calls) if any(u is v for u in sj.inputs)])
            bufs.append((lo, end, offsets[id(v)], v.type.nbytes))
        if si.workspace_bytes:
            bufs.append((lo, hi, call_ws[k], si.workspace_bytes))
    for i, (s0, e0, o0, n0) in enumerate(bufs):
        assert o0 % 64 == 0 and o0 + n0 <= need
        for s1, e1, o1, n1 in bufs[i + 1:]:
            if s0 <= e1 and s1 <= e0:
                assert o0 + n0 <= o1 or o1 + n1 <= o0
    busiest = max((sum(n for s, e, _, n in bufs if s <= k <= e) for k in range(
        len(comp.calls))), default=0)
    assert busiest <= need <= sum(-(-n // 64) * 64 for *_, n in bufs)
