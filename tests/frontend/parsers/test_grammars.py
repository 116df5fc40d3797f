"""Each tool parser's forced-call grammar, run in llguidance over a real (Llama 3) tokenizer:
it compiles, a valid call's tokens are accepted to the end, invalid arguments (and text
after the last call) are refused, and what it accepts parses back to the same calls."""

from __future__ import annotations

import json

import llguidance
import pytest

from flare import fixtures
from flare.errors import GrammarError
from flare.frontend.grammar import GrammarCompiler
from flare.frontend.parsers import get, tool_parser_names
from flare.request import GrammarRequest

from .outputs import TOOLS, parse

VOCAB_SIZE = 128256
EOT = 128009
RESERVED = 128002  # <|reserved_special_token_0|>, a special token

PARIS = ("get_weather", {"city": "Paris", "unit": "celsius", "days": 3})
UTC = ("get_time", {"tz": "Europe/Paris"})
INVALID = [
    ("get_weather", {"city": "Paris", "unit": "kelvin"}),  # not in the enum
    ("get_weather", {"city": "Paris"}),  # a required property missing
    ("get_weather", {"city": "Paris", "unit": "celsius", "days": "three"}),  # the wrong type
    ("get_weather", {"city": "P" * 30, "unit": "celsius"}),  # too long
    ("get_weather", {"city": "Paris", "unit": "celsius", "wind": 1}),  # not declared
]


def _value(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def render(family: str, calls: list[tuple[str, dict]]) -> str:
    """``calls`` written in ``family``'s syntax, as its chat template renders them."""
    args = [json.dumps(arguments) for _, arguments in calls]
    if family == "hermes":
        return "\n".join(f'<tool_call>\n{{"name": "{n}", "arguments": {a}}}\n</tool_call>'
                         for (n, _), a in zip(calls, args))
    if family == "llama3_json":
        return "; ".join(f'{{"name": "{n}", "parameters": {a}}}' for (n, _), a in zip(calls, args))
    if family == "mistral":
        return "".join(f"[TOOL_CALLS]{n}[ARGS]{a}" for (n, _), a in zip(calls, args))
    if family == "granite":
        return "<|tool_call|>" + json.dumps([{"name": n, "arguments": a} for n, a in calls])
    if family == "deepseek_v3":
        return "<｜tool▁calls▁begin｜>" + "\n".join(
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{a}\n```<｜tool▁call▁end｜>"
            for (n, _), a in zip(calls, args)) + "<｜tool▁calls▁end｜>"
    if family == "deepseek_v31":
        return "<｜tool▁calls▁begin｜>" + "".join(
            f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{a}<｜tool▁call▁end｜>" for (n, _), a in zip(calls, args)
        ) + "<｜tool▁calls▁end｜>"
    if family == "kimi_k2":
        return "<|tool_calls_section_begin|>" + "".join(
            f"<|tool_call_begin|>functions.{n}:{i}<|tool_call_argument_begin|>{a}<|tool_call_end|>"
            for i, ((n, _), a) in enumerate(zip(calls, args))) + "<|tool_calls_section_end|>"
    if family == "qwen3_coder":
        return "\n".join("<tool_call>\n<function=" + n + ">\n" + "".join(
            f"<parameter={k}>\n{_value(v)}\n</parameter>\n" for k, v in a.items()) + "</function>\n</tool_call>"
            for n, a in calls)
    if family == "glm45":
        return "\n".join(f"<tool_call>{n}\n" + "".join(
            f"<arg_key>{k}</arg_key>\n<arg_value>{_value(v)}</arg_value>\n" for k, v in a.items()) + "</tool_call>"
            for n, a in calls)
    raise AssertionError(family)


@pytest.fixture(scope="module")
def tokenizer_json():
    return fixtures.llama3_tokenizer_json()


@pytest.fixture(scope="module")
def tokenizer(tokenizer_json):
    return llguidance.LLTokenizer(tokenizer_json.read_text(encoding="utf-8"), n_vocab=VOCAB_SIZE, eos_token=[EOT])


@pytest.fixture(scope="module")
def compiler(tokenizer_json):
    return GrammarCompiler(tokenizer_json, "llama3-test", [EOT], VOCAB_SIZE)


def accepts(tokenizer, grammar: str, tokens: list[int]) -> bool:
    """Whether the grammar takes every token and may end right after them."""
    matcher = llguidance.LLMatcher(tokenizer, grammar, log_level=1)
    assert not matcher.is_error(), matcher.get_error()
    return matcher.validate_tokens(tokens) == len(tokens) and matcher.consume_tokens(tokens) \
        and matcher.is_accepting()


def accepts_text(tokenizer, grammar: str, text: str) -> bool:
    return accepts(tokenizer, grammar, tokenizer.tokenize_str(text))


FAMILIES = sorted(tool_parser_names())


def test_every_tool_parser_is_covered():
    required = {"hermes", "qwen3_coder", "llama3_json", "mistral", "deepseek_v3", "deepseek_v31", "granite"}
    assert required <= set(FAMILIES)


@pytest.mark.parametrize("family", FAMILIES)
def test_the_grammar_compiles(family, tokenizer, compiler):
    grammar = get(family).tool_grammar(TOOLS)
    is_error, messages = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, tokenizer)
    assert not is_error, messages
    compiler.compile(GrammarRequest("grammar", grammar, param="tool_choice")).matcher()


@pytest.mark.parametrize("family", FAMILIES)
def test_valid_calls_are_accepted_to_the_end_and_parse_back(family, tokenizer):
    grammar = get(family).tool_grammar(TOOLS)
    for calls in ([PARIS], [UTC], [PARIS, UTC]):
        text = render(family, calls)
        assert accepts_text(tokenizer, grammar, text), text
        result = parse(family, text)
        assert result.calls == calls and result.output.content == "" and result.malformed == 0
        assert not accepts_text(tokenizer, grammar, text + " Done.")


@pytest.mark.parametrize("family", FAMILIES)
def test_invalid_arguments_are_refused(family, tokenizer):
    grammar = get(family).tool_grammar(TOOLS)
    for call in INVALID:
        assert not accepts_text(tokenizer, grammar, render(family, [call])), call


@pytest.mark.parametrize("family", FAMILIES)
def test_one_named_function_and_no_parallel_calls(family, tokenizer):
    named = get(family).tool_grammar(TOOLS, name="get_time")
    assert accepts_text(tokenizer, named, render(family, [UTC]))
    assert not accepts_text(tokenizer, named, render(family, [PARIS]))
    single = get(family).tool_grammar(TOOLS, parallel=False)
    assert accepts_text(tokenizer, single, render(family, [PARIS]))
    assert not accepts_text(tokenizer, single, render(family, [PARIS, UTC]))


def test_mistral_takes_the_array_form_too(tokenizer):
    grammar = get("mistral").tool_grammar(TOOLS)
    text = '[TOOL_CALLS][{"name": "get_time", "arguments": {"tz": "UTC"}, "id": "a1b2c3d4e"}]'
    assert accepts_text(tokenizer, grammar, text)
    assert parse("mistral", text).output.tool_calls[0].id == "a1b2c3d4e"
    with_id = '[TOOL_CALLS]get_time[CALL_ID]a1b2c3d4e[ARGS]{"tz": "UTC"}'
    assert accepts_text(tokenizer, grammar, with_id)


def test_a_special_token_marker_is_matched_as_that_token(tokenizer):
    grammar = get("hermes").tool_grammar(TOOLS, special_tokens={"<tool_call>": RESERVED, "</tool_call>": RESERVED + 1})
    body = tokenizer.tokenize_str('\n{"name": "get_time", "arguments": {"tz": "UTC"}}\n')
    assert accepts(tokenizer, grammar, [RESERVED, *body, RESERVED + 1])
    assert not accepts_text(tokenizer, grammar, render("hermes", [UTC]))


def test_schemas_without_properties_allow_any_arguments(tokenizer):
    tools = [{"type": "function", "function": {"name": "anything"}}]
    for family in FAMILIES:
        calls = [("anything", {"k": "v"})]
        assert accepts_text(tokenizer, get(family).tool_grammar(tools), render(family, calls)), family


def test_no_such_tool_is_a_value_error():
    with pytest.raises(ValueError, match="no function tool named 'nope'"):
        get("hermes").tool_grammar(TOOLS, name="nope")
    with pytest.raises(ValueError, match="no function tools"):
        get("hermes").tool_grammar([])


def test_an_invalid_schema_is_refused_by_the_compiler(compiler):
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "minProperties": "x"}}}]
    with pytest.raises(GrammarError):
        compiler.compile(GrammarRequest("grammar", get("hermes").tool_grammar(tools)))
