"""Property test of the `fuse` pass on random DAGs of computes: every partition it produces
covers each compute exactly once (recomputations aside, which are marked copies), its
quotient graph is acyclic (the function stays in a valid topological order), and the fused
function computes what the original computed."""

from __future__ import annotations

import networkx as nx
import numpy as np
from fusion_testlib import top_graph
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from passes_testlib import random_inputs

from nfc.interp import run
from nfc.ir import ComputeOp, KernelOp
from nfc.irparser import parse_module
from nfc.passes.fusion import Fuse
from nfc.passmanager import Context
from nfc.verifier import verify

N = 6  # every tensor is N x N f32: any compute can read any earlier value

# bodies over two operands %a, %b: elementwise (transposed and broadcast reads too) and
# reductions (a GEMM, a non-GEMM sum, a max)
ELEMENTWISE = [
    "(%{a}[i, j] + %{b}[i, j])", "(exp(%{a}[i, j]) * %{b}[j, i])", "(max(%{a}[i, j], 0.0))",
    "(%{a}[i, 0] - %{b}[0, j])", "(select(%{a}[i, j] > 0.0, %{b}[i, j], 0.0))",
    "(tanh(%{a}[j, i]))",
]
REDUCTIONS = [
    "sum [k: {n}] (%{a}[i, k] * %{b}[k, j])", "sum [k: {n}] (exp(%{a}[i, k]) + %{b}[k, j])",
    "max [k: {n}] (%{a}[k, j] * %{b}[i, k])",
]


@st.composite
def dags(draw):
    """A random function: 2 arguments, 2-12 computes reading earlier values, sometimes an
    existing kernel, some values returned."""
    n = draw(st.integers(2, 12))
    names = ["x0", "x1"]
    lines = []
    t = f"tensor<{N}x{N}xf32>"
    for i in range(n):
        a = draw(st.sampled_from(names))
        b = draw(st.sampled_from(names))
        kind = draw(st.integers(0, 9))
        v = f"v{i}"
        if kind < 6:
            body = draw(st.sampled_from(ELEMENTWISE)).format(a=a, b=b)
            lines.append(f"  %{v} = nf.compute [i: {N}, j: {N}] {body} : {t}")
        elif kind < 9:
            body = draw(st.sampled_from(REDUCTIONS)).format(a=a, b=b, n=N)
            lines.append(f"  %{v} = nf.compute [i: {N}, j: {N}] {body} : {t}")
        else:
            lines += [f"  %{v} = nf.kernel {{nf.group = {i}}} {{",
                      f"    %{v}_in = nf.compute [i: {N}, j: {N}] (%{a}[i, j] * 0.5) : {t}",
                      f"    nf.yield %{v}_in : {t}", f"  }} : {t}"]
        names.append(v)
    rets = sorted(set(draw(st.lists(st.sampled_from(names[2:]), min_size=0, max_size=3)))
                  | {names[-1]})
    sig = ", ".join(t for _ in rets)
    text = (f"nf.func @forward(%x0: {t}, %x1: {t}) -> ({sig}) {{\n" + "\n".join(lines)
            + f"\n  nf.return {', '.join('%' + r for r in rets)} : {sig}\n}}\n")
    return text


OPTIONS = st.builds(
    Fuse, launch_us=st.sampled_from([0.0, 0.05, 5.0]), region_us=st.sampled_from([0.0, 2.0]),
    cache_kib=st.sampled_from([0, 512]), parallel_work=st.sampled_from([16, 1 << 16]),
    siblings=st.booleans(), recompute=st.booleans(), max_ops=st.sampled_from([2, 3, 64]),
    bandwidth_gbs=st.sampled_from([0.001, 15.0]))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags(), OPTIONS)
def test_partition_is_acyclic_cover(src, fuse):
    before = parse_module(src, "dag.nfir")
    verify(before)
    after = parse_module(src, "dag.nfir")
    orig = [op for op in after.func("forward").walk() if isinstance(op, ComputeOp)]
    fixed = [op for op in after.func("forward").body.ops if isinstance(op, KernelOp)]
    fuse.apply(Context(), after)
    verify(after)  # SSA order: each op after what it reads, so the kernels are topological
    f = after.func("forward")
    assert nx.is_directed_acyclic_graph(top_graph(f))
    # every original compute exactly once; anything else is a marked recomputed copy
    seen = [op for op in f.walk() if isinstance(op, ComputeOp)]
    ids = [id(op) for op in seen]
    assert len(ids) == len(set(ids))
    kept = {id(op) for op in orig} & set(ids)
    copies = [op for op in seen if id(op) not in kept]
    assert all(op.attrs.get("nf.recompute") is True for op in copies)
    if not fuse.recompute:
        assert kept == {id(op) for op in orig} and not copies
    # a compute disappears only when its copies replaced every use of it
    for op in orig:
        if id(op) not in kept:
            assert op.reduce is None and fuse.recompute
    # existing kernels stay as they were; new kernels respect max_ops
    assert all(k in f.body.ops for k in fixed)
    for k in f.body.ops:
        if isinstance(k, KernelOp) and k not in fixed:
            assert 2 <= len(k.body.ops) - 1 <= fuse.max_ops
    inputs = random_inputs(before.func("forward"), 0)
    want = run(before.func("forward"), inputs, module=before)
    got = run(f, inputs, module=after)
    for w, g in zip(want, got, strict=True):
        np.testing.assert_allclose(g, w, rtol=1e-6, atol=1e-6)
