"""Building blocks of the forced-tool-call grammars (llguidance's Lark dialect).

Each tool parser's ``tool_grammar`` writes its family's call syntax with a :class:`Lark`
builder: literals for the markers (or, for a marker the tokenizer has as a special token,
a ``<[id]>`` token reference, since a special token never matches its text), and inline
``%json { ... }`` rules for JSON Schema. JSON is written the way ``json.dumps`` (and
HF's ``tojson``) writes it, ``", "`` and ``": "`` and no other whitespace, so a forced call
renders back into the chat template exactly as the model produced it.

Nothing here imports llguidance: the text is compiled by frontend/grammar.
"""

from __future__ import annotations

import json
from typing import Callable, Mapping

from .schemas import declared_type, properties, resolved

JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def embedded(schemas: list[dict], prefix: str) -> tuple[list[dict], dict]:
    """``schemas`` made fit to sit inside a larger schema: each one's ``$defs`` (and
    ``definitions``) move to the root under ``prefix<i>.`` names and its references follow,
    so ``#/$defs/X`` still resolves. Returns the schemas and the root's ``$defs``."""
    out, defs = [], {}
    for i, schema in enumerate(schemas):
        local = {**schema.get("definitions", {}), **schema.get("$defs", {})}
        if not local and '"$ref"' not in json.dumps(schema):
            out.append(schema)
            continue
        own = f"{prefix}{i}"
        body = {key: value for key, value in schema.items() if key not in ("$defs", "definitions")}
        defs[own] = _moved(body, own)
        defs.update({f"{own}.{key}": _moved(value, own) for key, value in local.items()})
        out.append({"$ref": f"#/$defs/{own}"})
    return out, defs


def _moved(node, own: str):
    if isinstance(node, dict):
        return {key: _moved_ref(value, own) if key == "$ref" else _moved(value, own) for key, value in node.items()}
    if isinstance(node, list):
        return [_moved(item, own) for item in node]
    return node


def _moved_ref(ref, own: str):
    if not isinstance(ref, str):
        return ref
    if ref == "#":
        return f"#/$defs/{own}"
    for base in ("#/$defs/", "#/definitions/"):
        if ref.startswith(base):
            return f"#/$defs/{own}.{ref[len(base):]}"
    return ref


class Lark:
    """A grammar under construction: named rules, the first of which is ``start``."""

    def __init__(self, special_tokens: Mapping[str, int] | None = None):
        self._special = dict(special_tokens or {})
        self._rules: list[str] = []
        self._names = 0

    def lit(self, text: str) -> str:
        """``text`` as a grammar element: a literal, or a special token's reference."""
        if text in self._special:
            return f"<[{int(self._special[text])}]>"
        return json.dumps(text, ensure_ascii=False)

    def rule(self, body: str, *, name: str = "rule", options: str = "") -> str:
        """Add a rule matching ``body`` (``options``: its lexeme options); return its name."""
        self._names += 1
        name = f"{name}_{self._names}"
        self._rules.append(f"{name}{options}: {body}")
        return name

    def json(self, schema: dict) -> str:
        """A rule matching one JSON value valid against ``schema`` (json.dumps spacing)."""
        style = {**JSON_STYLE, **schema.get("x-guidance", {})}
        return self.rule("%json " + json.dumps({**schema, "x-guidance": style}, ensure_ascii=False), name="json")

    def text_value(self, schema: dict | None, params: dict, end: str) -> str:
        """A parameter value written as bare text (Qwen3-Coder, GLM), then ``end``: a string
        as it is (an enum as one of its choices; minLength and maxLength kept, a pattern or
        format not), another declared type as its JSON, an undeclared one as any text."""
        kind = declared_type(schema)
        schema = schema or {}
        choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
        if kind == "string" and choices and all(isinstance(choice, str) for choice in choices):
            return f"({' | '.join(self.lit(choice) for choice in choices)}) {self.lit(end)}"
        if kind not in ("string", None):
            defs = {key: params[key] for key in ("$defs", "definitions") if key in params}
            return f"{self.json({**schema, **defs})} {self.lit(end)}"
        low, high = (schema.get("minLength", 0), schema.get("maxLength", "")) if kind else (0, "")
        # Lazy up to ``end`` (its suffix option): the value can never run past the first ``end``.
        return self.rule(f"/(?s:.{{{int(low)},{high}}})/", name="text", options=f"[suffix={self.lit(end)}]")

    def text_parameters(self, params: dict, key: Callable[[str], str], end: str) -> str:
        """One call's parameters as text values: for each declared property in order (an
        optional one may be left out), ``key(name element)``, its value and ``end``; with
        no properties declared, any names and values."""
        required = set(params.get("required", ()))
        items = []
        for name, prop in properties(params):
            item = self.rule(f"{key(self.lit(name))} {self.text_value(resolved(prop, params), params, end)}",
                             name="param")
            items.append(item if name in required else f"{item}?")
        if not items:
            return f"{self.rule(key('/[A-Za-z0-9_.-]+/') + ' ' + self.text_value(None, params, end))}*"
        return " ".join(items)

    def repeated(self, item: str, separator: str, parallel: bool) -> str:
        """``item``, or with ``parallel`` one or more of them between ``separator`` literals."""
        return f"{item} ({self.lit(separator)} {item})*" if parallel else item

    def text(self, start: str) -> str:
        """The grammar: ``start: <start>`` and then every rule added."""
        return "\n".join([f"start: {start}", *self._rules]) + "\n"


def call_objects(declared: list[tuple[str, dict]], arguments_key: str = "arguments",
                 optional: dict | None = None) -> dict:
    """The schema of one ``{"name": ..., "<arguments_key>": {...}}`` call of any function in
    ``declared`` ((name, parameters schema) pairs); ``optional`` adds properties it may have."""
    params, defs = embedded([schema for _, schema in declared], "tool")
    variants = [{"type": "object",
                 "properties": {"name": {"const": name}, arguments_key: schema, **(optional or {})},
                 "required": ["name", arguments_key], "additionalProperties": False}
                for (name, _), schema in zip(declared, params)]
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    return {**schema, "$defs": defs} if defs else schema


def call_array(declared: list[tuple[str, dict]], parallel: bool, optional: dict | None = None) -> dict:
    """The schema of a JSON array of calls (:func:`call_objects`): one, or with ``parallel`` one or more."""
    item = call_objects(declared, optional=optional)
    defs = item.pop("$defs", None)
    schema = {"type": "array", "items": item, "minItems": 1, **({} if parallel else {"maxItems": 1})}
    return {**schema, "$defs": defs} if defs else schema
