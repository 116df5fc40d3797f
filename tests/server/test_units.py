"""Pure units: request validation, metrics rendering, event streams, the fake engine, admission."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest

from flare.config import ServerConfig
from flare.engine.telemetry import EngineStats
from flare.errors import AdmissionError, ExecutionError
from flare.request import ErrorEvent, FinishEvent, GenerationDefaults, SamplingParams, TokenEvent, Usage
from flare.server.admission import BodyBudget, FrontendPool, HttpAdmission
from flare.server.api.openai.schema import parse_chat, parse_completion
from flare.server.app import ServerState
from flare.server.metrics import ENGINE_COUNTERS, ENGINE_GAUGES, TokenRate
from flare.server.stream import EventDispatcher, EventStream
from flare.testing.fake_engine import EOS_ID, FakeEngine, FakeEngineConfig

USER = [{"role": "user", "content": "hi"}]
NO_DEFAULTS = GenerationDefaults()  # the built-in (OpenAI) defaults


# -- validation -----------------------------------------------------------------------

def test_chat_defaults_and_sampling_fields():
    gen = parse_chat({"model": "m", "messages": USER, "temperature": 0, "top_k": -1, "stop": "END",
                      "max_completion_tokens": 7, "max_tokens": 99, "seed": 3, "logprobs": True, "top_logprobs": 2,
                      "stream": True, "stream_options": {"include_usage": True}}, NO_DEFAULTS)
    params = gen.sampling_params(prompt_len=10, context_len=100)
    assert params.max_tokens == 7 and params.is_greedy and params.top_k == 0 and params.stop == ("END",)
    assert params.seed == 3 and params.logprobs and params.top_logprobs == 2
    assert gen.stream and gen.include_usage and gen.chat_options == {"add_generation_prompt": True}


def test_max_tokens_defaults_to_the_rest_of_the_context():
    gen = parse_chat({"messages": USER}, NO_DEFAULTS)
    assert gen.sampling_params(prompt_len=30, context_len=100).max_tokens == 70
    with pytest.raises(AdmissionError) as info:
        gen.sampling_params(prompt_len=100, context_len=100, context_hint="use a bigger core")
    assert info.value.status == 400 and "prompt of 100 tokens" in str(info.value)
    assert "context of 100 tokens" in str(info.value) and "use a bigger core" in str(info.value)


def test_messages_keep_the_clients_forms():
    """Parts stay parts, argument strings stay strings, unknown keys and [] tools pass (frontend/forms.py
    adapts them to the template); only what the API itself forbids is refused."""
    gen = parse_chat({"messages": [
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}], "name": "u"},
        {"role": "assistant", "content": None, "refusal": None, "reasoning_content": "hm", "tool_calls": [
            {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"x":  1}'}},
            {"id": "2", "type": "function", "function": {"name": "g", "arguments": ""}}]},
        {"role": "tool", "content": "r", "tool_call_id": "1", "x_extra": [1]}],
        "tools": [], "documents": [{"title": "t", "text": "d"}],
        "chat_template_kwargs": {"enable_thinking": False}}, NO_DEFAULTS)
    user, assistant, tool = gen.messages
    assert user == {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
                    "name": "u"}
    calls = assistant["tool_calls"]
    assert calls[0]["function"]["arguments"] == '{"x":  1}' and calls[1]["function"]["arguments"] == ""
    assert assistant["content"] is None and assistant["reasoning_content"] == "hm"
    assert tool["tool_call_id"] == "1" and tool["x_extra"] == [1]
    assert gen.tools == []
    assert gen.chat_options == {"add_generation_prompt": True, "documents": [{"title": "t", "text": "d"}],
                                "enable_thinking": False}
    for bad in ('{"x": ', "[1]", "3"):
        with pytest.raises(AdmissionError) as info:
            parse_chat({"messages": [{"role": "assistant", "content": None, "tool_calls": [
                {"type": "function", "function": {"name": "f", "arguments": bad}}]}]}, NO_DEFAULTS)
        assert info.value.status == 400 and "arguments" in str(info.value)


@pytest.mark.parametrize("field,value", [
    ("top_p", 0), ("top_p", 1.5), ("min_p", -0.1), ("presence_penalty", 3), ("repetition_penalty", 0),
    ("seed", "x"), ("stop", [1]), ("stop_token_ids", [-1]), ("logprobs", "yes"), ("top_logprobs", 21),
    ("max_tokens", True), ("stream", 1), ("store", True), ("documents", "d"), ("chat_template", 3),
])
def test_chat_rejects_bad_values(field, value):
    with pytest.raises(AdmissionError) as info:
        parse_chat({"messages": USER, "logprobs": True, field: value} if field == "top_logprobs"
                   else {"messages": USER, field: value}, NO_DEFAULTS)
    assert info.value.status == 400 and field in str(info.value)


def test_completion_prompt_forms():
    assert parse_completion({"prompt": "x"}, NO_DEFAULTS).prompt == "x"
    assert parse_completion({"prompt": ["x"]}, NO_DEFAULTS).prompt == "x"
    assert parse_completion({"prompt": [[1, 2]]}, NO_DEFAULTS).prompt == [1, 2]
    gen = parse_completion({"prompt": [5], "logprobs": 0}, NO_DEFAULTS)
    assert gen.sampling["logprobs"] and gen.sampling["top_logprobs"] == 0
    for bad in ([[1], [2]], [], [1.5], None, 3):
        with pytest.raises(AdmissionError):
            parse_completion({"prompt": bad}, NO_DEFAULTS)


# -- metrics ----------------------------------------------------------------------------

def test_token_rate_covers_the_last_minute():
    rate = TokenRate()
    for i in range(30):  # 150 s of samples, 10 tokens per 5 s
        rate.sample(1000.0 + 5 * i, 10.0 * i)
    assert rate.value == pytest.approx(120.0)  # 12 intervals of 5 s in the window


class _StatsEngine:
    """Only what ServerState and the metrics need."""

    def __init__(self, stats):
        self._stats = stats
        from flare.request import ModelCard
        self.card = ModelCard(identifier="x")
        self.context_len = 128
        self.max_active = 4
        self.generation_defaults = NO_DEFAULTS
        self.special_markers = {}

    def stats(self):
        return self._stats


def test_metrics_export_every_name_and_unset_ones_as_zero():
    state = ServerState(_StatsEngine(EngineStats(requests_admitted=5, launches={"prefill": 2, "custom": 1})),
                        ServerConfig())
    text = state.metrics.render().decode()
    for key in ENGINE_COUNTERS:
        assert f"flare_{key}_total " in text
    for key in ENGINE_GAUGES:
        assert f"flare_{key} 0.0" in text
    assert "flare_requests_admitted_total 5.0" in text
    assert 'flare_graph_launches_total{kind="prefill"} 2.0' in text
    assert 'flare_graph_launches_total{kind="custom"} 1.0' in text
    assert "flare_http_capacity 20.0" in text  # 4 x 4 queue + 4 active
    assert "prompt" not in text.lower().replace("prompt_tokens", "").replace("prompt tokens", "")


def test_metrics_survive_a_failing_engine():
    class Broken(_StatsEngine):
        def stats(self):
            raise ExecutionError("gone")

    state = ServerState(Broken({}), ServerConfig())
    assert b"flare_slots_live 0.0" in state.metrics.render()


# -- event streams ----------------------------------------------------------------------------

def test_event_stream_across_threads_keeps_order_and_coalesces():
    async def run():
        loop = asyncio.get_running_loop()
        dispatcher = EventDispatcher(loop)
        streams = [EventStream(dispatcher) for _ in range(4)]

        def produce():
            for i in range(500):
                for stream in streams:
                    stream.sink(TokenEvent((i,), str(i)))
            for stream in streams:
                stream.sink(FinishEvent("length", Usage(1, 500)))

        thread = threading.Thread(target=produce)
        thread.start()
        seen = {id(s): [] for s in streams}
        batches = 0

        async def drain(stream):
            nonlocal batches
            while not stream.is_terminal_received:
                batch = await stream.next_batch()
                batches += 1
                seen[id(stream)].extend(batch)

        await asyncio.gather(*(drain(s) for s in streams))
        thread.join()
        return streams, seen, batches

    streams, seen, batches = asyncio.run(run())
    for stream in streams:
        events = seen[id(stream)]
        assert [e.token_ids[0] for e in events[:-1]] == list(range(500))
        assert isinstance(events[-1], FinishEvent)
    assert batches <= 4 * 501


def test_consume_delivers_directly_and_stops_on_request():
    async def run():
        dispatcher = EventDispatcher(asyncio.get_running_loop())
        stream = EventStream(dispatcher)
        got = []

        def consumer(batch):
            got.extend(batch)
            if len(got) == 2:
                stream.stop_consuming()

        stream.sink(TokenEvent((1,), "a"))
        task = asyncio.ensure_future(stream.consume(consumer))
        await asyncio.sleep(0)
        stream.sink(TokenEvent((2,), "b"))
        await task  # stopped after two
        stream.sink(FinishEvent("stop", Usage(1, 2)))
        await asyncio.sleep(0)
        assert len(got) == 2  # no consumer: the event waits
        await stream.consume(consumer)
        return got, stream

    got, stream = asyncio.run(run())
    assert [type(e) for e in got] == [TokenEvent, TokenEvent, FinishEvent] and stream.is_terminal_received


def test_abandon_wakes_a_waiting_reader():
    async def run():
        stream = EventStream(EventDispatcher(asyncio.get_running_loop()))
        task = asyncio.ensure_future(stream.next_batch())
        await asyncio.sleep(0)
        stream.abandon()
        return await task

    assert asyncio.run(run()) == []


# -- admission ---------------------------------------------------------------------------------

def test_admission_permits_are_counted_and_idempotent():
    admission = HttpAdmission(2)
    a, _ = admission.try_acquire(), admission.try_acquire()
    assert admission.try_acquire() is None and admission.num_rejected == 1
    a.release()
    a.release()
    assert admission.num_in_use == 1
    assert admission.try_acquire() is not None
    with pytest.raises(ValueError):
        HttpAdmission(0)


def test_body_budget_counts_every_share_and_refuses_past_it():
    budget = BodyBudget(100)
    first, second = budget.share(), budget.share()
    assert first.take(60) and second.take(40) and budget.num_bytes == 100
    assert not second.take(1) and budget.num_refused == 1 and second.num_bytes == 40  # nothing counted
    first.release()
    first.release()  # idempotent
    assert budget.num_bytes == 40 and second.take(60) and budget.num_bytes == 100
    assert first.take(10**9)  # a released share counts nothing more
    second.release()
    assert budget.num_bytes == 0
    with pytest.raises(ValueError):
        BodyBudget(0)


def test_wait_idle_and_frontend_pool():
    async def run():
        admission = HttpAdmission(1)
        permit = admission.try_acquire()
        assert not await admission.wait_idle(0.05)
        asyncio.get_running_loop().call_later(0.05, permit.release)
        assert await admission.wait_idle(5)
        pool = FrontendPool(2)
        results = await asyncio.gather(*(pool.run(lambda x=i: threading.current_thread().name + str(x))
                                         for i in range(5)))
        with pytest.raises(ZeroDivisionError):
            await pool.run(lambda: 1 / 0)
        pool.close()
        return results, pool.num_pending

    results, pending = asyncio.run(run())
    assert all(name.startswith("flare-frontend") for name in results) and pending == 0


# -- the fake engine ------------------------------------------------------------------------------

def _collect(engine, prompt, params, timeout=10.0):
    done = threading.Event()
    events = []

    def sink(event):
        events.append(event)
        if isinstance(event, (FinishEvent, ErrorEvent)):
            done.set()

    ticket = engine.submit(prompt, params, sink)
    assert done.wait(timeout)
    return events, ticket


def _wait_idle(engine, timeout=10.0):
    """The real runtime frees a slot once its last step completes, after the terminal event."""
    deadline = time.monotonic() + timeout
    while engine.stats().slots_live and time.monotonic() < deadline:
        time.sleep(0.005)
    return engine.stats()


def test_fake_engine_generation_rules():
    engine = FakeEngine(FakeEngineConfig(tokens_per_s=0, context_len=256))
    try:
        prompt = engine.prepare_chat([{"role": "user", "content": "naïve"}], tools=None, options={})
        assert prompt.message_endpoints and prompt.text.endswith("<|im_start|>assistant\n")
        events, _ = _collect(engine, prompt, SamplingParams(max_tokens=100, logprobs=True, top_logprobs=2))
        text = "".join(e.text for e in events[:-1])
        assert text == "You said: naïve"
        finish = events[-1]
        assert finish.reason == "stop" and finish.usage.completion_tokens == len("You said: naïve".encode()) + 1
        assert all(len(lp.top) == 2 for e in events[:-1] for lp in e.logprobs)
        assert EOS_ID not in [t for e in events[:-1] for t in e.token_ids]
        events, _ = _collect(engine, prompt, SamplingParams(max_tokens=5, ignore_eos=True))
        assert events[-1].reason == "length" and "".join(e.text for e in events[:-1]) == "You s"
        events, _ = _collect(engine, prompt, SamplingParams(max_tokens=100, stop=("aï",)))
        assert "".join(e.text for e in events[:-1]) == "You said: n" and events[-1].stop == "aï"
        with pytest.raises(AdmissionError) as info:
            engine.submit(prompt, SamplingParams(max_tokens=256), lambda e: None)
        assert info.value.status == 400
    finally:
        engine.close()
    with pytest.raises(AdmissionError) as info:
        engine.submit(prompt, SamplingParams(max_tokens=4), lambda e: None)
    assert info.value.status == 503


def test_fake_engine_cancel_counts_and_frees_the_slot():
    engine = FakeEngine(FakeEngineConfig(tokens_per_s=100, max_active=1))
    try:
        prompt = engine.prepare_text("x")
        events = []
        ticket = engine.submit(prompt, SamplingParams(max_tokens=1000, ignore_eos=True), events.append)
        while not events:
            pass
        ticket.cancel()
        ticket.cancel()
        events2, _ = _collect(engine, prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        assert isinstance(events2[-1], FinishEvent)
        stats = _wait_idle(engine)
        assert stats.requests_cancelled == 1 and stats.slots_live == 0
        assert not any(isinstance(e, FinishEvent) for e in events)
    finally:
        engine.close()


def test_fake_engine_cancels_any_of_identical_requests():
    engine = FakeEngine(FakeEngineConfig(tokens_per_s=100, max_active=4))
    try:
        prompt = engine.prepare_text("same prompt")
        tickets = [engine.submit(prompt, SamplingParams(max_tokens=1000, ignore_eos=True), lambda e: None)
                   for _ in range(3)]
        while engine.stats().slots_live < 3:
            pass
        tickets[2].cancel()  # not first in the active list: removal must not compare prompts
        tickets[1].cancel()
        events, _ = _collect(engine, prompt, SamplingParams(max_tokens=2, ignore_eos=True))
        assert isinstance(events[-1], FinishEvent) and engine.stats().requests_cancelled == 2
        tickets[0].cancel()
    finally:
        engine.close()


def test_fake_engine_tokenizer_is_the_byte_encoding():
    engine = FakeEngine(FakeEngineConfig(tokens_per_s=0))
    try:
        text = "héllo <|im_end|>\n"
        assert engine.tokenizer.encode(text) == engine.prepare_text(text).token_ids.tolist()
        assert engine.tokenizer.vocab_size == EOS_ID + 1 and engine.tokenizer.special_ids == {EOS_ID}
        assert engine.token_bytes(0xC3) == b"\xc3" and engine.tokenizer.decode([104, EOS_ID, 105]) == "hi"
    finally:
        engine.close()


def test_fake_engine_crash_fails_the_runtime():
    engine = FakeEngine(FakeEngineConfig(tokens_per_s=0))
    try:
        prompt = engine.prepare_chat([{"role": "user", "content": "FLARE_FAKE_CRASH"}], tools=None, options={})
        events, _ = _collect(engine, prompt, SamplingParams(max_tokens=20))
        assert [t for e in events[:-1] for t in e.token_ids] == list(b"Yo")
        assert isinstance(events[-1], ErrorEvent) and "FLARE_FAKE_CRASH" in str(events[-1].error)
        assert engine.failure is not None
        with pytest.raises(AdmissionError) as info:
            engine.submit(engine.prepare_text("x"), SamplingParams(max_tokens=2), lambda e: None)
        assert info.value.status == 503 and info.value.code == "worker_unavailable"
    finally:
        engine.close()


def test_fake_engine_prefix_reuse_is_the_prefix_cache():
    engine = FakeEngine(FakeEngineConfig(tokens_per_s=0))
    try:
        first = [{"role": "user", "content": "a" * 300}]
        events, _ = _collect(engine, engine.prepare_chat(first, tools=None, options={}),
                             SamplingParams(max_tokens=400))
        reply = "".join(e.text for e in events[:-1])
        assert reply == "You said: " + "a" * 300 and events[-1].usage.cached_tokens == 0
        _wait_idle(engine)
        second = engine.prepare_chat(first + [{"role": "assistant", "content": reply},
                                              {"role": "user", "content": "again"}], tools=None, options={})
        events, _ = _collect(engine, second, SamplingParams(max_tokens=50))
        assert "".join(e.text for e in events[:-1]) == "You said: again"
        assert events[-1].usage.cached_tokens > 300 and engine.stats().prefix_hits >= 1
    finally:
        engine.close()
