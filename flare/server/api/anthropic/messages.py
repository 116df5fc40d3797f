"""Anthropic ``messages`` and ``system`` as the chat messages every family renders.

OpenAI-style messages (``engine.prepare_chat`` takes them), in the form the
client sent wherever that form exists there: a string stays a string, text
blocks become text parts (``cache_control`` dropped), and the frontend adapts
them to the template (frontend/forms.py).

- ``system`` and ``role: "system"`` messages are system messages;
  consecutive user or assistant turns are combined into one, as Anthropic does.
- ``tool_use`` blocks are the assistant's ``tool_calls`` (``arguments`` is the
  ``input`` object); each ``tool_result`` is a ``tool`` message with
  ``tool_call_id`` where it stands in the user turn (with the tool's ``name``
  when an earlier ``tool_use`` gave it); ``thinking`` blocks are
  ``reasoning_content``.
- Images and every other block type are refused with a 400 naming the block.
"""

from __future__ import annotations

from typing import Any, Mapping

from ...request_body import shorten
from ..openai.schema import _invalid, _name, _unsupported

_TEXT_KEYS = frozenset({"type", "text", "cache_control", "citations"})
_THINKING_KEYS = frozenset({"type", "thinking", "signature", "cache_control"})
_TOOL_USE_KEYS = frozenset({"type", "id", "name", "input", "cache_control", "caller", "toolset_name"})
_TOOL_RESULT_KEYS = frozenset({"type", "tool_use_id", "content", "is_error", "cache_control", "toolset_name"})
_BLOCKS_BY_ROLE = {"user": ("text", "tool_result"), "assistant": ("text", "thinking", "tool_use")}


def system_messages(system: Any) -> list[dict[str, Any]]:
    """The top-level ``system`` prompt (a string or text blocks) as a system message, if any."""
    if system is None:
        return []
    return [{"role": "system", "content": _text_content(system, "system")}]


def conversation(messages: Any) -> list[dict[str, Any]]:
    """``messages`` as chat messages (see the module docstring); 400 for anything not served."""
    if not isinstance(messages, list) or not messages:
        raise _invalid("'messages' must be a non-empty list", "messages")
    out: list[dict[str, Any]] = []
    names: dict[str, str] = {}  # tool_use id -> tool name, for the tool results that answer it
    for i, message in enumerate(messages):
        param = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _invalid(f"{param} must be an object", param)
        check_keys(message, frozenset({"role", "content"}), param)
        role = message.get("role")
        if "content" not in message:
            raise _invalid(f"{param}.content is required", f"{param}.content")
        content = message["content"]
        if role == "system":
            out.append({"role": "system", "content": _text_content(content, f"{param}.content")})
        elif role == "user":
            for converted in _user(content, param, names):
                _append(out, converted)
        elif role == "assistant":
            _append(out, _assistant(content, param, names))
        else:
            raise _invalid(f"{param}.role must be one of assistant, system, user", f"{param}.role")
    return out


def _append(out: list[dict[str, Any]], message: dict[str, Any]) -> None:
    """Add ``message``, combined with the previous one when both are user or both assistant turns."""
    last = out[-1] if out else None
    if last is None or last["role"] != message["role"] or message["role"] not in _BLOCKS_BY_ROLE:
        out.append(message)
        return
    parts = _as_parts(last["content"]) + _as_parts(message["content"])
    last["content"] = parts or ""
    if "reasoning_content" in message:
        last["reasoning_content"] = "\n".join(filter(None, (last.get("reasoning_content"),
                                                            message["reasoning_content"])))
    if "tool_calls" in message:
        last["tool_calls"] = last.get("tool_calls", []) + message["tool_calls"]


def _as_parts(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}] if content else []
    return content


def _blocks(content: Any, param: str, role: str) -> list[tuple[str, str, dict[str, Any]]]:
    """(type, where, block) for each block of a list content; types the role may not carry are refused."""
    if not isinstance(content, list):
        raise _invalid(f"{param}.content must be a string or a list of content blocks", f"{param}.content")
    if not content:
        raise _invalid(f"{param}.content must not be empty", f"{param}.content")
    out = []
    for j, block in enumerate(content):
        where = f"{param}.content[{j}]"
        kind = _block_type(block, where)
        if kind not in _BLOCKS_BY_ROLE[role]:
            raise _refused_block(kind, where, f"in a {role} message")
        out.append((kind, where, block))
    return out


def _block_type(block: Any, where: str) -> str:
    if not isinstance(block, dict) or not isinstance(block.get("type"), str):
        raise _invalid(f"{where} must be a content block (an object with a 'type')", where)
    return block["type"]


def _refused_block(kind: str, where: str, context: str = ""):
    if kind == "image":
        return _unsupported(f"{where}: image content is not supported: the served model takes text only",
                            f"{where}.type")
    known = "text, tool_use, tool_result and thinking"
    allowed = f" {context}" if kind in ("text", "tool_use", "tool_result", "thinking") else ""
    return _unsupported(f"{where}: content block type '{shorten(kind, 64)}' is not supported{allowed} "
                        f"(blocks served: {known})", f"{where}.type")


def _user(content: Any, param: str, names: Mapping[str, str]) -> list[dict[str, Any]]:
    """A user turn: its text, with each tool_result as a tool message where it stands."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    out: list[dict[str, Any]] = []
    parts: list[dict[str, Any]] = []
    for kind, where, block in _blocks(content, param, "user"):
        if kind == "text":
            parts.append(_text(block, where))
            continue
        if parts:
            out.append({"role": "user", "content": parts})
            parts = []
        out.append(_tool_result(block, where, names))
    if parts:
        out.append({"role": "user", "content": parts})
    return out


def _assistant(content: Any, param: str, names: dict[str, str]) -> dict[str, Any]:
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    parts: list[dict[str, Any]] = []
    reasoning: list[str] = []
    calls: list[dict[str, Any]] = []
    for kind, where, block in _blocks(content, param, "assistant"):
        if kind == "text":
            parts.append(_text(block, where))
        elif kind == "thinking":
            check_keys(block, _THINKING_KEYS, where)
            string_field(block, "thinking", where)
            if block.get("signature") is not None:
                string_field(block, "signature", where)  # ours are empty; any is accepted, none is checked
            check_cache_control(block.get("cache_control"), f"{where}.cache_control")
            reasoning.append(block["thinking"])
        else:
            calls.append(_tool_use(block, where, names))
    message: dict[str, Any] = {"role": "assistant", "content": parts or ""}
    if reasoning:
        message["reasoning_content"] = "\n".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


def _text_content(content: Any, param: str) -> str | list[dict[str, Any]]:
    """A string, or text blocks (system prompts, tool results)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _invalid(f"'{param}' must be a string or a list of text blocks", param)
    parts = []
    for j, block in enumerate(content):
        where = f"{param}[{j}]"
        kind = _block_type(block, where)
        if kind != "text":
            raise _refused_block(kind, where, "here (text only)")
        parts.append(_text(block, where))
    return parts


def _text(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    check_keys(block, _TEXT_KEYS, where)
    string_field(block, "text", where)
    check_cache_control(block.get("cache_control"), f"{where}.cache_control")
    if block.get("citations"):
        raise _unsupported(f"{where}.citations: citations are not supported", f"{where}.citations")
    return {"type": "text", "text": block["text"]}


def _tool_use(block: Mapping[str, Any], where: str, names: dict[str, str]) -> dict[str, Any]:
    check_keys(block, _TOOL_USE_KEYS, where)
    call_id = _name(block.get("id"), f"{where}.id")
    name = _name(block.get("name"), f"{where}.name")
    arguments = block.get("input")
    if not isinstance(arguments, dict):
        raise _invalid(f"{where}.input must be an object", f"{where}.input")
    caller = block.get("caller")
    if caller is not None and caller != {"type": "direct"}:
        raise _unsupported(f"{where}.caller: only direct tool calls are served", f"{where}.caller")
    _no_toolset(block, where)
    check_cache_control(block.get("cache_control"), f"{where}.cache_control")
    names[call_id] = name
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_result(block: Mapping[str, Any], where: str, names: Mapping[str, str]) -> dict[str, Any]:
    check_keys(block, _TOOL_RESULT_KEYS, where)
    call_id = _name(block.get("tool_use_id"), f"{where}.tool_use_id")
    content = block.get("content")
    message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id,
                               "content": "" if content is None else _text_content(content, f"{where}.content")}
    if call_id in names:
        message["name"] = names[call_id]
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise _invalid(f"{where}.is_error must be a boolean", f"{where}.is_error")
    if is_error:
        message["is_error"] = True  # reaches the template beside the content
    _no_toolset(block, where)
    check_cache_control(block.get("cache_control"), f"{where}.cache_control")
    return message


def _no_toolset(block: Mapping[str, Any], where: str) -> None:
    if block.get("toolset_name") is not None:
        raise _unsupported(f"{where}.toolset_name: toolsets are not served", f"{where}.toolset_name")


# -- shared checks ---------------------------------------------------------------

def check_cache_control(control: Any, param: str) -> None:
    """A cache breakpoint: accepted, since every prompt prefix is cached anyway (the prefix cache)."""
    if control is None:
        return
    if not isinstance(control, dict) or control.get("type") != "ephemeral":
        raise _invalid(f"{param} must be {{'type': 'ephemeral'}}", param)
    check_keys(control, frozenset({"type", "ttl"}), param)
    if control.get("ttl") not in (None, "5m", "1h"):
        raise _invalid(f"{param}.ttl must be '5m' or '1h'", f"{param}.ttl")


def check_keys(value: Mapping[str, Any], allowed: frozenset[str], param: str) -> None:
    unknown = sorted(key for key in value if key not in allowed)
    if unknown:
        raise _unsupported(f"{param}: unsupported field(s): {', '.join(shorten(k, 64) for k in unknown[:8])}",
                           f"{param}.{shorten(unknown[0], 64)}")


def string_field(value: Mapping[str, Any], key: str, where: str) -> str:
    if not isinstance(value.get(key), str):
        raise _invalid(f"{where}.{key} must be a string", f"{where}.{key}")
    return value[key]
