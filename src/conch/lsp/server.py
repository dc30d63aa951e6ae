"""``conch lsp``: a Language Server Protocol server over stdio (pygls).

Every feature is a function of :mod:`.analysis`; this module keeps one analysis per open
document (recomputed on each change, incremental sync) and converts positions between the
analysis's code points and the client's encoding (UTF-16 unless the client offers another).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from lsprotocol import types as T
from pygls.lsp.server import LanguageServer

from conch import __version__
from conch.lsp import analysis as an
from conch.lsp import queries

log = logging.getLogger("conch.lsp")

_KINDS = {
    "function": T.CompletionItemKind.Function,
    "variable": T.CompletionItemKind.Variable,
    "keyword": T.CompletionItemKind.Keyword,
    "field": T.CompletionItemKind.Field,
    "property": T.CompletionItemKind.Property,
}
_SYMBOLS = {"function": T.SymbolKind.Function, "variable": T.SymbolKind.Variable}


class ConchLanguageServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__("conch-lsp", __version__, text_document_sync_kind=T.TextDocumentSyncKind.Incremental)
        self.analyses: dict[str, an.Analysis] = {}
        self.last_ms = 0.0  # how long the last analysis took (logged at debug level)

    # documents

    def analysis(self, uri: str) -> an.Analysis:
        text = self.workspace.get_text_document(uri).source
        cached = self.analyses.get(uri)
        if cached is None or cached.text != text:
            t0 = time.perf_counter()
            cached = an.analyse(text)
            self.last_ms = (time.perf_counter() - t0) * 1000
            log.debug("analysed %s (%d lines) in %.1f ms", uri, len(cached.lines), self.last_ms)
            self.analyses[uri] = cached
        return cached

    def publish(self, uri: str) -> None:
        a = self.analysis(uri)
        doc = self.workspace.get_text_document(uri)
        diags = [
            T.Diagnostic(
                range=self.range(a, d.range),
                message=d.message + (f"\nhint: {d.hint}" if d.hint else ""),
                severity=T.DiagnosticSeverity.Error if d.severity == "error" else T.DiagnosticSeverity.Warning,
                code=d.kind,
                source="conch",
            )
            for d in a.diagnostics
        ]
        self.text_document_publish_diagnostics(
            T.PublishDiagnosticsParams(uri=uri, diagnostics=diags, version=doc.version)
        )

    # positions: the analysis counts code points, the client (usually) UTF-16 units

    @property
    def encoding(self) -> str:
        enc = self.workspace.position_encoding or T.PositionEncodingKind.Utf16
        return enc.value if isinstance(enc, T.PositionEncodingKind) else str(enc)

    def to_client(self, a: an.Analysis, line: int, ch: int) -> T.Position:
        if line < len(a.lines):
            text = a.lines[line][:ch]
            if not text.isascii():
                enc = self.encoding
                if enc == T.PositionEncodingKind.Utf16:
                    ch = len(text.encode("utf-16-le")) // 2
                elif enc == T.PositionEncodingKind.Utf8:
                    ch = len(text.encode("utf-8"))
        return T.Position(line=line, character=ch)

    def from_client(self, a: an.Analysis, pos: T.Position) -> tuple[int, int]:
        line, ch = pos.line, pos.character
        if line >= len(a.lines):
            return len(a.lines) - 1, len(a.lines[-1])
        text = a.lines[line]
        if text.isascii() or self.encoding == T.PositionEncodingKind.Utf32:
            return line, min(ch, len(text))
        utf8 = self.encoding == T.PositionEncodingKind.Utf8
        units = 0
        for i, c in enumerate(text):
            if units >= ch:
                return line, i
            units += len(c.encode("utf-8")) if utf8 else (2 if ord(c) > 0xFFFF else 1)
        return line, len(text)

    def range(self, a: an.Analysis, r: an.Range) -> T.Range:
        return T.Range(start=self.to_client(a, r[0], r[1]), end=self.to_client(a, r[2], r[3]))

    def location(self, uri: str, a: an.Analysis, r: an.Range) -> T.Location:
        return T.Location(uri=uri, range=self.range(a, r))


server = ConchLanguageServer()


@server.feature(T.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: ConchLanguageServer, params: T.DidOpenTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(T.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: ConchLanguageServer, params: T.DidChangeTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(T.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: ConchLanguageServer, params: T.DidCloseTextDocumentParams) -> None:
    uri = params.text_document.uri
    ls.analyses.pop(uri, None)
    ls.text_document_publish_diagnostics(T.PublishDiagnosticsParams(uri=uri, diagnostics=[]))


@server.feature(T.TEXT_DOCUMENT_COMPLETION, T.CompletionOptions(trigger_characters=[".", "("]))
def completion(ls: ConchLanguageServer, params: T.CompletionParams) -> T.CompletionList:
    a = ls.analysis(params.text_document.uri)
    line, ch = ls.from_client(a, params.position)
    items = [
        T.CompletionItem(
            label=c.label,
            kind=_KINDS.get(c.kind),
            detail=c.detail or None,
            documentation=T.MarkupContent(kind=T.MarkupKind.Markdown, value=c.documentation) if c.documentation else None,
            insert_text=c.insert_text,
            sort_text=c.sort_text,
        )
        for c in queries.completions(a, line, ch)
    ]
    return T.CompletionList(is_incomplete=False, items=items)


@server.feature(T.TEXT_DOCUMENT_HOVER)
def hover(ls: ConchLanguageServer, params: T.HoverParams) -> T.Hover | None:
    a = ls.analysis(params.text_document.uri)
    h = queries.hover(a, *ls.from_client(a, params.position))
    if h is None:
        return None
    return T.Hover(contents=T.MarkupContent(kind=T.MarkupKind.Markdown, value=h.markdown), range=ls.range(a, h.range))


@server.feature(T.TEXT_DOCUMENT_SIGNATURE_HELP, T.SignatureHelpOptions(trigger_characters=["(", ","]))
def signature_help(ls: ConchLanguageServer, params: T.SignatureHelpParams) -> T.SignatureHelp | None:
    a = ls.analysis(params.text_document.uri)
    s = queries.signature_help(a, *ls.from_client(a, params.position))
    if s is None:
        return None
    sig = T.SignatureInformation(
        label=s.label,
        documentation=T.MarkupContent(kind=T.MarkupKind.Markdown, value=s.documentation) if s.documentation else None,
        parameters=[T.ParameterInformation(label=p) for p in s.parameters],
        active_parameter=s.active_parameter,
    )
    return T.SignatureHelp(signatures=[sig], active_signature=0, active_parameter=s.active_parameter)


@server.feature(T.TEXT_DOCUMENT_DEFINITION)
def definition(ls: ConchLanguageServer, params: T.DefinitionParams) -> T.Location | None:
    uri = params.text_document.uri
    a = ls.analysis(uri)
    r = queries.definition(a, *ls.from_client(a, params.position))
    return None if r is None else ls.location(uri, a, r)


@server.feature(T.TEXT_DOCUMENT_REFERENCES)
def references(ls: ConchLanguageServer, params: T.ReferenceParams) -> list[T.Location]:
    uri = params.text_document.uri
    a = ls.analysis(uri)
    line, ch = ls.from_client(a, params.position)
    found = queries.references(a, line, ch, params.context.include_declaration)
    return [ls.location(uri, a, r) for r in found]


@server.feature(T.TEXT_DOCUMENT_DOCUMENT_SYMBOL)
def document_symbol(ls: ConchLanguageServer, params: T.DocumentSymbolParams) -> list[T.DocumentSymbol]:
    a = ls.analysis(params.text_document.uri)

    def convert(s: an.SymbolInfo) -> T.DocumentSymbol:
        return T.DocumentSymbol(
            name=s.name,
            kind=_SYMBOLS.get(s.kind, T.SymbolKind.Variable),
            detail=s.detail,
            range=ls.range(a, s.range),
            selection_range=ls.range(a, s.selection_range),
            children=[convert(c) for c in s.children],
        )

    return [convert(s) for s in queries.document_symbols(a)]


def run_stdio(**_: Any) -> None:
    """Serve one client on stdin/stdout until it exits."""
    queries.warm_up()  # the builtins' completion items, so that the first completion is quick
    server.start_io()
