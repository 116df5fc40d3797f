"""Tensor-parallel execution: one rank per device, rank 0 driving the others.

Rank 0 owns HTTP, the frontend and the scheduler. Its executor,
:class:`TensorParallelExecutor`, wraps its own CPU executor and mirrors every
submission to the other ranks over a control connection: the same graph, the same
uploads, the same fence. Each rank runs the step on its shard. The collectives
inside the decoder (flare/model/tensor_parallel.py, gloo on the CPU) make the ranks
meet, so every rank must run the same programs in the same order, which mirroring
guarantees.

A step completes when every rank has reported it.

- Each rank's report carries the fence and the graph identity, and its completion records.
- Rank 0 commits only when every report matches its own. Sampling runs on the gathered
  logits with the same seeds on every rank, so the records agree byte for byte.
- The step's time is the longest rank's interval.
- The frame bound holds for all ranks together: rank 0 submits only while its own
  window has room (at most :data:`TP_FRAMES` in flight), and the others run exactly rank
  0's submissions.

Failure:

- A rank whose connection closes, whose heartbeat (every :data:`HEARTBEAT_S`) stops for
  :data:`RANK_SILENT_S`, or that reports nothing for :data:`RANK_TIMEOUT_S` while rank 0
  waits on it, fails the executor with an error naming the rank. A stopped rank leaves the
  others blocked inside a collective, so only its silence names it.
- The runtime then ends every request with that error, and the server exits 1.
- :meth:`TensorParallelExecutor.close` drains every rank and waits for their processes; after
  a failure it first aborts NCCL's communicators (:func:`abort_nccl`: a GPU collective waiting on a
  dead peer would spin forever) and kills the ranks that do not exit.

Ranks meet through a :class:`RankPlan`. On one host, :func:`start_ranks` spawns ranks
1..N-1 as processes of their own session, so a Ctrl-C at the terminal reaches only
rank 0, which drains them. Across hosts, torchrun's environment names the rendezvous
(:func:`plan_from_environment`), and ``flare run`` on a rank other than 0 runs
:func:`run_rank` instead of serving.
"""

from __future__ import annotations

import collections
import logging
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from multiprocessing.connection import Client, Connection, Listener
from typing import Sequence

import numpy as np

from ..contract import PIPELINED_STEPS, Upload
from ..errors import ExecutionError
from .base import ExecutionCompletion, FenceTimeline

log = logging.getLogger("flare.ranks")

RANK_TIMEOUT_S = 5.0  # a rank silent this long while rank 0 waits on it has failed
HEARTBEAT_S = 0.5  # every rank's reporting thread says it is alive this often
RANK_SILENT_S = 3.0  # no message (report or heartbeat) for this long: the rank stopped answering
FAILED_CLOSE_S = 0.5  # after a failure: how long ranks get to exit before they are killed
FAILED_JOIN_S = 2.0  # then how long rank 0's own executor gets to leave its broken collective
ABORT_JOIN_S = 1.0  # abort: how long a killed rank's reader gets to see the hang-up before its connection closes
HANG_UP_JOIN_S = 2.0  # then, after rank 0 hangs up itself, how long the reader gets to end
RANK_GONE_WAIT_S = 1.0  # after a failed collective: how long to look for the rank that caused it
STARTUP_TIMEOUT_S = 600.0  # every rank must have loaded its shard by then
# Submissions in flight across the ranks: two, as before the single-rank window grew to four
# frames (flare.contract.FRAMES), until the multi-GPU run (issue 28) measures more.
TP_FRAMES = PIPELINED_STEPS
AUTHKEY_ENV = "FLARE_TP_AUTHKEY"


@dataclass(frozen=True)
class RankPlan:
    """Where the ranks meet: the gloo rendezvous and rank 0's control listener."""

    world: int
    master_addr: str
    master_port: int  # torch.distributed's TCP rendezvous
    control_port: int  # rank 0 listens here for the other ranks' control connections
    authkey: bytes

    def init_process_group(self, rank: int, device: str = "cpu") -> None:
        """Join the group: gloo for CPU ranks, NCCL for GPU ranks (``device`` is this rank's)."""
        import torch
        import torch.distributed as dist

        backend = "gloo"
        if device.startswith("cuda"):
            torch.cuda.set_device(torch.device(device))
            backend = "nccl"
        dist.init_process_group(backend, init_method=f"tcp://{self.master_addr}:{self.master_port}", rank=rank,
                                world_size=self.world, timeout=timedelta(seconds=STARTUP_TIMEOUT_S))


def rank_device(config_device: str, rank: int, environ=os.environ) -> str:
    """A rank's device: its own GPU (LOCAL_RANK under torchrun, else the rank on one host), or the CPU."""
    from ..model.loader import resolve_device

    if resolve_device(config_device).type != "cuda":
        return "cpu"
    return f"cuda:{int(environ.get('LOCAL_RANK', rank))}"


def _free_port(host: str) -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def plan_from_environment(world: int, environ=os.environ) -> RankPlan | None:
    """The plan torchrun's variables give (MASTER_ADDR, MASTER_PORT, WORLD_SIZE, RANK), with the
    control listener on MASTER_PORT + 1 and the key in FLARE_TP_AUTHKEY; None without them."""
    if "MASTER_ADDR" not in environ or "RANK" not in environ:
        return None
    size = int(environ.get("WORLD_SIZE", world))
    if size != world:
        raise ExecutionError(f"WORLD_SIZE={size} but --tensor-parallel {world}")
    key = environ.get(AUTHKEY_ENV)
    if not key:
        raise ExecutionError(f"ranks started by torchrun need a shared {AUTHKEY_ENV} (any secret string)")
    port = int(environ.get("MASTER_PORT", "29500"))
    return RankPlan(world, environ["MASTER_ADDR"], port, port + 1, key.encode())


# -- rank 0 ----------------------------------------------------------------------


def _hang_up(conn: Connection) -> None:
    """Shut the connection's socket down both ways, so that a recv() blocked on it returns EOF."""
    try:
        fd = os.dup(conn.fileno())
    except (OSError, ValueError):
        return  # already closed
    with socket.socket(fileno=fd) as sock:  # owns the duplicate only; shutdown acts on the socket
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # the peer is gone already


class _Link:
    """Rank 0's end of one other rank's control connection, with a reader thread."""

    def __init__(self, rank: int, conn: Connection, process: subprocess.Popen | None):
        self.rank = rank
        self.conn = conn
        self.process = process
        self.failure: ExecutionError | None = None
        self._cond = threading.Condition()
        self._reports: collections.deque = collections.deque()
        self._send_lock = threading.Lock()
        self._reader: threading.Thread | None = None
        self.last_seen = time.monotonic()

    def start_reader(self, on_failure) -> None:
        # The silence clock starts now: until this reader runs, nothing reads the rank's heartbeats,
        # and the rank spent the time since its hello loading its shard (seconds on a loaded host).
        self.last_seen = time.monotonic()

        def read() -> None:
            while True:
                try:
                    message = self.conn.recv()
                except (EOFError, OSError, TypeError):
                    # TypeError: the connection was closed between recv's check and its read (its
                    # handle cleared); close() hangs the socket up and waits for this thread first
                    self._fail(self._gone("its connection closed"), on_failure)
                    return
                self.last_seen = time.monotonic()
                if message[0] == "alive":
                    continue
                with self._cond:
                    self._reports.append(message)
                    self._cond.notify_all()

        self._reader = threading.Thread(target=read, name=f"flare-rank{self.rank}-reader", daemon=True)
        self._reader.start()

    def close(self, wait_s: float) -> None:
        """Close the connection after the reader has ended: it ends when the rank hangs up, and a
        rank still connected after ``wait_s`` is hung up on. Closing the descriptor alone would
        not wake a reader blocked in recv() (and the number could be reused under it); closing it
        between recv's check and its read raised a TypeError in the reader's thread."""
        reader = self._reader
        if reader is not None and reader is not threading.current_thread():
            reader.join(wait_s)
            if reader.is_alive():
                _hang_up(self.conn)
                reader.join(HANG_UP_JOIN_S)
        self.conn.close()

    def _gone(self, how: str) -> ExecutionError:
        code = self.process.poll() if self.process is not None else None
        exited = f"; it exited with code {code}" if code is not None else ""
        return ExecutionError(f"tensor-parallel rank {self.rank} failed: {how}{exited}")

    def _fail(self, error: ExecutionError, on_failure) -> None:
        with self._cond:
            if self.failure is None:
                self.failure = error
            self._cond.notify_all()
        on_failure(error)

    def send(self, message) -> None:
        with self._send_lock:
            try:
                self.conn.send(message)
            except (OSError, ValueError) as exc:
                raise self._gone(f"sending to it failed ({exc})") from None

    def receive(self, timeout: float):
        """The next report, or raise: the rank failed or stayed silent for ``timeout``."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while not self._reports:
                if self.failure is not None:
                    raise self.failure
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._gone(f"no report within {timeout:.0f} s")
                self._cond.wait(remaining)
            return self._reports.popleft()


class TensorParallelExecutor(FenceTimeline):
    """Rank 0's executor: its own executor plus the mirrored ranks (see the module docstring)."""

    def __init__(self, local, links: Sequence[_Link]):
        self.local = local
        self.contract = local.contract
        self.links = list(links)
        self._failure: ExecutionError | None = None
        self._submitted: collections.deque[tuple[int, int]] = collections.deque()  # (fence, graph) in flight
        self._closed = False
        for link in self.links:
            link.start_reader(self._on_failure)

    def _on_failure(self, error: ExecutionError) -> None:
        if self._failure is None and not self._closed:
            log.error("%s", error)
            self._failure = error

    @property
    def next_fence(self) -> int:
        return self.local.next_fence

    @property
    def completed_fence(self) -> int:
        return self.local.completed_fence

    @property
    def outstanding(self) -> int:
        return self.local.outstanding

    @property
    def graph_estimates_ns(self) -> Sequence[int]:
        return self.local.graph_estimates_ns

    @property
    def poisoned(self) -> BaseException | None:
        return self._failure or self.local.poisoned

    def can_submit(self) -> bool:
        return self._failure is None and self.local.can_submit() and len(self._submitted) < TP_FRAMES

    def _broadcast(self, message) -> None:
        for link in self.links:
            try:
                link.send(message)
            except ExecutionError as exc:
                self._on_failure(exc)
                raise

    def submit(self, graph_index: int, uploads: Sequence[Upload], grammar_constrained: bool = False) -> int:
        if self._failure is not None:
            raise ExecutionError(f"executor is poisoned: {self._failure}")
        if not self.local.can_submit():  # the local executor's refusal, in its words, before any rank sees it
            return self.local.submit(graph_index, uploads, grammar_constrained)
        if len(self._submitted) >= TP_FRAMES:
            raise ExecutionError(f"all {TP_FRAMES} tensor-parallel frames are in flight; poll before submitting again")
        fence = self.local.next_fence
        payload = [(name, offset, bytes(data)) for name, offset, data in uploads]
        self._broadcast(("submit", fence, graph_index, payload, grammar_constrained))
        local_fence = self.local.submit(graph_index, uploads, grammar_constrained)
        assert local_fence == fence
        self._submitted.append((fence, graph_index))
        return fence

    def release(self, fence: int, uploads: Sequence[Upload]) -> None:
        payload = [(name, offset, bytes(data)) for name, offset, data in uploads]
        self._broadcast(("release", fence, payload))
        self.local.release(fence, uploads)

    def _check_heartbeats(self) -> None:
        now = time.monotonic()
        for link in self.links:
            if link.failure is None and now - link.last_seen > RANK_SILENT_S:
                link._fail(link._gone(f"it stopped answering (nothing for {now - link.last_seen:.1f} s)"),
                           self._on_failure)

    def poll(self, timeout: float = 0.0) -> ExecutionCompletion | None:
        if self._submitted:
            self._check_heartbeats()
        if self._failure is not None and self._submitted:
            return self._failed_completion(self._failure)
        done = self.local.poll(timeout)
        if done is None:
            if self._failure is not None and self._submitted:
                return self._failed_completion(self._failure)
            return None
        fence, graph = self._submitted.popleft()
        if done.error is not None:
            # a peer that died breaks rank 0's collective first: name the rank, not the socket
            failure = self._failure or self._rank_failure(RANK_GONE_WAIT_S)
            if failure is None:
                return done
            failure.__cause__ = done.error
            return replace(done, error=failure)
        duration = done.duration_ns
        for link in self.links:
            try:
                kind, r_fence, r_graph, records, r_duration, error = link.receive(RANK_TIMEOUT_S)
            except ExecutionError as exc:
                self._on_failure(exc)
                return replace(done, error=exc)
            if error is not None:
                failure = ExecutionError(f"tensor-parallel rank {link.rank} failed at fence {r_fence}: {error}")
                self._on_failure(failure)
                return replace(done, error=failure)
            if (kind, r_fence, r_graph) != ("done", fence, graph) or records != done.records.tobytes():
                failure = ExecutionError(
                    f"tensor-parallel rank {link.rank} disagrees at fence {fence} (graph {graph}): it reported "
                    f"fence {r_fence}, graph {r_graph}{', other records' if r_fence == fence else ''}")
                self._on_failure(failure)
                return replace(done, error=failure)
            duration = max(duration, r_duration)
        return replace(done, duration_ns=duration)

    def _rank_failure(self, wait_s: float) -> ExecutionError | None:
        """The first rank found failed within ``wait_s`` (its reader sees the closed connection)."""
        deadline = time.monotonic() + wait_s
        while True:
            for link in self.links:
                if link.failure is not None:
                    return link.failure
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.01)

    def _failed_completion(self, error: ExecutionError) -> ExecutionCompletion:
        fence, graph = self._submitted.popleft()
        empty = np.zeros(0)
        return ExecutionCompletion(fence, graph, empty, empty, empty, 0, error)

    def close(self) -> None:
        """Drain every rank, then stop them; a failed group is torn down without waiting on it."""
        if self._closed:
            return
        failed = self._failure is not None
        self._closed = True
        for link in self.links:
            try:
                link.send(("close",))
            except ExecutionError:
                pass
        if failed:
            abort_nccl()
        closer = threading.Thread(target=self.local.close, name="flare-rank0-close", daemon=True)
        closer.start()
        # A failed group cannot drain: its collectives wait on the failed rank. Its ranks get half a
        # second, then are killed, which also ends rank 0's own collective in flight.
        closer.join(FAILED_CLOSE_S if failed else None)
        deadline = time.monotonic() + (FAILED_CLOSE_S if failed else 60.0)
        for link in self.links:
            if link.process is not None:
                try:
                    link.process.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    log.warning("tensor-parallel rank %d did not exit; killing it", link.rank)
                    link.process.kill()
            link.close(max(0.1, deadline - time.monotonic()))
        if failed:
            # the killed ranks' closed sockets end rank 0's own collective: let that thread finish,
            # so the group's threads are joined before the process exits (else C++ aborts the exit)
            closer.join(FAILED_JOIN_S)
            if closer.is_alive():
                log.warning("rank 0's executor is still inside a collective; exiting without it")
                return
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def abort_nccl() -> None:
    """Abort this process's NCCL communicators, if it has any: a GPU rank's collective waiting on a
    dead or stopped peer spins on the device until its communicator is aborted (the peer's socket
    closing, which ends a gloo collective, does not reach it), so rank 0's executor could not
    leave the step it is in. Gloo groups are left to their sockets."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_backend() != "nccl":
        return
    try:
        from torch.distributed.distributed_c10d import _abort_process_group

        _abort_process_group()
    except Exception as exc:  # noqa: BLE001 - the exit goes on without it
        log.warning("could not abort the NCCL communicator: %s", exc)


class RankGroup:
    """Rank 0's side while the group starts: the other ranks connected and loading."""

    def __init__(self, plan: RankPlan, links: list[_Link]):
        self.plan = plan
        self.links = links

    def shard(self, rank: int):
        from ..model.tensor_parallel import TensorParallel

        return TensorParallel(rank, self.plan.world)

    def executor(self, local, num_pages: int) -> TensorParallelExecutor:
        """Wait for every rank's shard, check it sized the same KV, and wrap ``local``."""
        for link in self.links:
            try:
                message = link.conn.recv() if link.conn.poll(STARTUP_TIMEOUT_S) else None
            except (EOFError, OSError):
                message = None
            if message is None or message[0] != "ready":
                self.abort()
                detail = f": {message[1]}" if message is not None and message[0] == "error" else ""
                raise link._gone(f"it did not load its shard{detail}")
            if message[1] != num_pages:
                self.abort()
                raise ExecutionError(f"tensor-parallel rank {link.rank} sized {message[1]} KV pages, rank 0 "
                                     f"{num_pages}: start every rank with the same KV budget")
        return TensorParallelExecutor(local, self.links)

    def abort(self) -> None:
        for link in self.links:
            if link.process is not None and link.process.poll() is None:
                link.process.kill()
            link.close(ABORT_JOIN_S)


def start_ranks(world: int, core_path: str, config, *, host: str = "127.0.0.1",
                plan: RankPlan | None = None) -> RankGroup:
    """Rank 0: spawn ranks 1..world-1 on this host (unless ``plan`` says torchrun started them),
    join the process group, and hand each rank the core and the engine config (``config.device``
    is rank 0's; a GPU rank takes its own)."""
    share_cores(world)
    spawn = plan is None
    if spawn:
        plan = RankPlan(world, host, _free_port(host), _free_port(host), secrets.token_bytes(16))
    listener = Listener((plan.master_addr, plan.control_port), authkey=plan.authkey)
    processes: dict[int, subprocess.Popen] = {}
    if spawn:
        env = {**os.environ, AUTHKEY_ENV: plan.authkey.hex()}
        for rank in range(1, world):
            argv = [sys.executable, "-m", "flare.execution.ranks", str(rank), str(world), plan.master_addr,
                    str(plan.master_port), str(plan.control_port)]
            # its own session: a terminal's Ctrl-C reaches rank 0 only, which drains the others
            processes[rank] = subprocess.Popen(argv, env=env, start_new_session=True)
    links: dict[int, _Link] = {}
    accepted = threading.Event()

    def accept() -> None:
        try:
            while len(links) < world - 1:
                conn = listener.accept()
                kind, rank = conn.recv()
                links[rank] = link = _Link(rank, conn, processes.get(rank))
                link.send(("load", str(core_path), config))  # it joins the group once it knows its device
        except (OSError, EOFError):
            pass
        accepted.set()

    threading.Thread(target=accept, name="flare-rank-accept", daemon=True).start()
    plan.init_process_group(0, config.device)  # returns once every rank joined
    if not accepted.wait(STARTUP_TIMEOUT_S) or len(links) < world - 1:
        listener.close()
        raise ExecutionError(f"only {len(links)} of {world - 1} tensor-parallel ranks connected")
    listener.close()
    return RankGroup(plan, [links[rank] for rank in range(1, world)])


# -- ranks 1..N-1 ------------------------------------------------------------------


def share_cores(world: int) -> None:
    """Ranks on one host split its cores: torch's threads of N ranks would otherwise contend."""
    import torch

    torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))


def _connect(plan: RankPlan) -> Connection:
    """Rank 0's control listener, retried while rank 0 starts it (torchrun starts ranks together)."""
    deadline = time.monotonic() + 60.0
    while True:
        try:
            return Client((plan.master_addr, plan.control_port), authkey=plan.authkey)
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def run_rank(rank: int, plan: RankPlan) -> int:
    """A rank other than 0: load its shard, then run rank 0's submissions until it closes the group."""
    import dataclasses

    from ..core.format import load_core
    from ..model.loader import load_model
    from ..model.tensor_parallel import TensorParallel
    from .cpu import CpuExecutor

    share_cores(plan.world)
    conn = _connect(plan)
    conn.send(("hello", rank))
    _, core_path, config = conn.recv()
    config = dataclasses.replace(config, device=rank_device(config.device, rank))
    plan.init_process_group(rank, config.device)
    try:
        core = load_core(core_path, verify=False)  # rank 0 verified it
        loaded = load_model(core, config, None, TensorParallel(rank, plan.world))
        if loaded.device.type == "cuda":
            from .cuda import make_cuda_executor
            executor = make_cuda_executor(loaded)  # captures with rank 0, collective by collective
        else:
            executor = CpuExecutor(loaded.programs, name=f"flare-rank{rank}-executor")
    except Exception as exc:  # noqa: BLE001 - rank 0 reports it
        conn.send(("error", f"{type(exc).__name__}: {exc}"))
        return 1
    send_lock = threading.Lock()
    conn.send(("ready", loaded.contract.num_pages))
    stop = threading.Event()
    submitted = threading.Event()

    def report() -> None:
        beat = time.monotonic()
        while not stop.is_set() or executor.outstanding:
            if not executor.outstanding:  # idle: wait for a submission (poll would return at once)
                submitted.wait(HEARTBEAT_S)
                submitted.clear()
            done = executor.poll(0.05)
            if done is None:
                if time.monotonic() - beat >= HEARTBEAT_S:  # alive, even while a collective waits
                    beat = time.monotonic()
                    with send_lock:
                        conn.send(("alive",))
                continue
            error = None if done.error is None else str(done.error)
            with send_lock:
                conn.send(("done", done.fence, done.graph_index, done.records.tobytes(), done.duration_ns, error))

    reporter = threading.Thread(target=report, name=f"flare-rank{rank}-report", daemon=True)
    reporter.start()
    try:
        while True:
            message = conn.recv()
            if message[0] == "submit":
                _, fence, graph, uploads, held = message
                if executor.next_fence != fence:
                    raise ExecutionError(f"rank {rank} expected fence {executor.next_fence}, rank 0 sent {fence}")
                executor.submit(graph, uploads, held)
                submitted.set()
            elif message[0] == "release":
                executor.release(message[1], message[2])
            elif message[0] == "close":
                submitted.set()
                break
    except (EOFError, OSError):
        os._exit(1)  # rank 0 is gone: nothing to drain for
    stop.set()
    reporter.join()
    executor.close()
    conn.close()
    import torch.distributed as dist

    dist.destroy_process_group()
    return 0


def _main(argv: Sequence[str]) -> int:
    rank, world, addr, master_port, control_port = argv
    key = bytes.fromhex(os.environ[AUTHKEY_ENV])
    logging.basicConfig(level="INFO", stream=sys.stderr, format=f"%(asctime)s %(levelname)s rank {rank}: %(message)s")
    return run_rank(int(rank), RankPlan(int(world), addr, int(master_port), int(control_port), key))


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
