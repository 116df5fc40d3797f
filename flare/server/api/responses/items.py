"""Responses items to OpenAI chat messages, the form ``engine.prepare_chat`` takes.

- a ``message`` item (or an easy input message: a role and content without a
  type) is a chat message; ``input_text`` and, on assistant messages,
  ``output_text`` parts become ``text`` parts, kept as parts (the frontend
  joins them only for a template that takes strings: frontend/forms.py);
- ``function_call`` items are an assistant message's ``tool_calls``, the
  arguments string kept as sent; calls that follow an assistant message (or
  each other) join it, as one chat turn holds text and calls;
- ``function_call_output`` is a ``tool`` message whose ``tool_call_id`` is the
  call's ``call_id``;
- a ``reasoning`` item's text is the next assistant message's
  ``reasoning_content``.

Item ids and statuses are accepted and dropped (the SDK sends them when a
client passes ``response.output`` back as input). Images, files, audio,
refusals, item references and encrypted reasoning are refused with a 400
naming the item.
"""

from __future__ import annotations

from typing import Any

from ....frontend.parsers import ParsedOutput
from ...request_body import decode_json, shorten
from ..openai.schema import _invalid, _name, _unsupported

MESSAGE_ROLES = frozenset({"user", "system", "developer", "assistant"})


def input_messages(value: Any) -> list[dict[str, Any]]:
    """A request's ``input`` (a string, or a list of items) as chat messages."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if not isinstance(value, list):
        raise _invalid("'input' must be a string or a list of input items", "input")
    out: list[dict[str, Any]] = []
    reasoning: str | None = None  # a reasoning item's text, waiting for its assistant message
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise _invalid(f"{where} must be an object", where)
        kind = item.get("type", "message" if "role" in item else None)
        if kind == "message":
            message = _message(item, where)
            if message["role"] == "assistant" and reasoning is not None:
                message["reasoning_content"], reasoning = reasoning, None
            out.append(message)
        elif kind == "function_call":
            call = _function_call(item, where)
            last = out[-1] if out else None
            if reasoning is None and last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
            else:
                out.append(_assistant("", reasoning, [call]))
                reasoning = None
        elif kind == "function_call_output":
            call_id = _name(item.get("call_id"), f"{where}.call_id")
            out.append({"role": "tool", "tool_call_id": call_id,
                        "content": _content(item.get("output"), f"{where}.output", ("input_text",))})
        elif kind == "reasoning":
            if item.get("encrypted_content") is not None:
                raise _unsupported(f"{where}: encrypted reasoning is not supported", f"{where}.encrypted_content")
            reasoning = (reasoning or "") + _reasoning_text(item.get("content"), f"{where}.content")
        elif kind == "item_reference":
            raise _unsupported(f"{where}: item references are not supported (send the item itself, or continue "
                               f"with previous_response_id)", f"{where}.type")
        else:
            raise _unsupported(f"{where}: input item type '{shorten(kind, 64)}' is not supported (messages, "
                               f"function_call, function_call_output and reasoning items are)", f"{where}.type")
    if reasoning is not None:
        out.append(_assistant("", reasoning, None))
    return out


def output_message(output: ParsedOutput) -> dict[str, Any]:
    """A response's output as the assistant message a continued conversation renders.

    The content is the text the model produced, as a string, so the re-rendered
    turn keeps its bytes and the prefix cache hits.
    """
    calls = [{"id": call.id, "type": "function", "function": {"name": call.name, "arguments": call.arguments}}
             for call in output.tool_calls]
    return _assistant(output.content, output.reasoning or None, calls or None)


def _assistant(content: str, reasoning: str | None, calls: list[dict[str, Any]] | None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if reasoning is not None:
        message["reasoning_content"] = reasoning
    if calls is not None:
        message["tool_calls"] = calls
    return message


def _message(item: dict[str, Any], where: str) -> dict[str, Any]:
    role = item.get("role")
    if role not in MESSAGE_ROLES:
        raise _invalid(f"{where}.role must be one of {', '.join(sorted(MESSAGE_ROLES))}", f"{where}.role")
    kinds = ("input_text", "output_text") if role == "assistant" else ("input_text",)
    return {"role": role, "content": _content(item.get("content"), f"{where}.content", kinds)}


def _content(content: Any, where: str, kinds: tuple[str, ...]) -> str | list[dict[str, Any]]:
    """A string, or text parts of the given kinds as chat ``text`` parts."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(f"{where} must be a string or a list of content parts", where)
    parts = []
    for i, part in enumerate(content):
        at = f"{where}[{i}]"
        if not isinstance(part, dict):
            raise _invalid(f"{at} must be an object", at)
        kind = part.get("type")
        if kind not in kinds:
            raise _unsupported(f"{at}: content part type '{shorten(kind, 64)}' is not supported here (text only: "
                               f"{', '.join(kinds)})", f"{at}.type")
        if not isinstance(part.get("text"), str):
            raise _invalid(f"{at}.text must be a string", f"{at}.text")
        parts.append({"type": "text", "text": part["text"]})
    return parts


def _function_call(item: dict[str, Any], where: str) -> dict[str, Any]:
    call_id = _name(item.get("call_id"), f"{where}.call_id")
    name = _name(item.get("name"), f"{where}.name")
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise _invalid(f"{where}.arguments must be a string holding a JSON object", f"{where}.arguments")
    if arguments.strip():  # "" counts as {}, as for chat tool calls
        parsed = decode_json(arguments.encode("utf-8"), what=f"{where}.arguments", param=f"{where}.arguments")
        if not isinstance(parsed, dict):
            raise _invalid(f"{where}.arguments must hold a JSON object", f"{where}.arguments")
    # The string as sent: the frontend parses it only for a template that takes mappings.
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _reasoning_text(content: Any, where: str) -> str:
    if content is None:
        return ""
    if not isinstance(content, list):
        raise _invalid(f"{where} must be a list of reasoning_text parts", where)
    pieces = []
    for i, part in enumerate(content):
        if not isinstance(part, dict) or part.get("type") != "reasoning_text" or not isinstance(part.get("text"), str):
            raise _invalid(f"{where}[{i}] must be a reasoning_text part with a text", f"{where}[{i}]")
        pieces.append(part["text"])
    return "".join(pieces)
