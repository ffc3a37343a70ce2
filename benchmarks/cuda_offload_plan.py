"""Planned arena saving of activation offload on the CUDA target (planning only, no GPU).

    .venv/bin/python benchmarks/cuda_offload_plan.py                    # lenet5 resnet18 capsnet
    .venv/bin/python benchmarks/cuda_offload_plan.py resnet18 --link pcie4 --json out.json

For each bench model at its bench settings (nfc.runtime.bench.models), the `train_step` of the
build pipeline, with fusion (what `nfc compile --target cuda` builds) and without, is lowered
to a CudaStep (nfc.codegen.cuda.step) twice: without offload and with `offload=
OffloadOptions(device, link)` (the values whose round trip the cost model of passes/offload.py
hides behind compute, prefetched from the op where the remaining compute covers the copy). It
prints the values and bytes offloaded and the arena without and with offload, and for
comparison the arena when every saved value of at least 64 KiB goes out (`hidden_only=False`,
fetched one op before its first backward reader: what a link fast enough would allow). Nothing
runs: these are the static plans' sizes; whether the copies really hide needs a GPU.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEFAULT_MODELS = ("lenet5", "resnet18", "capsnet")


def plan(name: str, fuse: bool, device: str, link: str) -> dict:
    """The offload plan's numbers of one model's `train_step`."""
    from nfc.codegen.cuda.offload import OffloadOptions
    from nfc.codegen.cuda.step import build_cuda_step
    from nfc.runtime.bench.models import resolve
    from nfc.runtime.build import build_module, pipeline_for

    bm = resolve(name)
    module, _ = build_module(bm.file, bm.settings(), None, pipeline_for(bm.file, fuse=fuse),
                             model=bm.model)
    t = time.perf_counter()
    base = build_cuda_step(module, ["train_step"])
    off = build_cuda_step(module, ["train_step"], offload=OffloadOptions(device, link))
    every = build_cuda_step(module, ["train_step"],
                            offload=OffloadOptions(device, link, hidden_only=False, lead=1))
    f0, f1, f2 = base.funcs["train_step"], off.funcs["train_step"], every.funcs["train_step"]
    return {"model": name, "settings": bm.settings(), "fuse": fuse, "device": device,
            "link": link, "ops": len(module.func("train_step").body.ops),
            "values": len(f1.offload), "bytes": sum(o.nbytes for o in f1.offload),
            "arena_without": f0.arena_bytes, "arena_with": f1.arena_bytes,
            "every_values": len(f2.offload), "every_bytes": sum(o.nbytes for o in f2.offload),
            "arena_every": f2.arena_bytes,
            "build_s": round(time.perf_counter() - t, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("models", nargs="*", default=list(DEFAULT_MODELS))
    ap.add_argument("--device", default="h100")
    ap.add_argument("--link", default="pcie5")
    ap.add_argument("--json", type=pathlib.Path)
    args = ap.parse_args(argv)
    rows = []
    print("| model | fused | ops | values | bytes | arena without | arena with | saving | "
          "every saved value: values, arena |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in args.models:
        for fuse in (True, False):
            r = plan(name, fuse, args.device, args.link)
            rows.append(r)
            mib = 1 << 20
            saving = r["arena_without"] - r["arena_with"]
            print(f"| {name} | {'yes' if fuse else 'no'} | {r['ops']} | {r['values']} | "
                  f"{r['bytes'] / mib:.2f} MiB | {r['arena_without'] / mib:.2f} MiB | "
                  f"{r['arena_with'] / mib:.2f} MiB | {saving / mib:.2f} MiB "
                  f"({100 * saving / max(1, r['arena_without']):.1f}%) | "
                  f"{r['every_values']}, {r['arena_every'] / mib:.2f} MiB |", flush=True)
    if args.json:
        from nfc.fsutil import atomic_write

        atomic_write(args.json, (json.dumps(rows, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
