"""Step programs: the bodies of the graphs a contract declares.

:class:`StepPrograms` owns every device-resident tensor of a loaded model (the
contract's buffers, the KV page pool, snapshot rows, per-slot hidden states and
penalty counts) and runs one program per graph. Programs read their inputs
from ``step.*`` and ``slot.*`` buffers and write ``slot.*`` state and
``out.*[frame]`` completions, so they can be captured as CUDA graphs and
replayed with nothing but byte-range uploads in between.

Physical conventions: KV page 0 and snapshot row 0 are scratch (logical ID i
lives at physical i + 1); slot 0 is the padding slot. Padding rows of a batch
read and write only those scratch locations.
"""

from __future__ import annotations

import numpy as np
import torch

from ..contract import (
    REC_CONSUMED,
    REC_FLAG_PARTICIPATED,
    REC_FLAG_SAMPLED,
    REC_FLAGS,
    REC_GENERATED,
    REC_GENERATION,
    REC_KIND,
    REC_NEW_TOKENS,
    REC_SLOT,
    REC_TOKEN0,
    RECORD_FIELDS,
    GraphKind,
    GraphSpec,
    PreparedContract,
)
from .attention import AttentionBatch, KVCache, PackedBatch, PackedRows
from .decoder import Decoder
from .sampling import (
    apply_grammar_masks,
    greedy_tokens,
    philox_uniform,
    sampled_tokens,
    token_logprobs,
    verify_drafts,
)

# The acceptance test of a sampled draft draws from its own Philox stream (the request seed
# with these bits flipped), so the sample stream stays the one plain decode draws from.
ACCEPT_STREAM = 0x5EC0_7A11

_TORCH_DTYPES = {"int64": torch.int64, "float32": torch.float32, "int32": torch.int32}


class StepPrograms:
    """Device state plus the program for every graph kind."""

    def __init__(self, decoder: Decoder, contract: PreparedContract, *, kv_dtype: torch.dtype | None = None,
                 bucket_pages: bool = False):
        spec = decoder.spec
        self.decoder = decoder
        self.contract = contract
        self.device = decoder.device
        self.dtype = decoder.dtype
        kv_dtype = kv_dtype or decoder.dtype
        # On the CPU, attention gathers only the pages a step can touch (rounded up to a
        # power of two); captured graphs use the full page table and a kernel instead.
        self.bucket_pages = bucket_pages
        # SPECULATIVE verification as flattened decode rows (captured graphs: a width-5 row costs
        # 4.47 ms on the H200 against 5.68 ms as a 5-query chunk) or as chunk rows (the CPU)
        self.flat_verification = self.device.type == "cuda"
        self.buffers: dict[str, torch.Tensor] = {
            b.name: torch.zeros(b.shape, dtype=_TORCH_DTYPES[b.dtype], device=self.device)
            for b in contract.buffers()
        }
        s1, rows = contract.max_active + 1, contract.num_snapshot_rows + 1
        self.kv = KVCache.allocate(spec.num_layers, contract.num_pages + 1, spec.num_kv_heads,
                                   spec.head_dim, kv_dtype, self.device)
        page_shape = (rows, spec.num_layers, contract.page_tokens, spec.num_kv_heads, spec.head_dim)
        self.snap_k = torch.zeros(page_shape, dtype=kv_dtype, device=self.device)
        self.snap_v = torch.zeros(page_shape, dtype=kv_dtype, device=self.device)
        self.snap_hidden = torch.zeros(rows, spec.hidden_size, dtype=self.dtype, device=self.device)
        self.snap_length = torch.zeros(rows, dtype=torch.int64, device=self.device)
        self.hidden = torch.zeros(s1, spec.hidden_size, dtype=self.dtype, device=self.device)
        self.output_counts = torch.zeros(s1, spec.vocab_size, dtype=torch.int32, device=self.device)
        self.prompt_counts = torch.zeros(s1, spec.vocab_size, dtype=torch.int32, device=self.device)
        # Bookkeeping a capture swaps for kernels (flare/model/kernels: sampling, slots): the
        # greedy variant's token choice, a decode step's reads of the slot state and every
        # sampling program's writes back. The methods named here are the reference.
        self.greedy_tokens = greedy_tokens
        self.sampled_tokens = sampled_tokens  # the sampling variant's token choice (the same arguments + RNG state)
        self.apply_grammar_masks = apply_grammar_masks  # (logits, sampling, masks, slots) -> None, in place
        self.decode_inputs = self._decode_inputs  # (slots) -> (tokens [B, 1], AttentionBatch)
        self.commit = self._commit  # (slots, token, do_sample, kind, positions=None, rows=None) -> None
        self.write_logprobs = self._write_logprobs  # (logits, token, slots) -> None
        # a verification step's flat rows (CUDA) and its outcome's writes
        self.verification_inputs = self._verification_inputs  # (slots, w) -> (tokens [b * w, 1], AttentionBatch)
        self.commit_verification = self._commit_verification  # (slots, rows, w, *, logits | token + accepted)
        self._ones = torch.ones(contract.step_rows, dtype=torch.bool, device=self.device)  # do_sample of decode rows
        # A decode step run in two parts (structured output, see run_part): the forward part
        # leaves the step's logits here for the sampling part, which runs once the host has
        # uploaded the masks that depend on the previous step's tokens.
        self.part_logits = torch.zeros(contract.max_batch, spec.vocab_size, dtype=torch.float32,
                                       device=self.device)
        self._runners = {
            GraphKind.INITIALIZE: self._initialize,
            GraphKind.PREFILL: self._prefill,
            GraphKind.DECODE: self._decode,
            GraphKind.SNAPSHOT: self._snapshot,
            GraphKind.RESTORE: self._restore,
            GraphKind.RESUME: self._resume,
            GraphKind.MIXED: self._mixed,
            GraphKind.SPECULATIVE: self._speculative,
        }

    def run(self, graph: GraphSpec) -> None:
        """Execute one graph's program against the current device buffers."""
        with torch.inference_mode():
            self._runners[graph.kind](graph)

    def run_part(self, graph: GraphSpec, part: str) -> None:
        """One part of a DECODE graph's program: ``"forward"`` (the decoder and the logits,
        which need nothing the host learns from the previous step) or ``"sample"`` (masking,
        sampling and the commit). Running both in order has the effect of :meth:`run`."""
        if graph.kind != GraphKind.DECODE or part not in ("forward", "sample"):
            raise ValueError(f"{graph.label} has no {part!r} part")
        with torch.inference_mode():
            slots = self._step("step.slots", graph.batch)
            if part == "forward":
                tokens, batch = self.decode_inputs(slots)
                hidden = self.decoder.forward(tokens, batch, self.kv)
                self.hidden.index_copy_(0, slots, hidden)
                self.part_logits[:graph.batch].copy_(self.decoder.logits(hidden))
            else:
                positions = self.buffers["slot.position"][slots] + 1
                self._sample_logits(slots, self.part_logits[:graph.batch], self._ones[:graph.batch],
                                    GraphKind.DECODE, graph.greedy, positions)

    # -- helpers ---------------------------------------------------------------

    def _step(self, name: str, b: int) -> torch.Tensor:
        return self.buffers[name][:b]

    def _page_table(self, slots: torch.Tensor, kv_lens: torch.Tensor) -> torch.Tensor:
        table = self.buffers["slot.page_table"][slots]
        if not self.bucket_pages:
            return table
        needed = max(1, -(-int(kv_lens.max()) // self.contract.page_tokens))
        width = 1 << (needed - 1).bit_length()
        return table[:, :min(width, table.shape[1])]

    def _write_frame(self, name: str, slots: torch.Tensor, rows: torch.Tensor) -> None:
        """out.<name>[step.frame][slots] = rows; the frame index is a device value, so the
        slice is gathered, updated and scattered back (capturable, no host sync)."""
        out, frame = self.buffers[name], self.buffers["step.frame"]
        current = out.index_select(0, frame).squeeze(0)
        current.index_copy_(0, slots, rows)
        out.index_copy_(0, frame, current.unsqueeze(0))

    def _record(self, slots: torch.Tensor, kind: GraphKind, sampled: torch.Tensor | None,
                emitted: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
        """The rows' completion records; ``emitted``: (count [b], tokens [b, w]) of a step that
        emits several tokens per row (SPECULATIVE), in place of the slot's one sampled token."""
        buf = self.buffers
        b = slots.shape[0]
        rec = torch.zeros(b, RECORD_FIELDS, dtype=torch.int64, device=self.device)
        rec[:, REC_SLOT] = slots
        rec[:, REC_GENERATION] = buf["slot.generation"][slots]
        rec[:, REC_CONSUMED] = buf["slot.position"][slots]
        rec[:, REC_GENERATED] = buf["slot.generated"][slots]
        rec[:, REC_KIND] = int(kind)
        if sampled is None:
            rec[:, REC_FLAGS] = REC_FLAG_PARTICIPATED
        else:
            rec[:, REC_NEW_TOKENS] = sampled.to(torch.int64)
            rec[:, REC_FLAGS] = REC_FLAG_PARTICIPATED + REC_FLAG_SAMPLED * sampled.to(torch.int64)
            rec[:, REC_TOKEN0] = buf["slot.token"][slots]
        if emitted is not None:
            count, tokens = emitted
            rec[:, REC_NEW_TOKENS] = count
            rec[:, REC_TOKEN0:REC_TOKEN0 + tokens.shape[1]] = tokens
        self._write_frame("out.records", slots, rec)

    def _sample_rows(self, slots: torch.Tensor, hidden: torch.Tensor, do_sample: torch.Tensor,
                     kind: GraphKind, greedy: bool = False, positions: torch.Tensor | None = None,
                     keep_hidden: bool = False) -> None:
        """Sample for rows where do_sample, update slot state, write logprobs and records.

        ``greedy``: every row is greedy and wants no logprobs, so the token is the argmax
        of the penalized logits and no distribution is sorted or normalized. ``positions``:
        the rows' new slot positions, stored with the tokens (see :meth:`_commit`).
        ``keep_hidden``: ``hidden`` goes into the slots' rows of ``self.hidden`` as well.
        """
        self._sample_logits(slots, self.decoder.logits(hidden), do_sample, kind, greedy, positions,
                            hidden if keep_hidden else None)

    def _sample_logits(self, slots: torch.Tensor, logits: torch.Tensor, do_sample: torch.Tensor, kind: GraphKind,
                       greedy: bool, positions: torch.Tensor | None, rows: torch.Tensor | None = None) -> None:
        """:meth:`_sample_rows` from the rows' logits [b, V] float32; ``rows``: hidden states to
        keep in ``self.hidden`` (see :meth:`_commit`)."""
        buf = self.buffers
        # Structured output: a constrained slot's disallowed tokens become -inf before any filter,
        # penalty or logprob sees them (rows whose slot is not constrained are left as they are).
        self.apply_grammar_masks(logits, buf["slot.sampling"], buf["slot.grammar_mask"], slots)
        if greedy:
            token = self.greedy_tokens(logits, buf["slot.sampling"], self.output_counts, self.prompt_counts, slots,
                                       do_sample, buf["slot.token"])
            self._commit_samples(slots, token, do_sample, kind, positions=positions, rows=rows)
            return
        token = self.sampled_tokens(logits, buf["slot.sampling"], self.output_counts, self.prompt_counts, slots,
                                    do_sample, buf["slot.token"], buf["slot.seed"], buf["slot.generated"])
        self._commit_samples(slots, token, do_sample, kind, logits, positions, rows)

    def _commit_samples(self, slots: torch.Tensor, token: torch.Tensor, do_sample: torch.Tensor, kind: GraphKind,
                        logits: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                        rows: torch.Tensor | None = None) -> None:
        """Store sampled tokens in the slot rows, count them for penalties, write outputs
        (the logprobs too, from the masked, unpenalized ``logits``, when given)."""
        self.commit(slots, token, do_sample, kind, positions, rows)
        if logits is not None:
            self.write_logprobs(logits, token, slots)

    def _write_logprobs(self, logits: torch.Tensor, token: torch.Tensor, slots: torch.Tensor) -> None:
        """The rows' logprobs (log-softmax of ``logits``) into this step's frame: the chosen
        token's, then the top ``contract.top_logprobs`` with their ids. The reference writes
        every row; the kernel form only rows whose slot sets SAMPLING_LOGPROBS, which are the
        only rows the host reads."""
        values, ids = token_logprobs(logits, token, self.contract.top_logprobs)
        self._write_frame("out.logprobs", slots, values)
        self._write_frame("out.top_ids", slots, ids)

    def _commit(self, slots: torch.Tensor, token: torch.Tensor, do_sample: torch.Tensor, kind: GraphKind,
                positions: torch.Tensor | None = None, rows: torch.Tensor | None = None) -> None:
        """Tokens (and ``positions``, the rows' new slot positions, when given) into the slot
        rows, generated and penalty counts, and the completion records (which read the
        positions); the step's final hidden ``rows``, when given, into ``self.hidden``."""
        buf = self.buffers
        if rows is not None:
            self.hidden.index_copy_(0, slots, rows)
        if positions is not None:
            buf["slot.position"].index_copy_(0, slots, positions)
        buf["slot.token"].index_copy_(0, slots, token)
        buf["slot.generated"].index_copy_(0, slots, buf["slot.generated"][slots] + do_sample.to(torch.int64))
        # Integer atomics: exact in any order, and no sort (index_put_ with accumulate sorts).
        self.output_counts.view(-1).scatter_add_(0, slots * self.output_counts.shape[1] + token,
                                                 do_sample.to(torch.int32))
        self._record(slots, kind, do_sample)

    def _positions(self, pos0: torch.Tensor, t: int) -> torch.Tensor:
        q = torch.arange(t, device=self.device)
        return pos0.view(-1, 1) + q.view(1, -1)

    def _write_index(self, slots: torch.Tensor, positions: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
        p = self.contract.page_tokens
        table = self.buffers["slot.page_table"][slots]
        page_idx = (positions // p).clamp(max=table.shape[1] - 1)
        phys = table.gather(1, page_idx)
        scratch = torch.arange(positions.shape[1], device=self.device).view(1, -1) % p
        return torch.where(valid, phys * p + positions % p, scratch)

    # -- programs --------------------------------------------------------------

    def _initialize(self, graph: GraphSpec) -> None:
        buf = self.buffers
        slots = self._step("step.slots", graph.batch)
        self.output_counts.index_fill_(0, slots, 0)
        self.prompt_counts.index_fill_(0, slots, 0)
        prompt = buf["step.prompt"].clamp(0, self.decoder.spec.vocab_size - 1)
        index = torch.arange(prompt.shape[0], device=self.device)
        valid = index < buf["step.prompt_len"]
        row = slots[:1].expand_as(prompt)
        self.prompt_counts.index_put_((row, prompt), valid.to(torch.int32), accumulate=True)
        # a preempted request's continuation: the outputs it sampled before count as outputs
        outputs = ~valid & (index < buf["step.prompt_len"] + buf["step.output_len"])
        self.output_counts.index_put_((row, prompt), outputs.to(torch.int32), accumulate=True)
        self._record(slots, GraphKind.INITIALIZE, None)

    def _chunk_batch(self, slots: torch.Tensor, pos0: torch.Tensor, n: torch.Tensor, t: int) -> AttentionBatch:
        """Attention metadata of rows of t query positions from pos0, the first n of each valid."""
        positions = self._positions(pos0, t)
        valid = torch.arange(t, device=self.device).view(1, -1) < n.view(-1, 1)
        kv_lens = pos0 + n
        return AttentionBatch(
            positions=positions.clamp(max=self.contract.context - 1),
            write_index=self._write_index(slots, positions, valid),
            page_table=self._page_table(slots, kv_lens),
            kv_lens=kv_lens,
        )

    def _prefill(self, graph: GraphSpec) -> None:
        buf = self.buffers
        b, t = graph.batch, graph.tokens
        slots = self._step("step.slots", b)
        tokens = buf["step.tokens"][:b, :t]
        n = self._step("step.num_tokens", b)
        pos0 = buf["slot.position"][slots]
        batch = self._chunk_batch(slots, pos0, n, t)
        hidden = self.decoder.forward(tokens, batch, self.kv, (n - 1).clamp(min=0))
        self._sample_rows(slots, hidden, self._step("step.sample", b) != 0, GraphKind.PREFILL, positions=batch.kv_lens,
                          keep_hidden=True)

    def _decode_inputs(self, slots: torch.Tensor) -> tuple[torch.Tensor, AttentionBatch]:
        """A decode step's tokens [B, 1] and attention metadata, read from the slot rows."""
        buf = self.buffers
        b = slots.shape[0]
        tokens = buf["slot.token"][slots].view(b, 1)
        pos0 = buf["slot.position"][slots]
        positions = pos0.view(b, 1)
        kv_lens = pos0 + 1
        return tokens, AttentionBatch(
            positions=positions.clamp(max=self.contract.context - 1),
            write_index=self._write_index(slots, positions, self._ones[:b].view(b, 1)),
            page_table=self._page_table(slots, kv_lens),
            kv_lens=kv_lens,
        )

    def _decode(self, graph: GraphSpec) -> None:
        b = graph.batch
        slots = self._step("step.slots", b)
        tokens, batch = self.decode_inputs(slots)
        hidden = self.decoder.forward(tokens, batch, self.kv)
        # As in _prefill, the commit stores the new positions and the hidden rows: a torch
        # launch between the last layer and the logits would cut the chain of
        # programmatically dependent launches there (the logits' weight loads could not
        # start early), and one after the commit would end every step with a plain launch.
        self._sample_rows(slots, hidden, self._ones[:b], GraphKind.DECODE, graph.greedy, positions=batch.kv_lens,
                          keep_hidden=True)

    def _mixed(self, graph: GraphSpec) -> None:
        """One forward over a decode cohort and packed prefill rows.

        Rows 0..w-1 of step.slots decode (their tokens and metadata come from the slot rows,
        as in DECODE); rows w..batch-1 are prefill rows whose ``step.num_tokens`` tokens lie
        back to back in the flattened ``step.tokens``, row after row. The flat stream the
        decoder runs is the p prompt tokens, then the w decode tokens: every GEMM sees
        p + w rows with no padding between requests.
        """
        buf, page = self.buffers, self.contract.page_tokens
        w, p = graph.width, graph.tokens
        slots = self._step("step.slots", graph.batch)
        pslots = slots[w:]
        n = buf["step.num_tokens"][w:graph.batch]
        ends = torch.cumsum(n, 0)
        starts = ends - n
        flat = torch.arange(p, device=self.device)
        row = torch.searchsorted(ends, flat, right=True).clamp(max=graph.prefill_rows - 1)
        valid = flat < ends[-1]
        pos0 = buf["slot.position"][pslots]
        positions = torch.where(valid, pos0[row] + flat - starts[row], 0).clamp(max=self.contract.context - 1)
        table = buf["slot.page_table"][pslots]
        phys = table[row, (positions // page).clamp(max=table.shape[1] - 1)]
        write = torch.where(valid, phys * page + positions % page, flat % page)  # padding: scratch page
        kv_lens = pos0 + n
        rows = PackedRows(positions=positions, q_start=starts, q_len=n, page_table=self._page_table(pslots, kv_lens),
                          kv_lens=kv_lens)
        tokens = buf["step.tokens"].view(-1)[:p]
        sample_index = (starts + n - 1).clamp(min=0)
        do_sample = buf["step.sample"][w:graph.batch] != 0
        new_positions = kv_lens
        decode = None
        if w:
            dtokens, decode = self.decode_inputs(slots[:w])
            tokens = torch.cat([tokens, dtokens.view(-1)])
            positions = torch.cat([positions, decode.positions.view(-1)])
            write = torch.cat([write, decode.write_index.view(-1)])
            # sampled rows in step.slots order: the decode rows (flat p..p+w-1), then the prefill rows
            sample_index = torch.cat([torch.arange(p, p + w, device=self.device), sample_index])
            do_sample = torch.cat([self._ones[:w], do_sample])
            new_positions = torch.cat([decode.kv_lens, kv_lens])
        batch = PackedBatch(positions=positions.view(1, -1), write_index=write.view(1, -1), prefill=rows,
                            decode=decode)
        hidden = self.decoder.forward(tokens.view(1, -1), batch, self.kv, sample_index)
        self._sample_rows(slots, hidden, do_sample, GraphKind.MIXED, graph.greedy, positions=new_positions,
                          keep_hidden=True)

    def _verification_inputs(self, slots: torch.Tensor, w: int) -> tuple[torch.Tensor, AttentionBatch]:
        """The flat verification rows' inputs: row r's w positions hold its last sampled token
        (slot.token) and its ``step.num_tokens`` d <= w - 1 drafts (``step.tokens[r, :d]``), each
        position a decode row reading the keys up to itself; positions past d write the scratch
        page. -> (tokens [b * w, 1], AttentionBatch)."""
        buf = self.buffers
        b = slots.shape[0]
        d = self._step("step.num_tokens", b)
        pos0 = buf["slot.position"][slots]
        tokens = torch.cat([buf["slot.token"][slots].view(b, 1), buf["step.tokens"][:b, :w - 1]], dim=1)
        rows = slots.repeat_interleave(w)
        q = torch.arange(w, device=self.device).repeat(b)
        limit = d.repeat_interleave(w)
        positions = (pos0.repeat_interleave(w) + q).view(-1, 1)
        kv_lens = pos0.repeat_interleave(w) + torch.minimum(q, limit) + 1
        return tokens.view(-1, 1), AttentionBatch(
            positions=positions.clamp(max=self.contract.context - 1),
            write_index=self._write_index(rows, positions, (q <= limit).view(-1, 1)),
            page_table=self._page_table(rows, kv_lens),
            kv_lens=kv_lens,
            keys_this_step=w,
        )

    def _verify_flat(self, slots, w):
        """The verification forward as b * w decode rows, one per target position (CUDA): the
        decode attention kernel and the small-batch GEMVs, each row reading the keys up to its
        own position, which the rows before it write in the same layer. A row's result depends
        on its position and context only, not on the drafts after it. -> (hidden [b * w, H],
        logits [b * w, V])."""
        tokens, batch = self.verification_inputs(slots, w)
        flat = self.decoder.forward(tokens, batch, self.kv)
        flat = flat.view(tokens.shape[0], -1)
        return flat, self.decoder.logits(flat)

    def _verify_rows(self, slots, w):
        """The verification forward as b rows of w queries (the CPU: one chunk-attention call
        per row instead of w decode rows, 130 ms against 189 ms for the demo core's width 5).
        -> (hidden [b * w, H], logits [b * w, V])."""
        buf = self.buffers
        b = slots.shape[0]
        d = self._step("step.num_tokens", b)
        tokens = torch.cat([buf["slot.token"][slots].view(b, 1), buf["step.tokens"][:b, :w - 1]], dim=1)
        batch = self._chunk_batch(slots, buf["slot.position"][slots], d + 1, w)
        q = torch.arange(w, device=self.device).view(1, w)
        hidden = self.decoder.forward(tokens, batch, self.kv, q.expand(b, w)).reshape(b * w, -1)
        return hidden, self.decoder.logits(hidden)

    def _speculative(self, graph: GraphSpec) -> None:
        """Verify each row's drafts: one forward over w target positions per row.

        Row r's positions hold its last sampled token (slot.token) and the ``step.num_tokens``
        d <= w - 1 drafts in ``step.tokens[r, :d]``. The target's choice at position i is
        compared with the draft at i + 1 (greedy: equal to the argmax; sampled: rejection
        sampling, :func:`verify_drafts`); the row emits the accepted drafts and the target's
        token after them (k + 1 tokens for k accepted), all in one record. KV written for the
        rejected drafts lies past the new position: the next step overwrites it and no
        attention reads beyond a row's length, which rolls it back.
        """
        buf, dev = self.buffers, self.device
        b, w = graph.batch, graph.tokens
        slots = self._step("step.slots", b)
        if self.flat_verification:
            hidden, logits = self._verify_flat(slots, w)
        else:
            hidden, logits = self._verify_rows(slots, w)
        if graph.greedy:
            self.commit_verification(slots, hidden, w, logits=logits)
            return
        q = torch.arange(w, device=dev).view(1, w)
        drafts = buf["step.tokens"][:b, :w - 1]
        following = torch.cat([drafts, torch.zeros(b, 1, dtype=torch.int64, device=dev)], dim=1)
        has_draft = q < self._step("step.num_tokens", b).view(-1, 1)
        seed = buf["slot.seed"][slots].view(b, 1).expand(b, w).reshape(-1)
        counter = (buf["slot.generated"][slots].view(b, 1) + q).reshape(-1)
        params = buf["slot.sampling"][slots].repeat_interleave(w, dim=0)
        accepted, token = verify_drafts(logits, params, following.reshape(-1), has_draft.reshape(-1),
                                        philox_uniform(seed ^ ACCEPT_STREAM, counter), philox_uniform(seed, counter))
        self.commit_verification(slots, hidden, w, token=token.view(b, w).contiguous(),
                                 accepted=accepted.view(b, w).contiguous())

    def _commit_verification(self, slots: torch.Tensor, rows: torch.Tensor, w: int, *,
                             logits: torch.Tensor | None = None, token: torch.Tensor | None = None,
                             accepted: torch.Tensor | None = None) -> None:
        """A verification's outcome into the slots: greedy from the ``logits`` [b * w, V] (a
        position's choice is its argmax, accepted where it equals the draft fed after it), or
        the rejection sampler's ``token`` and ``accepted`` [b, w]. With k accepted drafts (the
        longest accepted prefix) the row emits k + 1 tokens: the slot's position, last token and
        counts move by them, its hidden row becomes position k's of ``rows`` [b * w, H], and its
        record carries them."""
        buf, dev = self.buffers, self.device
        b = slots.shape[0]
        q = torch.arange(w, device=dev).view(1, w)
        if logits is not None:
            drafts = buf["step.tokens"][:b, :w - 1]
            following = torch.cat([drafts, torch.zeros(b, 1, dtype=torch.int64, device=dev)], dim=1)
            token = logits.argmax(dim=-1).view(b, w)
            accepted = (q < self._step("step.num_tokens", b).view(-1, 1)) & (following == token)
        k = accepted.to(torch.int64).cumprod(dim=1).sum(dim=1)  # accepted drafts per row
        new = k + 1
        emitted = q < new.view(-1, 1)
        last = token.gather(1, k.view(-1, 1)).view(b)
        pos0 = buf["slot.position"][slots]
        self.hidden.index_copy_(0, slots, rows.view(b, w, -1)[torch.arange(b, device=dev), k])
        buf["slot.position"].index_copy_(0, slots, pos0 + new)
        buf["slot.token"].index_copy_(0, slots, last)
        buf["slot.generated"].index_copy_(0, slots, buf["slot.generated"][slots] + new)
        self.output_counts.view(-1).scatter_add_(
            0, (slots.view(b, 1) * self.output_counts.shape[1] + token).view(-1), emitted.to(torch.int32).view(-1))
        self._record(slots, GraphKind.SPECULATIVE, self._ones[:b], (new, torch.where(emitted, token, 0)))

    def _tail_pages(self, slots: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        table = self.buffers["slot.page_table"][slots]
        idx = (lengths // self.contract.page_tokens).clamp(max=table.shape[1] - 1)
        return table.gather(1, idx.view(-1, 1)).view(-1)

    def _snapshot(self, graph: GraphSpec) -> None:
        buf = self.buffers
        slots = self._step("step.slots", graph.batch)
        rows = self._step("step.snapshot_rows", graph.batch)
        lengths = buf["slot.position"][slots]
        tail = self._tail_pages(slots, lengths)
        for layer in range(len(self.kv.k)):
            self.snap_k[:, layer].index_copy_(0, rows, self.kv.k[layer][tail])
            self.snap_v[:, layer].index_copy_(0, rows, self.kv.v[layer][tail])
        self.snap_hidden.index_copy_(0, rows, self.hidden[slots])
        self.snap_length.index_copy_(0, rows, lengths)
        self._record(slots, GraphKind.SNAPSHOT, None)

    def _restore(self, graph: GraphSpec) -> None:
        buf = self.buffers
        slots = self._step("step.slots", graph.batch)
        rows = self._step("step.snapshot_rows", graph.batch)
        lengths = self.snap_length[rows]
        tail = self._tail_pages(slots, lengths)
        for layer in range(len(self.kv.k)):
            self.kv.k[layer].index_copy_(0, tail, self.snap_k[rows, layer])
            self.kv.v[layer].index_copy_(0, tail, self.snap_v[rows, layer])
        buf["slot.position"].index_copy_(0, slots, lengths)
        self.hidden.index_copy_(0, slots, self.snap_hidden[rows])
        self._record(slots, GraphKind.RESTORE, None)

    def _resume(self, graph: GraphSpec) -> None:
        slots = self._step("step.slots", graph.batch)
        self._sample_rows(slots, self.hidden[slots], self._ones[:graph.batch], GraphKind.RESUME)

    # -- host access (CPU executor, tests) -------------------------------------

    def host_view(self, name: str) -> np.ndarray:
        """A writable NumPy view of a CPU buffer (CPU executor uploads go through it)."""
        tensor = self.buffers[name]
        if tensor.device.type != "cpu":
            raise ValueError(f"{name} is not host-visible on {tensor.device}")
        return tensor.numpy()
