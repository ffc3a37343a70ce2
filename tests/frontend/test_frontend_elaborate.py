"""Elaboration: the IR the frontend produces (roles, attributes, computes, locations),
unification, inference, unrolling and imports."""

from __future__ import annotations

from pathlib import Path

import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_file, compile_source
from nfc.ir import Call, ComputeOp, DType, Func, Load, Module
from nfc.printer import print_module
from nfc.verifier import verify

MLP = """
import std.nn
model mlp(batch = 8, hidden = 16) {
  input  x: f32[batch, 12]
  input  y: i32[batch]
  param  w1: f32[12, hidden] = normal(0.0, 0.05)
  param  b1: f32[hidden] = zeros
  param  w2: f32[hidden, 3] = uniform(-0.1, 0.1)
  state  rm: f32[hidden] = zeros
  random u: f32[batch, hidden]
  h = relu(linear(x, w1, b1))
  t[n, j] = h[n, j] * u[n, j]
  update rm = 0.9 * rm + 0.1 * t[0, 0]
  logits = linear_nobias(t, w2)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1, momentum = 0.9)
}
"""


def computes(f: Func) -> list[ComputeOp]:
    return [op for op in f.body.ops if isinstance(op, ComputeOp)]


def compile_ok(src: str, **kw: object) -> Module:
    m = compile_source(src, "e.nf", **kw)  # type: ignore[arg-type]
    verify(m)
    return m


def test_model_function_follows_the_contract() -> None:
    m = compile_ok(MLP)
    f = m.func("forward")
    assert m.name == "mlp"
    assert m.attrs == {"nf.model": "mlp", "nf.loss": "loss",
                       "nf.optimizer": {"name": "sgd", "lr": 0.1, "momentum": 0.9}}
    assert [a.name for a in f.args] == ["x", "y", "w1", "b1", "w2", "rm", "rng"]
    roles = [a["nf.role"] for a in f.arg_attrs]
    assert roles == ["input", "input", "param", "param", "param", "state", "rng"]
    assert f.arg_attrs[2] == {"nf.role": "param", "nf.init": "normal(0.0, 0.05)",
                              "nf.trainable": True}
    assert f.arg_attrs[4]["nf.init"] == "uniform(-0.1, 0.1)"
    assert f.arg_attrs[5] == {"nf.role": "state", "nf.init": "zeros"}
    assert f.args[6].type.shape == (2,) and f.args[6].dtype is DType.I64
    assert f.attrs["nf.results"] == ["loss", "logits", "state:rm"]
    assert [v.type.shape for v in f.ret.values] == [(), (8, 3), (16,)]


def test_params_override_and_shapes_follow() -> None:
    f = compile_ok(MLP, params={"batch": 2, "hidden": 5}).func("forward")
    assert f.arg("x").shape == (2, 12) and f.arg("w1").shape == (12, 5)


def test_every_op_is_located_and_inlined_ops_record_the_call_site() -> None:
    m = compile_ok(MLP)
    for op in m.func("forward").body.ops:
        assert op.loc is not None
    inlined = [op for op in computes(m.func("forward")) if "nf.callsite" in op.attrs]
    assert inlined and all(op.loc.file.endswith("nn.nf") for op in inlined)
    assert {op.attrs["nf.callsite"] for op in inlined} >= {"e.nf:11:12", "e.nf:11:7"}
    own = [op for op in computes(m.func("forward")) if "nf.callsite" not in op.attrs]
    assert all(op.loc.file == "e.nf" for op in own)


def test_random_declaration_is_a_philox_compute_with_unique_salts() -> None:
    src = "model m {\n random a: f32[2, 3]\n random b: f32[4]\n output a, b\n}"
    f = compile_ok(src).func("forward")
    a, b = computes(f)
    for op in (a, b):
        assert isinstance(op.body, Call) and op.body.fn == "philox"
    text = print_module(compile_ok(src), locs=False)
    assert "philox(%rng[0] + 4294967296, %rng[1] * 6 + (i0 * 3 + i1))" in text
    assert "philox(%rng[0] + 8589934592, %rng[1] * 4 + i0)" in text


def test_one_compute_per_comprehension_and_hoisted_reductions() -> None:
    src = """
model m {
  input x: f32[4, 5]
  y[i] = (sum(k) x[i, k]) / 5.0 + (max(k) x[i, k])
  z[i] = sum(k) sum(j) x[i, k] * x[j, k]
  output y, z
}"""
    ops = computes(compile_ok(src).func("forward"))
    kinds = [(op.reduce, [a.name for a in op.raxes]) for op in ops]
    assert kinds == [("sum", ["k"]), ("max", ["k_1"]), (None, []), ("sum", ["k", "j"])]


def test_elementwise_expression_is_one_compute() -> None:
    src = ("model m {\n input x: f32[3, 4]\n input b: f32[4]\n y = exp(x * 2.0 + b) - 1.0\n"
           " output y\n}")
    (op,) = computes(compile_ok(src).func("forward"))
    assert [a.extent for a in op.dims] == [3, 4]
    assert "exp(%x[i0, i1] * 2.0 + %b[i1]) - 1.0" in print_module(compile_ok(src))


def test_for_unrolls_with_rebinding_and_loop_variable() -> None:
    src = """
model m {
  input x: f32[3]
  h = x
  for i in 0..4 { h = h * f32(i) }
  output h
}"""
    f = compile_ok(src).func("forward")
    assert len(computes(f)) == 4
    assert f.ret.values[0] is computes(f)[-1].result


def test_weak_literals_take_the_type_of_their_context() -> None:
    src = ("model m {\n input x: f64[3]\n input n: i32[3]\n y = x * 2\n z = n * 3 + 1\n"
           " output y, z\n}")
    f = compile_ok(src).func("forward")
    assert [v.dtype for v in f.ret.values] == [DType.F64, DType.I32]


def test_dtype_variables_serve_several_dtypes() -> None:
    src = """
op twice(x: T[N]) -> T[N] {
  y[n] = x[n] * 2.0
}
model m {
  input a: f32[3]
  input b: f64[5]
  p = twice(a)
  q = twice(b)
  c = T0(a)
  output p, q
}"""
    with pytest.raises(CompileError):
        compile_source(src, "d.nf")
    f = compile_ok(src.replace("  c = T0(a)\n", "")).func("forward")
    assert [v.type.dtype for v in f.ret.values] == [DType.F32, DType.F64]


def test_shape_variables_solve_affine_dimensions() -> None:
    src = """
op unpad<p: int>(x: T[N, H + 2*p]) -> T[N, H] {
  y[n, h] = x[n, h + p]
}
model m {
  input x: f32[2, 9]
  y = unpad<p = 2>(x)
  output y
}"""
    assert compile_ok(src).func("forward").ret.values[0].shape == (2, 5)


def test_data_dependent_index_is_accepted_for_integer_tensors() -> None:
    src = """
model m {
  input ids: i32[4]
  param e: f32[10, 3] = normal(0.0, 1.0)
  h[n, d] = e[ids[n], d]
  output h
}"""
    (op,) = computes(compile_ok(src).func("forward"))
    ld = next(x for x in op.body.walk() if isinstance(x, Load) and x.tensor.name == "e")
    assert isinstance(ld.indices[0], Load)


def test_imports_relative_search_path_and_cycles(tmp_path: Path) -> None:
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "ops.nf").write_text(
        "op double(x: T[N]) -> T[N] {\n  y[n] = x[n] * 2.0\n}\n")
    main = tmp_path / "main.nf"
    main.write_text("import lib.ops\nmodel m {\n input x: f32[3]\n y = double(x)\n output y\n}\n")
    assert compile_file(main).func("forward").ret.values[0].shape == (3,)
    other = tmp_path / "elsewhere"
    other.mkdir()
    (other / "x.nf").write_text("import lib.ops\nmodel m {\n input x: f32[3]\n output x\n}\n")
    with pytest.raises(CompileError, match="cannot find module 'lib.ops'"):
        compile_file(other / "x.nf")
    compile_file(other / "x.nf", search_paths=[str(tmp_path)])
    (tmp_path / "a.nf").write_text("import b\nop fa(x: T[N]) -> T[N] { y[n] = x[n] }\n")
    (tmp_path / "b.nf").write_text("import a\nop fb(x: T[N]) -> T[N] { y[n] = x[n] }\n")
    with pytest.raises(CompileError) as ei:
        compile_file(tmp_path / "a.nf")
    assert "import cycle: a.nf -> b.nf -> a.nf" in str(ei.value)


def test_file_without_model_has_no_functions_and_model_choice() -> None:
    m = compile_source("op f(x: T[N]) -> T[N] { y[n] = x[n] }", "lib.nf")
    assert m.funcs == [] and m.name == "lib"
    two = "model a {\n input x: f32[2]\n output x\n}\nmodel b {\n input x: f32[3]\n output x\n}"
    with pytest.raises(CompileError, match="several models"):
        compile_source(two, "two.nf")
    assert compile_source(two, "two.nf", model="b").func("forward").args[0].shape == (3,)


def test_examples_and_stdlib_compile_and_verify() -> None:
    root = Path(__file__).resolve().parents[2]
    for path in sorted((root / "examples").glob("*.nf")):
        verify(compile_file(path))
    assert compile_file(root / "nfc" / "std" / "nn.nf").funcs == []


def test_printed_ir_parses_back_identically() -> None:
    from nfc.irparser import parse_module

    root = Path(__file__).resolve().parents[2]
    for path in [root / "examples" / "capsule.nf", root / "examples" / "lstm_cell.nf"]:
        text = print_module(compile_file(path))
        assert print_module(parse_module(text, "x.nfir")) == text
    text = print_module(compile_ok(MLP))
    assert print_module(parse_module(text, "x.nfir")) == text


def test_cli_reports_diagnostics_without_traceback(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    from nfc.cli import main

    bad = tmp_path / "bad.nf"
    bad.write_text("model m {\n  input x: f32[4]\n  y = x +* 2\n  z = nope(x)\n  output x\n}\n")
    assert main(["opt", str(bad)]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "internal error" not in err
    assert f"{bad}:3:10: error: unexpected '*', expected an expression" in err


def test_literal_arguments_take_the_dtype_of_their_parameter() -> None:
    src = """
op scale(x: T[N], s: T[]) -> T[N] {
  y[n] = x[n] * s
}
model m {
  input x: f64[3]
  y = scale(x, 2)
  output y
}"""
    f = compile_ok(src).func("forward")
    assert f.ret.values[0].dtype is DType.F64
