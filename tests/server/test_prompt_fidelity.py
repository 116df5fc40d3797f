"""Prompt fidelity through the served path: HTTP /tokenize on the real demo server equals
Transformers' ``apply_chat_template(..., tokenize=True)`` with the same template and tokenizer.

Every real template (llama.cpp's fixtures, and ../shared/templates when it is beside the
checkout) is sent as the request's ``chat_template`` (the server runs with
--trust-request-chat-template), crossed with conversations in the forms clients send:
tool-call arguments as compact and spaced JSON strings, objects, ``""`` and nested values;
several calls per turn; tool results; system and developer roles; assistant prefill;
content parts; documents; reasoning history; unicode; Jinja-looking text. The reference is
Transformers given the client's messages, converted only where the template cannot take
the client's form (the rule of flare/frontend/forms.py; the forms are probed here on
jinja2, not on our VM). Where Transformers raises a template error, the server must answer
400 carrying the template's message. Serve-time --chat-template and the two-turn cache
behaviour of a tool conversation are checked at the end.
"""

from __future__ import annotations

import copy
import json
import os
from functools import lru_cache
from pathlib import Path

import pytest
from server_harness import get_json, launch, post_json

from flare import fixtures
from flare.errors import FrontendError
from flare.frontend import forms as template_forms

pytestmark = pytest.mark.skipif(os.environ.get("FLARE_E2E_DEMO", "1") == "0",
                                reason="needs the demo core (FLARE_E2E_DEMO=0)")

SHARED = Path(__file__).resolve().parents[3] / "shared" / "templates"

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name"},
        "unit": {"type": "string", "description": "celsius or fahrenheit", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Search the web.",
    "parameters": {"type": "object", "properties": {
        "query": {"type": "string", "description": "What to look for"},
        "filters": {"type": "object", "description": "Optional filters"}}, "required": ["query"]}}}


def _call(call_id: str, name: str, arguments) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _tool_turn(arguments, *, content="") -> list[dict]:
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": [_call("call00001", "get_weather", arguments)]},
        {"role": "tool", "tool_call_id": "call00001", "name": "get_weather", "content": '{"temp": 21}'},
    ]


CONVERSATIONS = {
    "system_user": {"messages": [{"role": "system", "content": "You are terse."},
                                 {"role": "user", "content": "Hello there"}]},
    "developer_role": {"messages": [{"role": "developer", "content": "Answer in French."},
                                    {"role": "user", "content": "Hi"}]},
    "multi_turn": {"messages": [{"role": "user", "content": "One"}, {"role": "assistant", "content": "Two"},
                                {"role": "user", "content": "Three"}]},
    "assistant_prefill": {"messages": [{"role": "user", "content": "Name a colour"},
                                       {"role": "assistant", "content": "The colour is"}],
                          "add_generation_prompt": False, "continue_final_message": True},
    "args_compact_string": {"messages": _tool_turn('{"city":"Paris"}'), "tools": [WEATHER]},
    "args_spaced_string": {"messages": _tool_turn('{ "city" :  "Paris",\n  "unit": "celsius" }'),
                           "tools": [WEATHER]},
    "args_object": {"messages": _tool_turn({"city": "Paris", "unit": "celsius"}), "tools": [WEATHER]},
    "args_empty_string": {"messages": _tool_turn(""), "tools": [WEATHER]},
    "args_nested": {"messages": [
        {"role": "user", "content": "Find recent news"},
        {"role": "assistant", "content": "", "tool_calls": [_call(
            "call00002", "search", '{"query": "news", "filters": {"site": ["a.org", "b.org"], "recent": true, '
                                   '"n": 2.5, "x": null}}')]},
        {"role": "tool", "tool_call_id": "call00002", "name": "search", "content": "nothing"}],
        "tools": [SEARCH]},
    "content_null_tool_call": {"messages": [
        {"role": "user", "content": "Weather?"},
        {"role": "assistant", "content": None, "tool_calls": [_call("call00003", "get_weather", '{"city": "Oslo"}')]},
        {"role": "tool", "tool_call_id": "call00003", "content": "cold"}], "tools": [WEATHER]},
    "parallel_calls": {"messages": [
        {"role": "user", "content": "Weather in Paris and Rome, and search news"},
        {"role": "assistant", "content": "", "tool_calls": [
            _call("call00004", "get_weather", '{"city": "Paris"}'),
            _call("call00005", "get_weather", {"city": "Rome"}),
            _call("call00006", "search", '{"query":"news"}')]},
        {"role": "tool", "tool_call_id": "call00004", "name": "get_weather", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call00005", "name": "get_weather", "content": "rainy"},
        {"role": "tool", "tool_call_id": "call00006", "name": "search", "content": "none"},
        {"role": "assistant", "content": "Paris is sunny, Rome is rainy."},
        {"role": "user", "content": "Thanks"}], "tools": [WEATHER, SEARCH]},
    "content_parts": {"messages": [
        {"role": "system", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": [{"type": "text", "text": "First part."}, {"type": "text", "text": "Second."}]}]},
    "documents": {"messages": [{"role": "user", "content": "What does the report say?"}],
                  "documents": [{"title": "Report", "text": "Sales rose 4%."}, {"title": "Memo", "text": "Hi."}]},
    "documents_in_kwargs": {"messages": [{"role": "user", "content": "Summarize"}],
                            "chat_template_kwargs": {"documents": [{"title": "A", "text": "alpha"}]}},
    "reasoning_history": {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "Two plus two is four."},
        {"role": "user", "content": "And 3+3?"}]},
    "unicode": {"messages": [{"role": "user", "content": "Zürich 東京 🚀 café\u0301 ‮rtl‬ \u00a0nbsp"}]},
    "jinja_looking": {"messages": [{"role": "user", "content": "{{ messages }} {% if true %}x{% endif %} {# c #}"}]},
    "empty_tools": {"messages": [{"role": "user", "content": "No tools here"}], "tools": []},
    "extra_keys": {"messages": [{"role": "user", "content": "Hello", "x_client_id": 7}]},
    "template_kwargs": {"messages": [{"role": "user", "content": "Think?"}],
                        "chat_template_kwargs": {"enable_thinking": False}},
}


def _template_files() -> list[Path]:
    if os.environ.get("FLARE_E2E_DEMO", "1") == "0":
        return []  # the module is skipped: do not fetch fixtures to parametrize it
    files = sorted((fixtures.ensure_fixtures() / "templates").glob("*.jinja"))
    if SHARED.is_dir():
        files += sorted(SHARED.glob("*.jinja"))
    return files


@pytest.fixture(scope="module")
def served():
    server = launch("demo", extra_flags=("--trust-request-chat-template",))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def hf_tokenizer():
    from transformers import PreTrainedTokenizerFast

    from flare.core.embedded import demo_core
    core = demo_core()
    frontend = json.loads((core / "core.json").read_text())["contract"]["frontend"]
    return PreTrainedTokenizerFast(tokenizer_file=str(core / "tokenizer.json"),
                                   **{k: frontend[k] for k in ("bos_token", "eos_token", "unk_token", "pad_token")
                                      if frontend.get(k)})


@lru_cache(maxsize=4)
def _reference_forms(source: str, special: tuple) -> template_forms.TemplateForms:
    """The forms probed on jinja2 as Transformers configures it (the oracle side)."""
    from transformers.utils.chat_template_utils import _compile_jinja_template
    template = _compile_jinja_template(source)

    def render(context: dict) -> str:
        try:
            return template.render(**{**dict(special), "add_generation_prompt": True, "tools": None,
                                      "documents": None, **context})
        except Exception as exc:  # noqa: BLE001 - any jinja2 failure is a refused probe
            raise FrontendError(str(exc)) from None
    return template_forms.detect_forms(render)


def _client_to_template(messages: list[dict], forms: template_forms.TemplateForms) -> list[dict]:
    """The client's messages in the forms the template takes (written independently of the server's code)."""
    out = copy.deepcopy(messages)
    for message in out:
        if message.get("role") == "assistant" and message.get("tool_calls") and message.get("content") is None:
            message["content"] = ""  # as vLLM does: templates read the content of a tool-call turn
        content = message.get("content")
        if forms.content == "string" and isinstance(content, list):
            message["content"] = "\n".join(part["text"] for part in content)
        elif forms.content == "parts" and isinstance(content, str):
            message["content"] = [{"type": "text", "text": content}]
        for call in message.get("tool_calls") or ():
            arguments = call["function"]["arguments"]
            if forms.arguments == "mapping" and isinstance(arguments, str):
                call["function"]["arguments"] = json.loads(arguments) if arguments.strip() else {}
            elif forms.arguments == "string" and isinstance(arguments, dict):
                call["function"]["arguments"] = json.dumps(arguments, ensure_ascii=False)
    return out


def _reference(tokenizer, source: str, conversation: dict) -> tuple[str, object]:
    import jinja2
    forms = _reference_forms(source, tuple(sorted(tokenizer.special_tokens_map.items())))
    kwargs = dict(conversation.get("chat_template_kwargs") or {})
    documents = conversation.get("documents", kwargs.pop("documents", None))
    try:
        out = tokenizer.apply_chat_template(
            _client_to_template(conversation["messages"], forms), tools=conversation.get("tools"),
            documents=documents, chat_template=source, tokenize=True,
            add_generation_prompt=conversation.get("add_generation_prompt", True),
            continue_final_message=conversation.get("continue_final_message", False), **kwargs)
    except jinja2.TemplateError as exc:
        return "template_error", str(exc)
    except (ValueError, TypeError) as exc:  # Transformers' own refusals (e.g. continuation it cannot place)
        return "error", str(exc)
    return "ok", list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("template_path", _template_files(), ids=lambda p: f"{p.parent.name}/{p.name}")
def test_tokenize_matches_transformers(served, hf_tokenizer, template_path: Path):
    source = template_path.read_text(encoding="utf-8")
    for name, conversation in CONVERSATIONS.items():
        kind, expected = _reference(hf_tokenizer, source, conversation)
        status, body = post_json(served, "/tokenize", {**conversation, "chat_template": source})
        if kind == "ok":
            assert status == 200, f"{name}: transformers renders, flare answered {status}: {body}"
            assert body["tokens"] == expected, f"{name}: token IDs differ from transformers"
            assert body["count"] == len(expected)
        else:
            assert status == 400, f"{name}: transformers raised ({expected}), flare answered {status}"
            if kind == "template_error":
                assert expected in body["error"]["message"], f"{name}: {body['error']['message']!r}"


def test_forms_probed_on_known_templates():
    """The probe's verdicts on templates whose handling we know from reading them."""
    root = fixtures.ensure_fixtures() / "templates"
    special = (("bos_token", "<s>"), ("eos_token", "</s>"))
    expected = {
        "meetkai-functionary-medium-v3.2.jinja": ("string", "string"),  # prints arguments as they are
        "deepseek-ai-DeepSeek-V3.1.jinja": ("string", "mapping"),  # llama.cpp's later copy: tojson
        "Qwen-Qwen2.5-7B-Instruct.jinja": ("string", "mapping"),  # tojson of the arguments
        "meta-llama-Llama-3.1-8B-Instruct.jinja": ("string", "mapping"),
        "Qwen-Qwen3-0.6B.jinja": ("string", "either"),  # `is string` test on the arguments
        "Mistral-Small-3.2-24B-Instruct-2506.jinja": ("either", "mapping"),  # iterates content parts
    }
    for name, (content, arguments) in expected.items():
        forms = _reference_forms((root / name).read_text(encoding="utf-8"), special)
        assert (forms.content, forms.arguments) == (content, arguments), name
    if SHARED.is_dir():  # DeepSeek's own V3.1 template concatenates the arguments string
        forms = _reference_forms((SHARED / "deepseek-ai-DeepSeek-V3.1.jinja").read_text(encoding="utf-8"), special)
        assert forms.arguments == "string"


def test_tokenize_and_detokenize_shapes(served):
    status, body = post_json(served, "/tokenize", {"prompt": "Hello world", "return_token_strs": True})
    assert status == 200 and body["count"] == len(body["tokens"]) == len(body["token_strs"])
    assert body["max_model_len"] == 8192 and "".join(body["token_strs"]).replace("Ġ", " ") == "Hello world"
    status, back = post_json(served, "/detokenize", {"tokens": body["tokens"], "model": served.model})
    assert status == 200 and back == {"prompt": "Hello world"}
    status, chat = post_json(served, "/tokenize", {"messages": [{"role": "user", "content": "Hi"}]})
    assert status == 200 and chat["token_strs"] is None
    status, text = post_json(served, "/detokenize", {"tokens": chat["tokens"]})
    assert text["prompt"].startswith("<|im_start|>system\n") and text["prompt"].endswith("<|im_start|>assistant\n")
    # The IDs /tokenize reports are the ones generation prefills.
    status, done = post_json(served, "/v1/chat/completions", {"messages": [{"role": "user", "content": "Hi"}],
                                                              "max_tokens": 1})
    assert done["usage"]["prompt_tokens"] == chat["count"]


@pytest.mark.parametrize("path,body,status,param", [
    ("/tokenize", {}, 400, "prompt"),
    ("/tokenize", {"prompt": 3}, 400, "prompt"),
    ("/tokenize", {"prompt": "x", "bogus": 1}, 400, "bogus"),
    ("/tokenize", {"prompt": "x", "model": "nope"}, 404, "model"),
    ("/tokenize", {"messages": []}, 400, "messages"),
    ("/tokenize", {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ x + }}"}, 400, None),
    ("/detokenize", {"tokens": [-1]}, 400, "tokens"),
    ("/detokenize", {"tokens": "1 2"}, 400, "tokens"),
    ("/detokenize", {"tokens": [10**9]}, 400, None),
])
def test_tokenize_refusals(served, path, body, status, param):
    got, answer = post_json(served, path, body)
    assert got == status, answer
    if param:
        assert answer["error"]["param"] == param
    if "chat_template" in body:
        assert "line 1, column 8" in answer["error"]["message"]


def test_request_templates_need_the_trust_flag():
    plain = launch("demo")
    try:
        body = {"messages": [{"role": "user", "content": "x"}], "chat_template": "{{ messages[0].content }}"}
        for path in ("/tokenize", "/v1/chat/completions"):
            status, answer = post_json(plain, path, body)
            assert status == 400 and "--trust-request-chat-template" in answer["error"]["message"], path
    finally:
        plain.stop()


def test_serve_time_chat_template(served, tmp_path):
    """--chat-template replaces the core's: fingerprinted in /v1/models, same tokens as transformers."""
    source_path = fixtures.ensure_fixtures() / "templates" / "meetkai-functionary-medium-v3.2.jinja"
    template = tmp_path / "override.jinja"
    template.write_bytes(source_path.read_bytes())
    override = launch("demo", extra_flags=("--chat-template", str(template)))
    try:
        status, card = get_json(override, "/v1/models")
        info = card["data"][0]["chat_template"]
        import hashlib
        assert info["source"] == "override" and info["sha256"] == hashlib.sha256(template.read_bytes()).hexdigest()
        assert info["forms"] == {"content": "string", "arguments": "string"}
        conversation = CONVERSATIONS["args_spaced_string"]
        status, body = post_json(override, "/tokenize", conversation)
        status2, same = post_json(served, "/tokenize", {**conversation, "chat_template": template.read_text()})
        assert status == status2 == 200 and body["tokens"] == same["tokens"]
        # The spaced argument string reaches the prompt byte for byte.
        status, text = post_json(override, "/detokenize", {"tokens": body["tokens"]})
        assert '{ "city" :  "Paris",\n  "unit": "celsius" }' in text["prompt"]
    finally:
        override.stop()
    status, card = get_json(served, "/v1/models")
    assert card["data"][0]["chat_template"]["source"] == "core"


def test_two_turn_tool_conversation_reuses_the_first_turn(tmp_path):
    """openai SDK, demo core with a tool-calling template: turn two's cached_tokens cover turn one's
    prompt and the reply as the client sends it back (all but the reply's last token, which was
    sampled and never run through the model)."""
    openai = pytest.importorskip("openai")
    template = fixtures.ensure_fixtures() / "templates" / "Qwen-Qwen3-0.6B.jinja"
    server = launch("demo", extra_flags=("--chat-template", str(template)))
    try:
        client = openai.OpenAI(base_url=server.base_url + "/v1", api_key="none")
        messages = [
            {"role": "system", "content": "You help with the weather."},
            {"role": "user", "content": "What's the weather in Paris?"},
            {"role": "assistant", "content": "", "tool_calls": [{
                "id": "call_1", "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city":  "Paris", "unit":"celsius"}'}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": 21, "sky": "clear"}'},
        ]
        first = client.chat.completions.create(model=server.model, messages=messages, tools=[WEATHER],
                                               temperature=0, max_tokens=24)
        reply = first.choices[0].message
        messages += [{"role": "assistant", "content": reply.content}, {"role": "user", "content": "Thanks!"}]
        second = client.chat.completions.create(model=server.model, messages=messages, tools=[WEATHER],
                                                temperature=0, max_tokens=4)
        cached = second.usage.prompt_tokens_details.cached_tokens
        first_turn = first.usage.prompt_tokens + first.usage.completion_tokens
        assert cached >= first_turn - 1, (cached, first.usage, second.usage)
        assert cached < second.usage.prompt_tokens
    finally:
        server.stop()


@pytest.mark.parametrize("name", ["content_parts", "documents", "documents_in_kwargs", "empty_tools", "extra_keys",
                                  "reasoning_history", "args_empty_string", "args_object", "parallel_calls",
                                  "assistant_prefill"])
def test_chat_completions_prefill_what_tokenize_reports(served, name):
    """Chat completions on the core's own template accept every client form and prefill exactly the
    tokens /tokenize reports for the same fields."""
    conversation = CONVERSATIONS[name]
    status, tokenized = post_json(served, "/tokenize", conversation)
    assert status == 200, tokenized
    status, done = post_json(served, "/v1/chat/completions", {**conversation, "max_tokens": 1})
    assert status == 200, done
    assert done["usage"]["prompt_tokens"] == tokenized["count"]


def test_a_serve_time_template_that_does_not_compile_stops_startup(tmp_path):
    import subprocess

    from server_harness import FLARE_SERVE
    bad = tmp_path / "bad.jinja"
    bad.write_text("{% for m in messages %}\n{{ m.content | }}{% endfor %}", encoding="utf-8")
    run = subprocess.run([*FLARE_SERVE, "--port", "0", "--chat-template", str(bad)], capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 2 and "line 2, column" in run.stderr and str(bad) in run.stderr
