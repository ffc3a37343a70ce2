"""The background process of dynamic mode: `python -m nfc.runtime.dynamic.explorer JOB.json`.

It takes candidates from a *candidate source* (by default `tuned_candidates`: rank the
kernels of the training step by their share of the step as the training loop reports it,
search the schedule space of the most expensive ones with the tuner's genetic search,
re-ranking before each kernel by the latest report, measuring every candidate
in the tuner's isolated worker process and committing every result to the persistent tuning
cache at once, and build a complete library with the cache's best schedules whenever they
changed), then for every candidate library:

1. checks that it can replace the running one (compat.incompatibility: same tensors,
   arguments, results, ABI);
2. verifies it in a child process: one step of it and of the running library on copies of
   a snapshot of the live state and batch, compared within the rounding a change of
   summation order explains (verify.py);
3. offers it: `offer-<n>.json` in the job's directory (written atomically), which the
   training loop picks up at a step boundary;
4. (when the job asks for kernel reports) builds its *profiled twin* (the same schedules
   with per-kernel clock stamps) and names it in `twin-<n>.json`; the first twin, of the
   running library, is built before the first candidate.

The training loop samples steps on the twins and writes `report-<n>.json` (per kernel of
the step: time per call, calls per step, share; session.kernel_report). `tuned_candidates`
waits up to `report_wait` seconds for the first report (falling back to its own ranking,
`order`: a profiled step of default schedules, or the cost estimate) and re-ranks by the
latest report before each kernel's search, so that a kernel whose swap made it fast loses
its place (`next_kernel`). `order = cost` ignores the reports (a deterministic order).

Every outcome is a line of `events.jsonl` in the job's directory. A candidate that crashes,
hangs or computes something else is recorded (`rejected`) and never offered. Test and demo
sources: `given_libraries` offers prebuilt libraries listed in the job.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

Candidate = dict[str, Any]
"""{"path": library, "kernels": how many kernels changed, "note": str, "rtol": float?}"""
Log = Callable[[dict[str, Any]], None]


def candidate_pipeline(source: str, pipeline: str | None, *, im2col: bool, fuse: bool,
                       reproducible: bool, db: str = "") -> str:
    """The build pipeline of a model file with `apply-tuning` told to use only reproducible
    schedules when `reproducible` (and the cache file `db`)."""
    from nfc.passmanager import build_pipeline, format_pipeline
    from nfc.runtime.build import pipeline_for

    passes = build_pipeline(pipeline_for(source, pipeline, im2col=im2col, tuning=True,
                                         fuse=fuse))
    out = []
    for p in passes:
        if p.name == "apply-tuning":
            p = dataclasses.replace(p, reproducible=reproducible or p.reproducible,
                                    db=db or p.db)
        out.append(p)
    return format_pipeline(out)


def _which(job: Mapping[str, Any]) -> dict[str, Any]:
    """The build's `model=` (the model of a file defining several), when one was named."""
    return {"model": job["model"]} if job.get("model") else {}


def build_candidate(job: Mapping[str, Any], output: str, profile: bool | None = None) -> str:
    """A complete library of the job's model with the tuning cache's current best schedules
    (`profile`: with per-kernel clock stamps; default: the job's `profile`)."""
    from nfc.runtime.build import build_library, build_module, parse_settings

    params, opt = parse_settings(job.get("settings", []))
    text = candidate_pipeline(job["source"], job.get("pipeline"), im2col=job.get("im2col", True),
                              fuse=job.get("fuse", True),
                              reproducible=job.get("reproducible", False), db=job.get("db", ""))
    module, _ = build_module(job["source"], params, opt, text, **_which(job))
    if profile is None:
        profile = bool(job.get("profile", False))
    return build_library(module, output, profile=profile, use_cache=True).path


def max_reduction_terms(module: Any) -> int:
    """The longest sum of any kernel of the module (terms), for the verification tolerance."""
    from nfc.ir import ComputeOp

    best = 1
    for f in module.funcs:
        for op in f.body.walk() if hasattr(f.body, "walk") else f.body.ops:
            if isinstance(op, ComputeOp) and op.reduce is not None:
                best = max(best, math.prod(a.extent for a in op.raxes))
    return best


def _defaults(kernels: Any) -> dict[str, dict[str, Any]]:
    """key -> the default schedule (canonical axis names) of each kernel that has a space."""
    from nfc.codegen.kernel_spec import space as space_of
    from nfc.runtime.tuning.kernels import kernel_spec

    out = {}
    for k in kernels:
        with contextlib.suppress(KeyError, TypeError, ValueError):
            out[k.key] = dict(space_of(kernel_spec(k)).default())
    return out


def kernel_name(k: Any) -> str:
    """A short name of a kernel for the swap lines: kind, sizes and where the model makes it
    (`gemm 16x24/32 at mlp.nf:12:8`)."""
    where = f" at {os.path.basename(k.locs[0])}" if getattr(k, "locs", None) else ""
    return k.desc.split(" (")[0].removesuffix(" f32").removesuffix(" f64") + where


def kernel_change(k: Any, cache: Any, category: Any, old: Mapping[str, Any] | None,
                  new: Mapping[str, Any], default_s: float | None) -> dict[str, Any]:
    """One kernel of a candidate: its name and the measured time of one call with the
    running library's schedule (`before_ms`; the default's when it had none) and with the
    candidate's (`after_ms`), both as the tuning cache recorded them (None when unknown)."""
    def ms(schedule: Mapping[str, Any] | None) -> float | None:
        entry = cache.lookup(category, k.key, schedule) if schedule is not None else None
        t = entry.time if entry is not None else None
        return None if t is None else t * 1e3

    before = ms(old)
    if before is None and default_s is not None:
        before = default_s * 1e3
    return {"key": k.key, "name": kernel_name(k), "before_ms": before, "after_ms": ms(new)}


def rank_kernels(module: Any, order: str = "auto") -> tuple[list[Any], dict[str, float], str]:
    """The kernels of the module's training step, largest share of the step first, their
    times per step (seconds by key) and how they were estimated (nfc tune's `--order`)."""
    from nfc.runtime.tuning.driver import estimate_kernel_times, training_functions
    from nfc.runtime.tuning.kernels import collect_kernels

    functions = training_functions(module)
    kernels = collect_kernels(module, functions)
    times, how = estimate_kernel_times(module, functions, kernels, order)
    kernels.sort(key=lambda k: -times[k.key])
    return kernels, times, how


def latest_report(workdir: str | os.PathLike[str]) -> dict[str, Any] | None:
    """The training loop's newest kernel report in `workdir` (None: none yet)."""
    files = sorted(Path(workdir).glob("report-*.json"))
    for f in reversed(files):
        with contextlib.suppress(OSError, ValueError):
            return json.loads(f.read_text())
    return None


def wait_report(workdir: str | os.PathLike[str], timeout: float) -> dict[str, Any] | None:
    """The first report, waited for up to `timeout` seconds (None: none came)."""
    end = time.monotonic() + timeout
    while True:
        rep = latest_report(workdir)
        if rep is not None or time.monotonic() >= end:
            return rep
        time.sleep(0.1)


Sites = dict[int, list[tuple[str, float]]]
"""IR op position in the built library's function -> (kernel key, fraction of its time)."""


def plan_sites(job: Mapping[str, Any], kernels: Any, function: str = "train_step") -> Sites:
    """Which of `kernels` (keys of the module up to `apply-tuning`, the tuner's) run at each
    op of the built library's `function` (the job's whole build pipeline, `fuse` included):
    a compute op is its own key; a fused kernel (`nf.kernel`) holds stages, each with the key
    it had before fusion, its fraction of the kernel's time estimated by the FLOP/byte model
    (the report measures the fused kernel as a whole)."""
    from nfc.ir import ComputeOp, KernelOp
    from nfc.runtime.build import build_module, parse_settings
    from nfc.runtime.tuning.kernels import kernel_key, roofline_seconds

    params, opt = parse_settings(job.get("settings", []))
    text = candidate_pipeline(job["source"], job.get("pipeline"), im2col=job.get("im2col", True),
                              fuse=job.get("fuse", True),
                              reproducible=job.get("reproducible", False), db=job.get("db", ""))
    module, _ = build_module(job["source"], params, opt, text, **_which(job))
    known = {k.key for k in kernels}
    out: Sites = {}
    for n, op in enumerate(module.func(function).body.ops):
        if isinstance(op, ComputeOp):
            stages = [op]
        elif isinstance(op, KernelOp):
            body = op.body.walk() if hasattr(op.body, "walk") else op.body.ops
            stages = [s for s in body if isinstance(s, ComputeOp)]
        else:
            continue
        keyed = [(kernel_key(s), max(roofline_seconds(s), 1e-12)) for s in stages]
        keyed = [(key, t) for key, t in keyed if key in known]
        total = sum(t for _, t in keyed)
        if total > 0:
            out[n] = [(key, t / total) for key, t in keyed]
    return out


def reported_times(report: Mapping[str, Any], kernels: Any, sites: Sites) -> dict[str, float]:
    """Seconds per step of each kernel (by key) in `report`: each reported kernel's time per
    call, for every call (plan position = IR op, `sites`) split among the keys that run in
    it; kernels the report does not show get 0."""
    out = {k.key: 0.0 for k in kernels}
    for g in report.get("kernels", []):
        per_call = float(g.get("per_call_ms", 0.0)) * 1e-3
        for op in g.get("ops", []):
            for key, part in sites.get(op, []) if op is not None else []:
                if key in out:
                    out[key] += per_call * part
    return out


def next_kernel(kernels: Any, times: Mapping[str, float], searched: Mapping[str, int],
                top: int, rounds: int) -> Any:
    """The kernel to search next: among the `top` tunable kernels of the largest time per
    step in `times`, one searched the fewest times (fewer than `rounds`), the largest first;
    None when every one of them had its rounds."""
    ranked = sorted((k for k in kernels if k.tunable), key=lambda k: -times.get(k.key, 0.0))
    open_ = [k for k in ranked[:top] if searched.get(k.key, 0) < rounds]
    if not open_:
        return None
    fewest = min(searched.get(k.key, 0) for k in open_)
    return next(k for k in open_ if searched.get(k.key, 0) == fewest)


def tuned_candidates(job: Mapping[str, Any], log: Log) -> Iterator[Candidate]:
    """Search the most expensive kernels one after another (`rounds` searches each, each
    doubling the trials; the order follows the training loop's latest kernel report, see the
    module doc); after each, a library with the cache's best schedules when they changed."""
    from nfc.runtime.dynamic.verify import tolerance
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.category import default_category
    from nfc.runtime.tuning.driver import (
        TuneOptions,
        build_model,
        estimate_kernel_times,
        training_functions,
        tune_kernel,
    )
    from nfc.runtime.tuning.kernels import collect_kernels, schedules_from_cache
    from nfc.runtime.tuning.measure import MeasureSetupError

    module = build_model(job["source"], job.get("settings", []), job.get("pipeline"),
                         im2col=job.get("im2col", True), **_which(job))
    functions = training_functions(module)
    kernels = collect_kernels(module, functions)
    order = job.get("order", "auto")
    reports = bool(job.get("report")) and order != "cost" and "train_step" in functions
    sites = plan_sites(job, kernels) if reports else {}
    report = wait_report(job["workdir"], float(job.get("report_wait", 30.0))) \
        if reports else None
    if report is None:  # no report (yet): the explorer's own estimate
        own, own_how = estimate_kernel_times(module, functions, kernels, order)
    top = int(job.get("top", 4))
    by_key = {k.key: k for k in kernels}
    seen_seq: Any = ()

    def ranking() -> tuple[dict[str, float], str]:
        """The times per step to rank by: the latest report's, else the own estimate."""
        nonlocal report, seen_seq
        if reports:
            report = latest_report(job["workdir"]) or report
        times, how = (reported_times(report, kernels, sites), "report") if report is not None \
            else (own, own_how)
        seq = report.get("seq") if report is not None else None
        if seq != seen_seq:
            seen_seq = seq
            total = sum(times.values()) or 1.0
            ranked = sorted((k for k in kernels if k.tunable), key=lambda k: -times[k.key])
            log({"event": "ranked", "by": how, "seq": seq,
                 "step": report.get("step") if report is not None else None,
                 "kernels": [{"key": k.key, "desc": k.desc[:80],
                              "share": times[k.key] / total} for k in ranked[:top]]})
        return times, how
    rtol = tolerance(max_reduction_terms(module))
    reproducible = bool(job.get("reproducible", False))
    options = TuneOptions(trials=int(job.get("trials", 24)), seed=int(job.get("seed", 0)),
                          reproducible=reproducible, confirm=int(job.get("confirm", 1)),
                          population=int(job.get("population", 8)), patience=3)
    category = default_category()
    with TuningCache(job.get("db") or None) as cache:
        # what the running library has: the cache's best, else the default schedule (a
        # search that finds the default best changes nothing)
        offered = {**_defaults([k for k in kernels if k.tunable]),
                   **schedules_from_cache(kernels, cache, category, reproducible=reproducible)}
        rounds = max(1, int(job.get("rounds", 2)))
        searched: dict[str, int] = {}
        for n in range(top * rounds):
            times, _ = ranking()
            k = next_kernel(kernels, times, searched, top, rounds)
            if k is None:
                break
            r = searched.get(k.key, 0)
            searched[k.key] = r + 1
            t0 = time.monotonic()
            try:
                # a later round extends each search (the recorded candidates replay from the
                # cache for free, the search goes on from there)
                res, _ = tune_kernel(k, cache, category, dataclasses.replace(
                    options, trials=options.trials * 2 ** r))
            except (MeasureSetupError, ValueError) as exc:
                log({"event": "kernel", "key": k.key, "status": "error",
                     "reason": str(exc).splitlines()[0][:200]})
                continue
            log({"event": "kernel", "key": k.key, "desc": k.desc[:80], "status": "searched",
                 "round": r,
                 "evaluated": res.evaluated, "measured": res.measured, "best_s": res.time,
                 "default_s": res.default_time, "speedup": res.speedup,
                 "seconds": time.monotonic() - t0})
            table = schedules_from_cache(kernels, cache, category, reproducible=reproducible)
            changed = [key for key in table if table[key] != offered.get(key)]
            if not changed:
                continue
            details = [kernel_change(by_key[key], cache, category, offered.get(key),
                                     table[key], res.default_time if key == k.key else None)
                       for key in changed if key in by_key]
            out = str(Path(job["workdir"]) / f"candidate-{n}.so")
            try:
                build_candidate(job, out)
            except Exception as exc:  # noqa: BLE001 - a failed build is recorded, not fatal
                log({"event": "build", "status": "failed",
                     "reason": f"{type(exc).__name__}: {exc}"[:300]})
                continue
            offered = table

            def twin(out: str = out) -> str:
                return build_candidate(job, out.removesuffix(".so") + "-profiled.so", True)

            yield {"path": out, "kernels": len(changed), "rtol": rtol,
                   "note": f"after searching {k.desc[:60]}", "category": category,
                   "schedules": {key: table[key] for key in changed}, "changes": details,
                   "twin": twin}


def given_libraries(job: Mapping[str, Any], log: Log) -> Iterator[Candidate]:
    """Offer the prebuilt libraries the job lists (`libraries`: [{"path", "kernels"}...]);
    for tests and demos of the swap machinery."""
    for item in job.get("libraries", []):
        if item.get("delay"):
            time.sleep(float(item["delay"]))
        yield {"path": item["path"], "kernels": int(item.get("kernels", 1)),
               "rtol": float(item.get("rtol", job.get("rtol", 1e-5))),
               "note": item.get("note", "given"), "category": item.get("category"),
               "schedules": item.get("schedules"), "changes": item.get("changes"),
               "profiled": item.get("profiled")}


def _resolve(path: str) -> Callable[..., Iterator[Candidate]]:
    from nfc.runtime.tuning.worker import resolve

    return resolve(path)


def _record_rejection(job: Mapping[str, Any], cand: Candidate, verdict: Any) -> None:
    """A library that failed verification: its new schedules are recorded in the tuning cache
    with the verdict's status (wrong, failed, timeout), so that no build picks them again.
    Which of them is at fault is unknown, so all of them are (each passed the tuner's own
    check of its kernel alone)."""
    if not cand.get("schedules") or not cand.get("category"):
        return
    from nfc.runtime.tuning.cache import TuningCache

    with TuningCache(job.get("db") or None) as cache:
        for key, schedule in cand["schedules"].items():
            cache.put(cand["category"], key, schedule, status=verdict.status,
                      error=f"dynamic mode: the step built with it failed verification: "
                            f"{verdict.reason}"[:500])


def _watch_parent(workdir: str) -> None:
    """Exit when the training process is gone (even SIGKILLed): it would never take an
    offer, and its pinned core is free again; remove the work directory it cannot remove
    (unless NFC_DYNAMIC_KEEP). The measuring workers watch this process."""
    import shutil
    import threading

    parent = os.getppid()

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent:
                if not os.environ.get("NFC_DYNAMIC_KEEP"):
                    shutil.rmtree(workdir, ignore_errors=True)
                os._exit(3)

    threading.Thread(target=watch, daemon=True).start()


def run(job: Mapping[str, Any]) -> None:
    """Take candidates from the job's source, check, verify and offer them (module doc)."""
    from nfc.runtime.dynamic.compat import incompatibility
    from nfc.runtime.dynamic.verify import verify_candidate
    from nfc.runtime.loader import ArtifactError, read_metadata

    work = Path(job["workdir"])
    events = open(work / "events.jsonl", "a", encoding="utf-8")  # noqa: SIM115

    def log(rec: dict[str, Any]) -> None:
        rec = {"t": time.time(), **rec}
        events.write(json.dumps(rec) + "\n")
        events.flush()

    _watch_parent(job["workdir"])
    cpus = job.get("cpus")
    if cpus:
        with contextlib.suppress(AttributeError, OSError):
            os.sched_setaffinity(0, set(cpus))
    if job.get("nice"):
        with contextlib.suppress(OSError):
            os.nice(int(job["nice"]))
    current = job["current"]
    current_meta = read_metadata(current)
    snapshot = work / "snapshot.npz"
    offers = 0
    source = _resolve(job.get("candidates", "nfc.runtime.dynamic.explorer:tuned_candidates"))
    log({"event": "start", "pid": os.getpid(), "cpus": cpus})
    twins = 0

    def publish_twin(library: str, make: Callable[[], str]) -> None:
        """Build the profiled twin of `library` and name it for the training loop."""
        nonlocal twins
        t0 = time.monotonic()
        try:
            path = make()
        except Exception as exc:  # noqa: BLE001 - no twin: no reports of that library
            log({"event": "twin", "library": library, "status": "failed",
                 "reason": f"{type(exc).__name__}: {exc}"[:300]})
            return
        twins += 1
        rec = {"library": library, "profiled": path}
        tmp = work / f".twin-{twins:04d}.tmp"
        tmp.write_text(json.dumps(rec))
        os.replace(tmp, work / f"twin-{twins:04d}.json")
        log({"event": "twin", **rec, "seconds": time.monotonic() - t0})

    if job.get("report"):
        publish_twin(current, lambda: build_candidate(job, str(work / "current-profiled.so"),
                                                      True))
    for cand in source(job, log):
        path = cand["path"]
        try:
            why = incompatibility(current_meta, read_metadata(path))
        except ArtifactError as exc:
            why = str(exc)
        if why is not None:
            log({"event": "rejected", "path": path, "status": "incompatible", "reason": why})
            continue
        while not snapshot.exists():  # written by the trainer after its first step
            time.sleep(0.05)
        verdict = verify_candidate(current, path, str(snapshot), rtol=float(cand.get("rtol",
                                   1e-5)), timeout=float(job.get("verify_timeout", 120)))
        if not verdict.ok:
            log({"event": "rejected", "path": path, "status": verdict.status,
                 "reason": verdict.reason})
            _record_rejection(job, cand, verdict)
            continue
        offers += 1
        offer = {"path": path, "kernels": cand.get("kernels", 0), "note": cand.get("note", ""),
                 "changes": cand.get("changes") or []}
        tmp = work / f".offer-{offers:04d}.tmp"
        tmp.write_text(json.dumps(offer))
        os.replace(tmp, work / f"offer-{offers:04d}.json")
        log({"event": "offered", **offer})
        if job.get("report"):
            if cand.get("profiled"):
                given = str(cand["profiled"])
                publish_twin(path, lambda given=given: given)
            elif callable(cand.get("twin")):
                publish_twin(path, cand["twin"])
    log({"event": "done", "cpu_s": sum(os.times()[:4])})
    events.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(args[0]).read_text())
    run(job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
