"""Strided vector loads (`ExprEmitter.strided_load`, nfc.codegen.llvm.exprs): a load whose
lanes read `s * l + c` (s = 2, 3, 4: a stride-2 window along the vectorized axis) is one wide
load of `s * width` elements and a `shufflevector` taking every s-th, instead of a load and an
`insertelement` per lane. Checked on the host's code path and the AVX2 one (AVX-512 switched
off, as `NFC_CPU_FEATURES` does): results against the interpreter (bit for bit where the kernel
computes one operation per element, within the error bound for sums), the IR's shape, and
memory safety: the wide load never touches an element no lane reads, run on arrays that end
(or start) at a page the process may not read."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from codegen_lib import assert_matches, compute, inputs_of, ld, random_inputs, reference, tensor

from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.jit import compile_kernel
from nfc.codegen.schedule import Schedule, Split
from nfc.codegen.space import schedule_space
from nfc.ir import Binary, Const, DType, Expr, Index, Select

F32, F64, BF16 = DType.F32, DType.F64, DType.BF16
HERE = Path(__file__).resolve().parent
#: What `NFC_CPU_FEATURES` appends to force the AVX2 path on an AVX-512 host.
AVX2_ONLY = ",-avx512f,-avx512bw,-avx512dq,-avx512vl,-avx512bf16,-avx512vnni"


def _targets() -> list:
    h = host_target()
    return [pytest.param(h, id="host"),
            pytest.param(CpuTarget(h.cpu, h.features + AVX2_ONLY, h.triple), id="avx2")]


TARGETS = _targets()


def _lin(s: int, var: str, c: int) -> Expr:
    return Binary("+", Binary("*", Const(s), Index(var)), Const(c))


def strided_op(s: int, c: int, n: int, j: int, dt: DType, extra: int = 0):
    """`out[n, j] = x[n, s*j + c] * y[n, j]`: one operation per element (bitwise equal to the
    interpreter); `x`'s rows end at the last lane's element plus `extra`, so without `extra`
    the last row's wide load would reach past the end of the buffer."""
    x = tensor("x", (n, s * (j - 1) + c + 1 + extra), dt)
    y = tensor("y", (n, j), dt)
    return compute({"n": n, "j": j}, ld(x, "n", _lin(s, "j", c)) * ld(y, "n", "j"), dt)


def padded_op(s: int, n: int, j: int, w: int, dt: DType = F32):
    """`out[n, j] = x[n, s*j - 1]` where that is inside `x` (0 outside): the lanes of the
    first block read element -1 and the last block past the end, both switched off."""
    x = tensor("x", (n, w), dt)
    y = tensor("y", (n, j), dt)
    k = _lin(s, "j", -1)
    inside = Binary("and", Binary("<=", Const(0), k), Binary("<", k, Const(w)))
    return compute({"n": n, "j": j}, Select(inside, ld(x, "n", k), Const(0.0)) * ld(
        y, "n", "j"), dt)


def vec_schedule(width: int, tail: str = "auto") -> Schedule:
    return Schedule(splits=(Split("j", (width,), tail),), order=("n", "j.0", "j.1"),
                    vectorize="j.1")


def _inputs(op, seed: int = 0) -> list[np.ndarray]:
    ins = random_inputs(inputs_of(op), seed)
    if op.result.type.dtype is BF16:
        import ml_dtypes

        ins = [x.astype(ml_dtypes.bfloat16).astype(np.float32) for x in ins]
    return ins


def _f32(x) -> np.ndarray:
    return np.asarray(x).astype(np.float32)


def _shuffle_mask(s: int, width: int) -> str:
    return "<i32 " + ", i32 ".join(str(s * k) for k in range(width)) + ">"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dt", [F32, F64, BF16], ids=str)
@pytest.mark.parametrize("s,c,j,width,tail", [
    (2, 0, 16, 8, "auto"),    # whole vectors, the last one ending at the buffer's end
    (2, 1, 19, 8, "guard"),   # ragged: masked lanes, clamped indices
    (2, 1, 21, 16, "peel"),   # ragged: full vectors, then a peeled masked block
    (3, 2, 13, 8, "auto"),
    (3, 0, 10, 4, "guard"),
    (4, 3, 9, 8, "auto"),
])
def test_strided_loads_match_the_interpreter_bitwise(s, c, j, width, tail, dt, target):
    op = strided_op(s, c, 3, j, dt)
    kernel = compile_kernel(op, vec_schedule(width, tail), target=target)
    ins = _inputs(op, 1)
    got = kernel(*ins)
    np.testing.assert_array_equal(_f32(got), _f32(reference(op, ins)[0]))
    # the shape of the load: one wide vector and a shuffle, no insertelement per lane
    ir = kernel.ir_text
    assert _shuffle_mask(s, width) in ir
    assert ir.count("insertelement") < width
    bits = {F32: "f32", F64: "f64", BF16: "i16"}[dt]
    assert f"<{s * width} x " in ir and f"v{s * width}{bits}" in ir  # masked wide loads


def test_the_wide_load_is_plain_where_the_buffer_holds_it():
    """Rows padded by `s - 1` elements: the interval of the offset proves the wide load's
    last element inside the buffer, so it is an ordinary vector load; without the padding
    the last row's would read past the end, so it is masked to the lanes' elements."""
    s, width = 2, 8
    padded = compile_kernel(strided_op(s, 1, 3, 16, F32, extra=s - 1), vec_schedule(width))
    assert "llvm.masked.load" not in padded.ir_text
    assert f"load <{s * width} x float>" in padded.ir_text
    tight = compile_kernel(strided_op(s, 1, 3, 16, F32), vec_schedule(width))
    assert f"llvm.masked.load.v{s * width}f32" in tight.ir_text


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("s,j,w", [(2, 8, 16), (2, 11, 21), (3, 7, 19)])
def test_padded_reads_mask_the_switched_off_lanes(s, j, w, target):
    op = padded_op(s, 2, j, w)
    kernel = compile_kernel(op, vec_schedule(8, "guard"), target=target)
    ins = _inputs(op, 2)
    np.testing.assert_array_equal(kernel(*ins), reference(op, ins)[0])
    assert _shuffle_mask(s, 8) in kernel.ir_text


def test_switch_off_gathers_lane_by_lane(monkeypatch):
    """`NFC_STRIDED_LOADS=0` (for comparisons) emits the former per-lane gather, the same
    results, and another kernel key (a cached object of one is never used for the other)."""
    from nfc.codegen.artifact.kcache import kernel_key

    op = strided_op(2, 1, 3, 16, F32)
    sched = vec_schedule(8)
    on = compile_kernel(op, sched)
    key_on = kernel_key(op, sched, host_target())
    monkeypatch.setenv("NFC_STRIDED_LOADS", "0")
    off = compile_kernel(op, sched)
    assert kernel_key(op, sched, host_target()) != key_on
    assert _shuffle_mask(2, 8) not in off.ir_text
    assert off.ir_text.count("insertelement") >= 8
    ins = _inputs(op)
    np.testing.assert_array_equal(on(*ins), off(*ins))


def _depthwise_s2(n: int, c: int, h: int):
    """A 3 x 3 depthwise convolution, stride 2, padding 1 (MobileNet's second layer in
    small): the lanes along the output width read the input with stride 2."""
    o = (h + 2 - 3) // 2 + 1
    x, k = tensor("x", (n, c, h, h)), tensor("k", (c, 3, 3))
    row, col = _lin(2, "i", -1), _lin(2, "j", -1)
    row = Binary("+", row, Index("r"))
    col = Binary("+", col, Index("s"))
    inside = Binary("and", Binary("and", Binary("<=", Const(0), row), Binary("<", row, Const(h))),
                    Binary("and", Binary("<=", Const(0), col), Binary("<", col, Const(h))))
    body = Select(inside, ld(x, "n", "c", row, col), Const(0.0)) * ld(k, "c", "r", "s")
    return compute({"n": n, "c": c, "i": o, "j": o}, body, reduce="sum",
                   raxes={"r": 3, "s": 3})


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("h", [16, 19])
@pytest.mark.parametrize("phase_pack", [True, False], ids=["phase-pack", "direct"])
def test_stride2_depthwise_convolution(h, phase_pack, target):
    """The default schedule (lanes along the output width) with its phase pack, whose copy
    reads the input with stride 2, and without it (the kernel reads it with stride 2)."""
    import dataclasses

    op = _depthwise_s2(2, 3, h)
    space = schedule_space(op, target)
    sched = space.to_schedule(space.default())
    assert sched.pack, "the default schedule phase-packs the strided input"
    if not phase_pack:
        sched = dataclasses.replace(sched, pack=())
    kernel = compile_kernel(op, sched, target=target)
    assert "shufflevector" in kernel.ir_text
    ins = _inputs(op, 3)
    assert_matches(op, ins, [kernel(*ins)])


_GUARDED = textwrap.dedent("""
    import ctypes, mmap, sys
    import numpy as np
    sys.path.insert(0, sys.argv[1])
    from test_codegen_strided_loads import TARGETS, padded_op, strided_op, vec_schedule
    from codegen_lib import inputs_of, reference
    from nfc.codegen.jit import compile_kernel, memory_dtype
    from nfc.ir import DType

    page = mmap.PAGESIZE
    mem = mmap.mmap(-1, 3 * page)
    base = ctypes.addressof(ctypes.c_char.from_buffer(mem))
    libc = ctypes.CDLL(None)
    libc.mprotect.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    assert libc.mprotect(base, page, 0) == 0 and libc.mprotect(base + 2 * page, page, 0) == 0

    def placed(a, at_end):
        # `a` copied into the middle page, flush against the unreadable page after (or before)
        off = 2 * page - a.nbytes if at_end else page
        v = np.frombuffer(mem, a.dtype, a.size, off).reshape(a.shape)
        v[...] = a
        return v

    rng = np.random.default_rng(0)
    cases = [(strided_op(s, c, 3, j, dt), w, tail, True)
             for s, c, j, w, tail in [(2, 0, 16, 8, "auto"), (2, 1, 19, 8, "guard"),
                                      (3, 2, 13, 8, "peel"), (4, 0, 9, 8, "guard")]
             for dt in (DType.F32, DType.F64, DType.BF16)]
    cases += [(padded_op(s, 2, j, w), 8, "guard", at_end)
              for s, j, w in [(2, 8, 16), (3, 7, 19)] for at_end in (True, False)]
    for target in TARGETS:
        for op, w, tail, at_end in cases:
            kernel = compile_kernel(op, vec_schedule(w, tail), target=target.values[0])
            ins = [rng.standard_normal(v.shape).astype(memory_dtype(v.dtype))
                   for v in inputs_of(op)]
            out = np.empty(op.result.type.shape, memory_dtype(op.result.type.dtype))
            kernel.run([out], [placed(ins[0], at_end), ins[1]])
            want = reference(op, [x.astype(np.float32) if x.dtype.itemsize == 2 else x
                                  for x in ins])[0]
            np.testing.assert_array_equal(out.astype(np.float64),
                                          np.asarray(want).astype(out.dtype).astype(np.float64))
    print("ok", len(cases) * len(TARGETS))
""")


def test_wide_loads_stay_inside_the_buffer():
    """Every strided case on arrays flush against an unreadable page: a wide load that
    touched an element past the end (or before the start) of its array would crash the
    subprocess."""
    res = subprocess.run([sys.executable, "-c", _GUARDED, str(HERE)], capture_output=True,
                         text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert res.stdout.startswith("ok")
