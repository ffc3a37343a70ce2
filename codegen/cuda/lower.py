"""GPU lowering: a compute (or a group of computes) plus GPU schedules becomes loop-IR kernels.

A GPU kernel in the loop IR has one shape:

    blockIdx.x bx in 0..G {              # the grid (one block per iteration)
      alloc As: f16[64, 40] shared {     # shared memory of the block (zero or more)
        threadIdx.x tx in 0..T {         # the block: the body runs once per thread
          ...                            # serial/unrolled loops, stores, barriers, fragments
        }
      }
    }

The thread body is SPMD code: every thread runs it, barriers included, so control flow around
a barrier must be the same in every thread of a block (the simulator checks). Register
scalars (`alloc i: i32[] register`, stored once) name index values, which keeps the rendered
CUDA readable. One kernel per stage: a group (`nf.kernel`) inlines its elementwise producers as
on the CPU (`nfc.codegen.lower.group_stages`) and runs each remaining stage as its own kernel,
intermediates in global temporaries (`GpuProgram.temps`).

Elementwise stages and reductions are lowered here, contractions in `nfc.codegen.cuda.gemm`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from nfc.codegen.cuda.gpuir import WarpShuffle
from nfc.codegen.cuda.schedule import (
    ElementwiseSchedule,
    GemmSchedule,
    GpuSchedule,
    GpuScheduleError,
    ReduceSchedule,
)
from nfc.codegen.loops import (
    Allocate,
    Barrier,
    Buffer,
    BufLoad,
    For,
    If,
    LoopFunc,
    LoopKind,
    Scope,
    Seq,
    Stmt,
    Store,
    unique_name,
)
from nfc.codegen.lower import group_of, group_stages, identity
from nfc.codegen.lowering.tails import guarded as guard
from nfc.contraction import flatten, match_contraction
from nfc.ir import (
    Axis,
    Binary,
    ComputeOp,
    Const,
    DType,
    Expr,
    Index,
    KernelOp,
    Load,
    Loc,
    Select,
    Value,
    substitute_indices,
)

I32 = DType.I32
#: Largest buffer (elements) 32-bit index arithmetic reaches.
MAX_ELEMENTS = 2**31 - 1
#: Names the generated CUDA C must not use for variables (keywords, CUDA built-ins, helpers).
RESERVED = frozenset("""
    auto bool break case char const continue default do double else enum extern float for goto
    if inline int long return short signed sizeof static struct switch typedef union unsigned
    void volatile while half nv_bfloat16 min max abs blockIdx threadIdx blockDim gridDim
    warpSize wmma nvcuda main new delete class this template typename namespace using true
    false nullptr""".split())  # noqa: SIM905 - a word list reads better


@dataclass(frozen=True)
class GpuKernel:
    """One `__global__` function with its launch shape."""

    func: LoopFunc
    grid: int
    """Blocks (`gridDim.x`)."""
    block: int
    """Threads per block (`blockDim.x`)."""
    schedule: GpuSchedule
    kind: str
    """`elementwise`, `reduce` or `gemm`."""
    source: str = ""
    """The compute, one line (`out[i, j] = sum_k ...`), for a comment."""
    loc: Loc | None = None
    restrict: bool = True
    """Whether the parameters are declared `__restrict__`: False for a kernel whose launch
    passes one buffer as an output and an input (an update in place, nfc.codegen.cuda.step)."""

    @property
    def shared_bytes(self) -> int:
        """Static shared memory per block."""
        return sum(s.buffer.nbytes for s in self.func.body.walk()
                   if isinstance(s, Allocate) and s.buffer.scope is Scope.SHARED)


@dataclass(frozen=True)
class GpuProgram:
    """The kernels of a compute or a group, run in order. `params` are the global buffers the
    caller provides (outputs first, `n_outputs` of them, then inputs); `temps` are global
    buffers between stages. Kernels name buffers by these names (a contraction's kernel may see
    a buffer in a reshaped view, with the same name)."""

    name: str
    params: tuple[Buffer, ...]
    n_outputs: int
    temps: tuple[Buffer, ...]
    kernels: tuple[GpuKernel, ...]


class Names:
    """Unique C identifiers of one kernel, and register scalars bound once (`let`)."""

    def __init__(self, used: set[str]) -> None:
        self.used = used | RESERVED

    def fresh(self, hint: str | None, default: str = "v") -> str:
        """A new identifier from `hint`."""
        return unique_name(hint, self.used, default)

    def scalar(self, hint: str | None, dtype: DType = I32) -> Buffer:
        """A new register scalar."""
        return Buffer(self.fresh(hint), (), dtype, Scope.REGISTER)


def let(var: Buffer, value: Expr, body: Stmt | Sequence[Stmt]) -> Stmt:
    """`var = value` followed by `body`, `var` allocated around both."""
    rest = tuple(body) if isinstance(body, Sequence) else (body,)
    return Allocate(var, Seq((Store(var, (), value), *rest)))


def lets(pairs: Sequence[tuple[Buffer, Expr]], body: Stmt | Sequence[Stmt]) -> Stmt:
    """Nested `let`s, the first outermost."""
    out: Stmt | Sequence[Stmt] = body
    for var, value in reversed(pairs):
        out = let(var, value, out)
    return out if isinstance(out, Stmt) else Seq(tuple(out))


def v(buf: Buffer) -> BufLoad:
    """The value of a register scalar."""
    return BufLoad(buf, ())


def c(x: int) -> Const:
    """An integer literal."""
    return Const(x)


def add(*xs: Expr) -> Expr:
    """A sum, literal zeros dropped."""
    terms = [x for x in xs if not (isinstance(x, Const) and x.value == 0)]
    if not terms:
        return c(0)
    out = terms[0]
    for t in terms[1:]:
        out = Binary("+", out, t)
    return out


def mul(x: Expr, k: int) -> Expr:
    """`x * k`, simplified for 0, 1 and literals."""
    if isinstance(x, Const):
        return c(int(x.value) * k)
    return c(0) if k == 0 else x if k == 1 else Binary("*", x, c(k))


def lt(x: Expr, k: int) -> Expr:
    """`x < k`."""
    return Binary("<", x, c(k))


def unflatten(flat: Expr, extents: Sequence[int]) -> list[Expr]:
    """Coordinates of the row-major position `flat` in a box of `extents`."""
    out: list[Expr] = []
    stride = math.prod(extents)
    for n, e in enumerate(extents):
        stride //= e
        if e == 1:
            out.append(c(0))
            continue
        x = flat if stride == 1 else Binary("//", flat, c(stride))
        out.append(x if n == 0 else Binary("%", x, c(e)))
    return out


def bind_coords(names: Names, axes: Sequence[Axis], flat: Expr
                ) -> tuple[list[tuple[Buffer, Expr]], dict[str, Expr]]:
    """Register scalars for the coordinates of `flat` over `axes` (extent-1 axes are 0), and
    axis name -> its value."""
    pairs: list[tuple[Buffer, Expr]] = []
    env: dict[str, Expr] = {}
    for a, x in zip(axes, unflatten(flat, [a.extent for a in axes]), strict=True):
        if isinstance(x, Const):
            env[a.name] = x
            continue
        b = names.scalar(a.name)
        pairs.append((b, x))
        env[a.name] = v(b)
    return pairs, env


def body_expr(e: Expr, env: dict[str, Expr], bufs: dict[int, Buffer]) -> Expr:
    """A compute expression over loop-IR values: axes substituted, loads of buffers."""
    e = substitute_indices(e, env)

    def fn(x: Expr) -> Expr | None:
        return BufLoad(bufs[id(x.tensor)], x.indices) if isinstance(x, Load) else None
    return e.map(fn)


def kernel_shell(grid: int, block: int, shared: Sequence[Buffer],
                 body: Stmt, bx: str, tx: str) -> Stmt:
    """`blockIdx.x bx { alloc shared.. { threadIdx.x tx { body } } }`."""
    inner: Stmt = For(tx, c(block), LoopKind.THREAD_X, body)
    for s in reversed(shared):
        inner = Allocate(s, inner)
    return For(bx, c(grid), LoopKind.BLOCK_X, inner)


def acc_type(dt: DType) -> DType:
    """Accumulators of f16/bf16 reductions are f32 (as in the interpreter)."""
    return DType.F32 if dt in (DType.F16, DType.BF16) else dt


# ---------------------------------------------------------------------------------------------
# elementwise


def lower_elementwise(op: ComputeOp, s: ElementwiseSchedule, out: Buffer,
                      bufs: dict[int, Buffer], names: Names) -> tuple[Stmt, int, int]:
    """(body, grid, block) of an elementwise stage."""
    n = out.size
    t, items = s.threads, s.items
    grid = max(1, -(-n // (t * items)))
    bx, tx = names.fresh("bx"), names.fresh("tx")
    flat = names.scalar("i")
    it = names.fresh("it") if items > 1 else None
    pos = add(mul(Index(bx), t), Index(tx), mul(Index(it), grid * t) if it else c(0))
    pairs, env = bind_coords(names, op.dims, v(flat))
    store = Store(out, tuple(env[a.name] for a in op.dims), body_expr(op.body, env, bufs))
    inner = guard(lt(v(flat), n) if grid * t * items != n else None, lets(pairs, store))
    body = let(flat, pos, inner)
    if it is not None:
        body = For(it, c(items), LoopKind.UNROLLED, body)
    return kernel_shell(grid, t, (), body, bx, tx), grid, t


# ---------------------------------------------------------------------------------------------
# reductions


def _combine(reduce: str, acc: Buffer, value: Expr) -> Store:
    return Store(acc, (), value, reduce)


def _warp_reduce(reduce: str, acc: Buffer, names: Names) -> Stmt:
    """Butterfly xor shuffles: every lane ends with the warp's total."""
    tmp = names.scalar("other", acc.dtype)
    steps: list[Stmt] = []
    for off in (16, 8, 4, 2, 1):
        steps += [WarpShuffle(tmp, (), v(acc), off), _combine(reduce, acc, v(tmp))]
    return Allocate(tmp, Seq(tuple(steps)))


def _reduce_loop(op: ComputeOp, acc: Buffer, env: dict[str, Expr], bufs: dict[int, Buffer],
                 names: Names, lane: Expr | None = None, lanes: int = 1) -> Stmt:
    """`acc op= body` over the reduction axes: all of them (serial loops, `lane` None) or, for
    `lanes` cooperating threads, the positions `lane, lane + lanes, ...` of the flattened
    reduction."""
    assert op.reduce is not None
    if lane is None:
        loopvars = {a.name: names.fresh(a.name) for a in op.raxes}
        renv = dict(env) | {a: Index(x) for a, x in loopvars.items()}
        stmt: Stmt = _combine(op.reduce, acc, body_expr(op.body, renv, bufs))
        for a in reversed(op.raxes):
            stmt = For(loopvars[a.name], c(a.extent), LoopKind.SERIAL, stmt)
        return stmt
    total = math.prod(a.extent for a in op.raxes)
    r0, r = names.fresh("r0"), names.scalar("r")
    pairs, renv = bind_coords(names, op.raxes, v(r))
    update = lets(pairs, _combine(op.reduce, acc, body_expr(op.body, env | renv, bufs)))
    steps = -(-total // lanes)
    inner = let(r, add(mul(Index(r0), lanes), lane),
                guard(lt(v(r), total) if steps * lanes != total else None, update))
    return For(r0, c(steps), LoopKind.SERIAL, inner)


def lower_reduction(op: ComputeOp, s: ReduceSchedule, out: Buffer, bufs: dict[int, Buffer],
                    names: Names) -> tuple[Stmt, int, int]:
    """(body, grid, block) of a reduction stage (see ReduceSchedule)."""
    assert op.reduce is not None
    n_out, t = out.size, s.threads
    bx, tx = names.fresh("bx"), names.fresh("tx")
    acc = names.scalar("acc", acc_type(out.dtype))
    ident = identity(op.reduce, acc.dtype)
    if s.strategy == "thread":
        grid = max(1, -(-n_out // t))
        o = names.scalar("o")
        pairs, env = bind_coords(names, op.dims, v(o))
        out_idx = tuple(env[a.name] for a in op.dims)
        work = Allocate(acc, Seq((Store(acc, (), ident), _reduce_loop(op, acc, env, bufs, names),
                                  Store(out, out_idx, v(acc)))))
        body = let(o, add(mul(Index(bx), t), Index(tx)),
                   guard(lt(v(o), n_out) if grid * t != n_out else None, lets(pairs, work)))
        return kernel_shell(grid, t, (), body, bx, tx), grid, t
    if s.strategy == "warp":
        lane = names.scalar("lane")
        wpb = t // 32
        grid = max(1, -(-n_out // wpb))
        o = names.scalar("o")
        pairs, env = bind_coords(names, op.dims, v(o))
        out_idx = tuple(env[a.name] for a in op.dims)
        work = Allocate(acc, Seq((
            Store(acc, (), ident),
            _reduce_loop(op, acc, env, bufs, names, v(lane), 32),
            _warp_reduce(op.reduce, acc, names),
            If(Binary("==", v(lane), c(0)), Store(out, out_idx, v(acc))))))
        body = lets([(o, add(mul(Index(bx), wpb), Binary("//", Index(tx), c(32)))),
                     (lane, Binary("%", Index(tx), c(32)))],
                    guard(lt(v(o), n_out) if grid * wpb != n_out else None, lets(pairs, work)))
        return kernel_shell(grid, t, (), body, bx, tx), grid, t
    # one output per block
    grid = n_out
    pairs, env = bind_coords(names, op.dims, Index(bx))
    out_idx = tuple(env[a.name] for a in op.dims)
    stmts: list[Stmt] = [Store(acc, (), ident),
                         _reduce_loop(op, acc, env, bufs, names, Index(tx), t)]
    shared: list[Buffer] = []
    first = Binary("==", Index(tx), c(0))
    if s.shuffle:
        stmts.append(_warp_reduce(op.reduce, acc, names))
        if t > 32:
            nw = t // 32
            red = Buffer(names.fresh("red"), (nw,), acc.dtype, Scope.SHARED)
            shared.append(red)
            total = names.scalar("total", acc.dtype)
            tid = Index(tx)
            stmts += [
                If(Binary("==", Binary("%", tid, c(32)), c(0)),
                   Store(red, (Binary("//", tid, c(32)),), v(acc))),
                Barrier(),
                If(lt(tid, 32), let(total, Select(lt(tid, nw), BufLoad(red, (tid,)), ident), [
                    _warp_reduce(op.reduce, total, names),
                    If(first, Store(out, out_idx, v(total)))])),
            ]
        else:
            stmts.append(If(first, Store(out, out_idx, v(acc))))
    else:
        red = Buffer(names.fresh("red"), (t,), acc.dtype, Scope.SHARED)
        shared.append(red)
        stmts += [Store(red, (Index(tx),), v(acc)), Barrier()]
        step = t // 2
        while step >= 1:
            stmts += [If(lt(Index(tx), step),
                         Store(red, (Index(tx),), BufLoad(red, (add(Index(tx), c(step)),)),
                               op.reduce)),
                      Barrier()]
            step //= 2
        stmts.append(If(first, Store(out, out_idx, BufLoad(red, (c(0),)))))
    body = lets(pairs, Allocate(acc, Seq(tuple(stmts))))
    return kernel_shell(grid, t, shared, body, bx, tx), grid, t


# ---------------------------------------------------------------------------------------------
# kernels and programs


def describe(op: ComputeOp) -> str:
    """One line for a kernel's comment: `%out[i, j] = sum[k] (body)`."""
    from nfc.printer import format_expr

    dims = ", ".join(a.name for a in op.dims)
    red = f"{op.reduce}[{', '.join(f'{a.name}: {a.extent}' for a in op.raxes)}] " \
        if op.reduce else ""
    return f"%{op.result.name or 'out'}[{dims}] = {red}{format_expr(op.body)}"


def lower_stage(op: ComputeOp, schedule: GpuSchedule | None, out: Buffer,
                bufs: dict[int, Buffer], used: set[str], name: str,
                packed: dict[str, Buffer] | None = None) -> GpuKernel:
    """The kernel computing stage `op` into `out` (`bufs`: id(value) -> buffer; `packed`:
    a GEMM's packed operand temporaries, nfc.codegen.cuda.gemm_pack.lower_packs)."""
    from nfc.codegen.cuda.gemm import lower_gemm
    from nfc.codegen.cuda.space import default_gpu_schedule

    s = schedule if schedule is not None else default_gpu_schedule(op)
    problem = s.problem()
    if problem is not None:
        raise GpuScheduleError(f"invalid {s.kind} schedule: {problem}")
    names = Names(set(used))
    operands = list(op.operands)
    for b in [out, *(bufs[id(x)] for x in operands)]:
        if b.size > MAX_ELEMENTS:
            raise GpuScheduleError(f"buffer '{b.name}' has {b.size} elements; the CUDA backend "
                                   f"indexes with 32 bits (at most {MAX_ELEMENTS})")
        names.used.add(b.name)
    if isinstance(s, GemmSchedule):
        cont = match_contraction(op)
        if cont is None:
            raise GpuScheduleError("a gemm schedule for a compute that is not a contraction")
        view = flatten(op, cont)
        vop, vbufs, vout = op, bufs, out
        if view is not None:  # the same memory seen in the view's shapes
            vop, vbufs = view.op, dict(bufs)
            for vid, fv in view.values.items():
                vbufs[id(fv)] = replace(bufs[vid], shape=fv.shape)
            vout = vbufs[id(vop.result)]
        body, grid, block = lower_gemm(vop, s, vout, vbufs, names, packed)
        params = (vout, *(vbufs[id(x)] for x in vop.operands), *(packed or {}).values())
        kind = "gemm"
    else:
        if isinstance(s, ElementwiseSchedule) != (op.reduce is None):
            raise GpuScheduleError(f"a {s.kind} schedule for "
                                   f"{'a reduction' if op.reduce else 'an elementwise compute'}")
        if isinstance(s, ElementwiseSchedule):
            body, grid, block = lower_elementwise(op, s, out, bufs, names)
        else:
            body, grid, block = lower_reduction(op, s, out, bufs, names)
        params = (out, *(bufs[id(x)] for x in operands))
        kind = s.kind
    func = LoopFunc(name, params, 1, body)
    return GpuKernel(func, grid, block, s, kind, describe(op), op.loc)


def c_identifier(name: str) -> str:
    """`name` made a C identifier."""
    return unique_name(name, set(RESERVED), "k")


def lower_program(op: ComputeOp | KernelOp | Sequence[ComputeOp],
                  schedule: GpuSchedule | Sequence[GpuSchedule | None] | None = None, *,
                  name: str = "kernel") -> GpuProgram:
    """The GPU kernels of a compute or a group: one per stage after inlining elementwise
    producers (default schedules for stages given None)."""
    name = c_identifier(name)
    _, outputs, inputs = group_of(op)
    used: set[str] = set(RESERVED)
    params = [Buffer(unique_name("out" if n == 0 else f"out{n}", used, "out"), x.shape,
                     x.dtype) for n, x in enumerate(outputs)]
    params += [Buffer(unique_name(x.name, used, "in"), x.shape, x.dtype) for x in inputs]
    bufs: dict[int, Buffer] = {id(x): b for x, b in zip([*outputs, *inputs], params,
                                                        strict=True)}
    stages = [st for st, _ in group_stages(op, None)]
    scheds: Sequence[GpuSchedule | None]
    if schedule is None or isinstance(schedule, ElementwiseSchedule | ReduceSchedule
                                      | GemmSchedule):
        scheds = [schedule] * len(stages) if len(stages) == 1 else [None] * len(stages)
        if schedule is not None and len(stages) != 1:
            raise GpuScheduleError(f"a group of {len(stages)} stages needs a schedule per stage")
    else:
        scheds = list(schedule)
        if len(scheds) != len(stages):
            raise GpuScheduleError(f"{len(scheds)} schedules for {len(stages)} stages")
    temps: list[Buffer] = []
    kernels: list[GpuKernel] = []
    for n, st in enumerate(stages):
        if id(st.result) not in bufs:
            tb = Buffer(unique_name(st.result.name or "tmp", used, "tmp"), st.result.shape,
                        st.result.dtype)
            temps.append(tb)
            bufs[id(st.result)] = tb
        kname = name if len(stages) == 1 else f"{name}_{n}"
        packed, sn = None, scheds[n]
        if isinstance(sn, GemmSchedule) and sn.packed:  # packing kernels run first
            from nfc.codegen.cuda.gemm_pack import lower_packs

            ts, ks, packed = lower_packs(st, sn, bufs, used, kname)
            temps += ts
            kernels += ks
        kernels.append(lower_stage(st, scheds[n], bufs[id(st.result)], bufs, used, kname,
                                   packed))
    return GpuProgram(name, tuple(params), len(outputs), tuple(temps), tuple(kernels))


def stage_values(op: ComputeOp | KernelOp | Sequence[ComputeOp]) -> list[Value]:
    """The results of the stages of a group (for tests)."""
    return [st.result for st, _ in group_stages(op, None)]
