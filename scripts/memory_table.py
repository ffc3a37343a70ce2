"""Memory tables of the example models' train_step (docs/memory.md, docs/performance.md).

    .venv/bin/python scripts/memory_table.py [--codegen] [MODEL.nf ...] [--set batch=8]
    .venv/bin/python scripts/memory_table.py --options [MODEL.nf ...] [--bench BENCH.jsonl]
    .venv/bin/python scripts/memory_table.py --batch-search MODEL.nf [--max-factor 4]
    .venv/bin/python scripts/memory_table.py --breakdown MODEL.nf [--set batch=32] [--middle P]

Default: the planner against its lower bound. Without `--codegen` the plan is the IR level one
after the `nfc compile` pipeline (no kernel workspaces); with it the artifact's own plan
(workspaces and staging buffers included), which costs a code generation per model. Columns:
the arena of the old planner (greedy by size alone), the current planner's, the lower bound
(most bytes live at once), the gap, saved activations and the whole step's peak.

`--options`: the artifact's planned peak (`MemoryReport.total`: parameters, optimizer state,
inputs, outputs, arena) under each memory option, built as `nfc compile` builds (tuning cache,
fusion, kernel workspaces; nothing compiled by LLVM): the default pipeline, `remat`,
`remat{fraction=0.5}` (a 50% budget: the smallest reachable peak when it cannot be met),
`compress-activations` (ReLU masks), masks with `remat`, and masks with bf16 storage. With
`--bench` (a `nfc bench --json` file), each framework's measured step peak (peak RSS minus RSS
after the imports) is added. `--markdown` prints a Markdown table.

`--batch-search`: the budget is the model's default-batch peak without any option; the largest
batch (between the default and `--max-factor` times it) whose peak fits that budget, with the
default pipeline, with `remat{peak=budget}` and with `compress-activations,remat{peak=budget}`
(masks and recomputation are measured apart: their combination can be worse; `--bf16`: with
`compress-activations{dtype=bf16},remat{peak=budget}` instead, which is lossy).

`--breakdown`: the artifact plan's three busiest moments (op positions of the step) with the
largest buffers live there: values by name and type, kernel workspaces with their largest
allocations (GEMM panels, a fused kernel's temporaries); `--middle` puts passes before
tuning, as the other modes do.
"""

from __future__ import annotations

import argparse
import glob
import json
import sys
import time

from nfc.passes.memplan import (
    fmt_bytes,
    function_buffers,
    lower_bound,
    memory_report,
    plan_offsets,
)

BASE = "im2col,training-functions,inline,canonicalize,cse,dce"
REST = "apply-tuning,fuse"
#: (column, passes between the cleanup and `apply-tuning,fuse`)
OPTIONS = [
    ("default", ""),
    ("remat", "remat"),
    ("remat 50%", "remat{fraction=0.5}"),
    ("masks", "compress-activations"),
    ("masks+remat", "compress-activations,remat"),
    ("masks+bf16", "compress-activations{dtype=bf16}"),
]
#: bench model names of the example files (`nfc bench --list`)
BENCH_NAMES = {"examples/mlp.nf": "mlp3", "examples/capsule.nf": "matrix_capsule"}
#: the settings `nfc bench` uses for a model (its `--list`): the same here, so that the
#: measured columns compare like with like
BENCH_SETTINGS = {"examples/models/capsnet.nf": {"batch": 4}}


def _examples() -> list[str]:
    return sorted(p for p in glob.glob("examples/*.nf") + glob.glob("examples/models/*.nf")
                  if not p.endswith("layers.nf"))


def plan_of(path: str, middle: str, params: dict | None = None):
    """The artifact plan's MemoryReport of `path`'s train_step built with `middle` between the
    cleanup and tuning/fusion, and the seconds the build took; a CompileError propagates."""
    from nfc.codegen.artifact import build_artifact
    from nfc.runtime.build import build_module

    pipeline = ",".join(p for p in (BASE, middle, REST) if p)
    t0 = time.perf_counter()
    module, ctx = build_module(path, params or {}, {}, pipeline)
    art = build_artifact(module, functions=["train_step"])
    return art.plans["train_step"].memory_report(), time.perf_counter() - t0, ctx


def _bench_peaks(path: str | None) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    if not path:
        return out
    from nfc.runtime.bench.report import step_peak_mb

    with open(path, encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            if r.get("status") == "ok" and r.get("threads", 1) == 1:
                v = step_peak_mb(r)
                if v is not None:
                    out[(r["model"], r["framework"])] = v
    return out


def options_table(models: list[str], bench: str | None, markdown: bool) -> None:
    from nfc.diagnostics import CompileError

    peaks = _bench_peaks(bench)
    fws = [fw for fw in ("nfc", "torch", "torch-compile", "jax")
           if any(k[1] == fw for k in peaks)]
    head = ["model", *[name for name, _ in OPTIONS], *[f"{fw} measured" for fw in fws]]
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" + "---:|" * (len(head) - 1))
    else:
        print("  ".join(f"{h:>14}" for h in head))
    for path in models:
        cells = [path]
        base_total = None
        for _name, middle in OPTIONS:
            try:
                rep, secs, _ = plan_of(path, middle, BENCH_SETTINGS.get(path))
            except CompileError as exc:
                text = str(exc)
                feasible = text.split("smallest feasible budget is ")[-1].split(" bytes")[0]
                cells.append(f"> 50%: {int(feasible.replace(',', '')) / 2**20:.1f}"
                             if "cannot be met" in text else "error")
                continue
            except KeyError:
                cells.append("-")
                continue
            mb = rep.total / 2**20
            if base_total is None:
                base_total = rep.total
                cells.append(f"{mb:.1f}")
            else:
                cells.append(f"{mb:.1f} ({100 * (rep.total / base_total - 1):+.0f}%)")
            print(f"  [{path} {middle or 'default'}: arena {fmt_bytes(rep.arena)}, "
                  f"{secs:.0f} s]", file=sys.stderr, flush=True)
        name = BENCH_NAMES.get(path, path.rsplit("/", 1)[-1].removesuffix(".nf"))
        for fw in fws:
            v = peaks.get((name, fw))
            cells.append("-" if v is None else f"{v:.1f}")
        if markdown:
            print("| " + " | ".join(cells) + " |", flush=True)
        else:
            print("  ".join(f"{c:>14}" for c in cells), flush=True)


def batch_search(path: str, max_factor: float, bf16: bool = False) -> None:
    import re

    from nfc.diagnostics import CompileError

    with open(path, encoding="utf-8") as f:
        m = re.search(r"model\s+\w+\s*\([^)]*\bbatch\s*=\s*(\d+)", f.read())
    if m is None:
        raise SystemExit(f"{path}: no `batch = N` parameter in the model header")
    default = int(m.group(1))
    budget = plan_of(path, "", {"batch": default})[0].total
    print(f"{path}: default batch {default}, budget = its peak {budget:,} bytes "
          f"({fmt_bytes(budget)})")

    def fits(batch: int, middle: str) -> tuple[bool, int]:
        try:
            rep = plan_of(path, middle, {"batch": batch})[0]
        except CompileError:
            return False, 0
        return rep.total <= budget, rep.total

    modes = [("default", ""), ("remat", f"remat{{peak={budget}}}"),
             ("masks+remat", f"compress-activations,remat{{peak={budget}}}")]
    if bf16:
        modes = [("bf16+remat", f"compress-activations{{dtype=bf16}},remat{{peak={budget}}}")]
    for label, middle in modes:
        lo, hi = default, int(default * max_factor) + 1  # lo fits (the budget is its peak)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            ok, total = fits(mid, middle)
            print(f"  {label} batch {mid}: {'fits' if ok else 'does not fit'}"
                  + (f" ({total:,} bytes)" if total else ""), flush=True)
            if ok:
                lo = mid
            else:
                hi = mid
        print(f"{path} {label}: largest batch within the budget {lo} "
              f"({lo / default:.2f}x the default)", flush=True)


def breakdown(path: str, params: dict, middle: str, top: int = 3) -> None:
    """Print the busiest moments of `path`'s train_step plan and what is live there."""
    from nfc.codegen.artifact import build_artifact
    from nfc.codegen.jit import lower_kernel
    from nfc.runtime.build import build_module

    pipeline = ",".join(p for p in (BASE, middle, REST) if p)
    module, _ = build_module(path, params, {}, pipeline)
    plan = build_artifact(module, functions=["train_step"]).plans["train_step"]
    rep = plan.memory_report()
    ops = plan.func.body.ops
    values = {id(v): v for op in ops for v in op.results}
    bufs = plan.buffers
    live = [0] * (max(b.end for b in bufs) + 1)
    for b in bufs:
        for t in range(b.start, b.end + 1):
            live[t] += b.size
    print(f"{path} {params} {middle or 'default'}: peak {rep.total:,} bytes, arena "
          f"{rep.arena:,}")
    for t in sorted(range(len(live)), key=lambda t: -live[t])[:top]:
        print(f"  op {t}: {live[t]:,} bytes live")
        for b in sorted((b for b in bufs if b.start <= t <= b.end), key=lambda b: -b.size)[:6]:
            if b.key[0] == "v":
                v = values[b.key[1]]
                what = f"value %{v.name} {v.type}, live {b.start}-{b.end}"
            else:
                n = b.key[1]
                info = lower_kernel(ops[n], ops[n].attrs.get("nf.schedule"))
                big = sorted(info.loops.workspace_buffers, key=lambda w: -w.nbytes)[:3]
                what = f"{b.key[0]} of op {n}: " + ", ".join(
                    f"{w.name}{list(w.shape)} {fmt_bytes(w.nbytes)}" for w in big)
            print(f"    {fmt_bytes(b.size):>11}  {what}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*")
    ap.add_argument("--codegen", action="store_true")
    ap.add_argument("--set", dest="settings", action="append", default=[])
    ap.add_argument("--options", action="store_true")
    ap.add_argument("--bench", default=None)
    ap.add_argument("--markdown", action="store_true")
    ap.add_argument("--batch-search", action="store_true")
    ap.add_argument("--max-factor", type=float, default=4.0)
    ap.add_argument("--breakdown", action="store_true")
    ap.add_argument("--middle", default="", help="with --breakdown: passes before tuning")
    ap.add_argument("--bf16", action="store_true",
                    help="with --batch-search: only masks, bf16 storage and remat (lossy)")
    args = ap.parse_args(argv)
    if args.options:
        options_table(args.models or _examples(), args.bench, args.markdown)
        return 0
    if args.batch_search:
        for m in args.models:
            batch_search(m, args.max_factor, args.bf16)
        return 0
    from nfc.runtime.build import build_module, parse_settings, pipeline_for

    if args.breakdown:
        for m in args.models:
            breakdown(m, parse_settings(args.settings)[0], args.middle)
        return 0

    models = args.models or _examples()
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
            func = module.func("train_step")
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
