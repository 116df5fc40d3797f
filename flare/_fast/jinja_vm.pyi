"""The chat-template VM (see jinja_vm.pyx). Programs come from
flare.frontend.template.compile_template; this module is not called directly."""

from typing import Any

OPCODE_COUNT: int
OPCODES: dict[str, int]          # opcode name -> number (mirrors opcodes.Op)
FILTER_NAMES: tuple[str, ...]    # filter id -> name
TEST_NAMES: tuple[str, ...]      # test id -> name
DEFAULT_FUEL: int                # instructions per render
DEFAULT_MAX_DEPTH: int           # nested macro calls per render
MAX_RANGE: int                   # jinja2 sandbox's range() limit
GLOBALS: dict[str, Any]          # range, dict, namespace, raise_exception, strftime_now, ...

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
    def __init__(self, code: tuple[int, ...], consts: tuple, slot_names: tuple[str, ...],
                 root_slots: tuple[tuple[int, str], ...], mark_kind: str | None = ...,
                 fuel: int = ..., max_depth: int = ...) -> None: ...
    def render(self, context: dict, marked: bool = False) -> str | tuple[str, tuple[int, ...]]:
        """Render with ``context``; with ``marked`` also return the executed marks."""
