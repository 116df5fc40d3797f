"""A minimal step driver for model-level tests (no scheduler).

Drives the real executor, inputs packing and step programs by hand: pages are
handed out linearly, slots are chosen by the test. The runtime's scheduler does
this for real; here the test controls every chunk and batch.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer, models

from flare.config import EngineConfig
from flare.contract import REC_CONSUMED, REC_TOKEN0, GraphKind, mask_words
from flare.core.export import ExportOptions, export_core
from flare.core.format import load_core
from flare.execution.cpu import CpuExecutor
from flare.model.inputs import Inputs
from flare.model.loader import load_model
from flare.request import GrammarRequest, SamplingParams

GREEDY = SamplingParams(temperature=0.0)


def write_word_tokenizer(path: Path, vocab_size: int) -> None:
    """A trivial tokenizer.json so a random-weight checkpoint can be exported."""
    vocab = {f"t{i}": i for i in range(vocab_size)}
    Tokenizer(models.WordLevel(vocab, unk_token="t0")).save(str(path / "tokenizer.json"))


def save_tiny(model, path: Path) -> Path:
    model.save_pretrained(path)
    write_word_tokenizer(path, model.config.vocab_size)
    return path


def save_tiny_llama(path: Path, max_positions: int = 256) -> Path:
    """The smallest exportable Llama checkpoint (2 layers, hidden 32, vocab 128), seeded 0."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=max_positions))
    return save_tiny(model, path)


class Harness:
    def __init__(self, core_dir: Path, *, max_active: int = 4, kv_bytes: int = 64 << 20, device: str = "cpu",
                 mixed_prefill: bool | None = None):
        self.core = load_core(core_dir)
        self.model = load_model(self.core, EngineConfig(device=device, max_active=max_active,
                                                         kv_memory_bytes=kv_bytes, mixed_prefill=mixed_prefill))
        self.contract = self.model.contract
        self.programs = self.model.programs
        if self.model.device.type == "cuda":
            from flare.execution.cuda import make_cuda_executor
            self.executor = make_cuda_executor(self.model)
        else:
            self.executor = CpuExecutor(self.programs)
        self.inputs = Inputs(self.contract)
        self.next_page = 0
        self.pages: dict[int, list[int]] = {}

    @classmethod
    def export(cls, checkpoint: Path, out: Path, *, context: int = 512, chunk: int = 128, dtype: str = "float32",
               **kw) -> "Harness":
        export_core(checkpoint, out, ExportOptions(context=context, prefill_chunk_size=chunk,
                                                   max_active=kw.get("max_active", 4), dtype=dtype,
                                                   mixed_prefill=kw.pop("mixed_prefill", False)))
        return cls(out, **kw)

    def close(self) -> None:
        self.executor.close()

    def run(self, kind: GraphKind, batch: int, tokens: int = 1, greedy: bool = False):
        graph = self.contract.graph(kind, batch, tokens, greedy)
        self.executor.submit(graph.index, self.inputs.take())
        done = self.executor.poll(timeout=120)
        assert done is not None and done.error is None, done and done.error
        return done

    def alloc_pages(self, slot: int, upto_tokens: int) -> None:
        pages = self.pages.setdefault(slot, [])
        need = -(-upto_tokens // self.contract.page_tokens)
        new = list(range(self.next_page, self.next_page + need - len(pages)))
        self.next_page += len(new)
        if new:
            self.inputs.set_pages(slot, len(pages), new)
            pages.extend(new)

    def share_pages(self, slot: int, pages: list[int]) -> None:
        self.pages[slot] = list(pages)
        self.inputs.set_pages(slot, 0, pages)

    def admit(self, slot: int, *, position: int = 0, generation: int = 1, params=GREEDY, seed: int = 0,
              prompt: np.ndarray | None = None) -> None:
        self.inputs.admit_slot(slot, generation=generation, position=position, seed=seed, params=params)
        self.inputs.set_rows([slot], 1)
        self.inputs.set_prompt(prompt)
        self.run(GraphKind.INITIALIZE, 1)

    def prefill(self, slot: int, tokens: np.ndarray, start: int, chunks: list[int]) -> int:
        """Prefill tokens[start:] in the given chunk lengths; returns the sampled token."""
        pos = start
        for i, n in enumerate(chunks):
            cap = next(c for c in self.contract.prefill_capacities if c >= n)
            self.alloc_pages(slot, pos + n + 1)
            self.inputs.set_rows([slot], 1)
            self.inputs.set_prefill_row(0, tokens[pos:pos + n], sample=i == len(chunks) - 1)
            done = self.run(GraphKind.PREFILL, 1, cap)
            pos += n
            assert done.records[slot, REC_CONSUMED] == pos
        return int(done.records[slot, REC_TOKEN0])

    def prefill_together(self, prompts: dict[int, np.ndarray], batch: int, tokens: int) -> dict[int, int]:
        """Prefill whole prompts of several slots in one PREFILL b{batch} t{tokens} step (the rows
        past len(prompts) are padding); returns each slot's sampled token."""
        slots = list(prompts)
        for slot, p in prompts.items():
            self.alloc_pages(slot, len(p) + 1)
        self.inputs.set_rows(slots, batch)
        for i, p in enumerate(prompts.values()):
            self.inputs.set_prefill_row(i, p, sample=True)
        for i in range(len(slots), batch):
            self.inputs.set_prefill_row(i, np.zeros(0, dtype=np.int64), sample=False)
        done = self.run(GraphKind.PREFILL, batch, tokens)
        for slot, p in prompts.items():
            assert done.records[slot, REC_CONSUMED] == len(p)
        return {slot: int(done.records[slot, REC_TOKEN0]) for slot in slots}

    def mixed(self, decode_slots: list[int], prefill: dict[int, tuple[np.ndarray, bool]], *, width: int,
              tokens: int) -> dict[int, int]:
        """One MIXED step: ``decode_slots`` decode (rows 0.., padded to ``width``) while each slot of
        ``prefill`` consumes its tokens (packed from row ``width``), sampling where its flag says;
        returns the token of every sampling slot."""
        graph = next(g for g in self.contract.graphs
                     if g.kind == GraphKind.MIXED and g.width == width and g.tokens == tokens)
        for s in decode_slots:
            self.alloc_pages(s, self.position(s) + 2)
        for s, (t, _) in prefill.items():
            self.alloc_pages(s, self.position(s) + len(t) + 1)
        slots = np.zeros(graph.batch, np.int64)
        slots[:len(decode_slots)] = decode_slots
        slots[width:width + len(prefill)] = list(prefill)
        self.inputs.set_rows(slots, graph.batch)
        self.inputs.set_packed_prefill(width, list(prefill.values()), graph.prefill_rows)
        self.executor.submit(graph.index, self.inputs.take())
        done = self.executor.poll(timeout=120)
        assert done is not None and done.error is None, done and done.error
        sampling = [*decode_slots, *(s for s, (_, sample) in prefill.items() if sample)]
        return {s: int(done.records[s, REC_TOKEN0]) for s in sampling}

    def decode_step(self, slots: list[int]):
        """One DECODE step of ``slots`` in the smallest graph that holds them -> its completion."""
        cap = next(b for b in self.contract.batch_capacities if b >= len(slots))
        for s in slots:
            consumed = self.position(s)
            self.alloc_pages(s, consumed + 2)
        self.inputs.set_rows(slots, cap)
        return self.run(GraphKind.DECODE, cap)

    def decode(self, slots: list[int]) -> dict[int, int]:
        done = self.decode_step(slots)
        return {s: int(done.records[s, REC_TOKEN0]) for s in slots}

    def decode_steps(self, tokens: dict[int, list[int]], logits: dict[int, list[torch.Tensor]], steps: int) -> None:
        """Decode the slots of ``tokens`` together ``steps`` times, appending each step's
        sampled token and logits to their lists."""
        slots = list(tokens)
        for _ in range(steps):
            for slot, token in self.decode(slots).items():
                tokens[slot].append(token)
                logits[slot].append(self.logits(slot))

    def logits(self, slot: int) -> torch.Tensor:
        """Logits of the slot's last consumed token (the ones its last sample used), on the CPU."""
        with torch.inference_mode():
            return self.model.decoder.logits(self.programs.hidden[slot:slot + 1])[0].float().cpu()

    def generated(self, slot: int) -> int:
        return int(self.programs.buffers["slot.generated"][slot])

    def position(self, slot: int) -> int:
        return int(self.programs.buffers["slot.position"][slot])


def mask_row(vocab: int, allowed: list[int] | None = None) -> np.ndarray:
    """A slot.grammar_mask row allowing ``allowed`` (every token when None)."""
    row = np.zeros(mask_words(vocab), dtype=np.int32)
    if allowed is None:
        row[:] = -1
        return row
    bits = row.view(np.uint32)
    for token in allowed:
        bits[token // 32] |= np.uint32(1 << (token % 32))
    return row


def check_held_decode(h: Harness, prompt: np.ndarray, steps: int = 6, *, greedy_graph: bool = False) -> None:
    """A held DECODE step (forward part submitted, masks released after it, then sampling)
    samples what the whole step samples, and applies the masks of its release, not the ones
    resident when its forward part ran."""
    vocab = h.contract.vocab_size
    params = SamplingParams(temperature=0.0, grammar=GrammarRequest("json_object"))
    graph = h.contract.graph(GraphKind.DECODE, 1, greedy=greedy_graph)
    runs = []
    for mode in ("whole", "held", "forced"):
        h.admit(1, generation=300 + len(runs), params=params)
        h.inputs.set_grammar_masks([1], [mask_row(vocab)])
        tokens = [h.prefill(1, prompt, 0, [len(prompt)])]
        for step in range(steps):
            h.alloc_pages(1, h.position(1) + 2)
            h.inputs.set_rows([1], 1)
            if mode == "whole":
                done = h.run(GraphKind.DECODE, 1, greedy=greedy_graph)
            else:
                fence = h.executor.submit(graph.index, h.inputs.take(), grammar_constrained=True)
                assert h.executor.poll(timeout=0.05) is None and not h.executor.can_submit()
                forced = (runs[0][step + 1] + 1) % vocab
                h.inputs.set_grammar_masks([1], [mask_row(vocab, None if mode == "held" else [forced])])
                h.executor.release(fence, h.inputs.take())
                done = h.executor.poll(timeout=120)
                assert done is not None and done.error is None and done.fence == fence
            tokens.append(int(done.records[1, REC_TOKEN0]))
        runs.append(tokens)
    whole, held, forced = runs
    assert held == whole
    assert forced[1:] == [(t + 1) % vocab for t in whole[1:]]

