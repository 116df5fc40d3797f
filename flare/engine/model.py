"""NativeModel: a loaded core with its model runtime, for Python use and the server.

    model = NativeModel.load("path/to/core")
    for event in model.generate([1, 2, 3], SamplingParams(max_tokens=16)):
        ...
    model.close()

Loading verifies the core, places weights on the device, sizes the KV cache
from the memory budget, builds the step programs and an executor (CPU here;
the CUDA executor where a GPU is selected), and starts the model thread.
"""

from __future__ import annotations

import hashlib
import json
import queue
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np

from ..config import EngineConfig
from ..core.format import Core, load_core
from ..errors import ExecutionError
from ..frontend.grammar import GrammarCompiler, Matcher
from ..progress import Progress
from ..request import ErrorEvent, Event, FinishEvent, GrammarRequest, PreparedPrompt, SamplingParams
from ..scheduler.scheduler import RequestScheduler


def core_identity(core: Core) -> bytes:
    """32-byte model/recipe identity for prefix keys: recipe, dtype and every asset hash."""
    blob = json.dumps({"recipe": core.manifest["recipe"], "dtype": core.dtype,
                       "assets": {k: v["sha256"] for k, v in core.assets.items()}}, sort_keys=True)
    return hashlib.sha256(blob.encode()).digest()


class NativeModel:
    def __init__(self, core: Core, loaded, executor, runtime, tokenizer, drafter=None):
        self.core = core
        self.drafter = drafter  # speculative "draft": the DraftProposer driving the draft core
        self.loaded = loaded
        self.executor = executor
        self.runtime = runtime
        self.tokenizer = tokenizer
        # Structured output over the core's tokenizer and the model's vocabulary (built on first use).
        self.grammars = GrammarCompiler(core.asset("tokenizer.json"), core.assets["tokenizer.json"]["sha256"],
                                        core.recipe.eos_token_ids, loaded.contract.vocab_size)

    @classmethod
    def load(cls, core: str | Path | Core, config: EngineConfig = EngineConfig(), *,
             progress: Progress | None = None, decoder_factory=None, capacity: int | None = None,
             capacity_hint: str = "", proposer=None) -> "NativeModel":
        """``proposer``: a speculative proposer other than ``config.speculative``'s (the
        benchmark's ReplayProposer); the contract's SPECULATIVE graphs still come from the config.
        With ``config.speculative == "draft"`` the draft core loads first, so that on a GPU its
        KV takes its share of the free memory before the target sizes its own."""
        from tokenizers import Tokenizer

        from ..model.loader import load_model
        from .runtime import ModelRuntime

        if not isinstance(core, Core):
            if progress:
                progress(f"verifying core {core}")
            core = load_core(Path(core), progress=progress)
        drafter = None
        if proposer is None and config.speculative == "draft":
            from .drafter import load_drafter
            drafter = proposer = load_drafter(config.draft_core, core, config,
                                              config.max_active or core.contract.max_active, progress)
        ranks = None
        try:
            if config.tensor_parallel > 1:
                from dataclasses import replace

                from ..execution.ranks import rank_device
                config = replace(config, device=rank_device(config.device, 0))  # rank 0's own GPU, or the CPU
                ranks = cls._start_ranks(core, config, progress)
            loaded = load_model(core, config, progress, ranks.shard(0) if ranks is not None else None)
            if loaded.device.type == "cuda":
                from ..execution.cuda import make_cuda_executor
                executor = make_cuda_executor(loaded, progress)
            else:
                from ..execution.cpu import CpuExecutor
                executor = CpuExecutor(loaded.programs)
            if ranks is not None:
                executor = ranks.executor(executor, loaded.contract.num_pages)
        except BaseException:
            if ranks is not None:
                ranks.abort()
            if drafter is not None:
                drafter.close()
            raise
        tokenizer = Tokenizer.from_file(str(core.asset("tokenizer.json")))
        if decoder_factory is None:
            def decoder_factory():
                return StreamDecoder(tokenizer)
        if proposer is None and config.speculative == "copy":
            from ..scheduler.speculation import CopyProposer
            proposer = CopyProposer()
        scheduler = RequestScheduler(loaded.contract, core_identity(core), config.policy,
                                     eos_token_ids=core.recipe.eos_token_ids, proposer=proposer)
        max_active = loaded.contract.max_active
        runtime = ModelRuntime(scheduler, executor, decoder_factory=decoder_factory,
                               capacity=capacity or 5 * max_active, capacity_hint=capacity_hint)
        return cls(core, loaded, executor, runtime, tokenizer, drafter)

    @staticmethod
    def _start_ranks(core: Core, config: EngineConfig, progress: Progress | None):
        """Tensor parallel: the shapes checked, then ranks 1..N-1 started and joined (rank 0 is us)."""
        from ..execution.ranks import plan_from_environment, start_ranks
        from ..model.loader import resolve_device
        from ..model.tensor_parallel import check_shardable

        world = config.tensor_parallel
        check_shardable(core.recipe, world)
        plan = plan_from_environment(world)
        gpu = resolve_device(config.device).type == "cuda"
        if gpu and plan is None:
            import torch

            if torch.cuda.device_count() < world:
                raise ExecutionError(f"tensor parallel {world} needs {world} GPUs on this host, one per rank; "
                                     f"{torch.cuda.device_count()} found")
        if progress:
            progress(f"tensor parallel: {world} ranks ({'NCCL' if gpu else 'gloo'})")
        return start_ranks(world, str(core.path), config, plan=plan)

    @property
    def context_len(self) -> int:
        return self.loaded.contract.context

    def prepare_grammar(self, request: GrammarRequest) -> Matcher:
        """A request's constraint compiled (or from the cache) and started: its first mask computed."""
        return self.grammars.compile(request).matcher()

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, sink, grammar=None):
        return self.runtime.submit(prompt, params, sink, grammar)

    def generate(self, prompt: PreparedPrompt | Sequence[int], params: SamplingParams = SamplingParams(),
                 timeout: float | None = None) -> Iterator[Event]:
        """Submit and yield events until the terminal one (blocking); ``params.grammar`` is
        compiled here."""
        if not isinstance(prompt, PreparedPrompt):
            prompt = PreparedPrompt(np.asarray(prompt, dtype=np.int32))
        grammar = self.prepare_grammar(params.grammar) if params.grammar is not None else None
        events: queue.Queue = queue.Queue()
        ticket = self.runtime.submit(prompt, params, events.put, grammar)
        try:
            while True:
                event = events.get(timeout=timeout)
                yield event
                if isinstance(event, (FinishEvent, ErrorEvent)):
                    return
        except queue.Empty:
            ticket.cancel()
            raise ExecutionError(f"no event within {timeout} s") from None
        finally:
            ticket.cancel()

    def close(self, timeout: float | None = None) -> None:
        self.runtime.close(timeout)
        if self.drafter is not None:
            self.drafter.close()


class StreamDecoder:
    """Incremental detokenization over tokenizers' DecodeStream (holds split UTF-8)."""

    def __init__(self, tokenizer, skip_special_tokens: bool = True):
        from tokenizers.decoders import DecodeStream

        self._tokenizer = tokenizer
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)

    def push(self, token_ids) -> str:
        out = []
        for t in token_ids:
            piece = self._stream.step(self._tokenizer, int(t))
            if piece:
                out.append(piece)
        return "".join(out)

    def flush(self) -> str:
        return ""
