"""Source text to tokens, each with its 1-based line and column.

Newlines are not tokens: every token records whether a line break precedes it
(``nl_before``) and the parser decides where a statement ends (docs/language.md).
"""

from __future__ import annotations

from conch.lang.errors import ConchError

# typing costs milliseconds at start-up; annotations are strings (see __future__ above)
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

KEYWORDS = frozenset(
    {
        "let", "mut", "fn", "if", "else", "match", "for", "in", "while", "break",
        "continue", "return", "try", "catch", "throw", "true", "false", "null",
        "and", "or", "not",
    }
)  # fmt: skip

# Longest first so that ``..=`` wins over ``..`` and ``**`` over ``*``.
OPERATORS = (
    "..=", "//=", "**", "//", "..", "?.", "=>", "==", "!=", "<=", ">=", "=~", "&&", "||",
    "+=", "-=", "*=", "/=", "%=",
    "|", "+", "-", "*", "/", "%", "<", ">", "=", "!", ".", ",", ":", ";",
    "(", ")", "[", "]", "{", "}",
)  # fmt: skip

SIZE_SUFFIXES = {
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "pb": 1000**5,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "pib": 1024**5,
}
DURATION_SUFFIXES = {
    "ns": None,  # rejected: conch durations are whole milliseconds
    "ms": 1,
    "s": 1000,
    "sec": 1000,
    "min": 60_000,
    "h": 3_600_000,
    "hr": 3_600_000,
    "d": 86_400_000,
    "day": 86_400_000,
    "wk": 7 * 86_400_000,
}


class Token:
    __slots__ = ("col", "end_col", "end_line", "kind", "line", "nl_before", "parts", "space_before", "value")

    def __init__(self, kind: str, value: Any, line: int, col: int, end_line: int, end_col: int,
                 nl_before: bool = False, space_before: bool = False, parts: list[Any] | None = None) -> None:
        self.kind = kind  # "num", "str", "ident", "kw", "op", "eof"
        self.value = value
        self.line, self.col, self.end_line, self.end_col = line, col, end_line, end_col
        self.nl_before = nl_before
        self.space_before = space_before
        # For "str" tokens: a list of parts, each a str or a list of tokens (an interpolation).
        self.parts: list[Any] = [] if parts is None else parts

    def __repr__(self) -> str:
        return f"Token({self.kind!r}, {self.value!r}, {self.line}, {self.col})"

    def is_op(self, *ops: str) -> bool:
        return self.kind == "op" and self.value in ops

    def is_kw(self, *kws: str) -> bool:
        return self.kind == "kw" and self.value in kws

    def describe(self) -> str:
        if self.kind == "eof":
            return "end of input"
        if self.kind == "str":
            return "string"
        if self.kind == "num":
            return f"number {self.text!r}" if isinstance(self.value, int | float) else "number"
        return f"'{self.value}'"

    @property
    def text(self) -> str:
        return str(self.value)


def _error(message: str, line: int, col: int, hint: str | None = None) -> ConchError:
    return ConchError("SyntaxError", message, line=line, column=col, hint=hint)


class Lexer:
    def __init__(self, source: str, line: int = 1, col: int = 1) -> None:
        self.src = source
        self.pos = 0
        self.line = line
        self.col = col

    def _advance(self, n: int = 1) -> None:
        for _ in range(n):
            if self.src[self.pos] == "\n":
                self.line += 1
                self.col = 1
            else:
                self.col += 1
            self.pos += 1

    def tokenize(self, until_brace: bool = False) -> list[Token]:
        """All tokens; with ``until_brace``, stop at the ``}`` closing an interpolation."""
        src = self.src
        tokens: list[Token] = []
        nl = True
        space = True
        depth = 0
        n = len(src)
        while True:
            # whitespace and comments
            while self.pos < n:
                c = src[self.pos]
                if c == "\n":
                    nl = True
                    space = True
                    self._advance()
                elif c in " \t\r":
                    space = True
                    self._advance()
                elif c == "#":
                    while self.pos < n and src[self.pos] != "\n":
                        self._advance()
                elif c == "\\" and src.startswith("\n", self.pos + 1):
                    # An explicit line continuation.
                    space = True
                    self._advance(2)
                else:
                    break
            if self.pos >= n:
                if until_brace:
                    raise _error("unterminated interpolation '${'", self.line, self.col,
                                 hint="close it with '}'")
                tokens.append(Token("eof", None, self.line, self.col, self.line, self.col, nl, space))
                return tokens
            line, col = self.line, self.col
            c = src[self.pos]
            if until_brace and c == "}" and depth == 0:
                self._advance()
                tokens.append(Token("eof", None, line, col, line, col, nl, space))
                return tokens
            if c.isdigit():
                tok = self._number()
            elif c.isalpha() or c == "_":
                start = self.pos
                while self.pos < n and (src[self.pos].isalnum() or src[self.pos] == "_"):
                    self._advance()
                word = src[start : self.pos]
                tok = Token("kw" if word in KEYWORDS else "ident", word, line, col, 0, 0)
            elif c == '"':
                tok = self._string()
            elif c == "'":
                tok = self._raw_string()
            else:
                for op in OPERATORS:
                    if src.startswith(op, self.pos):
                        break
                else:
                    raise _error(f"unexpected character {c!r}", line, col)
                self._advance(len(op))
                if op in ("(", "[", "{"):
                    depth += 1
                elif op in (")", "]", "}"):
                    depth -= 1
                tok = Token("op", op, line, col, 0, 0)
            tok.end_line, tok.end_col = self.line, self.col
            tok.nl_before = nl
            tok.space_before = space
            nl = False
            space = False
            tokens.append(tok)

    def _number(self) -> Token:
        src = self.src
        n = len(src)
        line, col = self.line, self.col
        start = self.pos
        value: int | float
        if src.startswith(("0x", "0X", "0b", "0B", "0o", "0O"), self.pos):
            base = {"x": 16, "b": 2, "o": 8}[src[self.pos + 1].lower()]
            self._advance(2)
            dstart = self.pos
            while self.pos < n and (src[self.pos].isalnum() or src[self.pos] == "_"):
                self._advance()
            digits = src[dstart : self.pos]
            try:
                value = int(digits, base)
            except ValueError:
                raise _error(f"invalid number {src[start:self.pos]!r}", line, col)
            return Token("num", value, line, col, 0, 0)
        while self.pos < n and (src[self.pos].isdigit() or src[self.pos] == "_"):
            self._advance()
        is_float = False
        if self.pos + 1 < n and src[self.pos] == "." and src[self.pos + 1].isdigit():
            is_float = True
            self._advance()
            while self.pos < n and (src[self.pos].isdigit() or src[self.pos] == "_"):
                self._advance()
        if self.pos < n and src[self.pos] in "eE":
            j = self.pos + 1
            if j < n and src[j] in "+-":
                j += 1
            if j < n and src[j].isdigit():
                is_float = True
                self._advance(j - self.pos)
                while self.pos < n and src[self.pos].isdigit():
                    self._advance()
        text = src[start : self.pos]
        if text.endswith("_") or "__" in text:
            raise _error(f"invalid number {text!r}", line, col, hint="'_' goes between digits")
        value = float(text.replace("_", "")) if is_float else int(text.replace("_", ""))
        sstart = self.pos
        while self.pos < n and src[self.pos].isalpha():
            self._advance()
        suffix = src[sstart : self.pos]
        if suffix:
            key = suffix.lower()
            mult = SIZE_SUFFIXES.get(key) or DURATION_SUFFIXES.get(key)
            if mult is None or (self.pos < n and (src[self.pos].isdigit() or src[self.pos] == "_")):
                raise _error(
                    f"unknown number suffix {suffix!r}",
                    line,
                    col + (sstart - start),
                    hint="sizes: b kb mb gb tb kib mib gib tib; durations: ms s min h d",
                )
            value = round(value * mult) if is_float else value * mult
        return Token("num", value, line, col, 0, 0)

    _ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\", "0": "\0", "$": "$",
                "'": "'", "e": "\x1b", "b": "\b", "f": "\f"}  # fmt: skip

    def _string(self) -> Token:
        src = self.src
        n = len(src)
        line, col = self.line, self.col
        triple = src.startswith('"""', self.pos)
        self._advance(3 if triple else 1)
        if triple and src.startswith("\n", self.pos):
            self._advance()
        parts: list[Any] = []
        buf: list[str] = []
        while True:
            if self.pos >= n:
                raise _error("unterminated string", line, col, hint='close it with "' + ('""' if triple else "") + '"')
            c = src[self.pos]
            if triple:
                if src.startswith('"""', self.pos):
                    self._advance(3)
                    break
            elif c == '"':
                self._advance()
                break
            elif c == "\n":
                raise _error("unterminated string", line, col,
                             hint='strings end on the same line; use """...""" for several lines')
            if c == "\\":
                if self.pos + 1 >= n:
                    raise _error("unterminated string", line, col)
                e = src[self.pos + 1]
                if e == "u" and src.startswith("{", self.pos + 2):
                    end = src.find("}", self.pos + 3)
                    hexdigits = src[self.pos + 3 : end] if end != -1 else ""
                    try:
                        buf.append(chr(int(hexdigits, 16)))
                    except (ValueError, OverflowError):
                        raise _error("invalid unicode escape", self.line, self.col,
                                     hint=r"write \u{1F600}: 1 to 6 hex digits")
                    self._advance(end + 1 - self.pos)
                    continue
                if e == "\n":
                    self._advance(2)
                    continue
                if e not in self._ESCAPES:
                    raise _error(f"unknown escape '\\{e}'", self.line, self.col,
                                 hint=r'escapes are \n \t \r \" \\ \$ \u{...}; raw strings use single quotes')
                buf.append(self._ESCAPES[e])
                self._advance(2)
                continue
            if c == "$" and src.startswith("{", self.pos + 1):
                if buf:
                    parts.append("".join(buf))
                    buf = []
                self._advance(2)
                sub = Lexer(src, self.line, self.col)
                sub.pos = self.pos
                tokens = sub.tokenize(until_brace=True)
                self.pos, self.line, self.col = sub.pos, sub.line, sub.col
                if len(tokens) == 1:
                    raise _error("empty interpolation '${}'", tokens[0].line, tokens[0].col)
                parts.append(tokens)
                continue
            buf.append(c)
            self._advance()
        if buf or not parts:
            parts.append("".join(buf))
        value = parts[0] if len(parts) == 1 and isinstance(parts[0], str) else None
        return Token("str", value, line, col, 0, 0, parts=parts)

    def _raw_string(self) -> Token:
        src = self.src
        line, col = self.line, self.col
        end = src.find("'", self.pos + 1)
        nl = src.find("\n", self.pos + 1)
        if end == -1 or (nl != -1 and nl < end):
            raise _error("unterminated raw string", line, col, hint="close it with '")
        text = src[self.pos + 1 : end]
        self._advance(end + 1 - self.pos)
        return Token("str", text, line, col, 0, 0, parts=[text])


def tokenize(source: str) -> list[Token]:
    return Lexer(source).tokenize()
