"""Diagnostics: each error class with its message and line:col, all independent errors of a
file, cascade suppression, and the limits."""

from __future__ import annotations

import time

import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_source

LINEAR = """op linear(x: T[N, K], w: T[K, M], b: T[M]) -> T[N, M] {
  out[n, m] = (sum(k) x[n, k] * w[k, m]) + b[m]
}
"""


def errors(src: str, **kw: object) -> list[str]:
    """`line:col: message` of every diagnostic."""
    with pytest.raises(CompileError) as ei:
        compile_source(src, "e.nf", **kw)  # type: ignore[arg-type]
    return [f"{d.loc.line}:{d.loc.col}: {d.message}" if d.loc else d.message
            for d in ei.value.diagnostics]


def model(*lines: str, params: str = "") -> str:
    return f"model m{params} {{\n" + "\n".join(lines) + "\n}\n"


def test_bounds_violation_matches_the_style_guide() -> None:
    src = """op capsule_conv<stride: int = 2>(A: f32[B, C, H, W, 4, 4], K: f32[O, C, 3, 3, 4, 4]) -> f32[B, O, (H - 3) // stride + 1, (W - 3) // stride + 1, 4, 4] {
  out[b, o, p, q, i, j] = sum(c, r, s, t) A[b, c, p*stride + r + 2, q*stride + s, i, t] * K[o, c, r, s, t, j]
}
model m {
  input x: f32[2, 3, 30, 30, 4, 4]
  param k: f32[5, 3, 3, 3, 4, 4] = zeros
  y = capsule_conv(x, k)
  output y
}
"""  # noqa: E501
    with pytest.raises(CompileError) as ei:
        compile_source(src, "capsule.nf")
    text = ei.value.render()
    assert text.splitlines()[0] == ("capsule.nf:2:51: error: access 'A' dimension 2 can reach "
                                    "30 but the tensor has size 30")
    assert "^~~~~~~~~~~~~~~~\n" in text  # underlines `p*stride + r + 2`
    assert ("capsule.nf:1:34: note: 'A' declared here as f32[B, C, H, W, 4, 4] with H = 30"
            in text)
    assert "capsule.nf:7:7: note: in op 'capsule_conv' called here" in text


def test_negative_index_and_unguarded_shift() -> None:
    src = model(" input x: f32[5]", " y[i in 0..5] = x[i - 1]", " z[i] = x[i + 1] + x[i]",
                " output y")
    assert errors(src) == ["3:19: access 'x' dimension 0 can reach -1 but indices start at 0",
                           "4:11: access 'x' dimension 0 can reach 5 but the tensor has size 5"]


def test_unification_mismatch_shows_expected_and_actual() -> None:
    src = LINEAR + model(" input x: f32[2, 784]", " param w: f32[256, 10] = zeros",
                         " param b: f32[10] = zeros", " y = linear(x, w, b)", " output y")
    with pytest.raises(CompileError) as ei:
        compile_source(src, "e.nf")
    d = ei.value.diagnostics[0]
    assert (d.loc.line, d.loc.col) == (8, 16)
    assert d.message == ("shape mismatch for argument 2 of 'linear': expected T[K, M] = "
                         "f32[784, ?], got f32[256, 10]")
    assert [n.message for n in d.notes] == ["parameter 'w' declared here as T[K, M]",
                                           "K = 784 was bound by argument 1 dimension 1"]
    assert (d.notes[0].loc.line, d.notes[0].loc.col) == (1, 23)


def test_rank_dtype_and_arity_errors_at_calls() -> None:
    src = LINEAR + model(" input x: f32[2, 3, 4]", " input v: f64[2, 3]", " input w: f32[3, 4]",
                         " input b: f32[4]", " a = linear(x, w, b)", " c = linear(v, w, b)",
                         " d = linear(v, w)", " output w")
    assert errors(src) == [
        "9:13: argument 1 of 'linear' has rank 3 (f32[2, 3, 4]) but parameter 'x' expects rank 2",
        "10:16: argument 2 of 'linear' has dtype f32 but parameter 'w' expects T = f64 "
        "(bound by argument 1)",
        "11:6: op 'linear' takes 3 arguments but 2 were given",
    ]


def test_all_independent_errors_are_reported_without_cascades() -> None:
    src = model(" input x: f32[4]",
                " a = x + undefined",      # unknown name
                " b = a * 2.0",            # uses the failed `a`: no second error
                " c = b + a",
                " d = x + f64(x)",         # independent type error
                " e = undefined * 3.0",    # the same unknown name: reported once
                " f = relu(x)",
                " output x")
    assert errors(src) == [
        "3:10: unknown name 'undefined'",
        "6:6: type mismatch: f32 and f64; convert one with a cast such as f32(...)",
        "8:6: unknown op or function 'relu'",
    ]


def test_did_you_mean_suggestions() -> None:
    src = LINEAR + model(" input xs: f32[2, 3]", " param w: f32[3, 4] = zeros",
                         " param b: f32[4] = zeros", " y = linaer(xs, w, b)", " z = x + 1.0",
                         " output w")
    assert errors(src) == ["8:6: unknown op or function 'linaer'; did you mean 'linear'?",
                           "9:6: unknown name 'x'; did you mean 'xs'?"]


def test_range_inference_errors() -> None:
    src = model(" input x: f32[4, 8]", " input w: f32[5, 8]",
                " y[i] = sum(k) x[i, k] * w[i, k]", " z[i] = sum(k) x[i, 0]",
                " q[i] = 1.0", " output x")
    assert errors(src) == [
        "4:28: conflicting ranges for index 'i': 'x' dimension 0 has size 4 but 'w' dimension "
        "0 has size 5",
        "5:13: cannot infer the range of index 'k': it is never used alone as a subscript; "
        "give its range explicitly, e.g. `sum(k in 0..N)`",
        "6:4: cannot infer the range of index 'i': it is never used alone as a subscript; give "
        "its range explicitly, e.g. `t[i in 0..N] = ...`",
    ]


def test_dtype_rules_for_indices() -> None:
    src = model(" input x: f32[4, 8]", " input f: f32[4]", " y[i, j] = x[f[i], j]",
                " z[i, j] = x[i, j] + x[i, j * i]", " w[i, j] = x[i, j] * i", " output x")
    assert errors(src) == [
        "4:14: float tensor 'f' cannot be used as an index; indices must be integers",
        "5:27: index expression is not affine: one factor of '*' must be a compile-time "
        "constant",
        "6:12: integer index expression used as a f32 value; cast it with f32(...)",
    ]


def test_duplicates_and_model_only_statements() -> None:
    src = ("op f(x: T[N], x: T[N]) -> T[N] {\n  input q: f32[2]\n  y[n] = x[n]\n}\n"
           "op f(x: T[N]) -> T[N] { y[n] = x[n] }\n"
           + model(" input a: f32[2]", " input a: f32[2]", " output a"))
    assert errors(src) == [
        "5:1: op 'f' is defined twice",
        "1:15: 'x' is declared twice in the signature of 'f'",
        "2:3: 'input' statements are only allowed in a model",
        "8:8: 'a' is already declared",
    ]


def test_op_definition_checks_without_calls() -> None:
    src = ("op g(x: T[N]) -> (y: T[N], z: U[N]) {\n  y[i] = x[i] + qq\n}\n"
           "op h(x: flaot[N]) -> T[M] {\n  y[i] = x[i]\n}\n")
    assert errors(src) == [
        "1:31: dtype variable 'U' of the result is not bound by any parameter",
        "2:17: unknown name 'qq'",
        "1:28: output 'z' of 'g' is never assigned",
        "4:9: unknown dtype 'flaot'",
        "4:22: dtype variable 'T' of the result is not bound by any parameter",
        "4:24: 'M' in the result type is not bound by any parameter",
    ]


def test_compile_time_parameter_errors() -> None:
    src = ("op pad<p: int>(x: T[N]) -> T[N + 2*p] {\n"
           "  y[n] = x[n - p] if p <= n < N + p else 0.0\n}\n"
           + model(" input x: f32[4]", " a = pad(x)", " b = pad<pp = 1>(x)",
                   " c = pad<p = 1.5>(x)", " d = pad<p = 1>(x)", " output d"))
    assert errors(src) == [
        "6:6: op 'pad' needs the compile-time argument 'p' (`pad<p = ...>(...)`)",
        "7:10: op 'pad' has no compile-time parameter 'pp'; did you mean 'p'?",
        "8:10: compile-time parameter 'p' is int but the argument is 1.5",
    ]


def test_model_level_errors() -> None:
    src = model(" input x: f32[4]", " param w: f32[4]", " param v: f32[4] = gaussian",
                " update x = x", " minimize x with sgdd(lr = 0.1)", " output nothing")
    assert errors(src) == [
        "3:2: param 'w' needs an initializer, e.g. `= normal(0.0, 0.1)`",
        "4:20: unknown initializer 'gaussian' (known: normal, uniform, const, zeros, ones, "
        "glorot_uniform, he_normal)",
        "5:9: 'x' is not a state; declare it with `state x: ...`",
        "6:11: the loss must be a float scalar, but 'x' is f32[4]",
        "7:9: unknown name 'nothing'",
    ]
    assert errors(model(" input x: f32[4]")) == [
        "1:1: model 'm' produces nothing: add `minimize loss with sgd(lr = 0.1)` or "
        "`output name`"]
    assert errors(model(" input x: f32[n]", " output x", params="(n = 2)"),
                  params={"nn": 3}) == ["1:1: model 'm' has no parameter 'nn'; did you mean 'n'?"]


def test_multiple_results_and_non_compile_time_if() -> None:
    src = ("op two(x: T[N]) -> (a: T[N], b: T[N]) {\n  a[n] = x[n]\n  b[n] = x[n]\n}\n"
           + model(" input x: f32[4]", " y = two(x)", " p, q, r = two(x)",
                   " if x { z = x }", " output x"))
    assert errors(src) == [
        "7:6: op 'two' returns 2 results; assign them to as many names (`a, b = two(...)`)",
        "8:2: 3 names are assigned but the right-hand side has 2 results",
        "9:5: the condition of a statement `if` must be a compile-time boolean; for "
        "element-wise choices write `a if c else b`",
    ]


def test_recursion_and_reduction_minus_hint() -> None:
    src = ("op f(x: T[N]) -> T[N] {\n  y = g(x)\n}\nop g(x: T[N]) -> T[N] {\n  y = f(x)\n}\n"
           + model(" input x: f32[4]", " y = f(x)", " z[i] = x[i] + max(j) -x[j]", " output y"))
    errs = errors(src)
    assert errs[0] == "5:7: op 'f' calls itself (f -> g -> f); recursion cannot be inlined"
    assert errs[1].startswith("10:16: 'max' takes 2 arguments but 1 was given; a reduction "
                              "`max(j) body` needs its body on the same line, and the body "
                              "cannot start with '-'")


def test_limits_are_refused_quickly(monkeypatch: pytest.MonkeyPatch) -> None:
    t = time.perf_counter()
    assert errors(model(" input x: f32[10000000000, 10000000000000]", " output x")) == [
        "2:11: 'x' of shape [10000000000, 10000000000000] has more than 2^40 elements (the "
        "limit of this compiler)"]
    assert errors(model(" input x: f32[0]", " output x")) == [
        "2:11: 'x' has size 0 in dimension 0; sizes must be positive"]
    budget = ("more than the budget of 1000000 statements after unrolling loops and inlining "
              "ops (set NFC_MAX_STATEMENTS to raise it)")
    assert errors(model(" input x: f32[2]", " for i in 0..10000000 { y = x }", " output x")) \
        == [f"3:2: loop of 10000000 iterations (2 statements each) would elaborate at least "
            f"20000000 statements, {budget}"]
    nested = model(" input x: f32[2]",
                   " for i in 0..100000 { for j in 0..100000 { y = 1 } }", " output x")
    assert errors(nested) == [  # estimated before the outer loop runs once
        f"3:2: loop of 100000 iterations (200002 statements each) would elaborate at least "
        f"20000200000 statements, {budget}"]
    # bounds that depend on an outer loop are estimated when that loop gets there
    triangle = model(" input x: f32[2]", " for i in 0..1000 { for j in 0..i { y = 1 } }",
                     " output x")
    monkeypatch.setenv("NFC_MAX_STATEMENTS", "20000")
    assert errors(triangle) == [
        "3:21: loop of 140 iterations (2 statements each) would elaborate at least 280 "
        "statements after the 19744 before it, more than the budget of 20000 statements "
        "after unrolling loops and inlining ops (set NFC_MAX_STATEMENTS to raise it)"]
    monkeypatch.undo()
    assert errors("model m {\n x = " + "-" * 250 + "1\n}") == [
        "2:56: expression nested more than 200 deep"]
    assert time.perf_counter() - t < 20


def test_oversized_source_is_refused() -> None:
    from nfc.frontend.limits import MAX_SOURCE_BYTES

    src = "#" * (MAX_SOURCE_BYTES + 1)
    assert errors(src) == [f"1:1: source file is {MAX_SOURCE_BYTES + 1} bytes, more than the "
                           f"limit of {MAX_SOURCE_BYTES}"]


def test_huge_shapes_and_names_are_refused_with_short_messages() -> None:
    assert errors(model(" input x: f32[10000000000000000000000]", " output x")) == [
        "2:11: 'x' of shape [10000000000000000000000] has more than 2^40 elements (the limit "
        "of this compiler)"]
    long = "v" * 100_000
    assert errors(model(" input x: f32[2]", f" y = x + {long}", " output x")) == [
        "3:10: unknown name '" + "v" * 37 + "...'"]


def test_index_variable_in_a_tensor_level_statement() -> None:
    assert errors(model(" input x: f32[4]", " y = x[i] * 2.0", " z = x[2]", " output z")) == [
        "3:8: unknown name 'i': index variables exist only in comprehensions (`t[i, ...] = "
        "...`) and reductions"]
