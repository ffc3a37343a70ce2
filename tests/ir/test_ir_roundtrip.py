"""The contract of the textual IR: print(parse(print(m))) == print(m).

Property-tested over random modules and expressions, and checked on every IR the repository
has: .nfir files (chunk by chunk) and the frontend's output for examples/*.nf, before and after
the training-graph passes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from irgen import exprs, modules, normalize, same_expr

from nfc.diagnostics import CompileError
from nfc.ir import DType, TensorType, Value
from nfc.irparser import parse_expr, parse_module
from nfc.printer import Namer, format_expr, print_module

ROOT = Path(__file__).resolve().parents[2]
_SETTINGS = settings(max_examples=100, deadline=None,
                     suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

VALUES = [Value(TensorType((), DType.F32), "s"), Value(TensorType((4,), DType.F32), "v"),
          Value(TensorType((2, 3), DType.I32), "m")]


@_SETTINGS
@given(modules(), st.booleans())
def test_random_modules_round_trip(module, locs):
    text = print_module(module, locs=locs)
    again = parse_module(text, "random.nfir")
    assert print_module(again, locs=locs) == text
    # the structure survives too, not only the text
    assert [f.name for f in again.funcs] == [f.name for f in module.funcs]
    assert [len(list(f.walk())) for f in again.funcs] == [len(list(f.walk()))
                                                           for f in module.funcs]


@settings(_SETTINGS, max_examples=200)
@given(exprs(VALUES, max_leaves=40))
def test_random_expressions_parse_to_the_same_tree(expr):
    namer = Namer()
    for v in VALUES:
        namer.add(v)
    text = format_expr(expr, namer)
    parsed = parse_expr(text, {v.name: v for v in VALUES})
    assert same_expr(parsed, normalize(expr)), text
    assert format_expr(parsed, namer) == text


def _chunks(path: Path) -> list[str]:
    from nfc.cli.opt_cmd import split_input

    return split_input(path.read_text(encoding="utf-8"))


REPO_IR = sorted(p for base in ("tests", "examples", "docs") for p in (ROOT / base).rglob("*.nfir"))


@pytest.mark.parametrize("path", REPO_IR, ids=lambda p: str(p.relative_to(ROOT)))
def test_repository_ir_files_round_trip(path):
    parsed = 0
    for chunk in _chunks(path):
        try:
            module = parse_module(chunk, path.name)
        except CompileError:
            continue  # a chunk that tests a parse error
        text = print_module(module)
        assert print_module(parse_module(text, path.name)) == text
        parsed += 1
    assert parsed or "expected-error" in path.read_text()


EXAMPLES = sorted((ROOT / "examples").glob("*.nf"))


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_frontend_output_round_trips(path):
    frontend = pytest.importorskip("nfc.frontend")
    for training in (True, False):
        module = frontend.compile_file(path, training=training)
        text = print_module(module)
        assert print_module(parse_module(text, "x.nfir")) == text


@pytest.mark.parametrize("path", EXAMPLES[:3], ids=lambda p: p.name)
def test_training_graph_round_trips(path):
    frontend = pytest.importorskip("nfc.frontend")
    from nfc.passmanager import REGISTRY, PassManager

    module = frontend.compile_file(path)
    if "autodiff" not in REGISTRY.names() or "nf.loss" not in module.attrs:
        pytest.skip("no autodiff pass or no loss")
    # verify=False: this test is about the text, not about the passes' output
    PassManager([REGISTRY.get("autodiff")()], verify=False).run(module)
    text = print_module(module)
    assert "train_step" in text
    assert print_module(parse_module(text, "x.nfir")) == text
