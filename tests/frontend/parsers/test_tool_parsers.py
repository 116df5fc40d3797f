"""Every tool-call parser on outputs in its family's documented format: one call, several,
calls after text, reasoning before them (composed with ``think``), and a broken call
(its text is content, counted in ``malformed``)."""

from __future__ import annotations

import pytest

from .outputs import HERMES_CALL, parse

PARIS = ("get_weather", {"city": "Paris", "unit": "celsius"})
UTC = ("get_time", {"tz": "UTC"})
REASONING = "<think>\nThe user wants the weather.\n</think>\n\n"

CALL = {
    "hermes": lambda name, args: f'<tool_call>\n{{"name": "{name}", "arguments": {args}}}\n</tool_call>',
    "llama3_json": lambda name, args: f'{{"name": "{name}", "parameters": {args}}}',
    "mistral": lambda name, args: f"[TOOL_CALLS]{name}[ARGS]{args}",
    "deepseek_v3": lambda name, args: ("<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>"
                                       f"{name}\n```json\n{args}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "deepseek_v31": lambda name, args: (f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>{name}<｜tool▁sep｜>{args}"
                                        "<｜tool▁call▁end｜><｜tool▁calls▁end｜>"),
    "granite": lambda name, args: f'<|tool_call|>[{{"name": "{name}", "arguments": {args}}}]',
    "kimi_k2": lambda name, args: (f"<|tool_calls_section_begin|><|tool_call_begin|>functions.{name}:0"
                                   f"<|tool_call_argument_begin|>{args}<|tool_call_end|><|tool_calls_section_end|>"),
}
PARIS_ARGS = '{"city": "Paris", "unit": "celsius"}'
UTC_ARGS = '{"tz": "UTC"}'
# Two calls as each family writes them together.
PARALLEL = {
    "hermes": CALL["hermes"]("get_weather", PARIS_ARGS) + "\n" + CALL["hermes"]("get_time", UTC_ARGS),
    "llama3_json": CALL["llama3_json"]("get_weather", PARIS_ARGS) + "; " + CALL["llama3_json"]("get_time", UTC_ARGS),
    "mistral": CALL["mistral"]("get_weather", PARIS_ARGS) + CALL["mistral"]("get_time", UTC_ARGS),
    "deepseek_v3": CALL["deepseek_v3"]("get_weather", PARIS_ARGS).replace(
        "<｜tool▁calls▁end｜>", "\n" + CALL["deepseek_v3"]("get_time", UTC_ARGS).split("<｜tool▁calls▁begin｜>")[1]),
    "deepseek_v31": CALL["deepseek_v31"]("get_weather", PARIS_ARGS).replace(
        "<｜tool▁calls▁end｜>", CALL["deepseek_v31"]("get_time", UTC_ARGS).split("<｜tool▁calls▁begin｜>")[1]),
    "granite": f'<|tool_call|>[{{"name": "get_weather", "arguments": {PARIS_ARGS}}}, '
               f'{{"name": "get_time", "arguments": {UTC_ARGS}}}]',
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
               f"{PARIS_ARGS}<|tool_call_end|><|tool_call_begin|>functions.get_time:1<|tool_call_argument_begin|>"
               f"{UTC_ARGS}<|tool_call_end|><|tool_calls_section_end|>",
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n<parameter=unit>\n"
                   "celsius\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n<function=get_time>\n"
                   "<parameter=tz>\nUTC\n</parameter>\n</function>\n</tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n<arg_key>unit</arg_key>\n"
             "<arg_value>celsius</arg_value>\n</tool_call>\n<tool_call>get_time\n<arg_key>tz</arg_key>\n"
             "<arg_value>UTC</arg_value>\n</tool_call>",
}
SINGLE = {name: make("get_weather", PARIS_ARGS) for name, make in CALL.items()}
SINGLE["qwen3_coder"] = PARALLEL["qwen3_coder"].split("\n<tool_call>\n<function=get_time>")[0]
SINGLE["glm45"] = PARALLEL["glm45"].split("\n<tool_call>get_time")[0]
# Each family's call gone wrong in a way it can tell before the call starts.
MALFORMED = {
    "hermes": '<tool_call>\n{"name": get_weather, "arguments"\n</tool_call>',
    "llama3_json": '{"city": "Paris", "unit": "celsius"}',
    "mistral": "[TOOL_CALLS]get weather[ARGS]{}",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n[1]",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>not json<｜tool▁call▁end｜>",
    "granite": '<|tool_call|>[{"arguments": {}}]',
    "kimi_k2": "<|tool_calls_section_begin|>functions.get_weather:0",
    "qwen3_coder": "<tool_call>\n<function=get_weather>\ncity: Paris\n</function>\n</tool_call>",
    "glm45": "<tool_call>get_weather\ncity=Paris</tool_call>",
}
FAMILIES = sorted(PARALLEL)


@pytest.mark.parametrize("family", FAMILIES)
def test_one_call(family):
    result = parse(family, SINGLE[family])
    assert result.calls == [PARIS] and result.output.content == "" and result.malformed == 0
    assert result.output.reasoning == ""


@pytest.mark.parametrize("family", FAMILIES)
def test_parallel_calls_keep_their_order(family):
    result = parse(family, PARALLEL[family])
    assert result.calls == [PARIS, UTC] and result.output.content == "" and result.malformed == 0
    assert [call.index for call in result.output.tool_calls] == [0, 1]
    ids = [call.id for call in result.output.tool_calls]
    assert len(set(ids)) == 2 and all(ids)


@pytest.mark.parametrize("family", sorted(set(FAMILIES) - {"llama3_json"}))
def test_calls_after_text(family):
    result = parse(family, "Let me look that up. " + PARALLEL[family])
    assert result.calls == [PARIS, UTC] and result.output.content == "Let me look that up. "


@pytest.mark.parametrize("family", FAMILIES)
def test_reasoning_then_calls(family):
    result = parse(family, REASONING + PARALLEL[family], "think")
    assert result.output.reasoning == "The user wants the weather."
    assert result.calls == [PARIS, UTC] and result.output.content == "" and result.malformed == 0


@pytest.mark.parametrize("family", FAMILIES)
def test_reasoning_opened_by_the_prompt_then_a_call(family):
    result = parse(family, "The user wants the weather.\n</think>\n\n" + SINGLE[family], "think", opened=True)
    assert result.output.reasoning == "The user wants the weather." and result.calls == [PARIS]


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_that_does_not_parse_is_content_and_counted(family):
    result = parse(family, "Before. " * (family != "llama3_json") + MALFORMED[family])
    assert result.output.tool_calls == ()
    assert result.output.content == "Before. " * (family != "llama3_json") + MALFORMED[family]
    assert result.malformed == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_a_call_cut_off_before_it_starts_is_content(family):
    text = SINGLE[family]
    starts = next(end for end in range(len(text) + 1) if parse(family, text[:end]).output.tool_calls)
    result = parse(family, text[:starts - 1])
    assert result.output.tool_calls == () and result.output.content == text[:starts - 1] and result.malformed == 1


@pytest.mark.parametrize("family", FAMILIES)
def test_a_name_not_among_the_tools_is_still_a_call(family):
    text = SINGLE[family].replace("get_weather", "get_wether")
    assert [name for name, _ in parse(family, text).calls] == ["get_wether"]
    assert parse(family, SINGLE[family], tools=None).calls == [PARIS]


def test_hermes_reads_keys_in_any_order_and_string_arguments():
    text = '<tool_call>\n{"arguments": "{\\"city\\": \\"Paris\\"}", "name": "get_weather"}\n</tool_call>'
    assert parse("hermes", text).calls == [("get_weather", {"city": "Paris"})]


def test_hermes_tolerates_a_missing_close_and_drops_the_space_between_calls():
    result = parse("hermes", HERMES_CALL.removesuffix("</tool_call>") + "\n\n" + HERMES_CALL + "\n\nDone.")
    assert result.calls == [PARIS, PARIS] and result.output.content == "Done." and result.malformed == 0


def test_hermes_arguments_that_break_after_the_start_end_the_call_and_count():
    result = parse("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": 1}, "x": @}\n</tool_call>')
    assert result.calls == [("f", {"a": 1})] and result.malformed == 1
    assert result.output.content == ', "x": @}\n</tool_call>'
    truncated = parse("hermes", '<tool_call>\n{"name": "f", "arguments": {"a": [1, 2')
    assert truncated.output.tool_calls[0].arguments == '{"a": [1, 2' and truncated.malformed == 1
