"""NativeEngine: the server's Engine over a loaded core (NativeModel + Frontend)."""

from __future__ import annotations

import logging
import time
from dataclasses import replace
from functools import partial
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from ..config import ServerConfig
from ..core.format import Core, load_core
from ..errors import FrontendError
from ..frontend.annotations import sha256_hex
from ..frontend.continuations import GeneratedSpans
from ..frontend.frontend import AssetFingerprints, Frontend, RequestTemplates, TokenSettings, read_template_file
from ..frontend.parsers import served, syntax_of
from ..frontend.parsers.detect import detect as detect_parsers
from ..frontend.template.limits import TemplateLimits
from ..request import (
    EventSink,
    FinishEvent,
    GenerationDefaults,
    GrammarRequest,
    ModelCard,
    ModelDetails,
    PreparedPrompt,
    SamplingParams,
    TokenEvent,
)
from .model import NativeModel, core_identity
from .telemetry import EngineStats

log = logging.getLogger("flare.engine")


def template_limits(config: ServerConfig) -> TemplateLimits:
    """The chat-template budget the server configuration sets (docs/serving.md)."""
    return TemplateLimits(fuel=config.template_fuel, time_limit_s=config.template_time_limit_s,
                          max_string_bytes=config.template_max_bytes, max_collection_bytes=config.template_max_bytes,
                          max_output_bytes=2 * config.template_max_bytes)


def load_frontend(core: Core, limits: TemplateLimits | None = None) -> Frontend:
    """The core's tokenizer and chat template, verified against its fingerprints."""
    settings = dict(core.contract.frontend)
    tokens = TokenSettings(
        bos_token=settings.get("bos_token"), eos_token=settings.get("eos_token"),
        unk_token=settings.get("unk_token"), pad_token=settings.get("pad_token"),
        add_bos_token=settings.get("add_bos_token"),
        eos_token_ids=tuple(settings.get("eos_token_ids") or core.recipe.eos_token_ids),
    )
    template = core.asset("chat_template.jinja").read_bytes() if "chat_template.jinja" in core.assets else None
    expected = AssetFingerprints(
        tokenizer_json=core.assets["tokenizer.json"]["sha256"],
        chat_template=core.assets["chat_template.jinja"]["sha256"] if template is not None else None,
    )
    return Frontend.load(core.asset("tokenizer.json").read_bytes(), template, expected, tokens, limits=limits)


def override_template(frontend: Frontend, path: Path) -> Frontend:
    """``frontend`` with the chat template in ``path`` (--chat-template), annotated and fingerprinted like
    an exported one; FrontendError (naming the line and column) when it does not compile."""
    data = read_template_file(path, check=False)  # with_chat_template compiles it, once
    try:
        return frontend.with_chat_template(data, sha256_hex(data))
    except FrontendError as exc:
        raise FrontendError(f"chat template {path}: {exc}") from None


def template_card(core: Core, frontend: Frontend) -> dict[str, Any] | None:
    """What /v1/models reports about the template served: where it came from, its fingerprint, its forms."""
    if frontend.template is None:
        return None
    digest = frontend.fingerprints.chat_template
    exported = core.assets.get("chat_template.jinja", {}).get("sha256")
    return {"sha256": digest, "source": "core" if digest == exported else "override",
            "endpoint_path": frontend.endpoint_path, "forms": frontend.forms.to_json()}


def model_details(model: NativeModel, frontend: Frontend) -> ModelDetails:
    """What the served model is (Ollama's /api/show): recipe, size, dtype, device, template."""
    core = model.core
    recipe = core.recipe
    weights = sum(entry.get("bytes", 0) for name, entry in core.assets.items() if name.startswith("weights"))
    tool_parser, reasoning_parser = output_parsers(core, frontend)
    return ModelDetails(family=recipe.family, architecture=recipe.architecture, num_params=recipe.num_params,
                        dtype=core.dtype, weights_bytes=weights, device=str(model.loaded.device),
                        digest=core_identity(core).hex(),
                        chat_template=frontend.template.source if frontend.template is not None else None,
                        renders_tools=frontend.renders_tools, tool_parser=tool_parser,
                        reasoning_parser=reasoning_parser, hyperparameters=recipe.to_json())


def output_parsers(core: Core, frontend: Frontend) -> tuple[str | None, str | None]:
    """The (tool-call, reasoning) parsers for the template served: those the export recorded
    for the core's own template, else the ones its source implies (a serve-time
    --chat-template, or a core exported before parsers were recorded)."""
    if frontend.template is None:
        return None, None
    recorded = core.contract.frontend
    exported = core.assets.get("chat_template.jinja", {}).get("sha256")
    if frontend.fingerprints.chat_template == exported and "tool_parser" in recorded:
        return recorded.get("tool_parser"), recorded.get("reasoning_parser")
    return detect_parsers(frontend.template.source)


class NativeEngine:
    """Implements flare.engine.base.Engine for a prepared core."""

    def __init__(self, model: NativeModel, frontend: Frontend, served_names: Sequence[str] = (),
                 special_markers: Mapping[str, int] | None = None, reuse_output_tokens: bool = True):
        self.model = model
        self.frontend = frontend
        # Finished outputs, so that a prompt carrying one back is tokenized as it was generated
        # (frontend/continuations.py); None with --no-reuse-output-tokens.
        self.generated = GeneratedSpans(frontend.token_bytes) if reuse_output_tokens else None
        # Output-parser markers that are special tokens (kept in the output text), by text:
        # a forced tool call's grammar writes them as those tokens.
        self.special_markers = dict(special_markers or {})
        self.request_templates = RequestTemplates(frontend)
        core = model.core
        self.context_len = model.context_len
        self.max_active = model.loaded.contract.max_active
        self.generation_defaults: GenerationDefaults = core.generation
        capabilities = ("completion", "chat") if frontend.template is not None else ("completion",)
        self.card = ModelCard(identifier=core.identifier,
                              served_names=tuple(served_names) or core.contract.served_names,
                              max_model_len=self.context_len, capabilities=capabilities,
                              created=int(time.time()),
                              extra={"endpoint_path": frontend.endpoint_path, "dtype": core.dtype,
                                     "chat_template": template_card(core, frontend)},
                              details=model_details(model, frontend))

    @classmethod
    def load(cls, core_path: str | Path, config: ServerConfig, progress=None) -> "NativeEngine":
        from ..progress import LineProgress, stage_reporter

        # the server's startup progress logs each message; its measurable steps are bars on a
        # terminal, else logged as they start and end (flare/progress.py)
        say = stage_reporter(progress, "loading") if progress is not None else \
            LineProgress(lambda message: log.info("%s", message))
        core = load_core(Path(core_path), progress=say)
        frontend = load_frontend(core, template_limits(config))
        if config.chat_template:
            frontend = override_template(frontend, Path(config.chat_template))
            say(f"chat template {config.chat_template} (sha256 {frontend.fingerprints.chat_template[:16]}) "
                f"replaces the core's")
        say(f"chat template endpoints: {frontend.endpoint_path}; forms: content {frontend.forms.content}, "
            f"tool-call arguments {frontend.forms.arguments}")
        capacity = (config.queue_capacity or 4 * (config.engine.max_active or core.contract.max_active)) \
            + (config.engine.max_active or core.contract.max_active)
        # The served output parsers' markers that are special tokens stay in the output text,
        # which drops special tokens otherwise (vLLM keeps them for such parsers too).
        parsers = [served(option, model_parser) for option, model_parser in
                   zip((config.tool_parser, config.reasoning_parser), output_parsers(core, frontend))]
        markers = frontend.tokenizer.special_token_ids(syntax_of(*parsers))
        if markers:
            say(f"output parsers {', '.join(p for p in parsers if p)}: special tokens kept in the output: "
                f"{', '.join(markers)}")
        decoder_factory = partial(frontend.incremental_decoder, keep=frozenset(markers.values()))
        model = NativeModel.load(core, config.engine, progress=say, decoder_factory=decoder_factory,
                                 capacity=capacity,
                                 capacity_hint=config.capacity_hint or core.contract.capacity_hint)
        # The grammar engine's token tries (0.2 s for a 49k vocabulary, 1 s for 128k) are built
        # before the server listens: building them holds the GIL, which would stall the event
        # loop if it happened while serving.
        started = time.perf_counter()
        unavailable = model.grammars.warm()
        if unavailable is None:
            say(f"structured output: grammar engine ready in {time.perf_counter() - started:.1f} s")
        else:
            log.warning("structured output is unavailable (constrained requests get a 400): %s", unavailable)
        return cls(model, frontend, config.served_names, markers, config.reuse_output_tokens)

    @property
    def failure(self):
        return self.model.runtime.failure

    def prepare_chat(self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None,
                     options: Mapping[str, Any], chat_template: str | None = None) -> PreparedPrompt:
        frontend = self.frontend if chat_template is None else self.request_templates.get(chat_template)
        return self._as_generated(frontend.prepare_chat(messages, tools, options))

    def prepare_text(self, prompt: str | Sequence[int]) -> PreparedPrompt:
        if isinstance(prompt, str):
            ids = self.frontend.encode(prompt, add_special_tokens=True)
            return self._as_generated(PreparedPrompt(np.asarray(ids, dtype=np.int32), (), prompt))
        ids = np.asarray(list(prompt), dtype=np.int64)
        vocab = self.model.core.recipe.vocab_size
        if ids.size and (ids.min() < 0 or ids.max() >= vocab):
            raise FrontendError(f"prompt token IDs must be in [0, {vocab})")
        return PreparedPrompt(ids.astype(np.int32))

    def token_bytes(self, token_id: int) -> bytes:
        return self.frontend.token_bytes(token_id)

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.frontend.encode(text, add_special_tokens=add_special_tokens)

    def decode(self, token_ids: Sequence[int]) -> str:
        return self.frontend.decode(self.frontend.check_token_ids(token_ids), skip_special_tokens=False)

    def token_strings(self, token_ids: Sequence[int]) -> list[str]:
        return self.frontend.token_strings(token_ids)

    def prepare_grammar(self, request: GrammarRequest):
        return self.model.prepare_grammar(request)

    def _as_generated(self, prompt: PreparedPrompt) -> PreparedPrompt:
        """The prompt with the outputs it carries back spelled as they were generated."""
        if self.generated is None:
            return prompt
        spliced = self.generated.splice(prompt.token_ids)
        if not spliced.spans:
            return prompt
        return PreparedPrompt(spliced.token_ids, spliced.moved(prompt.message_endpoints), prompt.text)

    def submit(self, prompt: PreparedPrompt, params: SamplingParams, sink: EventSink, grammar=None):
        if self.generated is None:
            return self.model.submit(prompt, params, sink, grammar)
        outputs: list[int] = []
        generated = self.generated

        def recording(event) -> None:  # on the model thread, before the event goes on
            if type(event) is TokenEvent:
                outputs.extend(event.token_ids)
            elif type(event) is FinishEvent:
                generated.record(prompt.token_ids, outputs)
            sink(event)

        return self.model.submit(prompt, params, recording, grammar)

    def stats(self) -> EngineStats:
        grammars = self.model.grammars.stats()
        return replace(self.model.runtime.stats(), grammar_compiles=grammars.compiles,
                       grammar_compile_errors=grammars.compile_errors, grammar_cache_hits=grammars.cache_hits,
                       grammar_compile_seconds=grammars.compile_seconds, grammars_cached=grammars.cached,
                       **self._reuse_stats())

    def _reuse_stats(self) -> dict:
        if self.generated is None:
            return {}
        reuse = self.generated.stats()
        return {"outputs_carried_back": reuse.prompts, "reused_output_tokens": reuse.tokens,
                "outputs_recorded": reuse.entries}

    def start_trace(self):
        """Dashboard telemetry on: the runtime's CompletionTrace (flare/engine/trace.py)."""
        return self.model.runtime.start_trace()

    def stop_trace(self) -> None:
        self.model.runtime.stop_trace()

    @property
    def graph_labels(self) -> tuple[tuple[str, str], ...]:
        """(kind, label) of each captured graph, by graph index (the dashboard's scheduler pane)."""
        return tuple((g.kind.name.lower(), g.label) for g in self.model.loaded.contract.graphs)

    def shed_queued(self, error) -> None:
        self.model.runtime.shed_queued(error)

    def close(self, timeout: float | None = None) -> None:
        self.model.close(timeout)
