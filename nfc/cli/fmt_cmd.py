"""`nfc fmt`: rewrite .nf files in the canonical layout (docs/tools.md).

    nfc fmt model.nf                # in place
    nfc fmt examples/               # every .nf file under a folder
    nfc fmt --check .               # for CI: list the files that would change, exit 1 if any
    nfc fmt --diff model.nf         # print a unified diff, change nothing
    nfc fmt - < model.nf            # read standard input, write standard output

A file with a syntax error is reported like the compiler reports it and left alone; the exit
status is then 1.
"""

from __future__ import annotations

import argparse
import difflib
import sys
from pathlib import Path
from typing import Any

#: Folders never searched for .nf files.
_SKIP = {".git", ".venv", "venv", "node_modules", "__pycache__", "build", "dist"}


def add_parser(subparsers: Any) -> None:
    """Register `nfc fmt`."""
    p = subparsers.add_parser("fmt", help="format .nf files in the canonical layout",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", metavar="PATH",
                   help=".nf files or folders (searched recursively); '-' for standard input")
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--check", action="store_true",
                      help="change nothing; list the files that are not formatted, exit 1 if any")
    mode.add_argument("--diff", action="store_true",
                      help="change nothing; print a unified diff of each file that would change")
    p.set_defaults(func=run)


def nf_files(paths: list[str]) -> list[Path]:
    """The .nf files named by `paths` (folders searched recursively, sorted)."""
    out: list[Path] = []
    for s in paths:
        p = Path(s)
        if p.is_dir():
            out += sorted(f for f in p.rglob("*.nf") if f.is_file()
                          and not any(part in _SKIP for part in f.relative_to(p).parts[:-1]))
        else:
            out.append(p)
    return out


def run(args: argparse.Namespace) -> int:
    """Run `nfc fmt`."""
    from nfc.diagnostics import CompileError, print_diagnostics
    from nfc.format import format_source

    if "-" in args.paths:
        if len(args.paths) > 1:
            from nfc.cli import UsageError

            raise UsageError("'-' (standard input) cannot be mixed with paths")
        text = sys.stdin.read()
        new = format_source(text, "<stdin>")  # a CompileError is printed by nfc.cli.main
        if args.check:
            return int(new != text)
        if args.diff:
            sys.stdout.writelines(_diff(text, new, "<stdin>"))
            return 0
        sys.stdout.write(new)
        return 0

    status = 0
    changed: list[str] = []
    files = nf_files(args.paths)
    for path in files:
        name = str(path)
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            print(f"{name}: error: cannot read: {getattr(exc, 'strerror', None) or exc}",
                  file=sys.stderr)
            status = 1
            continue
        try:
            new = format_source(text, name)
        except CompileError as err:
            print_diagnostics(err)
            status = 1
            continue
        if new == text:
            continue
        changed.append(name)
        if args.check:
            print(f"would reformat {name}")
        elif args.diff:
            sys.stdout.writelines(_diff(text, new, name))
        else:
            path.write_text(new, encoding="utf-8")
            print(f"reformatted {name}", file=sys.stderr)
    if args.check and changed:
        status = 1
    if args.check or not args.diff:
        n = len(files)
        verb = "would be reformatted" if args.check else "reformatted"
        print(f"{len(changed)} of {n} file{'s' if n != 1 else ''} {verb}", file=sys.stderr)
    return status


def _diff(old: str, new: str, name: str) -> list[str]:
    return list(difflib.unified_diff(old.splitlines(keepends=True),
                                     new.splitlines(keepends=True), f"{name}", f"{name}"))
