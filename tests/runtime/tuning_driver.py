"""A tuner process for the kill and concurrency tests:

    python tuning_driver.py DB --key K --seed S --trials N [--sleep SEC] [--log FILE]

Tunes `FakeSpace` under `CATEGORY` into DB and prints the result as JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys

from tuning_fakes import CATEGORY, FakeMeasure, FakeSpace

from nfc.runtime.tuning.cache import TuningCache
from nfc.runtime.tuning.search import SearchConfig, tune


def main() -> int:
    """Run one tuning job."""
    ap = argparse.ArgumentParser()
    ap.add_argument("db")
    ap.add_argument("--key", default="k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--population", type=int, default=8)
    ap.add_argument("--sleep", type=float, default=0.0)
    ap.add_argument("--log")
    args = ap.parse_args()
    config = SearchConfig(population=args.population, trials=args.trials, seed=args.seed,
                          patience=1000)
    with TuningCache(args.db) as cache:
        result = tune(FakeSpace(), FakeMeasure(sleep=args.sleep, log=args.log), cache=cache,
                      category=CATEGORY, key=args.key, config=config)
    json.dump(dataclasses.asdict(result), sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
