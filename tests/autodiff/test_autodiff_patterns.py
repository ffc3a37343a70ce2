"""Finite-difference checks of gradients of index patterns, written directly in the IR.

Each case is one or two computes whose accesses exercise a part of the index solver: strides,
dilations, padding guards, `//`/`%` reshapes, constant indices, if/else concatenation, max
reductions with ties, repeated accesses.
"""

from __future__ import annotations

import numpy as np
import pytest


@pytest.mark.parametrize("stride,dil,pad", [(1, 1, 0), (2, 1, 1), (2, 2, 2), (3, 2, 1),
                                            (1, 3, 2)])
def test_conv_stride_dilation_padding(gradcheck, parse, conv_ir, rng, stride, dil, pad):
    text, _ = conv_ir(1, 2, 7, 3, 3, stride, dil, pad)
    f = parse(text).func("f")
    x = rng.standard_normal((1, 2, 7, 7))
    w = rng.standard_normal((3, 2, 3, 3))
    gradcheck(f, {"x": x, "w": w}, ["x", "w"], elementwise=0)


def test_grouped_conv(gradcheck, parse, conv_ir, rng):
    text, _ = conv_ir(2, 4, 5, 6, 3, 1, 1, 1, groups=2)
    f = parse(text).func("f")
    gradcheck(f, {"x": rng.standard_normal((2, 4, 5, 5)), "w": rng.standard_normal((6, 2, 3, 3))},
              ["x", "w"], elementwise=0)


def test_depthwise_conv(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%x: tensor<2x3x6x6xf64>, %w: tensor<3x1x3x3xf64>) -> (tensor<2x3x3x3xf64>) {
    %y = nf.compute [n: 2, c: 3, i: 3, j: 3] sum [r: 3, s: 3]
      (select(0 <= i * 2 + r - 1 and i * 2 + r - 1 < 6 and 0 <= j * 2 + s - 1
              and j * 2 + s - 1 < 6, %x[n, c, i * 2 + r - 1, j * 2 + s - 1], 0.0)
       * %w[c, 0, r, s]) : tensor<2x3x3x3xf64>
    nf.return %y : tensor<2x3x3x3xf64>
  }
}
"""
    f = parse(text).func("f")
    gradcheck(f, {"x": rng.standard_normal((2, 3, 6, 6)),
                  "w": rng.standard_normal((3, 1, 3, 3))}, ["x", "w"], elementwise=27)


def test_depth2space(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%x: tensor<2x8x3x2xf64>) -> (tensor<2x2x6x4xf64>) {
    %y = nf.compute [n: 2, c: 2, h: 6, w: 4]
      (%x[n, c * 4 + (h % 2) * 2 + w % 2, h // 2, w // 2]) : tensor<2x2x6x4xf64>
    nf.return %y : tensor<2x2x6x4xf64>
  }
}
"""
    f = parse(text).func("f")
    g = gradcheck(f, {"x": rng.standard_normal((2, 8, 3, 2))}, ["x"])
    assert g["x"].shape == (2, 8, 3, 2)


def test_channel_shuffle(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%x: tensor<2x12x2xf64>) -> (tensor<2x12x2xf64>) {
    %y = nf.compute [n: 2, c: 12, h: 2] (%x[n, (c % 3) * 4 + c // 3, h] * %x[n, c, h])
      : tensor<2x12x2xf64>
    nf.return %y : tensor<2x12x2xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"x": rng.standard_normal((2, 12, 2))}, ["x"])


def test_reshape_two_div_mod(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%x: tensor<3x4x2xf64>) -> (tensor<4x3x2xf64>) {
    %y = nf.compute [a: 4, b: 3, c: 2]
      (%x[(a * 6 + b * 2 + c) // 8, ((a * 6 + b * 2 + c) // 2) % 4, c]) : tensor<4x3x2xf64>
    %z = nf.compute [a: 4, b: 3, c: 2] (exp(%y[a, b, c])) : tensor<4x3x2xf64>
    nf.return %z : tensor<4x3x2xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"x": rng.standard_normal((3, 4, 2))}, ["x"])


def test_concat_if_else(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%a: tensor<3x2xf64>, %b: tensor<4x2xf64>) -> (tensor<7x2xf64>) {
    %y = nf.compute [i: 7, j: 2] (select(i < 3, %a[i, j], %b[i - 3, j] * %b[i - 3, j]))
      : tensor<7x2xf64>
    nf.return %y : tensor<7x2xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"a": rng.standard_normal((3, 2)),
                                      "b": rng.standard_normal((4, 2))}, ["a", "b"])


def test_broadcast_constant_index(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%a: tensor<3x4x1xf64>, %b: tensor<3x4x5xf64>) -> (tensor<3x4x5xf64>) {
    %y = nf.compute [h: 3, w: 4, c: 5] (%a[h, w, 0] * %b[h, w, c] + %b[h, w, 0])
      : tensor<3x4x5xf64>
    nf.return %y : tensor<3x4x5xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"a": rng.standard_normal((3, 4, 1)),
                                      "b": rng.standard_normal((3, 4, 5))}, ["a", "b"])


def test_repeated_accesses_shifted(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%a: tensor<6xf64>) -> (tensor<5xf64>) {
    %y = nf.compute [i: 5] (%a[i] * %a[i + 1] + %a[i] * %a[i] - %a[5 - i]) : tensor<5xf64>
    nf.return %y : tensor<5xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"a": rng.standard_normal(6)}, ["a"])


def test_max_pool_without_ties(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%x: tensor<2x7x7xf64>) -> (tensor<2x3x3xf64>) {
    %y = nf.compute [c: 2, i: 3, j: 3] max [r: 3, s: 3] (%x[c, i * 2 + r, j * 2 + s])
      : tensor<2x3x3xf64>
    nf.return %y : tensor<2x3x3xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"x": rng.standard_normal((2, 7, 7))}, ["x"])


def test_max_pool_ties_go_to_first(parse):
    from nfc.interp import run
    from nfc.passes.autodiff.graph import grad_func

    text = """
nf.module @m {
  nf.func @f(%x: tensor<5xf64>) -> (tensor<f64>) {
    %y = nf.compute [i: 2] max [r: 3] (%x[i * 2 + r]) : tensor<2xf64>
    %l = nf.compute [] sum [i: 2] (%y[i] * f64(i + 1)) : tensor<f64>
    nf.return %l : tensor<f64>
  }
}
"""
    g = grad_func(parse(text).func("f"), ["x"])
    x = np.array([1.0, 3.0, 3.0, 0.0, 3.0])
    # window 0 = x[0:3] ties at 1 and 2 -> 1; window 1 = x[2:5] ties at 2 and 4 -> 2
    np.testing.assert_array_equal(run(g, [x])[1], [0.0, 1.0, 2.0, 0.0, 0.0])


def test_min_and_prod_reductions(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%x: tensor<3x4xf64>) -> (tensor<3xf64>) {
    %a = nf.compute [i: 3] min [k: 4] (%x[i, k] * %x[i, k]) : tensor<3xf64>
    %b = nf.compute [i: 3] prod [k: 4] (%x[i, k] + 1.5) : tensor<3xf64>
    %c = nf.compute [i: 3] (%a[i] + %b[i]) : tensor<3xf64>
    nf.return %c : tensor<3xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"x": rng.standard_normal((3, 4))}, ["x"])


def test_prod_with_zero_factor(parse):
    from nfc.interp import run
    from nfc.passes.autodiff.graph import grad_func

    text = """
nf.module @m {
  nf.func @f(%x: tensor<3xf64>) -> (tensor<f64>) {
    %p = nf.compute [] prod [k: 3] (%x[k]) : tensor<f64>
    nf.return %p : tensor<f64>
  }
}
"""
    g = grad_func(parse(text).func("f"), ["x"])
    np.testing.assert_array_equal(run(g, [np.array([2.0, 0.0, 5.0])])[1], [0.0, 10.0, 0.0])


def test_capsule_conv(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%a: tensor<1x2x5x5x2x2xf64>, %k: tensor<2x2x3x3x2x2xf64>)
      -> (tensor<1x2x2x2x2x2xf64>) {
    %y = nf.compute [b: 1, o: 2, p: 2, q: 2, i: 2, j: 2] sum [c: 2, r: 3, s: 3, t: 2]
      (%a[b, c, p * 2 + r, q * 2 + s, i, t] * %k[o, c, r, s, t, j])
      : tensor<1x2x2x2x2x2xf64>
    nf.return %y : tensor<1x2x2x2x2x2xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"a": rng.standard_normal((1, 2, 5, 5, 2, 2)),
                                      "k": rng.standard_normal((2, 2, 3, 3, 2, 2))},
              ["a", "k"], elementwise=0)


def test_embedding_data_dependent_index(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%ids: tensor<5xi32>, %e: tensor<4x3xf64>) -> (tensor<5x3xf64>) {
    %y = nf.compute [n: 5, d: 3] (%e[%ids[n], d]) : tensor<5x3xf64>
    nf.return %y : tensor<5x3xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"ids": np.array([0, 2, 2, 3, 0], np.int32),
                                      "e": rng.standard_normal((4, 3))}, ["e"])


@pytest.mark.parametrize("fn", ["exp", "log", "sqrt", "rsqrt", "tanh", "sigmoid", "erf", "abs"])
def test_unary_intrinsics(gradcheck, parse, rng, fn):
    text = f"""
nf.module @m {{
  nf.func @f(%x: tensor<6xf64>) -> (tensor<6xf64>) {{
    %y = nf.compute [i: 6] ({fn}(%x[i] * %x[i] + 0.5) * {fn}(%x[i] - 2.0)) : tensor<6xf64>
    nf.return %y : tensor<6xf64>
  }}
}}
"""
    x = rng.uniform(0.2, 1.2, 6) * np.where(rng.random(6) < 0.5, -1, 1)
    if fn in ("log", "sqrt", "rsqrt"):
        text = text.replace(f"{fn}(%x[i] - 2.0)", f"{fn}(2.5 - %x[i])")
    gradcheck(parse(text).func("f"), {"x": x}, ["x"])


def test_binary_intrinsics_and_division(gradcheck, parse, rng):
    text = """
nf.module @m {
  nf.func @f(%x: tensor<6xf64>, %y: tensor<6xf64>) -> (tensor<6xf64>) {
    %z = nf.compute [i: 6] (max(%x[i], %y[i]) * min(%x[i], 0.3) + pow(%y[i] * %y[i] + 1.0,
        %x[i]) + pow(%x[i], 3.0) / (%y[i] * %y[i] + 1.0) - %x[i] / %y[i])
      : tensor<6xf64>
    nf.return %z : tensor<6xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"x": rng.standard_normal(6),
                                      "y": rng.uniform(0.5, 2.0, 6)}, ["x", "y"])


def test_loads_the_bounds_checker_cannot_prove_get_guards(gradcheck, parse, rng):
    # In dX for the load x[i + r], the other factor reads x[z + r] with z = i + r; the
    # checker only knows 0 <= z - r < 5 and r < 3, so that load gets a guard of its own.
    text = """
nf.module @m {
  nf.func @f(%x: tensor<9xf64>, %w: tensor<3xf64>) -> (tensor<5xf64>) {
    %y = nf.compute [i: 5] sum [r: 3] (%x[i + r] * %w[r] * %x[i + 2 * r]) : tensor<5xf64>
    nf.return %y : tensor<5xf64>
  }
}
"""
    gradcheck(parse(text).func("f"), {"x": rng.standard_normal(9),
                                      "w": rng.standard_normal(3)}, ["x", "w"])


def test_float_floor_division_is_reported_all_at_once(parse):
    from nfc.diagnostics import CompileError
    from nfc.passes.autodiff.graph import grad_func

    text = """
nf.module @m {
  nf.func @f(%x: tensor<4xf64>) -> (tensor<f64>) {
    %a = nf.compute [i: 4] (%x[i] // 0.5) : tensor<4xf64> loc("m.nf":3:3)
    %b = nf.compute [i: 4] ((%x[i] + 1.0) // 2.0 + %a[i] % 0.25) : tensor<4xf64> loc("m.nf":4:3)
    %l = nf.compute [] sum [i: 4] (%b[i] * %x[i]) : tensor<f64> loc("m.nf":5:3)
    nf.return %l : tensor<f64>
  }
}
"""
    with pytest.raises(CompileError) as info:
        grad_func(parse(text).func("f"), ["x"])
    diags = info.value.diagnostics
    assert [(d.loc.line, d.severity) for d in diags] == [(3, "error"), (4, "error")]
    assert all("'//' of floating-point values has no useful gradient" in d.message
               for d in diags)


def test_integer_and_index_only_uses_get_no_gradient(parse):
    from nfc.passes.autodiff.graph import reverse_mode

    text = """
nf.module @m {
  nf.func @f(%x: tensor<4xf64>, %k: tensor<4xi32>) -> (tensor<f64>) {
    %a = nf.compute [i: 4] (%x[i32(%x[i] * 0.0) + i] * f64(%k[i])) : tensor<4xf64>
    %l = nf.compute [] sum [i: 4] (%a[i]) : tensor<f64>
    nf.return %l : tensor<f64>
  }
}
"""
    f = parse(text).func("f")
    ops, grads = reverse_mode(f, f.ret.values[0], [f.args[0]])
    # one gather contribution for the value load; none through the index or to %k
    assert len(grads) == 1
    assert not any(op.result.dtype.is_int for op in ops if op.result is grads[0])


def test_stop_gradient_attribute(parse):
    from nfc.interp import run
    from nfc.passes.autodiff.graph import grad_func

    text = """
nf.module @m {
  nf.func @f(%x: tensor<3xf64>) -> (tensor<f64>) {
    %a = nf.compute [i: 3] (%x[i] * %x[i]) {nf.stop_gradient = true} : tensor<3xf64>
    %l = nf.compute [] sum [i: 3] (%a[i] * %x[i]) : tensor<f64>
    nf.return %l : tensor<f64>
  }
}
"""
    g = grad_func(parse(text).func("f"), ["x"])
    x = np.array([1.0, 2.0, -3.0])
    np.testing.assert_array_equal(run(g, [x])[1], x * x)  # d/dx of sum(a * x), a constant


def test_call_on_gradient_path_is_a_located_error(parse):
    from nfc.diagnostics import CompileError
    from nfc.passes.autodiff.graph import grad_func

    text = """
nf.module @m {
  nf.func @g(%a: tensor<3xf64>) -> (tensor<3xf64>) {
    %b = nf.compute [i: 3] (%a[i] * 2.0) : tensor<3xf64>
    nf.return %b : tensor<3xf64>
  }
  nf.func @f(%x: tensor<3xf64>) -> (tensor<f64>) {
    %y = nf.call @g(%x) : (tensor<3xf64>) -> (tensor<3xf64>) loc("m.nf":7:5)
    %l = nf.compute [] sum [i: 3] (%y[i]) : tensor<f64>
    nf.return %l : tensor<f64>
  }
}
"""
    with pytest.raises(CompileError) as info:
        grad_func(parse(text).func("f"), ["x"])
    (d,) = info.value.diagnostics
    assert "cannot differentiate through nf.call @g" in d.message and d.loc.line == 7
    assert "inline" in d.notes[0].message
