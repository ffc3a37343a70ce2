"""The textual-IR parser: trees, literals, scoping, diagnostics and limits."""

from __future__ import annotations

import math
import threading

import pytest

from nfc import irparser
from nfc.diagnostics import SOURCES, CompileError
from nfc.ir import (
    INTRINSICS,
    Binary,
    Call,
    CallOp,
    Cast,
    ComputeOp,
    Const,
    DType,
    Index,
    KernelOp,
    Load,
    Loc,
    Select,
    TensorType,
    Unary,
    Value,
    YieldOp,
)
from nfc.irbuild import Limits
from nfc.irparser import parse_expr, parse_module, strip_comments
from nfc.printer import print_module

V = Value(TensorType((4,), DType.F32), "v")


def expr(text: str):
    return parse_expr(text, {"v": V})


def errors(text: str, filename: str = "t.nfir") -> list:
    with pytest.raises(CompileError) as info:
        parse_module(text, filename)
    return info.value.diagnostics


def func(body: str, sig: str = "(%x: tensor<4xf32>) -> (tensor<4xf32>)") -> str:
    return f"nf.func @f{sig} {{\n{body}\n}}\n"


# ---- expressions ----------------------------------------------------------------------------

a, b, c = Index("a"), Index("b"), Index("c")


@pytest.mark.parametrize("text, tree", [
    ("a + b * c", Binary("+", a, Binary("*", b, c))),
    ("a - b - c", Binary("-", Binary("-", a, b), c)),
    ("a // b % c", Binary("%", Binary("//", a, b), c)),
    ("a or b and c", Binary("or", a, Binary("and", b, c))),
    ("not a < b and c", Binary("and", Unary("not", Binary("<", a, b)), c)),
    ("not not a", Unary("not", Unary("not", a))),
    ("-a * b", Binary("*", Unary("neg", a), b)),
    ("a < b + c", Binary("<", a, Binary("+", b, c))),
    ("(a < b) == c", Binary("==", Binary("<", a, b), c)),
    ("a - -b", Binary("-", a, Unary("neg", b))),
    ("-(a + b)", Unary("neg", Binary("+", a, b))),
])
def test_precedence_and_associativity(text, tree):
    assert expr(text) == tree


def test_comparisons_do_not_chain():
    with pytest.raises(CompileError):
        expr("a < b < c")


@pytest.mark.parametrize("text, const", [
    ("3", Const(3)), ("1.5", Const(1.5)), ("1e-05", Const(1e-05)), ("1e+16", Const(1e16)),
    ("-2", Const(-2)), ("-2.5", Const(-2.5)), ("-inf", Const(-math.inf)), ("inf", Const(math.inf)),
    ("true", Const(True, DType.I1)), ("false", Const(False, DType.I1)),
    ("f32(1.0)", Const(1.0, DType.F32)), ("f32(-1.0)", Const(-1.0, DType.F32)),
    ("i64(7)", Const(7, DType.I64)), ("bf16(-inf)", Const(-math.inf, DType.BF16)),
])
def test_literals(text, const):
    got = expr(text)
    assert got == const and type(got.value) is type(const.value)


def test_negative_float_zero_folds_but_integer_zero_and_nan_do_not():
    z = expr("-0.0")
    assert isinstance(z, Const) and math.copysign(1, z.value) < 0
    assert expr("-0") == Unary("neg", Const(0))  # an int literal has no negative zero
    n = expr("-nan")
    assert isinstance(n, Unary) and math.isnan(n.x.value)
    assert expr("-(1.0)") == Unary("neg", Const(1.0))  # parenthesised: not a literal


def test_a_cast_of_anything_but_a_number_stays_a_cast():
    assert expr("f32(a)") == Cast(DType.F32, a)
    assert expr("i1(true)") == Cast(DType.I1, Const(True, DType.I1))
    assert expr("f32((1.0))") == Cast(DType.F32, Const(1.0))
    assert expr("f32(f64(1.0))") == Cast(DType.F32, Const(1.0, DType.F64))
    assert expr("f32(-a)") == Cast(DType.F32, Unary("neg", a))


def test_calls_selects_and_loads():
    assert expr("select(a < 1, %v[a], 0.0)") == Select(Binary("<", a, Const(1)),
                                                       Load(V, (a,)), Const(0.0))
    for name, n in INTRINSICS.items():
        got = expr(f"{name}({', '.join(['a'] * n)})")
        assert got == Call(name, (a,) * n)
    ld = expr("%v[a + 1]")
    assert isinstance(ld, Load) and ld.tensor is V


def test_keywords_are_plain_names_where_no_keyword_fits():
    # `sum` and `max` are reduction kinds after the dims, but an index name in a body
    m = parse_module(func("  %y = nf.compute [sum: 4] sum [max: 2] (%x[sum] + f32(max)) "
                          ": tensor<4xf32>\n  nf.return %y : tensor<4xf32>"))
    op = m.funcs[0].body.ops[0]
    assert isinstance(op, ComputeOp) and op.dims[0].name == "sum" and op.reduce == "sum"
    assert op.body.b == Cast(DType.F32, Index("max"))


@pytest.mark.parametrize("text, message", [
    ("expp(a)", "unknown intrinsic 'expp'; did you mean 'exp'?"),
    ("foo(a)", "unknown intrinsic 'foo' (the intrinsics are exp"),
    ("max(a)", "'max' takes 2 arguments, got 1"),
    ("select(a, b)", "'select' takes 3 arguments, got 2"),
    ("f32(a, b)", "'f32' takes 1 argument, got 2"),
    ("%w[a]", "use of undefined value '%w'"),
])
def test_expression_errors(text, message):
    with pytest.raises(CompileError) as info:
        expr(text)
    assert message in info.value.diagnostics[0].message
    assert info.value.diagnostics[0].loc.col >= 1


# ---- modules ----------------------------------------------------------------------------------

MODULE = """nf.module @m attributes {nf.model = "m", "a key" = {x.y = [1, 2.0, -3, "\\u00e9\\"", false]}} {
  nf.func @forward(%x: tensor<4x8xf32> {nf.role = "input"}, %0: tensor<i32>) -> (tensor<4xf32>) attributes {nf.results = ["y"]} loc("a\\"b.nf":3:4 to :9) {
    %y = nf.compute [i: 4] sum [k: 8] (%x[i, k] * f32(%0[])) {nf.tag = 1} : tensor<4xf32> loc("m.nf":5:6)
    %k = nf.kernel {nf.s = "t"} {
      %t = nf.compute [i: 4] (%y[i]) : tensor<4xf32>
      nf.yield %t : tensor<4xf32>
    } : tensor<4xf32>
    %c, %d = nf.call @g(%k, %0) : (tensor<4xf32>, tensor<i32>) -> (tensor<4xf32>, tensor<i32>)
    nf.return %c : tensor<4xf32>
  }
}
"""  # noqa: E501


def test_module_structure():
    m = parse_module(MODULE, "m.nfir")
    assert m.name == "m"
    assert m.attrs == {"nf.model": "m", "a key": {"x.y": [1, 2.0, -3, 'é"', False]}}
    assert type(m.attrs["a key"]["x.y"][1]) is float
    f = m.funcs[0]
    assert [a.name for a in f.args] == ["x", "0"]  # names are kept as hints
    assert f.args[1].type == TensorType((), DType.I32)
    assert f.arg_attrs == [{"nf.role": "input"}, {}]
    assert f.attrs == {"nf.results": ["y"]} and f.loc == Loc('a"b.nf', 3, 4, 9)
    y, k, call, ret = f.body.ops
    assert isinstance(y, ComputeOp) and y.reduce == "sum" and [a.name for a in y.raxes] == ["k"]
    assert y.loc == Loc("m.nf", 5, 6) and y.attrs == {"nf.tag": 1}
    assert isinstance(k, KernelOp) and k.attrs == {"nf.s": "t"}
    inner = k.body.ops[0]
    assert isinstance(inner.body, Load) and inner.body.tensor is y.result
    assert isinstance(k.body.ops[-1], YieldOp)
    assert isinstance(call, CallOp) and call.args == [k.result, f.args[1]]
    assert [r.name for r in call.results] == ["c", "d"]
    assert ret.values == [call.results[0]]
    assert print_module(m) == MODULE.replace("\\u00e9", "é")  # the printer writes it raw


def test_bare_functions_make_a_module_named_after_the_file():
    text = func("  nf.return %x : tensor<4xf32>") + func("  nf.return %x : tensor<4xf32>",
                                                         ).replace("@f", "@g")
    m = parse_module(text, "dir/my model.nfir")
    assert m.name == "my_model" and [f.name for f in m.funcs] == ["f", "g"]
    assert parse_module(func("  nf.return %x : tensor<4xf32>"), "<stdin>").name == "stdin"


def test_multiline_signatures_and_bare_result_type():
    m = parse_module("nf.func @f(%x: tensor<4xf32>,\n           %y: tensor<4xf32>)\n"
                     "    -> tensor<4xf32> {\n  nf.return %x : tensor<4xf32>\n}\n")
    assert len(m.funcs[0].args) == 2


def test_comments_are_blanked_but_floor_division_is_not():
    text = ("// a comment with ( and \" in it\n" + func(
        "  %y = nf.compute [i: 4] (%x[i // 2] // 2.0) : tensor<4xf32> // trailing\n"
        "  nf.return %y : tensor<4xf32> loc(\"http://x\":1:1)"))
    m = parse_module(text)
    op = m.funcs[0].body.ops[0]
    assert op.body == Binary("//", Load(m.funcs[0].args[0], (Binary("//", Index("i"),
                                                                     Const(2)),)), Const(2.0))
    assert m.funcs[0].ret.loc.file == "http://x"
    assert strip_comments("a // b\n(c // d)") == "a     \n(c // d)"


# ---- diagnostics ------------------------------------------------------------------------------

def test_syntax_error_is_located_and_lists_what_was_expected():
    text = func("  %y = nf.compute [i: 4] (%x[i] +) : tensor<4xf32>")
    (d,) = errors(text)
    assert (d.loc.line, d.loc.col) == (2, 34)
    assert d.message.startswith("expected one of '(', '-'") and "found ')'" in d.message
    assert SOURCES.line("t.nfir", 2) == "  %y = nf.compute [i: 4] (%x[i] +) : tensor<4xf32>"


def test_misspelt_op_gets_a_hint_and_eof_is_reported_at_the_end():
    (d,) = errors(func("  %y = nf.compte [i: 4] (%x[i]) : tensor<4xf32>"))
    assert "found 'nf.compte'" in d.message and d.notes[0].message == \
        "did you mean 'nf.compute'?"
    (d,) = errors("nf.func @f() -> () {")
    assert d.message.startswith("expected") and "found end of input" in d.message
    assert (d.loc.line, d.loc.col) == (1, 21)
    (d,) = errors("nf.func @f() -> () { $ }")
    assert d.message.startswith("unexpected character '$'") and d.loc.col == 22


def test_every_semantic_error_is_reported_with_notes():
    text = func("  %y = nf.compute [i: 4] (%z[i] + %xx[i]) : tensor<4xf32>\n"
                "  %y = nf.compute [i: 4] (%later[i]) : tensor<4xf32>\n"
                "  %later = nf.compute [i: 4] (1.0) : tensor<4xf32>\n"
                "  nf.return %y : tensor<4xf16>")
    msgs = [(d.message, d.loc.line, [n.message for n in d.notes]) for d in errors(text)]
    assert ("redefinition of value '%y'", 3, ["previous definition here"]) in msgs
    assert ("use of undefined value '%z'", 2, []) in msgs
    assert ("use of undefined value '%xx'", 2, ["did you mean '%x'?"]) in msgs
    assert ("use of undefined value '%later'", 3,
            ["'%later' is defined here, after its use"]) in msgs
    assert any(m.startswith("type mismatch: '%y' has type tensor<4xf32> but nf.return "
                            "declares tensor<4xf16>") for m, _, _ in msgs)


def test_kernel_values_are_not_visible_after_the_kernel():
    text = func("  %k = nf.kernel {\n    %t = nf.compute [i: 4] (%x[i]) : tensor<4xf32>\n"
                "    nf.yield %t : tensor<4xf32>\n  } : tensor<4xf32>\n"
                "  nf.return %t : tensor<4xf32>")
    (d,) = errors(text)
    assert d.message == "use of undefined value '%t'" and d.loc.line == 6
    assert "inside an nf.kernel" in d.notes[0].message and d.notes[0].loc.line == 3


@pytest.mark.parametrize("body, message", [
    ("  %t = nf.compute [i: 4] (%x[i]) : tensor<4xf32>", "function body must end with "
     "'nf.return'"),
    ("  nf.return %x : tensor<4xf32>\n  nf.return %x : tensor<4xf32>",
     "'nf.return' must be the last op of its block"),
    ("  nf.yield %x : tensor<4xf32>", "'nf.yield' cannot end a function body"),
    ("  %k = nf.kernel {\n    nf.return %x : tensor<4xf32>\n  } : tensor<4xf32>\n"
     "  nf.return %k : tensor<4xf32>", "'nf.return' cannot end a nf.kernel body"),
    ("  %k = nf.kernel {\n    nf.yield %x : tensor<4xf32>\n  } : tensor<8xf32>\n"
     "  nf.return %x : tensor<4xf32>", "nf.kernel declares results (tensor<8xf32>) but "
     "nf.yield gives (tensor<4xf32>)"),
    ("  %a, %b = nf.compute [i: 4] (1.0) : tensor<4xf32>\n  nf.return %x : tensor<4xf32>",
     "nf.compute has 1 result but 2 names"),
    ("  %a = nf.call @g(%x) : (tensor<4xf32>) -> ()\n  nf.return %x : tensor<4xf32>",
     "nf.call has 0 results but 1 name"),
    ("  nf.call @g(%x) : (tensor<4xf32>, tensor<4xf32>) -> ()\n"
     "  nf.return %x : tensor<4xf32>", "nf.call has 1 value but 2 types"),
    ("  nf.return %x : tensor<4xf32>", "duplicate attribute 'a'"),
    ("  nf.return %x : tensor<4xf32>", "unknown element type 'f33'"),
    ("  %y = nf.compute [i: 4] (" + "9" * 5000 + ") : tensor<4xf32>\n"
     "  nf.return %y : tensor<4xf32>", "integer literal '99999999999999999...' is too large"),
])
def test_structural_errors(body, message):
    sig = "(%x: tensor<4xf32>) -> (tensor<4xf32>)"
    if "duplicate" in message:
        sig += " attributes {a = 1, a = 2}"
    if "f33" in message:
        sig = sig.replace("(%x: tensor<4xf32>)", "(%x: tensor<4xf32>, %q: tensor<2xf33>)")
    assert message in [d.message for d in errors(func(body, sig))][0] or any(
        message in d.message for d in errors(func(body, sig)))


def test_function_result_types_must_match_the_return():
    (d,) = errors(func("  nf.return %x : tensor<4xf32>", "(%x: tensor<4xf32>) -> (tensor<8xf32>)"))
    assert d.message == ("type mismatch: function '@f' declares results (tensor<8xf32>) but "
                         "nf.return gives (tensor<4xf32>)")
    assert d.notes[0].message == "results declared here" and d.notes[0].loc.col == 35


def test_redefined_function_and_a_failed_parse_leave_no_state_behind():
    text = func("  nf.return %x : tensor<4xf32>")
    (d,) = errors(text + text)
    assert d.message == "redefinition of function '@f'" and d.notes[0].loc.line == 1
    assert len(parse_module(text).funcs) == 1  # the next parse starts afresh


# ---- limits -----------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    "-" * 5_000 + "%x[i]",
    "not " * 5_000 + "true",
    " + ".join(["%x[i]"] * 5_000),
    "(" * 5_000 + "%x[i]" + ")" * 5_000 + " + " + "f32(" * 300 + "1.0" + ")" * 300,
])
def test_deep_expressions_are_diagnosed_not_a_recursion_error(body):
    text = func(f"  %y = nf.compute [i: 4] ({body}) : tensor<4xf32>\n"
                "  nf.return %y : tensor<4xf32>")
    (d,) = errors(text)
    assert d.message == "expression nested too deeply (the limit is 256 levels)"


def test_deep_attributes_and_kernels_and_large_inputs_are_refused(monkeypatch):
    (d,) = errors("nf.module @m attributes {a = " + "[" * 5000 + "]" * 5000 + "} {\n}")
    assert d.message == "attribute nested too deeply (the limit is 64 levels)"
    kernels = ("  %k = nf.kernel {\n" * 40 + "  nf.yield %x : tensor<4xf32>\n"
               + "  } : tensor<4xf32>\n  nf.yield %k : tensor<4xf32>\n" * 39
               + "  } : tensor<4xf32>\n  nf.return %k : tensor<4xf32>")
    (d,) = errors(func(kernels))
    assert d.message == "nf.kernel regions nested too deeply (the limit is 32)"
    monkeypatch.setattr(irparser, "LIMITS", Limits(max_chars=100))
    (d,) = errors("nf.module @m {\n}\n" + " " * 200)
    assert d.message == "input is too large (217 characters; the limit is 100)"


def test_nested_expression_just_under_the_limit_parses_and_prints():
    body = "-" * 127 + "(" + "a + " * 120 + "a)"
    e = expr(body)
    assert isinstance(e, Unary)


def test_parsing_from_several_threads():
    texts = [func(f"  %y = nf.compute [i: 4] (%x[i] * {n}.0) : tensor<4xf32>\n"
                  "  nf.return %y : tensor<4xf32>") for n in range(8)]
    results: dict[int, str] = {}

    def work(n: int) -> None:
        for _ in range(5):
            results[n] = print_module(parse_module(texts[n], f"t{n}.nfir"))

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert all(f"* {n}.0" in results[n] for n in range(8))
