"""Parameter values written as text (Qwen3-Coder's ``<parameter=...>``, GLM's ``<arg_value>``).

These families write each argument's value as bare text, so the parser turns it back into
JSON: by the parameter's declared type when the request's tool schema gives one, else by
what the text is (a JSON number, boolean, object, array or null becomes that value, any
other text, a quoted one included, is a string). A value that does not fit its declared
type stays a string: the client validates.
"""

from __future__ import annotations

import ast
import json

from .schemas import declared_type

_NOT_JSON = object()


def to_json(text: str, schema: dict | None) -> str:
    """The JSON text of a parameter value the model wrote as ``text``."""
    return json.dumps(_value(text, declared_type(schema)), ensure_ascii=False)


def _value(text: str, kind: str | None):
    if kind == "string":
        return text
    stripped = text.strip()
    if kind in ("integer", "number"):
        value = _json(stripped)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if kind == "number" or float(value).is_integer():
                return int(value) if kind == "integer" else value
        return text
    if kind == "boolean":
        return stripped.lower() == "true" if stripped.lower() in ("true", "false") else text
    if kind == "null":
        return None if stripped.lower() in ("null", "none") else text
    if kind in ("object", "array"):
        value = _json(stripped)
        if value is _NOT_JSON:  # the templates render a dict with str(): Python's repr
            value = _python_literal(stripped)
        return value if isinstance(value, dict if kind == "object" else list) else text
    value = _json(stripped)
    return text if value is _NOT_JSON or isinstance(value, str) else value


def _json(text: str):
    try:
        return json.loads(text, parse_constant=_refuse)
    except ValueError:
        return _NOT_JSON


def _refuse(constant: str):
    raise ValueError(f"{constant} is not JSON")


def _python_literal(text: str):
    try:
        value = ast.literal_eval(text)
        json.dumps(value, allow_nan=False)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return _NOT_JSON
    return value
