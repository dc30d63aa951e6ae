"""A pygments lexer for conch, used by the REPL and the documentation."""

from __future__ import annotations

from pygments.lexer import RegexLexer, bygroups, include, words
from pygments.token import (
    Comment,
    Keyword,
    Name,
    Number,
    Operator,
    Punctuation,
    String,
    Text,
    Whitespace,
)

KEYWORDS = (
    "let",
    "mut",
    "fn",
    "if",
    "else",
    "match",
    "for",
    "in",
    "while",
    "break",
    "continue",
    "return",
    "try",
    "catch",
    "throw",
    "and",
    "or",
    "not",
)
CONSTANTS = ("true", "false", "null")

_SUFFIX = r"(?:kib|kb|mib|mb|gib|gb|tib|tb|pib|pb|b|ms|min|sec|s|hr|h|day|d|wk)?"


class ConchLexer(RegexLexer):
    name = "conch"
    aliases = ["conch"]
    filenames = ["*.conch"]
    mimetypes = ["text/x-conch"]

    tokens = {
        "root": [
            (r"\s+", Whitespace),
            (r"#.*?$", Comment.Single),
            (r'"""', String.Double, "triple"),
            (r'"', String.Double, "string"),
            (r"'[^']*'", String.Single),
            (words(KEYWORDS, suffix=r"\b"), Keyword),
            (words(CONSTANTS, suffix=r"\b"), Keyword.Constant),
            (r"0x[0-9a-fA-F_]+\b", Number.Hex),
            (r"0b[01_]+\b", Number.Bin),
            (r"0o[0-7_]+\b", Number.Oct),
            (r"\d[\d_]*\.\d[\d_]*(?:[eE][+-]?\d+)?" + _SUFFIX, Number.Float),
            (r"\d[\d_]*[eE][+-]?\d+", Number.Float),
            (r"\d[\d_]*" + _SUFFIX + r"\b", Number.Integer),
            (r"(\??\.)([A-Za-z_]\w*)", bygroups(Operator, Name.Attribute)),
            (r"([A-Za-z_]\w*)(?=\s*\()", Name.Function),
            (r"[A-Za-z_]\w*", Name),
            (r"=>|\.\.=|\.\.|\*\*|//|==|!=|<=|>=|=~|&&|\|\||[-+*/%<>=!|]", Operator),
            (r"[()\[\]{},;:?]", Punctuation),
            (r".", Text),
        ],
        "escapes": [
            (r"\\u\{[0-9a-fA-F]+\}", String.Escape),
            (r'\\[ntr"\\$0ebf\']', String.Escape),
            (r"\$\{", String.Interpol, "interp"),
        ],
        "string": [
            include("escapes"),
            (r'"', String.Double, "#pop"),
            (r'[^"\\$]+', String.Double),
            (r"[\\$]", String.Double),
        ],
        "triple": [
            include("escapes"),
            (r'"""', String.Double, "#pop"),
            (r'[^"\\$]+', String.Double),
            (r'["\\$]', String.Double),
        ],
        "interp": [
            (r"\}", String.Interpol, "#pop"),
            include("root"),
        ],
    }
