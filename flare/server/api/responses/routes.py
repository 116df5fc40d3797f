"""OpenAI Responses routes: POST /v1/responses, GET and DELETE /v1/responses/{id}.

``POST`` validates its body (schema.py), checks the model, looks up the
response it continues (404 when unknown), and hands the rest to the shared
generation layer (server/generation.py) with its format (format.py), which
stores the finished response (store.py). Errors answer in OpenAI's shape. The
store is the server's own (one per installed family), read on the loop thread,
and its size is exported on /metrics.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable
from urllib.parse import parse_qsl, unquote

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ....errors import AdmissionError
from ...generation import check_model, generate
from ...protocol import HttpConnection, HttpRequest
from ...request_body import decode_json, shorten
from ...response import Response
from ..openai.errors import error_response
from .format import ResponsesFormat
from .schema import parse_responses
from .store import ResponseStore

if TYPE_CHECKING:
    from ...app import Router, ServerState

PREFIX = "/v1/responses/"


def install(router: "Router", state: "ServerState") -> None:
    """Add the Responses routes to ``router``, with a store of their own."""
    store = ResponseStore()
    state.metrics.registry.register(StoreCollector(store))
    router.add("POST", "/v1/responses", lambda request, conn: create(state, store, request, conn), generation=True,
               errors=error_response, name="responses")
    router.add_prefix("GET", PREFIX, lambda request, conn: retrieve(store, request), errors=error_response)
    router.add_prefix("DELETE", PREFIX, lambda request, conn: delete(store, request), errors=error_response)


async def create(state: "ServerState", store: ResponseStore, request: HttpRequest,
                 conn: HttpConnection) -> Response | None:
    gen = parse_responses(decode_json(request.body, max_depth=state.config.max_json_depth), state.generation_defaults)
    check_model(state, gen.model)
    earlier: tuple[dict[str, Any], ...] = ()
    if gen.previous_response_id is not None:
        previous = store.get(gen.previous_response_id)
        if previous is None:
            raise _not_found(gen.previous_response_id, param="previous_response_id")
        earlier = previous.conversation
    messages = gen.prompt_messages(earlier)
    engine = state.engine
    return await generate(state, request, conn, ResponsesFormat(state, gen, store, earlier),
                          lambda: engine.prepare_chat(messages, tools=gen.tools, options=gen.options,
                                                      chat_template=None),
                          gen.sampling_params, stream=gen.stream, output=state.output_plan(gen.tools, gen.tool_choice))


def retrieve(store: ResponseStore, request: HttpRequest) -> Response:
    query = dict(parse_qsl(request.query.decode("latin-1")))
    if query.get("stream", "false") != "false" or set(query) - {"stream"}:
        raise AdmissionError("retrieving takes no query parameters here (a stored response is not streamed "
                             "again)", status=400, code="unsupported_parameter", param=next(iter(query), None))
    response_id = _response_id(request)
    entry = store.get(response_id)
    if entry is None:
        raise _not_found(response_id)
    return Response.json(200, entry.response)


def delete(store: ResponseStore, request: HttpRequest) -> Response:
    response_id = _response_id(request)
    if not store.delete(response_id):
        raise _not_found(response_id)
    return Response.json(200, {"id": response_id, "object": "response", "deleted": True})


def _response_id(request: HttpRequest) -> str:
    tail = request.params["tail"]
    if "/" in tail:  # /v1/responses/{id}/input_items, /cancel: not served
        raise AdmissionError(f"no route for {request.method} {shorten(request.path)}", status=404, code="not_found")
    return unquote(tail)


def _not_found(response_id: str, *, param: str | None = None) -> AdmissionError:
    return AdmissionError(f"no stored response '{shorten(response_id)}' (never stored, deleted, or evicted)",
                          status=404, code="not_found", param=param)


class StoreCollector:
    """flare_responses_stored{,_chars} and flare_responses_evicted_total, read at scrape time."""

    def __init__(self, store: ResponseStore):
        self.store = store

    def collect(self) -> Iterable[Metric]:
        store = self.store
        yield GaugeMetricFamily("flare_responses_stored", "Responses kept for previous_response_id and retrieval.",
                                value=len(store))
        yield GaugeMetricFamily("flare_responses_stored_chars", "Characters of JSON the stored responses hold.",
                                value=store.num_chars)
        yield CounterMetricFamily("flare_responses_evicted", "Stored responses evicted for room (LRU).",
                                  value=store.num_evicted)
