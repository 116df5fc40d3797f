"""OpenAI-compatible routes: /v1/models, /v1/chat/completions, /v1/completions (and vLLM's /tokenize, /detokenize).

A generation route validates its body (schema.py), checks the model name and
hands the rest to the shared generation layer (server/generation.py) with
its format (format.py). The HTTP admission permit taken before the body was
read is released by the protocol when the response ends.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from ...generation import check_model, generate
from ...protocol import HttpConnection, HttpRequest
from ...request_body import decode_json, shorten
from ...response import Response
from .errors import error_response
from .format import ChatFormat, CompletionFormat
from .schema import parse_chat, parse_completion
from .tokenize import check_request_template, detokenize, tokenize

if TYPE_CHECKING:
    from ...app import Router, ServerState


def install(router: "Router", state: "ServerState") -> None:
    """Add the OpenAI routes to ``router``."""
    models = list_models(state)  # the card never changes while serving
    router.add("GET", "/v1/models", lambda request, conn: models, errors=error_response)
    router.add_prefix("GET", "/v1/models/", lambda request, conn: get_model(state, request.params["tail"]),
                      errors=error_response)
    router.add("POST", "/v1/chat/completions", lambda request, conn: chat_completions(state, request, conn),
               generation=True, errors=error_response, name="openai.chat")
    router.add("POST", "/v1/completions", lambda request, conn: completions(state, request, conn), generation=True,
               errors=error_response, name="openai.completions")
    # vLLM's tokenizer routes; they share the frontend workers, so they take admission permits too.
    router.add("POST", "/tokenize", lambda request, conn: tokenize(state, request, conn), generation=True,
               errors=error_response)
    router.add("POST", "/detokenize", lambda request, conn: detokenize(state, request, conn), generation=True,
               errors=error_response)


# -- discovery -----------------------------------------------------------------

def model_card(state: "ServerState") -> dict[str, Any]:
    card = state.card
    return {"id": card.id, "object": "model", "created": card.created, "owned_by": "flare", "root": card.identifier,
            "parent": None, "max_model_len": card.max_model_len, "capabilities": list(card.capabilities),
            "aliases": [name for name in (card.identifier, *card.served_names) if name and name != card.id],
            # the defaults requests get (the rest are OpenAI's), and where they come from
            "generation_config": state.config.generation_config,
            "generation_defaults": state.generation_defaults.to_json(),
            # how chat output is parsed (frontend/parsers; null: not parsed for that)
            "output_parsers": {"tool_calls": state.tool_parser, "reasoning": state.reasoning_parser},
            **card.extra}


def list_models(state: "ServerState") -> Response:
    return Response.json(200, {"object": "list", "data": [model_card(state)]})


def get_model(state: "ServerState", name: str) -> Response:
    name = unquote(name)
    if state.card.matches(name) or name == state.card.id:
        return Response.json(200, model_card(state))
    return error_response(404, f"the model '{shorten(name)}' does not exist", code="model_not_found",
                          param="model")


# -- generation ----------------------------------------------------------------

def _json_body(state: "ServerState", request: HttpRequest) -> Any:
    return decode_json(request.body, max_depth=state.config.max_json_depth)


async def chat_completions(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response | None:
    gen = parse_chat(_json_body(state, request), state.generation_defaults)
    check_model(state, gen.model)
    check_request_template(state, gen.chat_template)
    engine = state.engine
    return await generate(state, request, conn, ChatFormat(state, gen),
                          lambda: engine.prepare_chat(gen.messages, tools=gen.tools, options=gen.chat_options,
                                                      chat_template=gen.chat_template),
                          gen.sampling_params, stream=gen.stream, output=state.output_plan(gen.tools, gen.tool_choice))


async def completions(state: "ServerState", request: HttpRequest, conn: HttpConnection) -> Response | None:
    gen = parse_completion(_json_body(state, request), state.generation_defaults)
    check_model(state, gen.model)
    engine = state.engine
    # Raw text in, raw text out: completions are never parsed for reasoning or tool calls.
    return await generate(state, request, conn, CompletionFormat(state, gen), lambda: engine.prepare_text(gen.prompt),
                          gen.sampling_params, stream=gen.stream)
