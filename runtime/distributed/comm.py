"""The ranks of a data-parallel run: MPI through mpi4py (an optional extra, `pip install
nfc[distributed]`: the `mpich` wheel brings the MPI library and `mpiexec`).

A process belongs to a run of several ranks when the MPI launcher says so in its environment
(`PMI_SIZE` of MPICH's hydra, `OMPI_COMM_WORLD_SIZE` of Open MPI); mpi4py is imported only
then, so a plain `nfc train` never loads MPI.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
from typing import Any

import numpy as np

#: Environment variables in which MPI launchers give the number of ranks.
SIZE_VARS = ("PMI_SIZE", "OMPI_COMM_WORLD_SIZE", "MPI_LOCALNRANKS")


class DistributedError(RuntimeError):
    """A data-parallel run that cannot work (mpi4py missing, ranks that disagree)."""


def launched_size() -> int:
    """The number of ranks the MPI launcher started (1 outside mpiexec)."""
    for var in SIZE_VARS:
        val = os.environ.get(var, "")
        if val.isdigit() and int(val) > 0:
            return int(val)
    return 1


def launched_rank() -> int:
    """This process's rank according to the MPI launcher (0 outside mpiexec)."""
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK"):
        val = os.environ.get(var, "")
        if val.isdigit():
            return int(val)
    return 0


def have_mpi() -> bool:
    """Whether mpi4py imports (and so the `distributed` extra is installed)."""
    try:
        import mpi4py  # noqa: F401
    except ImportError:
        return False
    return True


def mpiexec() -> str | None:
    """The `mpiexec` next to this Python (the mpich wheel's, in a virtual environment), else
    the one on PATH."""
    here = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if os.access(here, os.X_OK):
        return here
    return shutil.which("mpiexec")


class Comm:
    """The world communicator: rank, size and the few collectives the runtime needs."""

    def __init__(self, comm: Any = None) -> None:
        if comm is None:
            try:
                from mpi4py import MPI
            except ImportError:
                raise DistributedError(
                    "this process was started by an MPI launcher with several ranks but "
                    "mpi4py is not installed: pip install 'nfc[distributed]' (mpich, mpi4py)"
                ) from None
            comm = MPI.COMM_WORLD
        self.comm = comm
        self.rank = int(comm.Get_rank())
        self.size = int(comm.Get_size())

    def allreduce_sum(self, buf: np.ndarray) -> None:
        """`buf` <- the elementwise sum of every rank's `buf` (in place)."""
        from mpi4py import MPI

        self.comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)

    def allgather(self, buf: np.ndarray, out: np.ndarray) -> None:
        """`out[r]` <- rank r's `buf` (raw bytes: any dtype, `out` of shape (size, *buf))."""
        self.comm.Allgather(buf.view(np.uint8), out.view(np.uint8))

    def mean(self, x: float) -> float:
        """The mean over the ranks of a number (the logged loss)."""
        a = np.array([x], dtype=np.float64)
        self.allreduce_sum(a)
        return float(a[0]) / self.size

    def barrier(self) -> None:
        self.comm.Barrier()

    def same(self, values: Any, what: str) -> None:
        """Refuse to go on when the ranks disagree on `values` (JSON data; compared by the
        SHA-256 of their JSON text, through buffers: mpi4py's object methods pickle)."""
        text = json.dumps(values, sort_keys=True)
        mine = np.frombuffer(hashlib.sha256(text.encode()).digest(), dtype=np.uint8).copy()
        every = np.empty((self.size, mine.size), dtype=np.uint8)
        self.allgather(mine, every)
        if not (every == mine).all():
            bad = [r for r in range(self.size) if not (every[r] == every[0]).all()]
            raise DistributedError(f"rank {bad[0]} disagrees with rank 0 on {what} "
                                   f"(rank {self.rank} has {text})")
