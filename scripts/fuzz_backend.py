"""Differential fuzzing of the CPU backend against the interpreter, for long runs.

    python scripts/fuzz_backend.py --cases 10000 --seed 1 --jobs 2 --save fuzz-failures/

Generates `.nf` models (and token mutants), builds each like `nfc compile`, runs `forward`
and one `train_step` and a few computes under random schedules, and compares every result
with the float32 error bound of the interpreter (tests/fuzz/backend_fuzz.py has the details).
Prints each failure with its program and a rerun command, a progress line every 100 cases and
at the end

    cases N, crashes C, hangs H, wrong W, rejected R

Exits with 1 when a case crashed, hung or computed a wrong result.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fuzz"))

import backend_fuzz  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000, help="number of cases")
    p.add_argument("--seed", type=int, default=0, help="campaign seed")
    p.add_argument("--start", type=int, default=0, help="first case index (to rerun one)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes")
    p.add_argument("--timeout", type=float, default=300.0,
                   help="seconds a case may take before it counts as a hang")
    p.add_argument("--schedules", type=int, default=2,
                   help="computes per case compiled with a random schedule")
    p.add_argument("--save", type=Path, default=None,
                   help="folder for the failing programs and their reports")
    p.add_argument("--file", type=Path, default=None,
                   help="check this .nf model (a saved reproducer) instead, in this process")
    args = p.parse_args(argv)
    if args.file is not None:
        outcome = backend_fuzz.check_source(args.file.read_text(encoding="utf-8"),
                                            schedules=args.schedules)
        print(f"{outcome.status}: {outcome.detail}")
        return 1 if outcome.status in ("crash", "wrong") else 0
    t0 = time.monotonic()
    campaign = backend_fuzz.Campaign(
        seed=args.seed, cases=args.cases, start=args.start, jobs=args.jobs,
        timeout=args.timeout, schedules=args.schedules, save=args.save,
        log=lambda line: print(line, flush=True))

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, stop)
    try:
        campaign.run()
    except KeyboardInterrupt:  # the summary of the cases done so far
        print("interrupted", flush=True)
    print(f"{campaign.summary()}; {campaign.checked} result elements checked, "
          f"{campaign.unchecked} without a finite bound; {time.monotonic() - t0:.0f} s",
          flush=True)
    print(campaign.summary(), flush=True)
    return 1 if campaign.failures else 0


if __name__ == "__main__":
    sys.exit(main())
