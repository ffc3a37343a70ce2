"""Ops that nothing calls are checked too: the signature for all sizes, the body at sample
sizes, reporting what fails at every sample (nfc.frontend.uncalled)."""

from __future__ import annotations

from pathlib import Path

import pytest

from nfc.cli import main
from nfc.diagnostics import CompileError, Diagnostic
from nfc.frontend import compile_file, compile_source, uncalled

ROOT = Path(__file__).resolve().parents[2]

# the reproductions of the report: each passed `nfc opt` and `nfc compile` with exit 0
BUGGY = """op neg(x: T[N]) -> T[N] {
  z = zeros<[-3]>
  y[i] = x[i]
}
op divz(x: T[N]) -> T[N] {
  y[i] = x[i // 0]
}
op oob(x: T[N]) -> T[N] {
  y[i] = x[i + 1]
}
op amb(x: T[N]) -> T[N] {
  y[i] = sum(k) x[i] * 2.0
}
op fidx(x: f32[N], ix: f32[N]) -> f32[N] {
  y[i] = x[ix[i]]
}
"""
BUGGY_ERRORS = [
    "2:7: 'zeros' has size -3 in dimension 0; sizes must be positive",
    "6:12: '//' in an index needs a positive constant, found 0",
    "9:12: access 'x' dimension 0 can reach 5 but the tensor has size 5",
    "12:14: cannot infer the range of index 'k': it is never used alone as a subscript; give "
    "its range explicitly, e.g. `sum(k in 0..N)`",
    "15:12: float tensor 'ix' cannot be used as an index; indices must be integers",
]
MODEL = """model m(batch = 2) {
  input x: f32[batch, 3]
  output x
}
"""


def diags(src: str, **kw: object) -> list[Diagnostic]:
    with pytest.raises(CompileError) as ei:
        compile_source(src, "u.nf", **kw)  # type: ignore[arg-type]
    return ei.value.diagnostics


def located(ds: list[Diagnostic]) -> list[str]:
    return [f"{d.loc.line}:{d.loc.col}: {d.message}" for d in ds if d.loc is not None]


def test_uncalled_ops_of_an_op_file_are_checked() -> None:
    ds = diags(BUGGY)
    assert located(ds) == BUGGY_ERRORS
    # each says where it was checked and with which sizes; the fake call leaves no note
    assert [n.message for n in ds[0].notes] == [
        "op 'neg' is not called, so it was checked as if called with N = 5, T = f32"]
    assert ds[0].notes[0].loc is not None and ds[0].notes[0].loc.line == 1
    assert [n.message for n in ds[2].notes] == [
        "'x' declared here as f32[N] with N = 5",
        "op 'oob' is not called, so it was checked as if called with N = 5, T = f32"]


def test_uncalled_ops_of_a_model_file_are_checked() -> None:
    """The model does not call the ops: before, `compile` of this file succeeded."""
    assert located(diags(BUGGY + MODEL)) == BUGGY_ERRORS


@pytest.mark.parametrize("command", ["opt", "compile"])
def test_cli_exits_1_with_located_errors(command: str, tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    src = tmp_path / "ops.nf"
    src.write_text(BUGGY + MODEL)
    out = tmp_path / "ops.so"
    argv = [command, str(src)] + (["-o", str(out)] if command == "compile" else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and not out.exists()
    for e in BUGGY_ERRORS:
        line, col, msg = e.split(":", 2)
        assert f"{src}:{line}:{col}: error:{msg}" in err


def test_called_ops_are_not_sampled_and_helpers_are(monkeypatch: pytest.MonkeyPatch) -> None:
    sampled: list[str] = []
    real = uncalled._OpCheck.elaborate

    def spy(self: uncalled._OpCheck, *a: object) -> list[Diagnostic]:
        sampled.append(self.op.name)
        return real(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(uncalled._OpCheck, "elaborate", spy)
    src = """op good(x: T[N, D]) -> T[N, D] {
  y[n, d] = x[n, d] * 2.0
}
op helper(x: T[N, D], w: T[D, M]) -> T[N, M] {
  y[n, m] = sum(d) x[n, d] * w[d, m + 1]
}
model m(batch = 3) {
  input x: f32[batch, 4]
  y = good(x)
  output y
}
"""
    ds = diags(src)
    assert located(ds) == ["5:35: access 'w' dimension 1 can reach 5 but the tensor has size 5"]
    assert ds[0].notes[-1].message == ("op 'helper' is not called, so it was checked as if "
                                       "called with N = 7, D = 6, M = 5, T = f32")
    assert sampled == ["helper"] * 4  # descending, ascending; then both with T = i32


def test_size_dependent_errors_are_left_to_the_calls() -> None:
    """An error that only some sizes provoke is a precondition, reported where a call breaks
    it; an error at every sample is reported at the definition."""
    preconditions = """op cross(x: T[N, D], w: T[D, M]) -> T[N, M] {
  y[n, m] = sum(d) x[n, d] * w[d, n]
}
op second(x: T[N]) -> T[] {
  y = x[1]
}
"""
    always = """op always(x: T[N, D], w: T[D, M]) -> T[N, M] {
  y[n, m] = sum(d) x[n, d] * w[d + 1, m]
}
"""
    # `cross` reads w[d, n]: out of bounds when N > M (the descending sample), fine when
    # N <= M (the ascending one); `second` fails only for N = 1; `always` fails at every size
    ds = diags(preconditions + always)
    assert located(ds) == ["8:32: access 'w' dimension 0 can reach 6 but the tensor has size 6"]
    assert ds[0].notes[-1].message == ("op 'always' is not called, so it was checked as if "
                                       "called with N = 7, D = 6, M = 5, T = f32")
    # a call with sizes that break the preconditions reports them, with those sizes
    call = preconditions + """model m {
  input x: f32[2, 3]
  input w: f32[3, 1]
  input v: f32[1]
  y = cross(x, w)
  z = second(v)
  output y, z
}
"""
    assert located(diags(call)) == [
        "2:35: access 'w' dimension 1 can reach 1 but the tensor has size 1",
        "5:9: access 'x' dimension 0 can reach 1 but the tensor has size 1"]


def test_signature_dimensions_are_checked_for_all_sizes() -> None:
    src = """op shrink(x: T[N]) -> T[N - 2 * N] {
  y[i] = x[i]
}
op negative(x: T[-1, N]) -> T[N] {
  y[i] = x[0, i]
}
op later(x: T[N]) -> T[N - 10] {
  y[i] = x[i + 10]
}
op param<k: int>(x: T[N]) -> T[N - k] {
  y[i] = x[i + k]
}
"""
    # N - 10 is positive for N > 10 and N - k for N > k: not errors (and `later` is skipped at
    # the samples, whose sizes make its result empty)
    assert located(diags(src)) == [
        "1:25: a dimension of the result is N - 2 * N, at most -1 for positive sizes; sizes "
        "must be positive",
        "4:18: a dimension of 'x' is -1; sizes must be positive"]


def test_dtype_variables_used_as_ids_are_sampled_as_integers() -> None:
    src = """op gather(E: T[V, D], ids: I[N]) -> T[N, D] {
  y[n, d] = E[ids[n], d]
}
op ints_only(x: T[N]) -> T[N] {
  y[i] = x[i] // 2 + x[i] % 3
}
op both(x: T[N], ids: T[N]) -> T[N] {
  y[n] = x[ids[n]] * 2
}
"""
    assert compile_source(src, "u.nf").funcs == []


def test_ops_with_definition_errors_are_not_elaborated_again() -> None:
    src = """op f(x: T[N]) -> T[N] {
  y[i] = x[i + 1] + nosuch[i]
}
"""
    # the unknown name is reported once, by the definition check; no sample cascades
    assert located(diags(src)) == ["2:21: unknown name 'nosuch'"]


def test_uncalled_op_calling_ops_with_wrong_shapes() -> None:
    src = """import std.nn
op block(x: T[N, D], w: T[D, D]) -> T[N, D] {
  y = linear_nobias(x, transpose2d(reshape<[D, D]>(w)))
  z = matmul(y, w)
  h = matmul(x, x)
}
"""
    ds = diags(src)
    assert [d.message.split(":")[0] for d in ds] == [
        "shape mismatch for argument 2 of 'matmul'"]
    assert ds[0].loc is not None and ds[0].loc.line == 5


def test_ops_with_list_parameters_get_only_the_signature_check(
        monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = uncalled._OpCheck.elaborate

    def spy(self: uncalled._OpCheck, *a: object) -> list[Diagnostic]:
        calls.append(self.op.name)
        return real(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(uncalled._OpCheck, "elaborate", spy)
    src = """op perm<p: ints>(x: T[N, M]) -> T[M, N] {
  y = transpose<perm = p>(x)
}
op fine(x: T[N]) -> T[N] {
  y[i] = x[i]
}
"""
    assert compile_source(src, "u.nf").funcs == []
    assert calls == ["fine"]


def test_stdlib_and_examples_pass_and_are_really_sampled(
        monkeypatch: pytest.MonkeyPatch) -> None:
    sampled: list[str] = []
    real = uncalled._OpCheck.elaborate

    def spy(self: uncalled._OpCheck, *a: object) -> list[Diagnostic]:
        sampled.append(self.op.name)
        return real(self, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(uncalled._OpCheck, "elaborate", spy)
    assert compile_file(ROOT / "nfc" / "std" / "nn.nf").funcs == []
    # every op of the library is elaborated at a sample, and passes at the first
    assert {"conv2d", "max_pool2d", "slice2d_axis0", "layer_norm", "embedding",
            "lstm_cell", "depth2space"} <= set(sampled)
    assert len(sampled) == len(set(sampled)) >= 50
    for path in sorted((ROOT / "examples").rglob("*.nf")):
        compile_file(path)


def test_ops_too_big_to_sample_are_left_to_their_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    """Sampling elaborates at most SAMPLE_STATEMENTS per sample: a bigger op is not built
    (it is estimated first), nor reported; its calls check it within the real budget."""
    emitted: list[object] = []
    monkeypatch.setattr(uncalled.Ctx, "emit", lambda self, op: emitted.append(op))
    src = """op big(x: T[N]) -> T[N] {
  y = x
  for t in 0..200000 { y = y * 1.0 }
}
"""
    assert compile_source(src, "u.nf").funcs == []
    assert emitted == []
    # the same op with 20 iterations is elaborated at a sample
    assert compile_source(src.replace("200000", "20"), "u.nf").funcs == []
    assert len(emitted) == 20
