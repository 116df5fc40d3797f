"""Which input forms a chat template consumes, decided once at load by probe renders.

Clients send message content as a string or as a list of text parts, and
tool-call arguments as a JSON string (the OpenAI form) or as an object.
Transformers hands the template whatever the client sent, so a template that
only understands one form prints the other as a Python repr (``[{'type':
'text', ...}]``, ``{'city': 'Paris'}``) or raises. We pass the client's form
through wherever the template accepts it (so re-rendered history keeps the
exact bytes the model produced, and the prefix cache hits) and convert only
where the template cannot take it:

- content: ``"either"`` passes as sent; ``"string"`` joins text parts with
  ``"\\n"``; ``"parts"`` wraps a string as one text part.
- arguments: ``"either"`` passes as sent; ``"mapping"`` parses JSON strings
  (``""`` is ``{}``) keeping key order; ``"string"`` serializes objects the
  way the ``tojson`` filter does (``", "`` and ``": "`` separators, no ASCII
  escaping).

A form is accepted when a probe conversation in that form renders without
error, shows the probe's text, and shows no Python repr of the probe value.
A template on which no probe renders (one that refuses the probe's roles, or
never prints the value) is ``"either"``: it cannot tell the forms apart, so
nothing is converted. vLLM makes the content decision by walking the Jinja
AST for loops over ``message['content']``; llama.cpp's minja probes renders
as we do, which also covers templates that test ``is string``.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable

from ..errors import FrontendError

EITHER = "either"
STRING = "string"
PARTS = "parts"
MAPPING = "mapping"

_TEXTS = ("flare-probe-system", "flare-probe-user", "flare-probe-reply", "flare-probe-again")
_ARGS_TEXT = '{"flare_probe_key":"flare-probe-value"}'  # compact: tojson of the object would add a space
_ARGS_VALUE = {"flare_probe_key": "flare-probe-value"}
_PROBE_TOOL = {"type": "function", "function": {
    "name": "flare_probe", "description": "probe",
    "parameters": {"type": "object", "properties": {
        "flare_probe_key": {"type": "string", "description": "probe"}}, "required": []}}}
_CALL_ID = "flare0001"  # nine alphanumerics: Mistral templates refuse any other tool-call ID

Render = Callable[[dict], str]  # a probe context -> the rendered text; raises FrontendError


@dataclass(frozen=True)
class TemplateForms:
    """How one template consumes content and tool-call arguments."""

    content: str = EITHER  # either | string | parts
    arguments: str = EITHER  # either | string | mapping

    def to_json(self) -> dict[str, str]:
        return {"content": self.content, "arguments": self.arguments}


def detect_forms(render: Render) -> TemplateForms:
    """Probe ``render`` (the template over its usual context) for the forms it accepts."""
    return TemplateForms(content=_content_form(render), arguments=_arguments_form(render))


def _outcome(render: Render, context: dict) -> str | None:
    try:
        return render(context)
    except FrontendError:
        return None


def _content_form(render: Render) -> str:
    def conversation(with_system: bool, as_parts: bool) -> list[dict]:
        roles = ("system", "user", "assistant", "user")
        messages = [{"role": role, "content": [{"type": "text", "text": text}] if as_parts else text}
                    for role, text in zip(roles, _TEXTS)]
        return messages if with_system else messages[1:]

    def shows(text: str | None, with_system: bool, as_parts: bool) -> bool:
        if text is None:
            return False
        needles = _TEXTS if with_system else _TEXTS[1:]
        repr_seen = as_parts and ("'type': 'text'" in text or '"type": "text"' in text)
        return all(n in text for n in needles) and not repr_seen

    for with_system in (True, False):
        as_string = _outcome(render, {"messages": conversation(with_system, False)})
        as_parts = _outcome(render, {"messages": conversation(with_system, True)})
        if as_string is None and as_parts is None:
            continue  # the template refuses this conversation's shape: try the next
        string_ok = shows(as_string, with_system, False)
        parts_ok = shows(as_parts, with_system, True)
        if string_ok and not parts_ok:
            return STRING
        if parts_ok and not string_ok:
            return PARTS
        return EITHER
    return EITHER


def _arguments_form(render: Render) -> str:
    def conversation(arguments: Any, variant: int) -> dict:
        call = {"id": _CALL_ID, "type": "function",
                "function": {"name": "flare_probe", "arguments": arguments}}
        assistant: dict[str, Any] = {"role": "assistant", "tool_calls": [call]}
        if variant == 1:
            assistant["content"] = ""
        messages = [{"role": "user", "content": "flare-probe-user"}, assistant,
                    {"role": "tool", "tool_call_id": _CALL_ID, "name": "flare_probe",
                     "content": "flare-probe-result"}]
        return {"messages": messages, "tools": [_PROBE_TOOL]}

    for variant in (0, 1):
        as_string = _outcome(render, conversation(_ARGS_TEXT, variant))
        as_mapping = _outcome(render, conversation(dict(_ARGS_VALUE), variant))
        if as_string is None and as_mapping is None:
            continue
        string_ok = as_string is not None and _ARGS_TEXT in as_string
        mapping_ok = (as_mapping is not None and "flare-probe-value" in as_mapping
                      and "'flare_probe_key'" not in as_mapping)
        if string_ok and not mapping_ok:
            return STRING
        if mapping_ok and not string_ok:
            return MAPPING
        return EITHER
    return EITHER


def renders_tools(render: Render) -> bool:
    """Whether the template shows a request's tools to the model (a probe tool's name appears)."""
    probe = {"messages": [{"role": "user", "content": "flare-probe-user"}], "tools": [_PROBE_TOOL]}
    text = _outcome(render, probe)
    return text is not None and _PROBE_TOOL["function"]["name"] in text


# -- adapting a request to the template ----------------------------------------

def adapt_content(content: Any, form: str) -> Any:
    """``content`` in the form the template takes (parts joined, or a string wrapped)."""
    if form == STRING and isinstance(content, list):
        texts = [part.get("text") for part in content if isinstance(part, dict)]
        if len(texts) == len(content) and all(isinstance(t, str) for t in texts):
            return "\n".join(texts)
    elif form == PARTS and isinstance(content, str):
        return [{"type": "text", "text": content}]
    return content


def adapt_arguments(arguments: Any, form: str, where: str) -> Any:
    """Tool-call ``arguments`` checked (a JSON object, or a string holding one; ``""`` is
    ``{}``) and put in the form the template takes."""
    if arguments is None:
        return None
    if isinstance(arguments, str):
        parsed = parse_arguments(arguments, where)
        return parsed if form == MAPPING else arguments
    if not isinstance(arguments, dict):
        raise FrontendError(f"{where} must be a JSON object or a string holding one, "
                            f"got {type(arguments).__name__}")
    if form == STRING:
        return json.dumps(arguments, ensure_ascii=False)
    return arguments


def parse_arguments(text: str, where: str) -> dict:
    """A JSON-string ``arguments`` value as an object (``""`` and blanks are ``{}``)."""
    if not text.strip():
        return {}
    try:
        parsed = json.loads(text)
    except ValueError as exc:
        raise FrontendError(f"{where} are not valid JSON: {exc}") from None
    if not isinstance(parsed, dict):
        raise FrontendError(f"{where} must be a JSON object, got {type(parsed).__name__}")
    return parsed
