"""The build pipeline: one pipeline string, run by the pass manager, for `nfc compile`,
`nfc train`, `nfc bench`, `nfc tune` and the Python API.

- every command prints (and runs) the same string, obtained here through each command's own
  code path, never copied;
- `-p` replaces it, `--print-ir-after-all` and `--time-passes` watch it, a bad `-p` is a
  located diagnostic (exit 1), and the verifier runs after each pass;
- the default pipeline gives exactly the IR of the hard-coded sequence it replaced (kept
  below as `old_build`), tuned schedules and all, on several models;
- `--set` has one parser.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pytest

import nfc.passmanager
from nfc.cli import main
from nfc.ir import ComputeOp, Module
from nfc.passmanager import Context, ModulePass, PassManager, PassRegistry, build_pipeline
from nfc.printer import print_module
from nfc.runtime import build

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "tests" / "runtime" / "models" / "tiny.nf")
BN_DROPOUT = str(ROOT / "tests" / "runtime" / "models" / "bn_dropout.nf")
MLP = str(ROOT / "examples" / "mlp.nf")
LENET = str(ROOT / "examples" / "lenet5.nf")
RESNET = str(ROOT / "examples" / "resnet_block.nf")

#: A model without `minimize`: the pipeline gives it an `@eval` only.
FORWARD_ONLY = """\
import std.nn

model scorer(batch = 4) {
  input  x: f32[batch, 8]
  param  w: f32[8, 3] = normal(0.0, 0.1)
  param  b: f32[3] = zeros
  logits = linear(x, w, b)
  output logits
}
"""


def _out(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ---- one pipeline, printed the same by every command ----------------------------------------

@pytest.mark.parametrize("flags", [[], ["--no-fuse"], ["--no-im2col", "--no-tuning"]])
def test_every_command_prints_and_runs_the_same_pipeline(capsys, monkeypatch, flags):
    from nfc.runtime.bench.driver import BenchOptions
    from nfc.runtime.bench.models import resolve
    from nfc.runtime.bench.worker import case_pipeline

    code, compiled, _ = _out(capsys, "compile", TINY, "--print-pipeline", *flags)
    assert code == 0
    code, trained, _ = _out(capsys, "train", TINY, "--print-pipeline", *flags)
    assert code == 0
    code, benched, _ = _out(capsys, "bench", TINY, "--print-pipeline", *flags)
    assert code == 0
    assert compiled == trained == benched and compiled.count("\n") == 1
    # the bench worker's own code path, with the spec the bench driver sends it
    opts = BenchOptions(models=(resolve(TINY),), im2col="--no-im2col" not in flags,
                        tuning="--no-tuning" not in flags, fuse="--no-fuse" not in flags)
    assert case_pipeline({"source": TINY, **opts.pipeline_spec()}) == compiled.strip()
    # the Python API (compile_model, hence load_model) records what it ran
    monkeypatch.setattr(build, "build_library",
                        lambda module, output=None, **kw: build.Built("lib.so", module))
    api = build.compile_model(TINY, im2col="--no-im2col" not in flags,
                              tuning="--no-tuning" not in flags, fuse="--no-fuse" not in flags)
    assert api.pipeline == compiled.strip()
    # nfc tune measures the kernels of the build pipeline up to apply-tuning
    im2col = [f for f in flags if f == "--no-im2col"]
    code, tuned, _ = _out(capsys, "tune", TINY, "--print-pipeline", *im2col)
    assert code == 0
    code, full, _ = _out(capsys, "compile", TINY, "--print-pipeline", *im2col)
    assert code == 0
    names = full.strip().split(",")
    assert tuned.strip() == ",".join(names[:names.index("apply-tuning")])


def test_the_default_pipeline(capsys):
    assert build.pipeline_for(TINY) == build.BUILD_PIPELINE == (
        "layout{when=auto},im2col,training-functions,inline,canonicalize,cse,dce,"
        "apply-tuning,fuse")
    # a .nfir module is taken as it is: no model-building passes
    assert build.pipeline_for("m.nfir") == "inline,canonicalize,cse,dce,apply-tuning,fuse"
    # -p is the whole pipeline (in the passes' own spelling); the flags edit it as well
    assert build.pipeline_for(TINY, " inline , fuse{max-ops=4}", fuse=False) == "inline"
    code, out, _ = _out(capsys, "compile", TINY, "-p", "cse,fuse{max-ops=4}",
                        "--print-pipeline")
    assert code == 0 and out == "cse,fuse{max-ops=4}\n"
    # --emit=ir runs the pipeline codegen gets, apply-tuning included
    code, out, _ = _out(capsys, "compile", TINY, "--emit=ir", "--print-pipeline")
    assert code == 0 and out == ("layout{when=auto},im2col,training-functions,inline,"
                                 "canonicalize,cse,dce,apply-tuning,fuse\n")


def test_print_pipeline_of_a_library_is_a_usage_error(capsys, tmp_path):
    so = tmp_path / "m.so"
    so.write_bytes(b"\x7fELF" + bytes(64))
    code, _, err = _out(capsys, "train", str(so), "--print-pipeline")
    assert code == 1 and "already compiled" in err


# ---- -p, --print-ir-after-all, --time-passes, the verifier -----------------------------------

def test_p_with_print_ir_after_all_prints_the_ir_after_each_pass(capsys):
    pipeline = "im2col,training-functions,inline,cse"
    code, out, err = _out(capsys, "compile", TINY, "--emit=ir", "--set", "batch=2", "-p",
                          pipeline, "--print-ir-after-all")
    assert code == 0, err
    dumps = [line for line in err.splitlines() if line.startswith("// -----// IR Dump After")]
    assert dumps == [f"// -----// IR Dump After {p} //----- //" for p in pipeline.split(",")]
    # the last dump is the IR written to stdout; the first is before autodiff
    assert err.rsplit("//----- //\n", 1)[1] == out
    first = err.split("//----- //\n")[1].split("// -----//")[0]
    assert "@train_step" not in first and "@train_step" in out
    assert "nf.kernel" not in out  # no fuse in this pipeline


def test_print_ir_after_one_pass_and_time_passes(capsys):
    code, _, err = _out(capsys, "compile", TINY, "--emit=ir", "--print-ir-after", "fuse",
                        "--time-passes")
    assert code == 0, err
    assert err.count("IR Dump After") == 1 and "IR Dump After fuse" in err
    table = err.split("Pass execution timing report")[1]
    for row in ("frontend", "(verify)", "im2col", "training-functions", "canonicalize",
                "fuse", "Total"):
        assert row in table
    code, _, err = _out(capsys, "compile", TINY, "--print-ir-after", "nonesuch")
    assert code == 1 and "unknown pass 'nonesuch'" in err


@pytest.mark.parametrize("command", ["compile", "train", "tune", "bench"])
def test_a_bad_pass_in_p_is_a_located_diagnostic(capsys, command):
    code, out, err = _out(capsys, command, TINY, "-p", "inline,frobnicate,cse")
    assert code == 1 and out == ""
    lines = err.splitlines()
    assert lines[0] == "<pipeline>:1:8: error: unknown pass 'frobnicate'"
    assert lines[1:3] == ["  inline,frobnicate,cse", "         ^~~~~~~~~~"]
    assert "known passes:" in err and "training-functions" in err and "apply-tuning" in err
    code, _, err = _out(capsys, command, TINY, "-p", "cse{depth=2}")
    assert code == 1 and "<pipeline>:1:5: error: pass 'cse' has no option 'depth'" in err


@dataclass(frozen=True)
class Breaker(ModulePass):
    """Breaks the IR: a compute whose type disagrees with its dims."""

    name: ClassVar[str] = "test-breaker"

    def apply(self, ctx: Context, module: Module) -> None:
        op = next(o for o in module.func("forward").body.ops if isinstance(o, ComputeOp))
        op.dims = op.dims * 2


def test_the_verifier_runs_after_each_pass(capsys, monkeypatch):
    reg = PassRegistry()
    reg.register(Breaker, "test")
    monkeypatch.setattr(nfc.passmanager, "REGISTRY", reg)
    code, _, err = _out(capsys, "compile", TINY, "--emit=ir", "-p", "test-breaker,cse")
    assert code == 1 and "the IR is invalid after pass 'test-breaker'" in err


# ---- the default pipeline gives what the hard-coded build gave ------------------------------

def old_build(path: str, settings: Sequence[str] = (), *, im2col: bool = True,
              tuning: bool = True, fuse: bool = True) -> Module:
    """The build as nfc.runtime.build hard-coded it before the build pipeline (model_module,
    run_pipeline(DEFAULT_PIPELINE), apply_tuning, run_pipeline(FUSE_PIPELINE)), verbatim."""
    from nfc.frontend import compile_file
    from nfc.passes.autodiff.train import (
        add_training_functions,
        eval_from_forward,
        needs_separate_eval,
    )
    from nfc.passes.im2col import im2col_func
    from nfc.runtime.tuning.kernels import apply_cached_schedules
    from nfc.settings import apply_optimizer, parse_settings
    from nfc.verifier import verify

    def run(module: Module, pipeline: str) -> None:
        PassManager(build_pipeline(pipeline), verify=False).run(module)
        verify(module)

    params, opt = parse_settings(settings)
    p = Path(path)
    module = compile_file(p, params=dict(params), training=True, require_model=True)
    apply_optimizer(module, opt)
    if needs_separate_eval(module.func("forward")):
        ev = compile_file(p, params=dict(params), training=False)
        module.funcs.append(eval_from_forward(ev.func("forward")))
    if im2col:
        for func in module.funcs:
            im2col_func(func)
    if module.attrs.get("nf.loss") is not None and module.attrs.get("nf.optimizer") is not None:
        add_training_functions(module)
    elif not module.has_func("eval"):
        module.funcs.append(eval_from_forward(module.func("forward")))
    run(module, "inline,canonicalize,cse,dce")
    if tuning:
        apply_cached_schedules(module)
    if fuse:
        run(module, "fuse")
    return module


CASES = [(MLP, ("batch=8", "opt.lr=0.05")), (LENET, ("batch=2",)), (RESNET, ("batch=2",)),
         (BN_DROPOUT, ("batch=4", "opt.name=adam"))]


@pytest.fixture(scope="module")
def tuned_cache(tmp_path_factory) -> Path:
    """$NFC_CACHE_DIR with a tuning cache that holds a faster valid schedule for every
    tunable kernel of the CASES (so apply-tuning changes their IR)."""
    from nfc.codegen.space import schedule_space
    from nfc.runtime.tuning.cache import TuningCache
    from nfc.runtime.tuning.category import default_category
    from nfc.runtime.tuning.driver import build_model
    from nfc.runtime.tuning.kernels import canonical_compute, collect_kernels

    d = tmp_path_factory.mktemp("cache")
    rng = random.Random(0)
    with TuningCache(d / "tuning.sqlite") as cache:
        for path, settings in CASES:
            for k in collect_kernels(build_model(path, settings)):
                if not isinstance(k.op, ComputeOp):
                    continue
                space = schedule_space(canonical_compute(k.op))
                default = space.default()
                other = next((c for c in ({n: rng.choice(v) for n, v in space.params.items()}
                                          for _ in range(200))
                              if space.is_valid(c) and c != default), None)
                cache.put(default_category(), k.key, default, 2e-5, naive=True, desc=k.desc)
                if other is not None:
                    cache.put(default_category(), k.key, other, 1e-5, desc=k.desc)
    return d


@pytest.mark.parametrize("path,settings", CASES, ids=lambda c: Path(c).stem
                         if isinstance(c, str) else None)
def test_the_default_pipeline_gives_the_ir_of_the_old_hard_coded_build(
        monkeypatch, tuned_cache, path, settings):
    monkeypatch.setenv("NFC_CACHE_DIR", str(tuned_cache))
    params, opt = build.parse_settings(settings)
    for flags in ({}, {"fuse": False, "tuning": False}, {"im2col": False}):
        new, ctx = build.build_module(path, params, opt, build.pipeline_for(path, **flags))
        want = print_module(old_build(path, settings, **flags), locs=True)
        assert print_module(new, locs=True) == want, (path, flags)
        if flags.get("tuning", True):
            assert "nf.schedule" in want and ctx.remarks["apply-tuning"].startswith(
                "tuning cache: ")


def test_compile_emit_ir_is_the_old_builds_ir(capsys, monkeypatch, tuned_cache):
    monkeypatch.setenv("NFC_CACHE_DIR", str(tuned_cache))
    # --emit=ir prints what codegen gets: the tuned schedules of the cache included
    code, out, err = _out(capsys, "compile", MLP, "--emit=ir", "--set", "batch=8")
    assert code == 0, err
    assert out == print_module(old_build(MLP, ["batch=8"]))
    assert out != print_module(old_build(MLP, ["batch=8"], tuning=False))
    code, out, err = _out(capsys, "compile", MLP, "--emit=ir", "--set", "batch=8",
                          "--no-tuning")
    assert code == 0, err
    assert out == print_module(old_build(MLP, ["batch=8"], tuning=False))


def test_a_model_without_a_loss_gets_eval_only(tmp_path):
    src = tmp_path / "scorer.nf"
    src.write_text(FORWARD_ONLY)
    module, _ = build.build_module(src)
    assert [f.name for f in module.funcs] == ["forward", "eval"]
    assert print_module(module) == print_module(old_build(str(src)))


def test_model_module_and_run_pipeline_keep_their_meaning():
    """The older entry points are the same pipeline in pieces."""
    params, opt = build.parse_settings(["batch=4"])
    module = build.run_pipeline(build.model_module(TINY, params, opt))
    whole, _ = build.build_module(TINY, params, opt, build.tune_pipeline_for(TINY))
    assert print_module(module) == print_module(whole)


# ---- the bench worker builds what nfc compile builds -----------------------------------------

def test_the_bench_worker_measures_the_fused_build(tmp_path, capsys):
    from nfc.runtime.bench.worker import compile_case

    rec = compile_case({"source": TINY, "settings": ["batch=4"], "out": str(tmp_path / "b")})
    code, printed, _ = _out(capsys, "compile", TINY, "--print-pipeline")
    assert code == 0 and rec["pipeline"] == printed.strip()
    module, _ = build.build_module(TINY, {"batch": 4}, {})
    kernels = sum(1 for op in module.func("train_step").body.ops
                  if not op.is_terminator)
    assert rec["kernels"] == kernels  # the fused train_step, as nfc compile builds it
    unfused, _ = build.build_module(TINY, {"batch": 4}, {}, build.pipeline_for(TINY, fuse=False))
    assert rec["kernels"] < sum(1 for op in unfused.func("train_step").body.ops
                                if not op.is_terminator)


# ---- --set --------------------------------------------------------------------------------

def test_set_has_one_parser():
    from nfc.cli import UsageError
    from nfc.cli.opt_cmd import parse_params
    from nfc.settings import SettingError, parse_settings

    assert build.parse_settings is parse_settings
    items = ["batch=32", "b = 0.5", "c=true", "opt.lr=0.01", "opt.name=adam"]
    assert parse_params(items) == parse_settings(items)[0] == {
        "batch": 32, "b": 0.5, "c": True}
    for bad in ("x", "=1", "x=abc"):
        with pytest.raises(SettingError) as built:
            parse_settings([bad])
        with pytest.raises(UsageError) as opt:
            parse_params([bad])
        assert str(built.value) == str(opt.value)


def test_nfc_opt_applies_optimizer_settings(capsys):
    code, out, err = _out(capsys, "opt", TINY, "--set", "opt.name=adam", "--set",
                          "opt.lr=0.5", "--no-locs")
    assert code == 0, err
    assert 'nf.optimizer = {name = "adam", lr = 0.5}' in out

