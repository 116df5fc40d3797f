"""Token sampling with explicit per-row RNG state, inside the step program.

No torch generator is used: each draw is a uniform from Philox4x32-10 keyed by the
request seed and counted by the request's generated-token count, so a captured graph
replays deterministically and a seeded request samples the same tokens whatever batch
it lands in.

A decode row (:func:`sample`) is drawn without sorting the vocabulary. The filters
(temperature, then top-k, top-p and min-p, all judged on the unfiltered distribution)
keep token ``i`` when fewer than ``top_k`` tokens score above it, the mass above it is
below ``top_p`` and its probability is at least ``min_p`` times the largest; ties are
kept or dropped together, and the most likely token always stays. A round draws a
token from the distribution restricted to the scores above a pivot (the CDF in token-id
order, inverted at that round's uniform) and accepts it when the filters keep it;
otherwise the pivot rises to its score, or to halfway between it and the largest score
where the filters would drop a token scoring that too (FlashInfer's dual pivot: fewer
rounds on a flat distribution), and the next round draws again. Every round's
distribution holds the kept set, so the accepted token is distributed as the filtered
distribution (the rejection scheme of FlashInfer's sorting-free samplers). A row
without filters accepts its first draw; after ``SAMPLE_ROUNDS`` rejections, a chance
that needs a flat distribution and a tiny ``top_k``, the row takes the most likely
token. Round ``r`` draws from Philox counter word 2 = ``r``, so round 0 is the one
uniform a row drew before. Captured graphs run the same rounds in three Triton launches
(:func:`flare.model.kernels.sampling.sample_tokens`).

Speculative verification (:func:`verify_drafts`) still filters in sorted order: it needs
the kept mass of a given draft, which the rounds never compute.

Sampling parameters live in a float32 row per slot, columns ``SAMPLING_*``.
"""

from __future__ import annotations

import torch

from ..contract import (  # noqa: F401 - the column layout lives with the contract
    SAMPLING_COLUMNS,
    SAMPLING_FREQUENCY,
    SAMPLING_GRAMMAR,
    SAMPLING_MIN_P,
    SAMPLING_PRESENCE,
    SAMPLING_REPETITION,
    SAMPLING_TEMPERATURE,
    SAMPLING_TOP_K,
    SAMPLING_TOP_P,
)

_PHILOX_M0 = 0xD2511F53
_PHILOX_M1 = 0xCD9E8D57
_PHILOX_W0 = 0x9E3779B9
_PHILOX_W1 = 0xBB67AE85
_MASK32 = 0xFFFFFFFF


def _mulhilo32(a: int, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(hi, lo) 32-bit halves of the 64-bit product a*b, with b in [0, 2^32), in int64 ops.

    Split into 16-bit limbs so no intermediate exceeds 2^49 (int64 never overflows).
    """
    a_lo, a_hi = a & 0xFFFF, a >> 16
    b_lo, b_hi = b & 0xFFFF, b >> 16
    ll = b_lo * a_lo
    lh = b_hi * a_lo
    hl = b_lo * a_hi
    hh = b_hi * a_hi
    mid = (ll >> 16) + (lh & 0xFFFF) + (hl & 0xFFFF)
    lo = (ll & 0xFFFF) | ((mid & 0xFFFF) << 16)
    hi = hh + (lh >> 16) + (hl >> 16) + (mid >> 16)
    return hi & _MASK32, lo & _MASK32


def philox_uniform(seed: torch.Tensor, counter: torch.Tensor, stream: int = 0) -> torch.Tensor:
    """One float32 uniform in [0, 1) per element from Philox4x32-10.

    key = (seed low 32 bits, seed high 32 bits); counter = (counter low, counter high,
    stream, 0). seed, counter: int64 tensors of the same shape; ``stream`` in [0, 2^32).
    """
    k0 = seed & _MASK32
    k1 = (seed >> 32) & _MASK32
    c0 = counter & _MASK32
    c1 = (counter >> 32) & _MASK32
    c2 = torch.full_like(c0, stream)
    c3 = torch.zeros_like(c0)
    for _ in range(10):
        hi0, lo0 = _mulhilo32(_PHILOX_M0, c0)
        hi1, lo1 = _mulhilo32(_PHILOX_M1, c2)
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
        k0 = (k0 + _PHILOX_W0) & _MASK32
        k1 = (k1 + _PHILOX_W1) & _MASK32
    # 24 high bits -> exactly representable float32 in [0, 1)
    return (c0 >> 8).to(torch.float32) * (1.0 / (1 << 24))


def apply_penalties(logits: torch.Tensor, params: torch.Tensor, output_counts: torch.Tensor,
                    prompt_mask: torch.Tensor) -> torch.Tensor:
    """Repetition (prompt + output, Hugging Face style) then presence/frequency (output only).

    logits [B, V] float32; params [B, SAMPLING_COLUMNS]; output_counts [B, V] int32;
    prompt_mask [B, V] bool.
    """
    rep = params[:, SAMPLING_REPETITION:SAMPLING_REPETITION + 1]
    seen = prompt_mask | (output_counts > 0)
    penalized = torch.where(logits > 0, logits / rep, logits * rep)
    logits = torch.where(seen, penalized, logits)
    counts = output_counts.to(torch.float32)
    presence = params[:, SAMPLING_PRESENCE:SAMPLING_PRESENCE + 1]
    frequency = params[:, SAMPLING_FREQUENCY:SAMPLING_FREQUENCY + 1]
    return logits - presence * (counts > 0).to(torch.float32) - frequency * counts


def apply_grammar_masks(logits: torch.Tensor, sampling: torch.Tensor, masks: torch.Tensor,
                        slots: torch.Tensor) -> None:
    """Set to -inf, in place, every logit a constrained row's bitmask forbids.

    logits [B, V] float32; sampling [slots, SAMPLING_COLUMNS] (SAMPLING_GRAMMAR marks a
    constrained slot); masks int32 [slots, ceil(V / 32)]: bit t % 32 of word t // 32 allows
    token t. Only the constrained rows are touched, so an unconstrained batch costs one
    flag read per row (this eager form runs on the CPU; CUDA graphs use
    :func:`flare.model.kernels.sampling.apply_grammar_masks`).
    """
    rows = (sampling[slots, SAMPLING_GRAMMAR] > 0).nonzero().view(-1)
    if rows.numel() == 0:
        return
    v = logits.shape[1]
    words = masks[slots[rows]]  # [R, W] int32
    shifts = torch.arange(32, dtype=torch.int32, device=logits.device)
    allowed = ((words.unsqueeze(-1) >> shifts) & 1).view(rows.numel(), -1)[:, :v].bool()
    logits[rows] = logits[rows].masked_fill(~allowed, float("-inf"))


def greedy_tokens(logits: torch.Tensor, sampling: torch.Tensor, output_counts: torch.Tensor,
                  prompt_counts: torch.Tensor, slots: torch.Tensor, do_sample: torch.Tensor,
                  slot_token: torch.Tensor) -> torch.Tensor:
    """The greedy decode variant's tokens: argmax of the penalized logits where do_sample,
    else the slot's current token (int64 [B]).

    logits [B, V] float32; sampling, output_counts, prompt_counts and slot_token are the
    per-slot state (rows indexed by ``slots``). CUDA graphs use the two-launch kernel
    :func:`flare.model.kernels.sampling.greedy_tokens` instead.
    """
    penalized = apply_penalties(logits, sampling[slots], output_counts[slots], prompt_counts[slots] > 0)
    return torch.where(do_sample, penalized.argmax(dim=-1), slot_token[slots])


def _filtered(logits: torch.Tensor, params: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The filtered distribution of each row, in descending order of probability:
    (kept [B, V] unnormalized probabilities, zero where filtered; order [B, V] their token ids;
    keep [B, V] the surviving ranks). Filters: temperature, top-k, top-p, min-p."""
    v = logits.shape[1]
    temperature = params[:, SAMPLING_TEMPERATURE:SAMPLING_TEMPERATURE + 1]
    top_p = params[:, SAMPLING_TOP_P:SAMPLING_TOP_P + 1]
    top_k = params[:, SAMPLING_TOP_K:SAMPLING_TOP_K + 1]
    min_p = params[:, SAMPLING_MIN_P:SAMPLING_MIN_P + 1]
    scaled = logits / torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    sorted_logits, order = scaled.sort(dim=-1, descending=True)
    probs = torch.softmax(sorted_logits, dim=-1)
    rank = torch.arange(v, device=logits.device).view(1, v)
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, v))
    keep = rank < k
    # top-p: keep the smallest prefix whose mass reaches top_p (the first token always stays)
    before = torch.cumsum(probs, dim=-1) - probs
    keep &= before < top_p
    keep &= probs >= min_p * probs[:, :1]
    keep |= rank == 0  # the most likely token always survives filtering (and padding rows stay valid)
    return torch.where(keep, probs, torch.zeros_like(probs)), order, keep


def _invert(kept: torch.Tensor, order: torch.Tensor, last: torch.Tensor, uniform: torch.Tensor) -> torch.Tensor:
    """The token at ``uniform`` of the CDF of the kept mass, per row (int64 [B]); ``last``
    [B, 1]: the last rank that may be chosen."""
    b, v = kept.shape
    cdf = torch.cumsum(kept, dim=-1)
    target = uniform.view(b, 1) * cdf[:, -1:]
    index = torch.searchsorted(cdf, target, right=True).clamp_(max=v - 1)
    # never land on a filtered token (possible only through float ties at the boundary)
    return order.gather(1, torch.minimum(index, last)).view(b)


def _is_greedy(params: torch.Tensor) -> torch.Tensor:
    return (params[:, SAMPLING_TEMPERATURE] <= 0) | (params[:, SAMPLING_TOP_K] == 1)


SAMPLE_ROUNDS = 32  # draws a row may take before it falls back to its most likely token


def _filter_limits(params: torch.Tensor, vocab: int) -> tuple[torch.Tensor, ...]:
    """Per row: (scale divisor, top_k as a count, top_p, min_p, whether any filter is set)."""
    temperature = params[:, SAMPLING_TEMPERATURE]
    top_p = params[:, SAMPLING_TOP_P]
    top_k = params[:, SAMPLING_TOP_K]
    min_p = params[:, SAMPLING_MIN_P]
    divisor = torch.where(temperature > 0, temperature, torch.ones_like(temperature))
    k = torch.where(top_k > 0, top_k, torch.full_like(top_k, vocab))
    filtered = (k < vocab) | (top_p < 1) | (min_p > 0)
    return divisor, k, top_p, min_p, filtered


def sample(logits: torch.Tensor, params: torch.Tensor, seed: torch.Tensor, counter: torch.Tensor) -> torch.Tensor:
    """One token per row from penalized float32 logits [B, V] (int64 [B]); ``seed`` and
    ``counter`` (int64 [B]) key each round's uniform. Greedy rows (temperature <= 0 or
    top_k == 1) take the argmax. The rounds are described in the module docstring."""
    b, v = logits.shape
    divisor, k, top_p, min_p, filtered = _filter_limits(params, v)
    scores = logits / divisor.view(b, 1)
    top = scores.amax(dim=-1, keepdim=True)
    weight = torch.exp(scores - top)
    total = weight.sum(dim=-1)
    ids = torch.arange(v, device=logits.device).view(1, v)
    token = logits.argmax(dim=-1)
    done = _is_greedy(params)
    pivot = torch.full((b, 1), float("-inf"), device=logits.device)
    for r in range(SAMPLE_ROUNDS):
        if bool(done.all()):
            break
        live = torch.where(scores > pivot, weight, torch.zeros_like(weight))
        cdf = torch.cumsum(live, dim=-1)
        target = philox_uniform(seed, counter, r).view(b, 1) * cdf[:, -1:]
        drawn = torch.searchsorted(cdf, target, right=True).view(b)
        # past the end only through rounding: the last token with weight left
        last = torch.where(live > 0, ids, -1).amax(dim=-1)
        drawn = torch.where(drawn < v, drawn, last).clamp(min=0)
        score = scores.gather(1, drawn.view(b, 1))
        kept = _kept_above(scores, weight, score, torch.exp(score - top).view(b), k, top_p * total, min_p)
        accept = ~done & (~filtered | (score.view(b) >= top.view(b)) | kept)
        token = torch.where(accept, drawn, token)
        done |= accept
        # the second pivot, halfway to the top: where it would be dropped too, so is all below it
        mid = (score + top) * 0.5
        mid_kept = _kept_above(scores, weight, mid, torch.exp(mid - top).view(b), k, top_p * total, min_p)
        pivot = torch.where(done.view(b, 1), pivot, torch.where(mid_kept.view(b, 1), score, mid))
    return token


def _kept_above(scores: torch.Tensor, weight: torch.Tensor, at: torch.Tensor, at_weight: torch.Tensor,
                k: torch.Tensor, mass_limit: torch.Tensor, min_p: torch.Tensor) -> torch.Tensor:
    """Whether the filters keep a token scoring ``at`` [B, 1] (relative weight ``at_weight`` [B]):
    fewer than k scores above it, the weight above it below ``mass_limit`` (top_p times the
    total), and at least min_p of the largest."""
    above = scores > at
    return ((above.sum(dim=-1) < k) & (torch.where(above, weight, 0.0).sum(dim=-1) < mass_limit)
            & (at_weight >= min_p))


def sampled_tokens(logits: torch.Tensor, sampling: torch.Tensor, output_counts: torch.Tensor,
                   prompt_counts: torch.Tensor, slots: torch.Tensor, do_sample: torch.Tensor,
                   slot_token: torch.Tensor, slot_seed: torch.Tensor, slot_generated: torch.Tensor) -> torch.Tensor:
    """The sampling variant's tokens: :func:`sample` of the penalized logits where do_sample,
    else the slot's current token (int64 [B]). The arguments are :func:`greedy_tokens`' with
    the per-slot seeds and generated counts (the rounds' Philox keys and counters) added.
    CUDA graphs use :func:`flare.model.kernels.sampling.sample_tokens` instead."""
    params = sampling[slots]
    penalized = apply_penalties(logits, params, output_counts[slots], prompt_counts[slots] > 0)
    token = sample(penalized, params, slot_seed[slots], slot_generated[slots])
    return torch.where(do_sample, token, slot_token[slots])


def token_logprobs(logits: torch.Tensor, token: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Logprobs (the log-softmax of ``logits`` [B, V] float32) of each row's ``token`` and its
    ``k`` most likely tokens -> (values [B, 1 + k]: the token's, then the top k in order; ids
    [B, k] int64). CUDA graphs use :func:`flare.model.kernels.sampling.write_logprobs`, which
    writes them into the step's frame for the rows that asked."""
    raw = torch.log_softmax(logits, dim=-1)
    top = raw.topk(k, dim=-1)
    return torch.cat([raw.gather(1, token.view(-1, 1)), top.values], dim=1), top.indices


def verify_drafts(logits: torch.Tensor, params: torch.Tensor, drafts: torch.Tensor, has_draft: torch.Tensor,
                  accept_uniform: torch.Tensor, sample_uniform: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rejection sampling of deterministic drafts, one target position per row.

    Row i's draft (the token proposed to follow position i, where ``has_draft``) is accepted
    with the probability the filtered target distribution p gives it; a rejected draft is
    replaced by a sample from p with the draft's mass removed and renormalized, and a row
    without a draft samples p. The emitted token is therefore distributed as p whatever the
    proposal (Leviathan et al. 2023, with a point-mass proposal q). Greedy rows accept a
    draft equal to the argmax and emit the argmax.

    logits [N, V] float32; params [N, SAMPLING_COLUMNS]; drafts, has_draft [N];
    uniforms [N] float32. -> (accepted [N] bool, token [N] int64).
    """
    kept, order, keep = _filtered(logits, params)
    mass = kept.sum(dim=-1)
    at = order == drafts.view(-1, 1)  # the draft's rank (one True per row, or none past V)
    draft_mass = torch.where(at, kept, torch.zeros_like(kept)).sum(dim=-1)
    greedy = _is_greedy(params)
    argmax = logits.argmax(dim=-1)
    accepted = has_draft & torch.where(greedy, drafts == argmax, accept_uniform * mass < draft_mass)
    residual = torch.where(at & has_draft.view(-1, 1), torch.zeros_like(kept), kept)
    # the last rank with mass left (a rejected draft may have been the last kept one)
    rank = torch.arange(kept.shape[1], device=kept.device).view(1, -1)
    last = torch.where(residual > 0, rank, 0).amax(dim=-1, keepdim=True)
    token = _invert(residual, order, last, sample_uniform)
    token = torch.where(accepted, drafts, token)
    return accepted, torch.where(greedy, argmax, token)
