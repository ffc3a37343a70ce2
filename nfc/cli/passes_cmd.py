"""`nfc passes`: every registered pass with its options, defaults and documentation.

    nfc passes                      # all of them, one paragraph each
    nfc passes canonicalize         # one pass, its whole docstring
    nfc passes --load-plugin my_passes:Fold

Passes come from the `nfc.passes` entry-point group; see docs/passes.md to add one.
"""

from __future__ import annotations

import argparse
import inspect
import sys
import textwrap
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Register `nfc passes`."""
    p = subparsers.add_parser("passes", help="list the registered passes and their options",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("names", nargs="*", metavar="NAME", help="show only these passes, in full")
    p.add_argument("--load-plugin", action="append", default=[], metavar="MODULE:CLASS",
                   help="also load an unregistered pass class (MODULE may be a .py path)")
    p.set_defaults(func=run)


def _default(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return '"' + value + '"'
    return str(value)


def describe(cls: Any, source: str, *, full: bool) -> str:
    """The listing of one pass class."""
    wrap = textwrap.TextWrapper(width=96, initial_indent="    ", subsequent_indent="    ")
    doc = (inspect.getdoc(cls) or "") if full else cls.summary()
    lines = [f"{cls.name}", f"  {source}"]
    if full:
        lines += ["    " + ln if ln else "" for ln in doc.split("\n")]
    elif doc:
        lines += wrap.wrap(doc)
    for o in cls.options():
        default = "required" if o.required else f"default {_default(o.default)}"
        lines.append(f"  {o.name.replace('_', '-')}: {o.type.__name__} ({default})")
        if o.doc:
            lines += textwrap.wrap(o.doc, width=96, initial_indent="      ",
                                   subsequent_indent="      ")
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Run `nfc passes`."""
    from nfc.diagnostics import CompileError
    from nfc.passmanager import REGISTRY

    for spec in args.load_plugin:
        REGISTRY.load_plugin(spec)
    names = args.names or REGISTRY.names()
    if args.names:
        for n in names:
            REGISTRY.get(n)  # an unknown name is an error listing the known ones
    status, blocks = 0, []
    for name in names:
        try:
            cls = REGISTRY.get(name)
        except CompileError as err:
            status = 1
            blocks.append(f"{name}\n  {REGISTRY.source(name)}\n    (cannot be loaded: "
                          f"{err.diagnostics[0].message})")
            continue
        blocks.append(describe(cls, REGISTRY.source(name), full=bool(args.names)))
    if not names:
        print("no passes are registered (entry-point group 'nfc.passes')", file=sys.stderr)
    print("\n\n".join(blocks))
    return status
