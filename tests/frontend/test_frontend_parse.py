"""The grammar and the parser: LALR without conflicts, the reduction/call and template/
comparison disambiguations, positions, and readable syntax errors."""

from __future__ import annotations

import logging

import pytest
from lark import Lark, logger

from nfc.diagnostics import CompileError
from nfc.frontend import ast
from nfc.frontend.parser import grammar_path, parse


def body(src: str) -> tuple[ast.Stmt, ...]:
    """Statements of `model m { src }`."""
    return parse("model m {\n" + src + "\n}", "p.nf").models[0].body


def value(src: str) -> ast.Expr:
    s = body("x = " + src)[0]
    assert isinstance(s, ast.Assign)
    return s.value


def syntax_error(src: str) -> str:
    with pytest.raises(CompileError) as ei:
        parse(src, "s.nf")
    d = ei.value.diagnostics[0]
    return f"{d.loc.line}:{d.loc.col}: {d.message}"


def test_grammar_is_lalr_without_conflicts(caplog: pytest.LogCaptureFixture) -> None:
    logger.setLevel(logging.DEBUG)
    try:
        with caplog.at_level(logging.DEBUG, logger="lark"):
            Lark(grammar_path().read_text(), parser="lalr", lexer="basic", debug=True)
    finally:
        logger.setLevel(logging.WARNING)
    assert not [r for r in caplog.records if "conflict" in r.getMessage().lower()]


def test_reduction_and_max_call_are_told_apart() -> None:
    red = value("max(j) x[j]")
    assert isinstance(red, ast.Reduce) and red.op == "max"
    assert [i.name for i in red.indices] == ["j"]
    call = value("max(a, b) - c")
    assert isinstance(call, ast.BinOp) and isinstance(call.a, ast.Call)
    # on its own line, the next statement is not the body of a reduction
    s = body("y = max(a, b)\nz = 1")
    assert isinstance(s[0].value, ast.Call) and len(s) == 2


def test_reduction_body_extends_to_the_right() -> None:
    e = value("a * sum(k) b[k] + c")
    assert isinstance(e, ast.BinOp) and e.op == "*"
    assert isinstance(e.b, ast.Reduce) and isinstance(e.b.body, ast.BinOp)
    e = value("(sum(k) b[k]) + c")
    assert isinstance(e, ast.BinOp) and e.op == "+" and isinstance(e.a, ast.Reduce)


def test_reduction_ranges_and_several_indices() -> None:
    e = value("sum(c, r in 0..3) x[c, r]")
    assert isinstance(e, ast.Reduce)
    assert [(i.name, i.lo is not None) for i in e.indices] == [("c", False), ("r", True)]


def test_reduction_body_with_minus_is_refused_with_a_hint() -> None:
    assert syntax_error("model m { x = sum(k) -y[k] }") == (
        "1:22: the body of a reduction cannot start with '-': write `sum(k) (-x[k])` or "
        "`-(sum(k) x[k])`")
    assert isinstance(value("sum(k) (-y[k])"), ast.Reduce)


def test_template_arguments_versus_comparison() -> None:
    call = value("conv2d<stride = 2>(x, w)")
    assert isinstance(call, ast.Call) and call.targs[0].name == "stride"
    r = value("reshape<[4, -1]>(x)")
    assert isinstance(r, ast.Call) and isinstance(r.targs[0].value, ast.ListExpr)
    cmp = value("a < b")
    assert isinstance(cmp, ast.Compare)
    chain = value("p <= h < H + p")
    assert isinstance(chain, ast.Compare) and chain.ops == ("<=", "<")


def test_statement_if_versus_conditional_expression() -> None:
    s = body("x = 1\nif training { y = 2 } else if true { y = 3 } else { y = 4 }")
    assert isinstance(s[1], ast.If) and isinstance(s[1].orelse[0], ast.If)
    e = value("a if c else b")
    assert isinstance(e, ast.IfExp)


def test_soft_keywords_are_usable_as_names() -> None:
    s = body("state = 1\noutput = 2\ninput x: f32[2]\noutput x")
    assert [type(x).__name__ for x in s] == ["Assign", "Assign", "Decl", "Output"]


def test_locations_span_the_node() -> None:
    e = value("foo(a, bb)")
    assert (e.loc.line, e.loc.col, e.loc.end_col) == (2, 5, 15)
    p = parse("op f<p: int = 2>(x: T[N]) -> (y: T[N], z: f32[]) {\n y[i] = x[i]\n z[] = 1.0 }",
              "o.nf").ops[0]
    assert p.cparams[0].name == "p" and [o.name for o in p.outputs] == ["y", "z"]
    assert p.outputs[1].type.dims == ()


@pytest.mark.parametrize(("src", "expected"), [
    ("model m { x = (1 + }", "1:20: unexpected '}', expected an expression"),
    ("model m {", "1:10: unexpected end of file, expected one of 'for', 'if', '}', a name"),
    ("model m { x = a if b }", "1:22: unexpected '}', expected one of an operator, 'else'"),
    ("model m { x = 1 $ }", "1:17: unexpected character '$'"),
    ("model m { inptu x: f32[3] }", "1:11: unknown declaration 'inptu'; did you mean 'input'?"),
    ("op f<p: itn>(x: T[N]) -> T[N] { y[i] = x[i] }",
     "1:9: unknown kind of compile-time parameter 'itn'; did you mean 'int'?"),
    ("model m { x = 1234567890123456789012345678901234 }",
     "1:15: integer literal with more than 30 digits"),
    ("model m { x = sum(k in 0..3, a + 1) y[k] }",
     "1:30: an index of 'sum' must be a name or `k in lo..hi`"),
])
def test_syntax_errors_are_located_and_readable(src: str, expected: str) -> None:
    assert syntax_error(src) == expected


def test_nesting_limits_are_diagnosed_not_crashed() -> None:
    deep = "model m { x = " + "(" * 300 + "y" + ")" * 300 + " }"
    assert "brackets nested more than 200 deep" in syntax_error(deep)
    minus = "model m { x = " + "-" * 300 + "y }"
    assert "expression nested more than 200 deep" in syntax_error(minus)
    right = "model m { x = y" + " + (y" * 300 + ")" * 300 + " }"
    assert "nested more than 200 deep" in syntax_error(right)
    alternating = "model m { x = y" + " + y * y" * 150 + " }"  # depth 2: + of * terms
    assert isinstance(parse(alternating, "s.nf").models[0].body[0], ast.Assign)
    # x * y - y * (...) nests: each parenthesised level adds depth, however long the chains
    nested = "model m { x = " + "y - y * (" * 120 + "y" + ")" * 120 + " }"
    assert "expression nested more than 200 deep" in syntax_error(nested)


def test_operator_chains_do_not_nest() -> None:
    """`a + b - c + ...` is one level however long; the tree stays left-associative."""
    chain = "model m { x = y" + " + y - y" * 3000 + " }"
    e = parse(chain, "s.nf").models[0].body[0].value  # type: ignore[attr-defined]
    assert isinstance(e, ast.BinOp) and e.op == "-" and e.depth == 2
    first, links = ast.chain(e)
    assert isinstance(first, ast.Name) and len(links) == 6000
    assert [link.op for link in links[:4]] == ["+", "-", "+", "-"]
    assert links[-1] is e and links[0].a is first
    assert len(e.children()) == 6001  # walkers see the operands, not 6000 nested nodes
    # a chain of `and` is one level too; `or` of `and` chains nests once
    conds = "model m { x = " + " or ".join(["a and b and c"] * 500) + " }"
    e = parse(conds, "s.nf").models[0].body[0].value  # type: ignore[attr-defined]
    assert isinstance(e, ast.BoolOp) and e.op == "or" and e.depth == 3


def test_megabyte_line_is_bounded() -> None:
    import time

    src = "model m { x = [" + "1, " * 350_000 + "1] }"
    t = time.perf_counter()
    msg = syntax_error(src)
    assert time.perf_counter() - t < 10
    assert msg.startswith("1:15: unexpected '['")


def test_independent_syntax_errors_are_all_reported() -> None:
    src = ("op f(x: T[N]) -> T[N] {\n  y[n] = x[n] +* 2\n  z[n] = x[n] ** 2\n}\n"
           "model m {\n  inptu q: f32[3]\n  a = x + +\n  b = (x\n  c = 3\n}\n")
    with pytest.raises(CompileError) as ei:
        parse(src, "s.nf")
    got = [f"{d.loc.line}:{d.loc.col}: {d.message}" for d in ei.value.diagnostics]
    assert got == [
        "2:16: unexpected '*', expected an expression",
        "3:16: unexpected '*', expected an expression",
        "6:3: unknown declaration 'inptu'; did you mean 'input'?",
        "7:11: unexpected '+', expected an expression",
        "9:3: unexpected name 'c', expected ')'",  # then stops: the '(' is never closed
    ]
