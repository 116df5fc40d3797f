"""Server options from the command line, FLARE_* variables and a TOML file.

Precedence, highest first: command-line flags, ``FLARE_*`` environment
variables, the config file (``--config PATH`` or ``FLARE_CONFIG``), the
:class:`~flare.config.ServerConfig` defaults. Every ServerConfig field can be
set in the file and through ``FLARE_<FIELD>``; ``max_active`` (and the other
EngineConfig fields) go to ``config.engine`` and may also be written in an
``[engine]`` table. docs/serving.md has the full table.
"""

from __future__ import annotations

import argparse
import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any, Mapping

from ..config import GENERATION_CONFIGS, MAX_ACTIVE_LIMIT, SPECULATIVE_MODES, EngineConfig, ServerConfig
from ..errors import Error
from .cors import check_origin_pattern

ENV_PREFIX = "FLARE_"
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
_BOOL_WORDS = {"1": True, "true": True, "yes": True, "on": True, "0": False, "false": False, "no": False, "off": False}
_SERVER_FIELDS = {f.name: f for f in dataclasses.fields(ServerConfig) if f.name != "engine"}
_ENGINE_FIELDS = {f.name: f for f in dataclasses.fields(EngineConfig) if f.name != "policy"}
_SERVER_TYPES = typing.get_type_hints(ServerConfig)
_ENGINE_TYPES = typing.get_type_hints(EngineConfig)

# (flag, config field, help). Defaults shown are read from the dataclasses.
_FLAGS = (
    ("--host", "host", "address to listen on"),
    ("--port", "port", "TCP port (0 picks a free one)"),
    ("--api-key", "api_key", "require 'Authorization: Bearer KEY' (or 'x-api-key: KEY') on every route but "
                             "/health and /metrics"),
    ("--max-active", "max_active", f"concurrent model requests, 1..{MAX_ACTIVE_LIMIT} (0 = the core's value)"),
    ("--queue-capacity", "queue_capacity", "HTTP requests admitted beyond max_active (0 = 4 x max_active)"),
    ("--frontend-workers", "frontend_workers", "threads that render templates and tokenize"),
    ("--log-level", "log_level", "one of " + ", ".join(LOG_LEVELS)),
    ("--max-body-bytes", "max_body_bytes", "request body limit (0 = 32 bytes per context token + 1 MiB)"),
    ("--max-json-depth", "max_json_depth", "deepest array/object nesting accepted in a JSON request body"),
    ("--template-time-limit", "template_time_limit_s", "seconds all chat-template renders of one request may take"),
    ("--template-fuel", "template_fuel", "template VM instructions one render may execute"),
    ("--template-max-bytes", "template_max_bytes", "bytes of one string or collection a template may build"),
    ("--request-timeout", "request_timeout_s", "seconds a client has to send a whole request"),
    ("--keepalive-timeout", "keepalive_timeout_s", "seconds an idle keep-alive connection stays open"),
    ("--shutdown-grace", "shutdown_grace_s", "seconds active responses get to finish on shutdown"),
    ("--context-hint", "context_hint", "appended to context-length errors: how to raise the limit"),
    ("--capacity-hint", "capacity_hint", "appended to capacity errors: how to raise the limit"),
    ("--generation-config", "generation_config", "request defaults: 'model' (the core's generation_config.json "
                                                 "values) or 'none' (OpenAI's: temperature 1, top_p 1)"),
    ("--chat-template", "chat_template", "a Jinja chat template FILE served instead of the core's"),
    ("--tool-parser", "tool_parser", "tool-call parser: 'auto' (the core's, or what --chat-template implies), "
                                     "'none', or a parser name (docs/api.md, Tool calls)"),
    ("--reasoning-parser", "reasoning_parser", "reasoning parser: 'auto', 'none', or a parser name"),
    ("--speculative", "speculative", "speculative decoding: 'copy' (drafts by n-gram lookup over the prompt and "
                                     "output), 'draft' (drafts by --draft-core) or 'none'"),
    ("--speculative-depth", "speculative_depth", "most drafted tokens verified per request and step, 1..7"),
    ("--tensor-parallel", "tensor_parallel", "ranks the model is sharded over, one per device (on the CPU: gloo "
                                             "processes on this host; torchrun's variables for several hosts)"),
    ("--draft-core", "draft_core", "with --speculative draft: a core DIR with the target's tokenizer (usually a "
                                   "smaller model of its family) that drafts for it"),
)
# Switches: present means true.
_SWITCHES = (
    ("--trust-request-chat-template", "trust_request_chat_template",
     "accept a 'chat_template' field in chat and /tokenize requests (rendered in the sandboxed VM)"),
)


# On/off pairs: --NAME and --no-NAME.
_TOGGLES = (
    ("--log-requests", "log_requests", "log one line per finished request (no prompt text)"),
    ("--dashboard", "dashboard", "show the terminal dashboard when stderr is a terminal (plain logs otherwise)"),
    ("--reuse-output-tokens", "reuse_output_tokens", "tokenize a prompt that carries an earlier output back with "
                                                     "the tokens it was generated with, so the prefix cache covers it"),
)


def _parser_check(name: str, kind: str) -> tuple[bool, str]:
    from ..frontend.parsers import parser_names

    known = parser_names(kind)
    return (name in ("auto", "none", *known),
            f"{kind}_parser must be auto, none or one of {', '.join(known)}, got {name!r}")


class ConfigError(Error):
    """An option that cannot be accepted (unknown key, wrong type, out of range)."""

    status = 400
    code = "invalid_config"


def _default(name: str) -> Any:
    if name in _SERVER_FIELDS:
        return _SERVER_FIELDS[name].default
    return _ENGINE_FIELDS[name].default


def add_server_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the server flags; absent flags leave lower-precedence sources in charge."""
    group = parser.add_argument_group("server")
    for flag, name, help_text in _FLAGS:
        kind = _type_of(name)
        group.add_argument(flag, dest=name, type=_argparse_type(kind), default=argparse.SUPPRESS,
                           help=f"{help_text} (default: {_default(name)!r})")
    for flag, name, help_text in _SWITCHES:
        group.add_argument(flag, dest=name, action="store_true", default=argparse.SUPPRESS, help=help_text)
    for flag, name, help_text in _TOGGLES:
        group.add_argument(flag, dest=name, action=argparse.BooleanOptionalAction, default=argparse.SUPPRESS,
                           help=f"{help_text} (default: {'on' if _default(name) else 'off'})")
    group.add_argument("--served-name", dest="served_names", action="append", default=argparse.SUPPRESS,
                       metavar="NAME", help="a model name clients may use; repeatable; the first is the "
                                            "id in /v1/models (default: the checkpoint identifier)")
    group.add_argument("--allowed-origin", dest="allowed_origins", action="append", default=argparse.SUPPRESS,
                       metavar="ORIGIN", help="a web page origin that may call the server besides the loopback "
                                              "ones, e.g. https://chat.example.com, https://*.example.com or '*' "
                                              "for any; repeatable (default: loopback origins only)")
    group.add_argument("--config", dest="config_path", default=argparse.SUPPRESS, metavar="PATH",
                       help=f"TOML file with ServerConfig fields (or {ENV_PREFIX}CONFIG)")


def _type_of(name: str) -> Any:
    return _SERVER_TYPES[name] if name in _SERVER_FIELDS else _ENGINE_TYPES[name]


def _argparse_type(kind: Any) -> Any:
    if kind is int:
        return int
    if kind is float:
        return float
    return str


def load_server_config(args: argparse.Namespace | Mapping[str, Any] | None, environ: Mapping[str, str],
                       config_path: str | Path | None = None) -> ServerConfig:
    """Merge defaults < config file < FLARE_* environment < command line into a ServerConfig."""
    given = dict(vars(args) if isinstance(args, argparse.Namespace) else (args or {}))
    path = config_path or given.pop("config_path", None) or environ.get(ENV_PREFIX + "CONFIG")
    given.pop("config_path", None)
    values: dict[str, Any] = {}
    if path:
        values.update(_from_file(Path(path)))
    values.update(_from_environ(environ))
    values.update({key: value for key, value in given.items() if key in _SERVER_FIELDS or key in _ENGINE_FIELDS})
    return _build(values)


def _from_file(path: Path) -> dict[str, Any]:
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"cannot read config file {path}: {exc}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {path} is not valid TOML: {exc}") from None
    values: dict[str, Any] = {}
    engine = data.pop("engine", {})
    if not isinstance(engine, dict):
        raise ConfigError(f"{path}: [engine] must be a table")
    for key, value in list(data.items()) + [(k, v) for k, v in engine.items()]:
        if key not in _SERVER_FIELDS and key not in _ENGINE_FIELDS:
            raise ConfigError(f"{path}: unknown setting '{key}'")
        values[key] = _coerce(key, value, f"{path}: {key}")
    return values


def _from_environ(environ: Mapping[str, str]) -> dict[str, Any]:
    values: dict[str, Any] = {}
    for name in (*_SERVER_FIELDS, *_ENGINE_FIELDS):
        raw = environ.get(ENV_PREFIX + name.upper())
        if raw is not None:
            values[name] = _coerce(name, raw, f"{ENV_PREFIX}{name.upper()}")
    return values


def _coerce(name: str, value: Any, where: str) -> Any:
    kind = _type_of(name)
    try:
        if name in ("served_names", "allowed_origins"):
            if isinstance(value, str):
                return tuple(part.strip() for part in value.split(",") if part.strip())
            if isinstance(value, (list, tuple)) and all(isinstance(v, str) for v in value):
                return tuple(value)
            raise TypeError("expected a list of strings")
        if kind is bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, str) and value.strip().lower() in _BOOL_WORDS:
                return _BOOL_WORDS[value.strip().lower()]
            raise TypeError("expected true or false")
        if kind is int:
            if isinstance(value, bool) or not isinstance(value, (int, str)):
                raise TypeError("expected an integer")
            return int(value)
        if kind is float:
            if isinstance(value, bool) or not isinstance(value, (int, float, str)):
                raise TypeError("expected a number")
            return float(value)
        if not isinstance(value, str):
            raise TypeError("expected a string")
        return value
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{where}: invalid value {value!r} ({exc})") from None


def _build(values: dict[str, Any]) -> ServerConfig:
    engine_values = {k: v for k, v in values.items() if k in _ENGINE_FIELDS}
    server_values = {k: v for k, v in values.items() if k in _SERVER_FIELDS}
    for name in ("served_names", "allowed_origins"):
        if name in server_values:
            server_values[name] = tuple(server_values[name])
    if server_values.get("api_key") == "":
        server_values["api_key"] = None
    config = ServerConfig(**server_values, engine=EngineConfig(**engine_values))
    _validate(config)
    return config


def _validate(config: ServerConfig) -> None:
    checks = (
        (0 <= config.port <= 65535, f"port must be 0..65535, got {config.port}"),
        (config.frontend_workers >= 1, f"frontend_workers must be at least 1, got {config.frontend_workers}"),
        (config.queue_capacity >= 0, f"queue_capacity must be non-negative, got {config.queue_capacity}"),
        (0 <= config.engine.max_active <= MAX_ACTIVE_LIMIT,
         f"max_active must be 0..{MAX_ACTIVE_LIMIT}, got {config.engine.max_active}"),
        (config.log_level.lower() in LOG_LEVELS, f"log_level must be one of {', '.join(LOG_LEVELS)}"),
        (config.engine.speculative in SPECULATIVE_MODES,
         f"speculative must be one of {', '.join(SPECULATIVE_MODES)}, got {config.engine.speculative!r}"),
        (1 <= config.engine.tensor_parallel <= 8,
         f"tensor_parallel must be 1..8, got {config.engine.tensor_parallel}"),
        (1 <= config.engine.speculative_depth <= 7,
         f"speculative_depth must be 1..7, got {config.engine.speculative_depth}"),
        (config.engine.speculative != "draft" or bool(config.engine.draft_core),
         "speculative 'draft' needs a draft core (--draft-core DIR)"),
        (not config.engine.draft_core or config.engine.speculative == "draft",
         f"draft_core {config.engine.draft_core!r} is used only with speculative 'draft', got "
         f"{config.engine.speculative!r}"),
        (config.max_body_bytes >= 0, "max_body_bytes must be non-negative"),
        (config.max_header_bytes >= 1024, "max_header_bytes must be at least 1024"),
        (config.max_url_bytes >= 256, "max_url_bytes must be at least 256"),
        (config.template_time_limit_s > 0, "template_time_limit_s must be positive"),
        (config.template_fuel >= 1000, "template_fuel must be at least 1000"),
        (config.template_max_bytes >= 4096, "template_max_bytes must be at least 4096"),
        (2 <= config.max_json_depth <= 512, f"max_json_depth must be 2..512, got {config.max_json_depth}"),
        (config.request_timeout_s > 0, "request_timeout_s must be positive"),
        (config.keepalive_timeout_s > 0, "keepalive_timeout_s must be positive"),
        (config.shutdown_grace_s >= 0, "shutdown_grace_s must be non-negative"),
        (config.generation_config in GENERATION_CONFIGS,
         f"generation_config must be one of {', '.join(GENERATION_CONFIGS)}, got {config.generation_config!r}"),
        *((problem is None, problem) for problem in map(check_origin_pattern, config.allowed_origins)),
        _parser_check(config.tool_parser, "tool"),
        _parser_check(config.reasoning_parser, "reasoning"),
    )
    for ok, message in checks:
        if not ok:
            raise ConfigError(message)
