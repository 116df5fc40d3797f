"""Conversation corpus for the chat-template differential tests.

Each conversation is a dict of template variables the way ``apply_chat_template``
passes them (messages, tools, documents) before the option variables
(add_generation_prompt, enable_thinking) and special tokens are added by
:func:`contexts`.
"""

from __future__ import annotations

import copy
import itertools

SPECIAL_TOKENS = {
    "bos_token": "<s>",
    "eos_token": "</s>",
    "unk_token": "<unk>",
    "pad_token": "<pad>",
}

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}

SEARCH_TOOL = {
    "type": "function",
    "function": {
        "name": "web_search",
        "description": "Search the web and return the top results.",
        "parameters": {
            "type": "object",
            "properties": {
                "query": {"type": "string", "description": "What to search for"},
                "max_results": {"type": "integer", "description": "At most this many"},
                "filters": {
                    "type": "object",
                    "properties": {"site": {"type": "string"}, "recent": {"type": "boolean"}},
                },
            },
            "required": ["query"],
        },
    },
}


def many_tools(count: int = 20) -> list[dict]:
    """``count`` distinct tool schemas (the benchmark's tools case)."""
    tools = []
    for i in range(count):
        tools.append({
            "type": "function",
            "function": {
                "name": f"tool_{i}",
                "description": f"Tool number {i}: does thing {i} with its arguments.",
                "parameters": {
                    "type": "object",
                    "properties": {
                        "text": {"type": "string", "description": "Input text"},
                        "count": {"type": "integer", "description": "How many"},
                        "mode": {"type": "string", "enum": ["fast", "exact"]},
                        "score": {"type": "number", "description": "A float, e.g. 0.5"},
                    },
                    "required": ["text"],
                },
            },
        })
    return tools


def _tool_call(name: str, arguments, call_id: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def history(turns: int, text: str = "Message number {i}, with some words in it.") -> list[dict]:
    """A system prompt plus ``turns`` alternating user/assistant messages."""
    msgs = [{"role": "system", "content": "You are a helpful assistant."}]
    for i in range(turns):
        role = "user" if i % 2 == 0 else "assistant"
        msgs.append({"role": role, "content": text.format(i=i)})
    if msgs[-1]["role"] == "assistant":
        msgs.append({"role": "user", "content": "And the last question?"})
    return msgs


def conversations() -> dict[str, dict]:
    """Named conversations: template variables other than options and tokens."""
    convs: dict[str, dict] = {}
    convs["single_user"] = {"messages": [{"role": "user", "content": "Hello!"}]}
    convs["system_multi_turn"] = {"messages": [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4"},
        {"role": "user", "content": "And 3+3?\nThink step by step."},
    ]}
    convs["tools_object_args"] = {
        "tools": [WEATHER_TOOL, SEARCH_TOOL],
        "messages": [
            {"role": "system", "content": "Use tools when helpful."},
            {"role": "user", "content": "Weather in Paris and news about it?"},
            {"role": "assistant", "content": "", "tool_calls": [
                _tool_call("get_weather", {"city": "Paris", "unit": "celsius"}, "call_1"),
                _tool_call("web_search", {"query": "Paris news", "max_results": 3,
                                          "filters": {"recent": True}}, "call_2"),
            ]},
            {"role": "tool", "tool_call_id": "call_1", "name": "get_weather",
             "content": "{\"temperature\": 21, \"sky\": \"clear\"}"},
            {"role": "tool", "tool_call_id": "call_2", "name": "web_search",
             "content": "1. Paris hosts a fair."},
            {"role": "assistant", "content": "It is 21°C and clear; Paris hosts a fair."},
            {"role": "user", "content": "Thanks!"},
        ],
    }
    convs["tools_string_args"] = {
        "tools": [WEATHER_TOOL],
        "messages": [
            {"role": "user", "content": "Weather in Tokyo?"},
            {"role": "assistant", "content": None, "tool_calls": [
                _tool_call("get_weather", "{\"city\": \"Tokyo\"}", "call_9")]},
            {"role": "tool", "tool_call_id": "call_9", "content": "rainy, 18C"},
        ],
    }
    convs["reasoning"] = {"messages": [
        {"role": "user", "content": "Is 17 prime?"},
        {"role": "assistant", "content": "Yes, 17 is prime.",
         "reasoning_content": "17 has no divisors between 2 and 4."},
        {"role": "user", "content": "And 21?"},
    ]}
    convs["inline_think"] = {"messages": [
        {"role": "user", "content": "Pick a number."},
        {"role": "assistant", "content": "<think>\nSomething small.\n</think>\n\nSeven."},
        {"role": "user", "content": "Another."},
    ]}
    convs["multimodal"] = {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Describe media."}]},
        {"role": "user", "content": [
            {"type": "image", "image": "<Image>"},
            {"type": "text", "text": "What is in this picture?"},
            {"type": "video", "video": "<Video>"},
            {"type": "text", "text": "And in the clip?"},
        ]},
        {"role": "assistant", "content": [{"type": "text", "text": "A cat, then a dog."}]},
        {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x.png"}},
                                     {"type": "text", "text": "This one?"}]},
    ]}
    convs["unicode_emoji"] = {"messages": [
        {"role": "system", "content": "Réponds en français. 日本語もOK. Ünïcödé ✓"},
        {"role": "user", "content": "Salut 👋🏽 — ça va? \"quotes\" & <tags> \\ back\\slash\t tab"},
        {"role": "assistant", "content": "Très bien 😀! 𝔘𝔫𝔦𝔠𝔬𝔡𝔢 e\u0301 \u2028 line-sep"},
        {"role": "user", "content": "  leading and trailing spaces  \n\n"},
    ]}
    convs["empty_strings"] = {"messages": [
        {"role": "system", "content": ""},
        {"role": "user", "content": ""},
        {"role": "assistant", "content": ""},
        {"role": "user", "content": " "},
    ]}
    convs["documents"] = {
        "documents": [{"title": "Doc A", "text": "Alpha text."},
                      {"title": "Doc B", "text": "Beta text."}],
        "messages": [{"role": "user", "content": "Summarise the documents."}],
    }
    convs["history_40"] = {"messages": history(40)}
    return convs


OPTION_SETS = [
    {"add_generation_prompt": agp, **({} if think is None else {"enable_thinking": think})}
    for agp, think in itertools.product((False, True), (None, True, False))
]


def contexts():
    """(case name, context) pairs crossing every conversation with every option set,
    plus one 200-turn history; contexts are fresh copies so renders cannot interfere."""
    for conv_name, conv in conversations().items():
        for i, options in enumerate(OPTION_SETS):
            ctx = {"tools": None, "documents": None, **copy.deepcopy(conv), **options,
                   **SPECIAL_TOKENS}
            yield f"{conv_name}/opt{i}", ctx
    yield "history_200", {"tools": None, "documents": None, "messages": history(200),
                          "add_generation_prompt": True, **SPECIAL_TOKENS}
