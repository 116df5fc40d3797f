"""Captured CUDA graphs give the same greedy tokens as transformers (float32, tiny models),
and snapshots taken on them resume where their slot left off."""

from __future__ import annotations

import pytest
import torch

from tests.model.harness import Harness, save_tiny
from tests.model.test_parity_tiny import (
    _greedy,
    _make,
    _prompt,
    _reference,
    logprobs_follow_the_logits,
    mixed_steps_match_transformers,
    resume_after_decode_steps,
)

STEPS = 64


@pytest.fixture(scope="module", params=["llama", "qwen3"])
def tiny_cuda(request, tmp_path_factory):
    torch.backends.cuda.matmul.allow_tf32 = False
    model = _make(request.param)
    ckpt = save_tiny(model, tmp_path_factory.mktemp(f"{request.param}-ckpt"))
    h = Harness.export(ckpt, tmp_path_factory.mktemp(f"{request.param}-core") / "core",
                       context=1024, chunk=128, device="cuda")
    yield model, h
    h.executor.close()


def test_greedy_tokens_match_transformers_for_64_steps(tiny_cuda):
    model, h = tiny_cuda
    prompts = {1: _prompt(1, 40), 2: _prompt(2, 150), 3: _prompt(3, 7)}
    tokens, logits = _greedy(h, prompts, STEPS, generation_base=50)
    for s, p in prompts.items():
        ref = _reference(model, p, tokens[s])
        assert ref.argmax(-1).tolist() == tokens[s], f"slot {s}: greedy tokens differ from transformers"
        diff = (torch.stack(logits[s]) - ref).abs().max().item()
        assert diff <= 2e-3, f"slot {s}: max |logit difference| {diff}"


def test_resume_from_a_snapshot_taken_after_decode_steps(tiny_cuda):
    """The captured graphs: the decode commit kernel stores the hidden row a snapshot keeps."""
    resume_after_decode_steps(tiny_cuda[1])


def test_captured_logprobs_follow_the_logits(tiny_cuda):
    """The captured general decode graph writes the logprobs of the slot that asks (the
    write_logprobs kernels), as the reference programs do."""
    logprobs_follow_the_logits(tiny_cuda[1])


def _check_cuda(model, prompt, tokens, logits) -> None:
    ref = _reference(model, prompt, tokens)
    assert ref.argmax(-1).tolist() == tokens, "greedy tokens differ from transformers"
    assert (torch.stack(logits) - ref).abs().max().item() <= 2e-3


def test_captured_mixed_steps_match_transformers(tmp_path_factory):
    """MIXED graphs captured on the GPU (the packed-rows kernel beside the decode kernel):
    decoders riding inside packed prefill steps still match transformers alone."""
    torch.backends.cuda.matmul.allow_tf32 = False
    model = _make("qwen3")
    ckpt = save_tiny(model, tmp_path_factory.mktemp("mixed-ckpt"))
    h = Harness.export(ckpt, tmp_path_factory.mktemp("mixed-core") / "core", context=1024, chunk=128,
                       device="cuda", max_active=8, mixed_prefill=True)
    try:
        mixed_steps_match_transformers(model, h, _check_cuda)
    finally:
        h.executor.close()
