"""Resource limits: budgets checked before the work they bound, operator chains that do not
count as nesting, and files with nothing to compile. No test measures time: each proves that a
check comes first by what was (not) built, by peak memory, or by sizes that could not be
built at all."""

from __future__ import annotations

import contextlib
import sys
import tracemalloc
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import nfc.frontend as frontend
from nfc.cli import main
from nfc.diagnostics import CompileError
from nfc.frontend import compile_source
from nfc.frontend.context import Ctx
from nfc.frontend.limits import MAX_EXPR_DEPTH
from nfc.interp import run
from nfc.ir import ComputeOp, Expr
from nfc.irparser import parse_module
from nfc.printer import print_module


def errors(src: str, **kw: object) -> list[str]:
    with pytest.raises(CompileError) as ei:
        compile_source(src, "l.nf", **kw)  # type: ignore[arg-type]
    return [f"{d.loc.line}:{d.loc.col}: {d.message}" if d.loc else d.message
            for d in ei.value.diagnostics]


def model(*lines: str, params: str = "") -> str:
    return f"model m{params} {{\n" + "\n".join(lines) + "\n}\n"


@contextlib.contextmanager
def peak_memory(limit: int) -> Iterator[None]:
    """Fail when the block allocates more than `limit` bytes at its peak."""
    tracemalloc.start()
    try:
        yield
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < limit, f"peak {peak} bytes"


@pytest.fixture
def emitted(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Every op the elaborator emits."""
    ops: list[object] = []
    real = Ctx.emit

    def spy(self: Ctx, op: object) -> None:
        ops.append(op)
        real(self, op)  # type: ignore[arg-type]

    monkeypatch.setattr(Ctx, "emit", spy)
    return ops


STATEMENTS = ("more than the budget of 1000000 statements after unrolling loops and inlining "
              "ops (set NFC_MAX_STATEMENTS to raise it)")


# ---- statements -------------------------------------------------------------------------


def test_a_long_unroll_is_refused_before_it_is_built(emitted: list[object]) -> None:
    """The report: 999,999 steps took 46 s and 844 MB before the refusal."""
    src = model(" input x: f32[4, 8]", " h = x", " for t in 0..999999 {", "  h = h * 1.0",
                "  g = h + 1.0", " }", " output h")
    with peak_memory(20 << 20):
        assert errors(src) == [f"4:2: loop of 999999 iterations (3 statements each) would "
                               f"elaborate at least 2999997 statements, {STATEMENTS}"]
    assert emitted == []  # not one iteration was elaborated


def test_the_estimate_counts_inlined_op_bodies(emitted: list[object]) -> None:
    body = "\n".join(f"  y{k} = x * {k}.0" for k in range(10))
    src = (f"op ten(x: T[N]) -> T[N] {{\n{body}\n  y = y9\n}}\n"
           + model(" input x: f32[4]", " for t in 0..100000 { x2 = ten(x) }", " output x"))
    assert errors(src) == [f"16:2: loop of 100000 iterations (13 statements each) would "
                           f"elaborate at least 1300000 statements, {STATEMENTS}"]
    assert emitted == []


def test_exponential_inlining_is_refused_at_the_first_call(emitted: list[object]) -> None:
    ops = ["op g0(x: T[N]) -> T[N] {\n  y = x * 2.0\n}"]
    for k in range(1, 41):  # g40 would inline 2^41 - 1 statements
        ops.append(f"op g{k}(x: T[N]) -> T[N] {{\n  a = g{k - 1}(x)\n  y = g{k - 1}(a)\n}}")
    src = "\n".join(ops) + "\n" + model(" input x: f32[4]", " y = g40(x)", " output y")
    (err,) = errors(src)
    head = "166:6: inlining op 'g40' would elaborate at least "
    assert err.startswith(head) and err.endswith(STATEMENTS)
    # counting stops once past the budget: "at least" that many
    assert int(err[len(head):].split()[0]) > 1_000_000
    assert emitted == []


def test_the_statement_budget_can_be_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    src = model(" input x: f32[2]", " for t in 0..30 { x = x * 2.0 }", " output x")
    monkeypatch.setenv("NFC_MAX_STATEMENTS", "50")
    assert errors(src)[0].startswith("3:2: loop of 30 iterations (2 statements each) would "
                                     "elaborate at least 60 statements, more than the budget "
                                     "of 50 statements")
    monkeypatch.setenv("NFC_MAX_STATEMENTS", "61")
    assert errors(src)[0].startswith("3:2: loop of 30 iterations (2 statements each) would "
                                     "elaborate at least 60 statements after the 2 before it, "
                                     "more than the budget of 61 statements")
    monkeypatch.setenv("NFC_MAX_STATEMENTS", "70")
    assert len(compile_source(src, "l.nf").func("forward").body.ops) == 31


# ---- bytes and points ---------------------------------------------------------------------


def test_terabytes_of_parameters_are_refused_at_the_declaration(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The report: 4 TiB of parameters compiled, then `train` died of a MemoryError."""
    src = model(" input x: f32[4, 1024]", " param w: f32[1024, 1073741824] = zeros",
                " y[n, j] = sum(k) x[n, k] * w[k, j]", " output y")
    with peak_memory(20 << 20):
        assert errors(src) == [
            "3:2: the parameters of model 'm' take 4398046511104 bytes (4 TiB) with 'w' "
            "(f32[1024, 1073741824]), more than the budget of 34359738368 bytes (32 GiB) "
            "(set NFC_MAX_PARAM_BYTES to raise it)"]
        monkeypatch.setenv("NFC_MAX_PARAM_BYTES", str(1 << 43))
        assert errors(src) == [
            "3:2: the tensors of this function take 4398046527488 bytes (4.0 TiB) with this one, "
            "more than the budget of 274877906944 bytes (256 GiB) (set NFC_MAX_TENSOR_BYTES "
            "to raise it)"]
        monkeypatch.setenv("NFC_MAX_TENSOR_BYTES", str(1 << 44))
        monkeypatch.setenv("NFC_MAX_POINTS", str(1 << 45))
        # with every budget raised it compiles: the IR holds no data
        assert compile_source(src, "l.nf").func("forward").args[1].type.nbytes == 1 << 42


def test_tensor_bytes_count_every_compute(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NFC_MAX_TENSOR_BYTES", "4096")
    ok = [" input x: f32[16, 16]", " y = x * 2.0", " z = y + 1.0", " w = z * z"]
    assert compile_source(model(*ok, " output w"), "l.nf")  # 4 x 1024 bytes: at the budget
    assert errors(model(*ok, " v = w - 1.0", " output v")) == [
        "6:2: the tensors of this function take 5120 bytes (5 KiB) with this one, more than "
        "the budget of 4096 bytes (4 KiB) (set NFC_MAX_TENSOR_BYTES to raise it)"]


def test_a_compute_of_a_trillion_points_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """The report: a 10^12-point reduction compiled and ran on."""
    src = model(" input a: f32[n]", " input b: f32[n]", " s[i] = sum(j) a[i] * b[j]",
                " output s", params="(n = 1000000)")
    msg = ("4:2: this compute has 1000000000000 iteration points (1000000 x 1000000), more "
           "than the budget of 100000000000 iteration points of one compute (set "
           "NFC_MAX_POINTS to raise it)")
    assert errors(src) == [msg]
    # the same statement inside an op: located in the op, with the call
    op = "op outer(a: T[N], b: T[N]) -> T[N] {\n  s[i] = sum(j) a[i] * b[j]\n}\n"
    with pytest.raises(CompileError) as ei:
        compile_source(op + model(" input a: f32[n]", " input b: f32[n]", " s = outer(a, b)",
                                  " output s", params="(n = 1000000)"), "l.nf")
    d = ei.value.diagnostics[0]
    assert (d.loc.line, d.loc.col) == (2, 3) and "1000000000000 iteration points" in d.message
    assert [n.message for n in d.notes] == ["in op 'outer' called here"]
    monkeypatch.setenv("NFC_MAX_POINTS", str(10**12))
    assert compile_source(src, "l.nf").func("forward")


def test_a_budget_set_to_nonsense_is_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NFC_MAX_POINTS", "lots")
    assert errors(model(" input x: f32[2]", " output x")) == [
        "environment variable NFC_MAX_POINTS must be a positive integer (the budget of "
        "iteration points of one compute), not 'lots'"]


# ---- operator chains --------------------------------------------------------------------


def _depth(e: Expr) -> int:
    best, stack = 0, [(e, 1)]
    while stack:
        x, d = stack.pop()
        best = max(best, d)
        stack.extend((c, d + 1) for c in x.children())
    return best


@contextlib.contextmanager
def no_extra_stack(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Compile under Python's default recursion limit (the frontend normally raises it), so
    that recursion along a chain of thousands of operators would fail."""
    monkeypatch.setattr(frontend, "_stack_room", contextlib.nullcontext)
    old = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    try:
        yield
    finally:
        sys.setrecursionlimit(old)


@pytest.mark.parametrize("terms", [200, 5000])
@pytest.mark.parametrize("level", ["tensor", "element"])
def test_flat_sums_compile_and_run(terms: int, level: str,
                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The report: a flat sum of 200 terms was refused as "nested more than 200 deep"."""
    value = (" y = " + " + ".join(["x"] * terms) if level == "tensor"
             else " y[i, j] = " + " + ".join(["x[i, j]"] * terms))
    src = model(" input x: f32[4, 8]", value, " output y")
    with no_extra_stack(monkeypatch):
        m = compile_source(src, "l.nf")
        text = print_module(m)
        again = parse_module(text, "l.nfir")
    f = m.func("forward")
    computes = [op for op in f.body.ops if isinstance(op, ComputeOp)]
    assert max(_depth(op.body) for op in computes) <= MAX_EXPR_DEPTH
    assert len(computes) >= terms // MAX_EXPR_DEPTH
    x = np.arange(32, dtype=np.float32).reshape(4, 8)
    (y,) = run(f, [x])
    np.testing.assert_allclose(y, terms * x)
    (y2,) = run(again.func("forward"), [x])
    np.testing.assert_array_equal(y, y2)


def test_long_chains_keep_their_guards_and_order(monkeypatch: pytest.MonkeyPatch) -> None:
    # x[i - 1] is read only where 1 <= i: the split-off parts carry the guard, and the
    # condition stays whole (split, it would lose the fact `i >= 1` that proves the access)
    terms = " + ".join(f"x[i - 1] * {k}.0" for k in range(300))
    conds = "i >= 1 and " + " and ".join(["x[0] > -1.0"] * 100)
    src = model(" input x: f32[8]", f" y[i in 0..8] = ({terms}) if {conds} else -1.0",
                " z = x - x - x - x - x - x - x - x" + " - x" * 1000, " output y, z")
    with no_extra_stack(monkeypatch):
        m = compile_source(src, "l.nf")
    x = np.arange(8, dtype=np.float32)
    y, z = run(m.func("forward"), [x])
    expected = np.concatenate([[-1.0], x[:-1] * sum(range(300))])
    np.testing.assert_allclose(y, expected, rtol=1e-6)
    np.testing.assert_allclose(z, -1006 * x)  # left-associative: x - x - ... is x - 1007 x
    # a condition cannot be split: past 200 it is refused, cleanly
    conds = "i >= 1 and " + " and ".join(["x[0] > -1.0"] * 300)
    assert errors(model(" input x: f32[8]", f" y[i in 0..8] = x[i - 1] if {conds} else 0.0",
                        " output y")) == [
        "3:29: condition nested more than 128 deep; split it into several statements"]


def test_long_chains_in_ops(monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the definition checks, `...` expansion, range inference with guards and the
    sampling of an op nothing calls."""
    terms = " + ".join(["x[..., d]"] * 2000)
    conds = " and ".join(["d < D"] * 100)  # a condition stays whole: at most 128 deep
    src = f"op f(x: T[..., D]) -> T[..., D] {{\n  y[..., d] = ({terms}) if {conds} else 0.0\n}}\n"
    with no_extra_stack(monkeypatch):
        assert compile_source(src, "l.nf").funcs == []
        bad = src.replace("x[..., d]) if", "x[..., d + 1]) if")
        assert [d.message for d in diags_of(bad)] == [
            "access 'x' dimension 2 can reach 5 but the tensor has size 5"]


def diags_of(src: str) -> list:  # type: ignore[type-arg]
    with pytest.raises(CompileError) as ei:
        compile_source(src, "l.nf")
    return ei.value.diagnostics


def test_long_comparison_chains(monkeypatch: pytest.MonkeyPatch) -> None:
    """`a < b < c ...` is one node with many operands: its `and`s are kept shallow too."""
    src = model(" input x: f32[4]", " y = f32(" + " < ".join(["x"] * 3000) + ")",
                " z[i] = f32(" + " <= ".join(["x[i]"] * 3000) + ")", " output y, z")
    with no_extra_stack(monkeypatch):
        m = compile_source(src, "l.nf")
    f = m.func("forward")
    assert max(_depth(op.body) for op in f.body.ops if isinstance(op, ComputeOp)) \
        <= MAX_EXPR_DEPTH
    y, z = run(f, [np.arange(4, dtype=np.float32)])
    assert y.tolist() == [0.0] * 4 and z.tolist() == [1.0] * 4


def test_compile_time_chains_and_deep_indices(monkeypatch: pytest.MonkeyPatch) -> None:
    ones = " + ".join(["1"] * 3000)
    src = model(f" z = zeros<[{ones}]>", " output z")
    with no_extra_stack(monkeypatch):
        assert compile_source(src, "l.nf").func("forward").ret.values[0].type.shape == (3000,)
        # an index cannot move into a compute of its own: a chain of 300 is refused, cleanly
        index = "i" + " + 1 - 1" * 150
        assert errors(model(" input x: f32[8]", f" y[i in 0..8] = x[{index}]",
                            " output y")) == [
            "3:19: index expression nested more than 128 deep; split it into several "
            "statements"]
        short = "i" + " + 1 - 1" * 40  # 80 deep: fine, and proven in bounds
        assert compile_source(model(" input x: f32[8]", f" y[i in 0..8] = x[{short}]",
                                    " output y"), "l.nf")


def test_genuine_nesting_is_still_refused() -> None:
    nested = "x" + " * (x + 1.0" * 150 + ")" * 150
    assert errors(model(" input x: f32[2]", f" y = {nested}", " output y")) == [
        "3:554: expression nested more than 200 deep"]


# ---- nothing to compile -------------------------------------------------------------------


def test_nothing_to_compile() -> None:
    assert errors("", require_model=True) == [
        "1:1: nothing to compile: 'l.nf' defines no model and no op"]
    ops = "op f(x: T[N]) -> T[N] {\n  y[i] = x[i]\n}\n"
    assert errors(ops, require_model=True) == [
        "1:1: nothing to compile: 'l.nf' defines no model (`nfc opt` checks a file of ops)"]
    assert compile_source(ops, "l.nf").funcs == []  # a library on its own is fine
    assert compile_source("# nothing\n", "l.nf").funcs == []


def test_cli_compile_refuses_files_without_a_model(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty.nf"
    empty.write_text("")
    out = tmp_path / "empty.so"
    assert main(["compile", str(empty), "-o", str(out)]) == 1
    assert not out.exists()
    err = capsys.readouterr().err
    assert f"{empty}:1:1: error: nothing to compile: '{empty}' defines no model" in err
    assert main(["opt", str(empty)]) == 0
