"""Scalar and vector emission of loop-IR expressions.

Inside a vectorized loop every expression is emitted once for all lanes: a value that depends
on the lane variable becomes an LLVM vector, one that does not stays scalar and is splatted
where it meets a vector. A load whose flattened offset has lane coefficient 1 is one vector
load, 0 a scalar load (broadcast), anything else a gather lane by lane. Loads under a
lane-dependent condition (a `select` guard, a `Clamp` of a padded tile, an `If` around the
store) are masked, so a lane that is switched off never touches memory.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

from llvmlite import ir

from nfc.affine import Affine, interval, to_affine
from nfc.codegen.llvm import intrinsics as M
from nfc.codegen.llvm.fold import const_ints, fold_int, int_constant
from nfc.codegen.loops import Buffer, BufLoad, Clamp
from nfc.ir import COMPARISONS, Binary, Call, Cast, Const, DType, Expr, Index, Select, Unary

LLTYPE: dict[DType, ir.Type] = {DType.F32: M.F32, DType.F64: M.F64, DType.I1: M.I1,
                                DType.I32: M.I32, DType.I64: M.I64}


def lltype(dt: DType) -> ir.Type:
    """The LLVM type of a scalar of `dt` (in registers)."""
    if dt not in LLTYPE:
        raise NotImplementedError(f"the CPU backend does not support {dt} yet")
    return LLTYPE[dt]


def memtype(dt: DType) -> ir.Type:
    """The LLVM type of an element of `dt` in memory (i1 is a byte)."""
    return ir.IntType(8) if dt is DType.I1 else lltype(dt)


def unify(a: DType, b: DType) -> DType:
    """The common type of two operands: floats beat integers, wider beats narrower."""
    if a == b:
        return a
    if a.is_float != b.is_float:
        return a if a.is_float else b
    return a if a.itemsize >= b.itemsize else b


#: Memo of `infer`/`_weak` results by (id(node), context); each entry pins its node, so an id is
#: never reused while the memo lives. An emitter keeps one per function: typing is then linear
#: in the expression size instead of quadratic in its depth.
TypeMemo = dict[tuple[int, object], tuple[Expr, object]]


def _weak(e: Expr, memo: TypeMemo | None = None) -> bool:
    if memo is not None:
        hit = memo.get((id(e), "weak"))
        if hit is not None and hit[0] is e:
            return bool(hit[1])
    if isinstance(e, Const):
        r = e.dtype is None
    elif isinstance(e, Unary) and e.op == "neg":
        r = _weak(e.x, memo)
    elif isinstance(e, Select) or (isinstance(e, Binary) and e.op not in COMPARISONS
                                   and e.op not in ("and", "or")):
        r = _weak(e.a, memo) and _weak(e.b, memo)
    elif isinstance(e, Call) and e.fn != "philox":
        r = all(_weak(a, memo) for a in e.args)
    else:
        r = False
    if memo is not None:
        memo[(id(e), "weak")] = (e, r)
    return r


def infer(e: Expr, ctx: DType | None, memo: TypeMemo | None = None) -> DType:
    """The type `e` computes in, given the type its context expects (`memo`: see TypeMemo)."""
    if isinstance(e, Const):
        if e.dtype is not None:
            return e.dtype
        if isinstance(e.value, bool):
            return DType.I1
        if ctx is not None:
            return ctx
        return DType.F32 if isinstance(e.value, float) else DType.I64
    if isinstance(e, Index | Clamp):
        return DType.I64
    if isinstance(e, BufLoad):
        return e.buffer.dtype
    if isinstance(e, Cast):
        return e.dtype
    if memo is not None:
        hit = memo.get((id(e), ctx))
        if hit is not None and hit[0] is e:
            return hit[1]  # type: ignore[return-value]
    r = _infer(e, ctx, memo)
    if memo is not None:
        memo[(id(e), ctx)] = (e, r)
    return r


def _infer(e: Expr, ctx: DType | None, memo: TypeMemo | None) -> DType:
    if isinstance(e, Unary):
        return DType.I1 if e.op == "not" else infer(e.x, ctx, memo)
    if isinstance(e, Binary):
        if e.op in COMPARISONS or e.op in ("and", "or"):
            return DType.I1
        return _common([e.a, e.b], ctx, memo)
    if isinstance(e, Select):
        return _common([e.a, e.b], ctx, memo)
    if isinstance(e, Call):
        if e.fn == "philox":
            return ctx if ctx is not None and ctx.is_float else DType.F32
        return _common(list(e.args), ctx, memo)
    raise TypeError(f"cannot type {e!r}")


def _common(args: list[Expr], ctx: DType | None, memo: TypeMemo | None = None) -> DType:
    strong = [infer(a, None, memo) for a in args if not _weak(a, memo)]
    if not strong:
        return infer(args[0], ctx, memo) if ctx is None else ctx
    out = strong[0]
    for t in strong[1:]:
        out = unify(out, t)
    return out


class ExprEmitter:
    """Emits expressions at the builder's position. Subclasses provide `ptr(buffer)`."""

    b: ir.IRBuilder
    env: dict[str, ir.Value]
    ranges: dict[str, tuple[int, int]]
    lane: str | None = None
    width: int = 1
    mask: ir.Value | None = None
    memo: TypeMemo | None = None
    """Types of the expressions emitted so far (per emitter, see TypeMemo)."""
    addr_memo: dict[tuple[object, ...], tuple[object, object, tuple[Expr, list[Clamp]]]] | None \
        = None
    aff_memo: dict[tuple[int, str | None], tuple[Expr, object]] | None = None
    sum_memo: dict[tuple[object, ...], tuple[object, ir.Value, list[ir.Value]]] | None = None

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

    def convert(self, v: ir.Value, src: DType, dst: DType) -> ir.Value:
        """Value conversion with numpy's rules (float to int truncates)."""
        if src == dst:
            return v
        b = self.b
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

    def value(self, e: Expr, dt: DType) -> ir.Value:
        """`e` evaluated and converted to `dt`."""
        if self.memo is None:
            self.memo = {}
        src = infer(e, dt, self.memo)
        return self.convert(self.emit(e, src), src, dt)

    def nonneg(self, e: Expr) -> bool:
        """Whether the integer expression `e` is provably >= 0 (cheaper division)."""
        iv = interval(e, self.ranges)
        return iv is not None and iv[0] >= 0

    # --- expressions ---------------------------------------------------------------------

    def emit(self, e: Expr, dt: DType) -> ir.Value:
        """`e` computed in type `dt` (its inferred type in context)."""
        b = self.b
        if isinstance(e, Const):
            return ir.Constant(lltype(dt), e.value if dt.is_float else int(e.value))
        if isinstance(e, Index):
            if e.name == self.lane:
                return ir.Constant(ir.VectorType(M.I64, self.width), list(range(self.width)))
            return self.env[e.name]
        if isinstance(e, Clamp):
            v = self.emit(e.x, DType.I64)
            ints = const_ints(v)
            if ints is not None:
                folded = int_constant(v.type, [min(x, e.hi) for x in ints])
                if folded is not None:
                    return folded
            hi = M.const(v.type, e.hi)
            return b.select(b.icmp_signed("<", v, hi), v, hi)
        if isinstance(e, BufLoad):
            return self.load(e)
        if isinstance(e, Cast):
            return self.value(e.x, e.dtype)
        if isinstance(e, Unary):
            if e.op == "not":
                v = self.value(e.x, DType.I1)
                ints = const_ints(v)
                if ints is not None:
                    return int_constant(v.type, [1 - (x & 1) for x in ints]) or v
                return b.xor(v, M.const(v.type, 1))
            v = self.emit(e.x, dt)
            return b.fneg(v) if dt.is_float else b.sub(M.const(v.type, 0), v)
        if isinstance(e, Binary):
            return self.binary(e, dt)
        if isinstance(e, Select):
            return self.select(e, dt)
        if isinstance(e, Call):
            return self.call(e, dt)
        raise TypeError(f"cannot emit {e!r}")

    def binary(self, e: Binary, dt: DType) -> ir.Value:
        b = self.b
        if e.op in ("and", "or"):
            x, y = self.match(self.value(e.a, DType.I1), self.value(e.b, DType.I1))
            folded = fold_int(e.op, x, y, x.type)
            if folded is not None:
                return folded
            return b.and_(x, y) if e.op == "and" else b.or_(x, y)
        if e.op in COMPARISONS:
            t = _common([e.a, e.b], None, self.memo)
            x, y = self.match(self.value(e.a, t), self.value(e.b, t))
            if not t.is_float:
                folded = fold_int(e.op, x, y, M.like(x.type, M.I1))
                if folded is not None:
                    return folded
            if t.is_float:
                if e.op == "!=":
                    return b.fcmp_unordered("!=", x, y)
                return b.fcmp_ordered(e.op, x, y)
            return b.icmp_signed(e.op, x, y)
        x, y = self.match(self.value(e.a, dt), self.value(e.b, dt))
        if dt.is_float:
            if e.op in ("//", "%"):
                q = M.intrinsic(b, "floor", [b.fdiv(x, y)])
                return q if e.op == "//" else b.fsub(x, b.fmul(q, y))
            fn = {"+": b.fadd, "-": b.fsub, "*": b.fmul, "/": b.fdiv}[e.op]
            return fn(x, y)
        folded = fold_int(e.op, x, y, x.type)
        if folded is not None:
            return folded
        if e.op in ("+", "-", "*"):
            return {"+": b.add, "-": b.sub, "*": b.mul}[e.op](x, y)
        if e.op == "/":
            return b.sdiv(x, y)
        if self.nonneg(e.a) and self.nonneg(e.b):
            return b.sdiv(x, y) if e.op == "//" else b.srem(x, y)
        # floor semantics for negative operands
        q, r = b.sdiv(x, y), b.srem(x, y)
        zero = M.const(x.type, 0)
        fix = b.and_(b.icmp_signed("!=", r, zero),
                     b.icmp_signed("!=", b.icmp_signed("<", r, zero),
                                   b.icmp_signed("<", y, zero)))
        if e.op == "//":
            return b.sub(q, b.zext(fix, x.type))
        return b.add(r, b.select(fix, y, zero))

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

    def call(self, e: Call, dt: DType) -> ir.Value:
        b = self.b
        fn = e.fn
        if fn == "philox":
            key = self.value(e.args[0], DType.I64)
            ctr = self.value(e.args[1], DType.I64)
            key, ctr = self.match(key, ctr)
            words = M.philox4x32(b, key, ctr)
            u = b.fmul(b.uitofp(words[0], M.like(key.type, M.F64)),
                       M.const(M.like(key.type, M.F64), 2.0 ** -32))
            return self.convert(u, DType.F64, dt)
        args = [self.value(a, dt) for a in e.args]
        if len(args) == 2:
            args = list(self.match(args[0], args[1]))
        x = args[0]
        if fn in ("max", "min"):
            y = args[1]
            op = ">" if fn == "max" else "<"
            c = b.fcmp_ordered(op, x, y) if dt.is_float else b.icmp_signed(op, x, y)
            return b.select(c, x, y)
        if fn == "abs":
            if dt.is_float:
                return M.intrinsic(b, "fabs", [x])
            return b.select(b.icmp_signed("<", x, M.const(x.type, 0)), b.sub(
                M.const(x.type, 0), x), x)
        if not dt.is_float:
            raise NotImplementedError(f"{fn} of {dt}")
        if fn == "pow":
            yc = e.args[1]
            c = float(yc.value) if isinstance(yc, Const) and not isinstance(
                yc.value, bool) else None
            return M.pow_(b, x, args[1], c)
        table: dict[str, Callable[[ir.IRBuilder, ir.Value], ir.Value]] = {
            "exp": M.exp, "log": M.log, "tanh": M.tanh, "erf": M.erf, "sigmoid": M.sigmoid,
            "sqrt": M.sqrt, "rsqrt": M.rsqrt}
        return table[fn](b, x)

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

    def int_value(self, e: Expr, lane_at: int | None = None) -> ir.Value:
        """The scalar i64 value of the index expression `e` (the lane variable, if any, at
        `lane_at`): a sum of the non-constant terms of its affine form, with everything
        known folded into one constant."""
        form = self.affine_form(e)
        if form is None or (lane_at is None and self.lane is not None
                            and form[0].coeff(self.lane)):
            if lane_at is not None and self.lane is not None:
                e = _subst(e, self.lane, lane_at)
            return self.value(e, DType.I64)
        a, atoms = form
        b = self.b
        total = a.const
        terms: list[tuple[ir.Value, int]] = []
        for name, c in a.coeffs:
            if name == self.lane:
                total += c * (lane_at or 0)
                continue
            v = self.value(atoms[name], DType.I64) if name in atoms else self.env[name]
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
        return self.b.gep(self.ptr(buf), [off], source_etype=memtype(buf.dtype))

    def load(self, e: BufLoad) -> ir.Value:
        b = self.b
        buf = e.buffer
        et = memtype(buf.dtype)
        if not self.lane_dependent(e):
            off, _ = self.address(buf, e.indices)
            v = b.load(self.gep(buf, self.int_value(off)), typ=et)
            return b.trunc(v, M.I1) if buf.dtype is DType.I1 else v
        off, clamps = self.address(buf, e.indices)
        coeff = self.lane_coeff(off)
        vt = ir.VectorType(et, self.width)
        if coeff == 1:
            base = self.scalar_at_lane0(off)
            p = self.gep(buf, base)
            mask = self.mask
            for c in clamps:
                x = self.emit(c.x, DType.I64)
                known = const_ints(x)
                if known is not None and all(v <= c.hi for v in known):
                    continue  # every lane in bounds: no mask needed for this clamp
                ok = b.icmp_signed("<=", x, M.const(x.type, c.hi)) if known is None else (
                    int_constant(M.like(x.type, M.I1), [v <= c.hi for v in known]))
                ok = self.vec(ok)
                mask = ok if mask is None else b.and_(mask, ok)
            if mask is None:
                v = b.load(p, typ=vt, align=_size(et))
            else:
                fn = M.declare(b.module, f"llvm.masked.load.{M.type_suffix(vt)}.p0", vt,
                               [p.type, M.I32, mask.type, vt])
                v = b.call(fn, [p, ir.Constant(M.I32, _size(et)), mask, ir.Constant(vt, None)])
            return b.trunc(v, ir.VectorType(M.I1, self.width)) if buf.dtype is DType.I1 else v
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
        return b.trunc(out, ir.VectorType(M.I1, self.width)) if buf.dtype is DType.I1 else out

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
