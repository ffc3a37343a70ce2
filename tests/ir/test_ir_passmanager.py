"""The pass manager: options, pipeline strings, the registry, running and verifying."""

from __future__ import annotations

import io
from dataclasses import dataclass
from importlib.metadata import EntryPoint
from typing import ClassVar

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nfc.diagnostics import CompileError
from nfc.ir import Binary, ComputeOp, Const, Module
from nfc.irparser import parse_module
from nfc.passmanager import (
    Context,
    ModulePass,
    PassManager,
    PassRegistry,
    available_passes,
    build_pipeline,
    get_pass,
    parse_pipeline,
    parse_pipeline_specs,
)
from nfc.printer import print_module

TEXT = """nf.func @f(%x: tensor<4xf32>) -> (tensor<4xf32>) {
  %y = nf.compute [i: 4] (%x[i] * 2.0) : tensor<4xf32> loc("t.nf":2:3)
  nf.return %y : tensor<4xf32>
}
"""


@dataclass(frozen=True)
class Scale(ModulePass):
    """Multiply every compute body by `factor`.

    More text that the summary leaves out.
    """

    name: ClassVar[str] = "scale"
    factor: float = 2.0
    """The factor."""
    times: int = 1
    """How many times
    to scale."""
    loud: bool = False
    label: str = "x"
    """A label."""

    def apply(self, ctx: Context, module: Module) -> None:
        for f in module.funcs:
            for op in f.walk():
                if isinstance(op, ComputeOp):
                    for _ in range(self.times):
                        op.body = Binary("*", op.body, Const(self.factor))
        module.attrs.setdefault("trace", []).append(self.label)


@dataclass(frozen=True)
class Needs(ModulePass):
    """Has a required option."""

    name: ClassVar[str] = "needs"
    level: int
    """Required."""


@dataclass(frozen=True)
class Breaker(ModulePass):
    """Breaks the IR: a compute whose type disagrees with its dims."""

    name: ClassVar[str] = "breaker"

    def apply(self, ctx: Context, module: Module) -> None:
        op = module.funcs[0].body.ops[0]
        op.dims = op.dims * 2


@dataclass(frozen=True)
class Complain(ModulePass):
    """Reports a warning and an error through the context."""

    name: ClassVar[str] = "complain"

    def apply(self, ctx: Context, module: Module) -> None:
        op = module.funcs[0].body.ops[0]
        ctx.warning("this looks slow", op.loc)
        ctx.error("this is wrong", op.loc)


@dataclass(frozen=True)
class Crash(ModulePass):
    """Has a bug."""

    name: ClassVar[str] = "crash"

    def apply(self, ctx: Context, module: Module) -> None:
        raise ZeroDivisionError("oops")


def registry(*extra: EntryPoint) -> PassRegistry:
    eps = [EntryPoint(c.name, f"{__name__}:{c.__name__}", "nfc.passes")
           for c in (Scale, Needs, Breaker, Complain, Crash)]
    return PassRegistry([*eps, *extra])


# ---- options ----------------------------------------------------------------------------------

def test_options_come_from_fields_with_their_docstrings():
    opts = Scale.options()
    assert [(o.name, o.type, o.default) for o in opts] == [
        ("factor", float, 2.0), ("times", int, 1), ("loud", bool, False), ("label", str, "x")]
    assert [o.doc for o in opts] == ["The factor.", "How many times to scale.", "", "A label."]
    assert Scale.summary() == "Multiply every compute body by `factor`."
    assert Needs.options()[0].required


@pytest.mark.parametrize("given, want", [
    ({"factor": "0.5", "times": "3"}, Scale(0.5, 3)),
    ({"times": "0x10", "loud": "yes"}, Scale(times=16, loud=True)),
    ({"loud": "OFF", "label": "a b"}, Scale(loud=False, label="a b")),
    ({"factor": "inf"}, Scale(factor=float("inf"))),
])
def test_option_strings_are_parsed_into_the_field_types(given, want):
    got = Scale.from_options(given)
    assert got == want and type(got.times) is int and type(got.factor) is float


@pytest.mark.parametrize("given, message", [
    ({"times": "1.5"}, "option 'times' of pass 'scale' expects an integer, got '1.5'"),
    ({"loud": "maybe"}, "option 'loud' of pass 'scale' expects true or false, got 'maybe'"),
    ({"factor": "x"}, "option 'factor' of pass 'scale' expects a number, got 'x'"),
    ({"factr": "1"}, "pass 'scale' has no option 'factr'; did you mean 'factor'?"),
    ({"zzz": "1"}, "pass 'scale' has no option 'zzz'; its options are factor, times, loud, "
                   "label"),
])
def test_bad_options_are_diagnosed(given, message):
    with pytest.raises(CompileError) as info:
        Scale.from_options(given)
    assert info.value.diagnostics[0].message == message


def test_required_options_and_unsupported_option_types():
    with pytest.raises(CompileError, match="pass 'needs' requires option 'level'"):
        Needs.from_options({})

    @dataclass(frozen=True)
    class Bad(ModulePass):
        name: ClassVar[str] = "bad"
        sizes: list[int] | None = None

    with pytest.raises(TypeError, match="option 'sizes' of pass 'bad' has type"):
        Bad.options()


@settings(max_examples=100, deadline=None)
@given(st.builds(Scale, st.floats(allow_nan=False), st.integers(), st.booleans(), st.text()))
def test_any_options_survive_pipeline_text(p):
    assert build_pipeline(p.pipeline_text(), registry()) == [p]


def test_pipeline_text_round_trips_through_the_parser():
    for p in (Scale(), Scale(0.25, 2, True, "a, {b}\"c"), Needs(3)):
        text = p.pipeline_text()
        assert build_pipeline(text, registry()) == [p]
    assert Scale(times=2).pipeline_text() == "scale{times=2}"


# ---- pipeline strings ---------------------------------------------------------------------------

def test_pipeline_strings():
    assert parse_pipeline("a,b{opt=1,x=foo}") == [("a", {}), ("b", {"opt": "1", "x": "foo"})]
    assert parse_pipeline(" a , b { opt = 1  x=\"p,q}\\\"\" } ") == [
        ("a", {}), ("b", {"opt": "1", "x": 'p,q}"'})]
    assert parse_pipeline("") == [] and parse_pipeline("  ") == []
    spec = parse_pipeline_specs("cse,scale{times=2}")[1]
    assert (spec.loc.col, spec.option_locs["times"].col) == (5, 11)


@pytest.mark.parametrize("text, col, message", [
    ("a,,b", 3, "expected a pass name, found ','"),
    ("a b", 3, "expected ',' between passes, found 'b'"),
    ("a{x=1", 6, "expected '}' to close the options of 'a', found end of pipeline"),
    ("a{x}", 4, "expected '=' after option 'x', found '}'"),
    ("a{x=}", 5, "expected an option value, found '}'"),
    ("a{x=1,x=2}", 7, "option 'x' given twice for pass 'a'"),
    ("a{x=\"1}", 5, "unterminated string in pass option"),
    ("a{x=\"\\q\"}", 5, "invalid string in pass option: invalid \\escape"),
    ("a,", 3, "expected a pass name, found end of pipeline"),
])
def test_malformed_pipelines_are_located(text, col, message):
    with pytest.raises(CompileError) as info:
        parse_pipeline(text)
    (d,) = info.value.diagnostics
    assert (d.loc.file, d.loc.line, d.loc.col, d.message) == ("<pipeline>", 1, col, message)
    assert text in info.value.render()  # the caret quotes the pipeline


def test_unknown_pass_lists_the_known_ones():
    with pytest.raises(CompileError) as info:
        build_pipeline("scale,scael{times=2}", registry())
    (d,) = info.value.diagnostics
    assert d.message == "unknown pass 'scael'; did you mean 'scale'?" and d.loc.col == 7
    assert d.notes[0].message == "known passes: breaker, complain, crash, needs, scale"


def test_option_errors_point_at_the_option():
    with pytest.raises(CompileError) as info:
        build_pipeline("scale{label=a,times=x}", registry())
    assert info.value.diagnostics[0].loc.col == 15


# ---- registry -----------------------------------------------------------------------------------

def test_entry_points_load_only_when_used():
    broken = EntryPoint("broken", "no_such_module_for_nfc:Pass", "nfc.passes")
    reg = registry(broken)
    assert "broken" in reg.names()  # listed without importing anything
    assert reg.get("scale") is Scale
    with pytest.raises(CompileError, match="cannot load pass 'broken' from "
                                           "no_such_module_for_nfc:Pass: ModuleNotFoundError"):
        reg.get("broken")


def test_duplicate_names_are_rejected_naming_both_sources():
    dup = EntryPoint("scale", "other_plugin:Scale", "nfc.passes")
    reg = registry(dup)
    assert "scale" in reg.names() and reg.get("needs") is Needs  # other names still work
    with pytest.raises(CompileError) as info:
        reg.get("scale")  # refused when used
    assert info.value.diagnostics[0].message == (
        f"pass 'scale' is registered twice: by other_plugin:Scale and by {__name__}:Scale; "
        "uninstall one of them")
    # the same target listed twice (one package seen twice) is not a conflict
    assert registry(EntryPoint("scale", f"{__name__}:Scale", "nfc.passes")).get("scale") is Scale


@pytest.mark.parametrize("name, value, message", [
    ("other", f"{__name__}:Scale", "entry point 'other' loads"),
    ("notpass", "builtins:int", "builtins:int is not a ModulePass dataclass"),
])
def test_entry_points_must_name_a_pass_of_that_name(name, value, message):
    with pytest.raises(CompileError, match=message):
        registry(EntryPoint(name, value, "nfc.passes")).get(name)


def test_plugins_from_files_and_modules(tmp_path, monkeypatch):
    src = tmp_path / "myplug.py"
    src.write_text(
        "from dataclasses import dataclass\nfrom typing import ClassVar\n"
        "from nfc.passmanager import ModulePass\n\n\n@dataclass(frozen=True)\n"
        "class Mine(ModulePass):\n    '''Mine.'''\n\n    name: ClassVar[str] = 'mine'\n"
        "    k: int = 1\n    '''K.'''\n\n    def apply(self, ctx, module):\n"
        "        module.attrs['mine'] = self.k\n")
    reg = registry()
    assert reg.load_plugin(f"{src}:Mine")[0].name == "mine"
    assert reg.load_plugin(str(src))[0] is reg.get("mine")  # loading twice is harmless
    assert reg.get("mine").options()[0].doc == "K."
    assert reg.source("mine") == f"--load-plugin {src}:Mine"
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(CompileError, match="has no attribute 'Nope'"):
        reg.load_plugin("myplug:Nope")
    with pytest.raises(CompileError, match="cannot load plugin 'nope_mod:X': "
                                           "ModuleNotFoundError"):
        reg.load_plugin("nope_mod:X")
    # a plugin may not take the name of a registered pass
    clash = tmp_path / "clash.py"
    clash.write_text(src.read_text().replace("'mine'", "'scale'"))
    with pytest.raises(CompileError, match="pass 'scale' is registered twice: by "
                                           f"{__name__}:Scale and by --load-plugin"):
        reg.load_plugin(f"{clash}:Mine")


def test_every_registered_pass_of_the_project_loads():
    eps = available_passes()
    assert {"canonicalize", "cse", "dce", "inline"} <= set(eps)
    for name in eps:
        cls = get_pass(name)
        assert cls.name == name and cls.__doc__
        cls.options()  # option types are valid
        cls()  # and every option has a default


# ---- running ------------------------------------------------------------------------------------

def test_passes_run_in_order_and_modify_the_module():
    m = parse_module(TEXT)
    PassManager([Scale(label="a"), Scale(factor=3.0, label="b")]).run(m)
    assert m.attrs["trace"] == ["a", "b"]
    assert "(%x[i] * 2.0 * 2.0 * 3.0)" in print_module(m)


def test_the_verifier_runs_after_each_pass_and_blames_the_pass():
    m = parse_module(TEXT)
    with pytest.raises(CompileError) as info:
        PassManager([Scale(), Breaker(), Scale(label="never")]).run(m)
    first = info.value.diagnostics[0]
    assert first.severity == "error"
    assert any("invalid after pass 'breaker'" in n.message for n in first.notes)
    assert m.attrs["trace"] == ["x"]
    PassManager([Breaker()], verify=False).run(parse_module(TEXT))  # no verifier, no error


def test_invalid_input_is_reported_before_any_pass():
    m = parse_module(TEXT.replace("[i: 4] (", "[i: 4, j: 4] ("))
    with pytest.raises(CompileError) as info:
        PassManager([Scale()]).run(m)
    assert not any("invalid after" in n.message for n in info.value.diagnostics[0].notes)
    assert "trace" not in m.attrs


def test_errors_reported_through_the_context_stop_the_pipeline():
    m = parse_module(TEXT)
    with pytest.raises(CompileError) as info:
        PassManager([Complain(), Scale()]).run(m)
    assert [(d.severity, d.message) for d in info.value.diagnostics] == [
        ("warning", "this looks slow"), ("error", "this is wrong")]
    assert info.value.diagnostics[0].loc.line == 2 and "trace" not in m.attrs


def test_a_crashing_pass_is_named_in_the_traceback():
    with pytest.raises(ZeroDivisionError) as info:
        PassManager([Crash()]).run(parse_module(TEXT))
    assert "while running pass 'crash'" in info.value.__notes__


def test_print_ir_after_and_timings():
    out = io.StringIO()
    pm = PassManager([Scale(label="a"), Scale(label="b", factor=5.0)], print_ir_after={"scale"},
                     stream=out, locs=False)
    pm.run(parse_module(TEXT))
    dumps = out.getvalue().split("// -----// IR Dump After scale //----- //\n")
    assert len(dumps) == 3 and "* 5.0" not in dumps[1] and "* 5.0" in dumps[2]
    assert "loc(" not in out.getvalue()
    report = pm.timings.report()
    assert "Pass execution timing report" in report
    assert [ln.split()[-1] for ln in report.splitlines()[-3:]] == ["(verify)", "scale", "Total"]
    out = io.StringIO()
    PassManager([Scale()], print_ir_after={"other"}, stream=out).run(parse_module(TEXT))
    assert out.getvalue() == ""
