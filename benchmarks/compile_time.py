"""Compile time of every example model (training step): where the seconds go.

    .venv/bin/python benchmarks/compile_time.py [models...] [--jobs N] [--json out.json]
        [--warm] [--no-fuse] [--profile model.nf] [--timeout 900]

Each model (default: examples/*.nf and examples/models/*.nf) is compiled like
`nfc compile --no-tuning` (frontend in training and evaluation modes, autodiff, the default
pipeline, the fuse pass when this nfc has one unless `--no-fuse`, the artifact with
`forward`, `eval`, `train_step` and `nfc_init`, linked with `cc`) in a fresh subprocess with an
empty cache directory (`NFC_CACHE_DIR`), so earlier models never help later ones. Reported per
model:

- `kernels`: kernel calls over all entry functions; `distinct`: kernels compiled into objects
  (after the builder's deduplication; fused groups are compiled stage by stage, so this counts
  their distinct stages);
- `ir_lines`: lines of LLVM IR handed to LLVM (unoptimised);
- CPU seconds of each phase, measured in the compiling process with `--jobs 1` (compile
  workers would hide LLVM time in other processes): `frontend`, `autodiff` (training and
  evaluation functions), `passes` (the pipeline), `lower` (schedules and loop IR), `emit`
  (LLVM IR construction and printing), `llvm_opt` (parsing and the optimisation pipeline),
  `codegen` (machine code), `link` (`cc -shared`), `other` (plans, entries, metadata);
- `wall`: wall-clock seconds of the whole compile with `--jobs` worker processes (default:
  the builder's default), and `cpu`: CPU seconds of that run including its children;
- with `--warm`, `warm_wall`: the same compile again with the cache directory the first one
  filled (an edit-compile loop, or another model sharing kernels).

The machine may be shared: CPU seconds are the stable measure, wall seconds the user's view.
`--profile model.nf` prints the top of a cProfile of one compile (Python time) instead.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("frontend", "autodiff", "passes", "lower", "emit", "llvm_opt", "codegen", "link",
          "other")


def default_models() -> list[Path]:
    """examples/*.nf and examples/models/*.nf that define a model (not shared layers)."""
    out = []
    for p in sorted((ROOT / "examples").glob("*.nf")) + sorted(
            (ROOT / "examples" / "models").glob("*.nf")):
        if re.search(r"^\s*model\s+\w+", p.read_text(encoding="utf-8"), re.M):
            out.append(p)
    return out


def _cpu() -> float:
    me = resource.getrusage(resource.RUSAGE_SELF)
    ch = resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + ch.ru_utime + ch.ru_stime


class _Timers:
    """CPU seconds per phase, by wrapping the functions of each phase (outermost wins)."""

    def __init__(self) -> None:
        self.t: dict[str, float] = {}
        self.active: str | None = None

    def wrap(self, owner: object, name: str, phase: str) -> None:
        fn = getattr(owner, name)

        def timed(*a, **k):  # noqa: ANN002, ANN003, ANN202 - transparent wrapper
            if self.active is not None:  # nested: counted by the outer phase
                return fn(*a, **k)
            self.active = phase
            t = _cpu()  # children too: `cc` links in a subprocess
            try:
                return fn(*a, **k)
            finally:
                self.t[phase] = self.t.get(phase, 0.0) + _cpu() - t
                self.active = None
        setattr(owner, name, timed)


def _module(rb, path: str):  # noqa: ANN001, ANN202 - nfc.runtime.build, a Module
    """The module `nfc compile --no-tuning` builds: front end, pipeline, and the fuse pass
    when this nfc has it (unless NFC_CT_NO_FUSE is set)."""
    if hasattr(rb, "pipeline_for"):  # one build pipeline, run by the pass manager
        fuse = not os.environ.get("NFC_CT_NO_FUSE")
        return rb.build_module(path, pipeline=rb.pipeline_for(path, tuning=False, fuse=fuse))[0]
    module = rb.model_module(path)
    rb.run_pipeline(module)
    fuse = getattr(rb, "FUSE_PIPELINE", None)
    if fuse and not os.environ.get("NFC_CT_NO_FUSE"):
        rb.run_pipeline(module, fuse)
    return module


def _child_phases(path: str, out: str) -> None:
    """In a subprocess: compile `path` once with phase timers (jobs 1), write JSON to `out`."""
    os.environ["NFC_COMPILE_JOBS"] = "1"
    import llvmlite.binding as llvm

    import nfc.codegen.jit as jit
    import nfc.codegen.llvm.emitter as emitter
    import nfc.codegen.native as native
    import nfc.frontend as frontend
    import nfc.passes.autodiff.train as train
    import nfc.runtime.build as rb

    T = _Timers()
    T.wrap(frontend, "compile_file", "frontend")
    T.wrap(train, "add_training_functions", "autodiff")
    T.wrap(train, "eval_from_forward", "autodiff")
    T.wrap(rb, "run_pipeline", "passes")
    if hasattr(rb, "pipeline_for"):  # the build pipeline: each pass, and the verifier after it
        import nfc.passmanager as pm

        for p in pm.build_pipeline(rb.pipeline_for(path, tuning=False)):
            T.wrap(type(p), "apply", "autodiff" if p.name == "training-functions" else "passes")
        T.wrap(pm, "verify_module", "passes")
    T.wrap(jit, "lower", "lower")
    T.wrap(emitter, "emit_function", "emit")
    T.wrap(llvm, "parse_assembly", "llvm_opt")
    T.wrap(llvm.ModulePassManager, "run", "llvm_opt")
    T.wrap(llvm.TargetMachine, "emit_object", "codegen")
    T.wrap(native, "link_bytes", "link")
    # printing the llvmlite module is part of building LLVM IR
    from llvmlite import ir
    T.wrap(ir.Module, "__repr__", "emit")
    ir.Module.__str__ = ir.Module.__repr__  # type: ignore[method-assign]
    lines = 0
    orig_parse = llvm.parse_assembly

    def counting_parse(text, *a, **k):  # noqa: ANN001, ANN002, ANN003, ANN202
        nonlocal lines
        lines += text.count("\n")
        return orig_parse(text, *a, **k)
    llvm.parse_assembly = counting_parse

    t0 = _cpu()
    module = _module(rb, path)
    with tempfile.TemporaryDirectory() as tmp:
        built = rb.build_library(module, os.path.join(tmp, "m.so"), use_cache=False)
    total = _cpu() - t0
    meta = built.artifact.metadata
    kernels = sum(len(f["kernels"]) for f in meta["functions"].values())
    stats = getattr(built.artifact, "stats", {}) or {}
    res = {p: T.t.get(p, 0.0) for p in PHASES[:-1]}
    res["other"] = max(0.0, total - sum(res.values()))
    res.update(total=total, kernels=kernels, ir_lines=lines,
               distinct=stats.get("distinct", len(built.artifact.kernels)),
               hits=stats.get("cache_hits", 0))
    Path(out).write_text(json.dumps(res))


def _child_wall(path: str, out: str) -> None:
    """In a subprocess: compile `path` with the default jobs; wall and CPU seconds."""
    import nfc.runtime.build as rb

    w, c = time.perf_counter(), _cpu()
    module = _module(rb, path)
    with tempfile.TemporaryDirectory() as tmp:
        built = rb.build_library(module, os.path.join(tmp, "m.so"), use_cache=False)
    stats = getattr(built.artifact, "stats", {}) or {}
    Path(out).write_text(json.dumps({"wall": time.perf_counter() - w, "cpu": _cpu() - c,
                                     "hits": stats.get("cache_hits", 0)}))


def _run_child(kind: str, path: Path, env: dict[str, str], timeout: float) -> dict:
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        out = f.name
    try:
        cmd = [sys.executable, __file__, f"--child-{kind}", str(path), out]
        res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                             cwd=ROOT)
        if res.returncode != 0:
            return {"error": res.stderr.strip().splitlines()[-1] if res.stderr.strip()
                    else f"exit {res.returncode}"}
        return json.loads(Path(out).read_text())
    except subprocess.TimeoutExpired:
        return {"error": f"timed out after {timeout:.0f} s"}
    finally:
        os.unlink(out)


def measure(path: Path, *, jobs: int | None, warm: bool, timeout: float) -> dict:
    """Phase split (cold cache, jobs 1), then wall time (cold cache, `jobs`), then warm."""
    row: dict = {"model": str(path.relative_to(ROOT))}
    with tempfile.TemporaryDirectory(prefix="nfc-ct-") as cache:
        env = dict(os.environ, NFC_CACHE_DIR=os.path.join(cache, "a"), PYTHONHASHSEED="0")
        row.update(_run_child("phases", path, env, timeout))
        if "error" in row:
            return row
        env["NFC_CACHE_DIR"] = os.path.join(cache, "b")
        if jobs is not None:
            env["NFC_COMPILE_JOBS"] = str(jobs)
        cold = _run_child("wall", path, env, timeout)
        row["wall"], row["cpu"] = cold.get("wall"), cold.get("cpu")
        if warm:
            again = _run_child("wall", path, env, timeout)
            row["warm_wall"], row["warm_hits"] = again.get("wall"), again.get("hits")
    return row


def _fmt(rows: list[dict], warm: bool) -> str:
    head = ["model", "kernels", "distinct", "ir_lines", *PHASES, "total", "wall", "cpu"]
    if warm:
        head += ["warm_wall"]
    lines = [" | ".join(head), " | ".join("---" for _ in head)]
    sums = dict.fromkeys(head[1:], 0.0)
    for r in rows:
        if "error" in r:
            lines.append(f"{r['model']} | error: {r['error']}")
            continue
        cells = [r["model"]]
        for h in head[1:]:
            v = r.get(h)
            if isinstance(v, float):
                cells.append(f"{v:.2f}")
                sums[h] += v
            elif isinstance(v, int):
                cells.append(f"{v:,}")
                sums[h] += v
            else:
                cells.append("-")
        lines.append(" | ".join(cells))
    lines.append(" | ".join(["**sum**"] + [
        f"{sums[h]:,.0f}" if h in ("kernels", "distinct", "ir_lines") else f"{sums[h]:.1f}"
        for h in head[1:]]))
    return "\n".join(lines)


def profile(path: Path, top: int) -> None:
    """cProfile of one compile (jobs 1, fresh cache), sorted by own and cumulative time."""
    import cProfile
    import pstats

    os.environ["NFC_COMPILE_JOBS"] = "1"
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["NFC_CACHE_DIR"] = tmp
        import nfc.runtime.build as rb

        pr = cProfile.Profile()
        pr.enable()
        module = _module(rb, str(path))
        rb.build_library(module, os.path.join(tmp, "m.so"), use_cache=False)
        pr.disable()
    st = pstats.Stats(pr)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)


def main(argv: list[str] | None = None) -> int:
    """Measure the models and print a Markdown table (and JSON with `--json`)."""
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] in ("--child-phases", "--child-wall"):
        sys.path.insert(0, str(ROOT))
        (_child_phases if argv[0] == "--child-phases" else _child_wall)(argv[1], argv[2])
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="*", type=Path)
    ap.add_argument("--jobs", type=int, default=None)
    ap.add_argument("--warm", action="store_true")
    ap.add_argument("--no-fuse", action="store_true", help="skip the fuse pass")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--timeout", type=float, default=900.0)
    ap.add_argument("--profile", type=Path, help="cProfile one model instead")
    ap.add_argument("--top", type=int, default=40)
    args = ap.parse_args(argv)
    if args.no_fuse:
        os.environ["NFC_CT_NO_FUSE"] = "1"
    if args.profile:
        profile(args.profile.resolve(), args.top)
        return 0
    models = [p.resolve() for p in args.models] or default_models()
    rows = []
    for p in models:
        t = time.perf_counter()
        row = measure(p, jobs=args.jobs, warm=args.warm, timeout=args.timeout)
        rows.append(row)
        print(f"{row['model']}: {time.perf_counter() - t:.1f} s", file=sys.stderr, flush=True)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=1))
    print(_fmt(rows, args.warm))
    return 0


if __name__ == "__main__":
    sys.exit(main())
