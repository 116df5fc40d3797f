"""Parity of the paged-KV model code with transformers on random tiny checkpoints.

Greedy tokens must be identical for 32 steps and logits within 1e-3, whether the
prompt is prefilled whole or in chunks, when ragged requests decode together,
and when a request reuses another's cached prefix pages or snapshot.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from flare.contract import FRAMES, REC_CONSUMED, REC_TOKEN0, GraphKind
from flare.errors import ExecutionError

from .harness import Harness, check_held_decode, save_tiny

STEPS = 32
TOL = 1e-3
VOCAB = 512

COMMON = dict(vocab_size=VOCAB, hidden_size=64, intermediate_size=160, num_hidden_layers=3,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024)


def _make(family: str):
    torch.manual_seed({"llama": 1, "qwen2": 2, "qwen3": 3}[family])
    if family == "qwen3":
        model = Qwen3ForCausalLM(Qwen3Config(head_dim=24, **COMMON))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**COMMON))
    else:
        model = LlamaForCausalLM(LlamaConfig(**COMMON))
    # random init is small; scale so greedy paths are not dominated by ties
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() == 2:
                p.mul_(4.0)
    return model.eval()


@pytest.fixture(scope="module", params=["llama", "qwen2", "qwen3"])
def tiny(request, tmp_path_factory):
    model = _make(request.param)
    ckpt = save_tiny(model, tmp_path_factory.mktemp(f"{request.param}-ckpt"))
    harness = Harness.export(ckpt, tmp_path_factory.mktemp(f"{request.param}-core") / "core",
                             context=1024, chunk=128)
    yield model, harness
    harness.close()


def _reference(model, prompt: np.ndarray, generated: list[int]) -> torch.Tensor:
    """HF logits predicting each generated token: [len(generated), V]."""
    ids = torch.tensor(np.concatenate([prompt, np.asarray(generated[:-1], dtype=np.int64)]))[None]
    with torch.no_grad():
        logits = model(ids).logits[0].float()
    return logits[len(prompt) - 1:]


def _check(model, prompt, tokens, our_logits):
    ref = _reference(model, prompt, tokens)
    assert ref.argmax(-1).tolist() == tokens, "greedy tokens differ from transformers"
    diff = (torch.stack(our_logits) - ref).abs().max().item()
    assert diff <= TOL, f"max |logit difference| {diff}"


def _generate(h: Harness, slot: int, prompt: np.ndarray, chunks: list[int], start: int = 0):
    tokens = [h.prefill(slot, prompt, start, chunks)]
    logits = [h.logits(slot)]
    for _ in range(STEPS - 1):
        tokens.append(h.decode([slot])[slot])
        logits.append(h.logits(slot))
    return tokens, logits


def _prompt(seed: int, n: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, n).astype(np.int64)


def _greedy(h: Harness, prompts: dict[int, np.ndarray], steps: int, generation_base: int = 10):
    """Prefill each slot's prompt alone (two chunks past 128 tokens), then decode all of them
    together: ``steps`` greedy tokens per slot and the logits each was sampled from."""
    tokens, logits = {}, {}
    for s, p in prompts.items():
        h.admit(s, generation=generation_base + s)
        tokens[s] = [h.prefill(s, p, 0, [len(p)] if len(p) <= 128 else [128, len(p) - 128])]
        logits[s] = [h.logits(s)]
    h.decode_steps(tokens, logits, steps - 1)
    return tokens, logits


@pytest.mark.parametrize("length,chunks", [(37, [37]), (150, [64, 64, 22]), (200, [128, 72]), (129, [1, 128])])
def test_prefill_and_decode_match_transformers(tiny, length, chunks):
    model, h = tiny
    prompt = _prompt(length, length)
    h.admit(1)
    tokens, logits = _generate(h, 1, prompt, chunks)
    _check(model, prompt, tokens, logits)


def test_cohort_prefill_of_ragged_prompts(tiny):
    """Two prompts of different lengths prefilled in one b2 step, a third alone in the same
    graph (a padding row), then all decoded together: each matches transformers on its own."""
    model, h = tiny
    prompts = {slot: _prompt(40 + slot, n) for slot, n in zip((1, 2, 3), (37, 5, 60))}
    for slot, p in prompts.items():
        h.admit(slot, prompt=p)
    first = h.prefill_together({1: prompts[1], 2: prompts[2]}, batch=2, tokens=64)
    first |= h.prefill_together({3: prompts[3]}, batch=2, tokens=64)
    tokens = {slot: [first[slot]] for slot in prompts}
    logits = {slot: [h.logits(slot)] for slot in prompts}
    h.decode_steps(tokens, logits, 7)
    for slot, p in prompts.items():
        _check(model, p, tokens[slot], logits[slot])


@pytest.fixture(scope="module")
def tiny_mixed(tmp_path_factory):
    model = _make("qwen3")
    ckpt = save_tiny(model, tmp_path_factory.mktemp("mixed-ckpt"))
    harness = Harness.export(ckpt, tmp_path_factory.mktemp("mixed-core") / "core", context=1024, chunk=128,
                             max_active=8, mixed_prefill=True)
    yield model, harness
    harness.close()


def test_mixed_steps_match_transformers(tiny_mixed):
    """Decode rows riding inside packed prefill steps: two requests decode while three
    prompts prefill packed in one stream (one of them cut across two steps, one finishing in
    the first), and every request's tokens and logits still match transformers alone."""
    mixed_steps_match_transformers(*tiny_mixed)


def mixed_steps_match_transformers(model, h, check=None) -> None:
    """The body of test_mixed_steps_match_transformers (tests/gpu runs it on captured graphs)."""
    check = check or _check
    prompts = {slot: _prompt(200 + slot, n) for slot, n in zip((1, 2, 3, 4, 5), (20, 45, 37, 70, 9))}
    for slot, p in prompts.items():
        h.admit(slot, prompt=p)
    tokens = {s: [h.prefill(s, prompts[s], 0, [len(prompts[s])])] for s in (1, 2)}
    logits = {s: [h.logits(s)] for s in (1, 2)}
    # step 1: decode 1, 2; prefill all of 3 and 5 and the first 50 tokens of 4 (128 tokens packed: 37 + 50 + 9)
    out = h.mixed([1, 2], {3: (prompts[3], True), 4: (prompts[4][:50], False), 5: (prompts[5], True)},
                  width=2, tokens=128)
    for s in (1, 2):
        tokens[s].append(out[s])
        logits[s].append(h.logits(s))
    for s in (3, 5):
        tokens[s], logits[s] = [out[s]], [h.logits(s)]
    # step 2: four decoders (a padded width of 4) and the rest of 4
    out = h.mixed([1, 2, 3, 5], {4: (prompts[4][50:], True)}, width=4, tokens=128)
    for s in (1, 2, 3, 5):
        tokens[s].append(out[s])
        logits[s].append(h.logits(s))
    tokens[4], logits[4] = [out[4]], [h.logits(4)]
    h.decode_steps(tokens, logits, 6)
    for s, p in prompts.items():
        check(model, p, tokens[s], logits[s])


def test_ragged_batch_decode(tiny):
    model, h = tiny
    prompts = {s: _prompt(100 + s, n) for s, n in zip((1, 2, 3, 4), (5, 70, 131, 64))}
    tokens, logits = _greedy(h, prompts, STEPS)
    for s, p in prompts.items():
        _check(model, p, tokens[s], logits[s])


def test_frames_in_flight_complete_in_order_then_backpressure(tiny):
    """The CPU executor holds FRAMES submissions in flight, each with its own completion
    frame: they complete in fence order with the device state advancing step by step and the
    tokens of the same decode run one step at a time; one more submission gets backpressure."""
    model, h = tiny
    prompt = _prompt(900, 20)
    h.admit(1, generation=90)
    alone = [h.prefill(1, prompt, 0, [20])] + [h.decode([1])[1] for _ in range(FRAMES)]
    h.admit(1, generation=91)
    assert h.prefill(1, prompt, 0, [20]) == alone[0]
    h.alloc_pages(1, h.position(1) + FRAMES + 1)
    h.inputs.set_rows([1], 1)
    graph = h.contract.graph(GraphKind.DECODE, 1)
    fences = [h.executor.submit(graph.index, h.inputs.take()) for _ in range(FRAMES)]
    assert h.executor.outstanding == FRAMES and not h.executor.can_submit()
    with pytest.raises(ExecutionError, match=f"all {FRAMES} frames"):
        h.executor.submit(graph.index, [])
    done = [h.executor.poll(timeout=120) for _ in fences]
    assert [d.fence for d in done] == fences and all(d.error is None for d in done)
    assert [int(d.records[1, REC_CONSUMED]) for d in done] == [21 + i for i in range(FRAMES)]
    assert [int(d.records[1, REC_TOKEN0]) for d in done] == alone[1:]


def test_prefix_pages_reused(tiny):
    """Request B maps A's two complete prompt pages and prefills only its own tail."""
    model, h = tiny
    shared = _prompt(7, 128)
    a = np.concatenate([shared, _prompt(8, 40)])
    b = np.concatenate([shared, _prompt(9, 25)])
    h.admit(1)
    h.prefill(1, a, 0, [128, 40])
    h.share_pages(2, h.pages[1][:2])
    h.admit(2, position=128)
    tokens, logits = _generate(h, 2, b, [25], start=128)
    _check(model, b, tokens, logits)


def test_snapshot_restore_resumes_without_replay(tiny):
    """A full prompt hit restores a snapshot (partial tail page + hidden) and samples."""
    model, h = tiny
    prompt = _prompt(11, 100)  # one complete page plus 36 tokens in the tail
    h.admit(1)
    first = h.prefill(1, prompt, 0, [100])
    h.inputs.set_rows([1], 1)
    h.inputs.set_snapshot_rows([0], 1)
    h.run(GraphKind.SNAPSHOT, 1)
    # slot 3: share the complete page, own a fresh tail page, restore and resume
    h.share_pages(3, h.pages[1][:1])
    h.alloc_pages(3, 101)
    h.admit(3, position=0)
    h.inputs.set_rows([3], 1)
    h.inputs.set_snapshot_rows([0], 1)
    h.run(GraphKind.RESTORE, 1)
    h.inputs.set_rows([3], 1)
    done = h.run(GraphKind.RESUME, 1)
    tokens = [int(done.records[3, 16])]
    assert tokens[0] == first
    logits = [h.logits(3)]
    for _ in range(STEPS - 1):
        tokens.append(h.decode([3])[3])
        logits.append(h.logits(3))
    _check(model, prompt, tokens, logits)


def resume_after_decode_steps(h: Harness) -> None:
    """A snapshot taken after decode steps carries the hidden row the last decode graph's
    commit stored: a slot restored from it resumes with the token that step sampled, and
    then decodes the same tokens as the slot it was taken from."""
    prompt = _prompt(31, 90)
    h.admit(1, generation=90)
    tokens = [h.prefill(1, prompt, 0, [90])]
    for _ in range(5):
        tokens.append(h.decode([1])[1])
    consumed = h.position(1)
    assert consumed == 95
    h.inputs.set_rows([1], 1)
    h.inputs.set_snapshot_rows([0], 1)
    h.run(GraphKind.SNAPSHOT, 1)
    h.share_pages(3, h.pages[1][:consumed // h.contract.page_tokens])
    h.alloc_pages(3, consumed + 1)
    h.admit(3, position=0, generation=91)
    h.inputs.set_rows([3], 1)
    h.inputs.set_snapshot_rows([0], 1)
    h.run(GraphKind.RESTORE, 1)
    h.inputs.set_rows([3], 1)
    resumed = [int(h.run(GraphKind.RESUME, 1).records[3, REC_TOKEN0])]
    assert resumed[0] == tokens[-1], "the resumed sample must be the one the last decode step drew"
    assert torch.equal(h.logits(3), h.logits(1))
    both = {1: [tokens[-1]], 3: resumed}
    h.decode_steps(both, {1: [], 3: []}, 8)
    assert both[3] == both[1]


def logprobs_follow_the_logits(h: Harness) -> None:
    """A slot that asks for logprobs reads, at each decode step, its token's logprob and the
    top logprobs of the logits it drew from (the reference's, within float32 rounding of
    another log-sum-exp order); a greedy request that asks runs the general graph."""
    from flare.model.sampling import token_logprobs
    from flare.request import SamplingParams

    asks = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=5)
    h.admit(1, generation=70, params=asks)
    h.admit(2, generation=71)
    for s in (1, 2):
        h.prefill(s, _prompt(s + 80, 30), 0, [30])
    k = h.contract.top_logprobs
    for _ in range(4):
        done = h.decode_step([1, 2])
        logits = h.logits(1)
        token = int(done.records[1, REC_TOKEN0])
        assert token == int(logits.argmax())
        values, ids = token_logprobs(logits[None], torch.tensor([token]), k)
        assert done.top_ids[1].tolist() == ids[0].tolist()
        np.testing.assert_allclose(done.logprobs[1], values[0].numpy(), rtol=0, atol=1e-4)


def test_logprobs_follow_the_logits(tiny):
    """The reference programs' logprobs (see logprobs_follow_the_logits; tests/gpu runs it on
    the captured graphs and their kernels)."""
    logprobs_follow_the_logits(tiny[1])


def test_snapshot_after_decode_steps_resumes(tiny):
    """The decode program keeps the hidden row a snapshot saves (see resume_after_decode_steps)."""
    resume_after_decode_steps(tiny[1])

def test_greedy_decode_variant_matches_the_general_sampler(tiny):
    """The greedy decode graph (argmax, no sort, no logprobs) picks the general sampler's tokens."""
    _, h = tiny
    p = _prompt(21, 50)
    runs = []
    for greedy in (False, True):
        h.admit(1, generation=70 + greedy)
        tokens = [h.prefill(1, p, 0, [50])]
        for _ in range(8):
            h.alloc_pages(1, h.position(1) + 2)
            h.inputs.set_rows([1], 1)
            done = h.run(GraphKind.DECODE, 1, greedy=greedy)
            tokens.append(int(done.records[1, 16]))
        runs.append(tokens)
    assert runs[0] == runs[1]


@pytest.mark.parametrize("greedy_graph", [False, True], ids=["general", "greedy"])
def test_a_held_decode_step_samples_with_the_masks_of_its_release(tiny, greedy_graph):
    check_held_decode(tiny[1], _prompt(33, 40), greedy_graph=greedy_graph)


@pytest.mark.parametrize("scaling", [None, dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                                high_freq_factor=4.0, original_max_position_embeddings=256)],
                         ids=["default", "llama3"])
def test_bf16_rope_is_bit_identical_to_transformers(scaling):
    """In bf16, transformers rounds the tables, each product and the sum; so must we."""
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

    from flare.model.layers import apply_rope, rope_table
    from flare.model.spec import ModelSpec

    config = LlamaConfig(**{**COMMON, "hidden_size": 512, "num_attention_heads": 4}, rope_theta=500000.0,
                         rope_scaling=scaling, architectures=["LlamaForCausalLM"])
    spec = ModelSpec.from_hf_config(config.to_dict())
    gen = torch.Generator().manual_seed(9)
    positions = torch.randint(0, 1024, (2, 40), generator=gen)
    q = (3 * torch.randn(2, 40, 4, spec.head_dim, generator=gen)).bfloat16()  # [B, T, H, D]
    k = (3 * torch.randn(2, 40, 2, spec.head_dim, generator=gen)).bfloat16()
    cos_hf, sin_hf = LlamaRotaryEmbedding(config)(q, positions)
    want_q, want_k = apply_rotary_pos_emb(q.transpose(1, 2), k.transpose(1, 2), cos_hf, sin_hf)
    cos, sin = rope_table(spec, 1024, torch.device("cpu"))
    assert torch.equal(apply_rope(q, cos[positions], sin[positions]), want_q.transpose(1, 2))
    assert torch.equal(apply_rope(k, cos[positions], sin[positions]), want_k.transpose(1, 2))


@pytest.mark.parametrize("family", ["llama", "qwen3"])
def test_bf16_forward_is_bit_identical_to_transformers_but_attention(family, tmp_path):
    """Every rounding point outside attention is transformers': with its attention swapped
    in, a bf16 forward over a fresh sequence gives the very same logits."""
    import dataclasses

    from flare.model.attention import AttentionBatch, fresh_sdpa_attention

    torch.manual_seed(5)
    shape = dict(COMMON, hidden_size=256, intermediate_size=512, num_attention_heads=8, rope_theta=500000.0)
    model = (Qwen3ForCausalLM(Qwen3Config(head_dim=32, **shape)) if family == "qwen3"
             else LlamaForCausalLM(LlamaConfig(**shape))).to(torch.bfloat16)
    ckpt = save_tiny(model, tmp_path / "ckpt")
    model = AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.bfloat16, attn_implementation="sdpa").eval()
    harness = Harness.export(ckpt, tmp_path / "core", context=256, chunk=128, dtype="bfloat16")
    try:
        programs = harness.programs
        decoder = programs.decoder
        decoder.ops = dataclasses.replace(decoder.ops, attention=fresh_sdpa_attention)
        seq = torch.tensor(_prompt(4, 128))
        pages = torch.arange(1, 3)
        positions = torch.arange(128)[None]
        batch = AttentionBatch(positions=positions, write_index=pages[positions // 64] * 64 + positions % 64,
                               page_table=pages[None], kv_lens=torch.tensor([128]))
        with torch.inference_mode():
            ours = decoder.logits(decoder.forward(seq[None], batch, programs.kv, positions)[0])
            want = model(seq[None]).logits[0].float()
    finally:
        harness.close()
    assert torch.equal(ours, want), f"max |logit difference| {(ours - want).abs().max().item()}"
