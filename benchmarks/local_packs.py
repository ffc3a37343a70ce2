"""Panels packed per batch element vs the whole operand at once: speed and workspace of the
kernels of a model's train_step that the choice changes (docs/performance.md, "Memory").

    .venv/bin/python benchmarks/local_packs.py examples/models/capsnet.nf --batch 32 [--rounds 7]

Builds the model as `nfc compile` does up to fusion (tuned schedules), lowers every kernel
with `nfc.codegen.lowering.packing.LOCAL_PACK_BYTES` at its value (`local`: large panel packs
filled per batch element) and disabled (`whole`: every pack filled whole first, as before),
and for each kernel whose workspace differs compiles both, checks that their results are bit
for bit equal on random inputs and times them in alternating rounds on one thread (median of
the rounds, each the best of 3 calls). Prints workspace and time of both and the ratio.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np

PIPELINE = "im2col,training-functions,inline,canonicalize,cse,dce,apply-tuning,fuse"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--ops", default="", help="only these op positions (comma separated)")
    args = ap.parse_args(argv)
    from nfc.codegen import jit
    from nfc.codegen.lower import group_of
    from nfc.codegen.lowering import packing
    from nfc.ir import ComputeOp, KernelOp
    from nfc.runtime.build import build_module

    jit.set_num_threads(1)
    params = {} if args.batch is None else {"batch": args.batch}
    module, _ = build_module(args.model, params, {}, PIPELINE)
    local_limit = packing.LOCAL_PACK_BYTES
    bad = 0
    for n, op in enumerate(module.func("train_step").body.ops):
        if not isinstance(op, ComputeOp | KernelOp) or (
                args.ops and str(n) not in args.ops.split(",")):
            continue
        sched = op.attrs.get("nf.schedule")
        kernels, ws = {}, {}
        for name, limit in (("whole", 1 << 62), ("local", local_limit)):
            packing.LOCAL_PACK_BYTES = limit
            ws[name] = jit.lower_kernel(op, sched).workspace_bytes
            if name == "local" and ws["local"] == ws["whole"]:
                break
            kernels[name] = jit.compile_kernel(op, sched)
        packing.LOCAL_PACK_BYTES = local_limit
        if len(kernels) < 2:
            continue
        rng = np.random.default_rng(n)
        ins = [rng.standard_normal(v.shape).astype(v.dtype.numpy) if v.dtype.is_float else
               rng.integers(0, 2, v.shape).astype(v.dtype.numpy) for v in group_of(op)[2]]
        outs = {k: kern(*ins) for k, kern in kernels.items()}
        same = all(np.array_equal(a, b, equal_nan=True) for a, b in zip(
            *(o if isinstance(o, tuple) else (o,) for o in outs.values()), strict=True))
        bad += not same
        times: dict[str, list[float]] = {k: [] for k in kernels}
        for _ in range(args.rounds):
            for k, kern in kernels.items():
                best = float("inf")
                for _ in range(3):
                    t0 = time.perf_counter()
                    kern(*ins)
                    best = min(best, time.perf_counter() - t0)
                times[k].append(best)
        med = {k: statistics.median(v) for k, v in times.items()}
        print(f"op {n:3d} workspace whole {ws['whole'] / 2**20:8.2f} MiB local "
              f"{ws['local'] / 2**20:8.2f} MiB  time whole {med['whole'] * 1e3:8.2f} ms local "
              f"{med['local'] * 1e3:8.2f} ms  local/whole {med['local'] / med['whole']:.3f}"
              f"  {'bit-identical' if same else 'RESULTS DIFFER'}", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
