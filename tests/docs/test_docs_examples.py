"""Every code block of docs/language.md is run, and every op signature docs/stdlib.md shows is
std.nn's.

A block is handled by what precedes it: an HTML comment `<!-- doctest: KIND ... -->` right
before the fence says how (invisible in the rendered page), else its language decides:

- no directive, no language: a `.nf` file; it compiles (a file of ops has them checked at sample
  sizes), and each model in it runs in the interpreter and takes a training step;
- `python`: it parses, and the names it imports exist;
- `doctest: parse`: it parses (a signature whose `{ ... }` stands for a body);
- `doctest: in` + a program with a line `BODY`: the block's lines replace `BODY`, then as a file;
- `doctest: output of` + a program: the block is what the compiler prints for that program
  (the `file:line:col: severity: message` lines; the file name is the block's).

A block of a new kind fails here until it gets a directive.
"""

from __future__ import annotations

import ast as pyast
import importlib
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from nfc.diagnostics import CompileError
from nfc.frontend import compile_source
from nfc.frontend.parser import parse
from nfc.interp import run
from nfc.passes.autodiff.train import add_training_functions
from nfc.verifier import verify

ROOT = Path(__file__).resolve().parents[2]
LANGUAGE = ROOT / "docs" / "language.md"
STDLIB = ROOT / "docs" / "stdlib.md"

_FENCE = re.compile(r"^( *)```(\w*)\n(.*?)^\1```", re.S | re.M)
_DIRECTIVE = re.compile(r"<!-- doctest: (\w+)[^\n]*\n?(.*?)-->\s*$", re.S)


@dataclass
class Block:
    """A fenced block: where it starts, its language, text, and directive (kind, payload)."""

    line: int
    lang: str
    text: str
    kind: str | None
    payload: str


def blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown file, dedented, each with the directive before it."""
    text = path.read_text()
    out = []
    for m in _FENCE.finditer(text):
        before = text[:m.start()]
        d = _DIRECTIVE.match(before, before.rfind("<!--")) if "<!--" in before else None
        kind = payload = None
        if d is not None:
            kind, payload = d.group(1), textwrap.dedent(d.group(2))
        out.append(Block(text.count("\n", 0, m.start()) + 1, m.group(2),
                         textwrap.dedent(m.group(1) and _indent(m.group(3), m.group(1))
                                         or m.group(3)), kind, payload or ""))
    return out


def _indent(body: str, prefix: str) -> str:
    # the lines of an indented fence keep the list item's indentation: a common prefix
    return "".join(line if line.startswith(prefix) or not line.strip() else prefix + line
                   for line in body.splitlines(keepends=True))


def _inputs(func, rng):
    """Random inputs and parameters (labels and ids below 2, which every example's classes
    exceed), the generator's (seed, step), zero optimizer state and state."""
    out = {}
    for a, attrs in zip(func.args, func.arg_attrs, strict=True):
        role = attrs.get("nf.role")
        if role == "rng":
            out[a.name] = np.array([5, 0], np.int64)
        elif role not in ("input", "param"):
            out[a.name] = np.zeros(a.shape, a.dtype.numpy)
        elif a.dtype.is_float:
            out[a.name] = rng.standard_normal(a.shape).astype(a.dtype.numpy)
        else:
            out[a.name] = rng.integers(0, 2, a.shape).astype(a.dtype.numpy)
    return out


def run_file(src: str, filename: str) -> None:
    """Compile `src`; run each of its models' forward and one training step (interpreter)."""
    models = [m.name for m in parse(src, filename).models]
    if not models:
        compile_source(src, filename)  # the ops, checked at sample sizes
        return
    rng = np.random.default_rng(0)
    for name in models:
        module = compile_source(src, filename, model=name)
        verify(module)
        f = module.func("forward")
        outs = run(f, _inputs(f, rng))
        assert all(np.isfinite(np.asarray(o, np.float64)).all() for o in outs), name
        if "nf.loss" in module.attrs:
            add_training_functions(module)
            step = module.func("train_step")
            outs = run(step, _inputs(step, rng))
            assert all(np.isfinite(np.asarray(o, np.float64)).all() for o in outs), name


def _headers(text: str) -> list[str]:
    """The `file:line:col: severity: message` entries of compiler output, each message's
    wrapped lines joined (a line that is neither a header nor source/caret continues it)."""
    entries: list[str] = []
    for line in text.splitlines():
        if re.match(r"^\S+\.nf:\d+:\d+: (error|warning|note): ", line):
            entries.append(line.strip())
        elif entries and line and not line.startswith(" "):
            entries[-1] += " " + line.strip()
    return entries


def check_block(b: Block, where: str) -> None:
    """Run one block as its directive or language says."""
    if b.lang == "python":
        tree = pyast.parse(b.text)
        for node in pyast.walk(tree):
            if isinstance(node, pyast.ImportFrom):
                mod = importlib.import_module(node.module or "")
                for alias in node.names:
                    assert hasattr(mod, alias.name), f"{where}: {node.module}.{alias.name}"
        return
    assert b.lang in ("", "nf"), f"{where}: a ```{b.lang} block needs a handler here"
    if b.kind == "parse":
        parse(b.text.replace("{ ... }", "{ }"), "example.nf")
    elif b.kind == "in":
        assert "BODY" in b.payload, f"{where}: `doctest: in` needs a line BODY"
        body = textwrap.indent(b.text, "  ")
        run_file(b.payload.replace("BODY\n", body), "example.nf")
    elif b.kind == "output":
        want = _headers(b.text)
        assert want, f"{where}: no `file:line:col: severity:` line in the output"
        filename = want[0].split(":")[0]
        with pytest.raises(CompileError) as ei:
            compile_source(b.payload, filename)
        got = _headers(str(ei.value))
        norm = [" ".join(h.split()) for h in want]
        assert [" ".join(h.split()) for h in got[:len(want)]] == norm, str(ei.value)
    else:
        assert b.kind is None, f"{where}: unknown directive 'doctest: {b.kind}'"
        assert "{ ... }" not in b.text, f"{where}: an elided body needs `doctest: parse`"
        run_file(b.text, "example.nf")


LANGUAGE_BLOCKS = blocks(LANGUAGE)


@pytest.mark.parametrize("block", LANGUAGE_BLOCKS,
                         ids=[f"line{b.line}" for b in LANGUAGE_BLOCKS])
def test_language_doc_block(block):
    check_block(block, f"docs/language.md:{block.line}")


def test_every_new_syntax_has_a_run_example():
    # the syntax added for users after the first release appears in a block that runs
    run_text = "\n".join(b.text + b.payload for b in LANGUAGE_BLOCKS if b.kind != "parse")
    for needle in (" frozen", " grad\n", " grad ", "stop_gradient(", "-inf", "i64[",
                   "in 0..t + 1", "--model", "[..., ", "min(i + k"):
        assert needle in run_text, f"no example of {needle!r} is run"


def test_the_directives_are_seen():
    kinds = [b.kind for b in LANGUAGE_BLOCKS]
    assert kinds.count("output") == 2 and kinds.count("parse") == 2 and kinds.count("in") == 2


def test_a_wrong_output_block_fails():
    b = Block(1, "", "big.nf:4:3: error: something else\n", "output",
              "model big {\n  input  x: f32[4]\n  y = x +\n}\n")
    with pytest.raises(AssertionError):
        check_block(b, "test")


# ---- the example of two models: gradients as the prose says ---------------------------------

def _two_models() -> str:
    (b,) = [b for b in LANGUAGE_BLOCKS if b.text.startswith("# seq.nf")]
    return b.text


def _fd(func, args, name, eps=1e-6):
    out = np.zeros_like(args[name])
    for i in np.ndindex(out.shape):
        hi, lo = dict(args), dict(args)
        hi[name], lo[name] = args[name].copy(), args[name].copy()
        hi[name][i] += eps
        lo[name][i] -= eps
        out[i] = (float(run(func, hi)[0]) - float(run(func, lo)[0])) / (2 * eps)
    return out


def test_two_model_example_gradients():
    """`grad:x` of `tagger` equals central differences of the loss with the running maximum
    held at its value (what `stop_gradient` means); `emb` stays put; `probe`'s is 2 x w / batch.
    """
    from nfc.testing import widen

    src = _two_models()
    rng = np.random.default_rng(7)
    module = widen(compile_source(src, "seq.nf", model="tagger"))
    add_training_functions(module)
    step = module.func("train_step")
    args = _inputs(step, rng)
    args["tags"] = rng.integers(0, 3, args["tags"].shape)
    res = dict(zip(step.attrs["nf.results"], run(step, dict(args)), strict=True))
    assert "param:emb" not in res and "param:w" in res
    # the same model with the maximum as an input, set to its value at x
    stopped = "stop_gradient(m[b, t, d])"
    assert stopped in src
    held = src.replace(stopped, "mx[b, t, d]").replace(
        "  param  w:", "  input  mx: f32[batch, steps, 8]\n  param  w:")
    seen = src.replace("  output logits", "  output logits, m")
    fwd = widen(compile_source(seen, "seq.nf", model="tagger")).func("forward")
    m = run(fwd, {a.name: args[a.name] for a in fwd.args})[-1]
    hf = widen(compile_source(held, "seq.nf", model="tagger")).func("forward")
    hargs = {a.name: (np.asarray(m) if a.name == "mx" else args[a.name]) for a in hf.args}
    want = _fd(hf, hargs, "x")
    assert np.abs(want).max() > 1e-4
    np.testing.assert_allclose(res["grad:x"], want, rtol=1e-6, atol=1e-9)
    # and without holding it the gradient would differ: the stop matters here
    full = _fd(module.func("forward"), {a.name: args[a.name]
                                        for a in module.func("forward").args}, "x")
    assert not np.allclose(full, want, rtol=1e-3, atol=1e-6)

    probe = widen(compile_source(src, "seq.nf", model="probe"))
    add_training_functions(probe)
    pstep = probe.func("train_step")
    pargs = {"x": rng.standard_normal((2, 4)), "w": np.ones(4)}
    pres = dict(zip(pstep.attrs["nf.results"], run(pstep, pargs), strict=True))
    assert not any(k.startswith("param:") for k in pres)
    np.testing.assert_allclose(pres["grad:x"], 2 * pargs["x"] * pargs["w"] / 2, rtol=1e-12)


# ---- docs/stdlib.md: the signatures shown are std.nn's --------------------------------------

def _std_signatures() -> dict[str, str]:
    """Each op of nfc/std/nn.nf: its signature as one line of single-spaced text."""
    text = (ROOT / "nfc" / "std" / "nn.nf").read_text()
    out = {}
    for m in re.finditer(r"^op (\w+)(.*?)\{\s*$", text, re.S | re.M):
        out[m.group(1)] = " ".join((m.group(1) + m.group(2)).split())
    return out


def _doc_signatures() -> list[str]:
    """Every `name(...) -> ...` or `name<...>(...) -> ...` in code spans of docs/stdlib.md."""
    text = STDLIB.read_text()
    return [" ".join(s.split()) for s in re.findall(r"`(\w+(?:<[^`]*?>)?\([^`]*?\) -> [^`]+)`",
                                                    text)]


def _params(sig: str) -> list[tuple[str, str | None]]:
    """(name, type or None) of each runtime parameter of a signature, and its result."""
    head, result = sig.split(" -> ", 1)
    args = head[head.index("(", head.index(">") if ">" in head.split("(")[0] else 0) + 1:-1]
    parts, depth, cur = [], 0, ""
    for ch in args:
        depth += ch in "[(" and 1 or ch in "])" and -1 or 0
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur.strip())
    out: list[tuple[str, str | None]] = []
    for p in parts:
        name, _, ty = p.partition(":")
        out.append((name.strip(), ty.strip() or None))
    return [*out, ("->", result.strip())]


def test_stdlib_doc_signatures_are_the_ops():
    std = _std_signatures()
    docs = _doc_signatures()
    assert len(docs) > 30
    checked = set()
    for sig in docs:
        name = sig.split("(")[0].split("<")[0]
        assert name in std, f"docs/stdlib.md shows '{name}', which std.nn does not define"
        ours, theirs = _params(sig), _params(std[name])
        assert [n for n, _ in ours] == [n for n, _ in theirs], (sig, std[name])
        for (n, t), (_, real) in zip(ours, theirs, strict=True):
            # a type the doc abbreviates (`g, b`) is left out, and a result whose sizes it
            # names (`HO, WO`); any other must be exact
            if t is None or (n == "->" and set(re.findall(r"[A-Za-z_]\w*", t))
                             - set(re.findall(r"[A-Za-z_]\w*", real))):
                continue
            assert t.replace(" ", "") == real.replace(" ", ""), \
                f"{name}: the doc says {n}: {t}, std.nn {real}"
        checked.add(name)
    # every op the doc names in a code span is one std.nn has
    for name in re.findall(r"`(\w+)(?:<[^`]*>)?\(", STDLIB.read_text()):
        if name not in ("reshape", "transpose", "f32", "f64", "max", "min", "exp", "log",
                        "sqrt", "tanh", "sigmoid", "erf", "rsqrt", "abs", "pow", "T", "Int",
                        "normal", "uniform", "const", "sum", "len", "import"):
            assert name in std or name in ("torch",), f"docs/stdlib.md names '{name}'"
    assert {"softmax_cross_entropy", "margin_loss", "matmul", "bmm"} <= checked
