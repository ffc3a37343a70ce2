"""`nfc opt`: read IR (or .nf source), run a pass pipeline, print the IR.

    nfc opt model.nf                                  # the frontend's IR
    nfc opt module.nfir -p inline,cse,canonicalize    # a pipeline
    nfc opt model.nf | nfc opt - -p autodiff          # stdin: IR or .nf source, sniffed
    nfc opt cases.nfir --split-input-file --verify-diagnostics

The module is verified after parsing and after every pass. `--verify-diagnostics` succeeds iff
exactly the diagnostics the file announces occur: `// expected-error {{text}}` (same line),
`expected-error@+1`, `@-2`, `@above`, `@below`, `expected-warning`, `expected-note` (in .nf
files the comment marker is `#`). Notes need not be announced; errors and warnings must be.
`expected-error@<pipeline> {{...}}` announces an error in the pipeline string.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nfc.cli import UsageError
from nfc.cli.pipeline_args import (
    add_model_argument,
    add_pass_manager_arguments,
    pass_manager_options,
)

#: What `--split-input-file` splits on (the whole line; `#` in .nf files).
SPLIT_RE = re.compile(r"^[ \t]*(?://|#) -----[ \t]*$", re.MULTILINE)
_EXPECT_RE = re.compile(
    r"expected-(error|warning|note|remark)(?:@(above|below|[+-]?\d+|<[^>]*>))?\s*\{\{(.*?)\}\}")


def add_parser(subparsers: Any) -> None:
    """Register `nfc opt`."""
    p = subparsers.add_parser("opt", help="run a pass pipeline on IR or .nf source",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a .nfir or .nf file, or - for stdin")
    p.add_argument("-p", "--pipeline", default="", metavar="PIPELINE",
                   help="passes to run, e.g. 'inline,cse,canonicalize{fast=true}'")
    p.add_argument("--pass", dest="passes", action="append", default=[], metavar="NAME",
                   help="append a pass (with options: 'name{k=v}'); repeatable")
    p.add_argument("-o", "--output", default="-", metavar="OUT",
                   help="write the IR here (default: stdout)")
    add_pass_manager_arguments(p)
    p.add_argument("--verify-diagnostics", action="store_true",
                   help="check the diagnostics against expected-error comments in the file")
    p.add_argument("--split-input-file", action="store_true",
                   help="treat each '// -----' separated chunk as its own input")
    p.add_argument("--no-locs", action="store_true", help="print the IR without locations")
    p.add_argument("--load-plugin", action="append", default=[], metavar="MODULE:CLASS",
                   help="load an unregistered pass class (MODULE may be a .py path)")
    p.add_argument("--set", dest="params", action="append", default=[], metavar="NAME=VALUE",
                   help="override a model parameter of a .nf input, or opt.<name> of its "
                        "optimizer; repeatable")
    p.add_argument("--inference", action="store_true",
                   help="compile a .nf input with `training` false")
    add_model_argument(p)
    p.add_argument("--eval", action="store_true",
                   help="run every function before and after the pipeline in the numpy "
                        "interpreter on random inputs and fail if a result changes")
    p.set_defaults(func=run)


# ---------------------------------------------------------------------------------------------
# input


def parse_settings(items: list[str]) -> tuple[dict[str, int | float | bool], dict[str, Any]]:
    """(model parameters, optimizer overrides) of `--set` items, by nfc.settings (the parser
    of every command's `--set`); a malformed item is a usage error."""
    from nfc.settings import SettingError, parse_settings

    try:
        return parse_settings(items)
    except SettingError as exc:
        raise UsageError(str(exc)) from None


def parse_params(items: list[str]) -> dict[str, int | float | bool]:
    """`["batch=32", "lr=0.1", "bias=true"]` -> typed values (the model parameters of
    `parse_settings`)."""
    return parse_settings(items)[0]


def read_input(path: str) -> tuple[str, str]:
    """The text of `path` (`-` is stdin) and the name diagnostics use for it."""
    if path == "-":
        return sys.stdin.buffer.read().decode("utf-8", errors="replace"), "<stdin>"
    try:
        return Path(path).read_bytes().decode("utf-8", errors="replace"), path
    except OSError as exc:
        raise UsageError(f"cannot read '{path}': {exc.strerror or exc}") from None


def is_ir(text: str, filename: str) -> bool:
    """Whether `text` is textual IR (else .nf source): by extension, else by its first word."""
    if filename.endswith(".nfir"):
        return True
    if filename.endswith(".nf"):
        return False
    for line in text.split("\n"):
        s = line.strip()
        if s and not s.startswith(("//", "#")):
            return s.startswith("nf.")
    return True


def split_input(text: str) -> list[str]:
    """The chunks between `// -----` lines, each padded with newlines so that its line
    numbers are those of the whole file."""
    chunks, start, line = [], 0, 1
    for m in SPLIT_RE.finditer(text):
        chunks.append("\n" * (line - 1) + text[start:m.start()])
        line += text.count("\n", start, m.end())
        start = m.end()
    chunks.append("\n" * (line - 1) + text[start:])
    return chunks


def load_module(text: str, filename: str, *, params: dict[str, int | float | bool] | None = None,
                training: bool = True, model: str | None = None) -> Any:
    """The module of IR text or .nf source (sniffed as in `is_ir`); `model` chooses among the
    models of a .nf file."""
    if is_ir(text, filename):
        from nfc.irparser import parse_module
        module = parse_module(text, filename)
        if "nf.schedule" in text:  # schedules in IR must fit their ops (located errors)
            from nfc.codegen.space import check_schedule_attrs
            check_schedule_attrs(module.funcs)
        return module
    from nfc.frontend import compile_source
    return compile_source(text, filename, params=params, training=training, model=model)


# ---------------------------------------------------------------------------------------------
# --verify-diagnostics


@dataclass
class Expected:
    """One `expected-<severity>@<where> {{text}}` directive."""

    severity: str
    text: str
    file: str
    line: int
    col: int
    directive_line: int
    matched: bool = False


def parse_expectations(text: str, filename: str) -> list[Expected]:
    """Every directive in the comments of `text`."""
    out = []
    for n, line in enumerate(text.split("\n"), start=1):
        if "expected-" not in line:
            continue
        for m in _EXPECT_RE.finditer(line):
            where, file, target = m.group(2), filename, n
            if where == "above":
                target = n - 1
            elif where == "below":
                target = n + 1
            elif where and where.startswith("<"):
                file, target = where, 0
            elif where and where[0] in "+-":
                target = n + int(where)
            elif where:
                target = int(where)
            out.append(Expected(m.group(1), m.group(3), file, target, m.start() + 1, n))
    return out


def check_expectations(expected: list[Expected], produced: list[Any], filename: str) -> list[Any]:
    """Match produced diagnostics (notes flattened) against the directives; the mismatches,
    as error diagnostics (empty when everything matched)."""
    from nfc.diagnostics import Diagnostic
    from nfc.ir import Loc

    flat = []
    for d in produced:
        flat.append(d)
        flat.extend(d.notes)
    used = [False] * len(flat)
    for e in expected:
        for i, d in enumerate(flat):
            if used[i] or d.severity != e.severity or d.loc is None or d.loc.file != e.file:
                continue
            if (e.line == 0 or d.loc.line == e.line) and e.text in d.message:
                used[i] = e.matched = True
                break
    problems = [Diagnostic("error", f"expected {e.severity} \"{e.text}\" was not produced",
                           Loc(filename, e.directive_line, e.col))
                for e in expected if not e.matched]
    for d, u in zip(flat, used, strict=True):
        if not u and d.severity != "note":
            problems.append(Diagnostic("error", f"unexpected {d.severity}: {d.message}", d.loc))
    return problems


# ---------------------------------------------------------------------------------------------
# --eval

#: Relative tolerance per float dtype when --eval compares results.
EVAL_RTOL = {"f16": 1e-2, "bf16": 1e-2, "f32": 1e-4, "f64": 1e-9}


def random_inputs(func: Any, seed: int = 0) -> list[Any]:
    """One array per argument: normal floats, integers in [0, 4), random booleans."""
    import numpy as np

    from nfc.ir import DType

    rng = np.random.default_rng(seed)
    out = []
    for a in func.args:
        if a.dtype.is_float:
            out.append(rng.standard_normal(a.shape).astype(a.dtype.numpy))
        elif a.dtype == DType.I1:
            out.append(rng.random(a.shape) < 0.5)
        else:
            out.append(rng.integers(0, 4, a.shape).astype(a.dtype.numpy))
    return out


def _laid_out_inputs(f: Any, g: Any, inputs: list[Any]) -> list[Any] | None:
    """`inputs` of `f` for `g`, whose arguments are `f`'s by name except parameters with an
    `nf.layout` (the parallel-fusion pass), which get their parts' inputs concatenated; None
    when `g`'s arguments cannot be made so."""
    import numpy as np

    from nfc.blocked import is_blocked, pack

    by_name = {a.name: x for a, x in zip(f.args, inputs, strict=True)}
    out = []
    for a, attrs in zip(g.args, g.arg_attrs, strict=True):
        lay = attrs.get("nf.layout")
        if is_blocked(lay) and a.name in by_name:  # the layout pass: the input packed
            x = pack(by_name[a.name], lay)  # type: ignore[arg-type]
        elif isinstance(lay, dict) and all(p in by_name for p in lay.get("parts", ())):
            x = np.concatenate([by_name[p] for p in lay["parts"]], axis=int(lay["axis"]))
        elif a.name in by_name:
            x = by_name[a.name]
        else:
            return None
        if tuple(np.shape(x)) != tuple(a.shape):
            return None
        out.append(x)
    return out


def compare_modules(before: Any, after: Any) -> None:
    """Run each function both modules have (same signature) on the same random inputs in the
    interpreter; a CompileError when a result differs beyond the dtype's tolerance."""
    import numpy as np

    from nfc.diagnostics import error
    from nfc.interp import InterpError, run

    for f in before.funcs:
        if not after.has_func(f.name):
            continue
        g = after.func(f.name)
        inputs = random_inputs(f)
        g_inputs = inputs
        if [a.type for a in f.args] != [a.type for a in g.args]:
            # parameters laid out by parallel-fusion{layout=true}: their parts concatenated
            g_inputs = _laid_out_inputs(f, g, inputs)
            if g_inputs is None:
                continue
        try:
            want = run(f, inputs, module=before)
        except InterpError as exc:
            print(f"eval: @{f.name}: skipped, the input module fails on random inputs: {exc}",
                  file=sys.stderr)
            continue
        try:
            got = run(g, g_inputs, module=after)
        except InterpError as exc:
            raise error(f"--eval: @{f.name} fails after the pipeline: {exc}", g.loc) from None
        if len(want) != len(got):
            raise error(f"--eval: @{f.name} returns {len(got)} results after the pipeline, "
                        f"{len(want)} before", g.loc)
        worst = 0.0
        for i, (w, r) in enumerate(zip(want, got, strict=True)):
            w, r = np.asarray(w), np.asarray(r)
            if w.shape != r.shape or w.dtype != r.dtype:
                raise error(f"--eval: result {i} of @{f.name} changed from {w.dtype}"
                            f"{list(w.shape)} to {r.dtype}{list(r.shape)}", g.loc)
            rtol = EVAL_RTOL.get(str(g.result_types[i].dtype), 0.0)
            if not np.allclose(r, w, rtol=rtol, atol=rtol, equal_nan=True):
                diff = np.abs(r.astype(np.float64) - w.astype(np.float64))
                at = np.unravel_index(int(np.nanargmax(diff)), diff.shape)
                raise error(f"--eval: the pipeline changed result {i} of @{f.name}: at "
                            f"{list(map(int, at))} it was {w[at]!r}, now {r[at]!r} (rtol "
                            f"{rtol})", g.loc)
            if w.size and w.dtype.kind == "f":
                worst = max(worst, float(np.nanmax(np.abs(r - w), initial=0.0)))
        print(f"eval: @{f.name}: {len(want)} result{'s' if len(want) != 1 else ''} agree "
              f"(max abs difference {worst:.3g})", file=sys.stderr)


# ---------------------------------------------------------------------------------------------
# running


@dataclass
class _Run:
    """Per-invocation state shared by the chunks."""

    args: argparse.Namespace
    pipeline: str
    params: dict[str, int | float | bool]
    optimizer: dict[str, Any]
    """`--set opt.<name>=...` overrides, applied to the input module's `nf.optimizer`."""
    timings: Any
    outputs: list[str] = field(default_factory=list)
    failed: bool = False


def _pipeline_text(args: argparse.Namespace) -> str:
    return ",".join(p for p in [args.pipeline.strip(), *(s.strip() for s in args.passes)] if p)


def _process(state: _Run, text: str, filename: str) -> tuple[str | None, list[Any]]:
    """Run one chunk: its output IR (None on error) and every diagnostic it produced."""
    from nfc.diagnostics import CompileError
    from nfc.passmanager import Context, PassManager, build_pipeline
    from nfc.printer import print_module
    from nfc.settings import apply_optimizer

    args = state.args
    options = pass_manager_options(args)
    ctx = Context(verify=options["verify"], params=dict(state.params))
    try:
        passes = build_pipeline(state.pipeline)  # per chunk: its errors may be expected
        t0 = time.perf_counter()
        module = load_module(text, filename, params=state.params, training=not args.inference,
                             model=args.model)
        apply_optimizer(module, state.optimizer)
        state.timings.add("parse" if is_ir(text, filename) else "frontend",
                          time.perf_counter() - t0)
        before = None
        if args.eval:
            from nfc.irparser import parse_module
            before = parse_module(print_module(module), "<eval>")
        pm = PassManager(passes, **options, locs=not args.no_locs)
        pm.timings = state.timings
        pm.run(module, ctx)
        if before is not None:
            compare_modules(before, module)
        t0 = time.perf_counter()
        out = print_module(module, locs=not args.no_locs)
        state.timings.add("print", time.perf_counter() - t0)
        return out, list(ctx.diagnostics.diagnostics)
    except CompileError as err:
        diags = list(err.diagnostics)
        seen = {id(d) for d in diags}
        diags += [d for d in ctx.diagnostics.diagnostics if id(d) not in seen]
        return None, diags


def run(args: argparse.Namespace) -> int:
    """Run `nfc opt`."""
    from nfc.diagnostics import SOURCES, CompileError, render
    from nfc.passmanager import REGISTRY, Timings, build_pipeline

    for spec in args.load_plugin:
        REGISTRY.load_plugin(spec)
    pass_manager_options(args)  # a bad --print-ir-after is a usage error before any work
    state = _Run(args, _pipeline_text(args), *parse_settings(args.params), Timings())
    if not args.verify_diagnostics:
        build_pipeline(state.pipeline)  # a bad pipeline is one error, not one per chunk
    text, filename = read_input(args.file)
    SOURCES.add(filename, text)
    chunks = split_input(text) if args.split_input_file else [text]
    for chunk in chunks:
        out, diags = _process(state, chunk, filename)
        SOURCES.add(filename, text)  # chunks keep the file's line numbers
        if args.verify_diagnostics:
            problems = check_expectations(parse_expectations(chunk, filename), diags, filename)
            if problems:
                state.failed = True
                print(CompileError(problems).render(), file=sys.stderr)
        else:
            if diags:
                print("\n".join(render(d) for d in diags), file=sys.stderr)
            state.failed |= out is None
        if out is not None:
            state.outputs.append(out)
    result = "// -----\n".join(state.outputs)
    if args.output == "-":
        sys.stdout.write(result)
        sys.stdout.flush()
    else:
        try:
            Path(args.output).write_text(result, encoding="utf-8")
        except OSError as exc:
            raise UsageError(f"cannot write '{args.output}': {exc.strerror or exc}") from None
    if args.time_passes:
        print(state.timings.report(), file=sys.stderr)
    return 1 if state.failed else 0
