"""The application behind every connection: routing, auth, admission, errors.

:class:`ServerState` holds what routes share (engine, config, admission,
frontend pool, metrics). :class:`Application` implements the protocol's
:class:`~flare.server.protocol.HttpApp`: after a request head it resolves the
route, checks the bearer token and, for generation routes, refuses when no
HTTP admission permit is left (429) or admission is paused (503), all before
the body is read; the permit itself is taken once the body is whole, and the
body's bytes count against the server's body budget (server/admission.py).
Route tables are installed per API family (server/api/*, listed in
``session.FAMILIES``), so new routes slot in without touching the protocol.
Each route carries its family's :class:`ErrorRenderer`: errors decided for a
route (auth, admission, anything its handler raises) answer in that family's
shape; errors that belong to no route (unknown path or
method, protocol-level errors) answer in OpenAI's, the default.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hmac
import logging
import time
import uuid
from typing import Any, Awaitable, Callable, Protocol

from ..config import MAX_ACTIVE_LIMIT, ServerConfig
from ..engine.base import Engine
from ..engine.telemetry import EngineStats
from ..errors import Error
from ..frontend.parsers import served
from ..request import GenerationDefaults
from .admission import BodyBudget, FrontendPool, HttpAdmission
from .api.openai.errors import error_response as openai_error_response
from .cors import OriginPolicy
from .generation import log_request
from .metrics import ServerMetrics
from .protocol import HttpConnection, HttpRequest, ProtocolLimits
from .response import Response
from .stream import EventDispatcher
from .tool_calls import AUTO, OutputPlan, ToolChoice, output_plan

log = logging.getLogger("flare.server")

Handler = Callable[[HttpRequest, HttpConnection], "Response | Awaitable[Response | None]"]


class ErrorRenderer(Protocol):
    """A route family's error shape: the response for a status, message, code and param."""

    def __call__(self, status: int, message: str, *, code: str | None = None, param: str | None = None,
                 headers: tuple[tuple[bytes, bytes], ...] = ()) -> Response: ...


# Errors that belong to no route (unknown paths and methods, protocol-level errors).
DEFAULT_ERRORS: ErrorRenderer = openai_error_response
# Error codes whose message gets the configured capacity_hint / context_hint.
CAPACITY_CODES = frozenset({"http_capacity_exhausted", "capacity_exhausted", "worker_unavailable",
                            "shutting_down"})
CONTEXT_CODES = frozenset({"context_length_exceeded"})
BODY_BYTES_PER_TOKEN = 32  # a context token's worth of request JSON (ServerConfig.max_body_bytes)


def _with_hint(message: str, hint: str) -> str:
    return f"{message} ({hint})" if hint and hint not in message else message


_HEALTH_OK = Response.json(200, {"status": "ok"})


class ServerState:
    """What every route shares; lives on the event loop thread."""

    def __init__(self, engine: Engine, config: ServerConfig):
        self.engine = engine
        self.config = config
        self.session_id = uuid.uuid4().hex
        card = engine.card
        if config.served_names:
            card = dataclasses.replace(card, served_names=tuple(config.served_names))
        if not card.max_model_len:
            card = dataclasses.replace(card, max_model_len=engine.context_len)
        self.card = card
        # What requests leave out: the model's defaults unless --generation-config none.
        self.generation_defaults = engine.generation_defaults if config.generation_config == "model" \
            else GenerationDefaults()
        if not self.generation_defaults.is_empty:
            log.info("request defaults from the model's generation config: %s (--generation-config none "
                     "for OpenAI's)", ", ".join(f"{k}={v}" for k, v in self.generation_defaults.to_json().items()))
        self.max_active = int(getattr(engine, "max_active", 0) or config.engine.max_active or MAX_ACTIVE_LIMIT)
        self.queue_capacity = config.queue_capacity or 4 * self.max_active
        self.admission = HttpAdmission(self.queue_capacity + self.max_active)
        self.frontend = FrontendPool(config.frontend_workers)
        self.origins = OriginPolicy(tuple(config.allowed_origins))
        self.metrics = ServerMetrics(self)
        body_limit = config.max_body_bytes or BODY_BYTES_PER_TOKEN * engine.context_len + (1 << 20)
        self.limits = ProtocolLimits(max_header_bytes=config.max_header_bytes, max_url_bytes=config.max_url_bytes,
                                     max_body_bytes=body_limit, request_timeout_s=config.request_timeout_s,
                                     keepalive_timeout_s=config.keepalive_timeout_s)
        # the bodies the permits could hold if taken at the head, now shared by every request's body
        self.body_budget = BodyBudget(self.admission.capacity * body_limit)
        self.listen_started: float | None = None  # monotonic
        self.is_draining = False  # shutting down: no new generation requests
        self.generations: set[Any] = set()  # ActiveGenerations, ended with an error event if the grace runs out
        # The served model's output parsers for chat routes (frontend/parsers): the core's
        # (or what a serve-time template implies) unless --tool-parser / --reasoning-parser.
        self.tool_parser = served(config.tool_parser, card.details.tool_parser)
        self.reasoning_parser = served(config.reasoning_parser, card.details.reasoning_parser)
        # parser markers that are special tokens (a forced call's grammar writes them as such)
        self.special_markers = dict(engine.special_markers)
        if self.tool_parser or self.reasoning_parser:
            log.info("output parsers: tool calls %s, reasoning %s", self.tool_parser or "none",
                     self.reasoning_parser or "none")
        self._dispatcher: EventDispatcher | None = None

    @property
    def dispatcher(self) -> EventDispatcher:
        """The event loop's EventDispatcher (created on first use, on the loop thread)."""
        if self._dispatcher is None:
            self._dispatcher = EventDispatcher(asyncio.get_running_loop())
        return self._dispatcher

    def seconds_since_listen(self) -> float:
        return 0.0 if self.listen_started is None else time.monotonic() - self.listen_started

    def output_plan(self, tools, choice: ToolChoice = AUTO, *, reasoning: bool = True) -> OutputPlan:
        """How a chat request's output is parsed (server/tool_calls.py); 400 for a tool choice
        the served parsers cannot honour."""
        return output_plan(self.tool_parser, self.reasoning_parser, tools, choice, reasoning=reasoning,
                           special_tokens=self.special_markers)

    def read_engine_stats(self) -> EngineStats:
        try:
            return self.engine.stats()
        except Exception:  # a scrape must not fail because the runtime is gone
            log.exception("engine.stats() failed")
            return EngineStats()

    def error_for(self, exc: Error, errors: ErrorRenderer = DEFAULT_ERRORS) -> Response:
        """The response for a typed error in ``errors``' shape, with the configured hints appended."""
        message = exc.message
        if exc.code in CAPACITY_CODES:
            message = _with_hint(message, self.config.capacity_hint)
        elif exc.code in CONTEXT_CODES:
            message = _with_hint(message, self.config.context_hint)
        headers = ((b"retry-after", b"1"),) if exc.status in (429, 503) else ()
        return errors(exc.status, message, code=exc.code, param=exc.param, headers=headers)


class Route:
    """A handler, what must happen before its body is read, and its family's error shape."""

    __slots__ = ("handler", "needs_auth", "is_generation", "errors", "name")

    def __init__(self, handler: Handler, needs_auth: bool, is_generation: bool,
                 errors: ErrorRenderer = DEFAULT_ERRORS, name: str | None = None):
        self.handler = handler
        self.needs_auth = needs_auth
        self.is_generation = is_generation  # takes an HTTP admission permit
        self.errors = errors
        self.name = name  # a generation route's name in request log lines ("openai.chat"), None: not logged


class Router:
    """Exact paths, plus prefixes whose remainder is a parameter (model names with slashes)."""

    def __init__(self):
        self._exact: dict[str, dict[str, Route]] = {}
        self._prefixes: list[tuple[str, dict[str, Route]]] = []

    def add(self, method: str, path: str, handler: Handler, *, auth: bool = True, generation: bool = False,
            errors: ErrorRenderer = DEFAULT_ERRORS, name: str | None = None) -> None:
        self._exact.setdefault(path, {})[method] = Route(handler, auth, generation, errors, name)

    def add_prefix(self, method: str, prefix: str, handler: Handler, *, auth: bool = True,
                   errors: ErrorRenderer = DEFAULT_ERRORS) -> None:
        route = Route(handler, auth, False, errors)
        for known, routes in self._prefixes:
            if known == prefix:
                routes[method] = route
                return
        self._prefixes.append((prefix, {method: route}))
        self._prefixes.sort(key=lambda item: -len(item[0]))

    def resolve(self, method: str, path: str) -> tuple[Route | None, str | None, tuple[str, ...]]:
        """(route, prefix remainder, methods allowed on this path)."""
        lookup = "GET" if method == "HEAD" else method
        routes = self._exact.get(path)
        tail = None
        if routes is None:
            for prefix, candidate in self._prefixes:
                if path.startswith(prefix) and len(path) > len(prefix):
                    routes, tail = candidate, path[len(prefix):]
                    break
        if routes is None:
            return None, None, ()
        return routes.get(lookup), tail, tuple(routes)


class Application:
    """Implements HttpApp over a Router and a ServerState."""

    def __init__(self, state: ServerState, router: Router):
        self.state = state
        self.router = router
        key = state.config.api_key
        self._api_key = key.encode("utf-8") if key else None

    def on_request_head(self, request: HttpRequest) -> Response | None:
        route, tail, methods = self.router.resolve(request.method, request.path)
        origin = request.origin
        if origin is not None:  # a web page's request (server/cors.py)
            origins = self.state.origins
            if not origins.allows(origin):
                errors = route.errors if route is not None else DEFAULT_ERRORS
                text = origin.decode("latin-1")
                self._log_refused(route.name if route is not None else None, 403, request.received_at,
                                  "origin_not_allowed")
                return self._count(errors(403, f"origin {text!r} is not allowed to call this server (allow it "
                                               "with --allowed-origin)", code="origin_not_allowed"))
            request.response_headers = origins.response_headers(origin)
        if route is None:
            if methods and request.method == "OPTIONS":  # a preflight, or a client asking what a path takes
                return self._count(self.state.origins.preflight(
                    origin, request.header(b"access-control-request-headers"), methods))
            if methods:
                response = DEFAULT_ERRORS(405, f"method {request.method} is not allowed on {request.path}",
                                          code="method_not_allowed",
                                          headers=((b"allow", ", ".join(methods).encode()),))
            else:
                response = DEFAULT_ERRORS(404, f"no route for {request.method} {request.path}", code="not_found")
            return self._count(response)
        request.route = route
        request.params = {"tail": tail} if tail is not None else None
        if route.needs_auth and self._api_key is not None and not self._is_authorized(request):
            self._log_refused(route.name, 401, request.received_at, "invalid_api_key")
            return self._count(route.errors(401, "missing or invalid bearer token (Authorization: Bearer KEY, "
                                                 "or x-api-key: KEY)",
                                            code="invalid_api_key", headers=((b"www-authenticate", b"Bearer"),)))
        if route.is_generation:
            state = self.state
            if state.is_draining or state.admission.is_paused:
                reason = "the server is shutting down" if state.is_draining else "admission is paused"
                state.admission.num_refused_paused += 1
                self._log_refused(route.name, 503, request.received_at, "admission_paused")
                return self._count(route.errors(503, f"{reason}; not accepting generation requests",
                                                code="admission_paused", headers=((b"retry-after", b"1"),)))
            if state.admission.refuses():  # before any of the body is read
                return self._capacity_exhausted(request)
        # The permit is taken once the body is whole (handle): a slow body holds bytes, not a permit.
        request.budget = self.state.body_budget.share()
        return None

    def _capacity_exhausted(self, request: HttpRequest) -> Response:
        route, admission = request.route, self.state.admission
        self._log_refused(route.name, 429, request.received_at, "http_capacity_exhausted")
        return self._count(self.state.error_for(Error(
            f"HTTP admission capacity exhausted: {admission.num_in_use} of {admission.capacity} requests "
            f"in progress (queue_capacity + max_active)", status=429, code="http_capacity_exhausted"),
            route.errors))

    def _is_authorized(self, request: HttpRequest) -> bool:
        # RFC 9110 section 11.4: credentials = auth-scheme 1*SP token68, the scheme
        # case-insensitive; or Anthropic's ``x-api-key: KEY``, on every route. Either
        # one that matches authorizes; two fields of one kind are ambiguous: refused.
        fields = [value for name, value in request.headers if name == b"authorization"]
        keys = [value for name, value in request.headers if name == b"x-api-key"]
        is_bearer = False
        if len(fields) == 1:
            scheme, _, token = fields[0].partition(b" ")
            is_bearer = scheme.lower() == b"bearer" and hmac.compare_digest(token.lstrip(b" "), self._api_key)
        return is_bearer or (len(keys) == 1 and hmac.compare_digest(keys[0], self._api_key))

    def handle(self, request: HttpRequest, conn: HttpConnection) -> "Response | Awaitable[Response | None]":
        route = request.route
        if route.is_generation and request.permit is None:
            request.permit = self.state.admission.try_acquire()
            if request.permit is None:  # taken while this body arrived
                return self._capacity_exhausted(request)
        try:
            result = route.handler(request, conn)
        except Error as exc:
            self._log_refused(route.name, exc.status, request.received_at, exc.code)
            return self._count(self.state.error_for(exc, route.errors))
        if type(result) is Response:
            return self._count(result)
        return self._finish_async(request, result)

    async def _finish_async(self, request: HttpRequest, pending: Awaitable[Response | None]) -> Response | None:
        try:
            response = await pending
        except Error as exc:  # raised before generate(), which answers (and logs) its own errors
            self._log_refused(request.route.name, exc.status, request.received_at, exc.code)
            response = self.state.error_for(exc, request.route.errors)
        if response is not None:
            self._count(response)
        return response

    def install_core_routes(self) -> None:
        """/health and /metrics: open even when api_key is set."""
        self.router.add("GET", "/health", self._health, auth=False)
        self.router.add("GET", "/metrics", self._metrics, auth=False)

    def _health(self, request: HttpRequest, conn: HttpConnection) -> Response:
        state = self.state
        if state.is_draining:
            return Response.json(503, {"status": "draining"})
        return _HEALTH_OK

    def _metrics(self, request: HttpRequest, conn: HttpConnection) -> Response:
        return Response(200, self.state.metrics.render(), b"text/plain; version=0.0.4; charset=utf-8")

    def error_response(self, status: int, message: str, target: tuple[str, str] | None = None) -> Response:
        """Protocol-level errors (HttpApp): in the shape of the family whose route the request
        named (a 413 on /v1/messages is Anthropic's), else the default shape."""
        errors = DEFAULT_ERRORS
        if target is not None:
            route, _, _ = self.router.resolve(*target)
            if route is not None:
                errors = route.errors
                self._log_refused(route.name, status, None, f"http_{status}")
        return self._count(errors(status, message, code=f"http_{status}"))

    def _log_refused(self, name: str | None, status: int, start: float | None, code: str) -> None:
        """The log line of a generation request (route ``name``) answered before generate()
        (server/generation.py); ``start`` is its arrival, None when the request never completed."""
        if name is not None and self.state.config.log_requests:
            log_request(name, status, start, error=code)

    def _count(self, response: Response) -> Response:
        self.state.metrics.count_response(response.status)
        return response
