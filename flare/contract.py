"""The torch-free ABI between the host (scheduler, runtime, executors) and step programs.

Graph kinds, the completion-record layout, upload ranges and PreparedContract live
here, below model/, execution/ and scheduler/, so that each of them can read the
contract without importing another. flare/_fast/records.pxd is the one Cython copy of
the completion-record layout; tests/test_contract.py proves the two agree.

A contract fixes, for one loaded core, every device-resident buffer (name, shape,
dtype, role) and every graph (kind and capacities). The host packs inputs into
host mirrors of the ``step.*`` and ``slot.*`` buffers and uploads only the byte
ranges it changed; programs read and write the device copies. Omitted ranges
keep their device contents, so back-to-back decode steps upload nothing.

Buffer roles:
- ``slot``: per-physical-slot state rows, row 0 is padding (S+1 rows)
- ``step``: per-submission inputs, indexed by batch row (B_max rows)
- ``out``: completion outputs [frame, slot, ...], copied back per step

Completion records (``out.records``, int64 [FRAMES, S+1, RECORD_FIELDS]) hold 16
metadata fields (``REC_*``) followed by ``RECORD_TOKENS`` token fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum
from typing import Union

import numpy as np

from .config import PAGE_TOKENS
from .request import MAX_TOP_LOGPROBS

RECORD_META = 16
RECORD_TOKENS = 8
RECORD_FIELDS = RECORD_META + RECORD_TOKENS
# Steps that decode or prefill in flight at most (a decode step queues behind the one
# before it), and submissions in flight at most, each with its own input frame and
# completion frame (``step.frame`` names it). The frames beyond the pipelined steps are for
# the small steps (INITIALIZE, SNAPSHOT, RESTORE, RESUME), two because a terminal capture
# and the INITIALIZE of the request taking its slot come in pairs: with two frames in all,
# a small step took the frame the next decode would have queued in, and the device idled
# for a host turn after it (docs/architecture.md, "Departures").
PIPELINED_STEPS = 2
FRAMES = PIPELINED_STEPS + 2

# Metadata fields of a completion record.
REC_SLOT = 0  # physical slot (0 for padding rows)
REC_GENERATION = 1  # the slot's generation when the program ran
REC_CONSUMED = 2  # cumulative tokens whose KV is written (the slot's position)
REC_GENERATED = 3  # cumulative sampled tokens
REC_NEW_TOKENS = 4  # tokens sampled by this program (0 or 1; more for speculative kinds)
REC_KIND = 5  # GraphKind of the program
REC_FLAGS = 6  # REC_FLAG_* bits
REC_TOKEN0 = RECORD_META  # first sampled token

REC_FLAG_PARTICIPATED = 1  # the slot took part in this program
REC_FLAG_SAMPLED = 2  # a token was sampled

# One host-to-device upload range: (input buffer name, byte offset, bytes). Ranges not
# uploaded keep their device contents.
Upload = tuple[str, int, Union[bytes, bytearray, memoryview]]

# Columns of the per-slot float32 sampling-parameter row (slot.sampling).
SAMPLING_TEMPERATURE = 0  # <= 0 means greedy
SAMPLING_TOP_P = 1
SAMPLING_TOP_K = 2  # 0 disables
SAMPLING_MIN_P = 3
SAMPLING_PRESENCE = 4
SAMPLING_FREQUENCY = 5
SAMPLING_REPETITION = 6  # 1 disables
SAMPLING_GRAMMAR = 7  # 1: the slot's sampling applies its slot.grammar_mask row
SAMPLING_LOGPROBS = 8  # 1: the request reads logprobs (out.logprobs, out.top_ids) of its tokens
SAMPLING_COLUMNS = 9


def mask_words(vocab_size: int) -> int:
    """int32 words in one token bitmask row (bit t % 32 of word t // 32 allows token t)."""
    return (vocab_size + 31) // 32


class GraphKind(IntEnum):
    """Step program kinds; values appear in completion records and metrics."""

    INITIALIZE = 1  # reset a slot's penalty state, mark prompt tokens
    PREFILL = 2  # consume up to t prompt tokens per row, optionally sample
    DECODE = 3  # consume each row's last sampled token, sample the next
    SNAPSHOT = 4  # copy a slot's tail page + hidden state into a snapshot row
    RESTORE = 5  # copy a snapshot row into a slot's private tail page
    RESUME = 6  # sample from a slot's saved hidden state without replaying tokens
    # one forward over a decode cohort (w rows) and packed prefill chunks (up to p prompt
    # tokens in variable-length rows); w = 0 is packed prefill alone
    MIXED = 7
    # verify drafts: each of b rows scores w target positions (its last token and up to w - 1
    # drafts), accepts the longest agreeing prefix and samples the token after it
    SPECULATIVE = 8
    # reserved for later kinds: VISION, SCORED_PREFILL


# Prefill rows a MIXED graph packs besides its decode width (step.* row buffers grow by this).
MIXED_PREFILL_ROWS = 8
# The smallest prompt capacity a MIXED graph is captured with: below it the decode cohort's
# own weight pass dominates and a pure decode or prefill step does as well.
MIXED_MIN_PROMPT = 512
MIXED_SMALL_PROMPTS = (128,)
# SPECULATIVE graphs: target widths w (1 + draft depth) are captured for batch capacities up to
# this; a width's tokens must fit one completion record (RECORD_TOKENS).
SPECULATIVE_MAX_BATCH = 32


def speculative_widths(depth: int) -> tuple[int, ...]:
    """The target widths captured for drafts of at most ``depth`` tokens: 2, 3, 5 and depth + 1
    (a short width costs less when only a prefix of the drafts is expected to survive)."""
    if not 1 <= depth < RECORD_TOKENS:
        raise ValueError(f"speculative depth must be between 1 and {RECORD_TOKENS - 1}, got {depth}")
    return tuple(sorted({w for w in (2, 3, 5) if w <= depth + 1} | {depth + 1}))


@dataclass(frozen=True)
class GraphSpec:
    index: int
    kind: GraphKind
    batch: int  # row capacity b
    tokens: int = 1  # token capacity t per row (prefill), 1 otherwise; MIXED: prompt capacity p;
    # SPECULATIVE: target width w (the row's last token and up to w - 1 drafts)
    greedy: bool = False  # DECODE variant for cohorts that are all greedy without logprobs
    width: int = 0  # MIXED: decode width w (rows 0..w-1 decode, rows w..batch-1 prefill)

    @property
    def label(self) -> str:
        if self.kind == GraphKind.SPECULATIVE:  # target width w, b * w packed target rows
            return (f"speculative b{self.batch} w{self.tokens} rows{self.batch * self.tokens}"
                    + (" greedy" if self.greedy else ""))
        if self.kind == GraphKind.MIXED:
            return f"mixed b{self.batch} p{self.tokens} w{self.width}" + (" greedy" if self.greedy else "")
        return f"{self.kind.name.lower()} b{self.batch} t{self.tokens}" + (" greedy" if self.greedy else "")

    @property
    def prefill_rows(self) -> int:
        """MIXED: the packed prefill rows' capacity (the rows after the decode width)."""
        return self.batch - self.width


@dataclass(frozen=True)
class BufferSpec:
    name: str
    shape: tuple[int, ...]
    dtype: str  # numpy dtype name
    role: str  # "slot" | "step" | "out"

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape)) * np.dtype(self.dtype).itemsize

    @property
    def row_bytes(self) -> int:
        return self.nbytes // self.shape[0]


def power_of_two_capacities(limit: int, start: int = 1) -> tuple[int, ...]:
    """start, 2*start, ... up to the smallest power of two >= limit."""
    caps = [start]
    while caps[-1] < limit:
        caps.append(caps[-1] * 2)
    return tuple(caps)


@dataclass(frozen=True)
class PreparedContract:
    """Everything the host and the step programs agree on for one loaded core."""

    max_active: int  # S: physical request slots 1..S
    context: int  # tokens per request (prompt + output)
    prefill_chunk_size: int  # T_max
    num_pages: int  # logical KV pages (physical page = logical + 1; 0 is scratch)
    num_snapshot_rows: int
    vocab_size: int
    hidden_size: int
    page_tokens: int = PAGE_TOKENS
    top_logprobs: int = MAX_TOP_LOGPROBS
    mixed_prefill: bool = False  # MIXED graphs captured (flare export --mixed-prefill)
    speculative_widths: tuple[int, ...] = ()  # SPECULATIVE target widths captured (none: no speculation)
    graphs: tuple[GraphSpec, ...] = field(default=())

    @property
    def max_pages_per_request(self) -> int:
        return -(-self.context // self.page_tokens)

    @property
    def batch_capacities(self) -> tuple[int, ...]:
        return power_of_two_capacities(self.max_active)

    @property
    def prefill_capacities(self) -> tuple[int, ...]:
        return tuple(t for t in power_of_two_capacities(self.prefill_chunk_size, 64)
                     if t <= self.prefill_chunk_size)

    @property
    def max_batch(self) -> int:
        return self.batch_capacities[-1]

    @property
    def mixed_prompt_capacities(self) -> tuple[int, ...]:
        """MIXED prompt capacities p: MIXED_SMALL_PROMPTS (a short remainder beside the
        decoders costs little more than their decode step) and the prefill capacities from
        MIXED_MIN_PROMPT up; the largest prefill capacity at least."""
        caps = self.prefill_capacities
        return tuple(t for t in caps if t in MIXED_SMALL_PROMPTS or t >= MIXED_MIN_PROMPT) or caps[-1:]

    @property
    def step_rows(self) -> int:
        """Rows of the step.* row buffers: the largest batch, plus a MIXED graph's prefill rows."""
        return self.max_batch + (self.mixed_rows if self.mixed_prefill else 0)

    @property
    def speculative_batches(self) -> tuple[int, ...]:
        if not self.speculative_widths:
            return ()
        return tuple(b for b in self.batch_capacities if b <= SPECULATIVE_MAX_BATCH)

    @property
    def mixed_rows(self) -> int:
        return min(MIXED_PREFILL_ROWS, self.max_active)

    @classmethod
    def build(cls, *, max_active: int, context: int, prefill_chunk_size: int, num_pages: int,
              num_snapshot_rows: int, vocab_size: int, hidden_size: int,
              mixed_prefill: bool = False, speculative_widths: tuple[int, ...] = ()) -> "PreparedContract":
        if any(not 2 <= w <= RECORD_TOKENS for w in speculative_widths):
            raise ValueError(f"speculative widths must be between 2 and {RECORD_TOKENS}, got {speculative_widths}")
        base = cls(max_active=max_active, context=context, prefill_chunk_size=prefill_chunk_size,
                   num_pages=num_pages, num_snapshot_rows=num_snapshot_rows,
                   vocab_size=vocab_size, hidden_size=hidden_size, mixed_prefill=mixed_prefill,
                   speculative_widths=tuple(sorted(set(speculative_widths))))
        graphs: list[GraphSpec] = []

        def add(kind: GraphKind, batch: int, tokens: int = 1, greedy: bool = False, width: int = 0) -> None:
            graphs.append(GraphSpec(len(graphs), kind, batch, tokens, greedy, width))

        for b in base.batch_capacities:
            add(GraphKind.DECODE, b)
            # argmax sampling skips the full-vocabulary sort and the top-20 logprobs
            add(GraphKind.DECODE, b, greedy=True)
        for t in base.prefill_capacities:
            add(GraphKind.PREFILL, 1, t)
        # Cohort prefill: several requests' chunks in one step, within the same token
        # budget as the largest single chunk (short prompts no longer take a weight pass each).
        for b in base.batch_capacities[1:]:
            for t in base.prefill_capacities:
                if b * t <= base.prefill_chunk_size:
                    add(GraphKind.PREFILL, b, t)
        # INITIALIZE resets its rows' penalty state and marks the prompt tokens (step.prompt) of
        # its first row only: a burst of admissions takes one step, not one each.
        for b in base.batch_capacities:
            add(GraphKind.INITIALIZE, b)
        for kind in (GraphKind.SNAPSHOT, GraphKind.RESTORE, GraphKind.RESUME):
            for b in base.batch_capacities:
                add(kind, b)
        if mixed_prefill:
            # Mixed steps: each decode width (0: packed prefill alone) with each prompt capacity,
            # the prefill rows after the decode rows.
            rows = base.mixed_rows
            for w in (0, *base.batch_capacities):
                for p in base.mixed_prompt_capacities:
                    add(GraphKind.MIXED, w + rows, p, width=w)
                    # every sampled row greedy without logprobs: argmax instead of a vocabulary sort
                    # (at 72 rows of Llama 3's vocabulary the general sampler cost 5-7 ms a step)
                    add(GraphKind.MIXED, w + rows, p, greedy=True, width=w)
        for b in base.speculative_batches:
            for w in base.speculative_widths:
                add(GraphKind.SPECULATIVE, b, w)
                add(GraphKind.SPECULATIVE, b, w, greedy=True)  # argmax verification, no vocabulary sort
        return cls(**{**base.__dict__, "graphs": tuple(graphs)})

    def graph(self, kind: GraphKind, batch: int, tokens: int = 1, greedy: bool = False) -> GraphSpec:
        for g in self.graphs:
            if g.kind == kind and g.batch == batch and g.tokens == tokens and g.greedy == greedy:
                return g
        raise KeyError(f"no {kind.name} graph with b={batch} t={tokens}{' (greedy)' if greedy else ''}")

    def buffers(self) -> tuple[BufferSpec, ...]:
        s1, bmax, tmax = self.max_active + 1, self.step_rows, self.prefill_chunk_size
        return (
            BufferSpec("slot.generation", (s1,), "int64", "slot"),
            BufferSpec("slot.token", (s1,), "int64", "slot"),
            BufferSpec("slot.position", (s1,), "int64", "slot"),
            BufferSpec("slot.generated", (s1,), "int64", "slot"),
            BufferSpec("slot.seed", (s1,), "int64", "slot"),
            BufferSpec("slot.sampling", (s1, SAMPLING_COLUMNS), "float32", "slot"),
            BufferSpec("slot.page_table", (s1, self.max_pages_per_request), "int64", "slot"),
            # structured output: the allowed next tokens of a constrained slot (SAMPLING_GRAMMAR)
            BufferSpec("slot.grammar_mask", (s1, mask_words(self.vocab_size)), "int32", "slot"),
            BufferSpec("step.slots", (bmax,), "int64", "step"),
            BufferSpec("step.tokens", (bmax, tmax), "int64", "step"),
            BufferSpec("step.num_tokens", (bmax,), "int64", "step"),
            BufferSpec("step.sample", (bmax,), "int64", "step"),
            BufferSpec("step.snapshot_rows", (bmax,), "int64", "step"),
            BufferSpec("step.prompt", (self.context,), "int64", "step"),
            BufferSpec("step.prompt_len", (1,), "int64", "step"),
            BufferSpec("step.output_len", (1,), "int64", "step"),  # output tokens after the prompt in step.prompt
            BufferSpec("step.frame", (1,), "int64", "step"),
            # NOTE: outputs are indexed by step.frame: the copy of frame k's records runs on
            # the copy stream while the next programs write the other frames.
            BufferSpec("out.records", (FRAMES, s1, RECORD_FIELDS), "int64", "out"),
            BufferSpec("out.logprobs", (FRAMES, s1, 1 + self.top_logprobs), "float32", "out"),
            BufferSpec("out.top_ids", (FRAMES, s1, self.top_logprobs), "int64", "out"),
        )

    def to_json(self) -> dict:
        return {
            "max_active": self.max_active, "context": self.context,
            "prefill_chunk_size": self.prefill_chunk_size, "num_pages": self.num_pages,
            "num_snapshot_rows": self.num_snapshot_rows, "page_tokens": self.page_tokens,
            "mixed_prefill": self.mixed_prefill, "speculative_widths": list(self.speculative_widths),
            "graphs": [g.label for g in self.graphs],
        }
