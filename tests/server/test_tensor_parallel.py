"""Tensor parallel on CPU ranks: the demo core (9 query heads, 3 KV heads) served by
`flare-serve --tensor-parallel 3` over gloo gives one rank's greedy tokens through the openai
SDK, streamed or not, with stop strings and prefix-cache hits; a rank killed mid-stream ends
every open stream with an error and the server exits 1; SIGTERM drains every rank; shapes that do
not divide are refused before anything starts."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import pytest
from server_harness import ENGINE_KINDS, FLARE_SERVE, launch

openai = pytest.importorskip("openai")

pytestmark = pytest.mark.skipif("demo" not in ENGINE_KINDS, reason="the demo engine is off (FLARE_E2E_DEMO=0)")

KV = ["--kv-memory-bytes", str(512 << 20), "--device", "cpu"]
# (a rank rank 0 gave up on is killed by its shutdown: nothing of a failed group outlives the server)
PROMPTS = ["Name the capital of France.", "List three colours.", "What is two plus two?"]


def client(served):
    return openai.OpenAI(base_url=served.base_url + "/v1", api_key="none", max_retries=0, timeout=120)


def children(pid: int) -> list[int]:
    """The rank processes a server spawned (its direct children)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def chat(c, model, prompt, **extra):
    reply = c.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                      max_tokens=12, temperature=0, **extra)
    return reply.choices[0].message.content, reply.usage


def stream_text(c, model, prompt, **extra):
    chunks = c.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                       max_tokens=12, temperature=0, stream=True, **extra)
    return "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)


@pytest.fixture(scope="module")
def single():
    served = launch("demo", extra_flags=tuple(KV))
    yield served
    served.stop()


@pytest.fixture(scope="module")
def sharded():
    # The drain test's 20 tokens over three gloo ranks on two cores took 6.5 s on a slow day,
    # past the default 5 s grace; what it tests is that every rank drains, so the grace is ample.
    served = launch("demo", shutdown_grace_s=30.0, extra_flags=(*KV, "--tensor-parallel", "3"))
    assert len(children(served.process.pid)) == 2
    yield served
    served.stop()


def test_three_ranks_give_one_ranks_greedy_tokens(single, sharded):
    one, three = client(single), client(sharded)
    for prompt in PROMPTS:
        expected, _ = chat(one, single.model, prompt)
        got, usage = chat(three, sharded.model, prompt)
        assert got == expected, prompt
        assert stream_text(three, sharded.model, prompt) == expected
    # a stop string cuts both at the same place
    stop = chat(one, single.model, PROMPTS[0])[0].split()[2]
    assert chat(three, sharded.model, PROMPTS[0], stop=[stop])[0] == chat(one, single.model, PROMPTS[0],
                                                                          stop=[stop])[0]
    # the prefix cache: the same prompt again reuses its tokens on every rank
    long = "Here is a long shared preamble about lighthouses. " * 12 + "Name one."
    first, _ = chat(three, sharded.model, long)
    again, usage = chat(three, sharded.model, long)
    assert again == first == chat(one, single.model, long)[0]
    assert usage.prompt_tokens_details is not None and usage.prompt_tokens_details.cached_tokens > 0


def test_sigterm_drains_every_rank(sharded):
    """(Runs after the parity test: it stops the module's server.)"""
    ranks = children(sharded.process.pid)
    assert len(ranks) == 2
    c = client(sharded)
    chunks = c.chat.completions.create(model=sharded.model, messages=[{"role": "user", "content": "Count."}],
                                       max_tokens=20, temperature=0, stream=True, extra_body={"ignore_eos": True})
    pieces = []
    for i, chunk in enumerate(chunks):
        if i == 1:
            sharded.process.send_signal(signal.SIGTERM)  # the response in flight still finishes
        pieces.append(chunk)
    assert pieces[-1].choices[0].finish_reason == "length" or pieces[-2].choices[0].finish_reason == "length"
    assert sharded.process.wait(30) == 0
    time.sleep(0.5)
    assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists()
                and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]


@pytest.mark.parametrize("how", ["killed", "stopped"])
def test_a_failed_rank_fails_the_stream_and_the_server_exits_1(how):
    """A rank that dies, or stops answering (SIGSTOP: the others wait inside a collective)."""
    fail_a_rank("demo", (*KV, "--tensor-parallel", "3"), 3, how)


def fail_a_rank(kind: str, flags: tuple[str, ...], world: int, how: str, streams: int = 3,
                max_tokens: int = 400) -> None:
    """Serve ``kind`` over ``world`` ranks, open ``streams`` long streamed answers, then kill (or
    stop) the last rank once each has its first chunks: every stream ends with an error naming the
    rank, the server exits 1 within 5 s, and no rank outlives it.
    (tests/server/test_tensor_parallel_gpu.py runs it on GPU ranks.)"""
    served = launch(kind, extra_flags=flags)
    try:
        ranks = children(served.process.pid)
        assert len(ranks) == world - 1
        c = client(served)
        started = [threading.Event() for _ in range(streams)]
        failures: list[BaseException | None] = [None] * streams

        def read(i: int) -> None:
            try:
                chunks = c.chat.completions.create(
                    model=served.model, messages=[{"role": "user", "content": f"Count to {100 + i}."}],
                    max_tokens=max_tokens, temperature=0, stream=True, extra_body={"ignore_eos": True})
                for n, _ in enumerate(chunks):
                    if n == 3:
                        started[i].set()
            except openai.APIError as exc:  # the stream's terminal error event
                failures[i] = exc
            finally:
                started[i].set()

        readers = [threading.Thread(target=read, args=(i,), daemon=True) for i in range(streams)]
        for t in readers:
            t.start()
        assert all(e.wait(120) for e in started)
        os.kill(ranks[-1], signal.SIGKILL if how == "killed" else signal.SIGSTOP)
        for t in readers:
            t.join(60)
        for failed in failures:
            assert failed is not None and f"rank {world - 1}" in str(failed), failures
            assert how == "killed" or "stopped answering" in str(failed), failed
        began = time.monotonic()
        code = served.process.wait(15)
        assert code == 1 and time.monotonic() - began < 5.0, "".join(served.stderr_lines[-30:])
        assert any("tensor-parallel rank" in line for line in served.stderr_lines)
        time.sleep(0.5)
        assert not [pid for pid in ranks if Path(f"/proc/{pid}").exists()
                    and Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"]
    finally:
        if served.process.poll() is None:
            served.process.kill()
        for pid in children(served.process.pid) if served.process.poll() is None else []:
            os.kill(pid, signal.SIGKILL)


def test_heads_that_do_not_divide_are_refused_before_any_rank_starts():
    argv = [*FLARE_SERVE, "--port", "0", *KV, "--tensor-parallel", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert "9" in done.stderr and "divide" in done.stderr, done.stderr[-2000:]
    assert "Flare listening" not in done.stderr


def test_ranks_started_by_a_launcher_meet_through_its_environment(single):
    """torchrun's variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, LOCAL_RANK) and a shared
    FLARE_TP_AUTHKEY: three processes started apart; rank 0 serves, the others run its steps."""
    from server_harness import start_subprocess

    port = _free_port()
    common = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "WORLD_SIZE": "3",
              "FLARE_TP_AUTHKEY": "a shared secret"}
    flags = [*KV, "--tensor-parallel", "3"]
    others = [subprocess.Popen([*FLARE_SERVE, *flags], env={**os.environ, **common, "RANK": str(r),
                                                           "LOCAL_RANK": str(r)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True) for r in (1, 2)]
    try:
        served = start_subprocess([*FLARE_SERVE, "--host", "127.0.0.1", "--port", "0", *flags], kind="demo",
                                  env={**common, "RANK": "0", "LOCAL_RANK": "0"})
        assert children(served.process.pid) == []  # nothing spawned: the launcher started the ranks
        got, _ = chat(client(served), served.model, PROMPTS[1])
        assert got == chat(client(single), single.model, PROMPTS[1])[0]
        assert served.stop() == 0
        assert [p.wait(30) for p in others] == [0, 0]  # drained by rank 0
    finally:
        for p in others:
            if p.poll() is None:
                p.kill()


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
