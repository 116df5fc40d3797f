"""Requests submitted to a loaded model all at once, and their events collected."""

from __future__ import annotations

import threading

import numpy as np

from flare.request import ErrorEvent, FinishEvent, PreparedPrompt


def submit_all(model, specs, timeout: float = 300) -> list[list]:
    """Submit every (prompt tokens, SamplingParams) without waiting; -> each request's events,
    once every request has ended."""
    runs = []
    for prompt, params in specs:
        events, done = [], threading.Event()

        def sink(event, events=events, done=done):
            events.append(event)
            if isinstance(event, (FinishEvent, ErrorEvent)):
                done.set()

        model.submit(PreparedPrompt(np.asarray(prompt).astype(np.int32)), params, sink)
        runs.append((events, done))
    for _, done in runs:
        assert done.wait(timeout), "a request did not end"
    return [events for events, _ in runs]
