"""The background process of dynamic mode: `python -m nfc.runtime.dynamic.explorer JOB.json`.

It takes candidates from a *candidate source* (by default `tuned_candidates`: rank the
kernels of the training step by their measured share of a profiled step, search the schedule
space of the most expensive ones with the tuner's genetic search, measuring every candidate
in the tuner's isolated worker process and committing every result to the persistent tuning
cache at once, and build a complete library with the cache's best schedules whenever they
changed), then for every candidate library:

1. checks that it can replace the running one (compat.incompatibility: same tensors,
   arguments, results, ABI);
2. verifies it in a child process: one step of it and of the running library on copies of
   a snapshot of the live state and batch, compared within the rounding a change of
   summation order explains (verify.py);
3. offers it: `offer-<n>.json` in the job's directory (written atomically), which the
   training loop picks up at a step boundary.

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


def build_candidate(job: Mapping[str, Any], output: str) -> str:
    """A complete library of the job's model with the tuning cache's current best schedules."""
    from nfc.runtime.build import build_library, build_module, parse_settings

    params, opt = parse_settings(job.get("settings", []))
    text = candidate_pipeline(job["source"], job.get("pipeline"), im2col=job.get("im2col", True),
                              fuse=job.get("fuse", True),
                              reproducible=job.get("reproducible", False), db=job.get("db", ""))
    module, _ = build_module(job["source"], params, opt, text, **_which(job))
    return build_library(module, output, profile=job.get("profile", False),
                         use_cache=True).path


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


def tuned_candidates(job: Mapping[str, Any], log: Log) -> Iterator[Candidate]:
    """Search the most expensive kernels one after another (`rounds` passes, each doubling
    the trials); after each, a library with the cache's best schedules when they changed."""
    from nfc.runtime.dynamic.verify import tolerance
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.category import default_category
    from nfc.runtime.tuning.driver import TuneOptions, build_model, tune_kernel
    from nfc.runtime.tuning.kernels import schedules_from_cache
    from nfc.runtime.tuning.measure import MeasureSetupError

    module = build_model(job["source"], job.get("settings", []), job.get("pipeline"),
                         im2col=job.get("im2col", True), **_which(job))
    kernels, times, how = rank_kernels(module, job.get("order", "auto"))
    total = sum(times.values()) or 1.0
    chosen = [k for k in kernels if k.tunable][: int(job.get("top", 4))]
    by_key = {k.key: k for k in kernels}
    log({"event": "ranked", "by": how, "kernels": [
        {"key": k.key, "desc": k.desc[:80], "share": times[k.key] / total} for k in chosen]})
    rtol = tolerance(max_reduction_terms(module))
    reproducible = bool(job.get("reproducible", False))
    options = TuneOptions(trials=int(job.get("trials", 24)), seed=int(job.get("seed", 0)),
                          reproducible=reproducible, confirm=int(job.get("confirm", 1)),
                          population=int(job.get("population", 8)), patience=3)
    category = default_category()
    with TuningCache(job.get("db") or None) as cache:
        # what the running library has: the cache's best, else the default schedule (a
        # search that finds the default best changes nothing)
        offered = {**_defaults(chosen),
                   **schedules_from_cache(kernels, cache, category, reproducible=reproducible)}
        rounds = max(1, int(job.get("rounds", 2)))
        work = [(r, k) for r in range(rounds) for k in chosen]
        for n, (r, k) in enumerate(work):
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
            yield {"path": out, "kernels": len(changed), "rtol": rtol,
                   "note": f"after searching {k.desc[:60]}", "category": category,
                   "schedules": {key: table[key] for key in changed}, "changes": details}


def given_libraries(job: Mapping[str, Any], log: Log) -> Iterator[Candidate]:
    """Offer the prebuilt libraries the job lists (`libraries`: [{"path", "kernels"}...]);
    for tests and demos of the swap machinery."""
    for item in job.get("libraries", []):
        if item.get("delay"):
            time.sleep(float(item["delay"]))
        yield {"path": item["path"], "kernels": int(item.get("kernels", 1)),
               "rtol": float(item.get("rtol", job.get("rtol", 1e-5))),
               "note": item.get("note", "given"), "category": item.get("category"),
               "schedules": item.get("schedules"), "changes": item.get("changes")}


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
    log({"event": "done", "cpu_s": sum(os.times()[:4])})
    events.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    job = json.loads(Path(args[0]).read_text())
    run(job)
    return 0


if __name__ == "__main__":
    sys.exit(main())
