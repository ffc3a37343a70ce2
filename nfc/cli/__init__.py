"""The `nfc` command line. Each subcommand lives in a module `nfc/cli/<name>_cmd.py` that
defines `add_parser(subparsers)` and `run(args) -> int`; they are discovered by name, so a new
subcommand needs no edit here. Heavy imports (llvmlite, cuda-python) happen inside `run`.
"""

from __future__ import annotations

import argparse
import importlib
import pkgutil
import sys
import traceback

from nfc import __version__
from nfc.diagnostics import CompileError, print_diagnostics

#: Subcommands in the order `nfc --help` lists them; others found later are appended.
ORDER = ["opt", "passes", "stats", "compile", "run", "train", "tune", "cache", "bench"]


def _command_modules() -> list[str]:
    import nfc.cli as pkg

    found = [m.name[:-4] for m in pkgutil.iter_modules(pkg.__path__) if m.name.endswith("_cmd")]
    return [n for n in ORDER if n in found] + sorted(n for n in found if n not in ORDER)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser with every discovered subcommand."""
    parser = argparse.ArgumentParser(
        prog="nfc", description="nfc: a compiler toolkit for training deep networks.")
    parser.add_argument("--version", action="version", version=f"nfc {__version__}")
    parser.add_argument("--traceback", action="store_true",
                        help="show the Python traceback of an internal error")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in _command_modules():
        mod = importlib.import_module(f"nfc.cli.{name}_cmd")
        mod.add_parser(sub)
    return parser


class UsageError(Exception):
    """A bad command line that argparse could not catch; printed as `nfc: error: ...`."""


def main(argv: list[str] | None = None) -> int:
    """Entry point of the `nfc` console script; returns the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.command is None:
        parser.print_help()
        return 1
    try:
        return int(args.func(args) or 0)
    except CompileError as err:
        print_diagnostics(err)
        return 1
    except UsageError as err:
        print(f"nfc: error: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("nfc: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if args.traceback:
            traceback.print_exc()
        print(f"nfc: internal error: {type(exc).__name__}: {exc}\n"
              "  this is a bug in nfc; rerun with --traceback and report it", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
