"""`nfc lsp`: the .nf language server, speaking LSP over standard input and output.

    nfc lsp                         # started by the editor, not by hand (docs/tools.md)

Diagnostics as you type, hover (shapes and dtypes of tensors, signatures of ops), go to
definition (across imports) and completion of op names. Needs the `lsp` extra:
`pip install 'nfc[lsp]'` (pygls).
"""

from __future__ import annotations

import argparse
from typing import Any


def add_parser(subparsers: Any) -> None:
    """Register `nfc lsp`."""
    p = subparsers.add_parser("lsp", help="run the .nf language server (LSP over stdio)",
                              description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stdio", action="store_true",
                   help="accepted for editors that pass it; stdio is the only transport")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run `nfc lsp`."""
    try:
        from nfc.lsp.server import main
    except ImportError as exc:
        from nfc.cli import UsageError

        raise UsageError(f"nfc lsp needs pygls ({exc}); install it with "
                         "`pip install 'nfc[lsp]'`") from None
    main()
    return 0
