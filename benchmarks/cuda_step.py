"""Training step on an NVIDIA GPU: nfc's CUDA backend against PyTorch CUDA eager, side by side.

    .venv/bin/python benchmarks/cuda_step.py                  # mlp3 lenet5 lltm resnet18 on GPU 0
    .venv/bin/python benchmarks/cuda_step.py mlp3 --repeats 50 --json out.json
    .venv/bin/python benchmarks/cuda_step.py --simulate --quick  # no GPU: the CUDA kernels on the
                                                                 # simulator, PyTorch on the CPU

For each model: the module as `nfc compile` builds it (nfc.runtime.build), lowered to one CUDA
translation unit (nfc.codegen.cuda.step), compiled by NVRTC for the device's architecture and
loaded as a `CudaModel` (one arena allocation, the step captured as a CUDA Graph and replayed).
The PyTorch twin of benchmarks/torch_models.py is loaded with nfc's initial parameters, so both
start from the same state; the first losses of the two are printed and must agree (within the
f32 rounding of the two summation orders: 1e-4 relative). Then each trains `--repeats` steps on
the same batch: nfc timed with CUDA events (`CudaModel.time`), PyTorch with
`torch.cuda.synchronize()` around the steps; the ratio is PyTorch's time over nfc's (above 1,
nfc is faster). Kernels run with their default GPU schedules (no `nfc tune --target cuda`).

`--simulate` runs the same script where there is no GPU: nfc's kernels on the kernel
simulator (seconds per step; times are meaningless and not printed as ratios), PyTorch on the
CPU; it checks the script and the first-loss agreement, nothing about speed. `scripts/
gpu_check.sh` runs this script on a machine with a GPU.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "benchmarks"))

DEFAULT_MODELS = ("mlp3", "lenet5", "lltm", "resnet18")


def build_nfc(name: str, settings: dict, simulate: bool):
    """A CudaModel of the bench model `name` at `settings`, initialised with seed 0."""
    from nfc.codegen.cuda.step import build_cuda_step
    from nfc.runtime.bench.models import resolve
    from nfc.runtime.build import build_module
    from nfc.runtime.cuda_model import CudaModel, simulated_model

    bm = resolve(name)
    module, _ = build_module(bm.file, settings, model=bm.model)
    step = build_cuda_step(module)
    if simulate:
        model = simulated_model(step)
    else:
        from nfc.codegen.cuda.driver import Device

        with Device() as dev:  # the device's architecture picks the cubin
            arch = dev.arch if dev.arch in ("sm_80", "sm_90") else "sm_80"
        model = CudaModel(step, step.compile(archs=(arch,), ptx=True))
    model.init(seed=0)
    return bm, model


def torch_twin(bm, settings: dict, state: dict, device: str):
    import torch
    from torch_models import TWINS

    torch.manual_seed(0)
    twin = TWINS[bm.twin](**settings)
    twin.load(state)
    return twin.to(device)


def run(name: str, args) -> dict:
    import torch

    from nfc.runtime.bench.models import resolve

    bm = resolve(name)
    settings = bm.settings(quick=args.quick)
    t0 = time.perf_counter()
    bm, model = build_nfc(name, settings, args.simulate)
    build_s = time.perf_counter() - t0
    device = "cpu" if args.simulate else "cuda"
    twin = torch_twin(bm, settings, model.state_dict(), device)
    inputs = twin.make_inputs(np.random.default_rng(0))
    nfc_inputs = {s.name: np.ascontiguousarray(inputs[s.name], dtype=s.dtype)
                  for s in model.functions["train_step"].inputs}
    tin = {k: v.to(device) for k, v in twin.torch_inputs(inputs).items()}
    nfc_loss = float(model.train_step(**nfc_inputs)["loss"])
    torch_loss = twin.train_step(tin)
    rec = {"model": name, "settings": settings, "nfc_first_loss": nfc_loss,
           "torch_first_loss": torch_loss, "build_s": round(build_s, 2),
           "loss_agrees": bool(abs(nfc_loss - torch_loss) <= 1e-4 * max(1.0, abs(torch_loss)))}
    if args.simulate:
        return rec
    rec["nfc_ms"] = model.time("train_step", repeats=args.repeats, warmup=3)
    for _ in range(3):
        twin.train_step(tin)
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(args.repeats):
        twin.train_step(tin)
    torch.cuda.synchronize()
    rec["torch_ms"] = (time.perf_counter() - t) * 1e3 / args.repeats
    rec["torch_over_nfc"] = rec["torch_ms"] / rec["nfc_ms"]
    model.close()
    return rec


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--quick", action="store_true", help="the bench's small --quick sizes")
    ap.add_argument("--simulate", action="store_true",
                    help="no GPU: nfc on the kernel simulator, PyTorch on the CPU")
    ap.add_argument("--json", help="write the records here")
    args = ap.parse_args(argv)
    if not args.simulate:
        from nfc.codegen.cuda.driver import Device, NoDriverError

        try:
            with Device() as dev:
                print(f"device: {dev.name} ({dev.arch})")
        except NoDriverError as exc:
            print(f"cuda_step: {exc}; use --simulate to check the script without a GPU")
            return 1
    recs = []
    bad = 0
    for name in args.models:
        rec = run(name, args)
        recs.append(rec)
        bad += not rec["loss_agrees"]
        line = (f"{name:10s} first loss nfc {rec['nfc_first_loss']:.6f} torch "
                f"{rec['torch_first_loss']:.6f} ({'agree' if rec['loss_agrees'] else 'DIFFER'})")
        if "nfc_ms" in rec:
            line += (f"  step nfc {rec['nfc_ms']:.3f} ms  torch {rec['torch_ms']:.3f} ms  "
                     f"({rec['torch_over_nfc']:.2f}x)")
        print(line, flush=True)
    if args.json:
        from nfc.fsutil import atomic_write

        atomic_write(args.json, json.dumps(recs, indent=1).encode())
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
