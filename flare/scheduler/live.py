"""LiveRequest: the scheduler's state for one request, queued or resident."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..cache import PrefixHistory
from ..request import SamplingParams
from .plan import Ended, Handle, Phase


@dataclass(eq=False)
class LiveRequest:
    rid: int
    prompt: np.ndarray  # int32 [L]
    endpoints: tuple[int, ...]  # complete-message token endpoints inside the prompt
    params: SamplingParams
    seed: int
    arrival: float
    stop_ids: frozenset[int]  # EOS (unless ignore_eos) and stop_token_ids

    phase: Phase = Phase.QUEUED
    handle: Handle | None = None
    epoch: int = 0
    history: PrefixHistory | None = None
    reused: int = 0  # prompt tokens reused from the cache at admission
    tip: int | None = None  # the pinned checkpoint at the end of this request's chain
    tip_endpoint: int = 0
    pages: list[int] = field(default_factory=list)  # logical page IDs by page index
    private_from: int = 0  # pages[i] for i >= private_from belong to this request
    uploaded_pages: int = 0  # page-table entries already uploaded
    page_budget: int = 0  # pages still reserved for this request
    targets: list[int] = field(default_factory=list)  # checkpoint endpoints still to capture
    target_rows: list[int] = field(default_factory=list)  # their reserved snapshot rows
    terminal_row: int = -1  # snapshot row reserved for a terminal capture
    snapshot_due: int = -1  # endpoint whose snapshot is the next step (SNAPSHOTTING)

    consumed: int = 0  # device position confirmed by completions
    planned: int = 0  # device position after every committed step
    generated: int = 0
    planned_generated: int = 0
    sampled: list[int] = field(default_factory=list)  # confirmed sampled tokens
    inflight: int = 0  # committed steps not yet completed
    last_fence: int = 0  # latest fence of a step that touches this request
    ended: Ended | None = None
    cancelled: bool = False

    # fairness (seconds of unserved execution, relative) and timing
    token_debt: float = 0.0
    delivery_debt: float = 0.0
    finished_at: float = 0.0
    last_progress: float = 0.0  # last commit of prompt/output tokens (or arrival)
    last_output: float | None = None  # last published output

    @property
    def prompt_len(self) -> int:
        return int(self.prompt.shape[0])

    @property
    def max_tokens(self) -> int:
        return self.params.max_tokens

    @property
    def next_stop(self) -> int:
        """Where the current prefill chunk must end: the next target or the prompt end."""
        for t in self.targets:
            if t > self.planned:
                return t
        return self.prompt_len

    @property
    def is_decodable(self) -> bool:
        return (self.phase == Phase.DECODING and self.ended is None
                and self.planned_generated < self.max_tokens)

    def bump(self) -> None:
        self.epoch += 1
