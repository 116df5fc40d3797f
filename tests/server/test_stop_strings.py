"""Stop strings end the output at every position, on every engine kind.

Each case first runs the same greedy request without stops (its text T, one
delta per token event), picks stop strings from T, and expects the output to be
T up to the earliest stop, streamed and not, with ``finish_reason`` "stop" and
a server that is still healthy afterwards (a matched stop once killed the real
runtime while the fake engine's own stop code passed these tests).
"""

from __future__ import annotations

import json

import pytest
from server_harness import get_json, request, wait_idle

PROMPT = "One, two, three, four,"
MULTIBYTE = "日本語, 日本語, 日本語,"  # byte-level tokens: characters span token boundaries


def _payload(server, text: str, **extra) -> tuple[str, dict]:
    if server.kind == "fake" and text == MULTIBYTE:
        # The fake engine echoes chat messages and continues completions with ASCII filler.
        return "/v1/chat/completions", {"model": server.model, "messages": [{"role": "user", "content": text}],
                                        "temperature": 0, "max_tokens": 24, **extra}
    return "/v1/completions", {"model": server.model, "prompt": text, "temperature": 0, "max_tokens": 24, **extra}


def _text_of(choice: dict) -> str:
    if "text" in choice:
        return choice["text"]
    return (choice.get("delta") or choice.get("message") or {}).get("content") or ""


def run(server, route: str, payload: dict, *, stream: bool) -> tuple[list[str], str, dict | None]:
    """(text deltas, finish_reason, usage) of one request."""
    body = {**payload, "stream": stream}
    if stream:
        body["stream_options"] = {"include_usage": True}
    status, _, raw = request(server, "POST", route, body)
    assert status == 200, raw
    if not stream:
        reply = json.loads(raw)
        return [_text_of(reply["choices"][0])], reply["choices"][0]["finish_reason"], reply["usage"]
    deltas, finish, usage = [], None, None
    events = raw.decode().split("\n\n")
    assert events[-2] == "data: [DONE]", events[-3:]
    for event in events[:-2]:
        assert event.startswith("data: "), event
        chunk = json.loads(event[len("data: "):])
        if chunk.get("usage"):
            usage = chunk["usage"]
        for choice in chunk["choices"]:
            if _text_of(choice):
                deltas.append(_text_of(choice))
            if choice.get("finish_reason"):
                assert finish is None, "two finish reasons"
                finish = choice["finish_reason"]
    return deltas, finish, usage


def expect_stop(server, text: str, stops: list[str], baseline: str) -> None:
    """Both modes end at the earliest stop in ``baseline`` (or run to the length limit)."""
    found = [(baseline.find(s), s) for s in stops if s in baseline]
    expected = baseline[:min(found)[0]] if found else baseline
    route, payload = _payload(server, text, stop=stops)
    for stream in (False, True):
        deltas, finish, usage = run(server, route, payload, stream=stream)
        assert "".join(deltas) == expected, (stops, stream, deltas)
        assert finish == ("stop" if found else "length"), (stops, stream, finish)
        assert usage["completion_tokens"] >= 1
    wait_idle(server)
    assert get_json(server, "/health") == (200, {"status": "ok"})


@pytest.fixture(scope="module")
def baselines(server) -> dict[str, list[str]]:
    """Greedy token deltas of each prompt, without stops."""
    out = {}
    for text in (PROMPT, MULTIBYTE):
        route, payload = _payload(server, text)
        deltas, finish, _ = run(server, route, payload, stream=True)
        assert finish == "length" and len(deltas) >= 8, deltas
        out[text] = deltas
    return out


def test_stop_at_the_first_token(server, baselines):
    deltas = baselines[PROMPT]
    expect_stop(server, PROMPT, [deltas[0]], "".join(deltas))
    expect_stop(server, PROMPT, [deltas[0][:1]], "".join(deltas))


def test_stop_mid_stream_inside_one_token(server, baselines):
    deltas = baselines[PROMPT]
    k = max(range(3, len(deltas)), key=lambda i: len(deltas[i].strip()))
    word = deltas[k].strip()  # one character on the fake engine's byte tokens
    expect_stop(server, PROMPT, [word[1:] or word], "".join(deltas))


def test_stop_across_a_token_boundary(server, baselines):
    deltas = baselines[PROMPT]
    k = len(deltas) // 2
    expect_stop(server, PROMPT, [deltas[k][-1] + deltas[k + 1][:1]], "".join(deltas))
    # a longer stop spanning three tokens
    expect_stop(server, PROMPT, [deltas[k][-1:] + deltas[k + 1] + deltas[k + 2][:1]], "".join(deltas))


def test_stop_on_multibyte_characters(server, baselines):
    baseline = "".join(baselines[MULTIBYTE])
    # The second non-ASCII character of the output ("本" on the demo and fake engines;
    # whatever a random-weight core says), alone and with its neighbours.
    at = [i for i, c in enumerate(baseline) if ord(c) > 127 and c != "\ufffd"][1]
    expect_stop(server, MULTIBYTE, [baseline[at]], baseline)
    expect_stop(server, MULTIBYTE, [baseline[at - 1:at + 2]], baseline)


def test_several_stops_end_at_the_earliest(server, baselines):
    deltas = baselines[PROMPT]
    baseline = "".join(deltas)
    late, early = deltas[-2].strip() or deltas[-3], deltas[4].strip() or deltas[5]
    expect_stop(server, PROMPT, [late, early], baseline)
    expect_stop(server, PROMPT, ["no such stop \u2603", early], baseline)


def test_withheld_prefix_is_released_at_the_length_limit(server, baselines):
    baseline = "".join(baselines[PROMPT])
    # The output's last characters start this stop string, which never completes.
    expect_stop(server, PROMPT, [baseline[-2:] + "\u2603never"], baseline)
    expect_stop(server, PROMPT, ["\u2603 never \u2603"], baseline)


def test_next_turn_after_a_stop_reuses_the_prefix(server, baselines):
    """A chat turn ended by a stop string, then the next turn over it: cached
    tokens are reused, and the reused answer equals the one computed again."""
    first = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Count to ten."}]
    route = "/v1/chat/completions"
    base = {"model": server.model, "messages": first, "temperature": 0, "max_tokens": 16}
    deltas, _, _ = run(server, route, base, stream=True)
    reply = "".join(deltas)
    stop = reply[len(reply) // 2:len(reply) // 2 + 2]
    assert stop.strip(), reply
    answer, finish, _ = run(server, route, {**base, "stop": [stop]}, stream=False)
    assert finish == "stop" and answer[0] == reply[:reply.find(stop)]
    second = first + [{"role": "assistant", "content": answer[0]}, {"role": "user", "content": "Again."}]
    replies = []
    for stream in (False, True, False):
        deltas, finish, usage = run(server, route, {**base, "messages": second}, stream=stream)
        replies.append("".join(deltas))
        assert usage["prompt_tokens_details"]["cached_tokens"] > 0, usage
    assert replies[0] == replies[1] == replies[2]
    assert get_json(server, "/health") == (200, {"status": "ok"})
    wait_idle(server)
