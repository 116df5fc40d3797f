"""Structured output on the demo core (CPU executor): masks in the real sampling step.

Each test runs the real model; the outputs are checked with the grammar's own meaning
(jsonschema for schemas, re.fullmatch for regexes) and against llguidance's matcher.
"""

from __future__ import annotations

import json
import math
import re
import threading
import time

import jsonschema
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flare.config import EngineConfig
from flare.core.embedded import demo_core
from flare.engine.model import NativeModel
from flare.errors import GrammarError
from flare.request import ErrorEvent, FinishEvent, GrammarRequest, PreparedPrompt, SamplingParams, TokenEvent

CAT = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20},
                                        "age": {"type": "integer", "minimum": 0, "maximum": 30}},
       "required": ["name", "age"], "additionalProperties": False}


@pytest.fixture(scope="module")
def model():
    m = NativeModel.load(demo_core(), EngineConfig(device="cpu", kv_memory_bytes=768 << 20))
    yield m
    m.close()


def chat(model, question: str) -> PreparedPrompt:
    text = f"<|im_start|>user\n{question}<|im_end|>\n<|im_start|>assistant\n"
    return PreparedPrompt(np.asarray(model.tokenizer.encode(text, add_special_tokens=False).ids, np.int32))


def run(model, prompt, grammar=None, **kw):
    """(text, token ids, logprobs, finish) of one request."""
    params = SamplingParams(**{"temperature": 0.0, "max_tokens": 64, **kw, "grammar": grammar})
    events = list(model.generate(prompt, params, timeout=300))
    finish = events[-1]
    assert isinstance(finish, FinishEvent), finish
    tokens = [e for e in events if isinstance(e, TokenEvent)]
    logprobs = [lp for e in tokens for lp in (e.logprobs or ())]
    return "".join(e.text for e in tokens), [t for e in tokens for t in e.token_ids], logprobs, finish


def accepted(model, grammar: GrammarRequest, token_ids) -> bool:
    """Whether the grammar's own matcher accepts every token the model produced."""
    return model.grammars.compile(grammar).matcher().advance(token_ids) is None


def test_json_schema_output_validates_and_ends_with_the_grammar(model):
    grammar = GrammarRequest("json_schema", CAT)
    text, ids, _, finish = run(model, chat(model, "Describe a cat as JSON."), grammar)
    jsonschema.validate(json.loads(text), CAT)
    assert finish.reason == "stop" and finish.stop is None  # the grammar ended it, not EOS
    assert finish.usage.completion_tokens == len(ids) < 64
    free, _, _, _ = run(model, chat(model, "Describe a cat as JSON."))
    assert not free.startswith("{")  # unconstrained, this model answers otherwise: the mask did it


def test_json_object_choice_and_regex(model):
    prompt = chat(model, "Is the sky blue? Answer.")
    text, _, _, finish = run(model, prompt, GrammarRequest("json_object"), temperature=1.0, seed=7)
    if finish.reason == "stop":
        assert isinstance(json.loads(text), dict)
    text, _, _, finish = run(model, prompt, GrammarRequest("choice", ("yes", "no", "maybe so")))
    assert text in ("yes", "no", "maybe so") and finish.reason == "stop"
    pattern = r"[0-9]{3}-[a-z]{2,4}"
    text, _, _, finish = run(model, prompt, GrammarRequest("regex", pattern), temperature=1.0, seed=3)
    assert finish.reason == "stop" and re.fullmatch(pattern, text), text


def test_lark_and_gbnf_grammars(model):
    prompt = chat(model, "Count.")
    lark = GrammarRequest("grammar", 'start: item ("," item)*\nitem: /[a-c]/')
    text, ids, _, finish = run(model, prompt, lark, max_tokens=12)
    assert accepted(model, lark, ids) and re.fullmatch(r"[a-c](,[a-c])*,?", text), text
    if finish.reason == "stop":
        assert re.fullmatch(r"[a-c](,[a-c])*", text), text
    text, _, _, finish = run(model, prompt, GrammarRequest("grammar", 'root ::= "up" | "down"'))
    assert text in ("up", "down") and finish.reason == "stop"


def test_max_tokens_cuts_a_constrained_response(model):
    grammar = GrammarRequest("json_schema", CAT)
    text, ids, _, finish = run(model, chat(model, "Describe a cat as JSON."), grammar, max_tokens=3)
    assert finish.reason == "length" and len(ids) == 3 and text.startswith("{")
    assert accepted(model, grammar, ids)


def test_stop_strings_apply_to_constrained_text(model):
    text, _, _, finish = run(model, chat(model, "Describe a cat as JSON."), GrammarRequest("json_schema", CAT),
                             stop=["age"])
    assert finish.reason == "stop" and finish.stop == "age"
    assert text.startswith('{"name": ') and "age" not in text


def test_logprobs_report_the_constrained_distribution(model):
    text, ids, logprobs, _ = run(model, chat(model, "Pick a letter."), GrammarRequest("choice", ("A", "B")),
                                 logprobs=True, top_logprobs=5)
    assert text in ("A", "B") and len(logprobs) == len(ids) == 1
    top = logprobs[0].top
    # only the two allowed tokens have mass, and it is renormalised over them
    assert {model.tokenizer.decode([t]) for t, _ in top} == {"A", "B"}
    assert math.isclose(sum(math.exp(lp) for _, lp in top), 1.0, rel_tol=1e-4)
    assert logprobs[0].logprob == max(lp for _, lp in top)


def test_a_prefix_cache_hit_samples_under_the_mask(model):
    prompt = chat(model, "Describe a tabby cat as JSON, please.")
    grammar = GrammarRequest("json_schema", CAT)
    first = run(model, prompt, grammar)
    second = run(model, prompt, grammar)  # the whole prompt is cached: the first token comes from RESUME
    assert second[3].usage.cached_tokens == len(prompt)
    assert second[0] == first[0] and second[3].reason == "stop"
    jsonschema.validate(json.loads(second[0]), CAT)


def test_free_rows_beside_constrained_rows_keep_their_tokens(model):
    free_prompts = [chat(model, q) for q in ("Tell me about Paris.", "What is rain?")]
    alone = [run(model, p, max_tokens=24)[1] for p in free_prompts]
    results: dict[int, list] = {}
    done = threading.Event()
    lock = threading.Lock()
    jobs = [(i, p, None) for i, p in enumerate(free_prompts)] + \
           [(2 + i, chat(model, q), GrammarRequest("json_schema", CAT)) for i, q in enumerate(("A cat?", "A dog?"))]

    def sink_for(key):
        events = []

        def sink(event):
            events.append(event)
            if isinstance(event, (FinishEvent, ErrorEvent)):
                with lock:
                    results[key] = events
                    if len(results) == len(jobs):
                        done.set()
        return sink

    for key, prompt, grammar in jobs:
        matcher = model.grammars.compile(grammar).matcher() if grammar else None
        model.submit(prompt, SamplingParams(temperature=0.0, max_tokens=24, grammar=grammar), sink_for(key), matcher)
    assert done.wait(300)
    for i in range(2):
        assert [t for e in results[i] if isinstance(e, TokenEvent) for t in e.token_ids] == alone[i]
    for key in (2, 3):
        text = "".join(e.text for e in results[key] if isinstance(e, TokenEvent))
        finish = results[key][-1]
        assert isinstance(finish, FinishEvent)
        if finish.reason == "stop":
            jsonschema.validate(json.loads(text), CAT)
    stats = model.runtime.stats()
    # pipelined: most constrained steps went in while the step before them was in flight
    assert stats.grammar_steps > 0 and stats.grammar_held_steps > stats.grammar_steps // 2


def test_a_cancelled_constrained_request_frees_its_slot(model):
    events, first = [], threading.Event()

    def sink(event):
        events.append(event)
        if isinstance(event, TokenEvent):
            first.set()

    grammar = GrammarRequest("json_object")
    prompt = chat(model, "Write a long JSON document about everything.")
    ticket = model.submit(prompt, SamplingParams(temperature=1.0, seed=1, max_tokens=200, grammar=grammar), sink,
                          model.grammars.compile(grammar).matcher())
    assert first.wait(120)
    ticket.cancel()
    text, _, _, finish = run(model, chat(model, "Pick."), GrammarRequest("choice", ("x", "y")))
    assert text in ("x", "y")
    deadline = time.monotonic() + 30
    while model.runtime.stats().slots_live and time.monotonic() < deadline:
        time.sleep(0.01)  # the last request's slot retires after its terminal event
    stats = model.runtime.stats()
    assert stats.slots_live == 0 and stats.requests_cancelled >= 1 and not model.runtime._constrained


def test_a_constraint_that_cannot_be_enforced_is_a_grammar_error(model):
    for request, words in ((GrammarRequest("json_schema", {"type": "array", "uniqueItems": True}, "format"),
                            "uniqueItems"),
                           (GrammarRequest("regex", "(unclosed", "structured_outputs.regex"), "unclosed group"),
                           (GrammarRequest("grammar", "start: missing_rule", "structured_outputs.grammar"),
                            "missing_rule")):
        with pytest.raises(GrammarError) as info:
            model.grammars.compile(request)
        assert info.value.status == 400 and words in str(info.value) and request.param in str(info.value)
    stats = model.grammars.stats()
    assert stats.compile_errors >= 3


# -- the property: every completed output validates against its schema -------------------

_leaf = st.one_of(
    st.builds(lambda lo, span: {"type": "integer", "minimum": lo, "maximum": lo + span},
              st.integers(-50, 50), st.integers(0, 100)),
    st.builds(lambda lo: {"type": "number", "exclusiveMinimum": lo, "maximum": lo + 10}, st.integers(-5, 5)),
    st.just({"type": "boolean"}),
    st.builds(lambda n: {"type": "string", "maxLength": n}, st.integers(1, 12)),
    st.sampled_from([{"type": "string", "format": f} for f in ("date", "time", "email", "uuid")]),
    st.builds(lambda values: {"enum": values}, st.lists(st.sampled_from(["red", "green", 3, None, True]),
                                                        min_size=1, max_size=3, unique=True)),
)


def _objects(children):
    def build(props, required):
        names = list(props)
        return {"type": "object", "properties": props, "required": [n for n, r in zip(names, required) if r],
                "additionalProperties": False}
    return st.dictionaries(st.sampled_from(["id", "name", "tags", "size", "kind", "meta"]), children,
                           min_size=1, max_size=3).flatmap(
        lambda props: st.lists(st.booleans(), min_size=len(props), max_size=len(props)).map(
            lambda required: build(props, required)))


_schemas = st.recursive(_leaf, lambda children: st.one_of(
    _objects(children),
    st.builds(lambda items, n: {"type": "array", "items": items, "maxItems": n}, children, st.integers(1, 3))),
    max_leaves=5)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_completed_outputs_validate_against_generated_schemas(model, temperature):
    prompt = chat(model, "Reply with JSON.")
    seen = {"stop": 0}

    @settings(max_examples=10, deadline=None, derandomize=True,
              suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
    @given(schema=_schemas, seed=st.integers(0, 2**31 - 1))
    def check(schema, seed):
        grammar = GrammarRequest("json_schema", schema)
        text, ids, _, finish = run(model, prompt, grammar, temperature=temperature, seed=seed, max_tokens=80)
        assert accepted(model, grammar, ids), (schema, text)
        if finish.reason == "stop":
            seen["stop"] += 1
            jsonschema.validate(json.loads(text), schema, format_checker=jsonschema.FormatChecker())
        else:
            assert finish.reason == "length"

    check()
    assert seen["stop"] >= 5  # most complete within the budget: the property is not vacuous
