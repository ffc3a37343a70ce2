"""Scalar and vector emission of loop-IR expressions.

Inside a vectorized loop every expression is emitted once for all lanes: a value that depends
on the lane variable becomes an LLVM vector, one that does not stays scalar and is splatted
where it meets a vector. A load whose flattened offset has lane coefficient 1 is one vector
load, 0 a scalar load (broadcast), 2 to 4 (a stride-2 window read along the lanes) one wide
load and a shuffle taking every s-th element (`strided_load`), anything else a gather lane by
lane. Loads under a lane-dependent condition (a `select` guard, a `Clamp` of a padded tile,
an `If` around the store) are masked, so a lane that is switched off never touches memory,
unless every load of the `select` is provably inside its buffer (`speculable`): then both
sides are computed and selected without masks or branches. Values invariant in the serial
loops around them are computed before those loops (`hoisted`, nfc.codegen.llvm.hoist).

f16 and bf16 values are f32 in registers and 16-bit (`i16` bit patterns) in tensors: a load
widens, a store rounds to the format (nearest even), and a cast to f16/bf16 rounds (the value
stays an f32 holding a representable number), so arithmetic on them is f32 arithmetic
rounded where a value is stored or cast, and a reduction into an f16/bf16 result accumulates
in f32. A kernel's private buffers (`Scope.REGISTER`/`LOCAL`: accumulators, scratch) hold
such values as f32 (`storage`): only tensors (parameters, the workspace) are 16-bit.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from typing import Any

from llvmlite import ir

from nfc import ops
from nfc.affine import Affine, interval, to_affine
from nfc.codegen.llvm import hoist, render
from nfc.codegen.llvm import intrinsics as M
from nfc.codegen.llvm.fold import const_ints, int_constant
from nfc.codegen.loops import Buffer, BufLoad, Clamp, Scope
from nfc.ir import Binary, Const, DType, Expr, Index, Select

#: Strided vector loads (`ExprEmitter.strided_load`): lane strides 2..MAX_STRIDE, at most
#: MAX_STRIDED_ELEMS elements loaded at once (beyond: lane by lane).
MAX_STRIDE, MAX_STRIDED_ELEMS = 4, 64


def strided_loads() -> bool:
    """Whether loads with a small constant lane stride are emitted as a wide load and a
    shuffle (default) or lane by lane (`NFC_STRIDED_LOADS=0`, for comparisons; part of the
    kernel key through `kcache.target_text`)."""
    return os.environ.get("NFC_STRIDED_LOADS", "1").strip().lower() not in (
        "0", "off", "no", "false")


#: The 16-bit float formats: f32 in registers, 16-bit bit patterns in memory.
HALF = frozenset({DType.F16, DType.BF16})

LLTYPE: dict[DType, ir.Type] = {DType.F32: M.F32, DType.F64: M.F64, DType.I1: M.I1,
                                DType.I32: M.I32, DType.I64: M.I64, DType.F16: M.F32,
                                DType.BF16: M.F32}


def lltype(dt: DType) -> ir.Type:
    """The LLVM type of a scalar of `dt` in registers (f16 and bf16: f32)."""
    if dt not in LLTYPE:
        raise NotImplementedError(f"the CPU backend does not support {dt} yet")
    return LLTYPE[dt]


def memtype(dt: DType) -> ir.Type:
    """The LLVM type of an element of `dt` in memory (i1 is a byte, f16/bf16 an i16)."""
    if dt in HALF:
        return M.I16
    return ir.IntType(8) if dt is DType.I1 else lltype(dt)


def storage(buf: Buffer) -> DType:
    """The type `buf`'s elements are stored as: its dtype, except f16/bf16 in a kernel's
    private buffers (accumulators, scratch), which hold f32 so that sums accumulate in f32."""
    if buf.dtype in HALF and buf.scope in (Scope.REGISTER, Scope.LOCAL):
        return DType.F32
    return buf.dtype


def round_literal(value: float, dt: DType) -> float:
    """`value` rounded to the float type `dt` (a literal typed by its context; bf16 to
    nearest even like nfc.interp)."""
    import numpy as np

    with np.errstate(over="ignore"):
        if dt is DType.BF16:
            if value != value:
                return float(value)
            bits = int(np.asarray(value, np.float32).view(np.uint32))
            bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
            return float(np.asarray(bits, np.uint32).view(np.float32))
        if dt is DType.F16:
            return float(np.float16(value))
        if dt is DType.F32:
            return float(np.float32(value))
    return float(value)


def _machine_leaf(e: Expr) -> DType | None:
    """Kinds of the loop-IR leaves: loop variables and clamped indices are i64 values."""
    if isinstance(e, Index | Clamp):
        return DType.I64
    if isinstance(e, BufLoad):
        return e.buffer.dtype
    return None


def typer() -> ops.Typer:
    """The operator table's typing for loop IR: machine leaves and `promote` (i64 loop
    variables meet i32 data), memoised per node."""
    return ops.Typer(_machine_leaf, ops.promote)


def infer(e: Expr, ctx: DType | None, memo: ops.Typer | None = None) -> DType:
    """The type `e` computes in, given the type its context expects: its kind by the operator
    table, weak kinds resolved by the context (`memo`: a `typer()` kept per emitter, so that
    typing is linear in the expression size instead of quadratic in its depth)."""
    k = (memo or typer()).kind(e)
    if k is None:
        raise TypeError(f"cannot type {e!r}")
    return ops.resolve(k, ctx)


class ExprEmitter:
    """Emits expressions at the builder's position. Subclasses provide `ptr(buffer)`."""

    b: ir.IRBuilder
    env: dict[str, ir.Value]
    ranges: dict[str, tuple[int, int]]
    lane: str | None = None
    width: int = 1
    mask: ir.Value | None = None
    types: ops.Typer | None = None
    """Kinds of the expressions emitted so far (per emitter, see `typer`)."""
    native_bf16: bool = False
    """f32 to bf16 by `vcvtneps2bf16` (the target has AVX-512 BF16), else integer rounding."""
    addr_memo: dict[tuple[object, ...], tuple[object, object, tuple[Expr, list[Clamp]]]] | None \
        = None
    aff_memo: dict[tuple[int, str | None], tuple[Expr, object]] | None = None
    sum_memo: dict[tuple[object, ...], tuple[object, ir.Value, list[ir.Value]]] | None = None
    hoists: list[hoist.Hoist] = []
    """The serial loops being emitted, outermost first (`hoisted`)."""

    def ptr(self, buf: Buffer) -> ir.Value:  # pragma: no cover - abstract
        """The base pointer of `buf`."""
        raise NotImplementedError

    # --- helpers -------------------------------------------------------------------------

    def vec(self, v: ir.Value) -> ir.Value:
        """`v` as a vector of the current width (splatting a scalar)."""
        if M.lanes(v.type) is not None:
            return v
        vt = ir.VectorType(v.type, self.width)
        if isinstance(v, ir.Constant) and not isinstance(v.constant, ir.values._Undefined):
            return ir.Constant(vt, [v] * self.width)
        one = self.b.insert_element(ir.Constant(vt, ir.Undefined), v, ir.Constant(M.I32, 0))
        return self.b.shuffle_vector(one, ir.Constant(vt, ir.Undefined),
                                     ir.Constant(ir.VectorType(M.I32, self.width),
                                                 [0] * self.width))

    def match(self, a: ir.Value, b: ir.Value) -> tuple[ir.Value, ir.Value]:
        """Both scalar, or both vectors."""
        if (M.lanes(a.type) is None) == (M.lanes(b.type) is None):
            return a, b
        return self.vec(a), self.vec(b)

    def lane_dependent(self, e: Expr) -> bool:
        """Whether `e` mentions the current lane variable."""
        return self.lane is not None and any(
            isinstance(x, Index) and x.name == self.lane for x in e.walk())

    def from_mem(self, v: ir.Value, sdt: DType) -> ir.Value:
        """A loaded element (or vector of them) stored as `sdt`, in its register type."""
        if sdt is DType.I1:
            return self.b.trunc(v, M.like(v.type, M.I1))
        if sdt is DType.F16:
            return M.half_to_f32(self.b, v)
        if sdt is DType.BF16:
            return M.bf16_to_f32(self.b, v)
        return v

    def to_mem(self, v: ir.Value, sdt: DType) -> ir.Value:
        """A register value as an element stored as `sdt` (f16/bf16: rounded)."""
        if sdt is DType.I1:
            return self.b.zext(v, M.like(v.type, ir.IntType(8)))
        if sdt is DType.F16:
            return M.f32_to_half(self.b, v)
        if sdt is DType.BF16:
            return M.f32_to_bf16(self.b, v, native=self.native_bf16)
        return v

    def convert(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
        """Value conversion with numpy's rules (float to int truncates); to f16/bf16 it
        rounds to the format, the result staying an f32."""
        if src == dst:
            return v
        b = self.b
        if src in HALF or dst in HALF:
            reg_src = DType.F32 if src in HALF else src
            reg_dst = DType.F32 if dst in HALF else dst
            v = self.convert(v, reg_src, reg_dst) if reg_src != reg_dst else v
            if dst in HALF:  # f16 and bf16 values are rounded: only f16 -> bf16 may change
                if isinstance(v, ir.Constant) and M.lanes(v.type) is None and isinstance(
                        v.constant, float):
                    return ir.Constant(v.type, round_literal(v.constant, dst))
                v = self.from_mem(self.to_mem(v, dst), dst)
            return v
        to = M.like(v.type, lltype(dst))
        if dst is DType.I1:
            zero = M.const(v.type, 0.0 if src.is_float else 0)
            return b.fcmp_unordered("!=", v, zero) if src.is_float else b.icmp_signed(
                "!=", v, zero)
        ints = const_ints(v)
        if ints is not None and not src.is_float and not dst.is_float:
            folded = int_constant(to, [int(x != 0) if dst is DType.I1 else x for x in ints])
            if folded is not None:
                return folded
        if src.is_float and dst.is_float:
            return b.fpext(v, to) if dst.itemsize > src.itemsize else b.fptrunc(v, to)
        if src.is_float:
            return b.fptosi(v, to)
        if dst.is_float:
            return b.uitofp(v, to) if src is DType.I1 else b.sitofp(v, to)
        if src is DType.I1:
            return b.zext(v, to)
        return b.sext(v, to) if dst.itemsize > src.itemsize else b.trunc(v, to)

    def typer(self) -> ops.Typer:
        """This emitter's memoised typing."""
        if self.types is None:
            self.types = typer()
        return self.types

    def value(self, e: Expr, dt: DType) -> ir.Value:
        """`e` evaluated and converted to `dt`."""
        src = infer(e, dt, self.typer())
        return self.convert(self.emit(e, src), src, dt)

    def nonneg(self, e: Expr) -> bool:
        """Whether the integer expression `e` is provably >= 0 (cheaper division)."""
        iv = interval(e, self.ranges)
        return iv is not None and iv[0] >= 0

    # --- expressions ---------------------------------------------------------------------

    def emit(self, e: Expr, dt: DType) -> ir.Value:
        """`e` computed in type `dt` (its inferred type in context): leaves here, operators
        through the renderer table (nfc.codegen.llvm.render)."""
        if self.hoists and not isinstance(e, Const | Index | Clamp):
            v = self.hoisted(e, dt)
            if v is not None:
                return v
        leaf = _LEAVES.get(type(e))
        if leaf is not None:
            return leaf(self, e, dt)
        return render.emit_op(self, e, dt)

    def const(self, e: Const, dt: DType) -> ir.Value:
        """A literal in type `dt` (rounded to it: an f16 literal is an f16 number)."""
        if dt in HALF:
            return ir.Constant(lltype(dt), round_literal(float(e.value), dt))
        return ir.Constant(lltype(dt), e.value if dt.is_float else int(e.value))

    def index(self, e: Index, dt: DType) -> ir.Value:
        """A loop variable (the lane vector `<0, 1, ...>` for the vectorized one)."""
        if e.name == self.lane:
            return ir.Constant(ir.VectorType(M.I64, self.width), list(range(self.width)))
        return self.env[e.name]

    def clamp(self, e: Clamp, dt: DType) -> ir.Value:
        """`min(x, hi)` of a padded tile's index (vector loads mask instead)."""
        # value(), not emit(): a clamped index may be a load of an i32 tensor (a gather)
        v = self.value(e.x, DType.I64)
        ints = const_ints(v)
        if ints is not None:
            folded = int_constant(v.type, [min(x, e.hi) for x in ints])
            if folded is not None:
                return folded
        hi = M.const(v.type, e.hi)
        return self.b.select(self.b.icmp_signed("<", v, hi), v, hi)

    def select(self, e: Select, dt: DType) -> ir.Value:
        b = self.b
        if self.lane is not None:
            # `select(u and l, x, y)` with u the same for every lane and loads in x: branch on
            # u, mask only by l (a convolution tap outside the image costs a jump, not a
            # masked load with its lane arithmetic)
            parts = _conjuncts(e.cond)
            uni = [p for p in parts if not self.lane_dependent(p)]
            if uni and len(uni) < len(parts) and not any(
                    isinstance(x, BufLoad) for x in e.b.walk()) and any(
                    isinstance(x, BufLoad) for x in e.a.walk()):
                lane = [p for p in parts if self.lane_dependent(p)]
                return self.select(Select(_conjunction(uni), Select(_conjunction(lane), e.a, e.b),
                                          e.b), dt)
        cond = self.value(e.cond, DType.I1)
        known = const_ints(cond)
        if known is not None and len(set(known)) == 1:  # the same side for every lane
            chosen = e.a if known[0] else e.b
            v = self.value(chosen, dt)
            return v if M.lanes(cond.type) is None else self.vec(v)
        has_loads = any(isinstance(x, BufLoad) for x in (*e.a.walk(), *e.b.walk()))
        if has_loads and self.speculable(e.a) and self.speculable(e.b):
            # every load of both sides is inside its buffer whatever the condition (a ReLU
            # mask, not a padding guard): both computed, a branchless select (a branch on
            # a data-dependent scalar mask mispredicted half the time: ResNet-18's 4 x 4
            # batch-norm gradients 2-4x slower; in vectors, plain loads instead of masked)
            x, y = self.match(self.value(e.a, dt), self.value(e.b, dt))
            if M.lanes(cond.type) is not None:
                x, y = self.vec(x), self.vec(y)
            return b.select(cond, x, y)
        if M.lanes(cond.type) is not None:
            if not has_loads:
                x, y = self.match(self.value(e.a, dt), self.value(e.b, dt))
                return b.select(cond, self.vec(x), self.vec(y))
            outer = self.mask
            on = cond if outer is None else b.and_(outer, cond)
            off = b.xor(cond, M.const(cond.type, 1))
            off = off if outer is None else b.and_(outer, off)
            self.mask = on
            x = self.vec(self.value(e.a, dt))
            self.mask = off
            y = self.vec(self.value(e.b, dt))
            self.mask = outer
            return b.select(cond, x, y)
        if not has_loads:
            x, y = self.match(self.value(e.a, dt), self.value(e.b, dt))
            return b.select(cond, x, y)
        # a uniform guard around loads: branch, so the unchosen side never runs
        with b.if_else(cond) as (then, otherwise):
            with then:
                x = self.value(e.a, dt)
                x = x if self.lane is None else self.vec(x)  # both phi inputs alike
                bx = b.block
            with otherwise:
                y = self.value(e.b, dt)
                y = y if self.lane is None else self.vec(y)
                by = b.block
        phi = b.phi(x.type)
        phi.add_incoming(x, bx)
        phi.add_incoming(y, by)
        return phi

    def hoisted(self, e: Expr, dt: DType) -> ir.Value | None:
        """`e` computed before the loops it is invariant in (nfc.codegen.llvm.hoist)."""
        return hoist.hoisted(self, e, dt)

    def speculable(self, e: Expr) -> bool:
        """Whether `e` may be evaluated whatever guards it (nfc.codegen.llvm.hoist)."""
        return hoist.speculable(self, e)

    # --- memory --------------------------------------------------------------------------

    def address(self, buf: Buffer, indices: tuple[Expr, ...], *, strip: bool = True
                ) -> tuple[Expr, list[Clamp]]:
        """The flattened offset expression and, with `strip`, the lane-dependent clamps
        taken out of it (for a masked contiguous access). The same access (an unrolled body
        emits it many times) gets the same expression object, so its affine form is
        computed once (`affine_form`)."""
        if self.addr_memo is None:
            self.addr_memo = {}
        key = (id(indices), id(buf), strip, self.lane)
        hit = self.addr_memo.get(key)
        if hit is not None and hit[0] is indices and hit[1] is buf:
            return hit[2]
        clamps: list[Clamp] = []
        off: Expr = Const(0)
        for ix, st in zip(indices, buf.strides, strict=True):
            if strip and isinstance(ix, Clamp) and self.lane_dependent(ix):
                clamps.append(ix)
                ix = ix.x
            off = Binary("+", off, Binary("*", ix, Const(st)))
        self.addr_memo[key] = (indices, buf, (off, clamps))
        return off, clamps

    def affine_form(self, e: Expr) -> tuple[Affine, dict[str, Expr]] | None:
        """`e` as an affine form over loop variables and atoms (non-affine sub-expressions
        free of the lane variable, named `@n`), memoised per expression; None when the lane
        variable occurs outside affine terms."""
        if self.aff_memo is None:
            self.aff_memo = {}
        key = (id(e), self.lane)
        hit = self.aff_memo.get(key)
        if hit is not None and hit[0] is e:
            return hit[1]
        atoms: dict[str, Expr] = {}
        lane = self.lane

        def atom(x: Expr) -> str | None:
            if lane is not None and any(isinstance(i, Index) and i.name == lane
                                        for i in x.walk()):
                return None
            name = f"@{len(atoms)}"
            atoms[name] = x
            return name
        a = to_affine(e, atom)
        form = None if a is None else (a, atoms)
        self.aff_memo[key] = (e, form)
        return form

    def scalar(self, v: ir.Value, lane_at: int | None) -> ir.Value:
        """`v` as a scalar: a lane-independent value (the lane variable substituted, or an
        atom without it) may still come out as a vector in a vectorized loop, from a `select`
        or a gather inside it: its lane `lane_at` (0 when None)."""
        if isinstance(v.type, ir.VectorType):
            return self.b.extract_element(v, ir.Constant(M.I32, lane_at or 0))
        return v

    def int_value(self, e: Expr, lane_at: int | None = None) -> ir.Value:
        """The scalar i64 value of the index expression `e` (the lane variable, if any, at
        `lane_at`): a sum of the non-constant terms of its affine form, with everything
        known folded into one constant."""
        form = self.affine_form(e)
        if form is None or (lane_at is None and self.lane is not None
                            and form[0].coeff(self.lane)):
            if lane_at is not None and self.lane is not None:
                e = _subst(e, self.lane, lane_at)
            return self.scalar(self.value(e, DType.I64), lane_at)
        a, atoms = form
        b = self.b
        total = a.const
        terms: list[tuple[ir.Value, int]] = []
        for name, c in a.coeffs:
            if name == self.lane:
                total += c * (lane_at or 0)
                continue
            v = (self.scalar(self.value(atoms[name], DType.I64), lane_at) if name in atoms
                 else self.env[name])
            known = const_ints(v)
            if known is not None and len(known) == 1:
                total += c * known[0]
                continue
            terms.append((v, c))
        if not terms:
            return ir.Constant(M.I64, total)
        # the variable part is shared by every access of an unrolled body: computed once per
        # basic block (where it dominates every later use), the rest is a constant offset
        if self.sum_memo is None:
            self.sum_memo = {}
        key = (id(b.block), tuple((id(v), c) for v, c in terms))
        hit = self.sum_memo.get(key)
        if hit is not None and hit[0] is b.block:
            acc = hit[1]
        else:
            acc = None
            for v, c in terms:
                t = v if c == 1 else b.mul(v, ir.Constant(M.I64, c))
                acc = t if acc is None else b.add(acc, t)
            assert acc is not None
            self.sum_memo[key] = (b.block, acc, [v for v, _ in terms])
        return acc if total == 0 else b.add(acc, ir.Constant(M.I64, total))

    def lane_coeff(self, off: Expr) -> int | None:
        """Coefficient of the lane variable in `off` (None: not affine in it)."""
        assert self.lane is not None
        form = self.affine_form(off)
        return None if form is None else form[0].coeff(self.lane)

    def gep(self, buf: Buffer, off: ir.Value) -> ir.Value:
        return self.b.gep(self.ptr(buf), [off], source_etype=memtype(storage(buf)))

    def load(self, e: BufLoad) -> ir.Value:
        b = self.b
        buf = e.buffer
        sdt = storage(buf)
        et = memtype(sdt)
        if not self.lane_dependent(e):
            off, _ = self.address(buf, e.indices)
            return self.from_mem(b.load(self.gep(buf, self.int_value(off)), typ=et), sdt)
        off, clamps = self.address(buf, e.indices)
        coeff = self.lane_coeff(off)
        vt = ir.VectorType(et, self.width)
        if coeff == 1:
            base = self.scalar_at_lane0(off)
            p = self.gep(buf, base)
            mask = self.lane_mask(clamps)
            if mask is None:
                v = b.load(p, typ=vt, align=_size(et))
            else:
                fn = M.declare(b.module, f"llvm.masked.load.{M.type_suffix(vt)}.p0", vt,
                               [p.type, M.I32, mask.type, vt])
                v = b.call(fn, [p, ir.Constant(M.I32, _size(et)), mask, ir.Constant(vt, None)])
            return self.from_mem(v, sdt)
        if coeff is not None and 2 <= coeff <= MAX_STRIDE and coeff * self.width <= (
                MAX_STRIDED_ELEMS) and strided_loads():
            return self.from_mem(self.strided_load(buf, off, clamps, coeff, vt), sdt)
        # gather, lane by lane (clamps kept); a switched-off lane reads element 0
        off, _ = self.address(buf, e.indices, strip=False)
        out = ir.Constant(vt, ir.Undefined)
        for lane in range(self.width):
            o = self.int_value(off, lane)
            if self.mask is not None:
                on = b.extract_element(self.mask, ir.Constant(M.I32, lane))
                o = b.select(on, o, ir.Constant(M.I64, 0))
            out = b.insert_element(out, b.load(self.gep(buf, o), typ=et),
                                   ir.Constant(M.I32, lane))
        return self.from_mem(out, sdt)

    def lane_mask(self, clamps: list[Clamp]) -> ir.Value | None:
        """The lanes that read memory: the current mask and, per lane-dependent clamp, the
        lanes whose index is within it (a clamped lane past a padded tile's end is a lane
        whose result is discarded); None when every lane reads."""
        b = self.b
        mask = self.mask
        for c in clamps:
            x = self.value(c.x, DType.I64)  # value(): a gather index is an i32 load
            known = const_ints(x)
            if known is not None and all(v <= c.hi for v in known):
                continue  # every lane in bounds: no mask needed for this clamp
            ok = b.icmp_signed("<=", x, M.const(x.type, c.hi)) if known is None else (
                int_constant(M.like(x.type, M.I1), [v <= c.hi for v in known]))
            ok = self.vec(ok)
            mask = ok if mask is None else b.and_(mask, ok)
        return mask

    def strided_load(self, buf: Buffer, off: Expr, clamps: list[Clamp], stride: int,
                     vt: ir.VectorType) -> ir.Value:
        """Lanes `base + stride * l` (a stride-2 window read along the lanes) as one load of
        the `stride * width` elements from `base` and a `shufflevector` taking every
        `stride`-th: two (three, four) vector loads and a permute instead of a load and an
        insert per lane. Only the elements the lanes read are touched: with a mask (guards,
        clamps) the wide load is masked to the switched-on lanes' elements; without one it is
        a plain load when the interval of the offset proves its last `stride - 1` elements
        (past the last lane's) inside the buffer, else masked to end at the last lane's
        element (on AVX2 a plain load and a `vmaskmovps` for the last part)."""
        b = self.b
        w = self.width
        n = stride * w
        wt = ir.VectorType(vt.element, n)
        p = self.gep(buf, self.scalar_at_lane0(off))
        mask = self.lane_mask(clamps)
        align = _size(vt.element)
        if mask is None:
            iv = interval(off, self.ranges)
            if iv is not None and iv[1] + stride - 1 < buf.size:
                wide = b.load(p, typ=wt, align=align)
                return self._every(wide, stride, w)
            # the elements up to the last lane's (after it, stride - 1 may lie outside)
            wmask: ir.Value = ir.Constant(ir.VectorType(M.I1, n),
                                          [k <= stride * (w - 1) for k in range(n)])
        else:
            lanes = ir.VectorType(M.I1, w)
            wmask = b.shuffle_vector(mask, ir.Constant(lanes, None), ir.Constant(
                ir.VectorType(M.I32, n), [k // stride if k % stride == 0 else w
                                          for k in range(n)]))
        fn = M.declare(b.module, f"llvm.masked.load.{M.type_suffix(wt)}.p0", wt,
                       [p.type, M.I32, wmask.type, wt])
        wide = b.call(fn, [p, ir.Constant(M.I32, align), wmask, ir.Constant(wt, None)])
        return self._every(wide, stride, w)

    def _every(self, wide: ir.Value, stride: int, w: int) -> ir.Value:
        """Every `stride`-th element of `wide`, `w` of them."""
        return self.b.shuffle_vector(wide, ir.Constant(wide.type, ir.Undefined), ir.Constant(
            ir.VectorType(M.I32, w), [stride * k for k in range(w)]))

    def scalar_at_lane0(self, e: Expr) -> ir.Value:
        """`e` with the lane variable at 0, as a scalar i64."""
        assert self.lane is not None
        return self.int_value(e, 0)

    def value_scalar(self, e: Expr) -> ir.Value:
        """Evaluate a lane-free integer expression (Clamps as `min`)."""
        return self.value(e, DType.I64)


def _size(t: ir.Type) -> int:
    """Bytes of a scalar memory type."""
    if isinstance(t, ir.IntType):
        return max(1, t.width // 8)
    return 4 if t == M.F32 else 8


def _subst(e: Expr, var: str, value: int) -> Expr:
    return e.map(lambda x: Const(value) if isinstance(x, Index) and x.name == var else None)


def _conjuncts(e: Expr) -> list[Expr]:
    """The operands of a tree of `and`s."""
    if isinstance(e, Binary) and e.op == "and":
        return [*_conjuncts(e.a), *_conjuncts(e.b)]
    return [e]


def _conjunction(parts: list[Expr]) -> Expr:
    return functools.reduce(lambda x, y: Binary("and", x, y), parts)


#: Emission of the leaves of loop-IR expressions; operators go through the renderer table.
_LEAVES: dict[type[Expr], Callable[[ExprEmitter, Any, DType], ir.Value]] = {
    Const: ExprEmitter.const, Index: ExprEmitter.index, Clamp: ExprEmitter.clamp,
    BufLoad: lambda em, e, dt: em.load(e),
}
