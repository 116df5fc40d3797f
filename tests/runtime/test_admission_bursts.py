"""INITIALIZE steps of several rows, through the real step programs and runtime on the CPU.

A burst of admissions initializes together: one program resets every row's penalty counts
and marks the prompt tokens of its first row (the scheduler puts a request with marks
first; tests/scheduler covers that choice). Requests initialized together must sample
exactly what each samples alone, penalties included.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flare.config import EngineConfig
from flare.contract import GraphKind
from flare.engine.model import NativeModel
from flare.request import FinishEvent, SamplingParams, TokenEvent
from tests.model.harness import Harness, save_tiny
from tests.model.test_parity_tiny import _make, _prompt
from tests.runtime.bursts import submit_all

PENALISED = dict(temperature=0.9, top_p=0.95, presence_penalty=0.3, frequency_penalty=0.4, repetition_penalty=1.3)


@pytest.fixture(scope="module")
def tiny_core(tmp_path_factory):
    ckpt = save_tiny(_make("llama"), tmp_path_factory.mktemp("burst-ckpt"))
    out = tmp_path_factory.mktemp("burst-core") / "core"
    Harness.export(ckpt, out, context=512, chunk=128, max_active=8).close()
    return out


def test_one_initialize_resets_every_row_and_marks_the_first(tiny_core):
    h = Harness(tiny_core)
    try:
        programs = h.programs
        slots = [3, 1, 2]
        programs.prompt_counts[slots] = 7  # what earlier requests in these slots left
        programs.output_counts[slots] = 5
        prompt = np.array([4, 9, 9, 4, 4, 11])
        for s in slots:
            h.inputs.admit_slot(s, generation=1, position=0, seed=0, params=SamplingParams(repetition_penalty=1.2))
        h.inputs.set_rows(slots, 4)
        h.inputs.set_prompt(prompt)
        h.run(GraphKind.INITIALIZE, 4)
        want = torch.zeros(programs.prompt_counts.shape[1], dtype=torch.int32)
        want.index_add_(0, torch.as_tensor(prompt), torch.ones(len(prompt), dtype=torch.int32))
        assert torch.equal(programs.prompt_counts[3], want)
        assert int(programs.prompt_counts[[1, 2]].abs().sum()) == 0
        assert int(programs.output_counts[slots].abs().sum()) == 0
    finally:
        h.close()


def _serve(core, specs) -> tuple[list[list[int]], int]:
    """Submit every spec at once; -> each request's tokens and the INITIALIZE launches."""
    model = NativeModel.load(core, EngineConfig(device="cpu", max_active=8))
    try:
        out = []
        for events in submit_all(model, specs):
            assert isinstance(events[-1], FinishEvent), events[-1]
            out.append([t for e in events if isinstance(e, TokenEvent) for t in e.token_ids])
        return out, model.runtime.stats().launches.get("initialize", 0)
    finally:
        model.close()


def test_requests_initialized_together_sample_what_they_sample_alone(tiny_core):
    specs = [(_prompt(900 + i, 20 + 9 * i),
              SamplingParams(max_tokens=24, seed=5 + i, ignore_eos=True, **(PENALISED if i % 3 == 1 else
                                                                              dict(temperature=0.8))))
             for i in range(6)]
    together, launches = _serve(tiny_core, specs)
    alone = [_serve(tiny_core, [spec])[0][0] for spec in specs]
    assert together == alone
    assert 1 <= launches <= len(specs), launches
