"""One baseline case of `nfc bench`: a model's training step in PyTorch eager, torch.compile or
jax.jit, timed in this (fresh) process; prints one JSON line.

    python benchmarks/run_baseline.py --framework torch --model mlp3 --threads 1
    python benchmarks/run_baseline.py --framework torch-compile --model lenet5 --threads 2 \\
        --batch 32 --min-time 1.0
    python benchmarks/run_baseline.py --framework jax --model bert --data case.npz

The models are the twins of nfc's example models in benchmarks/torch_models.py and
benchmarks/jax_models.py. One step is forward, loss, backward and the model's SGD update, on a
batch resident in memory:

- `torch`: eager; `opt.zero_grad(set_to_none=True); loss = model(**batch)["loss"];
  loss.backward(); opt.step()` (torch.optim.SGD, foreach).
- `torch-compile`: the same step with the model wrapped in `torch.compile` (inductor; forward
  and backward are compiled through AOTAutograd, the optimizer step stays eager). The inductor
  cache lives in a fresh directory, so the compile time is a cold one.
- `jax`: `jax_models.make_train_step`, jitted, with the parameters, state and momentum buffers
  donated (updated in place as nfc and PyTorch do).

`--data case.npz` supplies the initial parameters, state and inputs (keys `param:<name>`,
`state:<name>`, `input:<name>`; nfc bench writes it from nfc's own initialisation, so every
framework starts from the same numbers); without it the PyTorch twin's initializers and random
inputs are used (seed 0). Threads are set before the framework is imported: OMP_NUM_THREADS,
MKL_NUM_THREADS and torch.set_num_threads for PyTorch; for JAX, XLA's CPU client takes its
thread count from the CPUs the process may run on, so the process is restricted to `threads`
CPUs (sched_setaffinity).

Timing: the first step (compile included) is timed alone, then warm-up steps for --warmup
seconds, then single steps until --min-time seconds and at least --min-steps steps have been
timed; the median counts. The JSON line carries the times in ms, the first-step loss, the
compile time (first step minus a steady one; JAX: lower+compile), the process's peak RSS
(`resource.getrusage`) and its RSS after importing the framework. Errors are reported in the
line (`"status": "error"`), never as a traceback alone, and the exit code is 0 unless the
command line itself is wrong.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import statistics
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FRAMEWORKS = ("torch", "torch-compile", "jax")


def peak_rss_mb() -> float:
    """High-water mark of this process's resident set, in MB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def current_rss_mb() -> float:
    """Resident set size now, in MB (from /proc; the peak where that is unavailable)."""
    try:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError, IndexError):
        return peak_rss_mb()


def set_threads(framework: str, threads: int) -> None:
    """Limit the framework (not imported yet) to `threads` threads."""
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = str(threads)
    if framework == "jax":
        os.environ.setdefault("JAX_PLATFORMS", "cpu")
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_"
                                   f"eigen={'true' if threads > 1 else 'false'} "
                                   f"intra_op_parallelism_threads={threads}").strip()
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) > threads:
            os.sched_setaffinity(0, cpus[:threads])
    if framework == "torch-compile":
        # a private inductor cache: the compile time measured is a cold one
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="nfc-bench-inductor-")


def parse_sets(items: list[str]) -> dict[str, Any]:
    """`k=v` model params (ints, floats, bools)."""
    out: dict[str, Any] = {}
    for item in items:
        key, sep, val = item.partition("=")
        if not sep:
            raise SystemExit(f"run_baseline: --set expects key=value, got {item!r}")
        low = val.strip().lower()
        if low in ("true", "false"):
            out[key.strip()] = low == "true"
            continue
        try:
            out[key.strip()] = int(val)
        except ValueError:
            out[key.strip()] = float(val)
    return out


def load_module(name: str) -> Any:
    """benchmarks/<name>.py as a module (benchmarks/ is not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"_bench_{name}", HERE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def read_case(path: str | None) -> dict[str, dict[str, Any]] | None:
    """{"param": {...}, "state": {...}, "input": {...}} from a case .npz, or None."""
    if path is None:
        return None
    import numpy as np

    out: dict[str, dict[str, Any]] = {"param": {}, "state": {}, "input": {}}
    with np.load(path, allow_pickle=False) as z:
        for key in z.files:
            kind, _, name = key.partition(":")
            if kind in out:
                out[kind][name] = z[key]
    return out


def measure(step: Callable[[], Any], min_time: float, min_steps: int, warmup: float
            ) -> dict[str, Any]:
    """Time `step` (which must finish its work before returning): the first call alone, then
    warm-up, then single calls until `min_time` seconds and `min_steps` calls."""
    t0 = time.perf_counter()
    first_loss = float(step())
    first = time.perf_counter() - t0
    end = time.perf_counter() + warmup
    n_warm = 0
    while n_warm < 1 or time.perf_counter() < end:
        step()
        n_warm += 1
    times: list[float] = []
    cpu0 = time.process_time()
    wall0 = time.perf_counter()
    while len(times) < min_steps or sum(times) < min_time:
        t = time.perf_counter()
        step()
        times.append(time.perf_counter() - t)
    cpu = time.process_time() - cpu0
    wall = time.perf_counter() - wall0
    med = statistics.median(times)
    return {"step_ms": med * 1e3, "min_ms": min(times) * 1e3, "mean_ms": wall / len(times) * 1e3,
            "cpu_ms": cpu / len(times) * 1e3, "steps": len(times), "warmup_steps": n_warm,
            "first_step_s": first, "first_loss": first_loss,
            "compile_s": max(first - med, 0.0)}


def torch_case(args: argparse.Namespace, cfg: dict[str, Any], case: dict | None
               ) -> tuple[Callable[[], Any], dict[str, Any]]:
    """The PyTorch step (eager or compiled) and facts to report."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    info = {"version": torch.__version__, "rss_after_import_mb": current_rss_mb()}
    tm = load_module("torch_models")
    torch.manual_seed(args.seed)
    twin = tm.TWINS[args.model](**cfg)
    if case is not None:
        twin.load({**case["param"], **case["state"]})
        inputs = case["input"]
        missing = set(twin.input_specs()) - set(inputs)
        if missing:
            raise ValueError(f"case file lacks inputs {sorted(missing)}")
    else:
        inputs = twin.make_inputs(np.random.default_rng(args.seed))
    ins = twin.torch_inputs(inputs)
    twin.train()
    opt = twin.optimizer()
    fwd = torch.compile(twin) if args.framework == "torch-compile" else twin

    def step() -> Any:
        opt.zero_grad(set_to_none=True)
        loss = fwd(**ins)["loss"]
        loss.backward()
        opt.step()
        return loss.detach()

    return step, info


def jax_case(args: argparse.Namespace, cfg: dict[str, Any], case: dict | None
             ) -> tuple[Callable[[], Any], dict[str, Any]]:
    """The jitted JAX step and facts to report (compile time measured here, exactly)."""
    import jax
    import numpy as np

    info: dict[str, Any] = {"version": jax.__version__, "rss_after_import_mb": current_rss_mb()}
    jm = load_module("jax_models")
    if case is None:
        # the initial values come from the PyTorch twin's initializers
        import torch

        tm = load_module("torch_models")
        torch.manual_seed(args.seed)
        twin = tm.TWINS[args.model](**cfg)
        params = {n: p.detach().numpy() for n, p in twin.named_parameters()}
        state = {n: b.numpy() for n, b in twin.named_buffers()}
        inputs = twin.make_inputs(np.random.default_rng(args.seed))
    else:
        params, state, inputs = case["param"], case["state"], case["input"]
    jitted = jm.make_train_step(args.model, cfg)
    inner = getattr(jitted, "__wrapped__", None)
    if inner is not None:  # donate: parameters and buffers are updated in place
        jitted = jax.jit(inner, donate_argnums=(0, 1, 2))
    p = {k: jax.device_put(np.asarray(v)) for k, v in params.items()}
    s = {k: jax.device_put(np.asarray(v)) for k, v in state.items()}
    b = {k: jax.numpy.zeros_like(v) for k, v in p.items()}
    x = {k: jax.device_put(np.asarray(v)) for k, v in inputs.items()}
    t0 = time.perf_counter()
    compiled = jitted.lower(p, s, b, x).compile()
    info["compile_s"] = time.perf_counter() - t0
    box = [p, s, b]

    def step() -> Any:
        box[0], box[1], box[2], loss = compiled(box[0], box[1], box[2], x)
        return jax.block_until_ready(loss)

    return step, info


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The JSON record of one case (errors included as `status`/`error`)."""
    rec: dict[str, Any] = {"framework": args.framework, "model": args.model,
                           "threads": args.threads, "status": "ok", "pid": os.getpid(),
                           "python": platform.python_version()}
    try:
        cfg = parse_sets(args.set)
        if args.batch is not None:
            cfg["batch"] = args.batch
        rec["params"] = cfg
        case = read_case(args.data)
        if args.framework == "jax":
            step, info = jax_case(args, cfg, case)
        else:
            step, info = torch_case(args, cfg, case)
        compile_s = info.pop("compile_s", None)
        rec.update(info)
        rec.update(measure(step, args.min_time, args.min_steps, args.warmup))
        if compile_s is not None:
            rec["compile_s"] = compile_s
        if args.framework == "torch":
            rec["compile_s"] = None  # nothing is compiled in eager mode
    except ImportError as exc:
        rec.update(status="missing", error=f"{args.framework} is not installed ({exc})")
    except Exception as exc:  # noqa: BLE001 - a failing case is a result, not a crash
        tb = traceback.format_exc(limit=-3)
        msg = str(exc).strip().splitlines()
        rec.update(status="error", error=f"{type(exc).__name__}: {msg[0] if msg else ''}"[:400],
                   traceback=tb[-2000:])
    rec["peak_rss_mb"] = peak_rss_mb()
    if rec.get("rss_after_import_mb") is not None:
        # the step's own memory: the peak above the process after the imports (the case
        # read, the framework imported, nothing built), as nfc's worker measures it
        rec["step_peak_mb"] = rec["peak_rss_mb"] - rec["rss_after_import_mb"]
    return rec


def main(argv: list[str] | None = None) -> int:
    """Parse the command line, run the case, print its JSON line."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--framework", required=True, choices=FRAMEWORKS)
    ap.add_argument("--model", required=True, help="a key of torch_models.TWINS (mlp3, ...)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--batch", type=int, default=None)
    ap.add_argument("--set", action="append", default=[], metavar="K=V",
                    help="another model param (repeatable)")
    ap.add_argument("--data", default=None, metavar="CASE.npz",
                    help="initial parameters, state and inputs (see above)")
    ap.add_argument("--min-time", type=float, default=1.0)
    ap.add_argument("--min-steps", type=int, default=3)
    ap.add_argument("--warmup", type=float, default=0.2, metavar="SEC")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.threads < 1:
        ap.error("--threads must be at least 1")
    set_threads(args.framework, args.threads)
    rec = run(args)
    sys.stdout.write(json.dumps(rec) + "\n")
    sys.stdout.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
