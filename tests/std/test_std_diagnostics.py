"""Misusing std.nn ops produces located diagnostics, not crashes."""

from __future__ import annotations

import pytest

from nfc.diagnostics import CompileError
from nfc.ir import DType, TensorType

F64, F32, I32 = DType.F64, DType.F32, DType.I32


def t(*shape: int, dtype: DType = F64) -> TensorType:
    return TensorType(tuple(shape), dtype)


#: an indivisible size (a dimension `G * groups` of size 5) says so
INDIVISIBLE = "is not a multiple of"

BAD_USES = [
    # op, argument types, compile-time args, words the first message must contain (| = or)
    ("linear", [t(4, 3), t(5, 2), t(2)], {}, "shape mismatch"),            # K: 3 vs 5
    ("linear", [t(4, 3), t(3, 2), t(3)], {}, "shape mismatch"),            # bias M: 2 vs 3
    ("linear", [t(4, 3), t(3, 2, dtype=F32), t(2)], {}, "dtype"),          # T: f64 vs f32
    ("matmul", [t(4, 3), t(3)], {}, "rank"),
    ("concat2d_axis1", [t(2, 3), t(4, 3)], {}, "shape mismatch"),          # N: 2 vs 4
    ("conv2d", [t(1, 4, 5, 5), t(2, 3, 3, 3)], {}, "shape mismatch"),      # C 4 vs 3
    ("conv2d", [t(1, 4, 5, 5), t(2, 3, 3, 3)], {"groups": 2}, "shape mismatch"),  # 4 vs 3 * 2
    ("conv2d", [t(1, 4, 5, 5), t(3, 2, 3, 3)], {"groups": 2}, INDIVISIBLE),  # O 3 vs 2k
    ("conv2d", [t(1, 1, 2, 2), t(1, 1, 3, 3)], {}, "positive"),            # kernel > image
    ("depth2space", [t(1, 6, 2, 2)], {"r": 2}, INDIVISIBLE),          # 6 vs C * 4
    ("space2depth", [t(1, 1, 5, 4)], {"r": 2}, INDIVISIBLE),          # H 5 vs 2H'
    ("channel_shuffle", [t(1, 5, 2, 2)], {"groups": 2}, INDIVISIBLE),  # 5 vs 2G
    ("slice2d_axis1", [t(2, 5)], {"start": 3, "size": 4}, "can reach 6"),  # column 6 of 5
    ("softmax_cross_entropy", [t(4, 3), t(4)], {}, "i32"),                 # float labels
    ("softmax_cross_entropy", [t(4, 3), t(5, dtype=I32)], {},
     "leading dimensions of argument 2"),                                  # 4 vs 5
    ("max_pool2d", [t(1, 1, 4, 4)], {"stride": 1}, "size"),                # missing `size`
    ("lstm_cell", [t(2, 3), t(2, 4), t(2, 4), t(8, 16), t(16)], {}, "shape mismatch"),  # 8 vs 7
]


@pytest.mark.parametrize("name,types,params,words", BAD_USES,
                         ids=[f"{u[0]}-{i}" for i, u in enumerate(BAD_USES)])
def test_bad_use_is_a_diagnostic(std_compile, name, types, params, words):
    with pytest.raises(CompileError) as info:
        std_compile(name, types, params)
    first = info.value.diagnostics[0]
    assert first.severity == "error" and first.loc is not None
    assert any(w in first.message for w in words.split("|")), first.message


def test_shape_mismatch_points_at_the_call_site():
    from nfc.frontend import compile_source
    src = (
        "import std.nn\n"
        "model m(batch = 2) {\n"
        "  input x: f32[batch, 3]\n"
        "  param w: f32[4, 5] = zeros\n"
        "  param b: f32[5] = zeros\n"
        "  y = linear(x, w, b)\n"
        "  output y\n"
        "}\n"
    )
    with pytest.raises(CompileError) as info:
        compile_source(src, "user.nf")
    d = info.value.diagnostics[0]
    assert d.loc is not None and d.loc.file == "user.nf" and d.loc.line == 6
    text = info.value.render()
    assert "3" in text and "4" in text
