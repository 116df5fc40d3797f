"""Structured-output fields of every route family -> :class:`~flare.request.GrammarRequest`.

Only shapes and types are checked here, and sizes bounded; whether a schema,
regex or grammar compiles is decided later, on a frontend worker, where a
failure is a 400 naming the ``param`` recorded here. ``null`` counts as absent
everywhere. The errors raised are family-neutral AdmissionErrors (400): each
family's renderer gives them its shape.

The shapes, by family:

- OpenAI chat and completions: ``response_format`` (``text``, ``json_object``,
  ``json_schema``) and vLLM's ``structured_outputs`` (exactly one of ``json``,
  ``regex``, ``choice``, ``grammar``, ``json_object``): :func:`openai_grammar`;
- Responses: ``text.format`` (json_schema flattened into it): :func:`text_format`;
- Anthropic: ``output_config.format`` or the beta's ``output_format``: :func:`anthropic_format`;
- Ollama: ``format`` (``"json"`` or a schema): :func:`ollama_format`.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from ...request import GrammarRequest
from ..request_body import decode_json, shorten
from .refusals import invalid as _invalid
from .refusals import unsupported as _unsupported

MAX_SCHEMA_BYTES = 64 * 1024  # a schema's compact JSON, UTF-8
MAX_GRAMMAR_BYTES = 64 * 1024  # a regex or grammar text, UTF-8; also all choices together
MAX_CHOICES = 1024
SCHEMA_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's rule for a json_schema name

# vLLM's structured_outputs: the constraint keys (exactly one), and the options we do not serve,
# each with the value that leaves it off (None: only absent).
CONSTRAINT_KEYS = ("json", "regex", "choice", "grammar", "json_object")
_OFF_OPTIONS = {"disable_any_whitespace": False, "disable_additional_properties": False,
                "whitespace_pattern": None, "structural_tag": None}
_IGNORED_OPTIONS = frozenset({"disable_fallback"})  # one backend, nothing to fall back to


def _object(value: Any, param: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise _invalid(f"'{param}' must be an object", param)
    return value


def _check_keys(value: Mapping[str, Any], allowed: tuple[str, ...], param: str) -> None:
    """Keys outside ``allowed`` with a value other than null are a 400 naming the first."""
    unknown = sorted(key for key in value if key not in allowed and value[key] is not None)
    if unknown:
        name = shorten(unknown[0], 64)
        raise _unsupported(f"'{param}.{name}' is not supported (accepted: {', '.join(allowed)})",
                           f"{param}.{name}")


def _shown(value: Any) -> str:
    """A client's value in a message: a string quoted, anything shortened."""
    return repr(shorten(value, 64)) if isinstance(value, str) else shorten(value, 64)


def _text_bytes(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


# -- the pieces every family shares ----------------------------------------------

def json_schema(value: Any, param: str) -> dict[str, Any]:
    """A JSON Schema: an object, or ``true`` (any value, as ``{}``); at most MAX_SCHEMA_BYTES as JSON."""
    if value is True:
        return {}
    if not isinstance(value, dict):
        raise _invalid(f"'{param}' must be a JSON schema object", param)
    size = _text_bytes(json.dumps(value, separators=(",", ":"), ensure_ascii=False))
    if size > MAX_SCHEMA_BYTES:
        raise _invalid(f"'{param}' is too large: {size} bytes of JSON, at most {MAX_SCHEMA_BYTES}", param)
    return value


def schema_name(value: Any, param: str) -> str:
    """A json_schema ``name``: 1 to 64 characters of a-z, A-Z, 0-9, ``_`` and ``-`` (required)."""
    if value is None:
        raise _invalid(f"'{param}' is required", param)
    if not isinstance(value, str) or not SCHEMA_NAME.fullmatch(value):
        raise _invalid(f"'{param}' must be 1 to 64 characters of a-z, A-Z, 0-9, '_' and '-', got "
                       f"{_shown(value)}", param)
    return value


def _schema_options(config: Mapping[str, Any], param: str) -> None:
    """``strict`` (a boolean: output is constrained either way) and ``description`` (a string)."""
    if config.get("strict") is not None and not isinstance(config["strict"], bool):
        raise _invalid(f"'{param}.strict' must be a boolean", f"{param}.strict")
    if config.get("description") is not None and not isinstance(config["description"], str):
        raise _invalid(f"'{param}.description' must be a string", f"{param}.description")


def _format_type(value: Mapping[str, Any], kinds: tuple[str, ...], param: str) -> str:
    kind = value.get("type")
    if kind not in kinds:
        raise _invalid(f"'{param}.type' must be one of {', '.join(kinds)}, got {_shown(kind)}",
                       f"{param}.type")
    return kind


def _grammar_text(value: Any, param: str, *, allow_empty: bool) -> str:
    """A regex or grammar source: a string of at most MAX_GRAMMAR_BYTES (non-empty unless ``allow_empty``)."""
    if not isinstance(value, str) or not (value or allow_empty):
        raise _invalid(f"'{param}' must be a{'' if allow_empty else ' non-empty'} string", param)
    size = _text_bytes(value)
    if size > MAX_GRAMMAR_BYTES:
        raise _invalid(f"'{param}' is too large: {size} bytes, at most {MAX_GRAMMAR_BYTES}", param)
    return value


def _choices(value: Any, param: str) -> tuple[str, ...]:
    """A non-empty list of non-empty strings: at most MAX_CHOICES, MAX_GRAMMAR_BYTES in all."""
    if not isinstance(value, list) or not value or not all(isinstance(c, str) and c for c in value):
        raise _invalid(f"'{param}' must be a non-empty list of non-empty strings", param)
    if len(value) > MAX_CHOICES:
        raise _invalid(f"'{param}' accepts at most {MAX_CHOICES} choices, got {len(value)}", param)
    size = sum(_text_bytes(c) for c in value)
    if size > MAX_GRAMMAR_BYTES:
        raise _invalid(f"'{param}' is too large: {size} bytes in all, at most {MAX_GRAMMAR_BYTES}", param)
    return tuple(value)


# -- OpenAI chat and completions ---------------------------------------------------

def response_format(value: Any, param: str = "response_format") -> GrammarRequest | None:
    """OpenAI's ``response_format``: ``{"type": "text"}`` (None), ``{"type": "json_object"}``, or
    ``{"type": "json_schema", "json_schema": {"name", "schema"?, "strict"?, "description"?}}``
    (a missing schema allows any JSON value)."""
    if value is None:
        return None
    value = _object(value, param)
    kind = _format_type(value, ("text", "json_object", "json_schema"), param)
    _check_keys(value, ("type", "json_schema") if kind == "json_schema" else ("type",), param)
    if kind == "text":
        return None
    if kind == "json_object":
        return GrammarRequest("json_object", None, param)
    where = f"{param}.json_schema"
    if value.get("json_schema") is None:
        raise _invalid(f"'{where}' is required with type 'json_schema'", where)
    config = _object(value["json_schema"], where)
    _check_keys(config, ("name", "schema", "strict", "description"), where)
    schema_name(config.get("name"), f"{where}.name")
    _schema_options(config, where)
    schema = config.get("schema")
    schema = {} if schema is None else json_schema(schema, f"{where}.schema")
    return GrammarRequest("json_schema", schema, f"{where}.schema")


def structured_outputs(value: Any, param: str = "structured_outputs") -> GrammarRequest | None:
    """vLLM's ``structured_outputs``: exactly one of ``json`` (a schema, or a string holding one),
    ``regex`` (a string), ``choice`` (non-empty strings), ``grammar`` (Lark or GBNF text) or
    ``json_object`` (true). ``disable_fallback`` is accepted and moot; vLLM's other options only
    at their defaults."""
    if value is None:
        return None
    value = _object(value, param)
    _check_keys(value, CONSTRAINT_KEYS + tuple(_OFF_OPTIONS) + tuple(_IGNORED_OPTIONS), param)
    for option, off in _OFF_OPTIONS.items():
        if value.get(option) not in (None, off):
            raise _unsupported(f"'{param}.{option}' is not supported", f"{param}.{option}")
    if value.get("disable_fallback") is not None and not isinstance(value["disable_fallback"], bool):
        raise _invalid(f"'{param}.disable_fallback' must be a boolean", f"{param}.disable_fallback")
    given = [key for key in CONSTRAINT_KEYS if value.get(key) is not None]
    if len(given) != 1:
        found = f"got {', '.join(given)}" if given else "got none"
        raise _invalid(f"'{param}' must set exactly one of {', '.join(CONSTRAINT_KEYS)} ({found})", param)
    key = given[0]
    where = f"{param}.{key}"
    item = value[key]
    if key == "json":
        if isinstance(item, str):
            if _text_bytes(item) > MAX_SCHEMA_BYTES:
                raise _invalid(f"'{where}' is too large: {_text_bytes(item)} bytes, at most {MAX_SCHEMA_BYTES}",
                               where)
            item = decode_json(item.encode("utf-8", "surrogatepass"), what=f"'{where}'", param=where)
        return GrammarRequest("json_schema", json_schema(item, where), where)
    if key == "regex":
        return GrammarRequest("regex", _grammar_text(item, where, allow_empty=True), where)
    if key == "grammar":
        return GrammarRequest("grammar", _grammar_text(item, where, allow_empty=False), where)
    if key == "choice":
        return GrammarRequest("choice", _choices(item, where), where)
    if item is not True:
        raise _invalid(f"'{where}' must be true", where)
    return GrammarRequest("json_object", None, where)


def openai_grammar(body: Mapping[str, Any]) -> GrammarRequest | None:
    """The constraint of a chat or completion body: ``response_format`` or ``structured_outputs``
    (a non-text ``response_format`` with ``structured_outputs`` is a 400)."""
    from_format = response_format(body.get("response_format"))
    from_outputs = structured_outputs(body.get("structured_outputs"))
    if from_format is not None and from_outputs is not None:
        raise _invalid("'response_format' and 'structured_outputs' cannot both constrain the output: send one",
                       "structured_outputs")
    return from_format or from_outputs


# -- the other families --------------------------------------------------------------

def text_format(value: Any, param: str = "text.format") -> GrammarRequest | None:
    """Responses' ``text.format``: ``{"type": "text"}`` (None), ``{"type": "json_object"}``, or
    ``{"type": "json_schema", "name", "schema", "strict"?, "description"?}`` (schema required)."""
    if value is None:
        return None
    value = _object(value, param)
    kind = _format_type(value, ("text", "json_object", "json_schema"), param)
    if kind != "json_schema":
        _check_keys(value, ("type",), param)
        return None if kind == "text" else GrammarRequest("json_object", None, param)
    _check_keys(value, ("type", "name", "schema", "strict", "description"), param)
    schema_name(value.get("name"), f"{param}.name")
    _schema_options(value, param)
    if value.get("schema") is None:
        raise _invalid(f"'{param}.schema' is required with type 'json_schema'", f"{param}.schema")
    return GrammarRequest("json_schema", json_schema(value["schema"], f"{param}.schema"), f"{param}.schema")


def anthropic_format(value: Any, param: str = "output_config.format") -> GrammarRequest | None:
    """Anthropic's ``output_config.format`` (or the beta's top-level ``output_format``):
    ``{"type": "json_schema", "schema": {...}}``, both required."""
    if value is None:
        return None
    value = _object(value, param)
    _format_type(value, ("json_schema",), param)
    _check_keys(value, ("type", "schema"), param)
    if value.get("schema") is None:
        raise _invalid(f"'{param}.schema' is required", f"{param}.schema")
    return GrammarRequest("json_schema", json_schema(value["schema"], f"{param}.schema"), f"{param}.schema")


def ollama_format(value: Any, param: str = "format") -> GrammarRequest | None:
    """Ollama's ``format``: ``"json"`` (json_object), a JSON schema object, or ``""`` (none)."""
    if value is None or value == "":
        return None
    if value == "json":
        return GrammarRequest("json_object", None, param)
    if not isinstance(value, dict):
        raise _invalid(f"'{param}' must be \"json\" or a JSON schema object, got {_shown(value)}", param)
    return GrammarRequest("json_schema", json_schema(value, param), param)
