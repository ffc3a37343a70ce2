"""The pipeline flags the commands share, defined once: the pass manager's debugging flags
(`nfc opt` and every build command) and the build pipeline's flags (`nfc compile`, `nfc train`,
`nfc bench`, `nfc tune`). Not a subcommand (the CLI discovers only `*_cmd` modules).
"""

from __future__ import annotations

import argparse
from typing import Any

from nfc.cli import UsageError

#: The build flags and the pass each one removes (nfc.runtime.build.FLAG_PASSES).
BUILD_FLAGS = {
    "layout": "never store activations and weights blocked by channel: remove the layout pass "
              "(on by default where a measured rule or `nfc tune` finds it faster)",
    "im2col": "keep convolutions as loop nests: remove the im2col pass, which gathers their "
              "windows into columns before autodiff (less memory)",
    "tuning": "ignore tuned schedules of the tuning cache (nfc tune): remove the apply-tuning "
              "pass",
    "fuse": "one kernel per compute: remove the fuse pass",
}


def add_model_argument(p: argparse.ArgumentParser) -> None:
    """`--model NAME`: which model of a file that defines several (`model=` of the frontend)."""
    p.add_argument("--model", default=None, metavar="NAME",
                   help="the model to compile when the file defines several")


def add_pass_manager_arguments(p: argparse.ArgumentParser) -> None:
    """`--print-ir-after-all`, `--print-ir-after NAME`, `--time-passes`, `--no-verify`."""
    p.add_argument("--print-ir-after-all", action="store_true",
                   help="print the IR to stderr after every pass")
    p.add_argument("--print-ir-after", action="append", default=[], metavar="NAME",
                   help="print the IR to stderr after each run of this pass; repeatable")
    p.add_argument("--time-passes", action="store_true",
                   help="print a table of the time spent in each phase to stderr")
    p.add_argument("--no-verify", action="store_true",
                   help="do not run the verifier after each pass (debugging broken passes)")


def pass_manager_options(args: argparse.Namespace) -> dict[str, Any]:
    """The PassManager keywords the flags of `add_pass_manager_arguments` ask for
    (`verify`, `print_ir_after`); a usage error for an unknown `--print-ir-after` pass."""
    from nfc.passmanager import REGISTRY

    for name in args.print_ir_after:
        if name not in REGISTRY.names():
            raise UsageError(f"--print-ir-after: unknown pass '{name}' (known passes: "
                             f"{', '.join(REGISTRY.names())})")
    return {"verify": not args.no_verify,
            "print_ir_after": True if args.print_ir_after_all else tuple(args.print_ir_after)}


def add_build_pipeline_arguments(p: argparse.ArgumentParser,
                                 flags: tuple[str, ...] = ("layout", "im2col", "tuning",
                                                           "fuse"), *,
                                 pass_manager: bool = True) -> None:
    """`-p`, `--print-pipeline`, the `--no-<flag>` edits of the pipeline, and (unless
    `pass_manager` is False: the command compiles in another process) the pass manager's
    flags."""
    p.add_argument("-p", "--pipeline", default=None, metavar="PIPELINE",
                   help="the whole pipeline run after the frontend (default: the build "
                        "pipeline; --print-pipeline shows it)")
    p.add_argument("--print-pipeline", action="store_true",
                   help="print the exact pipeline this command runs (the default or -p, "
                        "edited by the --no-* flags) and exit")
    for flag in flags:
        p.add_argument(f"--no-{flag.replace('_', '-')}", action="store_true",
                       help=BUILD_FLAGS[flag])
    if "fuse" in flags:
        p.add_argument("--device-params", choices=("measured", "builtin"), default=None,
                       action=_DeviceParamsAction,
                       help="the fusion reward's device parameters: this machine's, measured "
                            "at first use and kept in the tuning cache (measured, the "
                            "default), or nfc's built-in constants (builtin); sets "
                            "$NFC_DEVICE_PARAMS for the build and its workers")
    if pass_manager:
        add_pass_manager_arguments(p)


class _DeviceParamsAction(argparse.Action):
    """`--device-params X`: `$NFC_DEVICE_PARAMS=X` (nfc.runtime.build.DEVICE_PARAMS_ENV), read
    by every build of the command, in this process or a worker it starts."""

    def __call__(self, parser: Any, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        import os

        setattr(namespace, self.dest, values)
        os.environ["NFC_DEVICE_PARAMS"] = str(values)


def build_flags(args: argparse.Namespace) -> dict[str, bool]:
    """`layout`, `im2col`, `tuning`, `fuse` as `nfc.runtime.build.pipeline_for` takes them (a flag a
    command does not have is on)."""
    return {flag: not getattr(args, f"no_{flag}", False) for flag in BUILD_FLAGS}


def add_build_option_arguments(p: argparse.ArgumentParser) -> None:
    """`--precision`, `--memory-budget`, `--compress-activations`: passes that `compile` and
    `train` add to the build pipeline (`with_build_options`)."""
    p.add_argument("--precision", choices=("f32", "bf16", "f16"), default="f32",
                   help="bf16/f16: mixed precision, matmuls and convolutions read 16-bit "
                   "operands and sum in f32, weights and optimizer state stay f32 (the "
                   "precision pass, docs/performance.md; default f32)")
    p.add_argument("--memory-budget", default=None, metavar="BYTES",
                   help="fit the training step's peak memory in BYTES (200MB, 1.5GiB) or a "
                        "percentage of its peak (50%%) by recomputing and reordering "
                        "(the remat pass, docs/memory.md); an error names the smallest "
                        "feasible budget")
    p.add_argument("--compress-activations", nargs="?", const="masks", default=None,
                   choices=("masks", "bf16", "f16"),
                   help="keep saved activations smaller: ReLU masks as booleans (masks, "
                        "exact: the default of the flag), plus the weight gradients' saved "
                        "inputs in bf16 or f16 (lossy); docs/memory.md")
    p.add_argument("--param-layout", choices=("split", "concat"), default="split",
                   help="concat: sibling weights read by one input (LSTM gates, Q/K/V) are "
                        "stored as one concatenated parameter that the optimizer updates "
                        "(parallel-fusion{layout=true} before training-functions); names, "
                        "init and checkpoints stay the parts' (docs/passes-builtin.md; "
                        "default split)")


def build_options_given(args: argparse.Namespace) -> bool:
    """Whether any option of `add_build_option_arguments` changes the pipeline."""
    return (args.precision != "f32" or args.memory_budget is not None
            or args.compress_activations is not None
            or getattr(args, "param_layout", "split") != "split")


def with_build_options(pipeline: str, args: argparse.Namespace) -> str:
    """`pipeline` with the passes `--precision` (precision), `--compress-activations`
    (compress-activations) and `--memory-budget` (remat{peak=...}) add, in that order, after
    `--param-layout concat` (parallel-fusion{layout=true} before training-functions)."""
    if getattr(args, "param_layout", "split") == "concat":
        from nfc.passes.parallel_fusion import with_param_layout

        pipeline = with_param_layout(pipeline)
    if args.precision != "f32":
        from nfc.passes.precision import with_precision

        pipeline = with_precision(pipeline, args.precision)
    if args.compress_activations is not None:
        from nfc.passes.compress import with_compression

        pipeline = with_compression(pipeline, args.compress_activations)
    if args.memory_budget is not None:
        from nfc.passes.remat import with_memory_budget

        try:
            pipeline = with_memory_budget(pipeline, args.memory_budget)
        except ValueError as exc:
            raise UsageError(f"--memory-budget: {exc}") from None
    return pipeline
