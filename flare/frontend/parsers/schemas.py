"""The request's declared tools, read for what the parsers and grammars need of them.

Tools arrive as OpenAI function objects (``{"type": "function", "function": {"name",
"description", "parameters"}}``); a bare ``{"name", "parameters"}`` is read the same way.
"""

from __future__ import annotations

ANY_OBJECT = {"type": "object"}


def functions(tools: list[dict], name: str | None = None) -> list[tuple[str, dict]]:
    """(name, parameters schema) of each function among ``tools`` (only ``name`` when given);
    ValueError when there is none."""
    found = []
    for tool in tools:
        function = tool.get("function", tool) if tool.get("type", "function") == "function" else None
        if isinstance(function, dict) and function.get("name"):
            found.append((function["name"], function.get("parameters") or ANY_OBJECT))
    if name is not None:
        found = [entry for entry in found if entry[0] == name]
    if not found:
        raise ValueError(f"no function tool named {name!r}" if name is not None else "no function tools")
    return found


def property_schemas(tools: list[dict]) -> dict[str, dict[str, dict]]:
    """function name -> parameter name -> that parameter's schema (a local ``$ref`` resolved);
    the first declaration of a name wins."""
    out: dict[str, dict[str, dict]] = {}
    for name, params in functions(tools) if tools else ():
        if name not in out:
            out[name] = {key: resolved(prop, params) for key, prop in properties(params)}
    return out


def properties(params: dict) -> list[tuple[str, dict]]:
    """The (name, schema) of each property a parameters schema declares, in order."""
    declared = params.get("properties")
    if not isinstance(declared, dict):
        return []
    return [(key, prop) for key, prop in declared.items() if isinstance(prop, dict)]


def resolved(prop: dict, params: dict) -> dict:
    """``prop``, or the definition its local ``$ref`` names in ``params``."""
    ref = prop.get("$ref")
    if isinstance(ref, str):
        defs = {**params.get("definitions", {}), **params.get("$defs", {})}
        target = defs.get(ref.rsplit("/", 1)[-1])
        if isinstance(target, dict):
            return target
    return prop


def declared_type(schema: dict | None) -> str | None:
    """The one JSON type ``schema`` declares ("string" for an enum or const of strings), or None."""
    if not schema:
        return None
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        kind = kinds[0] if len(kinds) == 1 else None
    if isinstance(kind, str):
        return kind
    choices = schema.get("enum", [schema["const"]] if "const" in schema else None)
    if choices and all(isinstance(choice, str) for choice in choices):
        return "string"
    return None
