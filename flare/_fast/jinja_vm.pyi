"""The chat-template VM (see jinja_vm.pyx). Programs come from
flare.frontend.template.compile_template; this module is not called directly."""

from typing import Any

from flare.errors import FrontendError

OPCODE_COUNT: int
OPCODES: dict[str, int]          # opcode name -> number (mirrors opcodes.Op)
FILTER_NAMES: tuple[str, ...]    # filter id -> name
TEST_NAMES: tuple[str, ...]      # test id -> name
DEFAULT_FUEL: int                # instructions per render
DEFAULT_MAX_DEPTH: int           # nested macro calls per render
DEFAULT_MAX_INT_BITS: int        # bits of an int `*` / `**` may build
DEFAULT_MAX_STRING_BYTES: int    # bytes of one str an operation may build
DEFAULT_MAX_COLLECTION_BYTES: int  # estimated bytes of one list/tuple/dict
DEFAULT_MAX_OUTPUT_BYTES: int    # bytes of output per render
DEFAULT_TIME_LIMIT_S: float      # seconds for all renders of one request
MAX_RANGE: int                   # jinja2 sandbox's range() limit
GLOBALS: dict[str, Any]          # range, dict, namespace, raise_exception, strftime_now, ...

class TemplateLimitError(FrontendError):
    """A render exceeded one of its template's limits (size, fuel, time)."""

class TemplateBudgetError(TemplateLimitError):
    """A render ran out of fuel or of its request's time budget: the request fails."""

class RenderBudget:
    """A wall-clock deadline shared by every render done for one request."""
    seconds: float
    deadline: float   # time.monotonic() seconds
    def __init__(self, seconds: float = ...) -> None: ...
    def remaining(self) -> float: ...

class Undefined:
    """A missing value with jinja2's default-Undefined semantics."""
    hint: str | None
    obj: Any
    name: Any
    def message(self) -> str: ...

class Markup(str):
    """Text marked safe; `+` HTML-escapes a plain-str operand (markupsafe semantics)."""

class TemplateNamespace: ...
class LoopContext: ...
class Macro:
    name: str
    def __call__(self, *args: Any, **kwargs: Any) -> str: ...

class Program:
    """One compiled template: immutable bytecode and constants, shared by renders."""
    consts: tuple
    slot_names: tuple[str, ...]
    root_slots: tuple[tuple[int, str], ...]
    mark_kind: str | None
    fuel: int
    max_depth: int
    max_int_bits: int
    max_string_bytes: int
    max_collection_bytes: int
    max_output_bytes: int
    time_limit_s: float
    def __init__(self, code: tuple[int, ...], consts: tuple, slot_names: tuple[str, ...],
                 root_slots: tuple[tuple[int, str], ...], mark_kind: str | None = ...,
                 fuel: int = ..., max_depth: int = ..., max_int_bits: int = ...,
                 max_string_bytes: int = ..., max_collection_bytes: int = ...,
                 max_output_bytes: int = ..., time_limit_s: float = ...) -> None: ...
    def render(self, context: dict, marked: bool = False,
               budget: RenderBudget | None = None) -> str | tuple[str, tuple[int, ...]]:
        """Render with ``context``; with ``marked`` also return the executed marks.
        ``budget``: the request's shared deadline (default: ``time_limit_s`` of its own)."""
