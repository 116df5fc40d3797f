"""Lexer: chat-template source to a flat token list.

Whitespace control is applied here, exactly as Transformers configures jinja2 for
``apply_chat_template``: ``trim_blocks`` (drop the first newline after a block or
comment tag), ``lstrip_blocks`` (drop spaces and tabs before a block or comment tag
that starts its line), the ``-`` modifier (strip all whitespace on that side) and the
``+`` modifier (disable lstrip/trim on that side). Newlines are normalised to ``\\n``
and one trailing newline of the source is dropped (jinja2's default
``keep_trailing_newline=False``).
"""

from __future__ import annotations

import bisect
import re
from typing import NamedTuple

from flare.errors import FrontendError

# Token kinds.
DATA = "data"              # literal template text, already whitespace-controlled
VAR_BEGIN = "var_begin"    # {{
VAR_END = "var_end"        # }}
BLOCK_BEGIN = "block_begin"  # {%
BLOCK_END = "block_end"    # %}
NAME = "name"
STRING = "string"
INT = "int"
FLOAT = "float"
OP = "op"
EOF = "eof"

_NEWLINE = re.compile(r"\r\n|\r|\n")
_TAG_START = re.compile(r"\{[%{#]")
_RAW_BEGIN = re.compile(r"\{%(-|\+|)\s*raw\s*(?:-%\}\s*|%\})")
_RAW_END = re.compile(r"(.*?)\{%(-|\+|)\s*endraw\s*(?:\+%\}|-%\}\s*|%\}\n?)", re.S)
_COMMENT_END = re.compile(r"(.*?)(?:\+#\}|-#\}\s*|#\}\n?)", re.S)
_BLOCK_END = re.compile(r"\+%\}|-%\}\s*|%\}\n?")
_VAR_END = re.compile(r"-\}\}\s*|\}\}")
_WHITESPACE = re.compile(r"\s+")
_FLOAT = re.compile(
    r"(?<!\.)(\d+_)*\d+((\.(\d+_)*\d+)?e[+\-]?(\d+_)*\d+|\.(\d+_)*\d+)", re.I)
_INT = re.compile(r"0[bB](_?[01])+|0[oO](_?[0-7])+|0[xX](_?[\da-fA-F])+|[1-9](_?\d)*|0(_?0)*")
_NAME = re.compile(r"[^\W\d]\w*")
_STRING = re.compile(r"'([^'\\]*(?:\\.[^'\\]*)*)'|\"([^\"\\]*(?:\\.[^\"\\]*)*)\"", re.S)
_OPERATORS = ("//", "**", "==", "!=", "<=", ">=", "+", "-", "/", "*", "%", "~", "[", "]",
              "(", ")", "{", "}", "<", ">", "=", ".", ":", "|", ",", ";")
_CLOSING = {"(": ")", "[": "]", "{": "}"}
# One alternation per token, in jinja2's rule order (float before integer before name).
_TOKEN = re.compile("|".join([
    f"(?P<float>{_FLOAT.pattern})",
    f"(?P<int>{_INT.pattern})",
    f"(?P<name>{_NAME.pattern})",
    f"(?P<string>{_STRING.pattern})",
    "(?P<op>" + "|".join(re.escape(op) for op in _OPERATORS) + ")",
]), re.S | re.I)


class Token(NamedTuple):
    kind: str
    value: object
    pos: int  # offset into the normalised source, for line/column in errors


class Source:
    """Normalised template text plus a position-to-line/column map."""

    def __init__(self, text: str):
        lines = _NEWLINE.split(text)
        if lines[-1] == "":
            del lines[-1]
        self.text = "\n".join(lines)
        self._line_starts = [0]
        for m in re.finditer("\n", self.text):
            self._line_starts.append(m.end())

    def where(self, pos: int) -> str:
        line = bisect.bisect_right(self._line_starts, pos)
        return f"line {line}, column {pos - self._line_starts[line - 1] + 1}"

    def error(self, message: str, pos: int) -> FrontendError:
        return FrontendError(f"template error: {message} at {self.where(pos)}")


def _lstrip_text(text: str, sign: str, is_var: bool, line_starting: bool) -> str:
    if sign == "-":
        return text.rstrip()
    if sign != "+" and not is_var:
        l_pos = text.rfind("\n") + 1
        if (l_pos > 0 or line_starting) and _WHITESPACE.fullmatch(text, l_pos):
            return text[:l_pos]
    return text


def tokenize(source: Source) -> list[Token]:
    """Split ``source`` into tokens; comments vanish, raw blocks become DATA."""
    src = source.text
    n = len(src)
    out: list[Token] = []
    pos = 0
    line_starting = True
    while pos < n:
        m = _TAG_START.search(src, pos)
        if m is None:
            out.append(Token(DATA, src[pos:], pos))
            break
        start = m.start()
        kind = src[start + 1]
        sign = src[start + 2] if start + 2 < n and src[start + 2] in "-+" else ""
        raw = _RAW_BEGIN.match(src, start) if kind == "%" else None
        text = _lstrip_text(src[pos:start], sign, kind == "{", line_starting)
        if text:
            out.append(Token(DATA, text, pos))
        if raw is not None:
            end = _RAW_END.match(src, raw.end())
            if end is None:
                raise source.error("missing end of raw directive", start)
            body = _lstrip_text(end.group(1), end.group(2), False, raw.group().endswith("\n"))
            if body:
                out.append(Token(DATA, body, raw.end()))
            pos = end.end()
            line_starting = src[pos - 1:pos] == "\n"
            continue
        if kind == "#":
            end = _COMMENT_END.match(src, start + 2)
            if end is None:
                raise source.error("missing end of comment tag", start)
            pos = end.end()
            line_starting = src[pos - 1:pos] == "\n"
            continue
        pos = start + 2 + len(sign)
        is_block = kind == "%"
        out.append(Token(BLOCK_BEGIN if is_block else VAR_BEGIN, None, start))
        pos = _lex_tag(source, pos, is_block, out)
        line_starting = src[pos - 1:pos] == "\n"
    out.append(Token(EOF, None, n))
    return out


def _lex_tag(source: Source, pos: int, is_block: bool, out: list[Token]) -> int:
    src = source.text
    n = len(src)
    end_re = _BLOCK_END if is_block else _VAR_END
    balance: list[str] = []
    begin = pos
    while True:
        ws = _WHITESPACE.match(src, pos)
        if ws is not None:
            pos = ws.end()
        if pos >= n:
            raise source.error(
                f"unexpected end of template, expected '{'%}' if is_block else '}}'}'", begin)
        if not balance:
            m = end_re.match(src, pos)
            if m is not None:
                out.append(Token(BLOCK_END if is_block else VAR_END, None, pos))
                return m.end()
        m = _TOKEN.match(src, pos)
        if m is None:
            raise source.error(f"unexpected character {src[pos]!r}", pos)
        kind = m.lastgroup
        text = m.group()
        if kind == "name":
            out.append(Token(NAME, text, pos))
            pos = m.end()
            continue
        if kind == "float":
            out.append(Token(FLOAT, float(text.replace("_", "")), pos))
            pos = m.end()
            continue
        if kind == "int":
            out.append(Token(INT, int(text.replace("_", ""), 0), pos))
            pos = m.end()
            continue
        if kind == "string":
            try:
                value = text[1:-1].encode("ascii", "backslashreplace").decode("unicode-escape")
            except UnicodeDecodeError as exc:
                raise source.error(f"invalid string escape ({exc.reason})", pos) from None
            out.append(Token(STRING, value, pos))
            pos = m.end()
            continue
        op = text
        if op in _CLOSING:
            balance.append(_CLOSING[op])
        elif op in (")", "]", "}"):
            if not balance:
                raise source.error(f"unexpected '{op}'", pos)
            expected = balance.pop()
            if expected != op:
                raise source.error(f"unexpected '{op}', expected '{expected}'", pos)
        out.append(Token(OP, op, pos))
        pos += len(op)
