"""nfc ops inside PyTorch (nfc.torch) against the same ops written with PyTorch primitives.

    .venv/bin/python benchmarks/torch_op.py [--threads 1 2] [--repeats 15] [--ops NAME ...]
                                            [--compile] [--json]

For each op, forward + backward (gradients for every input) on the same random float32
arguments and the same upstream gradient: the nfc op (`nfc.torch.load_op`, forward and
derived backward compiled by nfc, called through torch.library) against PyTorch eager on its
primitives (`--compile` adds the primitives under torch.compile's default backend). Both are
checked to agree before timing; repeats alternate between them so other load on the machine
hits both, and the median time per call is reported with the ratio torch / nfc (> 1: nfc is
faster), and the ratio of the fastest calls (less sensitive to other load on the machine).
Compilation happens before timing (libraries come from nfc's cache when present).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def _refs() -> dict[str, Callable[..., Any]]:
    import torch
    import torch.nn.functional as F

    def capsule_conv(a, k):  # noqa: ANN001, ANN202
        win = a.unfold(2, k.shape[2], 2).unfold(3, k.shape[3], 2)
        return torch.einsum("bcpqitrs,ocrstj->bopqij", win, k)

    def capsule_layer(a, k):  # noqa: ANN001, ANN202
        u = capsule_conv(a, k)
        n2 = (u * u).sum(dim=(-2, -1), keepdim=True)
        return u * (n2 / (1.0 + n2)) * torch.rsqrt(n2 + 1e-7)

    def lltm(x, h, c, w, b):  # noqa: ANN001, ANN202
        g = torch.cat([h, x], dim=1) @ w + b
        gi, go, gz = g.chunk(3, dim=1)
        c2 = c + F.elu(gz) * torch.sigmoid(gi)
        return torch.tanh(c2) * torch.sigmoid(go), c2

    def milstm(x, h, c, w, u, alpha, beta1, beta2, b):  # noqa: ANN001, ANN202
        wx, uh = x @ w, h @ u
        z = alpha * wx * uh + beta1 * uh + beta2 * wx + b
        zi, zf, zg, zo = z.chunk(4, dim=1)
        c2 = torch.sigmoid(zf) * c + torch.sigmoid(zi) * torch.tanh(zg)
        return torch.sigmoid(zo) * torch.tanh(c2), c2

    def channel_shuffle(x):  # noqa: ANN001, ANN202
        n, ch, hh, ww = x.shape
        return x.view(n, 4, ch // 4, hh, ww).transpose(1, 2).reshape(n, ch, hh, ww)

    return {"capsule_conv": capsule_conv, "capsule_layer": capsule_layer, "lltm_cell": lltm,
            "milstm_cell": milstm, "depth2space": lambda x: F.pixel_shuffle(x, 2),
            "channel_shuffle": channel_shuffle}


@dataclass
class Op:
    """One benchmarked op: where it is, its parameters, its argument shapes."""

    name: str
    source: str
    op: str
    params: dict[str, Any]
    shapes: list[tuple[int, ...]]


OPS = [
    Op("capsule_conv", "std.nn", "capsule_conv", {"stride": 2},
       [(32, 8, 12, 12, 4, 4), (16, 8, 3, 3, 4, 4)]),
    Op("capsule_layer", str(ROOT / "examples/torch_capsule/capsule.nf"), "capsule_layer", {},
       [(32, 8, 12, 12, 4, 4), (16, 8, 3, 3, 4, 4)]),
    # the PyTorch C++ extension tutorial's LLTM sizes: batch 64, input 784, state 128
    Op("lltm_cell", str(ROOT / "examples/models/lltm.nf"), "lltm_cell", {},
       [(64, 784), (64, 128), (64, 128), (912, 384), (384,)]),
    Op("milstm_cell", str(ROOT / "examples/milstm.nf"), "milstm_cell", {},
       [(64, 256), (64, 256), (64, 256), (256, 1024), (256, 1024), (1024,), (1024,), (1024,),
        (1024,)]),
    Op("depth2space", "std.nn", "depth2space", {"r": 2}, [(32, 64, 32, 32)]),
    Op("channel_shuffle", "std.nn", "channel_shuffle", {"groups": 4}, [(32, 64, 32, 32)]),
]


def _step(fn: Callable[..., Any], args: list[Any], ups: list[Any]) -> Callable[[], None]:
    import torch

    def run() -> None:
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        torch.autograd.backward(outs, ups)
        for a in args:
            a.grad = None
    return run


def _forward(fn: Callable[..., Any], args: list[Any]) -> Callable[[], None]:
    import torch

    def run() -> None:
        with torch.no_grad():
            fn(*args)
    return run


def _time(runs: dict[str, Callable[[], None]], repeats: int) -> dict[str, tuple[float, float]]:
    """(median, min) seconds per call of each run, alternating between them."""
    for run in runs.values():
        run()
        run()
    times: dict[str, list[float]] = {k: [] for k in runs}
    for _ in range(repeats):
        for k, run in runs.items():
            t0 = time.perf_counter()
            run()
            times[k].append(time.perf_counter() - t0)
    return {k: (statistics.median(v), min(v)) for k, v in times.items()}


def _check(spec: Op, nfc_fn: Callable[..., Any], ref: Callable[..., Any], args: list[Any],
           ups: list[Any]) -> float:
    """Largest difference of outputs and gradients, relative to their magnitude."""
    import torch

    def grads(fn: Callable[..., Any]) -> list[Any]:
        out = fn(*args)
        outs = out if isinstance(out, tuple) else (out,)
        return [o.detach() for o in outs] + list(torch.autograd.grad(outs, args, ups))

    worst = 0.0
    for a, b in zip(grads(nfc_fn), grads(ref), strict=True):
        worst = max(worst, float((a - b).abs().max()) / max(float(b.abs().max()), 1e-30))
    return worst


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark and print the table."""
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--ops", nargs="+", choices=[o.name for o in OPS])
    ap.add_argument("--compile", action="store_true",
                    help="also time the PyTorch formulation under torch.compile")
    ap.add_argument("--json", action="store_true", help="one JSON line per op and thread count")
    args = ap.parse_args(argv)

    import torch

    import nfc.torch

    refs = _refs()
    rows = []
    for spec in OPS:
        if args.ops and spec.name not in args.ops:
            continue
        t0 = time.perf_counter()
        op = nfc.torch.load_op(spec.source, spec.op, spec.params)
        g = torch.Generator().manual_seed(0)
        xs = [(torch.rand(s, generator=g) * 2 - 1).requires_grad_() for s in spec.shapes]
        out = op(*xs)
        outs = out if isinstance(out, tuple) else (out,)
        ups = [torch.rand(o.shape, generator=g) for o in outs]
        _step(op, xs, ups)()  # compiles the backward too
        build_s = time.perf_counter() - t0
        err = _check(spec, op, refs[spec.name], xs, ups)
        candidates = {"nfc": op, "torch": refs[spec.name]}
        if args.compile:
            candidates["torch_compile"] = torch.compile(refs[spec.name])
        for n in args.threads:
            torch.set_num_threads(n)
            op.native.set_num_threads(n)
            both = _time({k: _step(f, xs, ups) for k, f in candidates.items()}, args.repeats)
            fwd = _time({k: _forward(f, xs) for k, f in candidates.items()}, args.repeats)
            row = {"op": spec.name, "threads": n, "shapes": spec.shapes,
                   "nfc_fwd_bwd_ms": both["nfc"][0] * 1e3,
                   "torch_fwd_bwd_ms": both["torch"][0] * 1e3,
                   "speedup_fwd_bwd": both["torch"][0] / both["nfc"][0],
                   "nfc_fwd_bwd_min_ms": both["nfc"][1] * 1e3,
                   "torch_fwd_bwd_min_ms": both["torch"][1] * 1e3,
                   "speedup_fwd_bwd_min": both["torch"][1] / both["nfc"][1],
                   "nfc_fwd_ms": fwd["nfc"][0] * 1e3, "torch_fwd_ms": fwd["torch"][0] * 1e3,
                   "speedup_fwd": fwd["torch"][0] / fwd["nfc"][0],
                   "max_rel_diff": err, "nfc_build_s": build_s}
            if args.compile:
                row["torch_compile_fwd_bwd_ms"] = both["torch_compile"][0] * 1e3
                row["speedup_vs_compile"] = both["torch_compile"][0] / both["nfc"][0]
            rows.append(row)
            if args.json:
                print(json.dumps(row), flush=True)
    if not args.json:
        head = (f"{'op':<16}{'thr':>4}{'nfc f+b ms':>12}{'torch f+b ms':>14}{'torch/nfc':>11}"
                f"{'(min)':>7}{'nfc fwd ms':>12}{'torch fwd ms':>14}{'torch/nfc':>11}"
                f"{'rel diff':>10}")
        if args.compile:
            head += f"{'compile f+b':>13}{'compile/nfc':>13}"
        print(head)
        for r in rows:
            line = (f"{r['op']:<16}{r['threads']:>4}{r['nfc_fwd_bwd_ms']:>12.3f}"
                    f"{r['torch_fwd_bwd_ms']:>14.3f}{r['speedup_fwd_bwd']:>11.2f}"
                    f"{r['speedup_fwd_bwd_min']:>7.2f}{r['nfc_fwd_ms']:>12.3f}"
                    f"{r['torch_fwd_ms']:>14.3f}{r['speedup_fwd']:>11.2f}{r['max_rel_diff']:>10.1e}")
            if args.compile:
                line += f"{r['torch_compile_fwd_bwd_ms']:>13.3f}{r['speedup_vs_compile']:>13.2f}"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
