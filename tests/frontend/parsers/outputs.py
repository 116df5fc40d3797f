"""Shared by the parser tests: running a parser over pieces, the tools, and sample outputs.

``SAMPLES`` holds, per tool parser, outputs in the family's documented format (calls
alone, after text, several, broken ones); the streaming property test runs every one
through every split, and the per-family tests pin what some of them parse to.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from flare.frontend.parsers import Delta, OutputAssembler, OutputParser, ParsedOutput, ToolCall, build

WEATHER_PARAMS = {"type": "object",
                  "properties": {"city": {"type": "string", "maxLength": 24},
                                 "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                                 "days": {"type": "integer"}},
                  "required": ["city", "unit"], "additionalProperties": False}
TIME_PARAMS = {"type": "object", "properties": {"tz": {"$ref": "#/$defs/Zone"}}, "required": ["tz"],
               "$defs": {"Zone": {"type": "string"}}}
WEATHER = {"type": "function",
           "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER_PARAMS}}
TIME = {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": TIME_PARAMS}}
TOOLS = [WEATHER, TIME]


@dataclass
class Run:
    output: ParsedOutput
    deltas: list[Delta]
    malformed: int

    @property
    def calls(self) -> list[tuple[str, dict]]:
        """Each call's name and decoded arguments."""
        return [(call.name, json.loads(call.arguments)) for call in self.output.tool_calls]


def run(parser: OutputParser, pieces) -> Run:
    """Feed ``pieces`` (a str is one piece) and finish."""
    deltas: list[Delta] = []
    for piece in [pieces] if isinstance(pieces, str) else pieces:
        deltas += parser.feed(piece)
    deltas += parser.finish()
    assembler = OutputAssembler()
    assembler.add(deltas)
    return Run(assembler.result(), deltas, parser.malformed)


def parse(tool: str | None, text, reasoning: str | None = None, *, tools=TOOLS, opened: bool = False) -> Run:
    return run(build(tool, reasoning, tools=tools, reasoning_opened=opened), text)


def without_ids(output: ParsedOutput) -> ParsedOutput:
    """``output`` with every call ID blanked (generated IDs are random)."""
    calls = tuple(ToolCall(call.index, "", call.name, call.arguments) for call in output.tool_calls)
    return ParsedOutput(output.content, output.reasoning, calls)


HERMES_CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>'
SAMPLES: dict[str, list[str]] = {
    "hermes": [
        HERMES_CALL,
        "Let me check.\n" + HERMES_CALL
        + '\n<tool_call>\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n</tool_call>',
        '<tool_call>\n{"arguments": {"q": "a \\"}\\" b"}, "name": "search"}\n</tool_call>\nDone.',
        '<tool_call>\n[{"name": "a", "arguments": {}}, {"name": "b", "arguments": "{\\"x\\": [1, 2]}"}]\n</tool_call>',
        '<tool_call>\n{"name": get_weather, "arguments"\n</tool_call> then <tool_call>\n{"name": "f", "arguments": {}}',
        'x < y <tool_ <tool_call>{"name": "f", "arguments": {"s": "é ✓ 💡"}}</tool_call><tool_call>\n{"name": "g", "ar',
    ],
    "qwen3_coder": [
        "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\ncelsius\n"
        "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
        "I'll look.\n<tool_call>\n<function=search>\n<parameter=q>\nline one\nline </two>\n\n</parameter>\n"
        "<parameter=opts>\n{\"n\": [1, true, null]}\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
        "<function=get_time>\n<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>",
        "<tool_call>\n<function=unclosed>\n<parameter=x>\n1\n</function>",
        "<tool_call>\n<function=truncated>\n<parameter=x>\n1",
        "<tool_call>\nnot a function</tool_call> text",
    ],
    "llama3_json": [
        '{"name": "get_weather", "parameters": {"city": "Paris", "unit": "celsius"}}',
        ' <|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"k": [1, {"z": "}"}]}}',
        "Paris is sunny today {\"name\": \"not a call\"}",
        '{"city": "Paris"} is what you asked for',
        '{"name": "a", "parameters": {"x": 1}}\n\nI called it.',
    ],
    "mistral": [
        '[TOOL_CALLS]get_weather[ARGS]{"city": "Paris", "unit": "celsius"}',
        'Sure [TOOL_CALLS]a[CALL_ID]abcDEF123[ARGS]{"x": 1}[TOOL_CALLS]b[ARGS]{}',
        '[TOOL_CALLS] [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}, "id": "a1b2c3d4e"}, '
        '{"name": "get_time", "arguments": {"tz": "UTC"}}]',
        '[TOOL_CALLS]not a name!',
        '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}, {"arguments": {}}]',
    ],
    "deepseek_v3": [
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
        '{"city": "Paris", "unit": "celsius"}\n```<｜tool▁call▁end｜>\n'
        '<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_time\n```json\n{"tz": "UTC"}\n```<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
        "Checking.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```"
        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{bad}",
    ],
    "deepseek_v31": [
        '<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{"city": "Paris", "unit": "celsius"}'
        '<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{"tz": "UTC"}<｜tool▁call▁end｜>'
        "<｜tool▁calls▁end｜>",
        "Let me see<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
        "<｜tool▁calls▁begin｜>oops",
    ],
    "granite": [
        '<|tool_call|>[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, '
        '{"name": "get_time", "arguments": {"tz": "UTC"}}]',
        'Sure. <|tool_call|>{"name": "f", "arguments": {}}',
        "<|tool_call|>[]",
    ],
    "glm45": [
        "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n"
        "<arg_value>celsius</arg_value>\n<arg_key>days</arg_key>\n<arg_value>3</arg_value>\n</tool_call>",
        "Sure.\n<tool_call>a\n<arg_key>v</arg_key>\n<arg_value>{\"k\": [1]}</arg_value>\n</tool_call>\n<tool_call>b\n"
        "</tool_call>",
        "<tool_call>a\n<arg_key>v</arg_key>\nnope",
    ],
    "kimi_k2": [
        "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
        '{"city": "Paris", "unit": "celsius"}<|tool_call_end|><|tool_call_begin|>functions.get_time:1'
        '<|tool_call_argument_begin|>{"tz": "UTC"}<|tool_call_end|><|tool_calls_section_end|>',
        "Ok<|tool_calls_section_begin|><|tool_call_begin|>x<|tool_call_argument_begin|>[1]<|tool_call_end|>",
    ],
}
REASONED = ["<think>\nThe user wants the weather.\n</think>\n\n", "<think>\n\n</think>\n\n", "<think>unfinished"]
