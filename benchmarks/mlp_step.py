"""One training step of MLP-3 (784-256-128-10, batch 256, SGD momentum): nfc vs PyTorch eager.

    .venv/bin/python benchmarks/mlp_step.py [--threads 1 2] [--batch 256] [--json]

nfc: examples/mlp.nf compiled into a library (cached), one native call per step from Python.
PyTorch (optional, `pip install torch`): the same layers, loss and optimizer in eager mode,
starting from nfc's initial parameters, so the first-step losses must agree. Both are timed
on the same random batch, alternating repeats so that other load on the machine hits both;
the median step time is reported per thread count.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)

    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load
    from nfc.runtime.torch_ref import TorchUnavailable, compare_step

    t0 = time.perf_counter()
    built = compile_model(ROOT / "examples" / "mlp.nf", settings=[f"batch={args.batch}"])
    compile_s = time.perf_counter() - t0
    model = load(built.path)
    model.init(seed=0)
    rows = []
    for n in args.threads:
        try:
            c = compare_step(model, threads=n, repeats=args.repeats)
            rows.append({"threads": n, "nfc_ms": c.nfc_s * 1e3, "torch_ms": c.torch_s * 1e3,
                         "nfc_speed_vs_torch": c.torch_s / c.nfc_s, "nfc_loss": c.nfc_loss,
                         "torch_loss": c.torch_loss, "nfc_min_ms": c.nfc_min_s * 1e3,
                         "torch_min_ms": c.torch_min_s * 1e3})
        except TorchUnavailable as exc:
            from nfc.runtime.train import model_io

            fn = model.train_step
            x, y = model_io(fn.meta)
            import numpy as np

            feeds = {x.name: np.zeros(x.shape, x.dtype), y.name: np.zeros(y.shape, y.dtype)}
            model.set_num_threads(n)
            for _ in range(5):
                fn(**feeds)
            ts = []
            for _ in range(args.repeats):
                s = time.perf_counter()
                for _ in range(10):
                    fn(**feeds)
                ts.append((time.perf_counter() - s) / 10)
            rows.append({"threads": n, "nfc_ms": float(np.median(ts)) * 1e3, "torch_ms": None,
                         "nfc_speed_vs_torch": None, "note": str(exc)})
    flops = sum(k["flops"] for k in model.metadata["functions"]["train_step"]["kernels"])
    if args.json:
        print(json.dumps({"batch": args.batch, "compile_s": compile_s, "cached": built.cached,
                          "step_gflop": flops / 1e9, "rows": rows}))
        return 0
    print(f"MLP-3 784-256-128-10, batch {args.batch}, one training step (forward, backward, "
          f"SGD momentum): {flops / 1e9:.3f} GFLOP")
    print(f"nfc library: {built.path} ({'cached' if built.cached else 'built'} in "
          f"{compile_s:.1f} s)")
    import os

    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; medians "
          "(fastest repeat in brackets)")
    print(f"{'threads':>7} {'nfc ms':>17} {'torch ms':>17} {'nfc GFLOP/s':>12} "
          f"{'torch/nfc time':>15}  first-step loss nfc / torch")
    for r in rows:
        tm = (f"{r['torch_ms']:.3f} [{r['torch_min_ms']:.3f}]" if r["torch_ms"] is not None
              else "-")
        nm = f"{r['nfc_ms']:.3f} [{r.get('nfc_min_ms', r['nfc_ms']):.3f}]"
        ratio = f"{r['nfc_speed_vs_torch']:.2f}x" if r["nfc_speed_vs_torch"] else "-"
        loss = (f"{r['nfc_loss']:.6f} / {r['torch_loss']:.6f}" if r.get("torch_loss")
                else r.get("note", ""))
        print(f"{r['threads']:>7} {nm:>17} {tm:>17} "
              f"{flops / (r['nfc_ms'] * 1e-3) / 1e9:>12.1f} {ratio:>15}  {loss}")
    print("torch/nfc time > 1 means nfc is faster.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
