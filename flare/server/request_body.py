"""Decoding a JSON request body under limits, before any route looks at it.

Every failure is a 400 (:class:`~flare.errors.AdmissionError` with code
``invalid_json``), never an exception from deep inside a route:

- the body is strict UTF-8 and one JSON value (RFC 8259: no NaN/Infinity);
- nesting is at most ``max_depth`` arrays/objects, checked on the raw bytes
  before parsing (the stdlib parser would recurse into a RecursionError);
- integers have at most :data:`MAX_INT_DIGITS` digits (what any field can use:
  seeds and token IDs fit in 20), so no arbitrary-precision work is done;
- no string, key included, holds an unpaired UTF-16 surrogate (``"\\ud800"``
  escapes decode to text that cannot be encoded again, so the tokenizer, the
  template or the response would fail on it).

The body size itself is bounded by the protocol (413) before it is read.
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from ..errors import AdmissionError

MAX_JSON_DEPTH = 64  # default for ServerConfig.max_json_depth
MAX_INT_DIGITS = 40  # beyond any field's range; larger integers are refused unparsed

_ESCAPE = re.compile(rb"\\.", re.DOTALL)
_STRING = re.compile(rb'"[^"]*"')
_NOT_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")
_BRACKET_STEP = np.zeros(256, np.int8)
_BRACKET_STEP[list(b"[{")] = 1
_BRACKET_STEP[list(b"]}")] = -1


def _invalid(message: str, param: str | None = None) -> AdmissionError:
    return AdmissionError(message, status=400, code="invalid_json", param=param)


def nesting_depth(body: bytes) -> int:
    """The deepest array/object nesting in a JSON text (brackets inside strings ignored).

    Vectorized: escapes and strings are cut out with two regular expressions, the
    brackets left are summed with NumPy; a few milliseconds for a megabyte.
    """
    if b"[" not in body and b"{" not in body:
        return 0
    if b"\\" in body:
        body = _ESCAPE.sub(b"", body)
    if b'"' in body:
        body = _STRING.sub(b"", body)
    brackets = body.translate(None, _NOT_BRACKET)
    if not brackets:
        return 0
    steps = _BRACKET_STEP[np.frombuffer(brackets, np.uint8)]
    return int(np.cumsum(steps, dtype=np.int64).max())


def _parse_int(text: str) -> int:
    if len(text) > MAX_INT_DIGITS + (text[0] == "-"):
        raise _invalid(f"an integer in the request body has {len(text)} digits; at most {MAX_INT_DIGITS} are "
                       f"accepted")
    return int(text)


def _parse_constant(name: str) -> Any:
    raise _invalid(f"'{name}' is not valid JSON (RFC 8259 has no NaN or Infinity)")


def _has_lone_surrogate(value: Any) -> bool:
    """Whether any string or key in a decoded JSON value cannot be encoded as UTF-8."""
    try:
        json.dumps(value, ensure_ascii=False).encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def decode_json(body: bytes, *, max_depth: int = MAX_JSON_DEPTH, what: str = "request body",
                param: str | None = None) -> Any:
    """The JSON value of ``body``, or an AdmissionError (400) saying what is wrong with it.

    ``what`` and ``param`` name the text in messages (a request body, or a JSON
    string inside one such as tool-call arguments).
    """
    if not body or not body.strip():
        raise _invalid(f"{what} is empty; expected a JSON value", param)
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _invalid(f"{what} is not valid UTF-8 (byte {exc.start})", param) from None
    depth = nesting_depth(body)
    if depth > max_depth:
        raise _invalid(f"{what} nests {depth} levels of arrays/objects; at most {max_depth} are accepted", param)
    try:
        value = json.loads(text, parse_int=_parse_int, parse_constant=_parse_constant)
    except json.JSONDecodeError as exc:
        raise _invalid(f"{what} is not valid JSON: {exc}", param) from None
    except (RecursionError, ValueError) as exc:  # defensive: the checks above should have caught these
        raise _invalid(f"{what} cannot be decoded: {exc}", param) from None
    if _SURROGATE_ESCAPE.search(body) and _has_lone_surrogate(value):
        raise _invalid(f"{what} has a string with an unpaired UTF-16 surrogate escape (\\ud800-\\udfff)", param)
    return value


def shorten(value: Any, limit: int = 120) -> str:
    """A client-sent value for an error message: bounded, and always encodable."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > limit:
        text = text[:limit] + f"... ({len(text)} characters)"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")
