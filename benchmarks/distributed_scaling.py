"""Data-parallel step time on 1 and 2 local ranks (1 thread each): nfc over MPI next to
PyTorch DDP with the gloo backend, the all-reduce's α and β on this machine, and the effect
of fp16/bf16 gradient compression on the loss (docs/distributed.md, docs/performance.md).

    python benchmarks/distributed_scaling.py                         # everything, ~10 min
    python benchmarks/distributed_scaling.py --models mlp3 --rounds 2 --what scaling
    python benchmarks/distributed_scaling.py --what alpha-beta

Weak scaling: every rank runs the batch of the seed model's torch twin per step
(benchmarks/torch_models.py: mlp3 256, lenet5 64, lltm 64), so 2 ranks do twice the work
of 1 per step and the scaling efficiency is t(1 rank) / t(2 ranks) (1.0: perfect). The
single-rank runs are plain processes (no data-parallel pass, no DDP wrapper). Runs of nfc
and torch alternate within every round (A B A B ...) and each figure is the median over
rounds of each run's median step.

The sub-commands `nfc-rank`, `torch-run` and `sweep-rank` are what the driver launches.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

#: benchmark name -> (torch twin key, per-rank batch)
MODELS = {"mlp3": ("mlp3", 256), "lenet5": ("lenet5", 64), "lltm": ("lltm", 64)}
NF_FILES = {"mlp3": "examples/mlp.nf", "lenet5": "examples/lenet5.nf",
            "lltm": "examples/models/lltm.nf"}


def _mpiexec() -> str:
    from nfc.runtime.distributed import mpiexec

    exe = mpiexec()
    if exe is None:
        sys.exit("mpiexec not found: pip install 'nfc[distributed]'")
    return exe


def _env() -> dict[str, str]:
    return dict(os.environ, OMP_NUM_THREADS="1", OMP_WAIT_POLICY="passive",
                MKL_NUM_THREADS="1", PYTHONPATH=str(ROOT))


# ---- one nfc rank ------------------------------------------------------------------------------

def nfc_rank(model: str, batch: int, steps: int) -> None:
    from nfc.runtime.build import compile_model, pipeline_for
    from nfc.runtime.distributed import (
        Comm,
        DistOptions,
        launched_size,
        with_data_parallel,
    )
    from nfc.runtime.distributed.collective import Collective
    from nfc.runtime.loader import load

    src = str(ROOT / NF_FILES[model])
    comm = Comm() if launched_size() > 1 else None
    pipeline = with_data_parallel(pipeline_for(src), DistOptions()) if comm else None
    if comm is None or comm.rank == 0:
        built = compile_model(src, settings=[f"batch={batch}"], pipeline=pipeline)
    if comm is not None:
        comm.barrier()
        if comm.rank != 0:
            built = compile_model(src, settings=[f"batch={batch}"], pipeline=pipeline)
    m = load(built.path)
    m.init(0)
    m.set_num_threads(1)
    overlap = os.environ.get("NFC_BENCH_OVERLAP", "1") != "0"
    coll = Collective(m, comm, overlap=overlap) if comm is not None else None
    fn = m.functions["train_step"]
    bound = fn.bind()
    rng = np.random.default_rng(comm.rank if comm else 0)
    for arr in bound.inputs.values():
        if arr.dtype.kind in "iu":
            arr[...] = rng.integers(0, 10, arr.shape)
        else:
            arr[...] = rng.standard_normal(arr.shape)
    times = []
    for s in range(steps + 5):
        bound.rng[0], bound.rng[1] = 0, s
        t0 = time.perf_counter()
        out = bound()
        loss = float(out["loss"])
        if comm is not None:
            assert coll is not None
            coll.check()
            loss = comm.mean(loss)
        if s >= 5:
            times.append(time.perf_counter() - t0)
    if coll is not None:
        coll.close()
    grad_bytes = sum(int(np.prod(t["shape"])) * 4 for c in fn.meta.get("collectives", [])
                     for t in c["tensors"])
    if comm is None or comm.rank == 0:
        print(json.dumps({"step_s": statistics.median(times), "grad_bytes": grad_bytes,
                          "loss": loss}))


# ---- torch DDP ---------------------------------------------------------------------------------

def _torch_worker(rank: int, world: int, model: str, batch: int, steps: int, port: int,
                  out: str) -> None:
    import torch
    import torch.distributed as dist
    from torch_models import TWINS

    torch.set_num_threads(1)
    torch.manual_seed(0)
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    twin_cls = TWINS[MODELS[model][0]]
    twin = twin_cls(batch=batch)
    net: torch.nn.Module = twin
    if world > 1:
        dist.init_process_group("gloo", rank=rank, world_size=world)
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(twin)
    opt = torch.optim.SGD(twin.parameters(), lr=twin.LR, momentum=twin.MOMENTUM)
    ins = twin.torch_inputs(twin.make_inputs(np.random.default_rng(rank)))
    times = []
    for s in range(steps + 5):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = net(**ins)["loss"]
        loss.backward()
        opt.step()
        lv = loss.detach().clone()
        if world > 1:
            dist.all_reduce(lv)
        if s >= 5:
            times.append(time.perf_counter() - t0)
    if rank == 0:
        Path(out).write_text(json.dumps({"step_s": statistics.median(times)}))
    if world > 1:
        dist.destroy_process_group()


def torch_run(model: str, batch: int, steps: int, world: int) -> None:
    import socket
    import tempfile

    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fd, out = tempfile.mkstemp(suffix=".json")
    os.close(fd)
    try:
        if world == 1:
            _torch_worker(0, 1, model, batch, steps, port, out)
        else:
            mp.spawn(_torch_worker, args=(world, model, batch, steps, port, out), nprocs=world)
        print(Path(out).read_text())
    finally:
        os.unlink(out)


# ---- the all-reduce's α and β ------------------------------------------------------------------

SWEEP = [2 ** k for k in range(2, 25, 2)]  # 4 B .. 16 MiB


def sweep_rank(repeats: int) -> None:
    from nfc.runtime.distributed import Comm

    comm = Comm()
    res = {}
    for nbytes in SWEEP:
        buf = np.ones(nbytes // 4, np.float32)
        reps = max(3, min(repeats, int(2e8 // max(nbytes, 1))))
        ts = []
        for _ in range(reps):
            comm.barrier()
            t0 = time.perf_counter()
            comm.allreduce_sum(buf)
            ts.append(time.perf_counter() - t0)
        res[nbytes] = statistics.median(ts)
    if comm.rank == 0:
        print(json.dumps(res))


def fit_alpha_beta(times: dict[int, float], ranks: int = 2) -> tuple[float, float]:
    """t(n) = 2(R-1) α + 2(R-1)/R n β (the ring model) fitted to the sweep by relative least
    squares (each size's error relative to its time, so that the small sizes set α and the
    large ones β; plain least squares lets the largest sizes pull α negative)."""
    n = np.array([float(k) for k in times])
    t = np.array(list(times.values()))
    a = np.stack([np.full_like(n, 2 * (ranks - 1)), 2 * (ranks - 1) / ranks * n], axis=1)
    (alpha, beta), *_ = np.linalg.lstsq(a / t[:, None], np.ones_like(t), rcond=None)
    return float(alpha), float(beta)


# ---- the driver --------------------------------------------------------------------------------

def _run(cmd: list[str], timeout: float = 900) -> dict:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr[-3000:]}")
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    return json.loads(lines[-1])


def scaling(models: list[str], rounds: int, steps: int, with_torch: bool) -> dict:
    me = [sys.executable, str(Path(__file__).resolve())]
    runs: dict[str, dict[str, list[float]]] = {m: {} for m in models}
    grad: dict[str, int] = {}
    for r in range(rounds):
        for m in models:
            batch = MODELS[m][1]
            order = [("nfc", 1), ("nfc", 2)] + ([("torch", 1), ("torch", 2)] if with_torch
                                                else [])
            if r % 2:
                order.reverse()
            for fw, ranks in order:
                if fw == "nfc":
                    cmd = me + ["nfc-rank", m, str(batch), str(steps)]
                    if ranks > 1:
                        cmd = [_mpiexec(), "-n", str(ranks)] + cmd
                else:
                    cmd = me + ["torch-run", m, str(batch), str(steps), str(ranks)]
                res = _run(cmd)
                runs[m].setdefault(f"{fw}{ranks}", []).append(res["step_s"])
                if "grad_bytes" in res and ranks > 1:
                    grad[m] = res["grad_bytes"]
                print(f"round {r} {m} {fw} x{ranks}: {res['step_s'] * 1e3:.3f} ms",
                      file=sys.stderr)
    out = {}
    for m in models:
        med = {k: statistics.median(v) for k, v in runs[m].items()}
        row = {"batch_per_rank": MODELS[m][1], "grad_bytes": grad.get(m),
               "step_ms": {k: v * 1e3 for k, v in med.items()}, "raw_s": runs[m]}
        for fw in ("nfc", "torch"):
            if f"{fw}1" in med and f"{fw}2" in med:
                row[f"{fw}_efficiency"] = med[f"{fw}1"] / med[f"{fw}2"]
        out[m] = row
    return out


def alpha_beta(repeats: int) -> dict:
    me = [sys.executable, str(Path(__file__).resolve())]
    times = _run([_mpiexec(), "-n", "2"] + me + ["sweep-rank", str(repeats)])
    times = {int(k): float(v) for k, v in times.items()}
    alpha, beta = fit_alpha_beta(times)
    return {"times_s": times, "alpha_s": alpha, "beta_s_per_byte": beta,
            "bandwidth_GBps": 1e-9 / beta if beta > 0 else None}


def compression(steps: int) -> dict:
    """Final training loss and test accuracy of examples/mlp_digits.nf on 2 ranks for each
    gradient encoding (same seed, same data order)."""
    import tempfile

    out = {}
    for kind in ("none", "fp16", "bf16"):
        with tempfile.TemporaryDirectory() as d:
            metrics = Path(d) / "m.jsonl"
            cmd = [_mpiexec(), "-n", "2", sys.executable, "-m", "nfc", "train",
                   str(ROOT / "examples/mlp_digits.nf"), "--data", "digits", "--batch", "16",
                   "--max-steps", str(steps), "--compress", kind, "--quiet",
                   "--metrics", str(metrics)]
            proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
            if proc.returncode != 0:
                raise RuntimeError(proc.stderr[-3000:])
            recs = [json.loads(x) for x in metrics.read_text().splitlines()]
            losses = [r["loss"] for r in recs if r.get("event") == "step"]
            final = [r for r in recs if r.get("event") == "final"][-1]
            out[kind] = {"loss_last50": float(np.mean(losses[-50:])),
                         "test_accuracy": final.get("test_accuracy"),
                         "test_loss": final.get("test_loss")}
    return out


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv and argv[0] == "nfc-rank":
        nfc_rank(argv[1], int(argv[2]), int(argv[3]))
        return 0
    if argv and argv[0] == "torch-run":
        torch_run(argv[1], int(argv[2]), int(argv[3]), int(argv[4]))
        return 0
    if argv and argv[0] == "sweep-rank":
        sweep_rank(int(argv[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", default="mlp3,lenet5,lltm")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--what", default="scaling,alpha-beta,compression")
    ap.add_argument("--no-torch", action="store_true")
    ap.add_argument("--compress-steps", type=int, default=400)
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/distributed.json"))
    args = ap.parse_args(argv)
    what = set(args.what.split(","))
    load = os.getloadavg()
    res: dict = {"loadavg_before": load, "cpus": os.cpu_count()}
    if "alpha-beta" in what:
        res["alpha_beta"] = alpha_beta(200)
        print(json.dumps(res["alpha_beta"], indent=1), file=sys.stderr)
    if "scaling" in what:
        with_torch = not args.no_torch
        if with_torch:
            try:
                import torch  # noqa: F401
            except ImportError:
                with_torch = False
        res["scaling"] = scaling(args.models.split(","), args.rounds, args.steps, with_torch)
    if "compression" in what:
        res["compression"] = compression(args.compress_steps)
    res["loadavg_after"] = os.getloadavg()
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(res, indent=1) + "\n")
    print(json.dumps({k: v for k, v in res.items() if k != "alpha_beta"}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
