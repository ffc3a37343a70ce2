"""Differential fuzzing of the CPU backend (imported as `backend_fuzz` by the test and by
scripts/fuzz_backend.py).

Each case is a `.nf` model from fuzz_programs.py, either generated (random elementwise
expressions over the intrinsics, sum/max/min/prod reductions, broadcasting, `//` and `%`
index arithmetic, padded (guarded) and strided window accesses, contractions, reshapes,
transposes, gathers through an integer input, standard-library ops) or a token mutant of a
generated program or of the frontend fuzzer's snippets (tests/frontend). A case the
frontend rejects counts as rejected. Otherwise:

1. end to end: the model is built like `nfc compile` (frontend, im2col, autodiff, pipeline,
   fusion, artifact, `cc`), loaded, and its `forward` and one `train_step` run on random
   inputs and parameters; every result (loss, outputs, new parameters, optimizer state) must
   lie within the float32 error bound of the oracle (`nfc.testing.run_bounded`: the numpy
   interpreter in float64 with a running error analysis of the unoptimised IR);
2. schedules: a few computes of the training step are JIT-compiled alone with a random
   valid schedule of their schedule space and checked the same way on the interpreter's
   values of their operands.

Any exception in the compiler is a crash, any result outside its bound is wrong. Cases run
in worker processes (`Campaign`), so a segfault is a crash and a stuck case a hang, and the
campaign goes on with a fresh worker.
"""

from __future__ import annotations

import json
import os
import random
import selectors
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from fuzz_programs import make_program

# ---------------------------------------------------------------------------------------------
# checking one case


@dataclass
class Outcome:
    """What one case did: `status` is ok, rejected (the frontend refused it or its inputs
    are invalid), crash, wrong, hang or harness (the error-bound oracle failed: a bug of the
    fuzzer); `detail` says what failed."""

    status: str
    detail: str = ""
    checked: int = 0
    unchecked: int = 0

    def to_json(self) -> str:
        return json.dumps(self.__dict__)


class Mismatch(Exception):
    """A result outside its error bound."""


def _args(func: Any, rng: np.random.Generator, known: dict[str, np.ndarray]
          ) -> dict[str, np.ndarray]:
    """Arguments of `func` by name: `known` ones, else random inputs and parameters, zero
    optimizer state and (seed 0, step 0) for the generator."""
    out: dict[str, np.ndarray] = {}
    for a, attrs in zip(func.args, func.arg_attrs, strict=True):
        role = attrs.get("nf.role", "input")
        dt = a.dtype.numpy
        if a.name in known:
            out[a.name] = known[a.name]
        elif role == "rng":
            out[a.name] = np.zeros(a.shape, np.int64)
        elif role == "opt_state":
            out[a.name] = np.zeros(a.shape, dt)
        elif a.dtype.is_int:  # labels and token ids: {0, 1} is valid for every size >= 2
            out[a.name] = rng.integers(0, 2, size=a.shape).astype(dt)
        elif a.dtype.value == "i1":
            out[a.name] = rng.random(a.shape) < 0.5
        else:
            out[a.name] = rng.standard_normal(a.shape).astype(dt)
    return out


def _compare(what: str, got: np.ndarray, value: np.ndarray, error: np.ndarray,
             outcome: Outcome) -> None:
    from nfc.testing import SLACK, bound_violations

    got = np.asarray(got)
    if got.shape != value.shape:
        raise Mismatch(f"{what}: shape {got.shape}, expected {value.shape}")
    bad, unchecked = bound_violations(got, value, error)
    outcome.checked += got.size - unchecked
    outcome.unchecked += unchecked
    if bad.any():
        i = tuple(int(j) for j in np.argwhere(bad)[0])
        e = np.broadcast_to(error, bad.shape)[i]
        raise Mismatch(f"{what}: {int(bad.sum())} of {bad.size} elements outside the bound; "
                       f"at {i}: got {got[i]!r}, reference {value[i]!r}, error bound "
                       f"{SLACK} x {e:.3g}")


def check_end_to_end(path: Path, rng: np.random.Generator, outcome: Outcome) -> Any:
    """Build the model like `nfc compile`, run forward and one training step, compare;
    returns the oracle module (frontend and autodiff only)."""
    from nfc.interp import InterpError
    from nfc.interp import run as interp_run
    from nfc.runtime.build import compile_model, model_module
    from nfc.runtime.loader import load

    oracle = model_module(path, im2col=False)
    built = compile_model(str(path), str(path.with_suffix(".so")), use_cache=False,
                          tuning=False)
    model = load(built.path)
    values: dict[str, np.ndarray] = {}
    for fname in ("forward", "train_step"):
        if not oracle.has_func(fname):
            continue
        func = oracle.func(fname)
        args = _args(func, rng, values)
        values.update(args)
        try:
            interp = interp_run(func, args, module=oracle)
        except InterpError as err:  # e.g. an integer input out of range for a mutant
            raise _Invalid(str(err)) from err
        ref = _bounded(func, args, module=oracle)
        names = func.attrs["nf.results"]
        for n, ours, (v, e) in zip(names, interp, ref, strict=True):
            _compare(f"interpreter {fname} {n} (the bound itself)", ours, v, e, Outcome("ok"))
        roles = {a.name: attrs.get("nf.role") for a, attrs in
                 zip(func.args, func.arg_attrs, strict=True)}
        model.load_state_dict({n: args[n] if n in args else np.zeros_like(t)
                               for n, t in model.tensors.items()})
        fn = model.functions[fname]
        inputs = {a.name: args[a.name] for a in fn.inputs}
        outs = fn(**inputs, rng=(0, 0)) if "rng" in roles.values() else fn(**inputs)
        for spec, n, (v, e) in zip(fn.results, names, ref, strict=True):
            got = outs[n] if spec.get("inplace") is None else model.tensors[spec["inplace"]]
            _compare(f"native {fname} {n}", got, v, e, outcome)
    return oracle


class _Invalid(Exception):
    """The program reads out of bounds on the random inputs (an integer input used as an
    index): not a compiler bug."""


class HarnessError(Exception):
    """The error-bound oracle (nfc.testing) failed: a bug of the test, not of the compiler."""


def _bounded(*args: Any, **kw: Any) -> list[tuple[np.ndarray, np.ndarray]]:
    from nfc.testing import run_bounded

    try:
        return run_bounded(*args, **kw)
    except Exception as err:  # noqa: BLE001
        raise HarnessError(traceback.format_exc(limit=-4)) from err


def check_schedules(module: Any, rng: np.random.Generator, pyrng: random.Random,
                    outcome: Outcome, count: int) -> None:
    """`count` computes of the training step of `module` (which the pipeline changes), each
    JIT-compiled with a random valid schedule of its space, on the interpreter's values of
    its operands."""
    from nfc.codegen.jit import compile_kernel
    from nfc.codegen.lower import group_of
    from nfc.codegen.space import schedule_space
    from nfc.interp import _bind, _run_op
    from nfc.ir import Block, ComputeOp, Func, ReturnOp, YieldOp
    from nfc.runtime.build import run_pipeline

    if count <= 0:
        return
    run_pipeline(module)
    name = "train_step" if module.has_func("train_step") else "forward"
    func = module.func(name)
    args = _args(func, rng, {})
    env = {id(a): x for a, x in zip(func.args, _bind(func, args), strict=True)}
    ops = []
    for op in func.body.ops:
        if isinstance(op, ReturnOp | YieldOp):
            break
        _run_op(op, env, module)
        if isinstance(op, ComputeOp):
            ops.append(op)
    for op in pyrng.sample(ops, min(count, len(ops))):
        space = schedule_space(op)
        cfg = None
        for _ in range(200):
            cand = {k: pyrng.choice(v) for k, v in space.params.items()}
            if space.is_valid(cand):
                cfg = cand
                break
        schedule = space.to_schedule(cfg) if cfg is not None else None
        _, _, ins = group_of(op)
        arrays = [env[id(v)] for v in ins]
        kernel = compile_kernel(op, schedule)
        got = kernel(*arrays)
        single = Func("f", list(ins), Block([op, ReturnOp([op.result])]))
        (v, e), = _bounded(single, arrays)
        what = f"compute %{op.result.name} of @{name} with schedule {json.dumps(cfg)}"
        _compare(what, got, v, e, outcome)


def run_case(seed: int, index: int, *, schedules: int = 2) -> tuple[str, Outcome]:
    """Generate, compile and check case `index` of campaign `seed`: (source, outcome)."""
    try:
        kind, text = make_program(seed, index)
    except Exception:  # noqa: BLE001 - a bug of the generator, reported, not fatal
        return "", Outcome("crash", "harness (the program generator): "
                           + traceback.format_exc(limit=-4))
    return text, check_source(text, kind, np.random.default_rng([seed, index]),
                              random.Random(f"schedules:{seed}:{index}"), schedules)


def check_source(text: str, kind: str = "given", rng: np.random.Generator | None = None,
                 pyrng: random.Random | None = None, schedules: int = 2) -> Outcome:
    """Compile and check the model `text` (see the module docstring)."""
    from nfc.diagnostics import CompileError
    from nfc.frontend import compile_source

    rng = rng if rng is not None else np.random.default_rng(0)
    pyrng = pyrng if pyrng is not None else random.Random(0)
    try:
        compile_source(text, "fuzz.nf", training=True)
    except CompileError:
        return Outcome("rejected", kind)
    except Exception:  # noqa: BLE001 - any other exception is a compiler crash
        return Outcome("crash", "frontend: " + traceback.format_exc(limit=-4))
    outcome = Outcome("ok", kind)
    with tempfile.TemporaryDirectory(prefix="nfc-fuzz-") as tmp:
        path = Path(tmp) / "fuzz.nf"
        path.write_text(text, encoding="utf-8")
        stage = "end to end"
        try:
            oracle = check_end_to_end(path, rng, outcome)
            stage = "schedules"
            check_schedules(oracle, rng, pyrng, outcome, schedules)
        except _Invalid as err:
            return Outcome("rejected", f"{kind}, invalid at run time: {err}")
        except CompileError as err:  # a diagnostic after the frontend (no parameters, ...)
            return Outcome("rejected", f"{kind}, {stage}: {err}")
        except Mismatch as err:
            return Outcome("wrong", f"{stage}: {err}", outcome.checked, outcome.unchecked)
        except HarnessError as err:
            return Outcome("harness", f"{stage}: the oracle failed: {err}")
        except Exception:  # noqa: BLE001
            return Outcome("crash", f"{stage}: " + traceback.format_exc(limit=-6),
                           outcome.checked, outcome.unchecked)
    return outcome


# ---------------------------------------------------------------------------------------------
# campaigns: worker processes, crashes and hangs


def _worker() -> None:
    """Read `seed index` lines on stdin, answer one JSON outcome line each."""
    # NFC_FUZZ_SELFTEST="crash:3,hang:5,ok:0" makes case 3 abort, case 5 hang and case 0
    # pass at once (tests of the campaign's bookkeeping)
    selftest = dict(x.split(":")[::-1] for x in os.environ.get("NFC_FUZZ_SELFTEST", "").split(",")
                    if x)
    import nfc.testing  # noqa: F401 - the imports are done before the first case's clock starts

    sys.stdout.write("ready\n")
    sys.stdout.flush()
    for line in sys.stdin:
        seed, index, schedules = (int(x) for x in line.split())
        if selftest.get(str(index)) == "crash":
            os.abort()
        if selftest.get(str(index)) == "hang":
            time.sleep(3600)
        if selftest.get(str(index)) == "ok":
            sys.stdout.write(Outcome("ok").to_json() + "\n")
            sys.stdout.flush()
            continue
        _, outcome = run_case(seed, index, schedules=schedules)
        sys.stdout.write(outcome.to_json() + "\n")
        sys.stdout.flush()


@dataclass
class Campaign:
    """Cases `start .. start + cases` of campaign `seed`, run in `jobs` worker processes;
    a case taking longer than `timeout` seconds is a hang."""

    seed: int
    cases: int
    start: int = 0
    jobs: int = 1
    timeout: float = 120.0
    schedules: int = 2
    save: Path | None = None
    log: Any = None
    counts: dict[str, int] = field(default_factory=lambda: {
        "ok": 0, "rejected": 0, "crash": 0, "hang": 0, "wrong": 0, "harness": 0})
    failures: list[tuple[int, Outcome]] = field(default_factory=list)
    checked: int = 0
    unchecked: int = 0
    rejected_generated: int = 0
    """Generated (not mutated) programs rejected: a few are expected, many mean the frontend
    or the generator broke."""

    def _spawn(self) -> subprocess.Popen[str]:
        code = (f"import sys; sys.path.insert(0, {str(Path(__file__).parent)!r}); "
                "import backend_fuzz; backend_fuzz._worker()")
        # two threads, so parallel loops really run in parallel; no kernel object cache, so
        # every kernel is compiled and the user's cache is neither read nor filled
        env = dict(os.environ, OMP_NUM_THREADS=os.environ.get("OMP_NUM_THREADS", "2"),
                   NFC_OBJECT_CACHE="0")
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
                                env=env, bufsize=1)
        assert proc.stdout is not None
        if proc.stdout.readline() != "ready\n":  # the case clock starts once it is ready
            raise RuntimeError(f"a fuzz worker failed to start (exit code {proc.wait()})")
        return proc

    def run(self) -> Campaign:
        todo = list(range(self.start, self.start + self.cases))
        todo.reverse()
        sel = selectors.DefaultSelector()
        busy: dict[Any, tuple[subprocess.Popen[str], int, float]] = {}

        def give(proc: subprocess.Popen[str] | None) -> None:
            if not todo:
                if proc is not None:
                    proc.kill()
                    proc.wait()
                return
            if proc is None or proc.poll() is not None:
                proc = self._spawn()
            index = todo.pop()
            assert proc.stdin is not None and proc.stdout is not None
            proc.stdin.write(f"{self.seed} {index} {self.schedules}\n")
            proc.stdin.flush()
            busy[proc.stdout] = (proc, index, time.monotonic())
            sel.register(proc.stdout, selectors.EVENT_READ)

        for _ in range(max(1, self.jobs)):
            give(None)
        try:
            self._loop(busy, sel, give)
        finally:  # done, or interrupted (the counts so far stay right): no worker left behind
            for proc, _, _ in busy.values():
                proc.kill()
                proc.wait()
        return self

    def _loop(self, busy: dict[Any, tuple[subprocess.Popen[str], int, float]],
              sel: selectors.BaseSelector, give: Any) -> None:
        while busy:
            now = time.monotonic()
            deadline = min(t0 for _, _, t0 in busy.values()) + self.timeout
            events = sel.select(timeout=max(0.0, deadline - now))
            done = [key.fileobj for key, _ in events]
            for out, (proc, index, t0) in list(busy.items()):
                if out in done:
                    line = out.readline()  # type: ignore[union-attr]
                    outcome = Outcome(**json.loads(line)) if line else Outcome(
                        "crash", f"the worker died (exit code {proc.wait()})")
                elif time.monotonic() - t0 > self.timeout:
                    proc.kill()
                    proc.wait()
                    outcome = Outcome("hang", f"no answer in {self.timeout:g} s")
                else:
                    continue
                sel.unregister(out)
                del busy[out]
                self._record(index, outcome)
                if outcome.status in ("crash", "hang") and proc.poll() is None:
                    proc.kill()  # a compiler that raised may have left its process damaged
                    proc.wait()
                give(proc if outcome.status not in ("crash", "hang") else None)

    def _record(self, index: int, outcome: Outcome) -> None:
        self.counts[outcome.status] += 1
        if outcome.status == "rejected" and outcome.detail.startswith("generated"):
            self.rejected_generated += 1
        self.checked += outcome.checked
        self.unchecked += outcome.unchecked
        if outcome.status in ("crash", "hang", "wrong", "harness"):
            self.failures.append((index, outcome))
            text = self.program(index)
            report = self.reproducer(index, outcome)
            if self.save is not None:
                self.save.mkdir(parents=True, exist_ok=True)
                (self.save / f"case-{self.seed}-{index}.nf").write_text(text, encoding="utf-8")
                (self.save / f"case-{self.seed}-{index}.txt").write_text(report,
                                                                         encoding="utf-8")
            if self.log is not None:
                self.log(report)
        done = sum(self.counts.values())
        if self.log is not None and done % 100 == 0:
            self.log(self.summary() + f" (after {done}; {self.rejected_generated} of the "
                     f"rejected were generated, not mutated; {self.checked} elements checked)")

    def program(self, index: int) -> str:
        """The source of case `index` (empty when the generator fails on it)."""
        try:
            return make_program(self.seed, index)[1]
        except Exception:  # noqa: BLE001 - reported by the worker already
            return ""

    def reproducer(self, index: int, outcome: Outcome) -> str:
        """The failing program and how to rerun it."""
        return (f"--- case {index} of seed {self.seed}: {outcome.status.upper()}\n"
                f"{outcome.detail}\n"
                f"rerun: python scripts/fuzz_backend.py --seed {self.seed} --start {index} "
                f"--cases 1\n{self.program(index)}")

    def summary(self) -> str:
        c = self.counts
        total = sum(c.values())
        extra = f", harness errors {c['harness']}" if c["harness"] else ""
        return (f"cases {total}, crashes {c['crash']}, hangs {c['hang']}, wrong {c['wrong']}, "
                f"rejected {c['rejected']}{extra}")
