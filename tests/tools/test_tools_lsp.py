"""`nfc lsp`: drive the server as a subprocess with pygls's LSP client over stdio."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("pygls")

from lsprotocol import types as lsp  # noqa: E402
from pygls.lsp.client import LanguageClient  # noqa: E402
from pygls.uris import from_fs_path  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
STD = ROOT / "nfc" / "std" / "nn.nf"

MODEL = """\
import std.nn

# doubles x
op twice(x: T[N, D]) -> T[N, D] {
  y[n, d] = x[n, d] * 2.0
}

model m(batch = 8) {
  input  x: f32[batch, 4]
  input  y: i32[batch]
  param  w: f32[4, 3] = zeros
  param  b: f32[3] = zeros
  h = twice(x)
  logits = linear(h, w, b)
  loss = softmax_cross_entropy(logits, y)
  output logits
  minimize loss with sgd(lr = 0.1)
}
"""


class Session:
    """A client connected to `nfc lsp`, collecting published diagnostics."""

    def __init__(self, client: LanguageClient) -> None:
        self.client = client
        self.diagnostics: dict[str, list[lsp.Diagnostic]] = {}
        self.events: asyncio.Queue[str] = asyncio.Queue()

    async def wait_diagnostics(self, uri: str) -> list[lsp.Diagnostic]:
        while True:
            got = await asyncio.wait_for(self.events.get(), timeout=60)
            if got == uri:
                return self.diagnostics[uri]

    def open(self, uri: str, text: str) -> None:
        self.client.text_document_did_open(lsp.DidOpenTextDocumentParams(
            text_document=lsp.TextDocumentItem(uri=uri, language_id="nf", version=1,
                                               text=text)))

    def change(self, uri: str, text: str, version: int) -> None:
        self.client.text_document_did_change(lsp.DidChangeTextDocumentParams(
            text_document=lsp.VersionedTextDocumentIdentifier(uri=uri, version=version),
            content_changes=[lsp.TextDocumentContentChangeWholeDocument(text=text)]))

    async def hover(self, uri: str, line: int, col: int) -> lsp.Hover | None:
        return await self.client.text_document_hover_async(lsp.HoverParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            position=lsp.Position(line=line, character=col)))

    async def definition(self, uri: str, line: int, col: int) -> Any:
        return await self.client.text_document_definition_async(lsp.DefinitionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            position=lsp.Position(line=line, character=col)))

    async def completion(self, uri: str, line: int, col: int) -> Any:
        return await self.client.text_document_completion_async(lsp.CompletionParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            position=lsp.Position(line=line, character=col)))


def run_session(tmp_path: Path, body: Callable[[Session], Awaitable[None]]) -> None:
    async def main() -> None:
        client = LanguageClient("nfc-test", "0")
        session = Session(client)

        @client.feature(lsp.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        def on_diagnostics(params: lsp.PublishDiagnosticsParams) -> None:
            session.diagnostics[params.uri] = list(params.diagnostics)
            session.events.put_nowait(params.uri)

        await client.start_io(sys.executable, "-m", "nfc", "lsp", cwd=str(tmp_path))
        try:
            await client.initialize_async(lsp.InitializeParams(
                capabilities=lsp.ClientCapabilities(),
                root_uri=from_fs_path(str(tmp_path))))
            client.initialized(lsp.InitializedParams())
            await body(session)
            await client.shutdown_async(None)
            client.exit(None)
            await asyncio.wait_for(client.stop(), timeout=30)
        except BaseException:
            server = getattr(client, "_server", None)  # do not wait for a server in trouble
            if server is not None and server.returncode is None:
                server.kill()
            raise

    asyncio.run(asyncio.wait_for(main(), timeout=240))


def _pos(text: str, needle: str, nth: int = 0, offset: int = 0) -> tuple[int, int]:
    """0-based (line, column) of the `nth` occurrence of `needle` in `text`, plus `offset`."""
    at = -1
    for _ in range(nth + 1):
        at = text.index(needle, at + 1)
    line = text.count("\n", 0, at)
    return line, at - (text.rfind("\n", 0, at) + 1) + offset


def _value(h: lsp.Hover | None) -> str:
    assert h is not None
    c = h.contents
    return c.value if isinstance(c, lsp.MarkupContent) else str(c)


def test_lsp_session(tmp_path: Path) -> None:
    path = tmp_path / "m.nf"
    path.write_text(MODEL)
    uri = from_fs_path(str(path))
    assert uri is not None

    async def body(s: Session) -> None:
        s.open(uri, MODEL)
        assert await s.wait_diagnostics(uri) == []

        # hover: the shape of a tensor, at its definition and at a use
        h = _value(await s.hover(uri, *_pos(MODEL, "h = twice")))
        assert "h: f32[8, 4]" in h
        logits_use = _pos(MODEL, "logits", nth=1)  # in `softmax_cross_entropy(logits, y)`
        assert "logits: f32[8, 3]" in _value(await s.hover(uri, *logits_use))
        decl = _value(await s.hover(uri, *_pos(MODEL, "x: f32")))
        assert "x: f32[8, 4]" in decl and "batch = 8" in decl
        # in an op: the type at its call
        assert "y: f32[8, 4]" in _value(await s.hover(uri, *_pos(MODEL, "y[n, d]")))
        # hover on an op: its signature and doc comment
        sig = _value(await s.hover(uri, *_pos(MODEL, "linear(h")))
        assert "op linear(x: T[..., K], w: T[K, M], b: T[M]) -> T[..., M]" in sig
        assert "doubles x" in _value(await s.hover(uri, *_pos(MODEL, "twice(x)")))

        # go to definition across the import, and inside the file
        locs = await s.definition(uri, *_pos(MODEL, "softmax_cross_entropy"))
        assert len(locs) == 1 and Path(locs[0].uri.removeprefix("file://")).resolve() == STD
        line = STD.read_text().split("\n")[locs[0].range.start.line]
        assert line.startswith("op softmax_cross_entropy")
        assert line[locs[0].range.start.character:].startswith("softmax_cross_entropy")
        locs = await s.definition(uri, *_pos(MODEL, "twice(x)"))
        assert locs[0].uri == uri and locs[0].range.start.line == _pos(MODEL, "op twice")[0]

        # completion: the standard library's ops
        items = await s.completion(uri, *_pos(MODEL, "h = twice"))
        labels = {i.label for i in (items.items if hasattr(items, "items") else items)}
        assert {"conv2d", "linear", "layer_norm", "twice", "relu"} <= labels

        # diagnostics as you type: the compiler's located error, then its fix
        bad = MODEL.replace("linear(h, w, b)", "linear(h, b, w)")
        s.change(uri, bad, 2)
        diags = await s.wait_diagnostics(uri)
        assert diags and diags[0].severity == lsp.DiagnosticSeverity.Error
        assert diags[0].source == "nfc"
        assert diags[0].range.start.line == _pos(bad, "linear(h, b, w)")[0]
        s.change(uri, MODEL.replace("twice(x)", "twcie(x)"), 3)
        diags = await s.wait_diagnostics(uri)
        assert len(diags) == 1 and "did you mean 'twice'" in diags[0].message
        start = _pos(MODEL, "twice(x)")
        assert (diags[0].range.start.line, diags[0].range.start.character) == start
        assert diags[0].range.end.character == start[1] + len("twcie")
        s.change(uri, MODEL.replace("h = twice(x)", "h = twice(x) +"), 4)
        diags = await s.wait_diagnostics(uri)
        assert diags and "unexpected" in diags[0].message  # a syntax error
        s.change(uri, MODEL, 5)
        assert await s.wait_diagnostics(uri) == []

        # formatting: nfc fmt as one edit
        messy = MODEL.replace("h = twice(x)", "h=twice( x )")
        s.change(uri, messy, 6)
        await s.wait_diagnostics(uri)
        edits = await s.client.text_document_formatting_async(lsp.DocumentFormattingParams(
            text_document=lsp.TextDocumentIdentifier(uri=uri),
            options=lsp.FormattingOptions(tab_size=2, insert_spaces=True)))
        assert len(edits) == 1 and edits[0].new_text == MODEL
        assert edits[0].range.end.line == messy.count("\n")

    run_session(tmp_path, body)


def test_lsp_unit_ranges() -> None:
    """Locations convert to 0-based protocol ranges; a located note becomes related info."""
    from nfc.diagnostics import Diagnostic
    from nfc.ir import Loc
    from nfc.lsp.analysis import analyze
    from nfc.lsp.server import lsp_range, to_lsp

    r = lsp_range(Loc("a.nf", 3, 5, 9), None)
    assert (r.start.line, r.start.character, r.end.line, r.end.character) == (2, 4, 2, 8)
    r = lsp_range(Loc("a.nf", 1, 4), "x  abc = 1")  # no end: the name there
    assert (r.start.character, r.end.character) == (3, 6)
    an = analyze("op f(x: T[N]) -> T[N] {\n  y[n] = x[n]\n}\n", "a.nf")
    d = to_lsp(Diagnostic("error", "bad", Loc("a.nf", 2, 3, 4),
                          (Diagnostic("note", "here", Loc("a.nf", 1, 6, 7)),)), an)
    assert d.related_information and d.related_information[0].message == "here"
