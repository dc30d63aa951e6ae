"""``POST /api/v1/analyse``: the language server's front end over HTTP, for the studio's
editor. It parses and checks a program (syntax, unknown names with their did-you-mean hint,
argument counts against builtin signatures) and answers completions, hover and signature at
a cursor, exactly as ``conch lsp`` does (:mod:`conch.lsp.analysis`), and never runs the code:
nothing here reaches the sandbox. The analysis runs on a thread, so a long program does not
hold up the server's other requests.
"""

from __future__ import annotations

import asyncio
from typing import Any

from fastapi import APIRouter, Request
from starlette.responses import Response

from conch.lsp import analysis as front_end
from conch.lsp import queries
from conch.web.agent.protocol import ERRORS, AnalyseRequest, Analysis, parse_body, request_body
from conch.web.common.responses import json_response

router = APIRouter(tags=["execution"])


@router.post("/api/v1/analyse", response_model=Analysis, responses=ERRORS,
             openapi_extra=request_body(AnalyseRequest))
async def analyse(request: Request) -> Response:
    """Diagnostics for a program, and completions, hover and signature at `line`/`column`."""
    body = await parse_body(request, AnalyseRequest)
    return json_response(await asyncio.to_thread(_analyse, body))


def _analyse(body: AnalyseRequest) -> dict[str, Any]:
    an = front_end.analyse(body.code)
    out: dict[str, Any] = {
        "diagnostics": [
            {"kind": d.kind, "message": d.message, "hint": d.hint, "severity": d.severity,
             "line": d.range[0] + 1, "column": d.range[1] + 1,
             "end_line": d.range[2] + 1, "end_column": d.range[3] + 1}
            for d in an.diagnostics
        ],
        "completions": [],
        "hover": None,
        "signature": None,
    }
    if body.line is None or body.column is None:
        return out
    line, character = body.line - 1, body.column - 1
    out["completions"] = [
        {"label": c.label, "kind": c.kind, "detail": c.detail,
         "documentation": c.documentation, "insert_text": c.insert_text}
        for c in queries.completions(an, line, character)
    ]
    hover = queries.hover(an, line, character)
    out["hover"] = hover.markdown if hover is not None else None
    sig = queries.signature_help(an, line, character)
    if sig is not None:
        out["signature"] = {"label": sig.label, "documentation": sig.documentation,
                            "parameters": sig.parameters, "active_parameter": sig.active_parameter}
    return out
