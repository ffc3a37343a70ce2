"""Validate the fusion reward on the seed models: step time fused by the reward vs no fusion vs
fusing every legal merge, and the sign of R of sampled single decisions vs the measured change.

    .venv/bin/python benchmarks/fusion_reward.py                      # the seed models
    .venv/bin/python benchmarks/fusion_reward.py --models lltm bert --decisions 6 --rounds 15
    .venv/bin/python benchmarks/fusion_reward.py --json out.jsonl --markdown

Per model (its `nfc bench` sizes; `--quick` the small ones) the training step is built from the
same pre-fusion module (`nfc compile`'s pipeline without `fuse`) in these variants:

- `none`: no `fuse` pass (one kernel per compute);
- `reward`: `fuse` as every build runs it (this machine's measured device parameters, unless
  `--device-params builtin`);
- `all`: `fuse{launch-us=1000000}`: every legal merge has a huge reward, so the search takes
  every merge the codegen rules allow (recomputations are still priced);
- one per sampled decision of the `reward` search in `@train_step` (`fuse{explain}` numbering):
  a taken step is vetoed (`fuse{veto=N}`: the step and every other route to putting its two
  sides in one kernel are refused), a rejected one forced (`fuse{force=N}`).

All variants start from the same parameters and inputs (their first losses must agree); steps
run through `Function.bind` on one thread; the variants alternate in every round (the order
shuffled per round) so that other load on the machine hits all of them; each sample is the
process CPU time of a batch of steps (robust to being descheduled, not to cache and memory
contention from other processes). A decision's measured change is the median over rounds of
`t(without the step) - t(with it)` (paired within a round); it is *clear* when at least 80% of
the rounds agree on its sign, else within noise. The reward agrees with a decision when R and
the measured change have the same sign; the agreement rate counts clear decisions only, and
the table lists all. Decisions whose variant builds the same library as `reward` (the step
changed nothing that reaches codegen) are dropped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SEEDS = ("bert", "capsnet", "lltm", "lstm_lm", "mi_lstm", "mobilenet", "resnet18", "sc_rnn",
         "squeezenet", "sublstm")
ALL_OPTIONS = "launch-us=1000000"


@dataclass
class Variant:
    """One build of a model's step."""

    name: str
    pipeline: str
    kind: str = ""
    """`veto` or `force` for a decision, else empty."""
    step: int = -1
    reward_us: float = 0.0
    members: str = ""
    bound: Any = None
    model: Any = None
    path: str = ""
    kernels: int = 0
    loss: float = 0.0
    samples: list[float] = field(default_factory=list)
    labels: list[str] = field(default_factory=list)
    """Each kernel call of the step by its symbol (a hash of the kernel's code: the same in
    two builds, the same kernel)."""
    names: list[str] = field(default_factory=list)
    """Each kernel call's label (the values it yields), for the report."""
    profiled: Any = None
    """The bound step of a profiled build (per-kernel clock stamps), for decisions."""
    kernel_ns: list[list[list[float]]] = field(default_factory=list)
    """Per round, per kernel: its durations (ns) in the round's profiled steps."""


def _pre_fuse(bm, settings: dict[str, Any]):
    """(pipeline without fuse, module before fuse, settings list)."""
    from nfc.runtime.build import build_module, parse_settings, pipeline_for

    items = [f"{k}={v}" for k, v in settings.items()]
    text = pipeline_for(bm.file, fuse=False)
    params, opt = parse_settings(items)
    module, _ = build_module(bm.file, params, opt, text, model=bm.model)
    return text, module, items


def _decisions(module) -> list[Any]:
    """The reward search's decisions on `module` (in place: give a copy), numbered as the
    build's `fuse` pass numbers them (functions in order)."""
    from nfc.passes.fusion import Fuse, fuse_func
    from nfc.passes.fusion.partition import Options
    from nfc.passes.fusion.reward import CostModel
    from nfc.passmanager import Context
    from nfc.runtime.build import device_params_for

    fuse = Fuse()
    ctx = Context(device_params=device_params_for([fuse]))
    dev, source = fuse.resolve_device(ctx)
    out, steps = [], [0]
    for func in module.funcs:
        found: list[Any] = []
        fuse_func(func, CostModel(dev, fuse.max_nodes), Options(explain=True), found, steps)
        out += [(func.name, d) for d in found]
    return out, source


def _names(d) -> str:
    return " ".join(f"%{r.name or '?'}" for op in d.members for r in op.results[:1])


def _label(kernel: dict[str, Any]) -> str:
    """`'12 %a, %b kernel file:3:1'` -> `'%a, %b'`: the values the kernel yields."""
    text = kernel["label"].split(" ", 1)[1]
    return text.split(" [", 1)[0].split(" kernel", 1)[0]


def _bind(bm, path: str, seed: int) -> tuple[Any, Any]:
    import numpy as np

    from nfc.runtime.bench.worker import make_inputs
    from nfc.runtime.loader import load

    model = load(path)
    model.init(seed=seed)
    model.set_num_threads(1)
    fn = model.functions["train_step"]
    inputs = make_inputs(model.metadata, bm.int_bounds, seed)
    return model, fn.bind({s.name: np.ascontiguousarray(inputs[s.name], dtype=s.dtype)
                           for s in fn.inputs})


def _load(v: Variant, bm, items: list[str], seed: int, profile: bool) -> None:
    from nfc.runtime.build import compile_model

    built = compile_model(bm.file, settings=items, pipeline=v.pipeline, model=bm.model)
    v.path = built.path
    v.model, v.bound = _bind(bm, built.path, seed)
    kernels = v.model.metadata["functions"]["train_step"]["kernels"]
    v.kernels = len(kernels)
    v.labels = [k["symbol"] for k in kernels]
    v.names = [_label(k) for k in kernels]
    v.loss = float(v.bound()["loss"])
    if profile:
        prof = compile_model(bm.file, settings=items, pipeline=v.pipeline, model=bm.model,
                             profile=True)
        v.profiled = _bind(bm, prof.path, seed)


def _state(v: Variant) -> None:
    """Back to the initial parameters (steps update them in place)."""
    v.model.init(seed=0)
    if v.profiled is not None:
        v.profiled[0].init(seed=0)


def measure(variants: list[Variant], rounds: int, min_round: float, rng: random.Random) -> None:
    """Interleaved rounds (see the module doc): per variant a CPU-timed batch of steps, and
    for a profiled build as many steps with their kernels' clock stamps."""
    t = time.process_time()
    variants[0].bound()
    one = max(1e-6, time.process_time() - t)
    reps = max(1, int(min_round / one))
    for _ in range(rounds):
        order = list(variants)
        rng.shuffle(order)
        for v in order:
            v.bound()  # warm: the caches hold this variant's data
            t = time.process_time()
            for _ in range(reps):
                v.bound()
            v.samples.append((time.process_time() - t) / reps)
            if v.profiled is not None:
                bound = v.profiled[1]
                per: list[list[float]] = [[] for _ in v.labels]
                bound()
                for _ in range(reps):
                    bound()
                    ev = bound.fn.profile_events()
                    for k, (a, b) in enumerate(ev):
                        per[k].append(float(b - a))
                v.kernel_ns.append(per)


def _changed_ns(v: Variant, ref: Variant, r: int) -> float:
    """In round r: the median time (ns) of the kernels only `v` has minus that of the kernels
    only `ref` has (kernel calls matched by symbol, as multisets)."""
    def total(x: Variant, other: Variant) -> float:
        left = list(other.labels)
        out = 0.0
        for k, lab in enumerate(x.labels):
            if lab in left:
                left.remove(lab)
            else:
                out += statistics.median(x.kernel_ns[r][k])
        return out
    return total(v, ref) - total(ref, v)


def run_model(name: str, args: argparse.Namespace, rng: random.Random) -> dict[str, Any]:
    """Every variant of one model, built and timed; the model's record."""
    from nfc.runtime.bench.models import resolve

    bm = resolve(name)
    settings = bm.settings(quick=args.quick)
    t0 = time.perf_counter()
    base, module, items = _pre_fuse(bm, settings)
    decisions, source = _decisions(module)
    takes = [(f, d) for f, d in decisions if f == "train_step" and d.verdict == "take"]
    rejects = [(f, d) for f, d in decisions if f == "train_step" and d.verdict == "reject"]
    k = args.decisions
    sample = (rng.sample(takes, min(len(takes), (k + 1) // 2))
              + rng.sample(rejects, min(len(rejects), k // 2)))
    variants = [Variant("none", base), Variant("reward", f"{base},fuse"),
                Variant("all", f"{base},fuse{{{ALL_OPTIONS}}}")]
    for _, d in sample:
        kind = "veto" if d.verdict == "take" else "force"
        variants.append(Variant(f"{kind}#{d.index}", f"{base},fuse{{{kind}={d.index}}}",
                                kind, d.index, d.reward * 1e6, _names(d)))
    built = []
    for v in variants:
        try:
            _load(v, bm, items, 0, profile=bool(v.kind) or v.name == "reward")
        except Exception as exc:  # noqa: BLE001 - a variant that fails is reported, not fatal
            print(f"  {name}: {v.name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        built.append(v)
    ref = next(v for v in built if v.name == "reward")
    # a decision whose build is the reward's library changed nothing codegen sees
    built = [v for v in built if not v.kind or v.path != ref.path]
    for v in built:
        if abs(v.loss - ref.loss) > 1e-3 * max(1.0, abs(ref.loss)):
            raise AssertionError(f"{name}: {v.name} loss {v.loss} != reward's {ref.loss}")
    compile_s = time.perf_counter() - t0
    for v in built:
        _state(v)
    measure(built, args.rounds, args.min_round, rng)
    med = {v.name: statistics.median(v.samples) for v in built}
    rec: dict[str, Any] = {
        "model": name, "settings": settings, "device_params": source,
        "ms": {n: round(t * 1e3, 4) for n, t in med.items() if n in ("none", "reward", "all")},
        "kernels": {v.name: v.kernels for v in built if not v.kind},
        "decisions_total": {"take": len(takes), "reject": len(rejects)},
        "compile_s": round(compile_s, 1), "rounds": args.rounds, "decisions": []}
    by = {v.name: v for v in built}
    for v in built:
        if not v.kind:
            continue
        # paired per round: the time without the step minus the time with it, of the kernels
        # that differ (profiled build), and of the whole step (CPU time)
        sign = 1.0 if v.kind == "veto" else -1.0
        diffs = [sign * _changed_ns(v, ref, r) * 1e-9 for r in range(len(v.kernel_ns))]
        steps = [sign * (a - b) for a, b in zip(v.samples, ref.samples, strict=True)]
        pos = sum(d > 0 for d in diffs) / len(diffs)
        neg = sum(d < 0 for d in diffs) / len(diffs)
        delta = statistics.median(diffs)
        changed = sorted(set(v.labels) ^ set(ref.labels))
        clear = bool(changed) and (pos >= 0.8 or neg >= 0.8)
        rec["decisions"].append({
            "step": v.step, "kind": v.kind, "members": v.members,
            "reward_us": round(v.reward_us, 3), "measured_us": round(delta * 1e6, 3),
            "step_us": round(statistics.median(steps) * 1e6, 3),
            "rounds_positive": round(pos, 2), "clear": clear,
            "agree": (v.reward_us > 0) == (delta > 0), "kernels": by[v.name].kernels,
            "changed": len(changed),
            "changed_kernels": sorted({n for lab, n in zip(v.labels, v.names, strict=True)
                                       if lab in changed}
                                      | {n for lab, n in zip(ref.labels, ref.names, strict=True)
                                         if lab in changed})[:8]})
    return rec


def markdown(recs: list[dict[str, Any]]) -> str:
    """The two tables and the agreement rate."""
    lines = ["| model | none ms | reward ms | all ms | none/reward | all/reward | kernels "
             "(none/reward/all) |", "|---|---|---|---|---|---|---|"]
    for r in recs:
        ms, k = r["ms"], r["kernels"]
        lines.append(f"| {r['model']} | {ms['none']:.3f} | {ms['reward']:.3f} | "
                     f"{ms['all']:.3f} | {ms['none'] / ms['reward']:.2f} | "
                     f"{ms['all'] / ms['reward']:.2f} | {k['none']}/{k['reward']}/{k['all']} |")
    lines += ["", "| model | step | decision | R µs | measured µs (kernels) | step µs | "
              "rounds + | clear | agree |", "|---|---|---|---|---|---|---|---|---|"]
    clear = agree = n = n_agree = same = 0
    for r in recs:
        for d in r["decisions"]:
            if not d.get("changed", 1):
                same += 1  # the same kernels as `reward`: nothing to measure
                continue
            n += 1
            n_agree += d["agree"]
            clear += d["clear"]
            agree += d["clear"] and d["agree"]
            lines.append(f"| {r['model']} | #{d['step']} | {d['kind']} {d['members'][:40]} | "
                         f"{d['reward_us']:+.2f} | {d['measured_us']:+.2f} | "
                         f"{d['step_us']:+.1f} | "
                         f"{d['rounds_positive']:.2f} | {'yes' if d['clear'] else 'no'} | "
                         f"{'yes' if d['agree'] else 'no'} |")
    lines += ["", f"Agreement: {agree}/{clear} clear decisions "
              f"({100 * agree / max(clear, 1):.0f}%); {n_agree}/{n} of all sampled decisions "
              f"by the sign of the median; {same} more built the same kernels as `reward` "
              f"(not counted)."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(SEEDS))
    p.add_argument("--decisions", type=int, default=4,
                   help="decisions sampled per model (half taken, half rejected)")
    p.add_argument("--rounds", type=int, default=11)
    p.add_argument("--min-round", type=float, default=0.15,
                   help="CPU seconds of one variant's batch of steps in a round")
    p.add_argument("--quick", action="store_true", help="the models' small --quick sizes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device-params", choices=("measured", "builtin"), default=None)
    p.add_argument("--json", metavar="OUT.jsonl")
    p.add_argument("--markdown", action="store_true")
    p.add_argument("--report", metavar="IN.jsonl", nargs="+",
                   help="print the tables of earlier --json runs and exit")
    args = p.parse_args(argv)
    if args.report:
        recs = [json.loads(line) for path in args.report
                for line in Path(path).read_text(encoding="utf-8").splitlines() if line]
        print(markdown(recs))
        return 0
    if args.device_params:
        os.environ["NFC_DEVICE_PARAMS"] = args.device_params
    rng = random.Random(args.seed)
    recs = []
    print(f"load before: {os.getloadavg()[0]:.1f}", file=sys.stderr)
    for name in args.models:
        t0 = time.perf_counter()
        try:
            rec = run_model(name, args, rng)
        except Exception as exc:  # noqa: BLE001 - report and go on with the next model
            print(f"{name}: failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            continue
        rec["load"] = round(os.getloadavg()[0], 1)
        recs.append(rec)
        print(f"{name}: {json.dumps(rec['ms'])} kernels {rec['kernels']} "
              f"({time.perf_counter() - t0:.0f} s, load {rec['load']})", file=sys.stderr)
        for d in rec["decisions"]:
            print(f"  #{d['step']} {d['kind']} {d['members'][:50]}: R={d['reward_us']:+.2f}us "
                  f"measured={d['measured_us']:+.2f}us step={d['step_us']:+.1f}us "
                  f"({d['rounds_positive']:.2f} of rounds +)"
                  f" {'clear' if d['clear'] else 'noise'} "
                  f"{'agree' if d['agree'] else 'DISAGREE'}", file=sys.stderr)
        if args.json:
            with open(args.json, "a", encoding="utf-8") as f:
                f.write(json.dumps(rec) + "\n")
    if args.markdown or not args.json:
        print(markdown(recs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
