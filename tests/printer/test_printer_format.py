"""The printer's textual form: precedence, literals, attributes, names."""

import math

import pytest

from nfc.ir import (
    Axis,
    Binary,
    Block,
    Call,
    Cast,
    ComputeOp,
    Const,
    DType,
    Func,
    Index,
    Load,
    Loc,
    Module,
    ReturnOp,
    Select,
    TensorType,
    Unary,
    Value,
)
from nfc.printer import format_attr, format_expr, format_float, print_module

i, j, k = Index("i"), Index("j"), Index("k")


@pytest.mark.parametrize(
    ("expr", "text"),
    [
        (i + j * 2, "i + j * 2"),
        ((i + j) * 2, "(i + j) * 2"),
        (i - (j - k), "i - (j - k)"),
        ((i - j) - k, "i - j - k"),
        (i // 4 % 3, "i // 4 % 3"),
        (i // Binary("%", Const(4), Const(3)), "i // (4 % 3)"),
        (Unary("neg", i + j), "-(i + j)"),
        (Unary("neg", Unary("neg", i)), "-(-i)"),
        (Const(-1.5) * i, "-1.5 * i"),
        (i * Const(-2), "i * -2"),
        (Binary("and", Binary("<", i, j), Unary("not", Binary("==", j, k))),
         "i < j and not j == k"),
        (Binary("<", Binary("<", i, j), k), "(i < j) < k"),
        (Select(Binary(">=", i, Const(0)), Const(1.0), Const(0.0)), "select(i >= 0, 1.0, 0.0)"),
        (Call("max", (i, Const(0))), "max(i, 0)"),
        (Cast(DType.F64, i), "f64(i)"),
        (Const(2.0, DType.F32), "f32(2.0)"),
        (Const(True, DType.I1), "true"),
    ],
)
def test_expression_text(expr, text):
    assert format_expr(expr) == text


def test_float_literals_read_back_exactly():
    for x in [0.1, 1e-05, 3.0, 1e16, -2.5e-300, 123456789.123456789]:
        text = format_float(x)
        assert float(text) == x
        assert any(c in text for c in ".e")
    assert format_float(math.inf) == "inf" and format_float(-math.inf) == "-inf"
    assert format_float(math.nan) == "nan"


def test_attribute_values():
    assert format_attr({"nf.role": "input", "a b": [1, 2.0, True]}) == (
        '{nf.role = "input", "a b" = [1, 2.0, true]}')
    assert format_attr('quote " and \n') == '"quote \\" and \\n"'


def _module():
    t = TensorType((4, 8), DType.F32)
    x = Value(t, "x")
    s = ComputeOp(TensorType((4,), DType.F32), (Axis("i", 4),),
                  Load(x, (i, k)) * 2.0, reduce="sum", raxes=(Axis("k", 8),),
                  loc=Loc("m.nf", 3, 5), name="s")
    dup = ComputeOp(TensorType((4,), DType.F32), (Axis("i", 4),), Load(s.result, (i,)),
                    name="s")
    anon = ComputeOp(TensorType((4,), DType.F32), (Axis("i", 4),), Load(dup.result, (i,)))
    f = Func("forward", [x], Block([s, dup, anon, ReturnOp([anon.result])]),
             arg_attrs=[{"nf.role": "input"}])
    return Module("m", [f], attrs={"nf.batch": 4})


def test_module_text_and_unique_names():
    text = print_module(_module())
    assert text == (
        "nf.module @m attributes {nf.batch = 4} {\n"
        '  nf.func @forward(%x: tensor<4x8xf32> {nf.role = "input"}) -> (tensor<4xf32>) {\n'
        '    %s = nf.compute [i: 4] sum [k: 8] (%x[i, k] * 2.0) : tensor<4xf32> loc("m.nf":3:5)\n'
        "    %s_1 = nf.compute [i: 4] (%s[i]) : tensor<4xf32>\n"
        "    %0 = nf.compute [i: 4] (%s_1[i]) : tensor<4xf32>\n"
        "    nf.return %0 : tensor<4xf32>\n"
        "  }\n"
        "}\n")
    assert "loc(" not in print_module(_module(), locs=False)
