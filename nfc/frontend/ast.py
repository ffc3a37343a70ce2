"""The abstract syntax tree of .nf files. Every node is a frozen dataclass with a `loc`.

`loc` spans the node when it fits on one line (`end_col` set), else it marks its start.
Expression nodes carry `depth` (1 for a leaf) so that limits can be checked without recursion;
continuing an operator chain (`a + b + c`) does not add depth, and walkers go through chains
with `chain` rather than recursion.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nfc.ir import Loc

# ---------------------------------------------------------------------------------------------
# expressions


@dataclass(frozen=True)
class Node:
    """Base of all nodes."""

    loc: Loc


@dataclass(frozen=True)
class Expr(Node):
    """Base of expressions."""

    def children(self) -> tuple[Expr, ...]:
        """Direct sub-expressions."""
        return ()


@dataclass(frozen=True)
class Num(Expr):
    """An integer or float literal."""

    value: int | float
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class Bool(Expr):
    """`true` or `false`."""

    value: bool
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class Name(Expr):
    """A bare name: an index, a tensor, a compile-time value."""

    id: str
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class EllipsisExpr(Expr):
    """`...`: the leading dimensions of a rank-polymorphic op (first in a type `T[..., D]`),
    or their indices (first in an index list `y[..., d]` or a subscript `x[..., d]`)."""

    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class Subscript(Expr):
    """`x[i, j + 1]`: an element of the tensor named `name`."""

    name: str
    name_loc: Loc
    indices: tuple[Expr, ...]
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return self.indices


@dataclass(frozen=True)
class TArg(Node):
    """A compile-time argument of a call: `stride = 2`, or a bare list `[2, 3]` (name None)."""

    name: str | None
    value: Expr


@dataclass(frozen=True)
class ListExpr(Expr):
    """`[a, b, c]`, a list of compile-time ints (shapes, permutations)."""

    items: tuple[Expr, ...]
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return self.items


@dataclass(frozen=True)
class RangeArg(Expr):
    """`k in lo..hi` as an argument of a reduction head."""

    name: str
    lo: Expr
    hi: Expr
    depth: int = field(default=1, compare=False)


@dataclass(frozen=True)
class Call(Expr):
    """`f(a, b)` or `f<p = 1>(a)`: an op, an intrinsic, a cast or a builtin."""

    fn: str
    fn_loc: Loc
    targs: tuple[TArg, ...]
    args: tuple[Expr, ...]
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return self.args


@dataclass(frozen=True)
class RedIndex(Node):
    """One index of a reduction head, with an optional explicit range `lo..hi`."""

    name: str
    lo: Expr | None = None
    hi: Expr | None = None


@dataclass(frozen=True)
class Reduce(Expr):
    """`sum(k, j) body` (also max, min, prod)."""

    op: str
    indices: tuple[RedIndex, ...]
    body: Expr
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.body,)


@dataclass(frozen=True)
class BinOp(Expr):
    """An arithmetic operator: + - * / // %."""

    op: str
    a: Expr
    b: Expr
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        """The operands of the whole chain this node ends (see `chain`)."""
        first, links = chain(self)
        return (first, *(link.b for link in links))


@dataclass(frozen=True)
class BoolOp(Expr):
    """`a and b`, `a or b`."""

    op: str
    a: Expr
    b: Expr
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        """The operands of the whole chain this node ends (see `chain`)."""
        first, links = chain(self)
        return (first, *(link.b for link in links))


#: Operators of one precedence level: a left-associative chain of them (`a + b - c`) is one
#: level of nesting however long it is.
CHAIN_LEVEL = {"+": 1, "-": 1, "*": 2, "/": 2, "//": 2, "%": 2, "and": 3, "or": 4}


def same_level(a: str, b: str) -> bool:
    """Whether `a` and `b` are operators of one precedence level (`+` and `-`)."""
    return CHAIN_LEVEL.get(a, -1) == CHAIN_LEVEL.get(b, -2)


def chain(e: BinOp | BoolOp) -> tuple[Expr, tuple[BinOp | BoolOp, ...]]:
    """`a + b - c` as its first operand `a` and its links `a + b`, `(a + b) - c`, in order of
    evaluation. Walkers go through chains with this loop instead of recursing on `a`, so that a
    chain of any length costs no stack."""
    links: list[BinOp | BoolOp] = []
    x: Expr = e
    while isinstance(x, type(e)) and same_level(x.op, e.op):
        links.append(x)
        x = x.a
    links.reverse()
    return x, tuple(links)


@dataclass(frozen=True)
class Compare(Expr):
    """A comparison chain `a < b <= c` (Python semantics: `a < b and b <= c`)."""

    ops: tuple[str, ...]
    operands: tuple[Expr, ...]
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return self.operands


@dataclass(frozen=True)
class Unary(Expr):
    """`-x` (op "neg") or `not x` (op "not")."""

    op: str
    x: Expr
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)


@dataclass(frozen=True)
class IfExp(Expr):
    """`a if cond else b`."""

    cond: Expr
    a: Expr
    b: Expr
    depth: int = field(default=1, compare=False)

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.a, self.b)


# ---------------------------------------------------------------------------------------------
# types and statements


@dataclass(frozen=True)
class TypeExpr(Node):
    """`f32[N, K]`: a dtype name (or dtype variable) and dimension expressions."""

    dtype: str
    dtype_loc: Loc
    dims: tuple[Expr, ...]


@dataclass(frozen=True)
class Stmt(Node):
    """Base of statements."""


@dataclass(frozen=True)
class Target(Node):
    """A name being assigned."""

    name: str


@dataclass(frozen=True)
class Assign(Stmt):
    """`a = expr` or `a, b = expr`."""

    targets: tuple[Target, ...]
    value: Expr


@dataclass(frozen=True)
class LhsIndex(Node):
    """An output index of a comprehension, optionally with an explicit range; the name
    `...` stands for the leading indices of a rank-polymorphic op."""

    name: str
    lo: Expr | None = None
    hi: Expr | None = None


@dataclass(frozen=True)
class Comprehension(Stmt):
    """`name[i, j] = expr`."""

    target: Target
    indices: tuple[LhsIndex, ...]
    value: Expr


@dataclass(frozen=True)
class Decl(Stmt):
    """`input x: f32[...]`, `param w: ... = init`, `state s: ... = init`, `random u: ...`."""

    kind: str
    kind_loc: Loc
    target: Target
    type: TypeExpr
    init: Expr | None
    flags: tuple[tuple[str, Loc], ...] = ()
    """`frozen` (a param the optimizer leaves alone), `grad` (an input whose gradient
    `@train_step` returns), with their locations."""


@dataclass(frozen=True)
class Update(Stmt):
    """`update s = expr`: the next value of state `s`."""

    target: Target
    value: Expr


@dataclass(frozen=True)
class Output(Stmt):
    """`output a, b`: extra results of the model."""

    names: tuple[Target, ...]


@dataclass(frozen=True)
class KwArg(Node):
    """`name = value` in an optimizer call."""

    name: str
    value: Expr


@dataclass(frozen=True)
class Minimize(Stmt):
    """`minimize loss with sgd(lr = 0.1)`."""

    target: Target
    optimizer: str
    optimizer_loc: Loc
    kwargs: tuple[KwArg, ...]


@dataclass(frozen=True)
class If(Stmt):
    """A compile-time `if cond { ... } else { ... }`."""

    cond: Expr
    then: tuple[Stmt, ...]
    orelse: tuple[Stmt, ...]


@dataclass(frozen=True)
class For(Stmt):
    """`for i in lo..hi { ... }`, unrolled at compile time."""

    var: str
    lo: Expr
    hi: Expr
    body: tuple[Stmt, ...]


# ---------------------------------------------------------------------------------------------
# top level


@dataclass(frozen=True)
class Import(Node):
    """`import a.b.c`."""

    path: tuple[str, ...]


@dataclass(frozen=True)
class CParam(Node):
    """A compile-time parameter `<p: int = 1>`; kind is int, float, bool or ints."""

    name: str
    kind: str
    default: Expr | None


@dataclass(frozen=True)
class Param(Node):
    """A tensor parameter or a named output `x: T[N, K]`."""

    name: str
    type: TypeExpr


@dataclass(frozen=True)
class OpDef(Node):
    """`op name<cparams>(params) -> outputs { body }`.

    `outputs` holds one unnamed Param (name "") for a single-output op.
    """

    name: str
    cparams: tuple[CParam, ...]
    params: tuple[Param, ...]
    outputs: tuple[Param, ...]
    body: tuple[Stmt, ...]

    @property
    def single_output(self) -> bool:
        """True for `-> T[...]` (the output is the last statement's target)."""
        return len(self.outputs) == 1 and self.outputs[0].name == ""


@dataclass(frozen=True)
class ModelParam(Node):
    """A model parameter with its default value `batch = 64`."""

    name: str
    default: Expr


@dataclass(frozen=True)
class ModelDef(Node):
    """`model name(params) { body }`."""

    name: str
    params: tuple[ModelParam, ...]
    body: tuple[Stmt, ...]


@dataclass(frozen=True)
class Program(Node):
    """A parsed file."""

    file: str
    imports: tuple[Import, ...]
    ops: tuple[OpDef, ...]
    models: tuple[ModelDef, ...]
