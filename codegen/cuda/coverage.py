"""Every example model through the CUDA backend: the kernels of every function, compiled by
NVRTC and simulated kernel by kernel against the interpreter (tests/cuda/test_cuda_all_models.py
and scripts/cuda_coverage.py; docs/cuda.md, "Coverage").

    module = backend_module(path, REDUCED[name])     # nfc.runtime.build: as `nfc compile`
    cases = model_cases(module)                      # a GpuProgram per compute or group
    resources = compile_cases(cases, "sm_90")        # one translation unit, limits checked
    results = check_case(cases[0])                   # each kernel simulated vs nfc.interp

A kernel is checked on its own: its inputs are the interpreter's values of what it reads (the
program's inputs, drawn at random, or the interpreter's results of the stages before it), and
its output is compared with the interpreter's result of its stage:

- f32 on CUDA cores (`fma`, elementwise, reductions): within `SLACK` times the bound of
  `nfc.testing.errbound` on the rounding error of any f32 evaluation order of the stage (a
  sum of K terms gets a bound proportional to K and to the magnitudes of its terms); where
  that bound is not finite (a division by a value whose error covers zero), within 1e-5
  relative and 1e-6 absolute of the interpreter's f32 result; inf and NaN where the
  interpreter has them;
- integers and booleans: equal;
- Tensor Cores (`f16`, `bf16`, `tf32` inputs, f32 accumulation; see `wmma_tolerance`):
  `|got - want| <= (3u + K 2^-23) sum_k |a_k b_k| + eta sum_k (|a_k| + |b_k|) + 2 u_out |want|`
  per element, and a mean error at most `u sqrt(K)` times the mean of `sum_k |a_k b_k|`.

Inputs are uniform in [-1, 1) (integers in {0, 1}: labels and token ids stay in range); when
the interpreter's results of a program hold an inf or a NaN with those (the square root of a
negative running variance), the program is drawn again from [0.1, 1): the simulator's
`max`/`min` ignore NaN like `fmaxf`, the interpreter's do not (docs/cuda.md).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nfc.codegen.cuda.lower import GpuKernel, GpuProgram, lower_program
from nfc.codegen.cuda.nvrtc import Resources
from nfc.codegen.cuda.schedule import GemmSchedule
from nfc.codegen.cuda.sim import simulate_kernel
from nfc.codegen.cuda.simexpr import fill_value, storage_dtype
from nfc.codegen.cuda.space import classify, default_gpu_schedule
from nfc.codegen.lower import group_of, group_stages
from nfc.ir import (
    Binary,
    Block,
    Call,
    ComputeOp,
    Expr,
    Func,
    KernelOp,
    Module,
    Op,
    ReturnOp,
    Value,
)

#: Unit roundoff of the inputs of each inner product (fma: f32 itself).
UNIT = {"fma": 2.0**-24, "f16": 2.0**-11, "bf16": 2.0**-8, "tf32": 2.0**-11}
#: Half the spacing of the subnormals of each WMMA input precision: the absolute error of
#: rounding a tiny operand (f16 flushes gradients of 1e-6 to a few ulps; bf16 and tf32 have
#: f32's exponent range).
ETA = {"f16": 2.0**-25, "bf16": 2.0**-134, "tf32": 2.0**-134}
#: Tensor Core precisions, in the order `wmma_precision` hands them to models.
WMMA_PRECISIONS = ("f16", "bf16", "tf32")
#: Fallback tolerance of f32 elements without a finite error bound.
RTOL, ATOL = 1e-5, 1e-6

#: Reduced parameters of every example model (relative to examples/): batch 1-4, small
#: widths, so that every kernel of every function simulates in seconds.
REDUCED: dict[str, dict[str, int]] = {
    "capsule.nf": {"batch": 1},
    "lenet5.nf": {"batch": 4},  # a bias gradient over 2304 elements: a block reduction
    "lstm_cell.nf": {"batch": 2, "steps": 2, "features": 4, "hidden": 8, "classes": 3},
    "milstm.nf": {"batch": 2, "steps": 2, "features": 4, "hidden": 8, "classes": 3},
    "mlp.nf": {"batch": 2, "inputs": 20, "hidden1": 16, "hidden2": 12, "classes": 4},
    "mlp_digits.nf": {"batch": 2},
    "resnet_block.nf": {"batch": 2},
    "shufflenet_unit.nf": {"batch": 2},
    "models/bert.nf": {"batch": 1, "seq": 8, "vocab": 16, "hidden": 16, "heads": 2,
                       "ffn": 32, "layers": 1, "classes": 2},
    "models/capsnet.nf": {"batch": 1, "image": 12, "kernel": 3, "channels": 8, "types": 2,
                          "pdim": 4, "ddim": 4, "classes": 3, "rounds": 2},
    "models/lltm.nf": {"batch": 2, "steps": 2, "inputs": 16, "state_size": 8, "classes": 4},
    "models/lstm_lm.nf": {"batch": 2, "steps": 3, "vocab": 16, "embed": 8, "hidden": 8},
    "models/mi_lstm.nf": {"batch": 2, "steps": 2, "inputs": 16, "hidden": 8, "classes": 4},
    "models/mobilenet.nf": {"batch": 2, "image": 8, "width": 4, "classes": 4},
    "models/resnet18.nf": {"batch": 2, "image": 8, "width": 4, "classes": 4},
    "models/sc_rnn.nf": {"batch": 2, "steps": 2, "inputs": 16, "hidden": 8, "context": 4,
                         "classes": 4},
    "models/squeezenet.nf": {"batch": 2, "image": 16, "squeeze": 2, "classes": 4},
    "models/sublstm.nf": {"batch": 2, "steps": 2, "inputs": 16, "hidden": 8, "classes": 4},
}
_MODEL = re.compile(r"^\s*model\s+\w+", re.MULTILINE)


def examples_dir() -> Path:
    """The repository's examples/ folder."""
    return Path(__file__).resolve().parents[2] / "examples"


def example_models(root: Path | None = None) -> list[str]:
    """Every `.nf` file of examples/ and examples/models/ that declares a model, relative to
    examples/ (examples/models/layers.nf holds only layers)."""
    root = root or examples_dir()
    files = sorted(root.glob("*.nf")) + sorted((root / "models").glob("*.nf"))
    return [p.relative_to(root).as_posix() for p in files
            if _MODEL.search(p.read_text(encoding="utf-8"))]


@dataclass
class Case:
    """One compute or group of one function and its program."""

    function: str
    index: int
    op: ComputeOp | KernelOp
    program: GpuProgram
    stages: list[ComputeOp]
    precision: str = "fma"
    """`fma`: the default schedules; a WMMA precision: the GEMM stages on Tensor Cores."""


def wmma_precision(n: int) -> str:
    """The Tensor Core precision the n-th model gets in the default test run."""
    return WMMA_PRECISIONS[n % len(WMMA_PRECISIONS)]


def model_cases(module: Module, precision: str = "fma",
                functions: Sequence[str] | None = None) -> list[Case]:
    """A case per compute or kernel op of each function (default schedules), kernels named
    `<function>_<n>[_<stage>]` like `nfc compile --target cuda`. With a WMMA `precision`,
    only the programs with a contraction stage, whose contractions get that precision's
    default Tensor Core schedule (kernels named `<function>_<n>_<precision>...`)."""
    out = []
    for f in module.funcs:
        if functions is not None and f.name not in functions:
            continue
        ops = [op for op in f.body.ops if isinstance(op, ComputeOp | KernelOp)]
        for n, op in enumerate(ops):
            stages = [st for st, _ in group_stages(op, None)]
            if precision == "fma":
                prog = lower_program(op, name=f"{f.name}_{n}")
            else:
                gemm = [classify(st) == "gemm" for st in stages]
                if not any(gemm):
                    continue
                scheds = [default_gpu_schedule(st, precision) if g else None
                          for st, g in zip(stages, gemm, strict=True)]
                prog = lower_program(op, scheds, name=f"{f.name}_{n}_{precision}")
            out.append(Case(f.name, n, op, prog, stages, precision))
    return out


def sample(cases: Sequence[Case], n: int) -> list[Case]:
    """At most `n` of `cases`, evenly spread over them in function order, the first and the
    last always among them (a deterministic sample)."""
    if len(cases) <= n:
        return list(cases)
    if n <= 1:
        return list(cases[:n])
    picks = sorted({round(i * (len(cases) - 1) / (n - 1)) for i in range(n)})
    return [cases[i] for i in picks]


def case_kernels(cases: Sequence[Case]) -> list[GpuKernel]:
    """The kernels of `cases` to compile and check: all of them, but of a WMMA case only its
    Tensor Core stages' kernels (the others are the default cases' kernels again)."""
    out = []
    for c in cases:
        stages = stage_kernels(c)
        out += [k for k in c.program.kernels if c.precision == "fma" or _precision(k) != "fma"
                or k.func.name not in stages]
    return out


def _precision(k: GpuKernel) -> str:
    return k.schedule.precision if isinstance(k.schedule, GemmSchedule) else "fma"


def kernel_kind(k: GpuKernel) -> str:
    """`wmma`, `gemm` (CUDA cores), `reduce` or `elementwise`."""
    return "wmma" if _precision(k) != "fma" else k.kind


def compile_cases(cases: Sequence[Case], arch: str) -> dict[str, Resources]:
    """The kernels of `cases` rendered as one translation unit and compiled by NVRTC for
    `arch`, resources checked (ResourceError past a limit); resources per kernel."""
    from nfc.codegen.cuda.program import compile_program

    kernels = case_kernels(cases)
    compiled = compile_program(kernels, arch)
    return {k.func.name: compiled.resources[k.func.name] for k in kernels}


@dataclass
class KernelCheck:
    """One kernel simulated against the interpreter."""

    kernel: str
    kind: str
    precision: str
    elements: int
    max_error: float
    """Largest |simulated - reference| (float outputs; 0 for integers)."""
    ratio: float
    """Largest error over its tolerance (<= 1 passes)."""
    rel_error: float
    """`max_error` over the largest |reference| (normwise relative error)."""
    unchecked: int
    """Float elements checked against the fallback tolerance instead of a bound."""
    positive: bool
    """Whether the inputs were redrawn positive (module docstring)."""
    problem: str | None = None

    @property
    def ok(self) -> bool:
        """Within tolerance."""
        return self.problem is None


def _isolated(args: Sequence[Value], ops: Sequence[Op], results: Sequence[Value]) -> Func:
    """A function of clones of `ops` (the module's ops stay where they are)."""
    mapping: dict[Value, Value] = {a: Value(a.type, a.name) for a in args}
    body: list[Op] = [op.clone(mapping) for op in ops]
    return Func("f", [mapping[a] for a in args],
                Block([*body, ReturnOp([mapping[r] for r in results])]))


def random_inputs(values: Sequence[Value], rng: np.random.Generator,
                  positive: bool = False) -> list[np.ndarray]:
    """Inputs of `values` (module docstring)."""
    out = []
    for v in values:
        if v.dtype.value == "i1":
            out.append(rng.random(v.shape) < 0.5)
        elif v.dtype.is_int:
            out.append(rng.integers(0, 2, v.shape).astype(v.dtype.numpy))
        else:
            lo = 0.1 if positive else -1.0
            out.append(rng.uniform(lo, 1.0, v.shape).astype(v.dtype.numpy))
    return out


def _stage_values(case: Case, seed: int) -> tuple[dict[int, np.ndarray], bool]:
    """id(value) -> the interpreter's array, for the program's inputs and every stage result;
    whether the inputs had to be positive."""
    from nfc.interp import run

    ops, _, ins = group_of(case.op)
    results = [st.result for st in case.stages]
    func = _isolated(ins, ops, results)
    for positive in (False, True):
        arrays = random_inputs(ins, np.random.default_rng(seed), positive)
        with np.errstate(all="ignore"):
            got = run(func, arrays)
        finite = all(np.isfinite(g).all() for g in got if g.dtype.kind == "f")
        if finite or positive:
            break
    values = {id(v): a for v, a in zip(ins, arrays, strict=True)}
    values.update({id(v): a for v, a in zip(results, got, strict=True)})
    return values, positive


def stage_kernels(case: Case) -> dict[str, ComputeOp]:
    """Kernel name -> its stage, for the kernels that compute a stage (a GEMM schedule may
    add kernels before its stage's, packing operands into temporaries)."""
    prog, n = case.program, len(case.stages)
    names = [prog.name] if n == 1 else [f"{prog.name}_{i}" for i in range(n)]
    return dict(zip(names, case.stages, strict=True))


def check_case(case: Case, seed: int = 0) -> list[KernelCheck]:
    """Every stage kernel of `case` (`case_kernels`) simulated on the interpreter's values of
    its inputs and compared with the interpreter's result of its stage (module docstring).
    The kernels run in program order on one set of buffers, so a packing kernel's
    temporaries reach its GEMM; after a stage kernel is checked, its output buffer gets the
    interpreter's result back, which the next kernels read."""
    values, positive = _stage_values(case, seed)
    _, _, ins = group_of(case.op)
    prog = case.program
    stages = stage_kernels(case)
    kernels = {k.func.name: k for k in prog.kernels}
    names = {id(v): b.name for v, b in zip(ins, prog.params[prog.n_outputs:], strict=True)}
    names.update({id(st.result): kernels[kn].func.params[0].name
                  for kn, st in stages.items()})

    def stored(v: Value) -> np.ndarray:
        return np.ascontiguousarray(values[id(v)], storage_dtype(v.dtype)).reshape(-1).copy()
    arrays = {b.name: np.full(b.size, fill_value(b.dtype), storage_dtype(b.dtype))
              for b in (*prog.params, *prog.temps)}
    for v in [*ins, *(st.result for st in stages.values())]:
        arrays[names[id(v)]] = stored(v)
    wanted = {k.func.name for k in case_kernels([case])}
    out = []
    for k in prog.kernels:
        st = stages.get(k.func.name)
        if st is None:  # packs operands for a later stage kernel
            simulate_kernel(k, arrays)
            continue
        if k.func.name not in wanted:
            continue
        name = names[id(st.result)]
        arrays[name][:] = fill_value(st.result.dtype)
        simulate_kernel(k, arrays)
        got = arrays[name].reshape(st.result.shape).copy()
        arrays[name] = stored(st.result)
        out.append(_compare(k, st, got, values, positive))
    return out


def _compare(k: GpuKernel, st: ComputeOp, got: np.ndarray, values: dict[int, np.ndarray],
             positive: bool) -> KernelCheck:
    want = values[id(st.result)]
    prec = _precision(k)
    res = KernelCheck(k.func.name, kernel_kind(k), prec, int(got.size), 0.0, 0.0, 0.0, 0,
                      positive)
    if got.dtype.kind != "f":
        bad = int((got != want).sum())
        if bad:
            res.problem = f"{bad} of {got.size} elements differ"
        return res
    special = ~np.isfinite(want)
    if not np.array_equal(np.isnan(got), np.isnan(want)) or not np.array_equal(
            got[np.isinf(want)], want[np.isinf(want)]):
        res.problem = "inf/NaN elements differ from the interpreter's"
        return res
    ins = [values[id(v)] for v in st.operands]
    if prec == "fma":
        value, tol, res.unchecked = _f32_tolerance(st, ins, want)
    else:
        value, tol = want.astype(np.float64), wmma_tolerance(st, ins, prec, want)
    with np.errstate(all="ignore"):
        err = np.where(special, 0.0, np.abs(got.astype(np.float64) - value))
        res.max_error = float(err.max(initial=0.0))
        scale = float(np.abs(np.where(special, 0.0, value)).max(initial=0.0))
        res.rel_error = res.max_error / scale if scale > 0 else res.max_error
        ratio = np.where(special, 0.0, err / np.maximum(tol, 1e-300))
    res.ratio = float(ratio.max(initial=0.0))
    if res.ratio > 1.0:
        i = np.unravel_index(int(np.argmax(ratio)), ratio.shape)
        res.problem = (f"{int((ratio > 1).sum())} of {got.size} elements out of tolerance; "
                       f"worst at {tuple(int(j) for j in i)}: got {got[i]!r}, reference "
                       f"{value[i]!r}, tolerance {tol[i]:.3g}")
    elif prec != "fma":
        res.problem = _wmma_mean(st, ins, prec, err)
    return res


def _f32_tolerance(st: ComputeOp, ins: list[np.ndarray], want: np.ndarray
                   ) -> tuple[np.ndarray, np.ndarray, int]:
    """(float64 reference, tolerance per element, elements on the fallback tolerance)."""
    from nfc.testing import SLACK, run_bounded

    func = _isolated(st.operands, [st], [st.result])
    with np.errstate(all="ignore"):
        ((value, bound),) = run_bounded(func, ins)
    tol = SLACK * np.asarray(bound, np.float64)
    loose = ~(np.isfinite(value) & np.isfinite(tol))
    w64 = want.astype(np.float64)
    value = np.where(loose, w64, value)
    tol = np.where(loose, RTOL * np.abs(w64) + ATOL, tol)
    return value, tol, int((loose & np.isfinite(want)).sum())


def _sums(st: ComputeOp, ins: list[np.ndarray], body: Expr) -> np.ndarray:
    """`sum_k body` over the contraction's reduction axes, in float64 (the interpreter's
    float64 twin, nfc.testing.run_bounded)."""
    from nfc.testing import run_bounded

    op = ComputeOp(st.result.type, st.dims, body, reduce="sum", raxes=st.raxes)
    ((value, _),) = run_bounded(_isolated(st.operands, [op], [op.result]), ins)
    return np.asarray(value, np.float64)


def wmma_tolerance(st: ComputeOp, ins: list[np.ndarray], precision: str,
                   want: np.ndarray) -> np.ndarray:
    """The per-element tolerance of a contraction on Tensor Cores (module docstring): every
    product carries up to 2u of relative error from rounding its operands to the precision
    (u its unit roundoff) plus eta per operand below the normal range, the interpreter's own
    f32 products u_f32, the f32 sums about K 2^-24 on each side, an f16/bf16 output one
    rounding on each side."""
    body = st.body
    assert isinstance(body, Binary) and body.op == "*", "a contraction's body is a product"
    k = math.prod(a.extent for a in st.raxes)
    mag = _sums(st, ins, Call("abs", (body,)))
    ends = _sums(st, ins, Call("abs", (body.a,)) + Call("abs", (body.b,)))
    u = UNIT[precision]
    u_out = UNIT.get(st.result.dtype.value, 0.0)
    return ((3 * u + k * 2.0**-23) * mag * 1.01 + ETA[precision] * ends * 1.01
            + 2 * u_out * np.abs(want.astype(np.float64)) + 1e-30)


def _wmma_mean(st: ComputeOp, ins: list[np.ndarray], precision: str, err: np.ndarray
               ) -> str | None:
    """The typical error is of the order of u sqrt(K) times the magnitudes."""
    body = st.body
    assert isinstance(body, Binary)
    k = math.prod(a.extent for a in st.raxes)
    mag = _sums(st, ins, Call("abs", (body,)))
    ends = _sums(st, ins, Call("abs", (body.a,)) + Call("abs", (body.b,)))
    limit = UNIT[precision] * math.sqrt(k) * float(np.mean(mag)) + ETA[precision] * float(
        np.mean(ends))
    mean = float(np.mean(err))
    return None if mean <= limit else f"mean error {mean:.3g} above u sqrt(K) bound {limit:.3g}"


__all__ = ["REDUCED", "WMMA_PRECISIONS", "Case", "KernelCheck", "case_kernels",
           "check_case", "compile_cases", "example_models", "examples_dir", "kernel_kind",
           "model_cases", "random_inputs", "sample", "stage_kernels", "wmma_precision",
           "wmma_tolerance"]
