"""Convolution and GEMM kernels as a fraction of the machine's fp32 peak, on one thread.

    python benchmarks/conv_peak.py [--models lenet5,resnet18,mobilenet] [--sweep] [--repeat 20]
    python benchmarks/conv_peak.py --trees /tmp/old,. [--rounds 2]   # two checkouts, alternating

The peak is measured in the same run with a vendor BLAS, before and after the kernels: the best
of numpy's OpenBLAS (native kernels: `OPENBLAS_CORETYPE` dropped) and PyTorch's `torch.mm`
(MKL) on a 2048 x 2048 x 2048 fp32 GEMM, one thread. Then
every convolution kernel of the `@train_step` of the models (the build pipeline up to the
schedules: `im2col,training-functions,inline,canonicalize,cse,dce`; a convolution runs as the
im2col gather plus a GEMM over the columns, a grouped or depthwise one as its own kernel) is
compiled alone with its default schedule and timed on random inputs: the forward GEMM (`fwd`),
the GEMM into the column gradient or the direct input gradient (`dx`), the weight gradient
(`dw`), the gather (`cols`) and the scatter back of the column gradient (`col2im`), each with
its GFLOP/s and % of the peak (gathers and scatters count their multiply-adds as 0, so their
time is shown, not a percentage; a direct kernel counts every point of its iteration space,
padding taps included). `--sweep` adds square and skinny GEMMs against `torch.mm`.
`--depthwise` adds 3 x 3 depthwise convolutions (MobileNet's, the ShuffleNet unit's; forward,
input and weight gradient) against PyTorch's (`conv2d` with groups = C, `torch.nn.grad`),
timed interleaved, with the bytes each must move and its time against the roofline bound
max(FLOPs / peak, bytes / copy bandwidth), the bandwidth measured by a copy of the same size.

Times are the best of `--repeat` timings on the CPU clock of the calling thread (every
library here computes on the calling thread when limited to one), and kernels are called
through their function pointer on a prepared argument array, as a model's artifact calls
them, not through `JitKernel.run`'s argument checks.

With `--trees A,B` every tree runs this script in a subprocess of its own (its sources first
on PYTHONPATH), the trees alternating for `--rounds` rounds; each subprocess measures its own
peak, so the % of peak columns are comparable under a changing load. The medians of the
rounds are printed side by side. A tree may carry environment settings for its runs,
`--trees .:NFC_STRIDED_LOADS=0,.` (the same checkout with and without strided vector loads).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

MODELS = {"lenet5": "examples/lenet5.nf", "resnet18": "examples/models/resnet18.nf",
          "mobilenet": "examples/models/mobilenet.nf"}
PIPELINE = "im2col,training-functions,inline,canonicalize,cse,dce"


#: The clock: CPU time of the calling thread (every library here runs on the calling thread
#: when limited to one), so time the scheduler gives other jobs on a loaded machine is not
#: counted; they still share the caches and the memory bus.
CLOCK = time.thread_time


def _time(fn: Callable[[], object], repeat: int, min_s: float = 0.02) -> float:
    """Best of `repeat` timings, each over enough calls to last `min_s` (the best: on a loaded
    machine the other jobs only ever slow a run down)."""
    fn()
    t = CLOCK()
    fn()
    one = max(CLOCK() - t, 1e-6)
    inner = max(1, int(min_s / one))
    times = []
    for _ in range(repeat):
        t = CLOCK()
        for _ in range(inner):
            fn()
        times.append((CLOCK() - t) / inner)
    return min(times)


_NUMPY_PEAK = """
import sys, time
import numpy as np
from threadpoolctl import threadpool_limits
n, repeat = 2048, int(sys.argv[1])
rng = np.random.default_rng(0)
a = rng.standard_normal((n, n), dtype=np.float32)
b = rng.standard_normal((n, n), dtype=np.float32)
best = float("inf")
with threadpool_limits(1):
    a @ b
    for _ in range(repeat):
        t = time.thread_time()
        a @ b
        best = min(best, time.thread_time() - t)
print(2 * n ** 3 / best / 1e9)
"""


def peak_gflops(repeat: int) -> dict[str, float]:
    """fp32 GFLOP/s of a 2048^3 GEMM on one thread with numpy's OpenBLAS (in a subprocess
    without `OPENBLAS_CORETYPE`/`OPENBLAS_L2_SIZE`, which some machines set to force an old
    AVX2 kernel) and with PyTorch's `torch.mm` (MKL, which on AMD CPUs takes its AVX2 path)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")}
    out: dict[str, float] = {}
    res = subprocess.run([sys.executable, "-c", _NUMPY_PEAK, str(max(3, repeat // 3))],
                         env=env, capture_output=True, text=True, check=True)
    out["openblas"] = float(res.stdout.strip().splitlines()[-1])
    try:
        import torch
    except ImportError:
        return out
    n = 2048
    rng = np.random.default_rng(0)
    torch.set_num_threads(1)
    ta = torch.from_numpy(rng.standard_normal((n, n), dtype=np.float32))
    tb = torch.from_numpy(rng.standard_normal((n, n), dtype=np.float32))
    out["torch"] = 2 * n ** 3 / _time(lambda: torch.mm(ta, tb), max(3, repeat // 3)) / 1e9
    return out


def _role(op: Any, params: set[tuple[int, ...]], forward: bool) -> str:
    from nfc.contraction import match_contraction
    from nfc.ir import Load

    shape = tuple(op.result.type.shape)
    if op.attrs.get("nf.im2col"):
        return "cols"
    if op.reduce != "sum" or not op.raxes:
        return ""
    c = match_contraction(op)
    if c is None:
        lds = [x for x in op.body.walk() if isinstance(x, Load)]
        if len(lds) == 1:
            return "col2im" if len(lds[0].tensor.type.shape) > 4 else ""
        if len(lds) != 2:
            return ""
    if shape in params:
        return "dw"
    if len(shape) < 4:
        return ""
    if len(shape) > 4:
        return "dx"
    if c is None:
        # a direct (grouped, depthwise) convolution or its input gradient
        return "fwd" if forward else "dx"
    a, b = (tuple(x.tensor.type.shape) for x in (c.a, c.b))
    if len(a) > 4 or len(b) > 4:
        return "fwd"
    return ""


def conv_kernels(model: str, settings: dict[str, Any]) -> list[tuple[str, Any, float]]:
    """(role, compute, multiply-adds) of the convolution kernels of a model's train step."""
    from nfc.ir import ComputeOp
    from nfc.runtime.build import build_module
    from nfc.runtime.tuning.kernels import collect_kernels

    mod, _ = build_module(model, settings or None, pipeline=PIPELINE)
    fwd = mod.func("forward")
    params = {tuple(a.type.shape) for a in fwd.args if len(a.type.shape) == 4}
    in_forward = {k.key for k in collect_kernels(mod, ["forward"])}
    out = []
    for k in collect_kernels(mod, ["train_step"]):
        op = k.op
        if not isinstance(op, ComputeOp):
            continue
        role = _role(op, params, k.key in in_forward)
        if not role:
            continue
        if role in ("fwd", "dx", "dw"):
            macs = math.prod(a.extent for a in op.all_axes)
            if not any(len(v.type.shape) >= 4 for v in op.operands):
                continue
        else:
            macs = 0.0
        out.append((role, op, float(macs)))
    return out


def _caller(kernel: Any, outs: list[np.ndarray], ins: list[np.ndarray]) -> Callable[[], None]:
    """A call of the compiled function on a prepared argument array, as a model's artifact
    calls it (`JitKernel.run` checks and converts its arguments on every call, microseconds
    that would swamp the smallest kernels)."""
    import ctypes

    kernel.run(outs, ins)  # checks the arguments once
    ptrs = [a.ctypes.data for a in (*outs, *ins)]
    if kernel._workspace is not None:
        ptrs.append(kernel._workspace.ctypes.data)
    buf = (ctypes.c_void_p * max(1, len(ptrs)))(*ptrs)
    fn = kernel._fn
    return lambda: fn(buf)


def _inputs(kernel: Any, rng: np.random.Generator) -> list[np.ndarray]:
    return [rng.standard_normal(v.shape).astype(v.dtype.numpy) for v in kernel.info.inputs]


def _describe(op: Any) -> str:
    from nfc.runtime.tuning.kernels import describe

    return describe(op).split(" (")[0]


def measure_convs(models: list[str], repeat: int) -> list[dict[str, Any]]:
    from nfc.codegen.jit import compile_kernel

    rng = np.random.default_rng(0)
    rows = []
    for name in models:
        for role, op, macs in conv_kernels(MODELS.get(name, name), {}):
            k = compile_kernel(op)
            ins = _inputs(k, rng)
            outs = [np.empty(v.shape, v.dtype.numpy) for v in k.info.outputs]
            t = _time(_caller(k, outs, ins), repeat)
            rows.append({"model": name, "role": role, "shape": _describe(op),
                         "gflops": 2 * macs / t / 1e9, "us": t * 1e6})
    return rows


#: Depthwise cases (groups == channels, 3 x 3): (label, batch, channels, size, stride, padding):
#: MobileNet's two depthwise layers (examples/models/mobilenet.nf), the ShuffleNet unit's
#: (examples/shufflenet_unit.nf) and a wider late MobileNet layer.
DEPTHWISE = [("mobilenet d1", 16, 32, 16, 1, 1), ("mobilenet d2", 16, 64, 16, 2, 1),
             ("shufflenet", 8, 8, 8, 1, 1), ("late layer", 16, 128, 8, 1, 1)]

_DW_MODEL = """\
import std.nn

model dw(batch = {n}, channels = {c}, size = {h}, classes = 4) {{
  input  x: f32[batch, channels, size, size]
  input  y: i32[batch]
  param  k0: f32[channels, 1, 1, 1] = he_normal
  param  k: f32[channels, 1, 3, 3] = he_normal
  param  wo: f32[channels, classes] = glorot_uniform
  param  bo: f32[classes] = zeros
  h = depthwise_conv2d<stride = {s}, padding = {p}>(depthwise_conv2d(x, k0), k)
  logits = linear(global_avg_pool(h), wo, bo)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}}
"""


def depthwise_kernels(n: int, c: int, h: int, s: int, p: int) -> dict[str, Any]:
    """The forward (`fwd`), input-gradient (`dx`) and weight-gradient (`dw`) computes of a
    3 x 3 depthwise convolution, as the build pipeline makes them (a 1 x 1 depthwise layer
    before it, so that its input has a gradient)."""
    import tempfile

    from nfc.ir import ComputeOp, Load
    from nfc.runtime.build import build_module
    from nfc.runtime.tuning.kernels import collect_kernels

    with tempfile.TemporaryDirectory() as d:
        src = Path(d) / "dw.nf"
        src.write_text(_DW_MODEL.format(n=n, c=c, h=h, s=s, p=p))
        mod, _ = build_module(src, pipeline=PIPELINE)
    forward = {k.key for k in collect_kernels(mod, ["forward"])}
    found: dict[str, Any] = {}
    for k in collect_kernels(mod, ["train_step"]):
        op = k.op
        if not isinstance(op, ComputeOp) or op.reduce != "sum" or not op.raxes:
            continue
        shapes = [tuple(x.tensor.type.shape) for x in op.body.walk() if isinstance(x, Load)]
        w = (c, 1, 3, 3)
        if tuple(op.result.type.shape) == w:
            found["dw"] = op
        elif w in shapes and any(len(x) == 4 and x != w for x in shapes):
            found["fwd" if k.key in forward else "dx"] = op
    return found


def copy_bandwidth(nbytes: int, repeat: int) -> float:
    """Bytes per second of a copy (read + write counted) of `nbytes / 2` bytes: the
    bandwidth of the cache level a working set of `nbytes` lives in."""
    a = np.ones(max(1, nbytes // 8), np.float32)
    b = np.empty_like(a)
    return 2 * a.nbytes / _time(lambda: np.copyto(b, a), repeat)


def measure_depthwise(repeat: int, peak: float) -> list[dict[str, Any]]:
    """nfc's depthwise kernels (default schedules) and PyTorch's (`conv2d` with groups = C and
    its `torch.nn.grad` gradients, one thread), timed interleaved; each with its GFLOP/s, %
    of `peak`, the bytes it must move (inputs and output once) and its time as a fraction of
    the roofline bound max(FLOPs / peak, bytes / copy bandwidth at that working set)."""
    import torch
    import torch.nn.functional as F  # noqa: N812
    from torch.nn import grad as tgrad

    from nfc.codegen.jit import compile_kernel

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    for label, n, c, h, s, p in DEPTHWISE:
        ops = depthwise_kernels(n, c, h, s, p)
        o = (h + 2 * p - 3) // s + 1
        x = torch.from_numpy(rng.standard_normal((n, c, h, h), dtype=np.float32))
        k = torch.from_numpy(rng.standard_normal((c, 1, 3, 3), dtype=np.float32))
        dy = torch.from_numpy(rng.standard_normal((n, c, o, o), dtype=np.float32))
        torch_fn = {
            "fwd": lambda x=x, k=k, s=s, p=p, c=c: F.conv2d(x, k, None, s, p, 1, c),
            "dx": lambda x=x, k=k, dy=dy, s=s, p=p, c=c: tgrad.conv2d_input(
                x.shape, k, dy, s, p, 1, c),
            "dw": lambda x=x, k=k, dy=dy, s=s, p=p, c=c: tgrad.conv2d_weight(
                x, k.shape, dy, s, p, 1, c)}
        for role in ("fwd", "dx", "dw"):
            op = ops[role]
            kern = compile_kernel(op)
            ins = _inputs(kern, rng)
            outs = [np.empty(v.shape, v.dtype.numpy) for v in kern.info.outputs]
            call = _caller(kern, outs, ins)
            tn = tt = float("inf")
            for _ in range(3):  # interleaved
                tn = min(tn, _time(call, repeat))
                tt = min(tt, _time(torch_fn[role], repeat))
            flops = 2.0 * n * c * o * o * 9  # every tap, padding taps included
            nbytes = 4 * (sum(math.prod(v.shape) for v in (*kern.info.inputs,
                                                          *kern.info.outputs)))
            bw = copy_bandwidth(nbytes, repeat)
            bound = max(flops / (peak * 1e9), nbytes / bw)
            rows.append({"case": f"{label} {n}x{c}x{h}x{h} s{s}", "role": role,
                         "nfc_us": tn * 1e6, "torch_us": tt * 1e6,
                         "gflops": flops / tn / 1e9, "mbytes": nbytes / 1e6,
                         "gbs": nbytes / tn / 1e9, "bw": bw / 1e9,
                         "roofline": bound / tn})
    return rows


def _print_depthwise(rows: list[dict[str, Any]], peak: float) -> None:
    print(f"{'case':32s} {'kernel':6s} {'nfc us':>8s} {'torch us':>9s} {'torch/nfc':>9s} "
          f"{'GFLOP/s':>8s} {'%peak':>6s} {'MB':>6s} {'GB/s':>6s} {'copy GB/s':>9s} "
          f"{'%roofline':>9s}")
    for r in rows:
        print(f"{r['case']:32s} {r['role']:6s} {r['nfc_us']:8.1f} {r['torch_us']:9.1f} "
              f"{r['torch_us'] / r['nfc_us']:9.2f} {r['gflops']:8.1f} "
              f"{100 * r['gflops'] / peak:5.1f}% {r['mbytes']:6.2f} {r['gbs']:6.1f} "
              f"{r['bw']:9.1f} {100 * r['roofline']:8.1f}%")


SWEEP = [(s, s, s) for s in (16, 64, 256, 1024)] + [
    (m, 1024, 1024) for m in (16, 64, 256)] + [(1024, n, 1024) for n in (16, 64, 256)] + [
    (1024, 1024, k) for k in (16, 64, 256)] + [(64, 64, 1024), (16, 256, 256), (256, 16, 256)]


def measure_sweep(repeat: int) -> list[dict[str, Any]]:
    import torch

    from nfc.codegen.jit import compile_kernel
    from nfc.ir import Axis, ComputeOp, DType, Index, Load, TensorType, Value

    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    rows = []
    for m, n, kk in SWEEP:
        a_v = Value(TensorType((m, kk), DType.F32), "A")
        b_v = Value(TensorType((kk, n), DType.F32), "B")
        op = ComputeOp(TensorType((m, n), DType.F32), (Axis("i", m), Axis("j", n)),
                       Load(a_v, (Index("i"), Index("k"))) * Load(b_v, (Index("k"), Index("j"))),
                       reduce="sum", raxes=(Axis("k", kk),))
        kern = compile_kernel(op)
        a = rng.standard_normal((m, kk), dtype=np.float32)
        b = rng.standard_normal((kk, n), dtype=np.float32)
        c = np.empty((m, n), np.float32)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        call = _caller(kern, [c], [a, b])
        tn = tt = float("inf")
        for _ in range(2):  # interleaved
            tn = min(tn, _time(call, repeat))
            tt = min(tt, _time(lambda: torch.mm(ta, tb), repeat))  # noqa: B023
        err = float(np.abs(c - a @ b).max() / (np.abs(a) @ np.abs(b)).max())
        fl = 2.0 * m * n * kk
        rows.append({"shape": f"{m}x{n}x{kk}", "nfc": fl / tn / 1e9, "torch": fl / tt / 1e9,
                     "err": err})
    return rows


def run_once(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement: peak, conv kernels, sweep (peak measured before and after)."""
    from nfc.codegen.jit import set_num_threads

    set_num_threads(1)
    p0 = peak_gflops(args.repeat)
    convs = measure_convs([m for m in args.models.split(",") if m], args.repeat)
    sweep = measure_sweep(args.repeat) if args.sweep else []
    depthwise = measure_depthwise(args.repeat, max(p0.values())) if args.depthwise else []
    p1 = peak_gflops(args.repeat)
    peak = max(max(p0.values()), max(p1.values()))
    return {"peak": peak, "peaks": [p0, p1], "convs": convs, "sweep": sweep,
            "depthwise": depthwise, "load": os.getloadavg()[0]}


def _print(res: dict[str, Any], label: str = "") -> None:
    peak = res["peak"]
    print(f"{label}fp32 peak (vendor sgemm 2048^3, 1 thread): {peak:.1f} GFLOP/s "
          f"{res['peaks']}; load average {res['load']:.2f}")
    print(f"{'model':10s} {'kernel':6s} {'shape':34s} {'us':>9s} {'GFLOP/s':>8s} {'%peak':>6s}")
    for r in res["convs"]:
        pct = f"{100 * r['gflops'] / peak:5.1f}%" if r["gflops"] else "     -"
        print(f"{r['model']:10s} {r['role']:6s} {r['shape']:34s} {r['us']:9.1f} "
              f"{r['gflops']:8.1f} {pct:>6s}")
    if res.get("depthwise"):
        _print_depthwise(res["depthwise"], peak)
    if res["sweep"]:
        print(f"{'gemm MxNxK':16s} {'nfc':>8s} {'torch':>8s} {'nfc/torch':>9s} {'%peak':>6s}")
        for r in res["sweep"]:
            print(f"{r['shape']:16s} {r['nfc']:8.1f} {r['torch']:8.1f} "
                  f"{100 * r['nfc'] / r['torch']:8.1f}% {100 * r['nfc'] / peak:5.1f}%")


def compare(trees: list[str], argv: list[str], rounds: int) -> None:
    """Run every tree `rounds` times, alternating, and print medians side by side."""
    results: dict[str, list[dict[str, Any]]] = {t: [] for t in trees}
    here = Path(__file__).resolve()
    for r in range(rounds):
        for t in (trees if r % 2 == 0 else list(reversed(trees))):
            path, _, sets = t.partition(":")  # `tree:VAR=VALUE+VAR=VALUE`
            env = dict(os.environ, PYTHONPATH=str(Path(path).resolve()))
            env.update(kv.split("=", 1) for kv in sets.split("+") if "=" in kv)
            out = subprocess.run([sys.executable, str(here), *argv, "--json"], env=env,
                                 capture_output=True, text=True, check=True)
            results[t].append(json.loads(out.stdout.strip().splitlines()[-1]))
    loads = [x["load"] for t in trees for x in results[t]]
    peaks = {t: statistics.median(x["peak"] for x in results[t]) for t in trees}
    print(f"trees {trees}, {rounds} rounds; peak medians "
          + ", ".join(f"{peaks[t]:.1f}" for t in trees)
          + f" GFLOP/s; load average {min(loads):.1f}-{max(loads):.1f}")

    def med(t: str, kind: str, n: int, key: str) -> float:
        return statistics.median(x[kind][n][key] / (x["peak"] if key != "us" else 1)
                                 for x in results[t])

    first = results[trees[0]][0]
    print(f"{'model':10s} {'kernel':6s} {'shape':34s} "
          + " ".join(f"{'%pk/us ' + str(i):>12s}" for i in range(len(trees))))
    for n, r in enumerate(first["convs"]):
        key = "gflops" if r["gflops"] else "us"
        vals = []
        for t in trees:
            v = med(t, "convs", n, key)
            vals.append(f"{100 * v:11.1f}%" if key == "gflops" else f"{v:10.1f}us")
        print(f"{r['model']:10s} {r['role']:6s} {r['shape']:34s} " + " ".join(vals))
    if first.get("depthwise"):
        print(f"{'depthwise case':32s} {'kernel':6s} "
              + " ".join(f"{'us/%roof ' + str(i):>16s}" for i in range(len(trees)))
              + " " + " ".join(f"{'torch/nfc ' + str(i):>11s}" for i in range(len(trees))))
        for n, r in enumerate(first["depthwise"]):
            us = [statistics.median(x["depthwise"][n]["nfc_us"] for x in results[t])
                  for t in trees]
            roof = [statistics.median(x["depthwise"][n]["roofline"] for x in results[t])
                    for t in trees]
            vs = [statistics.median(x["depthwise"][n]["torch_us"] / x["depthwise"][n]["nfc_us"]
                                    for x in results[t]) for t in trees]
            print(f"{r['case']:32s} {r['role']:6s} "
                  + " ".join(f"{u:8.1f}/{100 * f:5.1f}%" for u, f in zip(us, roof, strict=True))
                  + " " + " ".join(f"{v:11.2f}" for v in vs))
    if first["sweep"]:
        print(f"{'gemm MxNxK':16s} " + " ".join(f"{'nfc/torch ' + str(i):>12s}"
                                                for i in range(len(trees))))
        for n, r in enumerate(first["sweep"]):
            vals = [statistics.median(x["sweep"][n]["nfc"] / x["sweep"][n]["torch"]
                                      for x in results[t]) for t in trees]
            print(f"{r['shape']:16s} " + " ".join(f"{100 * v:11.1f}%" for v in vals))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="lenet5,resnet18,mobilenet",
                    help="comma-separated: lenet5, resnet18, mobilenet or .nf paths")
    ap.add_argument("--sweep", action="store_true", help="also the GEMM shape sweep")
    ap.add_argument("--depthwise", action="store_true",
                    help="also depthwise kernels against PyTorch, with their roofline")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--trees", default="", help="comma-separated checkouts to compare")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--json", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.trees:
        sub = ["--models", args.models, "--repeat", str(args.repeat)]
        if args.sweep:
            sub.append("--sweep")
        if args.depthwise:
            sub.append("--depthwise")
        compare(args.trees.split(","), sub, args.rounds)
        return 0
    os.chdir(Path(__file__).resolve().parent.parent)
    res = run_once(args)
    if args.json:
        print(json.dumps(res))
    else:
        _print(res)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
