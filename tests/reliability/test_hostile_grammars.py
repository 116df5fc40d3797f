"""Hostile structured-output constraints: shapes, compile bombs and engine refusals.

Every family's constraint field gets hostile JSON values (the sweep of hostile.py) and a
list of constraints built to be slow or invalid: each answer is a 4xx in the family's
shape or a clean answer, never a 500; /health stays fast while they compile (grammars
build on frontend workers with the GIL released); afterwards the server is idle, its log
clean and its grammar cache within its bound.
"""

from __future__ import annotations

import concurrent.futures
import json

from hostile import FRAGMENTS, HealthProbe, dump, place
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from server_harness import metrics, wait_idle
from test_hostile_families import _check, _post
from test_hostile_requests import assert_log_clean
from test_soak import HEALTH_LIMIT_S

HI = [{"role": "user", "content": "Hi"}]


def _chain(depth: int) -> dict:
    schema: dict = {"type": "string"}
    for _ in range(depth):
        schema = {"type": "object", "properties": {"a": schema, "b": {"type": "integer"}}, "required": ["a"]}
    return schema


def _chat(model: str, **fields) -> dict:
    return {"model": model, "messages": HI, "max_tokens": 2, "temperature": 0, **fields}


def _cases(model: str) -> list[tuple[str, str, dict]]:
    """(family name for _check, route, body) of constraints made to be slow or refused."""
    schemas = [_chain(200), {"not": {"type": "string"}}, {"if": {"type": "string"}, "then": {"minLength": 2}},
               {"type": "array", "uniqueItems": True}, {"$ref": "#/$defs/missing"}, {"$ref": "#"},
               {"type": "nonsense"}, {"type": "integer", "minimum": "x"}, {"type": "string", "pattern": "("},
               {"type": "string", "maxLength": 10**18}, {"enum": [f"value-{i}" for i in range(4000)]},
               {"anyOf": [_chain(30), {"type": "number"}] * 20}, {"type": "object", "required": ["a"] * 500}]
    regexes = ["(a{1000}){1000}", "(?=a)b", "\\p{NoSuchClass}", "a" * 60000, "(x+x+)+y", "[\\d-z]", "\\"]
    grammars = ["start: start", "start: %import common.WORD", "%llguidance {}\nstart: /[a/", 'root ::= "a', "x" * 1000,
                "start: a\na: a a | \"b\""]
    cases = [("chat", "/v1/chat/completions", _chat(model, response_format={
        "type": "json_schema", "json_schema": {"name": "h", "schema": schema}})) for schema in schemas]
    cases += [("chat", "/v1/chat/completions", _chat(model, structured_outputs={"regex": r})) for r in regexes]
    cases += [("chat", "/v1/chat/completions", _chat(model, structured_outputs={"grammar": g})) for g in grammars]
    odd_choices = ["\u0000", "a\u202eb", "x" * 60000]
    cases += [("chat", "/v1/chat/completions", _chat(model, structured_outputs={"choice": odd_choices})),
              ("ollama_chat", "/api/chat", {"model": model, "messages": HI, "stream": False, "format": schemas[1],
                                            "options": {"num_predict": 2}}),
              ("messages", "/v1/messages", {"model": model, "max_tokens": 2, "messages": HI, "output_config": {
                  "format": {"type": "json_schema", "schema": schemas[0]}}}),
              ("responses", "/v1/responses", {"model": model, "input": "Hi", "max_output_tokens": 2, "store": False,
                                              "text": {"format": {"type": "json_schema", "name": "h",
                                                                  "schema": schemas[3]}}})]
    return cases


def test_constraints_built_to_be_slow_or_invalid(served):
    probe = HealthProbe(served.host_port)
    cases = _cases(served.model) * 2  # twice: the second round meets the compiled-grammar cache
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda case: (case[0], *_post(served, case[1], json.dumps(case[2]).encode())), cases))
    worst, count = probe.stop()
    for name, status, payload in answers:
        _check(name, status, payload)
    assert sum(status == 400 for _, status, _ in answers) >= len(cases) // 2
    assert count > 10 and worst < HEALTH_LIMIT_S, f"/health took {worst * 1e3:.1f} ms while grammars compiled"
    sample = wait_idle(served)
    assert sample.get("flare_grammars_cached", 0) <= 256
    assert_log_clean(served)


_PATHS = {
    "chat": ("/v1/chat/completions", _chat("m"), (("response_format",), ("response_format", "type"),
                                                  ("response_format", "json_schema"),
                                                  ("response_format", "json_schema", "schema"),
                                                  ("response_format", "json_schema", "name"),
                                                  ("structured_outputs",), ("structured_outputs", "json"),
                                                  ("structured_outputs", "regex"), ("structured_outputs", "choice"),
                                                  ("structured_outputs", "grammar"),
                                                  ("structured_outputs", "json_object"))),
    "ollama_chat": ("/api/chat", {"model": "m", "messages": HI, "stream": False, "options": {"num_predict": 2}},
                    (("format",),)),
    "messages": ("/v1/messages", {"model": "m", "max_tokens": 2, "messages": HI},
                 (("output_config", "format"), ("output_config", "format", "schema"), ("output_format",))),
    "responses": ("/v1/responses", {"model": "m", "input": "Hi", "max_output_tokens": 2, "store": False},
                  (("text", "format"), ("text", "format", "schema"), ("text", "format", "type"))),
}
values = st.one_of(st.sampled_from(FRAGMENTS), st.lists(st.sampled_from(FRAGMENTS), min_size=1, max_size=3))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), value=values)
def test_hostile_values_in_constraint_fields(served, data, value):
    name = data.draw(st.sampled_from(tuple(_PATHS)))
    route, body, paths = _PATHS[name]
    body = json.loads(json.dumps(body).replace('"m"', json.dumps(served.model)))
    status, payload = _post(served, route, dump(place(body, data.draw(st.sampled_from(paths)), value)).encode())
    _check(name, status, payload)


def test_the_server_is_clean_after_the_constraint_sweep(served):
    sample = wait_idle(served)
    assert metrics(served).get("flare_grammars_cached", 0) <= 256 and sample
    assert_log_clean(served)
