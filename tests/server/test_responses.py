"""The OpenAI Responses routes through real sockets: the official SDK and raw requests.

Every test runs on the fake engine and on a real ``flare-serve`` over the demo core
(conftest.py); fault injection and exact output are fake only.
"""

from __future__ import annotations

import json
import socket
import time

import openai
import pytest
from server_harness import assert_error, get_json, metric, post_json, request

from flare.frontend.parsers import (
    ContentDelta,
    OutputParser,
    ReasoningDelta,
    ToolCallArguments,
    ToolCallEnd,
    ToolCallStart,
    registry,
)
from flare.server.api.responses.items import input_messages
from flare.server.api.responses.store import ResponseStore, StoredResponse

INSTRUCTIONS = "You are terse."
QUESTION = "Say hello to Flare"
# Long enough that the first turn publishes prefix checkpoints a second turn can reuse.
BACKGROUND = "Background. " * 40


def _client(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key=server.api_key or "unused", max_retries=0)


def _create(server, **fields):
    return _client(server).responses.create(model=server.model, **fields)


# -- one response ----------------------------------------------------------------------

def test_create_returns_a_response_object(server):
    response = _create(server, input=QUESTION, instructions=INSTRUCTIONS, max_output_tokens=32, temperature=0)
    assert response.object == "response" and response.id.startswith("resp_") and response.model == server.model
    assert response.status in ("completed", "incomplete") and response.error is None
    message = response.output[0]
    assert message.type == "message" and message.role == "assistant" and message.id.startswith("msg_")
    assert message.content[0].type == "output_text" and response.output_text == message.content[0].text
    assert response.output_text
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 32
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.input_tokens_details.cached_tokens >= 0
    assert response.temperature == 0 and response.store is True and response.instructions == INSTRUCTIONS
    if server.kind == "fake":
        assert response.output_text == f"You said: {QUESTION}" and response.status == "completed"


def test_max_output_tokens_makes_it_incomplete(server):
    response = _create(server, input="Tell me a long story about the sea", max_output_tokens=3)
    assert response.status == "incomplete" and response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 3 and response.output[-1].status == "incomplete"


def test_streaming_events_match_the_whole_response(server):
    fields = {"input": QUESTION, "instructions": INSTRUCTIONS, "max_output_tokens": 24, "temperature": 0}
    whole = _create(server, **fields)
    events = list(_create(server, stream=True, **fields))
    assert [event.sequence_number for event in events] == list(range(len(events)))
    kinds = [event.type for event in events]
    deltas = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert kinds[:4] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added"]
    assert kinds[4:4 + len(deltas)] == ["response.output_text.delta"] * len(deltas)
    assert kinds[4 + len(deltas):] == ["response.output_text.done", "response.content_part.done",
                                       "response.output_item.done", f"response.{whole.status}"]
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    final = events[-1].response
    assert "".join(deltas) == events[-4].text == final.output_text == whole.output_text
    assert final.id == events[0].response.id != whole.id
    assert final.usage.output_tokens == whole.usage.output_tokens
    assert events[-2].item.id == final.output[0].id == events[2].item.id


def test_the_sdk_stream_helper_assembles_the_response(server):
    with _client(server).responses.stream(model=server.model, input=QUESTION, max_output_tokens=64,
                                          temperature=0) as stream:
        events = list(stream)
        # The helper assembles completed responses only; an incomplete one ends the stream as it is.
        final = stream.get_final_response() if events[-1].type == "response.completed" else events[-1].response
    texts = [event.delta for event in events if event.type == "response.output_text.delta"]
    assert final.output_text == "".join(texts) and final.output_text
    assert events[-1].type == "response.completed" or server.kind != "fake"


def test_output_logprobs(server):
    response = _create(server, input=QUESTION, max_output_tokens=4, temperature=0, top_logprobs=2,
                       include=["message.output_text.logprobs"])
    logprobs = response.output[0].content[0].logprobs
    assert 1 <= len(logprobs) <= 4
    for entry in logprobs:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 2
        assert bytes(entry.bytes).decode("utf-8", "replace") == entry.token
    events = list(_create(server, input=QUESTION, max_output_tokens=4, temperature=0, top_logprobs=2,
                          include=["message.output_text.logprobs"], stream=True))
    streamed = [e for event in events if event.type == "response.output_text.delta" for e in event.logprobs]
    assert [e.token for e in streamed] == [e.token for e in logprobs]


# -- conversations ----------------------------------------------------------------------

def test_previous_response_id_continues_and_reuses_the_prefix(server):
    client = _client(server)
    first = client.responses.create(model=server.model, instructions=BACKGROUND, input=QUESTION,
                                    max_output_tokens=8, temperature=0)
    second = client.responses.create(model=server.model, instructions=BACKGROUND, input="And once more?",
                                     previous_response_id=first.id, max_output_tokens=32, temperature=0)
    assert second.previous_response_id == first.id and second.status in ("completed", "incomplete")
    # The second prompt holds the first turn (input and output) before the new input ...
    assert second.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 2
    # ... and reuses its prefix from the cache.
    assert second.usage.input_tokens_details.cached_tokens > 0
    if server.kind == "fake":
        assert second.output_text == "You said: And once more?"
    stored = client.responses.retrieve(first.id)
    assert stored.id == first.id and stored.output_text == first.output_text and stored.usage == first.usage
    # A continuation of a continuation carries both earlier turns.
    third = client.responses.create(model=server.model, instructions=BACKGROUND, input="Thanks",
                                    previous_response_id=second.id, max_output_tokens=4)
    assert third.usage.input_tokens > second.usage.input_tokens


def test_streamed_responses_are_stored_too(server):
    events = list(_create(server, input=QUESTION, max_output_tokens=8, stream=True))
    final = events[-1].response
    stored = _client(server).responses.retrieve(final.id)
    assert stored.output_text == final.output_text and stored.status == final.status


def test_output_items_passed_back_as_input(server):
    client = _client(server)
    first = client.responses.create(model=server.model, input=QUESTION, max_output_tokens=8, store=False)
    second = client.responses.create(model=server.model, max_output_tokens=32, input=[
        {"role": "user", "content": QUESTION}, *[item.model_dump(exclude_none=True) for item in first.output],
        {"role": "user", "content": [{"type": "input_text", "text": "More"}]}])
    assert second.output_text
    if server.kind == "fake":
        assert second.output_text == "You said: More"


def test_function_calls_and_their_outputs(server):
    tools = [{"type": "function", "name": "weather", "description": "Weather by city",
              "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}]
    response = _create(server, tools=tools, max_output_tokens=32, input=[
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Weather in Paris?"}]},
        {"type": "function_call", "call_id": "call_1", "name": "weather", "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_1", "output": "18 C, sunny"},
        {"role": "user", "content": "Thanks"}])
    assert response.tools[0].name == "weather" and response.tool_choice == "auto"
    if server.kind == "fake":
        assert response.output_text == "You said: Thanks"


def test_store_false_is_not_kept_and_delete_forgets(server):
    client = _client(server)
    unstored = client.responses.create(model=server.model, input=QUESTION, max_output_tokens=4, store=False)
    assert unstored.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(unstored.id)
    stored = client.responses.create(model=server.model, input=QUESTION, max_output_tokens=4)
    client.responses.delete(stored.id)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(stored.id)
    status, payload = get_json(server, f"/v1/responses/{stored.id}")
    assert assert_error(status, payload, 404, stored.id)["code"] == "not_found"


def test_store_size_is_exported(server):
    _create(server, input=QUESTION, max_output_tokens=2)
    assert metric(server, "flare_responses_stored") >= 1 and metric(server, "flare_responses_stored_chars") > 0
    assert metric(server, "flare_responses_evicted_total") >= 0


# -- errors -------------------------------------------------------------------------------

def test_sdk_exceptions(server, launcher):
    client = _client(server)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model="no-such-model", input=QUESTION)
    assert "no-such-model" in str(info.value)
    with pytest.raises(openai.NotFoundError) as info:
        client.responses.create(model=server.model, input=QUESTION, previous_response_id="resp_unknown")
    assert "resp_unknown" in str(info.value)
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve("resp_unknown")
    with pytest.raises(openai.BadRequestError) as info:
        client.responses.create(model=server.model, input=QUESTION, text={"format": {"type": "json_schema"}})
    assert "text.format.name" in str(info.value)


def test_context_overflow_names_counts_and_hint(launcher):
    served = launcher(context_hint="raise it with flare export --context", context_len=512)
    card_len = get_json(served, "/v1/models")[1]["data"][0]["max_model_len"]
    with pytest.raises(openai.BadRequestError) as info:
        _create(served, input=QUESTION, max_output_tokens=card_len)
    error = info.value.body
    assert error["code"] == "context_length_exceeded" and error["param"] == "max_output_tokens"
    assert f"max_output_tokens of {card_len}" in error["message"]
    assert "raise it with flare export --context" in error["message"]
    status, payload = post_json(served, "/v1/responses", {"model": served.model, "input": "word " * card_len})
    assert assert_error(status, payload, 400, "context of")["param"] == "input"


@pytest.mark.parametrize("body,param", [
    ({"frobnicate": True}, "frobnicate"),
    ({"text": {"format": {"type": "json_schema", "name": "x"}}}, "text.format.schema"),
    ({"text": {"verbosity": "low"}}, "text.verbosity"),
    ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"background": True}, "background"),
    ({"conversation": "conv_1"}, "conversation"),
    ({"prompt": {"id": "pmpt_1"}}, "prompt"),
    ({"include": ["reasoning.encrypted_content"]}, "include"),
    ({"reasoning": {"summary": "auto"}}, "reasoning.summary"),
    ({"reasoning": {"effort": "enormous"}}, "reasoning.effort"),
    ({"truncation": "auto"}, "truncation"),
    ({"service_tier": "flex"}, "service_tier"),
    ({"stream_options": {"include_obfuscation": False}}, "stream_options"),
    ({"stream": True, "stream_options": {"include_obfuscation": True}}, "stream_options.include_obfuscation"),
    ({"temperature": 9}, "temperature"),
    ({"max_output_tokens": 0}, "max_output_tokens"),
    ({"top_logprobs": 21}, "top_logprobs"),
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}, "input[0].content[0].type"),
    ({"input": [{"role": "wizard", "content": "x"}]}, "input[0].role"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "[1]"}]}, "input[0].arguments"),
    ({"input": 7}, "input"),
    ({"input": None}, "input"),
    ({"metadata": {"k": 1}}, "metadata"),
])
def test_refusals_name_the_field(server, body, param):
    status, payload = post_json(server, "/v1/responses", {"model": server.model, "input": QUESTION, **body})
    assert assert_error(status, payload, 400)["param"] == param, payload


def test_accepted_fields_the_sdk_can_send(server):
    response = _create(server, input=QUESTION, max_output_tokens=4, top_p=0.9, parallel_tool_calls=False,
                       tool_choice="none", tools=[], metadata={"run": "7"}, user="u1", safety_identifier="s1",
                       prompt_cache_key="k1", prompt_cache_retention="in_memory", truncation="disabled",
                       service_tier="auto", background=False, reasoning={"effort": "low"},
                       text={"format": {"type": "text"}}, max_tool_calls=2)
    assert response.metadata == {"run": "7"} and response.parallel_tool_calls is False
    assert response.top_p == pytest.approx(0.9) and response.reasoning.effort == "low"


def test_retrieve_refuses_streaming_again_and_input_items_are_not_served(server):
    stored = _create(server, input=QUESTION, max_output_tokens=2)
    status, _, body = request(server, "GET", f"/v1/responses/{stored.id}?stream=true")
    assert_error(status, json.loads(body), 400, "stream")
    status, payload = get_json(server, f"/v1/responses/{stored.id}/input_items")
    assert_error(status, payload, 404, "input_items")


# -- faults and parsers (fake engine) --------------------------------------------------------

@pytest.mark.fake_only("fault injection: the FLARE_FAKE_CRASH marker")
def test_a_failure_mid_stream_ends_with_response_failed(launcher, fake_only):
    # The marker fails the runtime (as a device fault would), so each request gets a fresh server.
    body = {"input": "please FLARE_FAKE_CRASH", "max_output_tokens": 20}
    served = launcher()
    with pytest.raises(openai.InternalServerError) as info:
        _create(served, **body)
    message = info.value.body["message"]
    assert "fake execution failure" in message
    served = launcher()
    events = list(_create(served, stream=True, **body))
    assert [event.type for event in events[-2:]] == ["error", "response.failed"]
    assert events[-2].message == message and events[-2].code == "execution_error"
    failed = events[-1].response
    assert failed.status == "failed" and failed.error.message == message and failed.error.code == "server_error"
    assert failed.output[0].status == "incomplete" and failed.output[0].content[0].text
    assert [event.sequence_number for event in events] == list(range(len(events)))
    with pytest.raises(openai.NotFoundError):
        _client(served).responses.retrieve(failed.id)  # a failed response is not stored


@pytest.mark.fake_only("the fake's echo makes the answer long enough to leave in the middle")
def test_disconnect_mid_stream_cancels(launcher, fake_only):
    served = launcher(max_active=2, tokens_per_s=50)
    host, port = served.host_port
    sock = socket.create_connection((host, port))
    data = json.dumps({"model": served.model, "stream": True, "input": "lorem ipsum " * 40}).encode()
    sock.sendall(b"POST /v1/responses HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    received = b""
    while b"response.output_text.delta" not in received:
        received += sock.recv(65536)
    sock.close()
    deadline = time.monotonic() + 10
    while metric(served, "flare_requests_cancelled_total") < 1 or metric(served, "flare_http_admitted"):
        assert time.monotonic() < deadline, "the request was not cancelled"
        time.sleep(0.02)
    assert metric(served, "flare_http_disconnects_total") >= 1


class ReasonThenCall(OutputParser):
    """Every piece is reasoning; the output ends with one tool call."""

    name = "test-responses-reason-then-call"
    kind = "reasoning"  # served as the reasoning parser: every chat request goes through it

    def __init__(self, opened=False):
        pass

    def feed(self, text):
        return [ReasoningDelta(text)]

    def finish(self):
        return [ContentDelta("ok"), ToolCallStart(0, "call_0", "lookup"), ToolCallArguments(0, '{"q":'),
                ToolCallArguments(0, '"x"}'), ToolCallEnd(0)]


@pytest.mark.fake_only("a test parser installed in process")
def test_parser_deltas_become_reasoning_message_and_function_call_items(launcher, fake_only, monkeypatch):
    monkeypatch.setattr(registry, "_PARSERS", {**registry._PARSERS, ReasonThenCall.name: ReasonThenCall})
    served = launcher()
    served.session._server.state.reasoning_parser = ReasonThenCall.name
    whole = _create(served, input="hi")
    assert [item.type for item in whole.output] == ["reasoning", "message", "function_call"]
    assert whole.output[0].content[0].text == "You said: hi" and whole.output_text == "ok"
    call = whole.output[2]
    assert (call.call_id, call.name, call.arguments, call.id[:3]) == ("call_0", "lookup", '{"q":"x"}', "fc_")
    events = list(_create(served, input="hi", stream=True))
    kinds = [event.type for event in events]
    assert kinds[2:4] == ["response.output_item.added", "response.content_part.added"]
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == "You said: hi"
    assert "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta") == '{"q":"x"}'
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning", "message", "function_call"]
    assert final.output[2].arguments == '{"q":"x"}' and final.output_text == "ok"
    assert [e.output_index for e in events if e.type == "response.output_item.done"] == [0, 1, 2]
    # The stored conversation carries the call, so its output continues it.
    follow = _create(served, previous_response_id=final.id, input=[
        {"type": "function_call_output", "call_id": "call_0", "output": "42"}])
    assert follow.status == "completed"


# -- units: items and the store ---------------------------------------------------------------

def test_input_items_become_chat_messages():
    messages = input_messages([
        {"role": "developer", "content": "Be brief"},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "a"},
                                                         {"type": "input_text", "text": "b"}]},
        {"type": "reasoning", "id": "rs_1", "summary": [], "content": [{"type": "reasoning_text", "text": "hmm"}]},
        {"type": "message", "role": "assistant", "id": "msg_1", "status": "completed",
         "content": [{"type": "output_text", "text": "Let me check", "annotations": [], "logprobs": []}]},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "f", "arguments": '{"x": 1}'},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": ""},
        {"type": "function_call_output", "call_id": "c1", "output": "one"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "two"}]},
    ])
    assert messages == [
        {"role": "developer", "content": "Be brief"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": [{"type": "text", "text": "Let me check"}], "reasoning_content": "hmm",
         "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": '{"x": 1}'}},
                        {"id": "c2", "type": "function", "function": {"name": "g", "arguments": ""}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": [{"type": "text", "text": "two"}]},
    ]
    assert input_messages("hi") == [{"role": "user", "content": "hi"}]


def _entry(index: int, text: str = "x") -> StoredResponse:
    return StoredResponse.of({"id": f"resp_{index:03d}", "output": text}, ({"role": "user", "content": text},))


def test_the_store_never_exceeds_its_limits_and_evicts_least_recently_used():
    store = ResponseStore(max_responses=3, max_chars=10_000)
    for index in range(3):
        assert store.put(_entry(index))
    assert store.get("resp_000") is not None  # now the most recently used
    for index in range(3, 50):
        assert store.put(_entry(index))
        assert len(store) <= 3 and store.num_chars <= store.max_chars
        assert "resp_000" in store or index > 4
    assert "resp_000" not in store and store.num_evicted == 47
    assert store.num_chars == sum(store.get(f"resp_{i:03d}").size for i in range(47, 50))
    sized = ResponseStore(max_responses=100, max_chars=3 * _entry(0, "y" * 100).size)
    for index in range(20):
        sized.put(_entry(index, "y" * 100))
        assert sized.num_chars <= sized.max_chars and len(sized) <= 3
    assert not sized.put(_entry(99, "y" * 10_000)) and sized.num_refused == 1 and "resp_099" not in sized
    assert sized.delete("resp_019") and not sized.delete("resp_019") and len(sized) == 2
