"""Diagnostics: located errors and notes, rendered with the source line and a caret.

    capsule.nf:7:51: error: access 'A' dimension 2 can reach 30 but the tensor has size 30
      out[b, o, p, q, i, j] = sum(c, r, s, t) A[b, c, p*stride + r, ...] * K[o, c, r, s, t, j]
                                                      ^~~~~~~~~~~~

A user's mistake is raised as `CompileError` carrying every diagnostic found; the CLI prints
them and exits with code 1. Internal bugs are ordinary exceptions.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import TextIO

from nfc.ir import Loc


@dataclass(frozen=True)
class Diagnostic:
    """One message with a severity (`error`, `warning`, `note`) and an optional location."""

    severity: str
    message: str
    loc: Loc | None = None
    notes: tuple[Diagnostic, ...] = ()


class SourceManager:
    """Remembers the text of every file read, so diagnostics can quote it."""

    def __init__(self) -> None:
        self.files: dict[str, str] = {}

    def add(self, name: str, text: str) -> None:
        """Remember the text of `name`."""
        self.files[name] = text

    def line(self, name: str, line: int) -> str | None:
        """Line `line` (1-based) of `name`, or None when unknown."""
        text = self.files.get(name)
        if text is None:
            return None
        lines = text.split("\n")
        if 1 <= line <= len(lines):
            return lines[line - 1].rstrip("\r")
        return None


#: The process-wide source manager the frontend and the IR parser register files with.
SOURCES = SourceManager()

#: Longest source line quoted in full; longer lines are cut around the column.
_MAX_QUOTE = 160


def render(d: Diagnostic, sources: SourceManager | None = None) -> str:
    """`file:line:col: severity: message`, the source line and a caret; then the notes."""
    sources = sources or SOURCES
    out: list[str] = []
    if d.loc is None:
        out.append(f"nfc: {d.severity}: {d.message}")
    else:
        out.append(f"{d.loc}: {d.severity}: {d.message}")
        line = sources.line(d.loc.file, d.loc.line)
        if line is not None:
            col = max(d.loc.col, 1)
            width = 1
            if d.loc.end_col is not None and d.loc.end_col > col:
                width = d.loc.end_col - col
            start = 0
            if len(line) > _MAX_QUOTE:
                start = max(0, col - 1 - _MAX_QUOTE // 2)
                line = line[start:start + _MAX_QUOTE]
            line = line.replace("\t", " ")
            out.append("  " + line)
            pad = " " * (col - 1 - start)
            width = max(1, min(width, len(line) - (col - 1 - start)))
            out.append("  " + pad + "^" + "~" * (width - 1))
    for n in d.notes:
        out.append(render(n, sources))
    return "\n".join(out)


class CompileError(Exception):
    """A user's mistake: carries one or more diagnostics."""

    def __init__(self, diagnostics: list[Diagnostic]) -> None:
        assert diagnostics, "a CompileError needs at least one diagnostic"
        self.diagnostics = list(diagnostics)
        super().__init__("\n".join(render(d) for d in self.diagnostics))

    def render(self, sources: SourceManager | None = None) -> str:
        """All diagnostics, each with its quoted source."""
        return "\n".join(render(d, sources) for d in self.diagnostics)


def error(message: str, loc: Loc | None = None, *notes: Diagnostic) -> CompileError:
    """A CompileError with one error diagnostic (raise it)."""
    return CompileError([Diagnostic("error", message, loc, tuple(notes))])


def note(message: str, loc: Loc | None = None) -> Diagnostic:
    """A note to attach to an error."""
    return Diagnostic("note", message, loc)


@dataclass
class DiagnosticEngine:
    """Collects independent errors so that a file reports all of them, not only the first."""

    diagnostics: list[Diagnostic] = field(default_factory=list)
    limit: int = 50
    """Most errors kept; later ones are dropped so garbage input cannot flood the terminal."""

    def error(self, message: str, loc: Loc | None = None, *notes: Diagnostic) -> None:
        """Record an error."""
        if self.error_count < self.limit:
            self.diagnostics.append(Diagnostic("error", message, loc, tuple(notes)))

    def extend(self, err: CompileError) -> None:
        """Record the diagnostics of a raised CompileError."""
        for d in err.diagnostics:
            if self.error_count < self.limit:
                self.diagnostics.append(d)

    @property
    def error_count(self) -> int:
        """How many errors were recorded."""
        return sum(d.severity == "error" for d in self.diagnostics)

    def check(self) -> None:
        """Raise a CompileError if any error was recorded."""
        if self.error_count:
            raise CompileError(self.diagnostics)


def print_diagnostics(err: CompileError, stream: TextIO | None = None) -> None:
    """Print every diagnostic of `err` to `stream` (stderr by default)."""
    print(err.render(), file=stream or sys.stderr)
