"""`nfc fmt` (nfc/format.py): idempotence, comments, program preservation, --check/--diff."""

from __future__ import annotations

import dataclasses
import os
import random
import re
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nfc.cli import main
from nfc.diagnostics import CompileError
from nfc.format import _lex, format_source
from nfc.frontend import compile_source
from nfc.frontend.parser import parse
from nfc.ir import Loc
from nfc.printer import print_module

ROOT = Path(__file__).resolve().parents[2]
REPO_NF = sorted({*ROOT.glob("examples/**/*.nf"), ROOT / "nfc/std/nn.nf",
                  *ROOT.glob("tests/**/*.nf")})


def shape(node: object) -> object:
    """An AST without its locations (so that layout does not count)."""
    if isinstance(node, Loc):
        return None
    if dataclasses.is_dataclass(node) and not isinstance(node, type):
        return (type(node).__name__,
                tuple(shape(getattr(node, f.name)) for f in dataclasses.fields(node)
                      if f.name != "file"))
    if isinstance(node, tuple | list):
        return tuple(shape(x) for x in node)
    return node


def same_program(a: str, b: str) -> None:
    assert shape(parse(a, "a.nf")) == shape(parse(b, "a.nf"))
    assert [(t.type, str(t)) for t in _lex(a)] == [(t.type, str(t)) for t in _lex(b)]


MESSY = """\
import   std . nn   # the library


op   scaled_shift<s:int>( x:T[ N,D ] ,w : T[D])->T[N,D]{
   z[ i in 0 .. 3 ] = -(sum(k)x[i,k])+ - 1.0
        y[n,d]=x[n,(d+s)%D]*w[d]   # shift
}
  # a comment about the model
model tiny(batch=32,hidden=64){
input x:f32[batch,64]
    input y : i32[batch]
 param w1:f32[64,hidden]=he_normal
\tparam b1: f32[hidden] = zeros
 h = relu(linear(x,w1,b1))
   h = scaled_shift< s=3 >(h,  b1)
 if training { h = h*2.0 } else {h=h}
 logits = linear(h,
                 w1, b1)
 loss=sum(n)h[n,0]
 output logits
 minimize loss with sgd(lr=0.05,momentum=0.9)
}



"""

CANONICAL = """\
import std.nn   # the library

op scaled_shift<s: int>(x: T[N, D], w: T[D]) -> T[N, D] {
  z[i in 0..3] = -(sum(k) x[i, k]) + -1.0
  y[n, d] = x[n, (d + s) % D] * w[d]   # shift
}
# a comment about the model
model tiny(batch = 32, hidden = 64) {
  input  x: f32[batch, 64]
  input  y: i32[batch]
  param  w1: f32[64, hidden] = he_normal
  param  b1: f32[hidden] = zeros
  h = relu(linear(x, w1, b1))
  h = scaled_shift<s = 3>(h, b1)
  if training { h = h * 2.0 } else { h = h }
  logits = linear(h,
                  w1, b1)
  loss = sum(n) h[n, 0]
  output logits
  minimize loss with sgd(lr = 0.05, momentum = 0.9)
}
"""


def test_canonical_layout() -> None:
    assert format_source(MESSY, "messy.nf") == CANONICAL
    assert format_source(CANONICAL, "messy.nf") == CANONICAL
    same_program(MESSY, CANONICAL)


def test_printed_ir_is_unchanged() -> None:
    def ir(text: str) -> str:
        printed = print_module(compile_source(text, "messy.nf", training=True), locs=False)
        return re.sub(r"messy\.nf:\d+:\d+", "messy.nf", printed)  # call sites' locations

    assert ir(MESSY) == ir(CANONICAL)


def test_comments_are_kept_in_order() -> None:
    out = format_source(MESSY, "messy.nf")
    assert re.findall(r"#.*", out) == [c.rstrip() for c in re.findall(r"#.*", MESSY)]


def test_newlines_that_matter_are_kept() -> None:
    # `max(j)` followed by a newline is the intrinsic call's `)`, not a reduction head; a
    # statement `if` must start its line. Joining or splitting these lines would change the
    # program, so the formatter keeps every line break.
    src = ("op f(x: T[N, M]) -> T[N] {\n  y[n] = max(j) x[n, j]\n"
           "  z[n] = y[n]\n  if true { z = z }\n}\n")
    assert format_source(src, "f.nf") == src
    src2 = "op f(x: T[N]) -> T[N] {\n  y[n] = x[n] if n < 2\n    else 0.0\n}\n"
    assert format_source(src2, "f.nf") == src2  # a continuation line keeps its indentation
    assert format_source(src2.replace("    else", "else"), "f.nf") == src2  # at least +2


def test_comment_columns() -> None:
    src = "import std.nn   # aligned\nop f(x: T[N]) -> T[N] {   # a\n  y[n] = x[n]#b\n}\n"
    out = format_source(src, "f.nf")
    assert out.splitlines() == ["import std.nn   # aligned", "op f(x: T[N]) -> T[N] {   # a",
                                "  y[n] = x[n]  #b", "}"]


@pytest.mark.parametrize("path", REPO_NF, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_files_idempotent_and_same_program(path: Path) -> None:
    text = path.read_text()
    once = format_source(text, str(path))
    assert format_source(once, str(path)) == once
    same_program(text, once)


def _mutate_spaces(text: str, rnd: random.Random, indent: bool) -> str:
    """`text` with random extra whitespace between tokens (never inside one, never between
    code and a comment), longer runs of blank lines, trailing spaces and, with `indent`, random
    indentation of every line."""
    toks = _lex(text)
    lines = text.split("\n")
    # columns (0-based) where a space may be inserted: before each token but the first of
    # its line, and before comments
    cuts: dict[int, set[int]] = {}
    first_col: dict[int, int] = {}
    for t in toks:
        ln, col = (t.line or 1) - 1, (t.column or 1) - 1
        if ln in first_col:
            cuts.setdefault(ln, set()).add(col)
        else:
            first_col[ln] = col
    out: list[str] = []
    for i, line in enumerate(lines):
        chars = list(line)
        for col in sorted(cuts.get(i, ()), reverse=True):
            chars.insert(col, " " * rnd.randint(0, 3))
        new = "".join(chars)
        if indent and new.strip():
            new = " " * rnd.randint(0, 9) + new.lstrip(" ")
        new += " " * rnd.randint(0, 2)
        out.append(new)
        if not line.strip() and rnd.random() < 0.5:  # a longer run of blank lines
            out.append(" " * rnd.randint(0, 3))
    return "\n".join(out)


SAMPLES = [p for p in REPO_NF if p.stat().st_size < 20_000]


@settings(max_examples=int(os.environ.get("NFC_FMT_EXAMPLES", "30")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLES), st.integers(0, 2**32 - 1), st.booleans())
def test_whitespace_mutations(path: Path, seed: int, indent: bool) -> None:
    text = path.read_text()
    canonical = format_source(text, str(path))
    mutated = _mutate_spaces(text, random.Random(seed), indent)
    out = format_source(mutated, str(path))
    assert format_source(out, str(path)) == out  # idempotent
    same_program(text, out)  # the same program
    if not indent:  # spacing inside lines and blank lines do not matter at all
        assert out == canonical


# ---------------------------------------------------------------------------------------------
# the command line


def test_check_diff_and_in_place(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    good = tmp_path / "good.nf"
    good.write_text(CANONICAL)
    bad = tmp_path / "sub" / "bad.nf"
    bad.parent.mkdir()
    bad.write_text(MESSY)
    assert main(["fmt", "--check", str(tmp_path)]) == 1
    out = capsys.readouterr()
    assert f"would reformat {bad}" in out.out and str(good) not in out.out
    assert bad.read_text() == MESSY  # --check changes nothing
    assert main(["fmt", "--diff", str(bad)]) == 0
    out = capsys.readouterr()
    assert out.out.startswith(f"--- {bad}") and "+  input  x: f32[batch, 64]" in out.out
    assert bad.read_text() == MESSY
    assert main(["fmt", str(tmp_path)]) == 0
    assert bad.read_text() == CANONICAL and good.read_text() == CANONICAL
    assert main(["fmt", "--check", str(tmp_path)]) == 0


def test_syntax_error_is_a_located_diagnostic(tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    bad = tmp_path / "bad.nf"
    text = "op f(x: T[N]) -> T[N] {\n  y[n] = x[n] +\n}\n"
    bad.write_text(text)
    assert main(["fmt", str(bad)]) == 1
    err = capsys.readouterr().err
    assert f"{bad}:3:1: error: unexpected '}}'" in err and "Traceback" not in err
    assert bad.read_text() == text
    assert main(["fmt", "--check", str(bad)]) == 1


def test_stdin(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    import io

    monkeypatch.setattr("sys.stdin", io.StringIO(MESSY))
    assert main(["fmt", "-"]) == 0
    assert capsys.readouterr().out == CANONICAL


def test_repository_is_formatted(capsys: pytest.CaptureFixture[str]) -> None:
    """`nfc fmt --check` passes on the repository's own .nf files."""
    assert main(["fmt", "--check", *map(str, REPO_NF)]) == 0, capsys.readouterr().out


VOCAB = ["(", ")", "[", "]", "{", "}", ",", ":", "=", "-", "+", "*", "<", ">", "..", "...",
         "sum(k)", "max(j)", "if", "else", "x", "0", "1.5", "#c\n", "\n", " ", "->", "op", "."]


@settings(max_examples=int(os.environ.get("NFC_FMT_EXAMPLES", "60")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(SAMPLES), st.lists(st.tuples(st.floats(0, 1), st.integers(0, 3),
                                                   st.sampled_from(VOCAB)), min_size=1,
                                         max_size=4))
def test_token_mutants_format_or_diagnose(path: Path, edits: list) -> None:
    """Whatever the input, `format_source` gives a located CompileError or a formatted text
    that is idempotent and the same program; never another exception."""
    text = path.read_text()
    for where, kind, word in edits:
        toks = _lex(text)
        tok = toks[int(where * (len(toks) - 1))]
        a, b = tok.start_pos or 0, tok.end_pos or 0
        if kind == 0:
            text = text[:a] + text[b:]  # delete a token
        elif kind == 1:
            text = text[:a] + word + text[a:]  # insert before it
        elif kind == 2:
            text = text[:b] + word + text[b:]  # insert after it
        else:
            text = text[:a] + text[a:b] + " " + text[a:]  # duplicate it
    try:
        out = format_source(text, "fuzz.nf")
    except CompileError as err:
        assert all(d.loc is not None for d in err.diagnostics)
        return
    assert format_source(out, "fuzz.nf") == out
    same_program(text, out)
