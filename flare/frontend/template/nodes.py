"""AST node types produced by the parser and consumed by codegen.

Every node carries ``pos``, its offset in the normalised source, so codegen errors
name a line and column.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)
class Node:
    pos: int


# ---------------------------------------------------------------- expressions

@dataclass(slots=True)
class Const(Node):
    value: object


@dataclass(slots=True)
class Name(Node):
    name: str


@dataclass(slots=True)
class Getattr(Node):
    obj: Node
    attr: str


@dataclass(slots=True)
class Getitem(Node):
    obj: Node
    key: Node


@dataclass(slots=True)
class Slice(Node):
    obj: Node
    start: Node | None
    stop: Node | None
    step: Node | None


@dataclass(slots=True)
class Call(Node):
    func: Node
    args: list
    kwargs: list  # [(name, Node)]


@dataclass(slots=True)
class Filter(Node):
    value: Node | None  # None inside a filter block: the captured body
    name: str
    args: list
    kwargs: list


@dataclass(slots=True)
class Test(Node):
    value: Node
    name: str
    args: list
    kwargs: list


@dataclass(slots=True)
class BinOp(Node):
    op: str  # + - * / // % ** ~
    left: Node
    right: Node


@dataclass(slots=True)
class Compare(Node):
    left: Node
    ops: list  # [(op, Node)], op in == != < <= > >= in notin


@dataclass(slots=True)
class Unary(Node):
    op: str  # not, neg, pos
    operand: Node


@dataclass(slots=True)
class And(Node):
    left: Node
    right: Node


@dataclass(slots=True)
class Or(Node):
    left: Node
    right: Node


@dataclass(slots=True)
class CondExpr(Node):
    test: Node
    then: Node
    otherwise: Node | None


@dataclass(slots=True)
class ListLit(Node):
    items: list


@dataclass(slots=True)
class TupleLit(Node):
    items: list


@dataclass(slots=True)
class DictLit(Node):
    items: list  # [(key Node, value Node)]


# ---------------------------------------------------------------- statements

@dataclass(slots=True)
class Output(Node):
    nodes: list  # str for template data, Node for {{ expr }}


@dataclass(slots=True)
class If(Node):
    test: Node
    body: list
    otherwise: list


@dataclass(slots=True)
class For(Node):
    target: Node  # Name or TupleLit of Names
    iter: Node
    body: list
    otherwise: list
    cond: Node | None


@dataclass(slots=True)
class Set(Node):
    target: Node  # Name, TupleLit of Names, or Getattr(Name, attr) for namespaces
    value: Node


@dataclass(slots=True)
class SetBlock(Node):
    target: Node
    filters: list  # [Filter] applied to the captured body, innermost first
    body: list


@dataclass(slots=True)
class Macro(Node):
    name: str
    params: list  # [str]
    defaults: list  # [Node] for the trailing params
    body: list


@dataclass(slots=True)
class CallBlock(Node):
    call: Call
    params: list
    defaults: list
    body: list


@dataclass(slots=True)
class FilterBlock(Node):
    filters: list
    body: list


@dataclass(slots=True)
class With(Node):
    targets: list  # [Name]
    values: list   # [Node], evaluated in the enclosing scope
    body: list


@dataclass(slots=True)
class Loopctl(Node):
    kind: str  # break / continue


@dataclass(slots=True)
class Mark(Node):
    expr: Node | None  # None: output byte offset; else a segment count


@dataclass(slots=True)
class Template(Node):
    body: list = field(default_factory=list)
