"""The fusion reward's device parameters, measured once per machine and kept in the tuning
cache.

    python -m nfc.runtime.device_params            # measure (or reuse) and print `fuse{...}`
    python -m nfc.runtime.device_params --refresh  # measure again

Every build that fuses (`nfc compile`, `nfc train`, `nfc bench`: nfc.runtime.build.
device_params_for) calls `device_params()` and gives the result to the `fuse` pass, so the
first build on a machine measures (a few seconds) and later ones only look the timings up;
`--device-params builtin` / `NFC_DEVICE_PARAMS=builtin` skips it.

`device_params()` looks the micro-benchmark timings of `nfc.codegen.devbench` up in the tuning
cache under the CPU category (`cpu_category()`: device, features, cores, llvmlite and schedule
versions), so a number measured on another machine is never used; missing ones are measured
and stored. Each benchmark is one cache key (`nfc-devbench-1:<name>`) whose entry is its
timing; `--refresh` measures again and replaces it (measure on an idle machine).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nfc.passes.fusion.device import DeviceParams


def device_params(db: str | Path | None = None, *, refresh: bool = False,
                  store: bool = True) -> DeviceParams:
    """The device parameters of this machine: cached timings, else measured (and stored when
    `store`). `refresh` measures again and replaces the cached timings."""
    from nfc.codegen.devbench import BENCH_VERSION, BENCHMARKS, Timing, params_from
    from nfc.runtime.tuning import TuningCache, cpu_category, default_cache_path

    category = cpu_category(purpose="device-parameters")
    path = Path(db) if db is not None else default_cache_path()
    if not path.parent.exists() and store:
        path.parent.mkdir(parents=True, exist_ok=True)
    cache = TuningCache(path) if store or path.exists() else None
    timings: dict[str, Timing] = {}
    try:
        for name, bench in BENCHMARKS.items():
            key = f"{BENCH_VERSION}:{name}"
            entry = None if cache is None or refresh else cache.best(category, key)
            if entry is not None and entry.time is not None:
                timings[name] = Timing(name, dict(entry.schedule), float(entry.time))
                continue
            t = bench()
            if cache is not None and store:
                cache.put(category, key, t.spec, t.seconds, desc=f"device benchmark {name}")
            timings[name] = t
    finally:
        if cache is not None:
            cache.close()
    return params_from(timings)


def cached_device_params(db: str | Path | None = None) -> DeviceParams | None:
    """This machine's parameters when every benchmark's timing is in the tuning cache under
    its CPU category, else None; measures nothing (the `nfc.device_params` provider the
    `fuse{params=measured}` pass option reads)."""
    from nfc.codegen.devbench import BENCH_VERSION, BENCHMARKS, Timing, params_from
    from nfc.runtime.tuning import TuningCache, cpu_category, default_cache_path

    path = Path(db) if db is not None else default_cache_path()
    if not path.exists():
        return None
    category = cpu_category(purpose="device-parameters")
    cache = TuningCache(path)
    try:
        timings: dict[str, Timing] = {}
        for name in BENCHMARKS:
            entry = cache.best(category, f"{BENCH_VERSION}:{name}")
            if entry is None or entry.time is None:
                return None
            timings[name] = Timing(name, dict(entry.schedule), float(entry.time))
    finally:
        cache.close()
    return params_from(timings)


def main(argv: list[str] | None = None) -> int:
    """Print the measured parameters as a `fuse` pipeline entry."""
    p = argparse.ArgumentParser(prog="python -m nfc.runtime.device_params",
                                description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--db", help="tuning cache file (default: nfc's)")
    p.add_argument("--refresh", action="store_true", help="measure again")
    p.add_argument("--no-store", action="store_true", help="do not write the cache")
    args = p.parse_args(argv)
    params = device_params(args.db, refresh=args.refresh, store=not args.no_store)
    print(f"fuse{{{params.pipeline_options()}}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
