"""Two tensor-parallel ranks give one rank's greedy tokens through the whole runtime, on tiny
float32 Llama and Qwen3 models (Qwen3: q/k norms on sharded heads): on CPU ranks (gloo), and on
GPU ranks (NCCL, the collectives captured inside the CUDA graphs), which needs two GPUs (issue
28's machine; NCCL refuses two ranks on one device)."""

from __future__ import annotations

import pytest
import torch

from flare.config import EngineConfig
from flare.core.export import ExportOptions, export_core
from flare.engine.model import NativeModel
from flare.request import FinishEvent, SamplingParams, TokenEvent
from tests.model.harness import save_tiny
from tests.model.test_parity_tiny import _make, _prompt

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(torch.cuda.device_count() < 2,
                                                                reason="needs two GPUs"))]


def greedy(model: NativeModel, prompts, steps: int) -> list[list[int]]:
    out = []
    for prompt in prompts:
        events = list(model.generate(prompt, SamplingParams(max_tokens=steps, temperature=0, ignore_eos=True),
                                     timeout=120))
        assert isinstance(events[-1], FinishEvent), events[-1]
        out.append([t for e in events if isinstance(e, TokenEvent) for t in e.token_ids])
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_two_ranks_give_one_ranks_greedy_tokens(family, device, tmp_path):
    torch.backends.cuda.matmul.allow_tf32 = False
    ckpt = save_tiny(_make(family), tmp_path / "ckpt")
    core = tmp_path / "core"
    export_core(ckpt, core, ExportOptions(context=1024, prefill_chunk_size=128, max_active=4, dtype="float32"))
    prompts = [_prompt(1, 40).tolist(), _prompt(2, 150).tolist(), _prompt(3, 7).tolist()]
    one = NativeModel.load(core, EngineConfig(device=device, kv_memory_bytes=256 << 20))
    try:
        expected = greedy(one, prompts, 32)
    finally:
        one.close()
    two = NativeModel.load(core, EngineConfig(device=device, kv_memory_bytes=256 << 20, tensor_parallel=2))
    try:
        assert greedy(two, prompts, 32) == expected
    finally:
        two.close()
