"""Step time of each seed model with nfc's optional graph passes switched off and on (issue 12),
side by side with PyTorch eager, torch.compile and JAX: the table of docs/performance.md,
"Graph passes on and off".

    # the full table (the lead's run: an idle machine, about an hour for every seed model)
    .venv/bin/python benchmarks/pass_table.py --all --threads 1,2 \\
        --json benchmarks/results/pass_table.jsonl > benchmarks/results/pass_table.md

    # a smoke run: two small models, one thread, nfc only
    .venv/bin/python benchmarks/pass_table.py mlp3 lstm_lm --threads 1 --frameworks none

    # the baselines from an `nfc bench --json` file of the same run instead of new processes
    .venv/bin/nfc bench --all --json bench.jsonl
    .venv/bin/python benchmarks/pass_table.py --all --baselines bench.jsonl

**Variants.** `--passes` is a list in pipeline syntax (default
`no-layout,layout,swap-operands,parallel-fusion,param-layout`); each entry edits the default build
pipeline of `nfc compile` (nfc.runtime.build.pipeline_for) as the pass is meant to be used:

    no-layout           the default's `layout{when=auto}` removed (`--no-layout`: nothing
                        blocked; not part of "all")
    layout              nfc.passes.layout.with_layout (`layout` before `im2col`, forced on:
                        it blocks the forward that autodiff then differentiates; without
                        that helper, `inline,canonicalize,cse,dce,layout` first)
    param-layout        `--param-layout concat`: parallel-fusion{layout=true} before
                        `training-functions` (nfc.passes.parallel_fusion.with_param_layout)
    parallel-fusion     `parallel-fusion,canonicalize,cse,dce` after the cleanup, before
                        `apply-tuning` (on the training functions)
    swap-operands       after the cleanup, before `apply-tuning`
    any other pass      likewise after the cleanup, before `apply-tuning`

Options go with the name (`parallel-fusion{max-width=4}`, `layout{block=8}`). An entry whose
pass is not registered (`nfc passes`) is skipped and the script says so; so is one whose
edited pipeline does not build. "all" is every variant that remains, applied together.

**Method.** For each model (the `nfc bench` models: their benchmark sizes, `--quick` their
smoke sizes, `--set K=V` over both) every variant is compiled by `nfc bench`'s compile worker
(nfc.runtime.bench.worker: the library, then nfc's initial state from `--seed` and random
inputs in a case file; the library cache is allowed, `--cold` forbids it: compile time is not
what this measures). Then, for each thread count, one fresh process loads every variant's
library with its case and times their train steps alternating: after the first step (its
loss is printed: the variants must start from the same state, so the first losses agree to
rounding) and warm-up steps (`--warmup` seconds of the first variant), `--rounds` rounds in
which each variant runs a batch of steps (about `--min-time / --rounds` seconds of the
median variant), the order rotating from round to round, so that other load on the machine
falls on every variant alike. Every variant runs as many steps as the others (from the same
state, on the same batch: their losses after the timing should still agree roughly). A
variant's time is the median over the rounds of its mean step in the round (wall clock).
The baselines are the
`nfc bench` processes of benchmarks/run_baseline.py, started from the default variant's case
file (the same initial parameters and inputs), or read from `--baselines FILE.jsonl`.

**Table.** Per model and thread count: the default build's step time, then every column as
a ratio of step times to it (below 1: faster than nfc's default build; for the baselines
above 1 means nfc's default build is faster). A variant whose library is byte-identical to
the default one (the pass found nothing to do) shows `=`; `!` marks a first loss differing
from the default's by more than 1e-3 relative, `?` a loss after the timed steps differing by
more than 5 % (a variant that computes something else: look before believing its time).
`--json` writes one line per measurement.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

DEFAULT_PASSES = "no-layout,layout,swap-operands,parallel-fusion,param-layout"
#: Pseudo-passes: option names of the build, with the registered pass each one needs.
PSEUDO = {"param-layout": "parallel-fusion", "no-layout": "layout"}
#: Entries that switch something off: not part of "all".
OFF = frozenset({"no-layout"})
#: Relative difference of first losses beyond which the variants did not start alike.
LOSS_RTOL = 1e-3
#: ... and of the losses after the timed steps (as many for every variant, on the same batch:
#: rounding differences grow over the steps, so this is only a coarse check).
LAST_LOSS_RTOL = 0.05


# ---------------------------------------------------------------------------------------------
# the variants


@dataclass(frozen=True)
class Variant:
    """One build: a name for the table and its pipeline."""

    name: str
    pipeline: str


def _before(pipeline: str, text: str, anchor: str = "apply-tuning") -> str:
    """`pipeline` with the passes `text` inserted before its first `anchor` (else before
    `fuse`, else at the end)."""
    from nfc.passmanager import build_pipeline, format_pipeline

    passes = build_pipeline(pipeline)
    names = [p.name for p in passes]
    k = next((names.index(a) for a in (anchor, "fuse") if a in names), len(passes))
    return format_pipeline([*passes[:k], *build_pipeline(text), *passes[k:]])


def _with_layout(pipeline: str, options: str) -> str:
    """The layout transformation as its pass module places it (`with_layout`), else the
    cleanup and the pass before the pipeline (before `im2col`)."""
    try:
        from nfc.passes import layout as mod
    except ImportError:
        mod = None
    helper = getattr(mod, "with_layout", None)
    if helper is not None:
        return helper(pipeline, options[1:-1]) if options else helper(pipeline)
    return f"inline,canonicalize,cse,dce,layout{options},{pipeline}"


def _edit(pipeline: str, name: str, options: str) -> str:
    """`pipeline` with the pass `name` (and its option text `{...}`) switched on."""
    if name == "layout":
        return _with_layout(pipeline, options)
    if name == "no-layout":  # the default's automatic choice removed (`--no-layout`)
        from nfc.passmanager import build_pipeline, format_pipeline

        return format_pipeline([p for p in build_pipeline(pipeline) if p.name != "layout"])
    if name == "param-layout":
        from nfc.passes.parallel_fusion import with_param_layout

        return with_param_layout(pipeline)
    if name == "parallel-fusion":
        return _before(pipeline, f"parallel-fusion{options},canonicalize,cse,dce")
    return _before(pipeline, f"{name}{options}")


def variants(passes: str, base: str, say: Callable[[str], None]) -> list[Variant]:
    """The default build, one variant per usable entry of `passes`, and all of them together
    (when more than one). Entries whose pass is not registered, or whose pipeline does not
    build, are reported through `say` and left out."""
    from nfc.diagnostics import CompileError
    from nfc.passmanager import available_passes, build_pipeline
    from nfc.pipeline import parse_pipeline_specs

    registered = set(available_passes())
    out = [Variant("default", base)]
    edits: list[tuple[str, str]] = []
    for spec in parse_pipeline_specs(passes, "<--passes>"):
        need = PSEUDO.get(spec.name, spec.name)
        label = spec.name + (f"{{{','.join(f'{k}={v}' for k, v in spec.options.items())}}}"
                             if spec.options else "")
        if need not in registered:
            say(f"skipping '{label}': the pass '{need}' is not registered (`nfc passes` "
                "lists the registered ones)")
            continue
        opts = f"{{{','.join(f'{k}={v}' for k, v in spec.options.items())}}}" \
            if spec.options else ""
        if spec.name in PSEUDO and opts:
            say(f"skipping '{label}': it takes no options")
            continue
        try:
            text = _edit(base, spec.name, opts)
            build_pipeline(text)
        except CompileError as err:
            say(f"skipping '{label}': {str(err).strip().splitlines()[0]}")
            continue
        if text == base:
            say(f"note: '{label}' leaves the build pipeline unchanged")
        out.append(Variant(label, text))
        if spec.name not in OFF:
            edits.append((spec.name, opts))
    if len(edits) > 1:
        text = base
        for name, opts in edits:
            text = _edit(text, name, opts)
        out.append(Variant("all", text))
    return out


# ---------------------------------------------------------------------------------------------
# the timing process


def _bound(so: str, case: str, threads: int) -> tuple[Any, Callable[[], Any]]:
    """The library's train_step bound to the case's state and inputs (as nfc bench's run
    worker loads them)."""
    import numpy as np

    from nfc.runtime.bench.worker import ROLES
    from nfc.runtime.loader import load

    with np.load(case, allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    model = load(so)
    model.set_num_threads(threads)
    model.load_state_dict({k.split(":", 1)[1]: v for k, v in arrays.items()
                           if k.split(":", 1)[0] in ROLES})
    fn = model.functions["train_step"]
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    bound = fn.bind({s.name: np.ascontiguousarray(inputs[s.name], dtype=s.dtype)
                     for s in fn.inputs})
    return model, lambda: bound()["loss"]


def time_variants(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Alternate the variants' steps in this process (module doc, "Method")."""
    threads = int(spec["threads"])
    steps = {}
    keep = []
    failed: dict[str, dict[str, Any]] = {}
    for n, v in spec["variants"].items():
        try:
            model, step = _bound(v["so"], v["case"], threads)
            first_loss = float(step())
        except Exception as exc:  # noqa: BLE001 - that variant's cell says so; others run
            failed[n] = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:400]}
            continue
        keep.append(model)
        steps[n] = (step, first_loss)
    first = {n: fl for n, (_, fl) in steps.items()}
    steps = {n: st for n, (st, _) in steps.items()}
    names = list(steps)
    per_step = {}
    warm = 0  # warm-up steps: --warmup seconds of the first variant, as many for the others
    for n in names:  # the warm-up also estimates the step time
        end = time.perf_counter() + float(spec["warmup"])
        k, t0 = 0, time.perf_counter()
        while k < max(warm, 2) or (not warm and time.perf_counter() < end):
            steps[n]()
            k += 1
        warm = warm or k
        per_step[n] = (time.perf_counter() - t0) / k
    rounds = int(spec["rounds"])
    target = float(spec["min_time"]) / rounds
    # the same number of steps for every variant, so that they end in the same state too
    typical = statistics.median(per_step.values()) if per_step else 1.0
    reps = {n: max(1, round(target / max(typical, 1e-7))) for n in names}
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        for n in names[r % len(names):] + names[:r % len(names)]:
            c0, t0 = time.process_time(), time.perf_counter()
            for _ in range(reps[n]):
                steps[n]()
            times[n].append((time.perf_counter() - t0) / reps[n])
            cpu[n].append((time.process_time() - c0) / reps[n])
    last = {n: float(steps[n]()) for n in names}
    return {"threads": threads, "loadavg": os.getloadavg()[0], "results": {
        **{n: {"status": "ok", "step_ms": statistics.median(times[n]) * 1e3,
               "min_ms": min(times[n]) * 1e3, "cpu_ms": statistics.median(cpu[n]) * 1e3,
               "first_loss": first[n], "last_loss": last[n],
               "steps": reps[n] * rounds} for n in names},
        **failed}}


# ---------------------------------------------------------------------------------------------
# the run


def _close(a: float, b: float, rtol: float) -> bool:
    return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= rtol * max(1.0, abs(b))


def _sha(path: str) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def _read_baselines(path: str) -> dict[tuple[str, str, int], float]:
    """(model, framework, threads) -> step ms of the baselines in an `nfc bench --json` file."""
    from nfc.runtime.bench.driver import BASELINES

    out = {}
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        if rec.get("framework") in BASELINES and rec.get("status") == "ok" \
                and rec.get("step_ms"):
            out[(rec["model"], rec["framework"], int(rec["threads"]))] = float(rec["step_ms"])
    return out


class PassTable:
    """Compiles the variants, times them and the baselines, and keeps the records."""

    def __init__(self, args: argparse.Namespace, log: Callable[[str], None]) -> None:
        from nfc.runtime.bench.driver import BenchOptions, Runner

        self.args = args
        self.log = log
        self.threads = tuple(int(t) for t in args.threads.split(","))
        fws = () if args.frameworks == "none" else tuple(args.frameworks.split(","))
        self.frameworks = fws
        self.opts = BenchOptions(models=(), frameworks=fws, threads=self.threads,
                                 min_time=args.baseline_min_time, warmup=args.warmup,
                                 quick=args.quick, seed=args.seed, timeout=args.timeout)
        self.runner = Runner(self.opts, log=log)  # its processes: env, timeout, JSON line
        self.baselines = _read_baselines(args.baselines) if args.baselines else None
        self.records: list[dict[str, Any]] = []

    def _compile(self, m: Any, params: Mapping[str, Any], v: Variant, work: Path
                 ) -> dict[str, Any]:
        spec = {"source": str(m.file), "settings": [f"{k}={val}" for k, val in params.items()],
                "out": str(work / m.name / v.name.replace("/", "_")), "seed": self.args.seed,
                "int_bounds": {k: list(b) for k, b in m.int_bounds.items()},
                "use_cache": not self.args.cold, "model": m.model, "pipeline": v.pipeline}
        rec = self.runner._process([sys.executable, "-m", "nfc.runtime.bench.worker",
                                    "compile", json.dumps(spec)], 1,
                                   {"NFC_OBJECT_CACHE": "0"} if self.args.cold else None)
        if rec.get("status") == "ok":
            rec["sha"] = _sha(rec["so"])
            self.log(f"  {v.name}: {rec['kernels']} kernels, compiled in "
                     f"{rec['compile_s']:.1f} s ({rec['compile_kind']})")
        else:
            self.log(f"  {v.name}: {rec.get('status')}: {rec.get('error')}")
        return rec

    def run_model(self, m: Any, vs: list[Variant], work: Path) -> None:
        params = m.settings(self.args.quick, dict(self._settings()))
        self.log(f"{m.name} ({', '.join(f'{k}={v}' for k, v in params.items()) or 'defaults'})")
        comps = {v.name: self._compile(m, params, v, work) for v in vs}
        ok = [v.name for v in vs if comps[v.name].get("status") == "ok"]
        for threads in self.threads:
            base = {"model": m.name, "threads": threads}
            if ok:
                spec = {"threads": threads, "rounds": self.args.rounds,
                        "min_time": self.args.min_time, "warmup": self.args.warmup,
                        "variants": {n: {"so": comps[n]["so"], "case": comps[n]["case"]}
                                     for n in ok}}
                rec = self.runner._process([sys.executable, str(Path(__file__).resolve()),
                                            "--worker", json.dumps(spec)], threads)
                if rec.get("status", "ok") != "ok":
                    self.log(f"  {threads}t: timing failed: {rec.get('error')}")
                for n in ok:
                    r = rec.get("results", {}).get(n)
                    row = {**base, "variant": n, "framework": "nfc",
                           "pipeline": comps[n].get("pipeline"),
                           "kernels": comps[n].get("kernels"),
                           "same_as_default": comps[n].get("sha") == comps["default"].get(
                               "sha") if "default" in comps else None,
                           "loadavg": rec.get("loadavg"),
                           **(r or {"status": "error", "error": rec.get("error")})}
                    self.records.append(row)
            for v in vs:
                if v.name not in ok:
                    self.records.append({**base, "variant": v.name, "framework": "nfc",
                                         "status": comps[v.name].get("status"),
                                         "error": comps[v.name].get("error")})
            self._baselines(m, params, threads, comps.get("default", {}))
            self.log("  " + self._line(m.name, threads))

    def _settings(self) -> list[tuple[str, str]]:
        out = []
        for s in self.args.set or []:
            k, _, v = s.partition("=")
            out.append((k, v))
        return out

    def _baselines(self, m: Any, params: Mapping[str, Any], threads: int,
                   comp: Mapping[str, Any]) -> None:
        for fw in self.frameworks:
            base = {"model": m.name, "threads": threads, "framework": fw, "variant": fw}
            if self.baselines is not None:
                ms = self.baselines.get((m.name, fw, threads))
                self.records.append({**base, "status": "ok" if ms else "missing",
                                     "step_ms": ms, "source": self.args.baselines})
                continue
            rec = self.runner._baseline_case(m, fw, threads, params, comp)
            self.records.append({**base, **{k: rec.get(k) for k in (
                "status", "error", "step_ms", "min_ms", "first_loss", "compile_s")}})

    # -- the table

    def _find(self, model: str, threads: int, variant: str) -> dict[str, Any] | None:
        return next((r for r in self.records if r["model"] == model
                     and r["threads"] == threads and r["variant"] == variant), None)

    def columns(self) -> list[str]:
        seen: list[str] = []
        for r in self.records:
            if r["variant"] not in seen and r["variant"] != "default":
                seen.append(r["variant"])
        nfc = [c for c in seen if c not in self.frameworks]
        return nfc + [c for c in self.frameworks if c in seen]

    def _cell(self, model: str, threads: int, col: str) -> str:
        d = self._find(model, threads, "default")
        r = self._find(model, threads, col)
        if r is None:
            return ""
        if r.get("status") != "ok" or not r.get("step_ms"):
            return str(r.get("status") or "error")
        if d is None or d.get("status") != "ok":
            return f"{r['step_ms']:.3g} ms"
        if r.get("same_as_default"):
            return "="
        cell = f"{r['step_ms'] / d['step_ms']:.2f}"
        fl, dl = r.get("first_loss"), d.get("first_loss")
        if fl is not None and dl is not None and not _close(fl, dl, LOSS_RTOL):
            cell += " !"
        elif r.get("last_loss") is not None and d.get("last_loss") is not None and \
                r.get("steps") == d.get("steps") and not _close(r["last_loss"], d["last_loss"],
                                                               LAST_LOSS_RTOL):
            cell += " ?"
        return cell

    def _line(self, model: str, threads: int) -> str:
        d = self._find(model, threads, "default")
        head = f"{d['step_ms']:.3f} ms" if d and d.get("status") == "ok" else "-"
        return f"{threads}t default {head}; " + ", ".join(
            f"{c} {self._cell(model, threads, c)}" for c in self.columns())

    def markdown(self) -> str:
        names = {"torch": "PyTorch eager", "torch-compile": "torch.compile", "jax": "JAX"}
        cols = self.columns()
        models = list(dict.fromkeys(r["model"] for r in self.records))
        out = ["| " + " | ".join(["model", "threads", "default (ms)",
                                 *(names.get(c, c) for c in cols)]) + " |",
               "|---|---|---|" + "---|" * len(cols)]
        for model in models:
            for t in self.threads:
                d = self._find(model, t, "default")
                ms = f"{d['step_ms']:.3f}" if d and d.get("status") == "ok" else \
                    (d or {}).get("status", "-")
                out.append("| " + " | ".join([model, str(t), str(ms), *(
                    self._cell(model, t, c) for c in cols)]) + " |")
        return "\n".join(out)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", help="benchmark names or .nf files (nfc bench's)")
    ap.add_argument("--all", action="store_true", help="every nfc bench model with a twin")
    ap.add_argument("--passes", default=DEFAULT_PASSES,
                    help=f"the passes to switch on, pipeline syntax (default {DEFAULT_PASSES})")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--frameworks", default="torch,torch-compile,jax",
                    help="baselines to run beside nfc (or none)")
    ap.add_argument("--baselines", metavar="BENCH.jsonl",
                    help="read the baselines' times from an `nfc bench --json` file")
    ap.add_argument("--rounds", type=int, default=15)
    ap.add_argument("--min-time", type=float, default=3.0,
                    help="seconds of timed steps per variant and thread count")
    ap.add_argument("--baseline-min-time", type=float, default=1.0,
                    help="--min-time of the baseline processes (nfc bench's)")
    ap.add_argument("--warmup", type=float, default=0.3)
    ap.add_argument("--quick", action="store_true", help="the models' smoke sizes")
    ap.add_argument("--set", action="append", metavar="K=V", help="a model param (repeatable)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--cold", action="store_true", help="no library or object cache")
    ap.add_argument("--timeout", type=float, default=1800.0)
    ap.add_argument("--json", metavar="OUT.jsonl", help="write one line per measurement")
    ap.add_argument("--work-dir", help="keep libraries and case files here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        try:
            rec = {"status": "ok", **time_variants(json.loads(args.worker))}
        except Exception as exc:  # noqa: BLE001 - reported in the line
            rec = {"status": "error", "error": f"{type(exc).__name__}: {exc}"[:400]}
        print(json.dumps(rec), flush=True)
        return 0

    from nfc.runtime.bench.driver import BASELINES
    from nfc.runtime.bench.models import MODELS, UnknownModel, resolve
    from nfc.runtime.build import pipeline_for

    def log(s: str) -> None:
        print(s, file=sys.stderr, flush=True)

    bad = [f for f in ((args.frameworks.split(",")) if args.frameworks != "none" else ())
           if f not in BASELINES]
    if bad:
        log(f"error: unknown framework {', '.join(bad)} (known: {', '.join(BASELINES)}, none)")
        return 1
    try:
        models = [m for m in MODELS if m.twin] if args.all else [resolve(s) for s in
                                                                   args.models]
    except UnknownModel as exc:
        log(f"error: {exc}")
        return 1
    if not models:
        log("error: name a model or give --all")
        return 1
    from nfc.diagnostics import CompileError

    try:
        vs = variants(args.passes, pipeline_for(models[0].file), log)
    except CompileError as err:
        log(f"error: --passes: {str(err).strip()}")
        return 1
    log("variants:\n" + "\n".join(f"  {v.name}: {v.pipeline}" for v in vs))
    log(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs at the start")
    try:
        table = PassTable(args, log)
    except (OSError, ValueError, KeyError) as exc:  # --baselines unreadable or not bench's
        log(f"error: --baselines {args.baselines}: {exc}")
        return 1
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="nfc-pass-table-"))
    t0 = time.monotonic()
    try:
        for m in models:
            table.run_model(m, vs, work)
    finally:
        if not args.work_dir:
            import shutil

            shutil.rmtree(work, ignore_errors=True)
    if args.json:
        from nfc.fsutil import atomic_write

        atomic_write(args.json, "".join(json.dumps(r) + "\n" for r in table.records)
                     .encode(), 0o644)
    loads = [r["loadavg"] for r in table.records if r.get("loadavg") is not None]
    print(table.markdown())
    print(f"\n{len(models)} model(s) in {time.monotonic() - t0:.0f} s; load average during "
          f"the timing {min(loads, default=0):.1f}-{max(loads, default=0):.1f} on "
          f"{os.cpu_count()} CPUs; ratios are step times / nfc's default build.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
