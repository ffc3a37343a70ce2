"""Run under `mpiexec -n R` by test_data_parallel.py: train each model given for a few steps
on R ranks with BATCH samples per rank, checkpointing into OUT/<model stem>-<bn>."""

from __future__ import annotations

import sys
from pathlib import Path

from nfc.runtime.distributed import DistOptions
from nfc.runtime.train import TrainConfig, train


def main(argv: list[str]) -> int:
    """OUT BATCH then runs `MODEL.nf,BN,STEPS` (checkpoints in OUT/<stem>-<bn>)."""
    out, batch = Path(argv[0]), int(argv[1])
    for run in argv[2:]:
        src, bn, steps = run.split(",")
        cfg = TrainConfig(source=src, data="digits", batch=batch, max_steps=int(steps), seed=0,
                          checkpoint=str(out / f"{Path(src).stem}-{bn}"), evaluate=False,
                          progress=False, threads=1,
                          distributed=DistOptions(bucket_kb=1, bn=bn))
        train(cfg)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
