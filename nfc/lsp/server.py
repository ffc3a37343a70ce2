"""The .nf language server (`nfc lsp`), built on pygls; docs/tools.md shows the editor setup.

Features, in the manner of MLIR's mlir-lsp-server:

- diagnostics as you type: the compiler's own located errors (and their notes, as related
  information) for the unsaved text, published on open, change and save;
- hover: the concrete shape and dtype of a tensor name (its declaration with the values of
  its variables, or, in an op, the types it took at each call), and the signature and doc
  comment of an op;
- go to definition: of an op, across imports (`import std.nn` jumps into nfc/std/nn.nf), and
  of a tensor name (its declaration or latest assignment);
- completion: the ops visible in the file, every op of the standard library, intrinsics and
  keywords;
- formatting: `nfc fmt` (nfc.format) as one edit.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from lsprotocol import types as lsp
from pygls.lsp.server import LanguageServer
from pygls.uris import from_fs_path, to_fs_path

from nfc import __version__
from nfc.diagnostics import Diagnostic
from nfc.ir import Loc
from nfc.lsp.analysis import (
    INTRINSICS,
    KEYWORDS,
    Analysis,
    analyze,
    binding_at,
    file_path,
    op_info,
    std_ops,
    visible_ops,
    word_at,
)

#: Seconds to wait after a change before analysing, so typing does not queue analyses.
DEBOUNCE = 0.2

_SEVERITY = {"error": lsp.DiagnosticSeverity.Error, "warning": lsp.DiagnosticSeverity.Warning,
             "note": lsp.DiagnosticSeverity.Information}


class NfLanguageServer(LanguageServer):
    """A pygls server that keeps the latest analysis of every open document."""

    def __init__(self) -> None:
        super().__init__("nfc-lsp", __version__)
        self.analyses: dict[str, Analysis] = {}
        self.pending: dict[str, int] = {}

    def document_path(self, uri: str) -> str:
        """The file name the frontend is given for `uri` (relative to the cwd when inside)."""
        fs = to_fs_path(uri) if uri.startswith("file:") else None
        path = Path(fs) if fs else Path.cwd() / (uri.rsplit("/", 1)[-1] or "untitled.nf")
        try:
            return str(path.resolve().relative_to(Path.cwd().resolve()))
        except ValueError:
            return str(path)

    def refresh(self, uri: str) -> Analysis:
        """Analyse the current text of `uri` and publish its diagnostics."""
        doc = self.workspace.get_text_document(uri)
        return self.publish(uri, analyze(doc.source, self.document_path(uri)), doc.version)

    async def refresh_later(self, uri: str, version: int) -> None:
        """Analyse `uri` after DEBOUNCE seconds unless it changed again meanwhile; the
        analysis runs in a thread, so hover and completion answer meanwhile."""
        self.pending[uri] = version
        await asyncio.sleep(DEBOUNCE)
        if self.pending.get(uri) != version:
            return
        doc = self.workspace.get_text_document(uri)
        an = await asyncio.to_thread(analyze, doc.source, self.document_path(uri))
        if self.pending.get(uri) == version:
            self.publish(uri, an, version)

    def publish(self, uri: str, an: Analysis, version: int | None) -> Analysis:
        """Keep `an` as the analysis of `uri` and publish its diagnostics."""
        self.analyses[uri] = an
        diags = [to_lsp(d, an) for d in an.diagnostics if d.severity != "note"]
        self.text_document_publish_diagnostics(
            lsp.PublishDiagnosticsParams(uri=uri, diagnostics=diags, version=version))
        return an

    def analysis(self, uri: str) -> Analysis:
        """The latest analysis of `uri` (made now if there is none)."""
        return self.analyses.get(uri) or self.refresh(uri)


def lsp_range(loc: Loc, text: str | None) -> lsp.Range:
    """The protocol range (0-based, end exclusive) of a 1-based Loc; without an end column,
    the name (or the character) at the location."""
    line, col = max(loc.line - 1, 0), max(loc.col - 1, 0)
    end = loc.end_col - 1 if loc.end_col is not None and loc.end_col > loc.col else None
    if end is None:
        end = col + 1
        if text is not None:
            w = word_at(text, loc.line, loc.col)
            if w is not None and w[1] == loc.col:
                end = w[2] - 1
    return lsp.Range(start=lsp.Position(line=line, character=col),
                     end=lsp.Position(line=line, character=end))


def _text_of(file: str) -> str | None:
    from nfc.diagnostics import SOURCES

    return SOURCES.files.get(file)


def _same_file(a: str, b: str) -> bool:
    return a == b or file_path(a) == file_path(b)


def to_lsp(d: Diagnostic, an: Analysis) -> lsp.Diagnostic:
    """A compiler diagnostic as an LSP one on the document of `an`. An error located in
    another file (an imported module) is shown at the first note in this document, else at
    the first import, with its location in the message."""
    related = [lsp.DiagnosticRelatedInformation(
        location=lsp.Location(uri=from_fs_path(str(file_path(n.loc.file))) or n.loc.file,
                              range=lsp_range(n.loc, _text_of(n.loc.file))),
        message=n.message) for n in d.notes if n.loc is not None]
    message = d.message
    if d.loc is not None and _same_file(d.loc.file, an.path):
        rng = lsp_range(d.loc, an.text)
    else:
        here = next((n.loc for n in d.notes if n.loc is not None
                     and _same_file(n.loc.file, an.path)), None)
        if here is None and an.program is not None and an.program.imports:
            here = an.program.imports[0].loc
        rng = lsp_range(here, an.text) if here is not None else lsp.Range(
            start=lsp.Position(line=0, character=0), end=lsp.Position(line=0, character=0))
        if d.loc is not None:
            message = f"{d.loc}: {message}"
            related.insert(0, lsp.DiagnosticRelatedInformation(
                location=lsp.Location(uri=from_fs_path(str(file_path(d.loc.file))) or "",
                                      range=lsp_range(d.loc, _text_of(d.loc.file))),
                message=d.message))
    return lsp.Diagnostic(range=rng, message=message, source="nfc",
                          severity=_SEVERITY.get(d.severity, lsp.DiagnosticSeverity.Error),
                          related_information=related or None)


def _markdown(*blocks: str) -> lsp.MarkupContent:
    return lsp.MarkupContent(kind=lsp.MarkupKind.Markdown,
                             value="\n\n".join(b for b in blocks if b))


def hover(an: Analysis, line: int, col: int) -> lsp.Hover | None:
    """The hover at 0-based (line, col)."""
    w = word_at(an.text, line + 1, col + 1)
    if w is None:
        return None
    word, start, end = w
    rng = lsp.Range(start=lsp.Position(line=line, character=start - 1),
                    end=lsp.Position(line=line, character=end - 1))
    b = binding_at(an, word, line + 1, col + 1)
    if b is not None:
        if b.types:
            shown = "\n".join(f"{word}: {t}" for t in b.types[:8])
            more = f"\n({len(b.types) - 8} more)" if len(b.types) > 8 else ""
            calls = " (one per call)" if len(b.types) > 1 else ""
            text = _markdown(f"```nf\n{shown}{more}\n```",
                             f"declared `{b.declared}`" if b.declared else "",
                             f"tensor{calls}, bound at line {b.loc.line}")
        else:
            text = _markdown(f"```nf\n{word}: {b.declared}\n```",
                             "parameter (the op is not called, so its sizes are symbolic)")
        return lsp.Hover(contents=text, range=rng)
    ops = visible_ops(an).get(word)
    info = op_info(ops[0]) if ops else std_ops().get(word)
    if info is not None:
        where = info.file if ops else f"{info.file} (not imported: add `import std.nn`)"
        return lsp.Hover(contents=_markdown(f"```nf\n{info.signature}\n```", info.doc,
                                            f"defined in {where}:{info.line}"), range=rng)
    return None


def definition(an: Analysis, line: int, col: int) -> list[lsp.Location]:
    """Where the name at 0-based (line, col) is defined."""
    w = word_at(an.text, line + 1, col + 1)
    if w is None:
        return []
    word = w[0]
    b = binding_at(an, word, line + 1, col + 1)
    if b is not None:
        return [lsp.Location(uri=from_fs_path(str(file_path(b.loc.file))) or "",
                             range=lsp_range(b.loc, an.text))]
    ops = visible_ops(an).get(word, [])
    infos = [op_info(o) for o in ops]
    if not infos and word in std_ops():
        infos = [std_ops()[word]]
    return [lsp.Location(uri=from_fs_path(str(file_path(i.file))) or "",
                         range=lsp.Range(start=lsp.Position(line=i.line - 1, character=i.col - 1),
                                         end=lsp.Position(line=i.line - 1,
                                                          character=i.col - 1 + len(i.name))))
            for i in infos]


def completion(an: Analysis) -> lsp.CompletionList:
    """Op names (the file's, its imports', the standard library's), intrinsics, keywords."""
    items: dict[str, lsp.CompletionItem] = {}
    for name, ops in visible_ops(an).items():
        info = op_info(ops[0])
        items[name] = lsp.CompletionItem(label=name, kind=lsp.CompletionItemKind.Function,
                                         detail=info.signature,
                                         documentation=info.doc or None)
    for name, info in std_ops().items():
        items.setdefault(name, lsp.CompletionItem(
            label=name, kind=lsp.CompletionItemKind.Function, detail=info.signature,
            documentation=(info.doc + "\n\n" if info.doc else "") + "(std.nn)"))
    for name in INTRINSICS:
        items.setdefault(name, lsp.CompletionItem(label=name,
                                                  kind=lsp.CompletionItemKind.Function,
                                                  detail="intrinsic"))
    for name in KEYWORDS:
        items.setdefault(name, lsp.CompletionItem(label=name,
                                                  kind=lsp.CompletionItemKind.Keyword))
    return lsp.CompletionList(is_incomplete=False, items=list(items.values()))


def formatting(text: str, path: str) -> list[lsp.TextEdit] | None:
    """`nfc fmt` as one edit replacing the document; None when it does not parse (the
    diagnostics already say why) or is formatted already."""
    from nfc.diagnostics import CompileError
    from nfc.format import format_source

    try:
        new = format_source(text, path)
    except CompileError:
        return None
    if new == text:
        return []
    lines = text.split("\n")
    end = lsp.Position(line=len(lines) - 1, character=len(lines[-1].encode("utf-16-le")) // 2)
    return [lsp.TextEdit(range=lsp.Range(start=lsp.Position(line=0, character=0), end=end),
                         new_text=new)]


def build_server() -> NfLanguageServer:
    """The server with its features registered."""
    server = NfLanguageServer()

    @server.feature(lsp.TEXT_DOCUMENT_DID_OPEN)
    def did_open(ls: NfLanguageServer, params: lsp.DidOpenTextDocumentParams) -> None:
        ls.refresh(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CHANGE)
    async def did_change(ls: NfLanguageServer, params: lsp.DidChangeTextDocumentParams) -> None:
        await ls.refresh_later(params.text_document.uri, params.text_document.version)

    @server.feature(lsp.TEXT_DOCUMENT_DID_SAVE)
    def did_save(ls: NfLanguageServer, params: lsp.DidSaveTextDocumentParams) -> None:
        ls.refresh(params.text_document.uri)

    @server.feature(lsp.TEXT_DOCUMENT_DID_CLOSE)
    def did_close(ls: NfLanguageServer, params: lsp.DidCloseTextDocumentParams) -> None:
        ls.analyses.pop(params.text_document.uri, None)
        ls.pending.pop(params.text_document.uri, None)
        ls.text_document_publish_diagnostics(
            lsp.PublishDiagnosticsParams(uri=params.text_document.uri, diagnostics=[]))

    @server.feature(lsp.TEXT_DOCUMENT_HOVER)
    def on_hover(ls: NfLanguageServer, params: lsp.HoverParams) -> lsp.Hover | None:
        an = ls.analysis(params.text_document.uri)
        return hover(an, params.position.line, params.position.character)

    @server.feature(lsp.TEXT_DOCUMENT_DEFINITION)
    def on_definition(ls: NfLanguageServer,
                      params: lsp.DefinitionParams) -> list[lsp.Location] | None:
        an = ls.analysis(params.text_document.uri)
        return definition(an, params.position.line, params.position.character) or None

    @server.feature(lsp.TEXT_DOCUMENT_FORMATTING)
    def on_formatting(ls: NfLanguageServer,
                      params: lsp.DocumentFormattingParams) -> list[lsp.TextEdit] | None:
        doc = ls.workspace.get_text_document(params.text_document.uri)
        return formatting(doc.source, ls.document_path(params.text_document.uri))

    @server.feature(lsp.TEXT_DOCUMENT_COMPLETION, lsp.CompletionOptions(trigger_characters=[]))
    def on_completion(ls: NfLanguageServer, params: lsp.CompletionParams) -> Any:
        return completion(ls.analysis(params.text_document.uri))

    return server


def main() -> None:
    """Serve over standard input and output until the client says exit."""
    build_server().start_io()
