"""Frontend.load / render_chat / encode / decode (flare.frontend.frontend).

The reference is Transformers itself: the converted SmolLM2 tokenizer files are
written to a directory and loaded with AutoTokenizer, whose apply_chat_template
(jinja2) and tokenization must give the same prompt and token ids.
"""

from __future__ import annotations

import copy
import json
import threading
from pathlib import Path

import numpy as np
import pytest

from flare import fixtures
from flare.core.gguf_tokenizer import convert_gguf_file
from flare.errors import FrontendError
from flare.frontend.annotations import PATH_ANNOTATION, PATH_DIFFERENTIAL, PATH_MARKED, sha256_hex
from flare.frontend.forms import TemplateForms
from flare.frontend.frontend import AssetFingerprints, Frontend, TokenSettings, prepare_messages, token_endpoints
from flare.request import PreparedPrompt

TOOL = {"type": "function", "function": {"name": "get_weather", "description": "Weather for a city",
                                         "parameters": {"type": "object",
                                                        "properties": {"city": {"type": "string"}},
                                                        "required": ["city"]}}}
CHAT = [{"role": "system", "content": "You are terse."},
        {"role": "user", "content": "What is the capital of France?  "},
        {"role": "assistant", "content": "Paris."},
        {"role": "user", "content": "And of Germany? 🇩🇪 ünïcödé"}]
TOOL_CHAT = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": None,
              "tool_calls": [{"id": "call12345", "type": "function",
                              "function": {"name": "get_weather", "arguments": {"city": "Paris", "unit": "c"}}}]},
             {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "{\"t\": 20}"},
             {"role": "assistant", "content": "20C", "reasoning_content": "check units"},
             {"role": "user", "content": "thanks"}]


# Turn markers of the other families, so their templates' control text tokenizes as whole special
# tokens (as with each model's own tokenizer) instead of BPE pieces that straddle message ends.
FAMILY_SPECIALS = ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|eom_id|>",
                   "<|python_tag|>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[TOOL_CALLS]",
                   "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]", "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "<start_of_turn>",
                   "<end_of_turn>", "<|turn>", "<turn|>", "<|tool_call>", "<tool_call|>", "<|tool_response>",
                   "<tool_response|>", "<|channel>", "<channel|>", "<｜User｜>", "<｜Assistant｜>",
                   "<｜end▁of▁sentence｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁calls▁end｜>", "<｜tool▁call▁begin｜>",
                   "<｜tool▁call▁end｜>", "<｜tool▁sep｜>", "<｜tool▁outputs▁begin｜>", "<｜tool▁outputs▁end｜>",
                   "<｜tool▁output▁begin｜>", "<｜tool▁output▁end｜>", "<|start|>", "<|end|>", "<|message|>",
                   "<|channel|>", "<|return|>", "<|call|>", "<think>", "</think>", "<tool_call>", "</tool_call>"]


@pytest.fixture(scope="module")
def smollm2_assets(fixture_root: Path):
    converted = convert_gguf_file(fixtures.smollm2_gguf(fixture_root))
    return converted, json.dumps(converted.tokenizer_json).encode()


@pytest.fixture(scope="module")
def extended_assets(smollm2_assets):
    """SmolLM2's tokenizer plus the other families' turn markers as special tokens."""
    import tokenizers

    converted, tokenizer_json = smollm2_assets
    backend = tokenizers.Tokenizer.from_str(tokenizer_json.decode())
    backend.add_special_tokens([tokenizers.AddedToken(t, special=True, normalized=False) for t in FAMILY_SPECIALS])
    return converted, backend.to_str().encode()


def make_frontend(smollm2_assets, template: bytes | str | None = None, defaults=None) -> Frontend:
    converted, tokenizer_json = smollm2_assets
    if template is None:
        template = converted.tokenizer_config["chat_template"]
    template = template.encode() if isinstance(template, str) else template
    settings = TokenSettings.from_tokenizer_config(converted.tokenizer_config, converted.eos_token_ids)
    return Frontend.load(tokenizer_json, template, AssetFingerprints(sha256_hex(tokenizer_json), sha256_hex(template)),
                         settings, defaults)


@pytest.fixture(scope="module")
def frontend(smollm2_assets) -> Frontend:
    return make_frontend(smollm2_assets)


@pytest.fixture(scope="module")
def reference(extended_assets, tmp_path_factory):
    """Transformers' tokenizer over the same converted files."""
    transformers = pytest.importorskip("transformers")
    converted, tokenizer_json = extended_assets
    directory = tmp_path_factory.mktemp("smollm2-tokenizer")
    (directory / "tokenizer.json").write_bytes(tokenizer_json)
    (directory / "tokenizer_config.json").write_text(json.dumps(converted.tokenizer_config), encoding="utf-8")
    return transformers.AutoTokenizer.from_pretrained(str(directory))


def reference_render(reference, template: str, messages, tools=None, **kwargs) -> tuple[str, list[int]]:
    text = reference.apply_chat_template(messages, tools=tools, chat_template=template, tokenize=False, **kwargs)
    return text, reference(text, add_special_tokens=False)["input_ids"]


def all_templates(fixture_root: Path, shared_template_dir: Path | None) -> dict[str, bytes]:
    paths = sorted((fixture_root / "templates").glob("*.jinja"))
    if shared_template_dir is not None:
        paths += sorted(shared_template_dir.glob("*.jinja"))
    return {f"{'fixture' if p.parent.parent == fixture_root else 'shared'}/{p.name}": p.read_bytes() for p in paths}


def check_endpoints(frontend: Frontend, rendered) -> None:
    """Sorted, unique, strictly inside, and each one a clean cut of the prompt text.

    Marks map to tokens exactly; differential offsets are preserved prefixes and round down.
    """
    endpoints = list(rendered.message_endpoints)
    assert endpoints == sorted(set(endpoints))
    assert all(0 < e < len(rendered.token_ids) for e in endpoints)
    ids = rendered.token_ids.tolist()
    exact = frontend.endpoint_path != PATH_DIFFERENTIAL
    for e in endpoints:
        prefix = frontend.decode(ids[:e], skip_special_tokens=False)
        assert rendered.text.startswith(prefix)
        cut = len(prefix.encode())
        assert cut in rendered.byte_endpoints if exact else any(cut <= b for b in rendered.byte_endpoints)


def test_smollm2_prompt_matches_transformers(frontend, reference, smollm2_assets):
    template = smollm2_assets[0].tokenizer_config["chat_template"]
    assert frontend.endpoint_path == PATH_ANNOTATION and frontend.template.name == "smollm2"
    for messages in (CHAT, CHAT[1:], CHAT[1:2]):
        for add_generation_prompt in (True, False):
            rendered = frontend.render_chat(messages, options={"add_generation_prompt": add_generation_prompt})
            text, ids = reference_render(reference, template, messages, add_generation_prompt=add_generation_prompt)
            assert rendered.text == text and rendered.prompt == text.encode()
            assert rendered.token_ids.dtype == np.int32 and rendered.token_ids.tolist() == ids
            check_endpoints(frontend, rendered)
    rendered = frontend.render_chat(CHAT[1:])
    # Default system prompt, then the three messages; the generation header stays outside.
    assert len(rendered.message_endpoints) == 4
    tail = frontend.decode(rendered.token_ids[rendered.message_endpoints[-1]:].tolist(), skip_special_tokens=False)
    assert tail == "<|im_start|>assistant\n"


FAMILY_TEMPLATES = ["Qwen-Qwen2.5-7B-Instruct.jinja", "Qwen-Qwen3-0.6B.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja",
                    "meta-llama-Llama-3.2-3B-Instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja",
                    "google-gemma-4-31B-it.jinja", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja",
                    "Qwen3.5-4B.jinja", "HuggingFaceTB-SmolLM3-3B.jinja", "openai-gpt-oss-120b.jinja"]


def _tool_turns_with_content(messages: list[dict]) -> list[dict]:
    """A copy where an assistant tool-call turn without content has content "": Flare renders it
    so (as vLLM does), where Transformers hands the template no content key (Qwen3's raises)."""
    out = copy.deepcopy(messages)
    for message in out:
        if message.get("role") == "assistant" and message.get("tool_calls") and message.get("content") is None:
            message["content"] = ""
    return out


@pytest.mark.parametrize("name", FAMILY_TEMPLATES)
def test_family_templates_match_transformers(extended_assets, reference, fixture_root, name):
    source = (fixture_root / "templates" / name).read_bytes()
    frontend = make_frontend(extended_assets, source)
    conversations = [(CHAT, None), (CHAT[1:], None)]
    if "Mistral" not in name:
        conversations.append((TOOL_CHAT, [TOOL]))
    for messages, tools in conversations:
        for options in ({"add_generation_prompt": True}, {"add_generation_prompt": False},
                        {"add_generation_prompt": True, "enable_thinking": False}):
            try:
                text, ids = reference_render(reference, source.decode(), _tool_turns_with_content(messages),
                                             tools=tools, **options)
            except Exception as exc:  # the template rejects it: so must we, with its message
                with pytest.raises(FrontendError) as caught:
                    frontend.render_chat(messages, tools, options)
                assert str(exc).split("\n")[0][:40] in str(caught.value) or "raise" in str(exc).lower()
                continue
            rendered = frontend.render_chat(messages, tools, options)
            assert rendered.text == text
            assert rendered.token_ids.tolist() == ids
            check_endpoints(frontend, rendered)
            # Differential templates that rewrite earlier turns (reasoning stripped) keep fewer ends.
            assert len(rendered.message_endpoints) >= (2 if options["add_generation_prompt"] else 1), name


def test_every_real_template_loads_and_cuts_cleanly(extended_assets, fixture_root, shared_template_dir):
    paths = {PATH_ANNOTATION: 0, PATH_DIFFERENTIAL: 0, PATH_MARKED: 0}
    rendered_count = with_endpoints = 0
    base = make_frontend(extended_assets)
    templates = all_templates(fixture_root, shared_template_dir)
    assert len(templates) == (120 if shared_template_dir is not None else 70)
    for name, source in templates.items():
        frontend = base.with_chat_template(source, sha256_hex(source))
        assert frontend.tokenizer is base.tokenizer
        paths[frontend.endpoint_path] += 1
        try:
            rendered = frontend.render_chat(CHAT[1:])
        except FrontendError:
            continue  # e.g. templates that need extra variables; rejection is a typed error
        rendered_count += 1
        check_endpoints(frontend, rendered)
        assert rendered.byte_endpoints, name  # every template yields message ends in bytes...
        # ...which become token endpoints where the turn markers are whole tokens of this vocabulary.
        with_endpoints += bool(rendered.message_endpoints)
    # 11 bundled annotations match llama.cpp's 70 templates; ../shared/templates adds more when present.
    assert paths[PATH_ANNOTATION] >= (12 if shared_template_dir is not None else 11)
    assert paths[PATH_DIFFERENTIAL] >= (50 if shared_template_dir is not None else 40)
    assert rendered_count >= 0.9 * len(templates) and with_endpoints >= 0.8 * rendered_count


def test_endpoints_never_split_a_token(smollm2_assets):
    # "Hel" + "lo" is one token "Hello": the mark between them straddles it and is dropped.
    template = "{% for m in messages %}{{ m.content }}{% mark %}{% endfor %}"
    frontend = make_frontend(smollm2_assets, template)
    assert frontend.endpoint_path == PATH_MARKED
    rendered = frontend.render_chat([{"role": "user", "content": "Hel"}, {"role": "user", "content": "lo world"},
                                     {"role": "user", "content": "<|im_end|>x"}])
    assert rendered.byte_endpoints == (3, 11)
    assert frontend.decode(rendered.token_ids.tolist(), skip_special_tokens=False) == "Hello world<|im_end|>x"
    assert rendered.message_endpoints == (2,)  # "Hello", " world" | "<|im_end|>", "x"


def test_token_endpoints_rule():
    prompt = "ab cd".encode()
    starts, ends = np.array([0, 2, 3]), np.array([2, 3, 5])  # "ab", " ", "cd"
    assert token_endpoints([2, 3], prompt, starts, ends) == [1, 2]
    assert token_endpoints([1, 4, 5], prompt, starts, ends) == []  # inside tokens, or the very end
    # Overlapping spans (normalizers can map two tokens onto one character) block the cut.
    assert token_endpoints([2], prompt, np.array([0, 1, 3]), np.array([2, 3, 5])) == []
    multibyte = "é|x".encode()
    assert token_endpoints([3], multibyte, np.array([0, 1, 2]), np.array([1, 2, 3])) == [2]
    # Differential cuts round down to the last clean boundary instead of being dropped.
    assert token_endpoints([1, 4], prompt, starts, ends, round_down=True) == [2]
    assert token_endpoints([2], prompt, np.array([0, 1, 3]), np.array([2, 3, 5]), round_down=True) == []


def test_defaults_then_request_options(smollm2_assets, fixture_root):
    source = (fixture_root / "templates" / "Qwen-Qwen3-0.6B.jinja").read_bytes()
    no_think = "<think>\n\n</think>\n\n"
    default_off = make_frontend(smollm2_assets, source, defaults={"enable_thinking": False})
    assert default_off.render_chat(CHAT).text.endswith("<|im_start|>assistant\n" + no_think)
    assert default_off.render_chat(CHAT, options={"enable_thinking": True}).text.endswith("<|im_start|>assistant\n")
    plain = make_frontend(smollm2_assets, source)
    assert plain.render_chat(CHAT).text.endswith("<|im_start|>assistant\n")
    assert not plain.render_chat(CHAT, options={"add_generation_prompt": False}).text.endswith("assistant\n")
    generation_off = make_frontend(smollm2_assets, source, defaults={"add_generation_prompt": False})
    assert generation_off.render_chat(CHAT).text.endswith("<|im_end|>\n")


def test_tool_arguments_as_strings_or_objects_keep_their_order(smollm2_assets, fixture_root):
    source = (fixture_root / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_bytes()
    frontend = make_frontend(smollm2_assets, source)

    def call(arguments):
        return [{"role": "user", "content": "x"},
                {"role": "assistant", "content": "",
                 "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": arguments}}]}]

    as_string = frontend.render_chat(call('{"zeta": 1, "alpha": [2, {"y": "ü", "b": null}]}'))
    as_object = frontend.render_chat(call({"zeta": 1, "alpha": [2, {"y": "ü", "b": None}]}))
    assert as_string.text == as_object.text
    assert '"arguments": {"zeta": 1, "alpha": [2, {"y": "ü", "b": null}]}' in as_string.text
    for bad, message in (("[1, 2]", "must be a JSON object, got list"), ("{not json", "not valid JSON"),
                         ("42", "got int"), (17, "got int")):
        with pytest.raises(FrontendError, match=message):
            frontend.render_chat(call(bad))


def test_messages_are_not_modified_and_content_is_preserved(frontend):
    messages = [{"role": "user", "content": "  spaced\tout \u200b text  ", "name": None},
                {"role": "assistant", "content": "ok", "tool_calls": [
                    {"type": "function", "function": {"name": "f", "arguments": '{"a": 1}'}}]},
                {"role": "user", "content": "next"}]
    snapshot = copy.deepcopy(messages)
    rendered = frontend.render_chat(messages)
    assert messages == snapshot
    assert "\n  spaced\tout \u200b text  <|im_end|>" in rendered.text
    prepared = prepare_messages(messages)
    assert "name" not in prepared[0]
    # Arguments keep the client's form unless the template needs the other (frontend/forms.py).
    assert prepared[1]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
    as_mapping = prepare_messages(messages, TemplateForms(arguments="mapping"))
    assert as_mapping[1]["tool_calls"][0]["function"]["arguments"] == {"a": 1}
    reasoning = prepare_messages([{"role": "assistant", "content": "x", "reasoning": "r"}])[0]
    assert reasoning["reasoning_content"] == reasoning["thinking"] == "r"


def test_continue_final_message_matches_transformers(extended_assets, reference, fixture_root):
    for name in ("Qwen-Qwen2.5-7B-Instruct.jinja", "meta-llama-Llama-3.1-8B-Instruct.jinja"):
        source = (fixture_root / "templates" / name).read_bytes()
        frontend = make_frontend(extended_assets, source)
        messages = CHAT + [{"role": "assistant", "content": "Berlin is "}]
        options = {"add_generation_prompt": False, "continue_final_message": True}
        rendered = frontend.render_chat(messages, options=options)
        text, ids = reference_render(reference, source.decode(), copy.deepcopy(messages), **options)
        assert rendered.text == text and rendered.token_ids.tolist() == ids
        # Qwen keeps the trailing space, Llama trims content: the cut follows each (Transformers' rule).
        assert rendered.text.endswith("\nBerlin is " if name.startswith("Qwen") else "\n\nBerlin is")
        check_endpoints(frontend, rendered)
        # The open message is not complete: no endpoint at or after its start.
        assert max(rendered.byte_endpoints) < len(rendered.prompt) - len("Berlin is")
        with pytest.raises(FrontendError, match="not compatible"):
            frontend.render_chat(messages, options={"continue_final_message": True})


def test_template_errors_become_frontend_errors(smollm2_assets, fixture_root):
    gemma = make_frontend(smollm2_assets, (fixture_root / "templates" / "google-gemma-2-2b-it.jinja").read_bytes())
    with pytest.raises(FrontendError, match="System role not supported"):
        gemma.render_chat(CHAT)
    frontend = make_frontend(smollm2_assets)
    for messages, message in (([], "empty conversation"), ("hi", "list of message"), ([["user"]], "must be an object"),
                              ([{"role": "user", "content": "x", "tool_calls": "f"}], "must be a list")):
        with pytest.raises(FrontendError, match=message):
            frontend.render_chat(messages)
    with pytest.raises(FrontendError, match="tools must be a list"):
        frontend.render_chat(CHAT, tools={"type": "function"})


def test_fingerprint_mismatch_names_the_asset_and_both_hashes(smollm2_assets):
    converted, tokenizer_json = smollm2_assets
    template = converted.tokenizer_config["chat_template"].encode()
    settings = TokenSettings.from_tokenizer_config(converted.tokenizer_config)
    good = AssetFingerprints(sha256_hex(tokenizer_json), sha256_hex(template))
    wrong = "0" * 64
    with pytest.raises(FrontendError) as caught:
        Frontend.load(tokenizer_json, template, AssetFingerprints(wrong, good.chat_template), settings)
    message = str(caught.value)
    assert "tokenizer.json" in message and wrong in message and good.tokenizer_json in message
    with pytest.raises(FrontendError, match=f"chat template fingerprint mismatch: expected SHA-256 {wrong}, got "
                                            f"{good.chat_template}"):
        Frontend.load(tokenizer_json, template, AssetFingerprints(good.tokenizer_json, wrong), settings)
    with pytest.raises(FrontendError, match="without an expected SHA-256"):
        Frontend.load(tokenizer_json, template, AssetFingerprints(good.tokenizer_json), settings)
    without_template = Frontend.load(tokenizer_json, None, AssetFingerprints(good.tokenizer_json), settings)
    assert without_template.endpoint_path is None
    with pytest.raises(FrontendError, match="no chat template"):
        without_template.render_chat(CHAT)
    with pytest.raises(FrontendError, match="line"):  # a template that does not compile names where
        make_frontend(smollm2_assets, "{% for x in %}")
    with pytest.raises(FrontendError, match="segment-count marks"):
        make_frontend(smollm2_assets, "{% for m in messages %}{{ m.content }}{% mark loop.index %}{% endfor %}")


def test_encode_decode_and_settings(smollm2_assets, frontend):
    converted, tokenizer_json = smollm2_assets
    assert frontend.encode("Hello world") == frontend.encode("Hello world", add_special_tokens=False) == [19556, 905]
    settings = TokenSettings.from_tokenizer_config({**converted.tokenizer_config, "add_bos_token": True,
                                                    "bos_token": {"content": "<|im_start|>"}})
    with_bos = Frontend.load(tokenizer_json, None, AssetFingerprints(sha256_hex(tokenizer_json)), settings)
    assert with_bos.encode("Hello world") == [1, 19556, 905]
    assert with_bos.encode("Hello world", add_special_tokens=False) == [19556, 905]
    ids = frontend.encode("<|im_start|>Hi 😀<|im_end|>")
    assert frontend.decode(ids) == "Hi 😀"
    assert frontend.decode(ids, skip_special_tokens=False) == "<|im_start|>Hi 😀<|im_end|>"
    decoder = frontend.incremental_decoder()
    assert "".join(decoder.push([i]) for i in ids) + decoder.flush() == "Hi 😀"
    assert frontend.token_bytes(ids[1]) == b"Hi"
    assert frontend.settings.eos_token_ids == (2, 0)
    assert frontend.settings.special_tokens_map()["eos_token"] == "<|im_end|>"
    with pytest.raises(FrontendError, match="must be a string"):
        TokenSettings.from_tokenizer_config({"bos_token": 5})


def test_prepared_prompt_and_concurrent_renders(frontend):
    expected = frontend.render_chat(CHAT)
    prepared = frontend.prepare_chat(CHAT)
    assert isinstance(prepared, PreparedPrompt)
    assert prepared.token_ids.tolist() == expected.token_ids.tolist()
    assert prepared.message_endpoints == expected.message_endpoints and prepared.text == expected.text
    results, errors = [], []

    def worker():
        try:
            for _ in range(30):
                results.append(frontend.render_chat(CHAT).token_ids.tolist())
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors and len(results) == 120
    assert all(r == expected.token_ids.tolist() for r in results)
