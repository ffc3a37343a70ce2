"""Whole programs and modules through the CUDA pipeline: lower, render, compile, check.

    programs = module_programs(module)               # every compute of every function
    source = render_kernels([k for p in programs for k in p.kernels])
    compiled = compile_program(programs[0], "sm_90") # NVRTC, resources checked
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from nfc.codegen.cuda.lower import GpuKernel, GpuProgram, lower_program
from nfc.codegen.cuda.nvrtc import (
    ARCHS,
    CompiledModule,
    ResourceError,
    check_resources,
    compile_cuda,
)
from nfc.codegen.cuda.render import RenderError, render_kernel, render_kernels
from nfc.codegen.cuda.schedule import GpuScheduleError
from nfc.codegen.loops import print_loops
from nfc.diagnostics import CompileError, Diagnostic
from nfc.ir import ComputeOp, KernelOp, Module


def compile_program(program: GpuProgram | Sequence[GpuKernel], arch: str = "sm_80", *,
                    check: bool = True, use_cache: bool = True) -> CompiledModule:
    """Render and compile the kernels to a cubin for `arch`; with `check`, ResourceError when
    a kernel breaks the target's limits (nfc.codegen.cuda.nvrtc.check_resources).

    With `check`, a kernel that spills registers is compiled again with less register
    pressure (`render_kernels`'s `relax`), up to `RELAX_LEVELS` times: first with
    `__launch_bounds__(threads, 1)` (under `__launch_bounds__(threads)` alone ptxas aims at a
    register count of its own, 64 at 128 threads, which spilled some GEMM tiles), then with
    its serial loops kept rolled (ptxas unrolled a 16-step tile copy inside the K loop of a
    tf32 GEMM and spilled at 255 registers). The other kernels keep the plain text."""
    kernels = list(program.kernels if isinstance(program, GpuProgram) else program)
    title = program.name if isinstance(program, GpuProgram) else ""
    compiled = compile_cuda(render_kernels(kernels, title), arch, use_cache=use_cache)
    relax: dict[str, int] = {}
    while check and (more := respill_bounds(compiled, kernels, relax)):
        relax.update(more)
        compiled = compile_cuda(render_kernels(kernels, title, relax=relax), arch,
                                use_cache=use_cache)
    if check:
        problems = []
        for k in kernels:
            res = compiled.resources.get(k.func.name)
            if res is None:
                problems.append(f"kernel '{k.func.name}': no resource usage in the NVRTC log")
                continue
            problems += [f"kernel '{k.func.name}' on {arch}: {p}"
                         for p in check_resources(k.block, res, arch)]
        if problems:
            raise ResourceError("; ".join(problems))
    return compiled


#: Register-pressure relief levels of `compile_program` (see `render_kernels`).
RELAX_LEVELS = 2


def respill_bounds(compiled: CompiledModule, kernels: Sequence[GpuKernel],
                   relax: Mapping[str, int] | None = None) -> dict[str, int]:
    """Kernel name -> its next relief level (`render_kernels`'s `relax`) for each kernel that
    spills registers in `compiled` and has a level left (`relax`: the levels it was
    compiled with)."""
    out = {}
    for k in kernels:
        res = compiled.resources.get(k.func.name)
        level = (relax or {}).get(k.func.name, 0)
        if res is not None and (res.spill_stores or res.spill_loads) and level < RELAX_LEVELS:
            out[k.func.name] = level + 1
    return out


def module_programs(module: Module, functions: Sequence[str] | None = None
                    ) -> list[GpuProgram]:
    """A program per compute or kernel op of each function (all, or those named), named
    `<function>_<n>` in op order, with default schedules. What the backend cannot lower or
    emit (a buffer beyond 32-bit indexing, an intrinsic with no CUDA spelling) is a
    CompileError at the compute's location."""
    out = []
    for f in module.funcs:
        if functions and f.name not in functions:
            continue
        n = 0
        for op in f.body.ops:
            if isinstance(op, ComputeOp | KernelOp):
                try:
                    prog = lower_program(op, name=f"{f.name}_{n}")
                    for k in prog.kernels:
                        render_kernel(k)
                except (GpuScheduleError, RenderError) as exc:
                    raise CompileError([Diagnostic(
                        "error", f"the CUDA backend cannot compile this: {exc}", op.loc)]
                        ) from None
                out.append(prog)
                n += 1
    return out


#: What `nfc compile --target cuda` can emit.
CUDA_EMITS = ("cuda", "cuda-loops")


def emit_text(module: Module, functions: Sequence[str] | None, what: str) -> str:
    """`nfc compile --emit=cuda` (one translation unit with every kernel of the functions) or
    `--emit=cuda-loops` (their GPU loop IR)."""
    programs = module_programs(module, functions)
    kernels = [k for p in programs for k in p.kernels]
    if what == "cuda-loops":
        return "\n".join(print_loops(k.func) for k in kernels)
    return render_kernels(kernels, f"{len(kernels)} kernels")


__all__ = ["ARCHS", "CUDA_EMITS", "RELAX_LEVELS", "compile_program", "emit_text",
           "module_programs", "respill_bounds"]
