"""What is particular to each family: value types, IDs, where calls may begin, markers."""

from __future__ import annotations

import re

from flare.frontend.parsers import ToolCallArguments, ToolCallStart, build

from .outputs import TOOLS, parse

DEEPSEEK_CALLS = "<\uff5ctool\u2581calls\u2581begin\uff5c>"  # fullwidth vertical bar, lower one-eighth block


def test_qwen3_coder_values_follow_the_declared_types():
    text = ("<tool_call>\n<function=get_weather>\n<parameter=city>\n123\n</parameter>\n<parameter=unit>\ncelsius\n"
            "</parameter>\n<parameter=days>\n 7 \n</parameter>\n</function>\n</tool_call>")
    assert parse("qwen3_coder", text).calls == [("get_weather", {"city": "123", "unit": "celsius", "days": 7})]
    assert parse("qwen3_coder", text, tools=None).calls == [("get_weather", {"city": 123, "unit": "celsius",
                                                                             "days": 7})]


def test_qwen3_coder_undeclared_values_are_json_when_they_are_json():
    values = {"n": "-1.5", "b": "true", "o": '{"k": [1]}', "a": "[1, 2]", "z": "null", "s": '"quoted"',
              "t": "plain text", "nan": "NaN"}
    text = "<tool_call>\n<function=f>\n" + "".join(f"<parameter={k}>\n{v}\n</parameter>\n" for k, v in values.items())
    text += "</function>\n</tool_call>"
    assert parse("qwen3_coder", text).calls == [("f", {"n": -1.5, "b": True, "o": {"k": [1]}, "a": [1, 2], "z": None,
                                                       "s": '"quoted"', "t": "plain text", "nan": "NaN"})]


def test_qwen3_coder_reads_python_literals_for_declared_objects_and_booleans():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {
        "o": {"type": "object"}, "b": {"type": "boolean"}, "x": {"type": "integer"}}}}}]
    text = ("<tool_call>\n<function=f>\n<parameter=o>\n{'k': True}\n</parameter>\n<parameter=b>\nFalse\n</parameter>\n"
            "<parameter=x>\nmany\n</parameter>\n</function>\n</tool_call>")
    assert parse("qwen3_coder", text, tools=tools).calls == [("f", {"o": {"k": True}, "b": False, "x": "many"})]


def test_qwen3_coder_streams_a_string_value_as_it_is_written():
    parser = build("qwen3_coder", None, tools=TOOLS)
    deltas = parser.feed("<tool_call>\n<function=get_weather>\n<parameter=city>\nSan ")
    assert [type(d) for d in deltas] == [ToolCallStart, ToolCallArguments, ToolCallArguments, ToolCallArguments]
    assert "".join(d.fragment for d in deltas[1:]) == '{"city": "San '
    assert parser.feed('Fran"cisco\n</param') == [ToolCallArguments(0, 'Fran\\"cisco')]
    assert parser.feed("eter>\n") == [ToolCallArguments(0, '"')]


def test_glm_values_follow_the_declared_types():
    text = ("<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>days</arg_key>\n"
            "<arg_value>3</arg_value>\n<arg_key>extra</arg_key>\n<arg_value>[\"a\"]</arg_value>\n</tool_call>")
    assert parse("glm45", text).calls == [("get_weather", {"city": "Paris", "days": 3, "extra": ["a"]})]


def test_mistral_keeps_the_models_ids_and_makes_nine_character_ones():
    result = parse("mistral", '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"tz": "UTC"}[TOOL_CALLS]get_time[ARGS]{}')
    first, second = result.output.tool_calls
    assert first.id == "a1b2c3d4e" and re.fullmatch(r"[A-Za-z0-9]{9}", second.id)
    listed = parse("mistral", '[TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "UTC"}, "id": "Zz9Zz9Zz9"}]')
    assert listed.output.tool_calls[0].id == "Zz9Zz9Zz9" and listed.calls == [("get_time", {"tz": "UTC"})]


def test_generated_ids_are_call_and_24_hex_digits():
    call = parse("hermes", '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>').output.tool_calls[0]
    assert re.fullmatch(r"call_[0-9a-f]{24}", call.id)


def test_llama3_calls_only_at_the_start_of_the_output():
    call = '{"name": "get_time", "parameters": {"tz": "UTC"}}'
    assert parse("llama3_json", "\n " + call).calls == [("get_time", {"tz": "UTC"})]
    assert parse("llama3_json", "<|python_tag|>" + call).calls == [("get_time", {"tz": "UTC"})]
    later = parse("llama3_json", "Here: " + call)
    assert later.output.tool_calls == () and later.output.content == "Here: " + call and later.malformed == 0


def test_llama3_content_streams_at_once_when_the_output_is_no_call():
    parser = build("llama3_json", None)
    assert parser.feed("  ") == []
    assert [d.text for d in parser.feed("Hi {")] == ["  ", "Hi {"]


def test_llama3_builtin_tool_syntax_is_content():
    text = '<|python_tag|>brave_search.call(query="weather")'
    result = parse("llama3_json", text)
    assert result.output.content == text and result.malformed == 1


def test_deepseek_markers_are_the_fullwidth_ones():
    ascii_bars = "<|tool▁calls▁begin|><|tool▁call▁begin|>f<|tool▁sep|>{}<|tool▁call▁end|><|tool▁calls▁end|>"
    assert parse("deepseek_v31", ascii_bars).output.content == ascii_bars
    fullwidth = ascii_bars.replace("|", "\uff5c")
    assert fullwidth.startswith(DEEPSEEK_CALLS) and parse("deepseek_v31", fullwidth).calls == [("f", {})]


def test_deepseek_v3_tolerates_a_missing_fence():
    text = DEEPSEEK_CALLS + '<｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n{"a": 1}<｜tool▁call▁end｜>'
    assert parse("deepseek_v3", text).calls == [("f", {"a": 1})]


def test_kimi_ids_are_the_models_and_name_the_function():
    text = ("<|tool_calls_section_begin|><|tool_call_begin|>functions.get_time:3<|tool_call_argument_begin|>{}"
            "<|tool_call_end|><|tool_calls_section_end|>")
    call = parse("kimi_k2", text).output.tool_calls[0]
    assert (call.id, call.name) == ("functions.get_time:3", "get_time")


def test_granite_reads_a_single_object_without_the_list():
    assert parse("granite", '<|tool_call|>{"name": "f", "arguments": {"a": 1}}').calls == [("f", {"a": 1})]
