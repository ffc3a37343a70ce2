"""`nfc stats`: FLOPs and bytes of every compute, per function, with phase totals.

    nfc stats model.nf                      # the forward function(s)
    nfc stats model.nf --pass autodiff      # the training graph: forward, backward, update
    nfc stats module.nfir --function train_step --set batch=32
    nfc stats model.nf --pass autodiff --memory   # peak memory of each step (docs/memory.md)

Counting rules are those of `nfc.cost` (guards count what is taken; bytes are compulsory
traffic). `points` is the iteration space (output times reduction axes).
"""

from __future__ import annotations

import argparse
from typing import Any

from nfc.cli.pipeline_args import add_model_argument


def add_parser(subparsers: Any) -> None:
    """Register `nfc stats`."""
    p = subparsers.add_parser("stats", help="FLOP and byte counts per compute",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a .nf model or a textual IR module (- for stdin)")
    p.add_argument("-p", "--pipeline", default="",
                   help="passes to run first, e.g. 'autodiff' or 'inline,autodiff'")
    p.add_argument("--pass", dest="passes", action="append", default=[], metavar="NAME",
                   help="append a pass to run first (repeatable)")
    p.add_argument("--function", dest="funcs", action="append", default=[], metavar="NAME",
                   help="only this function (repeatable)")
    # the old spelling, kept working but not advertised
    p.add_argument("--func", dest="funcs", action="append", help=argparse.SUPPRESS)
    p.add_argument("--set", dest="params", action="append", default=[], metavar="NAME=VALUE",
                   help="override a model parameter of a .nf input")
    p.add_argument("--inference", action="store_true",
                   help="compile a .nf input with `training` false")
    add_model_argument(p)
    p.add_argument("--memory", action="store_true",
                   help="report each function's peak memory: arena (and its lower bound), "
                        "parameters, optimizer state, saved activations by call site")
    p.set_defaults(func=run)


def _fmt(x: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(x) >= scale:
            return f"{x / scale:.3f}{unit}"
    return f"{x:.0f}"


def format_table(module: Any, funcs: list[str] | None = None) -> str:
    """The stats table of `module` (all functions, or those named)."""
    from nfc.cost import func_cost, phase_totals

    lines: list[str] = []
    for f in module.funcs:
        if funcs and f.name not in funcs:
            continue
        costs = func_cost(f)
        lines.append(f"@{f.name}")
        head = f"  {'value':<18} {'phase':<9} {'shape':<16} {'points':>10} {'flops':>10} " \
               f"{'bytes':>10} {'flop/B':>7}"
        lines.append(head)
        for c in costs:
            shape = "x".join(map(str, c.shape)) or "scalar"
            lines.append(f"  {c.name:<18} {c.phase:<9} {shape:<16} {_fmt(c.points):>10} "
                         f"{_fmt(c.flops):>10} {_fmt(c.bytes):>10} {c.intensity:>7.2f}")
        totals = phase_totals(costs)
        for phase, (fl, by) in totals.items():
            lines.append(f"  {'total ' + phase:<45} {_fmt(fl):>10} {_fmt(by):>10}")
        if "forward" in totals and "backward" in totals and totals["forward"][0]:
            ratio = totals["backward"][0] / totals["forward"][0]
            lines.append(f"  backward/forward flops: {ratio:.2f}")
        lines.append("")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Print the table."""
    from nfc.cli import UsageError
    from nfc.cli.opt_cmd import load_module, parse_params, read_input

    text, filename = read_input(args.file)
    module = load_module(text, filename, params=parse_params(args.params),
                         training=not args.inference, model=args.model)
    pipeline = ",".join(p for p in [args.pipeline, *args.passes] if p)
    if pipeline:
        from nfc.passmanager import Context, build_pipeline

        ctx = Context()
        for pass_ in build_pipeline(pipeline):
            pass_.apply(ctx, module)
            ctx.diagnostics.check()
    missing = [n for n in args.funcs if not module.has_func(n)]
    if missing:
        raise UsageError(f"no function @{missing[0]} in the module")
    if getattr(args, "memory", False):
        print(format_memory(module, args.funcs or None), end="")
        return 0
    print(format_table(module, args.funcs or None), end="")
    return 0


def format_memory(module: Any, funcs: list[str] | None = None) -> str:
    """The memory report of every function (or those named): the IR level static plan of
    nfc.passes.memplan, which the artifact's plan equals but for kernel workspaces."""
    from nfc.passes.memplan import memory_report

    lines: list[str] = []
    for f in module.funcs:
        if (funcs and f.name not in funcs) or not f.body.ops:
            continue
        lines += memory_report(f).lines()
        lines.append("")
    return "\n".join(lines)
