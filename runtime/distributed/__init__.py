"""Beyond one process: data-parallel training over MPI and tuning on a dask cluster.

Data-parallel training (`mpiexec -n R nfc train model.nf ...`, or `nfc train --workers R`,
which launches that): every rank compiles the model with `--batch` samples per step (the
global batch is R times that) and the `data-parallel` pass (nfc.passes.data_parallel), whose
`nf.allreduce` ops the native step calls back into (`Collective`). Each step, every rank
takes its slice of the same global batch (one seeded order, nfc.runtime.data.BatchOrder over
the global batch), the gradients are averaged over the ranks between the backward and the
optimizer update, so the parameters stay identical everywhere and equal those of one process
with the global batch (up to the order of f32 sums). Rank 0 alone logs, evaluates and writes
checkpoints; they record the global batch, so a run resumes on any number of ranks whose
global batch is the same. See docs/distributed.md.

Tuning on a cluster: nfc.runtime.distributed.dask_tune (`nfc tune --cluster ADDR`).
"""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from nfc.runtime.distributed.comm import (
    Comm,
    DistributedError,
    have_mpi,
    launched_rank,
    launched_size,
    mpiexec,
)

__all__ = ["Comm", "DistOptions", "Distributed", "DistributedError", "have_mpi",
           "launch", "launched_rank", "launched_size", "mpiexec", "prepare", "with_data_parallel"]


@dataclass(frozen=True)
class DistOptions:
    """Options of a data-parallel run (`nfc train --bucket-kb/--compress/--bn/--no-overlap`)."""

    bucket_kb: int = 25600
    compress: str = "none"
    bn: str = "local"
    overlap: bool = True


def with_data_parallel(pipeline: str, opts: DistOptions) -> str:
    """`pipeline` with `data-parallel{...}` right after `training-functions` (at the front
    when it has none: a `.nfir` module given with its `@train_step`)."""
    dp = (f"data-parallel{{bucket-kb={opts.bucket_kb},compress={opts.compress},"
          f"bn={opts.bn}}}")
    parts = [p for p in _split(pipeline) if p]
    if any(p.split("{")[0] == "data-parallel" for p in parts):
        return pipeline
    names = [p.split("{")[0] for p in parts]
    at = names.index("training-functions") + 1 if "training-functions" in names else 0
    return ",".join(parts[:at] + [dp] + parts[at:])


def _split(text: str) -> list[str]:
    out, depth, cur = [], 0, ""
    for ch in text:
        depth += ch == "{"
        depth -= ch == "}"
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    out.append(cur.strip())
    return out


class Distributed:
    """This rank of a data-parallel run."""

    def __init__(self, comm: Comm, opts: DistOptions) -> None:
        self.comm = comm
        self.opts = opts
        self.rank = comm.rank
        self.size = comm.size
        self.collective: Any = None

    @property
    def is_root(self) -> bool:
        return self.rank == 0

    def open(self, open_model: Any) -> Any:
        """`open_model()` on rank 0 first (it compiles into the build cache), then on the
        others (which find the library there)."""
        if self.is_root:
            try:
                out = open_model()
            finally:
                self.comm.barrier()
            return out
        self.comm.barrier()
        return open_model()

    def attach(self, model: Any, batch: int) -> None:
        """Check the ranks agree on the model and the batch; register the collective."""
        from nfc.runtime.distributed.collective import Collective

        fm = model.metadata["functions"]["train_step"]
        self.comm.same([batch, fm["args"], fm.get("collectives")], "the model and --batch")
        self.collective = Collective(model, self.comm, overlap=self.opts.overlap)

    def shard(self, idx: Any) -> Any:
        """This rank's slice of the global batch `idx`."""
        n = len(idx) // self.size
        return idx[self.rank * n:(self.rank + 1) * n]

    def after_step(self, loss: float) -> float:
        """Raise what failed in the step's collectives; the loss averaged over the ranks."""
        self.collective.check()
        return self.comm.mean(loss)

    def close(self) -> None:
        if self.collective is not None:
            self.collective.close()
            self.collective = None


def prepare(cfg: Any) -> tuple[Any, Distributed | None]:
    """The TrainConfig of this rank and its `Distributed` (None outside a run of several
    ranks, or with `cfg.distributed` None and no launcher around): the build pipeline gets the
    data-parallel pass; ranks other than 0 neither log, evaluate, plot nor write metrics."""
    from nfc.codegen.artifact.container import is_library_path
    from nfc.runtime.build import pipeline_for
    from nfc.runtime.train import TrainError

    if launched_size() <= 1:
        return cfg, None
    opts = cfg.distributed if isinstance(cfg.distributed, DistOptions) else DistOptions()
    comm = Comm()
    if comm.size <= 1:
        return cfg, None
    if is_library_path(cfg.source):
        raise TrainError("data-parallel training compiles the model with the data-parallel "
                         "pass: give the model file (.nf or .nfir), not a compiled library")
    if cfg.mode == "dynamic":
        raise TrainError("--mode dynamic does not combine with several ranks yet")
    text = with_data_parallel(pipeline_for(cfg.source, cfg.pipeline, im2col=cfg.im2col,
                                           tuning=cfg.tuning, fuse=cfg.fuse,
                                           layout=cfg.layout), opts)
    cfg = dataclasses.replace(cfg, pipeline=text)
    if comm.rank != 0:
        cfg = dataclasses.replace(cfg, metrics=None, plot=None, progress=False,
                                  evaluate=False, trace=None, log=lambda s: None)
    return cfg, Distributed(comm, opts)


def launch(workers: int, argv: Sequence[str], *, threads: int | None = None) -> int:
    """Run `nfc <argv>` on `workers` local ranks with mpiexec (`nfc train --workers N`);
    returns its exit status."""
    exe = mpiexec()
    if exe is None or not have_mpi():
        raise DistributedError("--workers needs MPI: pip install 'nfc[distributed]' (the mpich "
                               "and mpi4py wheels bring mpiexec and the bindings)")
    env = dict(os.environ)
    env.setdefault("OMP_NUM_THREADS", str(threads or 1))
    cmd = [exe, "-n", str(workers), sys.executable, "-m", "nfc", *argv]
    return subprocess.call(cmd, env=env)
