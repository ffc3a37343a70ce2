"""The nfc side of `nfc bench`, run in fresh processes like the baselines:

    python -m nfc.runtime.bench.worker compile SPEC_JSON   # build the library, write the case
    python -m nfc.runtime.bench.worker run SPEC_JSON       # time train_step; one JSON line

`compile` runs the front end and the build pipeline of `nfc compile` and `nfc train`
(nfc.runtime.build.pipeline_for: im2col, autodiff, the cleanup, the tuned schedules of the
tuning cache when it has some, fusion; the spec's `pipeline`, `im2col`, `tuned` and `fuse`
edit it as the command-line flags do; its `model` chooses the model of a file that defines
several), builds the library (cold unless the spec allows the library cache), initialises
the model with the seed and writes the case file every framework starts from: the persistent
tensors (`param:`, `state:`, `opt_state:` keys) and random inputs (`input:`; floats standard
normal, integers uniform below their bound). `run` loads the library in a process that never
compiled anything, so its peak RSS is the training step's own, and times the step as
nfc.runtime.bench.timing does for every framework.

Each action prints exactly one JSON line on stdout, errors included (`"status": "error"`).
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from nfc.runtime.bench.timing import current_rss_mb, measure, peak_rss_mb

ROLES = ("param", "state", "opt_state")


def _classes(meta: Mapping[str, Any]) -> int:
    """Classes of the model: the last axis of a `logits` or `lengths` result (else 10)."""
    for fm in meta["functions"].values():
        for r in fm["results"]:
            if r["name"] in ("logits", "lengths") and r["shape"]:
                return int(r["shape"][-1])
    return 10


def make_inputs(meta: Mapping[str, Any], int_bounds: Mapping[str, Any], seed: int
                ) -> dict[str, np.ndarray]:
    """Random inputs of `train_step`: floats standard normal, integers uniform in [0, bound)
    with the bound an axis of a named tensor (`int_bounds`) or the number of classes."""
    from nfc.runtime.loader import TensorSpec

    fm = meta["functions"]["train_step"]
    shapes = {t["name"]: t["shape"] for t in meta["tensors"]}
    for r in fm["results"]:
        shapes.setdefault(r["name"], r["shape"])
    rng = np.random.default_rng(seed)
    out = {}
    for a in fm["args"]:
        if a.get("role") != "input":
            continue
        spec = TensorSpec.of(a)
        if spec.dtype.kind in "iu":
            if spec.name in int_bounds:
                tensor, axis = int_bounds[spec.name]
                hi = int(shapes[tensor][axis])
            else:
                hi = _classes(meta)
            out[spec.name] = rng.integers(0, hi, size=spec.shape).astype(spec.dtype)
        elif spec.dtype.kind == "b":
            out[spec.name] = rng.integers(0, 2, size=spec.shape).astype(bool)
        else:
            out[spec.name] = rng.standard_normal(spec.shape).astype(spec.dtype)
    return out


def compile_case(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Build the library and write the case file (see the module doc)."""
    from nfc.runtime.build import build_library, build_module, parse_settings
    from nfc.runtime.loader import load

    rec: dict[str, Any] = {}
    out = Path(spec["out"])
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    params, opt = parse_settings(spec.get("settings", []))
    rec["pipeline"] = pipeline = case_pipeline(spec)
    module, ctx = build_module(spec["source"], params, opt, pipeline, model=spec.get("model"))
    if not module.has_func("train_step"):
        raise ValueError("the model has no train_step (it needs `minimize <loss> with ...`)")
    t_front = time.perf_counter() - t0
    rec["tuning"] = ctx.remarks.get("apply-tuning", "not used")
    rec["fuse"] = ctx.remarks.get("fuse", "not used")  # the reward's device parameters
    use_cache = bool(spec.get("use_cache"))
    # Only train_step is timed, so only it is built; but the library cache keys a module
    # without the function list, so a cached build must hold every function.
    built = build_library(module, str(out / "model.so"), use_cache=use_cache,
                          functions=None if use_cache else ["train_step"])
    rec["compile_s"] = time.perf_counter() - t0
    rec["frontend_s"] = t_front  # the frontend and the pass pipeline
    rec["compile_kind"] = "cached" if built.cached else "cold"
    plan = getattr(built.artifact, "plans", {}).get("train_step")
    if plan is not None:  # the static plan's peak (docs/memory.md); unknown for a cached build
        rec["planned_mb"] = plan.memory_report().total / 2**20
    if spec.get("profile"):
        # a second library with kernel timers (nfc compile --profile), for the kernel table
        prof = build_library(module, str(out / "model-profile.so"), profile=True,
                             use_cache=False, functions=["train_step"])
        rec["profile_so"] = prof.path
    model = load(built.path)
    model.init(int(spec.get("seed", 0)))
    fm = model.metadata["functions"]["train_step"]
    # the state by its logical names and shapes (`state_dict`: a tensor the build laid out,
    # concatenated or blocked, as the model file declares it), which the baselines load too
    named = model.named_specs()
    arrays = {f"{named[n].role}:{n}": a for n, a in model.state_dict().items()}
    inputs = make_inputs(model.metadata, spec.get("int_bounds", {}), int(spec.get("seed", 0)))
    arrays.update({f"input:{k}": v for k, v in inputs.items()})
    np.savez(out / "case.npz", **arrays)
    first = next(iter(inputs.values()), None)
    rec.update(so=built.path, case=str(out / "case.npz"),
               batch=int(first.shape[0]) if first is not None and first.ndim else None,
               gflop=sum(float(k.get("flops", 0)) for k in fm["kernels"]) / 1e9,
               kernels=len(fm["kernels"]), arena_mb=int(fm["arena_bytes"]) / 2**20,
               params_mb=sum(a.nbytes for n, a in model.tensors.items()
                             if model.specs[n].role == "param") / 2**20)
    return rec


def case_pipeline(spec: Mapping[str, Any]) -> str:
    """The pipeline a compile spec builds with: `nfc compile`'s for the model file, edited by
    the spec's `pipeline` (the whole of it, as `-p`), `im2col`, `tuned` and `fuse`."""
    from nfc.runtime.build import pipeline_for

    return pipeline_for(spec["source"], spec.get("pipeline"), im2col=spec.get("im2col", True),
                        tuning=spec.get("tuned", True), fuse=spec.get("fuse", True),
                        layout=spec.get("layout", True))


def run_case(spec: Mapping[str, Any]) -> dict[str, Any]:
    """Time the library's train_step (see the module doc)."""
    # the baseline as benchmarks/run_baseline.py takes it: the case read, the framework
    # imported, nothing built yet; `step_peak_mb` is the peak above it
    with np.load(spec["case"], allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    import nfc.codegen.artifact.initgen  # noqa: F401 - what `load` imports, like `import torch`
    from nfc.runtime.loader import host_cpu_features, load

    host_cpu_features()  # loads LLVM (llvmlite), as `load` does to check the CPU features
    rec: dict[str, Any] = {"rss_after_import_mb": current_rss_mb()}
    threads = int(spec.get("threads", 1))
    model = load(spec["so"])
    model.set_num_threads(threads)
    rec["threads_set"] = model.get_num_threads()
    model.load_state_dict({k.split(":", 1)[1]: v for k, v in arrays.items()
                           if k.split(":", 1)[0] in ROLES})
    inputs = {k.split(":", 1)[1]: v for k, v in arrays.items() if k.startswith("input:")}
    fn = model.functions["train_step"]
    bound = fn.bind({s.name: np.ascontiguousarray(inputs[s.name], dtype=s.dtype)
                     for s in fn.inputs})
    rec.update(measure(lambda: bound()["loss"], float(spec.get("min_time", 1.0)),
                       int(spec.get("min_steps", 5)), float(spec.get("warmup", 0.2))))
    if spec.get("profile_so"):
        # about --min-time of profiled steps, between 2 and 10 of them
        steps = max(2, min(10, int(float(spec.get("min_time", 1.0)) * 1e3 / rec["step_ms"])))
        rec["profile"] = profile_case(spec["profile_so"], arrays, threads, steps)
    return rec


def profile_case(so: str, arrays: Mapping[str, np.ndarray], threads: int, steps: int,
                 top: int = 8) -> dict[str, Any]:
    """Per-kernel times of a profiled build of the same step: the slowest kernels."""
    from nfc.runtime.loader import load
    from nfc.runtime.profile import Profiler

    model = load(so)
    model.set_num_threads(threads)
    model.load_state_dict({k.split(":", 1)[1]: v for k, v in arrays.items()
                           if k.split(":", 1)[0] in ROLES})
    fn = model.functions["train_step"]
    bound = fn.bind({s.name: np.ascontiguousarray(arrays[f"input:{s.name}"], dtype=s.dtype)
                     for s in fn.inputs})
    bound()  # warm-up
    prof = Profiler(fn.meta["kernels"])
    for i in range(steps):
        bound()
        prof.add(fn.profile_events(), i)
    rows = prof.rows()
    step_ms = prof.step_ns * 1e-6 / max(prof.calls, 1)
    groups = {}
    # contractions (matmuls, convolutions and their gradients) against everything else
    for name, pick in (("reductions", True), ("other", False)):
        sel = [r for r in rows if (" sum [" in r.label) == pick]
        ms = sum(r.total_ms for r in sel)
        gflop = sum(r.gflops * r.total_ms * 1e-3 for r in sel)
        groups[name] = {"kernels": len(sel), "percent": sum(r.percent for r in sel),
                        "gflops": gflop / (ms * 1e-3) if ms > 0 else 0.0}
    return {"steps": prof.calls, "kernel_ms": sum(r.total_ms for r in rows) / max(prof.calls, 1),
            "step_ms": step_ms, "kernels": len(rows), "groups": groups,
            "top": [{"label": r.label, "ms": r.total_ms / max(r.calls, 1),
                     "percent": r.percent, "gflops": r.gflops, "gbytes": r.gbytes}
                    for r in rows[:top]]}


def main(argv: list[str] | None = None) -> int:
    """`worker compile|run SPEC_JSON`: one JSON line on stdout."""
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2 or argv[0] not in ("compile", "run"):
        print("usage: python -m nfc.runtime.bench.worker compile|run SPEC_JSON", file=sys.stderr)
        return 2
    spec = json.loads(argv[1])
    rec: dict[str, Any] = {"framework": "nfc", "action": argv[0], "status": "ok",
                           "pid": os.getpid()}
    try:
        rec.update((compile_case if argv[0] == "compile" else run_case)(spec))
    except Exception as exc:  # noqa: BLE001 - a failing case is a result, not a crash
        from nfc.diagnostics import CompileError

        if isinstance(exc, CompileError):
            first = str(exc).strip().splitlines()
            msg = f"does not compile: {first[0] if first else exc}"
        else:
            lines = str(exc).strip().splitlines()
            msg = f"{type(exc).__name__}: {lines[0] if lines else ''}"
        rec.update(status="error", error=msg[:400], traceback=traceback.format_exc()[-2000:])
    rec["peak_rss_mb"] = peak_rss_mb()
    if argv[0] == "run" and rec.get("rss_after_import_mb") is not None:
        rec["step_peak_mb"] = rec["peak_rss_mb"] - rec["rss_after_import_mb"]
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
