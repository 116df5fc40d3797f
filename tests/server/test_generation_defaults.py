"""Generation defaults: the model's generation_config.json values fill in what a request leaves out.

Precedence is request > model > built-in (OpenAI's), with null counting as absent; a default
max_new_tokens is clamped to the room the prompt leaves, while an explicit max_tokens that
does not fit stays a 400. ``--generation-config none`` serves the built-in defaults. Checked
on the schema alone, on the fake engine (the SamplingParams that reach it), and on real
engines: the demo server (SmolLM2's model-card sampling, temperature 0.2 and top_p 0.9;
the README's quick start), and a core exported from the SmolLM2 GGUF with
``flare export --generation``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

import pytest
from server_harness import FLARE_SERVE, REPO, Served, get_json, post_json, request, start_subprocess

from flare import fixtures
from flare.config import ServerConfig
from flare.core.embedded import DEMO_GENERATION
from flare.errors import AdmissionError, FrontendError
from flare.request import GenerationDefaults, SamplingParams
from flare.server.api.openai.schema import parse_chat, parse_completion
from flare.server.options import ConfigError, add_server_arguments, load_server_config
from flare.server.session import Server
from flare.testing.fake_engine import FakeEngine, FakeEngineConfig

USER = [{"role": "user", "content": "hi"}]
MODEL = GenerationDefaults(temperature=0.2, top_p=0.9, top_k=40, min_p=0.05, repetition_penalty=1.1,
                           max_new_tokens=64)
NONE = GenerationDefaults()
SAMPLING_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
needs_demo = pytest.mark.skipif(os.environ.get("FLARE_E2E_DEMO", "1") == "0",
                                reason="needs the demo core (FLARE_E2E_DEMO=0)")


def _sampling(params: SamplingParams) -> dict:
    return {key: getattr(params, key) for key in (*SAMPLING_KEYS, "max_tokens")}


# -- the schema: precedence ------------------------------------------------------------------

@pytest.mark.parametrize("parse,body,max_tokens", [(parse_chat, {"messages": USER}, 64),
                                                   (parse_completion, {"prompt": "hi"}, 16)])
def test_model_defaults_fill_in_what_the_request_leaves_out(parse, body, max_tokens):
    params = parse(body, MODEL).sampling_params(prompt_len=10, context_len=1000)
    # a completion's max_tokens is OpenAI's 16 unless the model's max_new_tokens is lower
    assert _sampling(params) == {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
                                 "repetition_penalty": 1.1, "max_tokens": max_tokens}
    # null counts as absent
    nulls = {key: None for key in (*SAMPLING_KEYS, "max_tokens")}
    assert parse({**body, **nulls}, MODEL).sampling_params(prompt_len=10, context_len=1000) == params


@pytest.mark.parametrize("parse,body", [(parse_chat, {"messages": USER}), (parse_completion, {"prompt": "hi"})])
def test_request_values_win_over_model_defaults(parse, body):
    explicit = {"temperature": 1.5, "top_p": 0.5, "top_k": -1, "min_p": 0, "repetition_penalty": 1.0,
                "max_tokens": 5}
    params = parse({**body, **explicit}, MODEL).sampling_params(prompt_len=10, context_len=1000)
    assert _sampling(params) == {"temperature": 1.5, "top_p": 0.5, "top_k": 0, "min_p": 0.0,
                                 "repetition_penalty": 1.0, "max_tokens": 5}
    assert parse({**body, "temperature": 0}, MODEL).sampling_params(10, 1000).is_greedy  # 0 is a value, not absent


def test_without_model_defaults_requests_get_openais():
    params = parse_chat({"messages": USER}, NONE).sampling_params(prompt_len=10, context_len=1000)
    assert _sampling(params) == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                 "repetition_penalty": 1.0, "max_tokens": 990}
    # the legacy completions API: 16 tokens (OpenAI's default, and vLLM's), null as absent
    for body in ({"prompt": "hi"}, {"prompt": "hi", "max_tokens": None}):
        assert parse_completion(body, NONE).sampling_params(prompt_len=10, context_len=1000).max_tokens == 16
    assert parse_completion({"prompt": "hi"}, GenerationDefaults(max_new_tokens=8)).sampling_params(10, 1000) \
        .max_tokens == 8
    assert parse_completion({"prompt": "hi", "max_tokens": 500}, NONE).sampling_params(10, 1000).max_tokens == 500
    # a model's top_k of -1 disables it, as a request's does
    assert parse_chat({"messages": USER}, GenerationDefaults(top_k=-1)).sampling_params(10, 1000).top_k == 0


def test_default_max_new_tokens_is_clamped_but_an_explicit_max_tokens_must_fit():
    chat = parse_chat({"messages": USER}, MODEL)
    assert chat.sampling_params(prompt_len=980, context_len=1000).max_tokens == 20  # 64 clamped to the room
    assert chat.sampling_params(prompt_len=999, context_len=1000).max_tokens == 1
    with pytest.raises(AdmissionError) as info:  # no room at all: the prompt is blamed
        chat.sampling_params(prompt_len=1000, context_len=1000)
    assert info.value.status == 400 and info.value.param == "messages"
    for body in ({"messages": USER, "max_tokens": 64}, {"messages": USER, "max_completion_tokens": 64}):
        with pytest.raises(AdmissionError) as info:
            parse_chat(body, MODEL).sampling_params(prompt_len=980, context_len=1000)
        assert info.value.status == 400 and info.value.code == "context_length_exceeded"
        assert info.value.param == "max_tokens" and "max_tokens of 64" in str(info.value)
    completion = parse_completion({"prompt": "x"}, MODEL)
    assert completion.sampling_params(prompt_len=990, context_len=1000).max_tokens == 10
    # a prompt that fills the context is blamed even beside an explicit max_tokens
    for prompt_len in (1000, 1200):
        with pytest.raises(AdmissionError) as info:
            parse_chat({"messages": USER, "max_tokens": 5}, MODEL).sampling_params(prompt_len, context_len=1000)
        assert info.value.param == "messages" and "at least one output token" in str(info.value)


# -- the value type ------------------------------------------------------------------------------

def test_generation_defaults_from_a_mapping():
    defaults = GenerationDefaults.from_mapping({"temperature": 1, "top_k": 20, "max_new_tokens": 256, "min_p": None})
    assert defaults == GenerationDefaults(temperature=1.0, top_k=20, max_new_tokens=256)
    assert isinstance(defaults.temperature, float) and defaults.to_json() == {"temperature": 1.0, "top_k": 20,
                                                                               "max_new_tokens": 256}
    assert GenerationDefaults.from_mapping({}).is_empty and not defaults.is_empty


@pytest.mark.parametrize("values,needle", [
    ({"do_sample": True}, "'do_sample' is not a generation default; known: temperature, top_p"),
    ({"temperature": 2.5}, "temperature must be a number from 0 to 2, got 2.5"),
    ({"temperature": -0.1}, "temperature must be a number from 0 to 2"),
    ({"temperature": "0.7"}, "temperature must be a number"),
    ({"temperature": float("nan")}, "temperature must be a number"),
    ({"top_p": 0}, "top_p must be a number above 0 and at most 1, got 0"),
    ({"top_p": 1.01}, "top_p must be a number above 0 and at most 1"),
    ({"top_k": 2.5}, "top_k must be an integer of at least -1, got 2.5"),
    ({"top_k": -2}, "top_k must be an integer of at least -1"),
    ({"min_p": 1.5}, "min_p must be a number from 0 to 1"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number from 0.001 to 10"),
    ({"max_new_tokens": 0}, "max_new_tokens must be an integer of at least 1, got 0"),
    ({"max_new_tokens": True}, "max_new_tokens must be an integer"),
])
def test_generation_defaults_refuse_unknown_keys_and_bad_values(values, needle):
    with pytest.raises(FrontendError) as info:
        GenerationDefaults.from_mapping(values, source="core.json")
    assert str(info.value).startswith("core.json: ") and needle in str(info.value), str(info.value)
    assert info.value.param == next(iter(values))


# -- --generation-config ---------------------------------------------------------------------------

def _parse(argv: list[str]):
    import argparse
    parser = argparse.ArgumentParser()
    add_server_arguments(parser)
    return parser.parse_args(argv)


def test_generation_config_from_flag_environment_and_file(tmp_path):
    assert load_server_config(_parse([]), {}).generation_config == "model"
    path = tmp_path / "flare.toml"
    path.write_text('generation_config = "none"\n')
    assert load_server_config(_parse(["--config", str(path)]), {}).generation_config == "none"
    assert load_server_config(_parse([]), {"FLARE_GENERATION_CONFIG": "none"}).generation_config == "none"
    assert load_server_config(_parse(["--generation-config", "model"]),
                              {"FLARE_GENERATION_CONFIG": "none"}).generation_config == "model"
    with pytest.raises(ConfigError, match="generation_config must be one of model, none, got 'vllm'"):
        load_server_config(_parse(["--generation-config", "vllm"]), {})


def test_bad_generation_config_stops_flare_serve_in_one_line():
    run = subprocess.run([*FLARE_SERVE, "--generation-config", "auto", "--port", "0"], capture_output=True,
                         text=True, timeout=120, cwd=REPO)
    assert run.returncode == 2 and "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and "generation_config must be one of model, none" in lines[0], run.stderr


# -- the fake engine: what reaches the engine ----------------------------------------------------------

def _fake_server(generation_config: str):
    engine = FakeEngine(FakeEngineConfig(tokens_per_s=0, generation=MODEL))
    seen: list[SamplingParams] = []
    submit = engine.submit

    def recording_submit(prompt, params, sink, grammar=None):
        seen.append(params)
        return submit(prompt, params, sink, grammar)

    engine.submit = recording_submit
    session = Server.start(engine, ServerConfig(port=0, generation_config=generation_config))
    return Served("fake", session.base_url, session=session), seen


def test_fake_server_applies_the_model_defaults_unless_generation_config_none():
    served, seen = _fake_server("model")
    try:
        card = get_json(served, "/v1/models")[1]["data"][0]
        assert card["generation_config"] == "model" and card["generation_defaults"] == MODEL.to_json()
        assert post_json(served, "/v1/chat/completions", {"messages": USER})[0] == 200
        assert post_json(served, "/v1/completions", {"prompt": "hi", "temperature": 0.7, "top_p": None})[0] == 200
        status, payload = post_json(served, "/v1/completions", {"prompt": "x" * 4090, "max_tokens": 64})
        assert status == 400 and payload["error"]["param"] == "max_tokens"
        assert post_json(served, "/v1/completions", {"prompt": "x" * 4090, "ignore_eos": True})[0] == 200
    finally:
        served.stop()
    model, override, clamped = (_sampling(p) for p in seen)
    assert model == {"temperature": 0.2, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "repetition_penalty": 1.1,
                     "max_tokens": 64}
    assert override == {**model, "temperature": 0.7, "max_tokens": 16}  # a completion: OpenAI's 16
    assert clamped["max_tokens"] == 6  # 4096 - 4090

    served, seen = _fake_server("none")
    try:
        card = get_json(served, "/v1/models")[1]["data"][0]
        assert card["generation_config"] == "none" and card["generation_defaults"] == {}
        assert post_json(served, "/v1/completions", {"prompt": "hi"})[0] == 200
    finally:
        served.stop()
    assert _sampling(seen[0]) == {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "min_p": 0.0,
                                  "repetition_penalty": 1.0, "max_tokens": 16}


# -- the demo server (SmolLM2-135M-Instruct) -----------------------------------------------------------

@pytest.fixture(scope="module")
def demo() -> Served:
    served = start_subprocess([*FLARE_SERVE, "--host", "127.0.0.1", "--port", "0"], kind="demo")
    yield served
    served.stop()


@pytest.fixture(scope="module")
def demo_none() -> Served:
    served = start_subprocess([*FLARE_SERVE, "--host", "127.0.0.1", "--port", "0", "--generation-config", "none"],
                              kind="demo")
    yield served
    served.stop()


POEM = [{"role": "user", "content": "Write a poem about the sea."}]
SEEDS = (1, 2, 3)


def _chat_text(served: Served, **fields) -> str:
    status, payload = post_json(served, "/v1/chat/completions", {"messages": POEM, "max_tokens": 16, **fields})
    assert status == 200, payload
    return payload["choices"][0]["message"]["content"]


@needs_demo
def test_demo_models_card_shows_smollm2_sampling(demo):
    card = get_json(demo, "/v1/models")[1]["data"][0]
    assert card["generation_config"] == "model"
    assert card["generation_defaults"] == {"temperature": 0.2, "top_p": 0.9} == dict(DEMO_GENERATION)
    assert any("request defaults from the model's generation config: temperature=0.2, top_p=0.9" in line
               for line in demo.stderr_lines)


@needs_demo
def test_demo_requests_sample_with_the_model_defaults(demo):
    # A seeded request samples the same tokens for the same settings: leaving the settings out
    # (or sending null) must be sampling with SmolLM2's, and a request's own values must win.
    for seed in SEEDS:
        default = _chat_text(demo, seed=seed)
        assert default == _chat_text(demo, seed=seed, temperature=0.2, top_p=0.9)
        assert default == _chat_text(demo, seed=seed, temperature=None, top_p=None)
    hot = [_chat_text(demo, seed=seed, temperature=1.0, top_p=1.0) for seed in SEEDS]
    assert hot != [_chat_text(demo, seed=seed) for seed in SEEDS]


@needs_demo
def test_demo_with_generation_config_none_samples_with_openais_defaults(demo_none):
    card = get_json(demo_none, "/v1/models")[1]["data"][0]
    assert card["generation_config"] == "none" and card["generation_defaults"] == {}
    for seed in SEEDS:
        assert _chat_text(demo_none, seed=seed) == _chat_text(demo_none, seed=seed, temperature=1.0, top_p=1.0)


def readme_quick_start() -> tuple[str, dict, dict]:
    """(path, headers, body) of the curl command in README.md's quick start."""
    text = (REPO / "README.md").read_text(encoding="utf-8")
    section = text.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"```bash\n(.*?)```", section, re.S).group(1)
    command = next(line for line in block.replace("\\\n", " ").splitlines() if line.lstrip().startswith("curl"))
    argv = shlex.split(command)
    url = next(arg for arg in argv[1:] if "/v1/" in arg)
    headers = dict(h.split(": ", 1) for flag, h in zip(argv, argv[1:]) if flag == "-H")
    headers = {name.title(): value for name, value in headers.items()}
    body = json.loads(next(value for flag, value in zip(argv, argv[1:]) if flag in ("-d", "--data")))
    return url[url.index("/v1/"):], headers, body


@needs_demo
def test_readme_quick_start_answers_within_10_s(demo):
    path, headers, body = readme_quick_start()
    assert path == "/v1/chat/completions" and "temperature" not in body  # the demo's defaults decide
    started = time.monotonic()
    status, _, payload = request(demo, "POST", path, raw_body=json.dumps(body).encode(), headers=headers,
                                 timeout=10)
    elapsed = time.monotonic() - started
    assert status == 200 and elapsed < 10, (status, elapsed)
    answer = json.loads(payload)["choices"][0]["message"]["content"]
    assert "Paris" in answer, answer


# -- a core exported with --generation, on the real engine -------------------------------------------

CONTEXT = 256


@pytest.fixture(scope="module")
def small_core(tmp_path_factory) -> Path:
    """The SmolLM2 GGUF exported by the CLI with a 256-token context, greedy and 16 tokens by default."""
    out = tmp_path_factory.mktemp("generation") / "core"
    run = subprocess.run([sys.executable, "-m", "flare.cli", "export", str(fixtures.smollm2_gguf()), "-o", str(out),
                          "--context", str(CONTEXT), "--prefill-chunk-size", "128", "--max-active", "2",
                          "--dtype", "float32", "--generation", "max_new_tokens=16", "--generation", "temperature=0",
                          "--generation", "top_p=0.95"],
                         capture_output=True, text=True, timeout=600, cwd=REPO)
    assert run.returncode == 0, run.stderr
    return out


@pytest.fixture(scope="module")
def small(small_core) -> Served:
    served = start_subprocess([*FLARE_SERVE, str(small_core), "--host", "127.0.0.1", "--port", "0"], kind="core")
    yield served
    served.stop()


def _complete(served: Served, prompt, **fields) -> tuple[int, dict]:
    return post_json(served, "/v1/completions", {"prompt": prompt, **fields})


@needs_demo
def test_flare_info_prints_the_exported_defaults(small_core):
    run = subprocess.run([sys.executable, "-m", "flare.cli", "info", "--no-verify", str(small_core)],
                         capture_output=True, text=True, timeout=120, cwd=REPO)
    assert run.returncode == 0, run.stderr
    assert "generation defaults: temperature 0.0, top_p 0.95, max_new_tokens 16" in run.stdout, run.stdout


@needs_demo
def test_exported_max_new_tokens_is_the_clamped_default_on_the_real_engine(small):
    card = get_json(small, "/v1/models")[1]["data"][0]
    assert card["generation_defaults"] == {"temperature": 0.0, "top_p": 0.95, "max_new_tokens": 16}
    status, payload = _complete(small, "The sea", ignore_eos=True)
    assert status == 200 and payload["usage"]["completion_tokens"] == 16, payload
    assert payload["choices"][0]["finish_reason"] == "length"
    long_prompt = [1070] * (CONTEXT - 6)  # leaves room for 6 tokens
    status, payload = _complete(small, long_prompt, ignore_eos=True)
    assert status == 200 and payload["usage"]["completion_tokens"] == 6, payload
    status, payload = _complete(small, long_prompt, max_tokens=16)
    assert status == 400 and payload["error"]["code"] == "context_length_exceeded", payload
    assert payload["error"]["param"] == "max_tokens"
    status, payload = _complete(small, [1070] * CONTEXT)
    assert status == 400 and payload["error"]["param"] == "prompt", payload
    assert _complete(small, "The sea", ignore_eos=True, max_tokens=3)[1]["usage"]["completion_tokens"] == 3


@needs_demo
def test_exported_temperature_is_the_default_on_the_real_engine(small):
    def text(**fields) -> str:
        status, payload = _complete(small, "Once upon a time", max_tokens=12, **fields)
        assert status == 200, payload
        return payload["choices"][0]["text"]

    greedy = text(temperature=0)
    assert [text(seed=seed) for seed in SEEDS] == [greedy] * len(SEEDS)  # the default is greedy
    assert text(temperature=None, seed=1) == greedy
    assert any(text(temperature=1.0, top_p=1.0, seed=seed) != greedy for seed in SEEDS)  # the request's wins
