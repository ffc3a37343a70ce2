"""Large reductions: the summation scheme of nfc.codegen.lowering.reductions against the one
it replaced, interleaved in one process (docs/performance.md, "Reductions").

    .venv/bin/python benchmarks/reductions.py                     # 1e7-term mean, JIT
    PYTHONPATH=/tmp/old .venv/bin/python benchmarks/reductions.py --build mse A.so
    .venv/bin/python benchmarks/reductions.py --build mse B.so
    .venv/bin/python benchmarks/reductions.py --libs A.so B.so    # two builds of one model

Kernels: `sum(k) x[k] / N` over 10^7 f32 terms (a mean with the division in the summed body,
as written `sum(k) x[k] / N` or left by the gradient of a mean), compiled four ways:
`old` (one vector of 16 partial sums added for the whole reduction, the division per term,
one thread: the code before the change), `+blocked` (blocks of 128 terms per lane flushed
into float64), `+factor` (the division applied once to the sum), `new` (the default
schedule: also two vectors of partial sums and 64 chunks run on threads). Each round times
every variant (best of 5 calls), the rounds alternate; the table gives medians, the ratio to
`old` and the relative error against the float64 sum.

`--build NAME OUT.so` builds one of `MODELS` like `nfc compile` (no tuning) with the nfc that
is first on PYTHONPATH (an older checkout: `/tmp/old` above); `--libs A.so B.so` times
`forward` and `train_step` of two builds of one model the same way, every input uniform in
[0.5, 1.5).
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np

#: Models for `--build`: a mean of 10^7 elements (its gradient sums `x * 1/n`), and the mean
#: squared error of a [60, 100, 1000] tensor (std.nn's `mse` flattens it with a reshape) with
#: two means of it, one written with the division inside the sum.
MODELS = {
    "mean": """
model mean(n = 10000000) {
  input x: f32[n]
  param w: f32[1] = ones
  loss[] = (sum(i) x[i] * w[0]) / n
  output loss
  minimize loss with sgd(lr = 0.1)
}
""",
    "mse": """
import std.nn
model mse(a = 60, b = 100, c = 1000) {
  input x: f32[a, b, c]
  input t: f32[a, b, c]
  param w: f32[1] = ones
  y[i, j, k] = x[i, j, k] * w[0]
  loss1[] = (sum(i, j, k) y[i, j, k]) / (a * b * c)
  loss2 = mse(y, t)
  loss3[] = sum(i, j, k) y[i, j, k] / (a * b * c)
  loss[] = loss1[] + loss2[] + loss3[]
  output loss1
  output loss2
  output loss3
  minimize loss with sgd(lr = 0.1)
}
""",
}


def build(name: str, out: str) -> None:
    import tempfile
    from pathlib import Path

    from nfc.runtime.build import build_library, frontend_module, pipeline_for, run_pipeline

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / f"{name}.nf"
        src.write_text(MODELS[name])
        module = frontend_module(src, {})
        run_pipeline(module, pipeline_for(src, tuning=False))
        build_library(module, out, use_cache=False)


def best_of(fn: Callable[[], object], reps: int = 5) -> float:
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def rounds(variants: dict[str, Callable[[], object]], n: int) -> dict[str, float]:
    """Median over `n` alternating rounds of each variant's best-of-5 time (seconds)."""
    times: dict[str, list[float]] = {k: [] for k in variants}
    for r in range(n):
        names = list(variants) if r % 2 == 0 else list(reversed(variants))
        for k in names:
            times[k].append(best_of(variants[k]))
    return {k: statistics.median(v) for k, v in times.items()}


def jit_kernels(n: int) -> None:
    import nfc.codegen.lowering.reductions as red
    import nfc.codegen.lowering.stage as stage
    from nfc.codegen.cpu import host_target
    from nfc.codegen.jit import compile_kernel, set_num_threads
    from nfc.codegen.schedule import Split, replace
    from nfc.codegen.space import default_schedule
    from nfc.ir import Axis, Binary, ComputeOp, Const, DType, Index, Load, TensorType, Value

    x = Value(TensorType((n,), DType.F32), "x")
    op = ComputeOp(TensorType((), DType.F32), (), Binary("/", Load(x, (Index("k"),)),
                                                          Const(float(n))),
                   reduce="sum", raxes=(Axis("k", n),), name="mean")
    new = default_schedule(op)
    lanes = host_target().lanes(DType.F32)
    old = replace(new, splits=(Split("k", (lanes,)),), parallel_reduce=0)
    whole = stage.split_factors

    def build(sched, blocked: bool, factor: bool):
        saved = red.BLOCK_MIN
        red.BLOCK_MIN = saved if blocked else 1 << 62
        stage.split_factors = whole if factor else (lambda o: (o.body, ()))
        try:
            return compile_kernel(op, sched)
        finally:
            red.BLOCK_MIN = saved
            stage.split_factors = whole
    kernels = {"old": build(old, False, False), "+blocked": build(old, True, False),
               "+factor": build(old, True, True), "new": build(new, True, True)}
    arr = np.random.default_rng(0).uniform(0.5, 1.5, n).astype(np.float32)
    ref = float(arr.astype(np.float64).mean())
    print(f"mean of {n} f32 terms; new schedule: {new}")
    for threads in (1, 2):
        set_num_threads(threads)
        t = rounds({k: (lambda k=k: kernels[k](arr)) for k in kernels}, 9)
        for k, kern in kernels.items():
            err = abs(float(kern(arr)) - ref) / ref
            print(f"  threads {threads}  {k:9s} {t[k] * 1e3:8.3f} ms  old/this "
                  f"{t['old'] / t[k]:5.2f}  relative error {err:.1e}")


def libraries(paths: list[str], threads: int) -> None:
    from nfc.runtime.loader import load

    calls: dict[str, Callable[[], object]] = {}
    for tag, path in zip("AB", paths, strict=True):
        m = load(path)
        m.set_num_threads(threads)
        m.init(0)
        for fname in ("forward", "train_step"):
            fn = getattr(m, fname)
            ins = {spec.name: np.random.default_rng(k).uniform(0.5, 1.5, spec.shape)
                   .astype(spec.dtype) for k, spec in enumerate(fn.inputs)}
            calls[f"{fname} {tag}"] = lambda fn=fn, ins=ins: fn(**ins)
    t = rounds(calls, 9)
    for fname in ("forward", "train_step"):
        a, b = t[f"{fname} A"], t[f"{fname} B"]
        print(f"  threads {threads}  {fname:10s} A {a * 1e3:8.3f} ms  B {b * 1e3:8.3f} ms  "
              f"A/B {a / b:5.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=10**7)
    ap.add_argument("--libs", nargs=2, metavar="SO")
    ap.add_argument("--build", nargs=2, metavar=("MODEL", "OUT"))
    a = ap.parse_args()
    if a.build:
        build(*a.build)
    elif a.libs:
        for threads in (1, 2):
            libraries(a.libs, threads)
    else:
        jit_kernels(a.n)


if __name__ == "__main__":
    main()
