"""The CUDA backend's coverage of the example models: per model and function, its kernels, their
kinds, whether NVRTC compiles them for sm_80 and sm_90, their largest register count and shared
memory, and the simulator's largest error against the interpreter.

    python scripts/cuda_coverage.py                       # every model, reduced sizes
    python scripts/cuda_coverage.py --wmma all            # + contractions on Tensor Cores
    python scripts/cuda_coverage.py models/bert.nf --full # the sizes of the .nf file
    python scripts/cuda_coverage.py --no-simulate         # compile only

Sizes are `nfc.codegen.cuda.coverage.REDUCED` (batch 1-4) unless `--full`. Kernels and checks
are those of tests/cuda/test_cuda_all_models.py (docs/cuda.md, "Coverage"). Columns:
`kernels` (default schedules; `+n` Tensor Core kernels of `--wmma`), the kinds (elementwise,
reduce, gemm on CUDA cores, wmma with its precision), `sm_80`/`sm_90` (`ok` or the error),
`regs` and `smem` (the largest per kernel, over both architectures and all the kernels),
`f32 err` for the kernels on CUDA cores: the largest normwise relative error (max |sim - ref| /
max |ref| of a kernel) and in parentheses the largest error over its tolerance (twice the
errbound of any f32 evaluation order; <= 1 passes), `wmma err` the same for Tensor Core
kernels and their per-precision bound.
Exits with 1 when a kernel fails to lower, compile or match.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from collections.abc import Sequence

from nfc.codegen.cuda import coverage as cov
from nfc.runtime.build import backend_module

KINDS = ("elementwise", "reduce", "gemm")


def _compile(cases: Sequence[cov.Case], arch: str, row: dict, problems: list[str]) -> None:
    try:
        res = cov.compile_cases(cases, arch)
    except Exception as exc:  # noqa: BLE001 - reported in the table
        row[arch] = type(exc).__name__
        problems.append(f"{arch}: {exc}")
        return
    row[arch] = "ok"
    if res:
        row["regs"] = max(row.get("regs", 0), max(r.registers for r in res.values()))
        row["smem"] = max(row.get("smem", 0), max(r.shared_bytes for r in res.values()))


def _simulate(cases: Sequence[cov.Case], row: dict, problems: list[str]) -> None:
    worst = {"f32": [0.0, 0.0], "wmma": [0.0, 0.0]}
    for c in cases:
        try:
            checks = cov.check_case(c)
        except Exception as exc:  # noqa: BLE001 - reported in the table
            problems.append(f"{c.program.name}: {type(exc).__name__}: {exc}")
            continue
        for r in checks:
            w = worst["wmma" if r.kind == "wmma" else "f32"]
            w[0], w[1] = max(w[0], r.rel_error), max(w[1], r.ratio)
            if not r.ok:
                problems.append(f"{r.kernel}: {r.problem}")
    row["f32"], row["wmma_err"] = worst["f32"], worst["wmma"]


def _kind(k) -> str:
    kind = cov.kernel_kind(k)
    return f"{kind} {k.schedule.precision}" if kind == "wmma" else kind


def model_rows(name: str, args: argparse.Namespace) -> list[dict]:
    """A row per function of model `name`."""
    params = {} if args.full else cov.REDUCED[name]
    module = backend_module(cov.examples_dir() / name, params)
    precs = (cov.WMMA_PRECISIONS if args.wmma == "all" else
             (cov.wmma_precision(cov.example_models().index(name)),) if args.wmma == "one"
             else ())
    rows = []
    for f in module.funcs:
        t0 = time.perf_counter()
        problems: list[str] = []
        cases = cov.model_cases(module, functions=[f.name])
        wmma = [c for p in precs for c in cov.model_cases(module, p, functions=[f.name])]
        kernels = cov.case_kernels(cases)
        kinds = Counter(_kind(k) for k in cov.case_kernels(cases + wmma))
        row: dict = {"model": name, "function": f.name, "kernels": len(kernels),
                     "wmma": len(cov.case_kernels(wmma)), "kinds": kinds}
        for arch in ("sm_80", "sm_90"):
            _compile(cases + wmma, arch, row, problems)
        if not args.no_simulate:
            _simulate(cases + wmma, row, problems)
        row["problems"], row["seconds"] = problems, time.perf_counter() - t0
        rows.append(row)
    return rows


def _cells(r: dict) -> list[str]:
    order = [*KINDS, *(f"wmma {p}" for p in cov.WMMA_PRECISIONS)]
    kinds = ", ".join(f"{r['kinds'][k]} {k}" for k in order if r["kinds"][k])
    f32 = "-" if "f32" not in r else f"{r['f32'][0]:.1e} ({r['f32'][1]:.2f})"
    wmma = ("-" if not r["wmma"] or "wmma_err" not in r
            else f"{r['wmma_err'][0]:.1e} ({r['wmma_err'][1]:.2f})")
    n = f"{r['kernels']}" + (f"+{r['wmma']}" if r["wmma"] else "")
    return [r["model"], r["function"], n, kinds, r["sm_80"], r["sm_90"],
            str(r.get("regs", "-")), str(r.get("smem", "-")), f32, wmma]


HEAD = ["model", "function", "kernels", "kinds", "sm_80", "sm_90", "regs", "smem", "f32 err",
        "wmma err"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("models", nargs="*", help="models relative to examples/ (default: all)")
    p.add_argument("--full", action="store_true", help="the sizes of the .nf files")
    p.add_argument("--wmma", choices=("none", "one", "all"), default="one",
                   help="Tensor Core kernels: none, the model's precision (default), all three")
    p.add_argument("--no-simulate", action="store_true", help="compile only")
    args = p.parse_args(argv)
    names = args.models or cov.example_models()
    unknown = [n for n in names if n not in cov.REDUCED]
    if unknown:
        print(f"error: unknown models {unknown}; known: {sorted(cov.REDUCED)}", file=sys.stderr)
        return 1
    print("| " + " | ".join(HEAD) + " |")
    print("|" + "---|" * len(HEAD))
    failed = []
    for name in names:
        for r in model_rows(name, args):
            print("| " + " | ".join(_cells(r)) + " |", flush=True)
            failed += [f"{name} {r['function']}: {x}" for x in r["problems"]]
    for line in failed:
        print(line[:2000], file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
