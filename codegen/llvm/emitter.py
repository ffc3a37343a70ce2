"""Loop IR to LLVM IR (llvmlite.ir).

A kernel becomes `void name(ptr buffers)`: `buffers[n]` points at parameter `n` (outputs,
then inputs) and, when the kernel needs one, the last entry at its workspace (64-byte aligned,
`LoopFunc.workspace_bytes`). Loops are emitted directly: serial loops as phi loops, unrolled
loops by replicating their body, a vectorized loop as one vector body (see `exprs`), and a
parallel loop as an outlined function run by nfc's thread pool (`nfc_parallel`,
nfc.codegen.llvm.threadpool; libgomp with NFC_THREADS_BACKEND=gomp), the threads claiming
contiguous chunks of iterations as they come, or as a serial loop when its work is small
(nfc.codegen.llvm.parallel). Register buffers are entry-block allocas with constant
indices, which SROA turns into SSA registers; reductions use FMA (float sums add in the
schedule's order: no reassociation, `combine`).
"""

from __future__ import annotations

import itertools

from llvmlite import ir

from nfc.affine import interval
from nfc.codegen.cpu import CpuTarget
from nfc.codegen.llvm import bf16dot, intrinsics, render
from nfc.codegen.llvm.exprs import ExprEmitter, infer, lltype, memtype, storage
from nfc.codegen.llvm.fold import const_ints
from nfc.codegen.llvm.hoist import Hoist
from nfc.codegen.loops import (
    Allocate,
    Barrier,
    Buffer,
    For,
    If,
    LoopFunc,
    LoopKind,
    Scope,
    Seq,
    Stmt,
    Store,
)
from nfc.ir import Binary, DType, Expr

PTR = ir.PointerType()
VOID = ir.VoidType()
#: LOCAL buffers up to this size live on the stack; bigger ones are heap-allocated.
STACK_BYTES = 64 * 1024
#: Innermost serial loops of at most this many iterations, this body size (stores times their
#: value's nodes) and this size in all are unrolled by the emitter (`_auto_unroll`).
AUTO_UNROLL_TRIPS, AUTO_UNROLL_BODY, AUTO_UNROLL_COST = 32, 16, 256
_counter = itertools.count()


class _Attrs(ir.values.FunctionAttributes):
    """Function attributes that also accept LLVM string attributes (`"k"="v"`)."""

    def add(self, name: str) -> None:
        set.add(self, name)


def set_attributes(fn: ir.Function, attrs: tuple[str, ...]) -> None:
    """Give `fn` the attributes `attrs` (keywords or `"key"="value"` strings)."""
    new = _Attrs()
    for a in fn.attributes:
        new.add(a)
    for a in attrs:
        new.add(a)
    fn.attributes = new


class FuncEmitter(ExprEmitter):
    """Emits statements into one LLVM function."""

    def __init__(self, fn: ir.Function, target: CpuTarget, *, parallel: bool) -> None:
        self.fn = fn
        self.target = target
        self.parallel_ok = parallel
        entry = fn.append_basic_block("entry")
        self.body_block = fn.append_basic_block("body")
        self.entry = ir.IRBuilder(entry)
        self.b = ir.IRBuilder(self.body_block)
        self.env: dict[str, ir.Value] = {}
        self.ranges: dict[str, tuple[int, int]] = {}
        self.ptrs: dict[str, ir.Value] = {}
        self.frees: list[ir.Value] = []
        self.ws_offsets: dict[str, int] = {}
        self.workspace: ir.Value | None = None
        self.lane = None
        self.width = 1
        self.mask = None
        self.native_bf16 = target.has("avx512bf16")
        self.hoists: list[Hoist] = []

    @property
    def module(self) -> ir.Module:
        return self.fn.module

    def ptr(self, buf: Buffer) -> ir.Value:
        return self.ptrs[buf.name]

    def finish(self) -> None:
        """Free heap buffers, return, and close the entry block."""
        for p in self.frees:
            self.b.call(intrinsics.declare(self.module, "free", VOID, [PTR]), [p])
        self.b.ret_void()
        self.entry.branch(self.body_block)

    def call_c(self, name: str, ret: ir.Type, args: list[ir.Value]) -> ir.Value:
        return self.b.call(intrinsics.declare(self.module, name, ret, [a.type for a in args]), args)

    # --- statements ----------------------------------------------------------------------

    def stmt(self, s: Stmt) -> None:
        """Emit `s` at the current position."""
        if isinstance(s, Seq):
            for c in s.body:
                self.stmt(c)
        elif isinstance(s, For):
            self.loop(s)
        elif isinstance(s, Store):
            self.store(s)
        elif isinstance(s, If):
            self.if_(s)
        elif isinstance(s, Allocate):
            # the pointer is known inside the allocation only: one made inside a loop (a pack
            # filled per batch element) does not dominate what follows the loop, such as the
            # pointers a later parallel region passes to its body
            outer = self.ptrs.get(s.buffer.name)
            self.ptrs[s.buffer.name] = self.allocate(s.buffer)
            self.stmt(s.body)
            if outer is None:
                del self.ptrs[s.buffer.name]
            else:
                self.ptrs[s.buffer.name] = outer
        elif isinstance(s, Barrier):
            raise NotImplementedError("barriers exist only on GPUs")
        else:
            raise TypeError(f"unknown statement {s!r}")

    def allocate(self, buf: Buffer) -> ir.Value:
        sdt = storage(buf)  # f16/bf16 scratch holds f32
        nbytes = max(buf.size * sdt.itemsize, 1)
        if buf.scope is Scope.GLOBAL:
            assert self.workspace is not None, "workspace buffer outside the kernel body"
            off = self.ws_offsets[buf.name]
            return self.b.gep(self.workspace, [ir.Constant(intrinsics.I64, off)],
                              source_etype=ir.IntType(8))
        if buf.scope is Scope.LOCAL and nbytes > STACK_BYTES:
            i64 = intrinsics.I64
            p = self.entry.call(intrinsics.declare(self.module, "aligned_alloc", PTR, [i64, i64]),
                                [ir.Constant(i64, 64), ir.Constant(i64, (nbytes + 63) // 64 * 64)])
            self.frees.append(p)
            return p
        arr = ir.ArrayType(memtype(sdt), max(buf.size, 1))
        return _aligned_alloca(self.entry, arr, buf.name)

    def if_(self, s: If) -> None:
        cond = self.value(s.cond, DType.I1)
        known = const_ints(cond)
        if known is not None and len(set(known)) == 1:  # decided at compile time
            taken = s.then if known[0] else s.orelse
            if taken is not None:
                self.stmt(taken)
            return
        if intrinsics.lanes(cond.type) is not None:
            outer = self.mask
            self.mask = cond if outer is None else self.b.and_(outer, cond)
            self.stmt(s.then)
            if s.orelse is not None:
                off = self.b.xor(cond, intrinsics.const(cond.type, 1))
                self.mask = off if outer is None else self.b.and_(outer, off)
                self.stmt(s.orelse)
            self.mask = outer
            return
        if s.orelse is None:
            with self.b.if_then(cond):
                self.stmt(s.then)
        else:
            with self.b.if_else(cond) as (then, otherwise):
                with then:
                    self.stmt(s.then)
                with otherwise:
                    self.stmt(s.orelse)

    def loop(self, s: For) -> None:
        c = s.const_extent
        if c == 1 and s.kind is not LoopKind.VECTORIZED and not s.kind.is_gpu:
            # one iteration: straight-line code with the variable 0, which folds the index
            # arithmetic (no phi loop, no outlined parallel region for one chunk)
            saved = self.env.get(s.var)
            self.env[s.var] = ir.Constant(intrinsics.I64, 0)
            self.ranges[s.var] = (0, 0)
            self.stmt(s.body)
            self._forget(s.var, saved)
        elif s.kind is LoopKind.UNROLLED and self.native_bf16 and bf16dot.emit_pairs(self, s):
            pass  # pairs of bf16 products per vdpbf16ps (nfc.codegen.llvm.bf16dot)
        elif s.kind is LoopKind.UNROLLED and c is not None or _auto_unroll(s, c):
            saved = self.env.get(s.var)
            for k in range(c):
                self.env[s.var] = ir.Constant(intrinsics.I64, k)
                self.ranges[s.var] = (k, k)
                self.stmt(s.body)
            self._forget(s.var, saved)
        elif s.kind is LoopKind.VECTORIZED and c is not None and self.lane is None:
            self.lane, self.width = s.var, c
            self.ranges[s.var] = (0, c - 1)
            self.stmt(s.body)
            self.lane, self.width = None, 1
            self.ranges.pop(s.var, None)
        elif s.kind is LoopKind.VECTORIZED and c is not None:
            raise NotImplementedError("nested vectorized loops")
        elif s.kind.is_gpu:
            raise NotImplementedError(f"GPU loop kind {s.kind.value} on the CPU")
        elif s.kind is LoopKind.PARALLEL and self.parallel_ok and self.lane is None:
            self.parallel(s)
        else:
            n = self.value(s.extent, DType.I64)
            self.serial(s.var, ir.Constant(intrinsics.I64, 0), n, s.body, self._hi(s.extent))

    def _hi(self, extent: Expr) -> int | None:
        iv = interval(extent, self.ranges)
        return None if iv is None else iv[1] - 1

    def _forget(self, var: str, saved: ir.Value | None) -> None:
        self.ranges.pop(var, None)
        if saved is None:
            self.env.pop(var, None)
        else:
            self.env[var] = saved

    def serial(self, var: str, lo: ir.Value, hi: ir.Value, body: Stmt,
               max_index: int | None) -> None:
        """`for var in lo..hi` as a phi loop (no iterations when hi <= lo)."""
        b = self.b
        pre = b.block
        n = next(_counter)
        head = self.fn.append_basic_block(f"{var}.head{n}")
        loop = self.fn.append_basic_block(f"{var}.body{n}")
        done = self.fn.append_basic_block(f"{var}.done{n}")
        b.branch(head)
        b.position_at_end(head)
        i = b.phi(intrinsics.I64, name=var)
        i.add_incoming(lo, pre)
        b.cbranch(b.icmp_signed("<", i, hi), loop, done)
        b.position_at_end(loop)
        saved = self.env.get(var)
        self.env[var] = i
        if max_index is not None:
            self.ranges[var] = (0, max(max_index, 0))
        inner = list(body.walk())
        self.hoists = [*self.hoists, Hoist(
            pre, frozenset({var, *(s.var for s in inner if isinstance(s, For))}),
            frozenset(s.buffer.name for s in inner if isinstance(s, Store)))]
        self.stmt(body)
        self.hoists = self.hoists[:-1]
        nxt = b.add(i, ir.Constant(intrinsics.I64, 1), flags=("nsw",))
        i.add_incoming(nxt, b.block)
        b.branch(head)
        b.position_at_end(done)
        self._forget(var, saved)

    def parallel(self, s: For) -> None:
        """A parallel loop: on threads, or serially below the work threshold
        (nfc.codegen.llvm.parallel)."""
        from nfc.codegen.llvm.parallel import emit_parallel

        emit_parallel(self, s)

    # --- stores --------------------------------------------------------------------------

    def combine(self, op: str, old: ir.Value, s: Store, dt: DType) -> ir.Value:
        """`old op value` for a reducing store: FMA for sums of products. A float sum adds
        in the schedule's order, not reassociable: with `reassoc`, LLVM reordered a scalar
        accumulation (vectorizing or unrolling its loop) or not depending on the code around
        it, so one reduction rounded differently in differently fused kernels (a build with
        `remat` or compressed masks, docs/memory.md "Batch doubling under a budget")."""
        b = self.b
        e = s.value
        fm = ("reassoc", "contract")
        if op == "sum" and dt.is_float and isinstance(e, Binary) and e.op == "*":
            x, y = self.value(e.a, dt), self.value(e.b, dt)
            x, y = self.match(x, y)
            x, old2 = self.match(x, old)
            y, _ = self.match(y, old2)
            return intrinsics.fma(b, x, y, old2)
        v = self.value(e, dt)
        v, old = self.match(v, old)
        if op == "sum":
            return b.fadd(v, old) if dt.is_float else b.add(v, old)
        if op == "prod":
            return b.fmul(v, old, flags=fm) if dt.is_float else b.mul(v, old)
        cmp = ">" if op == "max" else "<"
        c = b.fcmp_ordered(cmp, v, old) if dt.is_float else b.icmp_signed(cmp, v, old)
        return b.select(c, v, old)

    def store(self, s: Store) -> None:
        b = self.b
        buf, dt = s.buffer, s.buffer.dtype
        sdt = storage(buf)  # dt as it is stored (f16/bf16 scratch: f32)
        et = memtype(sdt)
        idx_lane = any(self.lane_dependent(i) for i in s.indices)
        val_lane = self.lane_dependent(s.value)
        off, _ = self.address(buf, s.indices)
        if self.lane is None or (not idx_lane and not val_lane and self.mask is None):
            p = self.gep(buf, self.int_value(off))
            if s.reduce is None:
                v = self.value(s.value, dt)
            else:
                old = self.from_mem(b.load(p, typ=et), sdt)
                v = self.combine(s.reduce, old, s, dt)
            b.store(self.to_mem(v, sdt), p)
            return
        if not idx_lane:
            if s.reduce is None:
                raise NotImplementedError("a plain store of all lanes to one element")
            from nfc.codegen.lowering.reductions import identity

            v = self.vec(self.value(s.value, dt))
            if self.mask is not None:
                ident = self.value(identity(s.reduce, dt), dt)
                v = b.select(self.mask, v, self.vec(ident))
            r = self.horizontal(s.reduce, v, dt)
            p = self.gep(buf, self.int_value(off))
            old = b.load(p, typ=et)
            if sdt in (DType.F16, DType.BF16):
                old = self.from_mem(old, sdt)
            b.store(self.to_mem(self._merge(s.reduce, old, r, dt), sdt), p)
            return
        coeff = self.lane_coeff(off)
        vt = ir.VectorType(et, self.width)
        if coeff == 1:
            p = self.gep(buf, self.scalar_at_lane0(off))
            align = _elem_bytes(et)
            if s.reduce is None:
                v = self.vec(self.value(s.value, dt))
            else:
                old = self._vload(p, vt, align, buf)
                v = self.vec(self.combine(s.reduce, old, s, dt))
            v = self.to_mem(v, sdt)
            if self.mask is None:
                b.store(v, p, align=align)
            elif buf.scope in (Scope.REGISTER, Scope.LOCAL):
                old_all = b.load(p, typ=vt, align=align)
                b.store(b.select(self.mask, v, old_all), p, align=align)
            else:
                fn = intrinsics.declare(self.module,
                                        f"llvm.masked.store.{intrinsics.type_suffix(vt)}.p0", VOID,
                                        [vt, PTR, intrinsics.I32, self.mask.type])
                b.call(fn, [v, p, ir.Constant(intrinsics.I32, align), self.mask])
            return
        self.scatter(s, off)

    def _vload(self, p: ir.Value, vt: ir.VectorType, align: int, buf: Buffer) -> ir.Value:
        b = self.b
        if self.mask is None or buf.scope in (Scope.REGISTER, Scope.LOCAL):
            v = b.load(p, typ=vt, align=align)
        else:
            fn = intrinsics.declare(self.module,
                                    f"llvm.masked.load.{intrinsics.type_suffix(vt)}.p0", vt,
                                    [PTR, intrinsics.I32, self.mask.type, vt])
            v = b.call(fn, [p, ir.Constant(intrinsics.I32, align), self.mask,
                            ir.Constant(vt, None)])
        return self.from_mem(v, storage(buf))

    def scatter(self, s: Store, off: Expr) -> None:
        """A store whose lanes hit non-contiguous elements: lane by lane."""
        b = self.b
        dt = s.buffer.dtype
        v = self.vec(self.value(s.value, dt)) if s.reduce is None else None
        lane, width, mask = self.lane, self.width, self.mask
        assert lane is not None
        for k in range(width):
            kc = ir.Constant(intrinsics.I32, k)

            def one(k: int = k, kc: ir.Constant = kc) -> None:
                o = self.int_value(off, k)
                p = self.gep(s.buffer, o)
                if v is not None:
                    b.store(self.to_mem(b.extract_element(v, kc), storage(s.buffer)), p)
                    return
                # a reducing scatter: evaluate the lane's value in scalar mode
                self.lane, self.width, self.mask = None, 1, None
                sub = Store(s.buffer, s.indices, s.value, s.reduce)
                self.env[lane] = ir.Constant(intrinsics.I64, k)
                self.store(sub)
                self.env.pop(lane)
                self.lane, self.width, self.mask = lane, width, mask
            if mask is None:
                one()
            else:
                with b.if_then(b.extract_element(mask, kc)):
                    one()

    def horizontal(self, op: str, v: ir.Value, dt: DType) -> ir.Value:
        """Reduce the lanes of `v` to a scalar."""
        b = self.b
        e = intrinsics.elem(v.type)
        if dt.is_float:
            if op in ("sum", "prod"):
                start = ir.Constant(e, 0.0 if op == "sum" else 1.0)
                name = "fadd" if op == "sum" else "fmul"
                fn = intrinsics.declare(
                    self.module, f"llvm.vector.reduce.{name}.{intrinsics.type_suffix(v.type)}",
                    e, [e, v.type])
                return b.call(fn, [start, v], fastmath=("reassoc", "contract"))
            name = "fmax" if op == "max" else "fmin"
        else:
            name = {"sum": "add", "prod": "mul", "max": "smax", "min": "smin"}[op]
        fn = intrinsics.declare(
            self.module, f"llvm.vector.reduce.{name}.{intrinsics.type_suffix(v.type)}", e,
            [v.type])
        return b.call(fn, [v])

    def _merge(self, op: str, old: ir.Value, r: ir.Value, dt: DType) -> ir.Value:
        b = self.b
        if dt is DType.I1:
            old = b.trunc(old, intrinsics.I1)
        fm = ("reassoc", "contract")
        if op == "sum":
            return b.fadd(old, r, flags=fm) if dt.is_float else b.add(old, r)
        if op == "prod":
            return b.fmul(old, r, flags=fm) if dt.is_float else b.mul(old, r)
        cmp = ">" if op == "max" else "<"
        c = b.fcmp_ordered(cmp, r, old) if dt.is_float else b.icmp_signed(cmp, r, old)
        return b.select(c, r, old)


def _auto_unroll(s: For, c: int | None) -> bool:
    """Whether to unroll a short innermost serial loop although the schedule did not ask:
    few iterations of a small body that gains from it (a guarded tile remainder, a column sum
    into an accumulator row, a reduction over 10 classes): its masks and index arithmetic
    fold to constants, its accumulators stay in registers. Plain elementwise loops stay.
    LLVM's own unroller, which did this, is off (jit.PIPELINE): it also unrolled the
    reduction loops around register tiles, which cost compile time and (measured) made a
    tiled kernel twice as slow. Index expressions do not count towards the size: they fold
    to a constant offset once unrolled."""
    if s.kind is not LoopKind.SERIAL or c is None or not 2 <= c <= AUTO_UNROLL_TRIPS:
        return False
    size = 0
    gains = False  # guards that fold, or accumulators that stay in registers
    for x in s.body.walk():
        if isinstance(x, For) and x.const_extent != 1 and x.kind in (LoopKind.SERIAL,
                                                                      LoopKind.PARALLEL):
            return False
        if isinstance(x, If):
            gains = True
        if isinstance(x, Store):
            size += (1 + _value_size(x.value)) * _lanes_of(s.body, x)
            gains = gains or x.reduce is not None or x.buffer.scope is not Scope.GLOBAL
    return gains and size <= AUTO_UNROLL_BODY and c * size <= AUTO_UNROLL_COST


def _value_size(e: Expr) -> int:
    """Operations of a stored value (a load counts once, its indices not at all; an operator
    its renderer's size: a transcendental function about 20, it becomes a polynomial)."""
    from nfc.codegen.loops import BufLoad

    if isinstance(e, BufLoad):
        return 1
    return render.size(e) + sum(_value_size(c) for c in e.children())


def _lanes_of(body: Stmt, store: Store) -> int:
    """How many times `store` runs per iteration of `body` (unrolled loops around it)."""
    def walk(st: Stmt, reps: int) -> int | None:
        if st is store:
            return reps
        inner = reps * (st.const_extent or 1) if isinstance(st, For) and (
            st.kind is LoopKind.UNROLLED) else reps
        for ch in st.children():
            r = walk(ch, inner)
            if r is not None:
                return r
        return None
    return walk(body, 1) or 1


def _elem_bytes(t: ir.Type) -> int:
    if isinstance(t, ir.IntType):  # i16 holds f16/bf16
        return max(1, t.width // 8)
    return 4 if t == intrinsics.F32 else 8


def _aligned_alloca(b: ir.IRBuilder, t: ir.Type, name: str) -> ir.Value:
    a = b.alloca(t, name=name)
    a.align = 64
    a.type = PTR  # llvmlite types allocas as typed pointers; the emitter uses opaque `ptr`
    return a


def emit_function(module: ir.Module, f: LoopFunc, name: str, target: CpuTarget) -> ir.Function:
    """Add `void name(ptr buffers)` computing `f` to `module`."""
    fn = ir.Function(module, ir.FunctionType(VOID, [PTR]), name=name)
    set_attributes(fn, ("nounwind", *target.function_attributes))
    em = FuncEmitter(fn, target, parallel=True)
    arg = fn.args[0]
    for k, buf in enumerate(f.params):
        em.ptrs[buf.name] = em.entry.load(
            em.entry.gep(arg, [ir.Constant(intrinsics.I64, k)], source_etype=PTR), typ=PTR,
            name=buf.name)
    if f.workspace_bytes:
        em.workspace = em.entry.load(
            em.entry.gep(arg, [ir.Constant(intrinsics.I64, len(f.params))], source_etype=PTR),
            typ=PTR,
            name="workspace")
        off = 0
        for buf in f.workspace_buffers:
            em.ws_offsets[buf.name] = off
            off += (buf.nbytes + 63) // 64 * 64
    em.stmt(f.body)
    em.finish()
    return fn


__all__ = ["emit_function", "set_attributes", "infer", "lltype"]
