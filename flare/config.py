"""Frozen configuration, layered ServerConfig -> EngineConfig -> PolicyConfig.

Configs never change after startup. Values measured at load (KV page count,
eos ids) live in runtime-info objects, not here. CLI defaults are read from
these dataclass fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field

PAGE_TOKENS = 64
MAX_ACTIVE_LIMIT = 256
# ServerConfig.generation_config: "model" applies the core's generation defaults (its
# generation_config.json) to requests, "none" OpenAI's built-in ones (vLLM's auto / vllm).
GENERATION_CONFIGS = ("model", "none")
# EngineConfig.speculative: "copy" drafts by n-gram lookup over the prompt and output
# (prompt-lookup decoding), "draft" by a draft core loaded beside the target (draft_core),
# "none" decodes one token per step (docs/speculative.md).
SPECULATIVE_MODES = ("copy", "draft", "none")


@dataclass(frozen=True)
class PolicyConfig:
    """Scheduler value coefficients (preferences, not latency bounds)."""

    output_token_value: float = 64.0  # one output token, in prompt-token units
    token_fairness: float = 16.0
    delivery_fairness: float = 4.0
    decode_age_price: float = 0.1
    terminal_value: float = 256.0
    terminal_age_price: float = 1.0
    service_price_adaptation_s: float = 0.100
    timing_freshness_s: float = 30.0
    adaptive_verification_exponent: float = 1.0
    checkpoint_extra_work_fraction: float = 0.05
    refresh_credit_fraction: float = 0.002 / 0.998
    refresh_credit_cap_s: float = 0.005
    timing_window: int = 9
    # MIXED steps that carry decoders use at most this prompt capacity (vLLM's token budget): on
    # the H200 (Llama-3-8B) a 1,024-token step with 64 decoders takes 30 ms and a 2,048-token one
    # 56 ms, every decoder's inter-token gap (docs/benchmarks.md, "Serving under load").
    mixed_token_budget: int = 1024
    # KV pages on demand: admission reserves the prompt plus at most this many output tokens;
    # pages beyond grow from unreserved pages as the request decodes, and when none are left
    # the scheduler preempts (docs/scheduler.md, "Resources").
    output_page_lookahead: int = 256


@dataclass(frozen=True)
class EngineConfig:
    """How a core is loaded and executed."""

    device: str = "auto"  # "auto", "cpu", "cuda", "cuda:N"
    max_active: int = 0  # 0 = the core's contract value
    kv_memory_bytes: int = 0  # 0 = default: 1 GiB on CPU, a fraction of free memory on GPU
    kv_memory_fraction: float = 0.85
    num_snapshot_rows: int = 0  # 0 = derived from max_active
    mixed_prefill: bool | None = None  # MIXED graphs; None = the core's contract (flare export --mixed-prefill)
    speculative: str = "none"  # one of SPECULATIVE_MODES
    speculative_depth: int = 4  # most drafts verified per request and step (1..7)
    draft_core: str = ""  # speculative "draft": the draft core's directory (same tokenizer as the target)
    # ranks the model is sharded over, one per device (flare/execution/ranks.py; on the CPU, gloo
    # processes on this host); 1 is the single-rank path, unchanged
    tensor_parallel: int = 1
    policy: PolicyConfig = field(default_factory=PolicyConfig)


@dataclass(frozen=True)
class ServerConfig:
    """HTTP server settings (docs/serving.md; flags, FLARE_* variables and TOML keys share these names)."""

    host: str = "127.0.0.1"  # listen address
    port: int = 8000  # listen port; 0 picks a free one (logged at startup)
    api_key: str | None = None  # when set, every route but /health and /metrics needs "Bearer <api_key>"
    served_names: tuple[str, ...] = ()  # model aliases; the first non-empty one is the /v1/models id
    # web page origins allowed beside the loopback ones ("*" = any; server/cors.py); a request
    # with an Origin header from elsewhere gets 403
    allowed_origins: tuple[str, ...] = ()
    queue_capacity: int = 0  # HTTP requests admitted beyond max_active; 0 = 4 x max_active
    frontend_workers: int = 2  # threads rendering templates and tokenizing, one request each
    max_body_bytes: int = 0  # 0 = derived from the context (32 bytes per token) + 1 MiB
    max_header_bytes: int = 64 * 1024  # request head (headers) limit; 431 beyond
    max_url_bytes: int = 8 * 1024  # request target limit; 414 beyond
    max_json_depth: int = 64  # nesting of arrays/objects in a JSON request body; 400 beyond
    template_time_limit_s: float = 2.0  # wall clock for all chat-template renders of one request; 400 beyond
    template_fuel: int = 20_000_000  # template VM instructions per render; 400 beyond
    template_max_bytes: int = 16 * 1024 * 1024  # one string or collection a template builds; 400 beyond
    request_timeout_s: float = 60.0  # a client must deliver a whole request in this time (408)
    keepalive_timeout_s: float = 75.0  # an idle keep-alive connection is closed after this
    shutdown_grace_s: float = 5.0  # on SIGINT/SIGTERM/close, active responses get this long to finish
    log_level: str = "info"  # debug, info, warning, error or critical
    log_requests: bool = True  # one info line per finished request (route family, status, tokens, times)
    dashboard: bool = True  # the terminal dashboard, when stderr is a usable terminal (docs/dashboard.md)
    # a prompt that carries a finished output back (the next turn) gets the tokens it was
    # generated with, not its re-encoding, so the prefix cache covers it (frontend/continuations.py)
    reuse_output_tokens: bool = True
    context_hint: str = ""  # appended to context-length errors: the setting that raises the limit
    capacity_hint: str = ""  # appended to 429/503 capacity errors: the setting that raises the limit
    generation_config: str = "model"  # request defaults: the core's generation values, or "none" (OpenAI's)
    chat_template: str | None = None  # a chat template file served instead of the core's (--chat-template)
    trust_request_chat_template: bool = False  # requests may carry their own chat_template (vLLM's flag)
    # Output parsers (frontend/parsers): "auto" serves the core's (or what a serve-time template
    # implies), "none" parses nothing, a name serves that parser.
    tool_parser: str = "auto"
    reasoning_parser: str = "auto"
    engine: EngineConfig = field(default_factory=EngineConfig)
