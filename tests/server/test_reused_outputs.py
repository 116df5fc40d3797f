"""A text prompt that carries a completion back takes the tokens it was generated with
(frontend/continuations.py), on the real demo server through /v1/completions.

The chat side (a grammar-forced tool call sent back as the next turn) is in
test_tool_calls.py; this is the other way in, ``NativeEngine.prepare_text``.
"""

from __future__ import annotations

import pytest
from server_harness import launch, metric, post_json

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 24},
                                           "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
          "required": ["city", "unit"], "additionalProperties": False}
LEAD = ("You are a weather service. Answer every question with one JSON object naming the city and the unit "
        "of temperature the user prefers. ") * 3  # long enough for the prefix cache's 64-token pages
CITIES = ("Rome", "Madrid", "Lisbon", "Cairo", "Sydney", "Toronto", "Moscow", "Dublin")


@pytest.fixture(scope="module")
def served():
    server = launch("demo")
    yield server
    server.stop()


def test_a_completion_sent_back_is_read_as_it_was_generated(served):
    """Sampled JSON is sometimes spelled with tokens the tokenizer would not choose (with
    this seed, Rome's is). Sent back as the next prompt, every completion is covered by the
    prefix cache whole, and the spliced ones are counted."""
    spliced = 0
    for city in CITIES:
        prompt = LEAD + f"Question: what is the weather in {city}?\nJSON:\n"
        before = metric(served, "flare_outputs_carried_back_total")
        status, first = post_json(served, "/v1/completions", {
            "model": served.model, "prompt": prompt, "max_tokens": 40, "temperature": 0.9, "seed": 2,
            "structured_outputs": {"json": SCHEMA}})
        assert status == 200, first
        text = first["choices"][0]["text"]
        status, second = post_json(served, "/v1/completions", {
            "model": served.model, "prompt": prompt + text + "\n", "max_tokens": 2, "temperature": 0})
        assert status == 200, second
        covered = first["usage"]["prompt_tokens"] + first["usage"]["completion_tokens"]
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= covered - 1, (city, text)
        spliced += metric(served, "flare_outputs_carried_back_total") > before
    assert spliced, "no completion was spelled off the tokenizer's way: nothing was carried back"
    assert metric(served, "flare_reused_output_tokens_total") > 0
    assert metric(served, "flare_outputs_recorded") >= 2 * len(CITIES)
