"""Ollama-compatible routes: /api/tags, /api/show, /api/ps, /api/version, /api/chat, /api/generate.

A generation route validates its body (schema.py), resolves the model name
(with or without its ``:tag``), refuses what the served model cannot do
(tools its template never shows, thinking without a reasoning parser, a
request template the server does not trust) and hands the rest to the
shared generation layer (server/generation.py) with its format (format.py):
the same admission, limits, prefix cache, disconnect cancellation and
metrics as every family.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ....errors import AdmissionError
from ...generation import generate
from ...protocol import HttpConnection, HttpRequest
from ...request_body import decode_json
from ...response import Response
from ..openai.schema import _check_fields, _invalid
from ..openai.tokenize import check_request_template
from . import models
from .errors import error_response
from .format import ChatFormat, GenerateFormat
from .schema import OllamaRequest, parse_chat, parse_generate

if TYPE_CHECKING:
    from ...app import Router, ServerState

SHOW_FIELDS = frozenset({"model", "name", "verbose"})


def install(router: "Router", state: "ServerState") -> None:
    """Add the Ollama routes to ``router``."""
    # The card never changes while serving.
    tags = Response.json(200, models.tags(state))
    processes = Response.json(200, models.processes(state))
    version = Response.json(200, models.version())
    router.add("GET", "/api/tags", lambda request, conn: tags, errors=error_response)
    router.add("GET", "/api/ps", lambda request, conn: processes, errors=error_response)
    router.add("GET", "/api/version", lambda request, conn: version, errors=error_response)
    router.add("POST", "/api/show", lambda request, conn: show(state, request), errors=error_response)
    router.add("POST", "/api/chat", lambda request, conn: chat(state, request, conn), generation=True,
               errors=error_response, name="ollama.chat")
    router.add("POST", "/api/generate", lambda request, conn: generate_route(state, request, conn),
               generation=True, errors=error_response, name="ollama.generate")


def _json_body(state: "ServerState", request: HttpRequest) -> Any:
    return decode_json(request.body, max_depth=state.config.max_json_depth)


def _check_model(state: "ServerState", name: str) -> None:
    if not models.is_served(state.card, name):
        raise AdmissionError(models.not_found(name), status=404, code="model_not_found", param="model")


def show(state: "ServerState", request: HttpRequest) -> Response:
    body = _json_body(state, request)
    if not isinstance(body, dict):
        raise _invalid("request body must be a JSON object", None)
    _check_fields(body, SHOW_FIELDS)
    name = body.get("model") or body.get("name")  # "name" is the older spelling
    if not isinstance(name, str) or not name:
        raise _invalid("model is required", "model")
    _check_model(state, name)
    return Response.json(200, models.show(state))


def _check_request(state: "ServerState", gen: OllamaRequest) -> None:
    """The model name, then what this model cannot do (Ollama's refusals, in its words)."""
    _check_model(state, gen.model)
    check_request_template(state, gen.chat_template)
    if gen.tools and gen.chat_template is None and not state.card.details.renders_tools:
        raise AdmissionError(f"{gen.model} does not support tools: its chat template never shows them to the "
                             f"model", status=400, code="unsupported_parameter", param="tools")
    if gen.think and not models.supports_thinking(state):
        raise AdmissionError(f"{gen.model} does not support thinking: no reasoning parser is served for it",
                             status=400, code="unsupported_parameter", param="think")


async def chat(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response | None:
    gen = parse_chat(_json_body(state, request), state.generation_defaults, state.engine.context_len)
    _check_request(state, gen)
    fmt = ChatFormat(state, request, gen)
    if gen.is_load:
        return Response.json(200, fmt.loaded())
    engine = state.engine
    return await generate(state, request, conn, fmt,
                          lambda: engine.prepare_chat(gen.messages, tools=gen.tools, options=gen.chat_options,
                                                      chat_template=gen.chat_template),
                          gen.sampling_params, stream=gen.stream, output=state.output_plan(gen.tools, gen.tool_choice))


async def generate_route(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response | None:
    gen = parse_generate(_json_body(state, request), state.generation_defaults, state.engine.context_len)
    _check_request(state, gen)
    fmt = GenerateFormat(state, request, gen)
    if gen.is_load:
        return Response.json(200, fmt.loaded())
    engine = state.engine
    if gen.is_raw:  # raw text in, raw text out, as /v1/completions
        return await generate(state, request, conn, fmt, lambda: engine.prepare_text(gen.prompt),
                              gen.sampling_params, stream=gen.stream)
    # Only a request that asked for thinking has its output parsed (Ollama's generate has no tool calls).
    return await generate(state, request, conn, fmt,
                          lambda: engine.prepare_chat(gen.messages, tools=None, options=gen.chat_options,
                                                      chat_template=gen.chat_template),
                          gen.sampling_params, stream=gen.stream, output=state.output_plan(None, reasoning=gen.think))
