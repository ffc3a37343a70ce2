"""Pipeline strings: `inline,cse,canonicalize{fast=true}` -> located (name, options) specs.

The grammar is a comma-separated list of pass names, each optionally followed by `{k=v,...}`;
values are bare words or double-quoted JSON strings (with JSON escapes), and options may also be
separated by spaces. Errors are CompileErrors located in the pseudo-file `<pipeline>`, which is
registered with nfc.diagnostics.SOURCES so the caret lands under the offending character.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from nfc.diagnostics import SOURCES, CompileError, Diagnostic
from nfc.ir import Loc

__all__ = ["PIPELINE_FILE", "PassSpec", "parse_pipeline", "parse_pipeline_specs"]

#: The pseudo-file that diagnostics about a pipeline string point into.
PIPELINE_FILE = "<pipeline>"


@dataclass(frozen=True)
class PassSpec:
    """One entry of a parsed pipeline string: a pass name and its options, as written."""

    name: str
    options: dict[str, str]
    loc: Loc
    option_locs: dict[str, Loc] = field(default_factory=dict)


class _PipelineReader:
    """A small hand-written scanner: the grammar is a comma list of `name{k=v,...}`."""

    def __init__(self, text: str, filename: str) -> None:
        self.text, self.filename, self.pos = text, filename, 0

    def loc(self, start: int, end: int | None = None) -> Loc:
        return Loc(self.filename, 1, start + 1, (end + 1) if end is not None else None)

    def fail(self, message: str, start: int, end: int | None = None) -> CompileError:
        return CompileError([Diagnostic("error", message, self.loc(start, end))])

    def skip_ws(self) -> None:
        while self.pos < len(self.text) and self.text[self.pos].isspace():
            self.pos += 1

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def found(self) -> str:
        return f"'{self.peek()}'" if self.peek() else "end of pipeline"

    def word(self, what: str, extra: str = "") -> tuple[str, int]:
        start = self.pos
        while self.pos < len(self.text) and (self.text[self.pos].isalnum()
                                             or self.text[self.pos] in "_-." + extra):
            self.pos += 1
        if start == self.pos:
            raise self.fail(f"expected {what}, found {self.found()}", start)
        return self.text[start:self.pos], start

    def value(self) -> str:
        if self.peek() == '"':  # a JSON string literal
            start = self.pos
            self.pos += 1
            while self.peek() not in ('"', ""):
                self.pos += 2 if self.peek() == "\\" else 1
            if self.peek() != '"':
                raise self.fail("unterminated string in pass option", start)
            self.pos += 1
            try:
                return json.loads(self.text[start:self.pos])
            except json.JSONDecodeError as exc:
                raise self.fail(f"invalid string in pass option: {exc.msg.lower()}", start,
                                self.pos) from None
        start = self.pos
        while self.peek() not in ("", ",", "{", "}", '"') and not self.peek().isspace():
            self.pos += 1
        if start == self.pos:
            raise self.fail(f"expected an option value, found {self.found()}", start)
        return self.text[start:self.pos]

    def entry(self) -> PassSpec:
        name, start = self.word("a pass name")
        spec = PassSpec(name, {}, self.loc(start, self.pos))
        self.skip_ws()
        if self.peek() != "{":
            return spec
        self.pos += 1
        self.skip_ws()
        while self.peek() != "}":
            if not self.peek():
                raise self.fail(f"expected '}}' to close the options of '{name}', found end "
                                "of pipeline", self.pos)
            key, kstart = self.word("an option name")
            if key in spec.options:
                raise self.fail(f"option '{key}' given twice for pass '{name}'", kstart,
                                self.pos)
            self.skip_ws()
            if self.peek() != "=":
                raise self.fail(f"expected '=' after option '{key}', found {self.found()}",
                                self.pos)
            self.pos += 1
            self.skip_ws()
            spec.options[key] = self.value()
            spec.option_locs[key] = self.loc(kstart, self.pos)
            self.skip_ws()
            if self.peek() == ",":
                self.pos += 1
                self.skip_ws()
            elif self.peek() not in ("}", "") and not self.text[self.pos - 1].isspace():
                raise self.fail(f"expected ',' or '}}' after option '{key}', found "
                                f"{self.found()}", self.pos)
        self.pos += 1
        return spec

    def pipeline(self) -> list[PassSpec]:
        specs: list[PassSpec] = []
        self.skip_ws()
        if not self.peek():
            return specs
        while True:
            specs.append(self.entry())
            self.skip_ws()
            if not self.peek():
                return specs
            if self.peek() != ",":
                raise self.fail(f"expected ',' between passes, found {self.found()}", self.pos)
            self.pos += 1
            self.skip_ws()


def parse_pipeline_specs(text: str, filename: str = PIPELINE_FILE) -> list[PassSpec]:
    """Parse `a,b{opt=1,x=foo}` into located specs; raises CompileError pointing into `text`.

    Option values are bare words or double-quoted JSON strings; options
    are separated by commas or spaces.
    """
    SOURCES.add(filename, text)
    if "\n" in text:
        raise CompileError([Diagnostic("error", "a pipeline is one line",
                                       Loc(filename, 1, text.index("\n") + 1))])
    return _PipelineReader(text, filename).pipeline()


def parse_pipeline(text: str) -> list[tuple[str, dict[str, str]]]:
    """Parse a pipeline string into (pass name, {option: value text}) pairs."""
    return [(s.name, dict(s.options)) for s in parse_pipeline_specs(text)]
