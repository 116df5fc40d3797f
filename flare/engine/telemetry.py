"""Typed engine telemetry: the one place engine statistics are named.

:class:`EngineStats` is what an engine publishes: counters (monotonic since
start), gauges (a value now) and successful graph launches by kind. /metrics, ``ServingSession.snapshot``,
the fake engine and docs/metrics.md all derive from its fields: each field's
metadata carries its Prometheus type and help text, and a test checks the
document against them.

The real runtime's model thread builds a new EngineStats after a turn that
changed something (at most every :data:`PUBLISH_INTERVAL_S`, and always before
it goes idle or stops), and readers on any thread take the latest one: a plain
attribute read of an immutable value, never scheduler state mid-update.
The dashboard's per-completion and per-request telemetry is engine/trace.py's.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Iterator, Mapping

COUNTER, GAUGE = "counter", "gauge"
PUBLISH_INTERVAL_S = 0.010  # while busy; an idle or stopping runtime publishes at once

# Graph kinds always exported as flare_graph_launches_total{kind=...}, launched or not.
GRAPH_KINDS = ("initialize", "restore", "snapshot", "vision", "prefill", "scored_prefill",
               "resume_sampling", "decode", "speculative", "mixed")


def _stat(kind: str, help_text: str):
    return field(default=0, metadata={"kind": kind, "help": help_text})


@dataclass(frozen=True)
class EngineStats:
    """Counters and gauges of one engine (docs/metrics.md lists each with its exported name)."""

    requests_admitted: int = _stat(COUNTER, "Requests admitted by the model runtime.")
    requests_completed: int = _stat(COUNTER, "Requests that finished successfully (stop or length).")
    requests_cancelled: int = _stat(COUNTER, "Requests cancelled before finishing (client disconnects included).")
    requests_failed: int = _stat(COUNTER, "Requests that ended with an execution failure.")
    prefix_lookups: int = _stat(COUNTER, "Prefix cache lookups, including admissions later rejected for resource "
                                         "pressure.")
    prefix_hits: int = _stat(COUNTER, "Prefix cache lookups that reused at least one cached token.")
    prefix_misses: int = _stat(COUNTER, "Prefix cache lookups that reused nothing.")
    prefix_reused_tokens: int = _stat(COUNTER, "Prompt tokens served from the prefix cache.")
    checkpoints_published: int = _stat(COUNTER, "Unique prefix checkpoints that became ready (duplicate proposals "
                                                "excluded).")
    checkpoint_evictions: int = _stat(COUNTER, "Logical evictions of cached checkpoints.")
    prompt_tokens: int = _stat(COUNTER, "Prompt tokens consumed by prefill (padding and prefix reuse excluded).")
    generated_tokens: int = _stat(COUNTER, "Output tokens committed, including EOS and tokens withheld by stop "
                                           "strings.")
    device_busy_seconds: float = _stat(COUNTER, "Measured device time of completed steps (CUDA events on a GPU).")
    slots_live: int = _stat(GAUGE, "Request slots holding a live request.")
    slots_free: int = _stat(GAUGE, "Request slots free for admission (retirement fences completed).")
    slots_retiring: int = _stat(GAUGE, "Request slots awaiting retirement of their final GPU use.")
    pages_reusable: int = _stat(GAUGE, "KV pages whose fences have completed and can be allocated.")
    snapshots_reusable: int = _stat(GAUGE, "Snapshot rows whose fences have completed and can be allocated.")
    checkpoints_cached: int = _stat(GAUGE, "Prefix checkpoints held by the cache.")
    pages_cached: int = _stat(GAUGE, "KV pages owned by cached checkpoints.")
    requests_pending: int = _stat(GAUGE, "Requests admitted by the model runtime and waiting for a slot.")
    requests_preempted: int = _stat(COUNTER, "Requests preempted for KV pages (each continues as a new admission).")
    preempted_restored: int = _stat(COUNTER, "Preempted requests readmitted from their own checkpoint (nothing "
                                             "replayed but the last sampled token).")
    preempted_recomputed: int = _stat(COUNTER, "Preempted requests readmitted by recomputing past the longest "
                                               "cached prefix (their checkpoint was evicted or never taken).")
    grammar_steps: int = _stat(COUNTER, "Steps that sampled a structured-output request.")
    grammar_held_steps: int = _stat(COUNTER, "Structured-output steps submitted before their token masks were known "
                                             "(their forward part ran while the masks were computed).")
    grammar_compiles: int = _stat(COUNTER, "Structured-output constraints compiled (grammar cache misses).")
    grammar_compile_errors: int = _stat(COUNTER, "Structured-output constraints refused because they cannot be "
                                                 "enforced.")
    grammar_cache_hits: int = _stat(COUNTER, "Structured-output constraints served from the compiled-grammar cache.")
    grammar_compile_seconds: float = _stat(COUNTER, "Wall time spent compiling structured-output constraints.")
    grammars_cached: int = _stat(GAUGE, "Compiled grammars held by the grammar cache.")
    outputs_carried_back: int = _stat(COUNTER, "Requests that carried a recorded output back and took the tokens "
                                               "it was generated with in place of its re-encoding.")
    reused_output_tokens: int = _stat(COUNTER, "Prompt tokens taken from recorded outputs (frontend/continuations.py).")
    outputs_recorded: int = _stat(GAUGE, "Finished requests' outputs held for the next turns that carry them back.")
    speculative_verification_steps: int = _stat(COUNTER, "Completed speculative (verification) graphs.")
    speculative_drafter_steps: int = _stat(COUNTER, "Learned-proposal depth D summed over completed speculative "
                                                    "programs (copy proposals contribute none).")
    speculative_draft_tokens: int = _stat(COUNTER, "Draft positions allocated to progressing generation rounds, "
                                                   "rejected ones included.")
    speculative_accepted_tokens: int = _stat(COUNTER, "Drafted tokens accepted by verification (bonus tokens "
                                                      "excluded).")
    speculative_draft_rounds: int = _stat(COUNTER, "Request rounds that offered at least one draft.")
    speculative_generation_rounds: int = _stat(COUNTER, "Progressing generation request rounds (decode, mixed and "
                                                        "speculative rows).")
    speculative_mean_acceptance_length: float = _stat(GAUGE, "Accepted drafts per request round with at least one "
                                                             "offered draft (bonus token excluded).")
    speculative_depth: float = _stat(GAUGE, "DEPTH: allocated draft positions per progressing generation request "
                                            "round, zero-draft rounds included.")
    launches: Mapping[str, int] = field(default_factory=dict)  # successful graph launches by kind name


def stat_fields(kind: str | None = None) -> Iterator[tuple[str, str, str]]:
    """(name, kind, help) of every counter and gauge, in declaration order."""
    for f in fields(EngineStats):
        if "kind" in f.metadata and (kind is None or f.metadata["kind"] == kind):
            yield f.name, f.metadata["kind"], f.metadata["help"]
