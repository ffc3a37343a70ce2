"""The rewrite API: use lists under every mutation, cloning, erasing, the pattern walker."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from irgen import funcs, modules

from nfc.diagnostics import CompileError, DiagnosticEngine
from nfc.ir import (
    Axis,
    Binary,
    Block,
    CallOp,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Module,
    Op,
    ReturnOp,
    TensorType,
    Value,
    YieldOp,
)
from nfc.irparser import parse_module
from nfc.passmanager import Context, ModulePass, PassManager
from nfc.printer import print_func, print_module
from nfc.rewrite import PatternRewriteWalker, RewritePattern, Rewriter, walk_ops
from nfc.verifier import check_use_lists

T = TensorType((4,), DType.F32)
IDX = Index("i")
_SETTINGS = settings(max_examples=150, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def compute(body: Expr, name: str | None = None) -> ComputeOp:
    return ComputeOp(T, (Axis("i", 4),), body, name=name)


def load(v: Value) -> Expr:
    return Load(v, (IDX,) * v.type.rank) if v.type.rank else Load(v, ())


def readers(func: Func) -> dict[Value, set[Op]]:
    """What the use lists must say, recomputed from scratch."""
    out: dict[Value, set[Op]] = {}
    for op in func.walk():
        for v in op.direct_operands:
            out.setdefault(v, set()).add(op)
    return out


def assert_consistent(func: Func, values: list[Value], free: list[Op]) -> None:
    want = readers(func)
    for v in values:
        assert set(v.uses) == want.get(v, set()), v
    for op in free:
        assert op.parent is None and not op.attached
    eng = DiagnosticEngine()
    check_use_lists(func, eng)
    assert not eng.diagnostics, eng.diagnostics


def chain(n: int) -> tuple[Func, list[ComputeOp]]:
    """@f(%x) computing %c0 = x * 2, %c1 = c0 * 2, ... and returning the last."""
    x = Value(T, "x")
    ops, prev = [], x
    for k in range(n):
        op = compute(Binary("*", load(prev), Const(2.0)), f"c{k}")
        ops.append(op)
        prev = op.result
    return Func("f", [x], Block([*ops, ReturnOp([prev])])), ops


# ---------------------------------------------------------------------------------------------
# use lists


def test_uses_follow_construction_and_detaching() -> None:
    f, (a, b) = chain(2)
    x = f.args[0]
    assert x.uses == (a,) and a.result.uses == (b,) and b.result.uses == (f.ret,)
    free = compute(load(x))  # in no block: reads nothing yet
    assert x.uses == (a,)
    f.body.ops.insert(0, free)
    assert x.uses == (a, free) and free.parent is f.body and free.attached
    del f.body.ops[0]
    assert x.uses == (a,) and free.parent is None and not free.attached


def test_kernel_bodies_count_only_inside_a_function() -> None:
    x = Value(T, "x")
    inner = compute(load(x))
    kernel = KernelOp(Block([inner, YieldOp([inner.result])]))
    assert not x.has_uses  # the kernel is in no function yet
    f = Func("f", [x], Block([kernel, ReturnOp([kernel.result])]))
    assert x.uses == (inner,) and kernel.result.uses == (f.ret,)
    assert kernel.operands == [x] and kernel.direct_operands == []
    f.body.ops.remove(kernel)  # nested ops stop reading too
    assert not x.has_uses and not inner.attached
    assert_consistent(f, [x, inner.result, kernel.result], [])


def test_operand_lists_edited_in_place() -> None:
    f, (a, b) = chain(2)
    ret = f.ret
    ret.values.append(a.result)
    assert set(a.result.uses) == {b, ret}
    ret.values[0] = f.args[0]
    assert b.result.uses == () and ret in f.args[0].uses
    del ret.values[:]
    assert a.result.uses == (b,) and not b.result.has_uses
    assert_consistent(f, [f.args[0], a.result, b.result], [])


@_SETTINGS
@given(funcs(), st.data())
def test_random_mutations_keep_use_lists_consistent(func: Func, data: st.DataObject) -> None:
    """Any sequence of mutations, through the rewriter or the lists themselves, leaves every
    value's use list equal to the set of ops that read it."""
    rw = Rewriter()
    values = list(func.args) + [r for op in func.walk() for r in op.results]
    free: list[Op] = []
    extra = Value(T, "extra")  # a value of no function
    values.append(extra)

    def pick(seq):  # noqa: ANN001, ANN202
        return data.draw(st.sampled_from(list(seq)))

    def fresh_compute() -> ComputeOp:
        picks = data.draw(st.lists(st.sampled_from(values), max_size=3))
        body: Expr = Const(1.0)
        for v in picks:
            body = Binary("+", body, load(v))
        op = compute(body)
        values.append(op.result)
        return op

    for _ in range(data.draw(st.integers(1, 25))):
        ops = list(func.walk())
        anchors = ops
        kind = data.draw(st.sampled_from(
            ["insert", "erase", "rauw", "update", "values", "list", "move", "wrap", "clone",
             "detach", "reinsert", "trim", "kernel_body"]))
        event(kind)
        if kind == "insert" and anchors:
            rw.insert_op_before(fresh_compute(), pick(anchors))
        elif kind == "erase" and ops:
            op = pick(ops)
            if op.is_terminator:
                continue
            used = any(r.has_uses for r in op.results)
            try:
                rw.erase_op(op)
                assert not used
            except ValueError:
                assert used and op.attached
        elif kind == "rauw" and values:
            rw.replace_all_uses_with(pick(values), pick(values))
        elif kind == "update":
            cs = [op for op in ops if isinstance(op, ComputeOp)]
            if cs:
                rw.update(pick(cs), body=fresh_compute().body)
        elif kind == "values":
            terms = [op for op in ops if op.is_terminator]
            if terms:
                term = pick(terms)
                how = data.draw(st.sampled_from(["assign", "append", "set", "del", "iadd"]))
                if how == "assign":
                    term.values = data.draw(st.lists(st.sampled_from(values), max_size=3))
                elif how == "append":
                    term.values.append(pick(values))
                elif how == "iadd":
                    term.values += [pick(values)]
                elif term.values and how == "set":
                    term.values[0] = pick(values)
                elif term.values:
                    del term.values[0]
        elif kind == "list":
            blocks = [func.body] + [r for op in ops for r in op.regions()]
            block = pick(blocks)
            how = data.draw(st.sampled_from(["reverse", "pop", "insert", "assign", "clear"]))
            if how == "reverse":
                block.ops[:] = block.ops[::-1]
            elif how == "pop" and block.ops:
                free.append(block.ops.pop(data.draw(st.integers(0, len(block.ops) - 1))))
            elif how == "insert":
                block.ops.insert(data.draw(st.integers(0, len(block.ops))), fresh_compute())
            elif how == "assign":
                keep = [op for op in block.ops if data.draw(st.booleans())]
                free += [op for op in block.ops if op not in keep]
                block.ops = keep
            else:
                free += block.ops
                block.ops.clear()
        elif kind == "move" and len(ops) > 1:
            op, anchor = pick(ops), pick(ops)
            if op.parent is not None and not any(anchor is o for o in walk_ops_of(op)):
                rw.move_op_before(op, anchor)
        elif kind == "wrap":
            top = [op for op in func.body.ops if isinstance(op, ComputeOp)]
            if top:
                op = pick(top)
                anchor_index = func.body.index(op)
                rw.detach_op(op)
                kernel = KernelOp(Block([op, YieldOp([op.result])]))
                values.extend(kernel.results)
                func.body.ops.insert(anchor_index, kernel)
        elif kind == "clone" and ops:
            op = pick(ops)
            if not well_formed(op):
                continue  # a kernel cloned needs its yield
            mapping = {pick(values): pick(values)} if data.draw(st.booleans()) else {}
            copy = op.clone(mapping)
            values.extend(copy.results)
            values.extend(r for inner in walk_ops_of(copy) for r in inner.results)
            if anchors:
                rw.insert_op_before(copy, pick(anchors))
        elif kind == "detach" and ops:
            op = pick(ops)
            if op.parent is not None:
                free.append(rw.detach_op(op))
        elif kind == "reinsert" and free and anchors:
            op = free.pop(data.draw(st.integers(0, len(free) - 1)))
            if op.parent is None and not any(a is op or a in walk_ops_of(op) for a in anchors):
                rw.insert_op_before(op, pick(anchors))
            else:
                free.append(op)
        elif kind == "trim":
            kernels = [op for op in ops if isinstance(op, KernelOp)]
            if kernels:
                k = pick(kernels)
                unused = [n for n, r in enumerate(k.results) if not r.has_uses]
                if isinstance(k.body.ops[-1] if k.body.ops else None, YieldOp) and (
                        len(k.body.ops[-1].values) == len(k.results)):
                    rw.erase_results(k, unused)
        elif kind == "kernel_body":
            kernels = [op for op in ops if isinstance(op, KernelOp)]
            if kernels:
                k = pick(kernels)
                op = fresh_compute()
                k.body = Block([op, YieldOp([op.result])])
        free = [op for op in free if op.parent is None]
        assert_consistent(func, values, [op for op in free if op.parent is None])


def well_formed(op: Op) -> bool:
    """Whether every kernel in `op` ends with a yield of one value per result."""
    for k in [op, *walk_ops_of(op)]:
        if isinstance(k, KernelOp):
            term = k.body.ops[-1] if k.body.ops else None
            if not isinstance(term, YieldOp) or len(term.values) != len(k.results):
                return False
    return True


def walk_ops_of(op: Op) -> list[Op]:
    """The ops nested in `op`."""
    return [inner for region in op.regions() for inner in walk_ops(region)]


def test_an_op_is_refused_a_second_block_by_the_rewriter() -> None:
    f, (a, b) = chain(2)
    with pytest.raises(ValueError, match="already in a block"):
        Rewriter().insert_op_before(a, b)
    with pytest.raises(ValueError, match="already in a block"):
        f.body.insert_after(a, b)


# ---------------------------------------------------------------------------------------------
# erasing


def test_erasing_a_used_value_is_refused_loudly() -> None:
    f, (a, b) = chain(2)
    before = print_func(f)
    with pytest.raises(ValueError, match=r"cannot erase nf.compute defining %c0: still read"):
        Rewriter().erase_op(a)
    with pytest.raises(ValueError, match="still read"):
        f.body.erase(a)
    assert print_func(f) == before and a.attached and a.result.uses == (b,)
    k = KernelOp(Block([(c := compute(load(f.args[0]))), YieldOp([c.result])]))
    Rewriter().insert_op_before(k, f.ret)
    Rewriter().update(f.ret, values=[k.result])
    with pytest.raises(ValueError, match="still read"):
        Rewriter().erase_results(k, [0])


def test_erase_in_use_order_and_replace() -> None:
    f, (a, b) = chain(2)
    rw = Rewriter()
    rw.replace_op(b, [], [a.result])
    assert f.ret.values == [a.result] and not b.attached and not b.parent
    assert a.result.uses == (f.ret,)
    rw.replace_all_uses_with(a.result, f.args[0])
    rw.erase_op(a)
    assert [op.opname for op in f.body.ops] == ["nf.return"]
    assert f.args[0].uses == (f.ret,)


# ---------------------------------------------------------------------------------------------
# cloning


@_SETTINGS
@given(modules())
def test_clones_print_like_the_original_and_share_nothing(module: Module) -> None:
    before = {f.name: {id(v): set(v.uses) for op in f.walk() for v in op.results}
              for f in module.funcs}
    copy = Module(module.name, [f.clone() for f in module.funcs], attrs=module.attrs)
    text = print_module(module)
    assert print_module(copy) == text
    assert print_module(parse_module(print_module(copy), "clone.nfir")) == text
    for f, g in zip(module.funcs, copy.funcs, strict=True):
        old = {id(x) for op in f.walk() for x in [op, *op.results]} | {id(a) for a in f.args}
        new = {id(x) for op in g.walk() for x in [op, *op.results]} | {id(a) for a in g.args}
        assert not old & new
        # cloning leaves the original's use lists alone
        assert {id(v): set(v.uses) for op in f.walk() for v in op.results} == before[f.name]


def test_clone_maps_operands_and_records_results() -> None:
    f, (a, b) = chain(2)
    y = Value(T, "y")
    mapping = {f.args[0]: y}
    a2 = a.clone(mapping)
    b2 = b.clone(mapping)
    assert mapping[a.result] is a2.result and mapping[b.result] is b2.result
    assert a2.operands == [y] and b2.operands == [a2.result]
    assert a2.parent is None and not y.has_uses  # a clone reads nothing until inserted
    call = CallOp("g", [a.result, a.result], [T], attrs={"k": [1]})
    call2 = call.clone({a.result: y})
    assert call2.args == [y, y] and call2.attrs == call.attrs
    assert call2.attrs["k"] is not call.attrs["k"]  # attributes are deep copies


# ---------------------------------------------------------------------------------------------
# the walker


def _fold_times_one(op: Op, rw: Rewriter) -> None:
    if isinstance(op, ComputeOp) and isinstance(op.body, Binary) and op.body.op == "*" and (
            op.body.b == Const(1.0)):
        rw.update(op, body=op.body.a)


def _remove_copy(op: Op, rw: Rewriter) -> None:
    if isinstance(op, ComputeOp) and isinstance(op.body, Load) and op.body.indices == (IDX,):
        rw.replace_op(op, [], [op.body.tensor])


def ones_chain(n: int) -> Func:
    x = Value(T, "x")
    ops, prev = [], x
    for k in range(n):
        ops.append(compute(Binary("*", load(prev), Const(1.0)), f"c{k}"))
        prev = ops[-1].result
    return Func("f", [x], Block([*ops, ReturnOp([prev])]))


@pytest.mark.parametrize("reverse", [False, True])
def test_walker_reaches_a_fixpoint(reverse: bool) -> None:
    f = ones_chain(5)
    walker = PatternRewriteWalker([_fold_times_one, _remove_copy], walk_reverse=reverse)
    assert walker.rewrite_func(f)
    assert [op.opname for op in f.body.ops] == ["nf.return"] and f.ret.values == f.args
    assert walker.rewrites == 10  # each op: one fold, then (revisited) one removal
    assert not walker.rewrite_func(f)  # nothing left to do
    assert_consistent(f, f.args, [])


def test_a_single_walk_applies_one_pattern_per_op() -> None:
    f = ones_chain(3)
    PatternRewriteWalker([_fold_times_one, _remove_copy],
                         apply_recursively=False).rewrite_func(f)
    assert len(f.body.ops) == 4  # folded into copies, not revisited to remove them


def test_the_walker_visits_kernel_bodies_and_reverse_walks_dead_chains() -> None:
    class EraseDead(RewritePattern):
        def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
            if not op.is_terminator and not any(r.has_uses for r in op.results):
                rewriter.erase_op(op)

    f, ops = chain(4)
    f.ret.values = [f.args[0]]
    inner = compute(load(f.args[0]))
    f.body.ops.insert(0, KernelOp(Block([inner, YieldOp([inner.result])])))
    walker = PatternRewriteWalker(EraseDead(), walk_reverse=True, apply_recursively=False)
    assert walker.rewrite_func(f)
    assert [op.opname for op in f.body.ops] == ["nf.return"] and walker.rewrites == 5


def test_patterns_that_undo_each_other_are_stopped() -> None:
    def swap(op: Op, rw: Rewriter) -> None:
        if isinstance(op, ComputeOp) and isinstance(op.body, Binary):
            rw.update(op, body=Binary(op.body.op, op.body.b, op.body.a))

    f, _ = chain(1)
    with pytest.raises(RuntimeError, match="did not converge"):
        PatternRewriteWalker([swap], max_rewrites=50).rewrite_func(f)


def test_terminators_are_a_trait() -> None:
    assert ReturnOp.is_terminator and YieldOp.is_terminator and not ComputeOp.is_terminator
    assert not issubclass(YieldOp, ReturnOp)
    f, _ = chain(1)
    assert f.body.terminator is f.ret


def test_the_pass_manager_blames_a_pass_that_breaks_use_lists() -> None:
    @dataclass(frozen=True)
    class Rogue(ModulePass):
        name: ClassVar[str] = "rogue"

        def apply(self, ctx: Context, module: Module) -> None:
            module.funcs[0].args[0]._uses.clear()  # around every API: nothing keeps it right

    f, _ = chain(2)
    with pytest.raises(CompileError) as info:
        PassManager([Rogue()]).run(Module("m", [f]), Context())
    d = info.value.diagnostics[0]
    assert "broken use lists in @f: the use list of '%x'" in d.message
    assert any("after pass 'rogue'" in n.message for n in d.notes)
