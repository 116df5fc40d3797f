"""Rank 0's watch over the other ranks (flare/execution/ranks.py): the heartbeat silence limit
counts from when rank 0 starts listening, not from the rank's hello, and still fails a rank
that stops answering."""

from __future__ import annotations

import time
from multiprocessing import Pipe

from flare.contract import GraphKind, PreparedContract
from flare.execution import ranks
from flare.execution.ranks import TensorParallelExecutor, _Link
from flare.testing.fake_executor import FakeExecutor


def _contract() -> PreparedContract:
    return PreparedContract.build(max_active=2, context=256, prefill_chunk_size=64, num_pages=8,
                                  num_snapshot_rows=2, vocab_size=32, hidden_size=8)


def test_a_slow_shard_load_is_not_silence_but_a_silent_rank_fails():
    contract = _contract()
    ours, theirs = Pipe()
    link = _Link(1, ours, None)
    link.last_seen = time.monotonic() - 10 * ranks.RANK_SILENT_S  # the hello came long ago: the rank loaded since
    executor = TensorParallelExecutor(FakeExecutor(contract, manual=True), [link])
    try:
        decode = contract.graph(GraphKind.DECODE, 1).index
        executor.submit(decode, [])
        assert theirs.recv()[0] == "submit"
        assert executor.poll() is None  # the step is in flight; the rank has not been silent
        assert link.failure is None and executor.can_submit()
        theirs.send(("alive",))
        deadline = time.monotonic() + 5
        while link.last_seen < time.monotonic() - 1 and time.monotonic() < deadline:
            time.sleep(0.01)
        link.last_seen -= ranks.RANK_SILENT_S + 1  # then it stops answering
        done = executor.poll()
        assert done is not None and "stopped answering" in str(done.error)
        assert not executor.can_submit()
    finally:
        theirs.close()
        ours.close()


def _reader_link():
    ours, theirs = Pipe()
    link = _Link(1, ours, None)
    failures = []
    link.start_reader(failures.append)
    return link, theirs, failures


def test_closing_a_link_waits_for_the_rank_to_hang_up():
    """close() lets the reader see the rank's hang-up (EOF) before it closes the connection: a
    connection closed under a reader blocked in recv() failed that recv with a TypeError in the
    reader's thread (CI, an unhandled thread exception)."""
    link, theirs, failures = _reader_link()
    theirs.send(("alive",))
    theirs.close()  # the rank exits after its last heartbeat
    link.close(5.0)
    assert not link._reader.is_alive()
    assert link.conn.closed
    assert len(failures) == 1 and "connection closed" in str(failures[0])


def test_a_rank_that_never_hangs_up_is_hung_up_on():
    """A rank that keeps its end open past the wait: rank 0 shuts the socket down, so the reader
    blocked in recv() sees EOF and ends before the connection is closed (closing the descriptor
    alone leaves the reader blocked, reading whatever file later takes its number)."""
    link, theirs, failures = _reader_link()
    try:
        link.close(0.05)
        assert not link._reader.is_alive()
        assert link.conn.closed
        assert len(failures) == 1 and "connection closed" in str(failures[0])
        assert theirs.poll(1.0)  # and the rank sees rank 0 hang up
    finally:
        theirs.close()
