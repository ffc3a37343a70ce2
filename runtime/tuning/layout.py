"""The layout choice of a model as a tuner knob: `layout` off, or on with block 8 or 16.

    choice = tune_layout("examples/models/squeezenet.nf")   # measure, record, return the winner
    cached_layout_choice(digest)                             # what `layout{when=auto}` reads

`nfc tune` builds the model's train step once per candidate (`candidates()`: `off` and the
blocks valid on this CPU: 8, and 16 with AVX-512), times the steps of all of them alternating
in rounds (so that other load falls on every candidate alike; median per candidate), and
records each candidate's median in the tuning cache as one entry of the key
`nfc-layout-1:<digest>` under this CPU's category (`cpu_category(purpose="layout")`: device,
features, cores, llvmlite and schedule-space versions). `digest` is the SHA-256 of the model's
frontend module as printed without locations (the module `layout{when=auto}` sees first in the
build pipeline), so a change to the model or its `--set` sizes is a new key. Every record is
one committed transaction of the cache (`TuningCache.put`); the winner is the cache's
`best` entry of that key, read back and checked (`parse_choice`) by the `nfc.layout_choice`
provider that the `layout` pass calls (passes may not import the runtime). A missing, failed
or unreadable entry leaves the pass to its rule.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

#: Version of the key: a change to what is measured or how the choice is spelled is a new one.
KEY_VERSION = "nfc-layout-1"

Timer = Callable[[str, int], float]
"""`(choice, round) -> seconds` of one train step of the candidate `choice` (tests inject one)."""


def module_digest(module: Any) -> str:
    """The SHA-256 of `module` printed without locations (the key of its layout choice;
    nfc.passes.layout.module_digest, which the pass computes)."""
    from nfc.passes.layout import module_digest as digest

    return digest(module)


def layout_key(digest: str) -> str:
    """The tuning-cache key of the layout choice of the module with `digest`."""
    return f"{KEY_VERSION}:{digest}"


def layout_category() -> dict[str, Any]:
    """The tuning-cache category of layout choices on this CPU."""
    from nfc.runtime.tuning.category import cpu_category

    return cpu_category(purpose="layout")


def candidates() -> list[str]:
    """The choices valid on this CPU: `off`, block 8, and block 16 where a vector register
    holds 16 f32 lanes (AVX-512)."""
    from nfc.passes.layout import default_block

    return ["off", "8"] + (["16"] if default_block() >= 16 else [])


def parse_choice(schedule: Mapping[str, Any]) -> str | None:
    """The choice a cache entry's schedule spells (`{"layout": "off"}`, `{"layout": 16}`),
    checked: None when it is not one of `candidates()`."""
    if not isinstance(schedule, Mapping) or set(schedule) != {"layout"}:
        return None
    value = schedule["layout"]
    text = value if isinstance(value, str) else (
        str(value) if isinstance(value, int) and not isinstance(value, bool) else "")
    return text if text in candidates() else None


def cached_layout_choice(digest: str, db: str | Path | None = None) -> str | None:
    """The recorded choice (`off` or a block) for the module with `digest` on this CPU, or
    None: no cache, no entry, a damaged cache or an entry that is no valid choice. Measures
    nothing (the `nfc.layout_choice` provider of the `layout` pass)."""
    from nfc.runtime.tuning.cache import TuningCache, default_cache_path
    from nfc.runtime.tuning.model import CacheError

    path = Path(db) if db is not None else default_cache_path()
    if not path.exists():
        return None
    try:
        with TuningCache(path, create=False) as cache:
            entry = cache.best(layout_category(), layout_key(digest))
    except (CacheError, OSError, ValueError):
        return None
    if entry is None or entry.time is None:
        return None
    return parse_choice(entry.schedule)


def choice_pipeline(pipeline: str, choice: str) -> str:
    """`pipeline` with its `layout` pass fixed to `choice` (`off`: `when=never`; a block:
    `when=always, block=N`), or with `layout` added before `im2col` when it has none."""
    import dataclasses

    from nfc.passes.layout import with_layout
    from nfc.passmanager import build_pipeline, format_pipeline

    passes = build_pipeline(with_layout(pipeline))
    out = []
    for p in passes:
        if p.name == "layout":
            p = (dataclasses.replace(p, when="never") if choice == "off"
                 else dataclasses.replace(p, when="always", block=choice))
        out.append(p)
    return format_pipeline(out)


def _builds(source: str | Path, settings: Sequence[str], model: str | None,
            pipeline: str, choices: Sequence[str], threads: int | None) -> dict[str, Any]:
    """A bound train step per choice, from the same initial state and inputs."""
    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load
    from nfc.runtime.train import synthetic_train_step

    steps: dict[str, Any] = {}
    for c in choices:
        m = load(compile_model(source, settings=settings, pipeline=choice_pipeline(pipeline, c),
                               model=model).path)
        if threads:
            m.set_num_threads(threads)
        steps[c] = (m, synthetic_train_step(m))
    return steps


def step_timer(source: str | Path, settings: Sequence[str] = (), *, model: str | None = None,
               pipeline: str | None = None, choices: Sequence[str] | None = None,
               threads: int | None = None, min_time: float = 0.05) -> Timer:
    """A `Timer` over real builds: each choice compiled with `choice_pipeline` (the default
    build pipeline unless `pipeline`), loaded and bound once; a call runs enough steps of that
    build to take about `min_time` seconds and returns the wall time per step."""
    from nfc.runtime.build import pipeline_for

    text = pipeline if pipeline is not None else pipeline_for(source)
    steps = _builds(source, settings, model, text, list(choices or candidates()), threads)
    reps: dict[str, int] = {}

    def timer(choice: str, _round: int) -> float:
        bound = steps[choice][1]
        if choice not in reps:
            t0 = time.perf_counter()
            bound()
            reps[choice] = max(1, int(min_time / max(time.perf_counter() - t0, 1e-6)))
        n = reps[choice]
        t0 = time.perf_counter()
        for _ in range(n):
            bound()
        return (time.perf_counter() - t0) / n

    return timer


def measure_choices(timer: Timer, choices: Sequence[str], rounds: int = 7
                    ) -> dict[str, float]:
    """The median step time of every choice over `rounds` rounds, the choices alternating
    (their order rotating by round)."""
    times: dict[str, list[float]] = {c: [] for c in choices}
    order = list(choices)
    for r in range(rounds):
        for c in order[r % len(order):] + order[:r % len(order)]:
            times[c].append(timer(c, r))
    return {c: statistics.median(v) for c, v in times.items()}


def record_choices(medians: Mapping[str, float], digest: str,
                   db: str | Path | None = None) -> str:
    """Record every choice's median step time (one committed transaction each) under
    `layout_key(digest)`; returns the winner as the cache reads it back."""
    from nfc.runtime.tuning.cache import TuningCache, default_cache_path

    path = Path(db) if db is not None else default_cache_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    category, key = layout_category(), layout_key(digest)
    with TuningCache(path) as cache:
        for c, seconds in medians.items():
            value: str | int = c if c == "off" else int(c)
            cache.put(category, key, {"layout": value}, seconds,
                      desc=f"layout choice of a model (train step, {c})")
        best = cache.best(category, key)
    won = parse_choice(best.schedule) if best is not None else None
    assert won is not None, "a recorded layout choice must read back"
    return won


def tune_layout(source: str | Path, settings: Sequence[str] = (), *, model: str | None = None,
                pipeline: str | None = None, db: str | Path | None = None, rounds: int = 7,
                threads: int | None = None, timer: Timer | None = None
                ) -> tuple[str, dict[str, float]]:
    """Measure every candidate's train step of the model (`timer`, default `step_timer`),
    record them, and return (the winner, the medians)."""
    from nfc.runtime.build import frontend_module
    from nfc.settings import parse_settings

    params, opt = parse_settings(list(settings))
    digest = module_digest(frontend_module(source, params, opt, model=model))
    choices = candidates()
    if timer is None:
        timer = step_timer(source, settings, model=model, pipeline=pipeline, choices=choices,
                           threads=threads)
    medians = measure_choices(timer, choices, rounds)
    return record_choices(medians, digest, db), medians
