"""Benchmark: a square fp32 matmul, nfc's default schedule vs numpy and PyTorch, side by side.

    python benchmarks/matmul.py [--n 1024] [--repeat 10] [--threads 1,2]

Prints GFLOP/s for each library at each thread count and nfc as a percentage of PyTorch
(eager `torch.mm`, MKL) when torch is importable. Every library runs in the same process, one
after another per repetition, so they see the same machine state; the best time counts.
`OPENBLAS_CORETYPE`/`OPENBLAS_L2_SIZE` (set on some machines for old OpenBLAS builds) slow a
current numpy down, so the benchmark drops them for numpy only when started with
`--numpy-native` (it re-executes itself).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable

import numpy as np

_CLOCK = {"wall": time.perf_counter, "cpu": time.process_time}
_threads = 1


def _best(fn: Callable[[], object], repeat: int, clock: str = "wall") -> float:
    """Best time of `repeat` calls. The `cpu` clock counts the process's CPU seconds divided
    by the thread count: on a machine shared with other jobs it measures the code, not the
    scheduler (busy-waiting threads still count)."""
    now = _CLOCK[clock]
    fn()
    best = float("inf")
    for _ in range(repeat):
        t = now()
        fn()
        best = min(best, now() - t)
    return best / (_threads if clock == "cpu" else 1)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=10)
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                    help="wall time, or process CPU time / threads (for a busy machine)")
    ap.add_argument("--numpy-native", action="store_true",
                    help="unset OPENBLAS_CORETYPE/OPENBLAS_L2_SIZE for numpy (re-executes)")
    args = ap.parse_args(argv)
    if args.numpy_native and any(k in os.environ for k in ("OPENBLAS_CORETYPE",
                                                           "OPENBLAS_L2_SIZE")):
        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
        os.execve(sys.executable, [sys.executable, *sys.argv], env)

    from threadpoolctl import threadpool_limits

    from nfc.codegen.cpu import host_target
    from nfc.codegen.jit import compile_kernel, set_num_threads
    from nfc.codegen.space import schedule_space
    from nfc.ir import Axis, ComputeOp, DType, Index, Load, TensorType, Value

    try:
        import torch
    except ImportError:
        torch = None

    n = args.n
    a_v = Value(TensorType((n, n), DType.F32), "A")
    b_v = Value(TensorType((n, n), DType.F32), "B")
    op = ComputeOp(TensorType((n, n), DType.F32), (Axis("i", n), Axis("j", n)),
                   Load(a_v, (Index("i"), Index("k"))) * Load(b_v, (Index("k"), Index("j"))),
                   reduce="sum", raxes=(Axis("k", n),))
    space = schedule_space(op)
    cfg = space.default()
    t0 = time.perf_counter()
    kernel = compile_kernel(op)
    compile_s = time.perf_counter() - t0
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    c = np.empty((n, n), np.float32)
    kernel.run([c], [a, b])
    ta, tb = (torch.from_numpy(a), torch.from_numpy(b)) if torch is not None else (None, None)
    err = float(np.abs(c - a @ b).max())
    flops = 2.0 * n ** 3
    print(f"matmul {n}x{n}x{n} fp32 on {host_target().cpu} "
          f"({host_target().vector_bits}-bit vectors); nfc schedule {cfg}; "
          f"compile {compile_s:.2f} s; max |nfc - numpy| = {err:.2e}")
    header = f"{'threads':>7} {'nfc':>10} {'numpy':>10}"
    if torch is not None:
        header += f" {'torch':>10} {'nfc/torch':>10}"
    print(header + f"   (GFLOP/s, {args.clock} clock)")
    global _threads
    for threads in (int(x) for x in args.threads.split(",")):
        _threads = threads
        set_num_threads(threads)
        times = {"nfc": float("inf"), "numpy": float("inf"), "torch": float("inf")}
        if torch is not None:
            torch.set_num_threads(threads)
        for _ in range(3):  # interleave, so a busy neighbour hurts every library alike
            times["nfc"] = min(times["nfc"], _best(lambda: kernel.run([c], [a, b]),
                                                   args.repeat, args.clock))
            with threadpool_limits(threads):
                times["numpy"] = min(times["numpy"], _best(lambda: a @ b, args.repeat,
                                                                 args.clock))
            if torch is not None:
                times["torch"] = min(times["torch"], _best(lambda: torch.mm(ta, tb),
                                                           args.repeat, args.clock))
        g = {k: flops / v / 1e9 for k, v in times.items()}
        line = f"{threads:>7} {g['nfc']:>10.1f} {g['numpy']:>10.1f}"
        if torch is not None:
            line += f" {g['torch']:>10.1f} {100 * g['nfc'] / g['torch']:>9.1f}%"
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
