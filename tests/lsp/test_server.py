"""``conch lsp`` end to end: a real LSP client (pytest-lsp) talks to the server over stdio."""

from __future__ import annotations

import sys

import pytest
import pytest_lsp
from lsprotocol import types as T
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

URI = "file:///tmp/conch-lsp-test/main.conch"

DOC = """\
let greeting = "hello"
fn shout(s) => upper(s) + "!"
let words = ["a", "b"] | map(shout)
let n = lenn(words)
shout(greeting)
"""


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "conch.cli.main", "lsp", "--stdio"]),
)
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    params = T.InitializeParams(capabilities=client_capabilities("visual-studio-code"))
    await lsp_client.initialize_session(params)
    yield
    await lsp_client.shutdown_session()


async def open_doc(client: LanguageClient, text: str, uri: str = URI) -> None:
    client.text_document_did_open(
        T.DidOpenTextDocumentParams(text_document=T.TextDocumentItem(uri=uri, language_id="conch", version=1, text=text))
    )
    await client.wait_for_notification(T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)


@pytest.mark.asyncio
async def test_diagnostics_as_you_type(client: LanguageClient) -> None:
    await open_doc(client, DOC)
    [d] = client.diagnostics[URI]
    assert d.range == T.Range(start=T.Position(line=3, character=8), end=T.Position(line=3, character=12))
    assert d.code == "NameError"
    assert d.message == "unknown name 'lenn'\nhint: did you mean \"len\"?"
    assert d.source == "conch"

    # an incremental edit: lenn -> len, and a syntax error on a new last line
    client.text_document_did_change(
        T.DidChangeTextDocumentParams(
            text_document=T.VersionedTextDocumentIdentifier(uri=URI, version=2),
            content_changes=[
                T.TextDocumentContentChangePartial(
                    range=T.Range(start=T.Position(line=3, character=8), end=T.Position(line=3, character=12)),
                    text="len",
                ),
                T.TextDocumentContentChangePartial(
                    range=T.Range(start=T.Position(line=5, character=0), end=T.Position(line=5, character=0)),
                    text="let bad = (1 + )\n",
                ),
            ],
        )
    )
    await client.wait_for_notification(T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
    [d] = client.diagnostics[URI]
    assert d.code == "SyntaxError"
    assert d.range == T.Range(start=T.Position(line=5, character=15), end=T.Position(line=5, character=16))
    assert d.message.startswith("unexpected ')'")


@pytest.mark.asyncio
async def test_completion_hover_definition(client: LanguageClient) -> None:
    await open_doc(client, DOC + "let r = {name: 1}\nr.")
    doc = T.TextDocumentIdentifier(uri=URI)

    result = await client.text_document_completion_async(
        T.CompletionParams(text_document=doc, position=T.Position(line=5, character=0))
    )
    assert isinstance(result, T.CompletionList)
    items = {i.label: i for i in result.items}
    assert items["sort_by"].detail == "sort_by(items: Array, key: String | Function, desc: Bool = false) -> Array"
    assert items["sort_by"].kind == T.CompletionItemKind.Function
    assert items["shout"].detail == "fn shout(s)"

    fields = await client.text_document_completion_async(
        T.CompletionParams(text_document=doc, position=T.Position(line=6, character=2))
    )
    assert isinstance(fields, T.CompletionList)
    assert [i.label for i in fields.items] == ["name"]

    hover = await client.text_document_hover_async(
        T.HoverParams(text_document=doc, position=T.Position(line=1, character=16))
    )
    assert hover is not None and isinstance(hover.contents, T.MarkupContent)
    assert "upper(s: String) -> String" in hover.contents.value

    loc = await client.text_document_definition_async(
        T.DefinitionParams(text_document=doc, position=T.Position(line=4, character=8))
    )
    assert isinstance(loc, T.Location)
    assert loc.range == T.Range(start=T.Position(line=0, character=4), end=T.Position(line=0, character=12))

    refs = await client.text_document_references_async(
        T.ReferenceParams(text_document=doc, position=T.Position(line=1, character=4),
                          context=T.ReferenceContext(include_declaration=True))
    )
    assert refs is not None
    assert sorted((r.range.start.line, r.range.start.character) for r in refs) == [(1, 3), (2, 29), (4, 0)]

    sig = await client.text_document_signature_help_async(
        T.SignatureHelpParams(text_document=doc, position=T.Position(line=2, character=29))
    )
    assert sig is not None
    assert sig.signatures[0].label.startswith("map(items: Array, fn: Function)")
    assert sig.active_parameter == 1

    symbols = await client.text_document_document_symbol_async(T.DocumentSymbolParams(text_document=doc))
    assert symbols is not None
    assert [s.name for s in symbols] == ["greeting", "shout", "words", "n", "r"]


@pytest.mark.asyncio
async def test_round_trip_latency_on_1000_lines(client: LanguageClient) -> None:
    """Prints the time from a didChange to its publishDiagnostics and of a completion request
    on a 1,000-line document, through the client (docs/lsp.md); never asserted."""
    import statistics
    import time

    from tests.lsp.test_analysis import big_document

    text = big_document()
    await open_doc(client, text)
    assert list(client.diagnostics[URI]) == []
    doc = T.TextDocumentIdentifier(uri=URI)
    edits, completions = [], []
    for k in range(10):
        t0 = time.perf_counter()
        client.text_document_did_change(
            T.DidChangeTextDocumentParams(
                text_document=T.VersionedTextDocumentIdentifier(uri=URI, version=2 + k),
                content_changes=[
                    T.TextDocumentContentChangePartial(
                        range=T.Range(start=T.Position(line=500, character=0), end=T.Position(line=500, character=0)),
                        text=f"let added{k} = lenn({k})\n",
                    )
                ],
            )
        )
        await client.wait_for_notification(T.TEXT_DOCUMENT_PUBLISH_DIAGNOSTICS)
        edits.append((time.perf_counter() - t0) * 1000)
        assert len(client.diagnostics[URI]) == k + 1
        t0 = time.perf_counter()
        await client.text_document_completion_async(
            T.CompletionParams(text_document=doc, position=T.Position(line=501, character=0))
        )
        completions.append((time.perf_counter() - t0) * 1000)
    print(f"\nround trip, 1000 lines: didChange -> diagnostics median {statistics.median(edits):.1f} ms "
          f"(max {max(edits):.1f}); completion median {statistics.median(completions):.1f} ms "
          f"(max {max(completions):.1f})")


@pytest.mark.asyncio
async def test_positions_in_utf16(client: LanguageClient) -> None:
    """The analysis counts code points; the client (VS Code's capabilities) UTF-16 units."""
    await open_doc(client, 'let s = "😀" + lenn("é")\n')
    [d] = client.diagnostics[URI]
    # "😀" is 2 UTF-16 units: lenn starts at code point 14, unit 15
    assert d.range == T.Range(start=T.Position(line=0, character=15), end=T.Position(line=0, character=19))
    loc = await client.text_document_hover_async(
        T.HoverParams(text_document=T.TextDocumentIdentifier(uri=URI), position=T.Position(line=0, character=5))
    )
    assert loc is not None and loc.range is not None
    assert loc.range.start.character == 4
