# ruff: noqa: E501
"""Compile-time machinery of the artifact builder: structural kernel keys, deduplicated kernels
and groups compiled stage by stage (checked against the interpreter), the persistent object
cache (hit, miss, invalidation by target and version, damaged entries), the parallel compile
workers, and the emitter's folded index arithmetic."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from codegen_lib import check, compute, ld, matmul, tensor

from nfc.codegen.artifact import build_artifact
from nfc.codegen.artifact.kcache import ObjectCache, kernel_key, kernel_symbol, structural_text
from nfc.codegen.cpu import host_target
from nfc.codegen.schedule import Schedule
from nfc.interp import run as interp_run
from nfc.ir import Index
from nfc.irparser import parse_module

# Two identical layers (other names, other call sites) and a third of another shape: 6 kernel
# calls, 4 distinct kernels.
REPEATED = """
nf.module @rep {
  nf.func @step(%x: tensor<8x16xf32> {nf.role = "input"}, %w1: tensor<16x16xf32> {nf.role = "param"}, %w2: tensor<16x16xf32> {nf.role = "param"}, %w3: tensor<16x4xf32> {nf.role = "param"}) -> (tensor<8x4xf32>, tensor<8x16xf32>) attributes {nf.results = ["y", "h"]} {
    %h1 = nf.compute [n: 8, m: 16] sum [k: 16] (%x[n, k] * %w1[k, m]) {nf.callsite = "a.nf:1:1"} : tensor<8x16xf32>
    %a1 = nf.compute [n: 8, m: 16] (tanh(%h1[n, m])) {nf.callsite = "a.nf:1:1", nf.phase = "forward"} : tensor<8x16xf32>
    %h2 = nf.compute [n: 8, m: 16] sum [k: 16] (%a1[n, k] * %w2[k, m]) {nf.callsite = "a.nf:2:1"} : tensor<8x16xf32>
    %a2 = nf.compute [n: 8, m: 16] (tanh(%h2[n, m])) {nf.callsite = "a.nf:2:1"} : tensor<8x16xf32>
    %h3 = nf.compute [n: 8, m: 4] sum [k: 16] (%a2[n, k] * %w3[k, m]) : tensor<8x4xf32>
    %y = nf.compute [n: 8, m: 4] (tanh(%h3[n, m])) : tensor<8x4xf32>
    nf.return %y, %a2 : tensor<8x4xf32>, tensor<8x16xf32>
  }
}
"""


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """A private, empty object cache for the test."""
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("NFC_OBJECT_CACHE", raising=False)
    return tmp_path / "cache" / "objects"


def _ops(text: str = REPEATED):
    module = parse_module(text)
    return module, [op for op in module.funcs[0].body.ops[:-1]]


def _run_library(path: str, module, rng_seed: int = 0) -> None:
    """Load the library, run @step on random data, compare with the interpreter."""
    from nfc.runtime.loader import load

    func = module.funcs[0]
    rng = np.random.default_rng(rng_seed)
    feeds = {a.name: rng.standard_normal(a.shape).astype(np.float32) for a in func.args}
    model = load(path)
    for name, arr in feeds.items():
        if name in model.tensors:
            model.tensors[name][...] = arr
    out = model.functions["step"](x=feeds["x"])
    want = interp_run(func, dict(feeds), module=module)
    for name, w in zip(["y", "h"], want, strict=True):
        np.testing.assert_allclose(out[name], w, rtol=1e-5, atol=1e-6)


def test_structural_key_ignores_names_and_labels_but_not_structure():
    _, ops = _ops()
    t = host_target()
    h1, a1, h2, a2, h3, _ = ops
    assert structural_text(h1) == structural_text(h2)  # names and call sites differ
    assert kernel_key(a1, None, t) == kernel_key(a2, None, t)  # nf.phase is a label
    assert kernel_key(h1, None, t) != kernel_key(h3, None, t)  # another shape
    assert kernel_key(h1, None, t) != kernel_key(a1, None, t)
    sched = Schedule(order=("n", "m", "k"))
    assert kernel_key(h1, sched, t) != kernel_key(h1, None, t)
    assert kernel_key(h1, sched, t) == kernel_key(h2, sched, t)
    other = dataclasses.replace(t, features=t.features + ",-avx2")
    assert kernel_key(h1, None, other) != kernel_key(h1, None, t)
    assert kernel_key(h1, None, t, version="0.0.0-other") != kernel_key(h1, None, t)
    assert kernel_symbol(kernel_key(h1, None, t)).startswith("nfc_k_")
    # a different body (tanh vs exp) is a different kernel
    x = tensor("x", (8, 16))
    e = compute({"n": 8, "m": 16}, ld(x, "n", "m") * 2.0)
    f = compute({"n": 8, "m": 16}, ld(x, "n", "m") * 3.0)
    assert structural_text(e) != structural_text(f)


def test_deduplicated_kernels_match_the_interpreter_and_the_cache_is_hit(cache_dir, tmp_path):
    module, _ = _ops()
    art = build_artifact(module, split=1)
    calls = art.metadata["functions"]["step"]["kernels"]
    assert len(calls) == 6 and len(art.kernels) == 4
    assert calls[0]["symbol"] == calls[2]["symbol"] and calls[1]["symbol"] == calls[3]["symbol"]
    lib = str(tmp_path / "a.so")
    art.write_shared(lib)
    assert art.stats["cache_misses"] == 4 and art.stats["cache_hits"] == 0
    assert len(list(cache_dir.glob("*.nfo"))) == 4
    _run_library(lib, module)

    again = build_artifact(parse_module(REPEATED), split=1)
    lib2 = str(tmp_path / "b.so")
    again.write_shared(lib2)
    assert again.stats["cache_hits"] == 4 and again.stats["cache_misses"] == 0
    _run_library(lib2, module, rng_seed=1)


def test_cache_is_invalidated_by_target_and_version(cache_dir, tmp_path, monkeypatch):
    module, _ = _ops()
    build_artifact(module, split=1).write_shared(str(tmp_path / "a.so"))
    n = len(list(cache_dir.glob("*.nfo")))
    # another nfc version: every kernel is compiled again (and stored beside the old ones)
    import nfc.codegen.artifact.kcache as kc

    monkeypatch.setattr(kc, "__version__", "9.9.9")
    art = build_artifact(parse_module(REPEATED), split=1)
    art.write_shared(str(tmp_path / "b.so"))
    assert art.stats["cache_hits"] == 0 and art.stats["cache_misses"] == 4
    assert len(list(cache_dir.glob("*.nfo"))) == 2 * n
    # another target (feature string): misses too; the library still computes the same
    monkeypatch.undo()
    monkeypatch.setenv("NFC_CACHE_DIR", str(cache_dir.parent))
    t = host_target()
    other = dataclasses.replace(t, features=t.features + ",-prfchw")
    art = build_artifact(parse_module(REPEATED), split=1, target=other)
    lib = str(tmp_path / "c.so")
    art.write_shared(lib)
    assert art.stats["cache_hits"] == 0 and art.stats["cache_misses"] == 4
    _run_library(lib, module)


def test_object_cache_is_data_only_checked_atomic_private_and_pruned(tmp_path, capsys):
    import os
    import time

    root = tmp_path / "objs"
    cache = ObjectCache(root)
    assert cache.get("k1") is None
    cache.put("k1", b"not an object")  # refused: not ELF
    assert cache.get("k1") is None
    obj = b"\x7fELF" + bytes(range(256)) * 4
    cache.put("k1", obj)
    cache.put("k2", obj)
    assert cache.get("k1") == obj and cache.damaged == []
    assert not [p for p in root.iterdir() if not p.name.endswith(".nfo")]  # no temporaries
    assert root.stat().st_mode & 0o777 == 0o700
    assert cache.path("k1").stat().st_mode & 0o777 == 0o600
    # damaged entries: a flipped bit, a truncation, garbage, another key's entry
    good = cache.path("k1").read_bytes()
    flipped = bytearray(good)
    flipped[-100] ^= 0x10
    for key, data in [("f", bytes(flipped)), ("t", good[:-1]), ("g", b"garbage"),
                      ("c", good)]:
        cache.path(key).write_bytes(data)
        assert cache.get(key) is None, key
        assert not cache.path(key).exists(), key  # deleted: compiled and stored again
    assert len(cache.damaged) == 4
    assert cache.report_damaged() == 4 and cache.damaged == []
    err = capsys.readouterr().err
    assert err.count("warning") == 1 and "4 damaged cached kernel object(s)" in err
    assert cache.report_damaged() == 0 and capsys.readouterr().err == ""
    # pruning: least recently used first; objects of the old layout and stale temporaries
    (root / "old.o").write_bytes(b"\x7fELF")
    stale = root / ".k9.nfo.abc.nfctmp"
    stale.write_bytes(b"x")
    old = time.time() - 7200
    os.utime(stale, (old, old))
    os.utime(cache.path("k2"), (old + 100, old + 100))  # least recently used
    assert cache.prune(max_bytes=1500) >= 2
    assert cache.get("k2") is None and cache.get("k1") == obj
    assert not (root / "old.o").exists() and not stale.exists()


def test_disabled_cache_and_damaged_object_recovery(cache_dir, tmp_path, monkeypatch):
    module, _ = _ops()
    monkeypatch.setenv("NFC_OBJECT_CACHE", "0")
    art = build_artifact(module, split=1)
    art.write_shared(str(tmp_path / "a.so"))
    assert not cache_dir.exists() and art.stats["cache_misses"] == 4
    monkeypatch.setenv("NFC_OBJECT_CACHE", "1")
    build_artifact(parse_module(REPEATED), split=1).write_shared(str(tmp_path / "b.so"))
    victim = sorted(cache_dir.glob("*.nfo"))[0]
    victim.write_bytes(victim.read_bytes()[:200])  # cut short: fails its check
    art = build_artifact(parse_module(REPEATED), split=1)
    lib = str(tmp_path / "c.so")
    art.write_shared(lib)  # the damaged object is compiled again, the others are hits
    assert art.stats["cache_hits"] == 3 and art.stats["cache_misses"] == 1
    _run_library(lib, module)
    assert ObjectCache(cache_dir)._check(victim.stem, victim.read_bytes()) is None
    # a checked object the linker refuses anyway: everything is compiled afresh
    key = sorted(cache_dir.glob("*.nfo"))[1].stem
    ObjectCache(cache_dir).put(key, b"\x7fELF not really an object")
    art = build_artifact(parse_module(REPEATED), split=1)
    art.write_shared(lib)
    assert art.stats["cache_misses"] == 4
    _run_library(lib, module)


def test_parallel_workers_build_the_same_objects(monkeypatch, cache_dir):
    from nfc.codegen.artifact import parallel

    module, _ = _ops()
    monkeypatch.setattr(parallel, "PARALLEL_MIN_COST", 0.0)
    monkeypatch.setenv("NFC_OBJECT_CACHE", "0")
    art = build_artifact(module, split=2)
    ks = art.kernel_set
    serial = ks.objects(1)
    stats_before = dict(ks.stats)
    par = ks.objects(2)
    assert ks.stats.get("worker_jobs", 0) > stats_before.get("worker_jobs", 0)
    assert serial == par  # byte for byte: the worker parses the IR text, same code

    # a job the worker cannot parse is compiled here instead
    job = parallel.KernelJob("nfc_k_bad", "this is not IR", None, 1.0)
    stats: dict = {}
    jobs = [dataclasses.replace(job, symbol=f"nfc_k_bad{n}") for n in range(4)]
    out = parallel.compile_jobs(jobs, lambda j: b"local:" + j.symbol.encode(), host_target(), 2,
                                stats)
    assert out == {j.symbol: b"local:" + j.symbol.encode() for j in jobs}
    assert len(stats["worker_errors"]) >= 1


def test_folded_index_arithmetic_keeps_kernels_small_and_right():
    from nfc.codegen.jit import emit_kernel, new_module

    op = matmul(64, 10, 64)
    module = new_module()
    emit_kernel(module, "k", op)
    lines = str(module).count("\n")
    assert lines < 1500, lines  # was ~3,100 before the index arithmetic was folded
    check(op)
    # single-iteration loops, a reduction over a short axis (unrolled by the emitter), a
    # tile remainder, and a guard that folds to a constant
    x = tensor("x", (3, 10))
    red = compute({"n": 3}, ld(x, "n", "c"), reduce="max", raxes={"c": 10})
    check(red)
    check(compute({"n": 3, "c": 10}, ld(x, "n", "c") + ld(x, "n", Index("c") * 0)))
    check(matmul(1, 5, 3))


def test_fold_int_matches_the_ir_semantics():
    from llvmlite import ir

    from nfc.codegen.llvm.fold import const_ints, fold_int

    i64, i1 = ir.IntType(64), ir.IntType(1)
    c = lambda v: ir.Constant(i64, v)  # noqa: E731
    for op, a, b, want in [("+", 3, 4, 7), ("-", 3, 4, -1), ("*", -3, 4, -12),
                           ("//", -7, 2, -4), ("%", -7, 2, 1), ("//", 7, -2, -4)]:
        assert const_ints(fold_int(op, c(a), c(b), i64)) == [want], (op, a, b)
    assert const_ints(fold_int("<", c(2), c(3), i1)) == [1]
    assert fold_int("//", c(1), c(0), i64) is None  # left to the instruction
    vt = ir.VectorType(i64, 4)
    lanes = ir.Constant(vt, [ir.Constant(i64, k) for k in range(4)])
    assert const_ints(fold_int("<", lanes, ir.Constant(vt, [ir.Constant(i64, 2)] * 4),
                               ir.VectorType(i1, 4))) == [1, 1, 0, 0]
    fn = ir.Function(ir.Module(), ir.FunctionType(ir.VoidType(), [i64]), "f")
    x = fn.args[0]
    assert fold_int("+", x, c(0), i64) is x and fold_int("*", c(1), x, i64) is x
    assert const_ints(fold_int("*", x, c(0), i64)) == [0]
    assert fold_int("+", x, c(1), i64) is None  # needs an instruction
    t, f = ir.Constant(i1, True), ir.Constant(i1, False)
    assert fold_int("<", t, f, i1) is None  # signed i1: not folded


# Two fused groups sharing stages: the first has two structurally identical row sums (of %x
# and of %y) and a product; the second a row sum of %x again and a product.
GROUPS = """
nf.module @groups {
  nf.func @step(%x: tensor<8x16xf32> {nf.role = "input"}, %y: tensor<8x16xf32> {nf.role = "input"}) -> (tensor<8xf32>, tensor<8xf32>) attributes {nf.results = ["z", "w"]} {
    %z = nf.kernel {nf.fusion = {est_us = 1.0}} {
      %s1 = nf.compute [n: 8] sum [k: 16] (%x[n, k]) : tensor<8xf32>
      %s2 = nf.compute [n: 8] sum [k: 16] (%y[n, k]) : tensor<8xf32>
      %z1 = nf.compute [n: 8] (%s1[n] * %s2[n]) : tensor<8xf32>
      nf.yield %z1 : tensor<8xf32>
    } : tensor<8xf32>
    %w = nf.kernel {nf.fusion = {est_us = 2.0}} {
      %e = nf.compute [n: 8, k: 16] (%y[n, k] * 0.5) : tensor<8x16xf32>
      %s3 = nf.compute [n: 8] sum [k: 16] (%x[n, k]) : tensor<8xf32>
      %w1 = nf.compute [n: 8] (%s3[n] * %z[n]) : tensor<8xf32>
      %s4 = nf.compute [n: 8] sum [k: 16] (%e[n, k] * %w1[n]) : tensor<8xf32>
      nf.yield %s4 : tensor<8xf32>
    } : tensor<8xf32>
    nf.return %z, %w : tensor<8xf32>, tensor<8xf32>
  }
}
"""


def test_groups_compile_stage_by_stage_and_share_stages(cache_dir, tmp_path, monkeypatch):
    from nfc.runtime.loader import load

    # stage by stage as such: horizontal fusion would compile the two independent row sums
    # as one kernel (tests/codegen/test_codegen_horizontal.py)
    monkeypatch.setenv("NFC_HFUSE", "0")
    module = parse_module(GROUPS)
    art = build_artifact(module, split=1)
    ks = art.kernel_set
    assert len(ks.composites) == 2 and len(art.kernels) == 2
    first, second = ks.composites.values()
    assert [c[0] for c in first.calls][0] == [c[0] for c in first.calls][1]  # the two row sums
    assert first.calls[0][0] == second.calls[0][0]  # ... and the first stage of the second
    # distinct stage kernels: row sum, product, scaled-and-weighted sum (%e is inlined)
    assert len(ks.entries) == 3
    lib = str(tmp_path / "g.so")
    art.write_shared(lib)
    rng = np.random.default_rng(3)
    feeds = {n: rng.standard_normal((8, 16)).astype(np.float32) for n in ("x", "y")}
    out = load(lib).functions["step"](**feeds)
    want = interp_run(module.funcs[0], dict(feeds), module=module)
    np.testing.assert_allclose(out["z"], want[0], rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(out["w"], want[1], rtol=1e-5, atol=1e-5)
