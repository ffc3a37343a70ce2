"""The arena of every example's train_step against its lower bound (docs/memory.md).

    .venv/bin/python scripts/memory_table.py [--codegen] [MODEL.nf ...] [--set batch=8]

Without `--codegen` the plan is the IR level one after the `nfc compile` pipeline (no kernel
workspaces); with it the artifact's own plan (workspaces and staging buffers included), which
costs a code generation per model. Columns: the arena of the old planner (greedy by size
alone), the current planner's, the lower bound (most bytes live at once), the gap, saved
activations and the whole step's peak.
"""

from __future__ import annotations

import argparse
import glob
import sys
import time

from nfc.passes.memplan import (
    fmt_bytes,
    function_buffers,
    lower_bound,
    memory_report,
    plan_offsets,
)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--codegen", action="store_true")
    ap.add_argument("--set", dest="settings", action="append", default=[])
    args = ap.parse_args(argv)
    from nfc.runtime.build import build_module, parse_settings, pipeline_for

    models = args.models or sorted(glob.glob("examples/*.nf") + glob.glob("examples/models/*.nf"))
    print(f"{'model':<34} {'bufs':>5} {'old arena':>11} {'new arena':>11} {'lower bnd':>11} "
          f"{'gap old':>7} {'gap new':>7} {'saved':>11} {'peak':>11} {'s':>5}")
    for path in models:
        t0 = time.perf_counter()
        try:
            params, opt = parse_settings(args.settings)
            module, _ = build_module(path, params, opt, pipeline_for(path, None))
            if not module.has_func("train_step"):
                print(f"{path:<34} (no train_step)")
                continue
            func = module.func("train_step") if hasattr(module, "func") else next(
                f for f in module.funcs if f.name == "train_step")
            if args.codegen:
                from nfc.codegen.artifact import build_artifact

                plan = build_artifact(module, functions=["train_step"]).plans["train_step"]
                bufs, rep = plan.buffers, plan.memory_report()
            else:
                bufs = function_buffers(func)
                rep = memory_report(func, bufs)
            old = plan_offsets(bufs, strategies=["size"]).peak
            lb = lower_bound(bufs)
            print(f"{path:<34} {len(bufs):>5} {fmt_bytes(old):>11} {fmt_bytes(rep.arena):>11} "
                  f"{fmt_bytes(lb):>11} {old / max(lb, 1):>7.3f} {rep.arena / max(lb, 1):>7.3f} "
                  f"{fmt_bytes(rep.saved_total):>11} {fmt_bytes(rep.total):>11} "
                  f"{time.perf_counter() - t0:>5.1f}", flush=True)
        except Exception as exc:  # noqa: BLE001 - a failing model is a row, not a crash
            print(f"{path:<34} error: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
