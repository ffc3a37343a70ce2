"""Scalar expressions: the immutable trees that form the body of an `nf.compute`.

Expressions are frozen dataclasses with structural equality; `Load` is the one node that refers
to a tensor value.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nfc.ir.types import DType

if TYPE_CHECKING:
    from nfc.ir.values import Value

#: Binary operators and their printing precedence (higher binds tighter).
BINARY_PRECEDENCE: dict[str, int] = {
    "or": 1, "and": 2,
    "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
    "+": 5, "-": 5,
    "*": 6, "/": 6, "//": 6, "%": 6,
}
COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})
LOGICAL = frozenset({"and", "or"})


class _Intrinsics(Mapping[str, int]):
    """Intrinsic name -> number of arguments: a view of the operator table (nfc.ops), which
    holds everything else about each one, plugins' intrinsics included."""

    def _table(self) -> Mapping[str, int]:
        from nfc.ops import Intrinsics  # the table builds on this module

        return Intrinsics()

    def __getitem__(self, name: str) -> int:
        return self._table()[name]

    def __contains__(self, name: object) -> bool:
        return name in self._table()

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())


#: Intrinsic functions: name -> number of arguments (see nfc.ops for what each one does).
INTRINSICS: Mapping[str, int] = _Intrinsics()

REDUCTIONS = ("sum", "max", "min", "prod")


class Expr:
    """Base of scalar expressions. Subclasses are frozen dataclasses."""

    def children(self) -> tuple[Expr, ...]:
        """Direct sub-expressions."""
        return ()

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        """A copy with the given direct sub-expressions."""
        return self

    def walk(self) -> Iterator[Expr]:
        """This expression and every sub-expression, parents first."""
        stack: list[Expr] = [self]
        while stack:
            e = stack.pop()
            yield e
            stack.extend(reversed(e.children()))

    def map(self, fn: Callable[[Expr], Expr | None]) -> Expr:
        """Rewrite bottom-up: `fn` gets each rebuilt node and returns a replacement or None."""
        kids = self.children()
        node = self
        if kids:
            new = tuple(k.map(fn) for k in kids)
            if any(a is not b for a, b in zip(new, kids, strict=True)):
                node = self.rebuild(new)
        out = fn(node)
        return node if out is None else out

    # operator sugar for builders and tests
    def __add__(self, o: Any) -> Expr: return Binary("+", self, lift(o))
    def __radd__(self, o: Any) -> Expr: return Binary("+", lift(o), self)
    def __sub__(self, o: Any) -> Expr: return Binary("-", self, lift(o))
    def __rsub__(self, o: Any) -> Expr: return Binary("-", lift(o), self)
    def __mul__(self, o: Any) -> Expr: return Binary("*", self, lift(o))
    def __rmul__(self, o: Any) -> Expr: return Binary("*", lift(o), self)
    def __truediv__(self, o: Any) -> Expr: return Binary("/", self, lift(o))
    def __floordiv__(self, o: Any) -> Expr: return Binary("//", self, lift(o))
    def __mod__(self, o: Any) -> Expr: return Binary("%", self, lift(o))
    def __neg__(self) -> Expr: return Unary("neg", self)


def lift(x: Any) -> Expr:
    """Turn a Python number into a weakly typed constant; leave expressions alone."""
    if isinstance(x, Expr):
        return x
    if isinstance(x, bool):
        return Const(x, DType.I1)
    if isinstance(x, int | float):
        return Const(x)
    raise TypeError(f"cannot make an expression of {x!r}")


@dataclass(frozen=True)
class Const(Expr):
    """A literal. `dtype` None means weakly typed: it takes the type of its context."""

    value: int | float | bool
    dtype: DType | None = None

    @property
    def is_float(self) -> bool:
        """True for a floating-point literal."""
        return isinstance(self.value, float) and not isinstance(self.value, bool)


@dataclass(frozen=True)
class Index(Expr):
    """An index variable of the enclosing compute (an output or a reduction axis)."""

    name: str


@dataclass(frozen=True)
class Load(Expr):
    """An element of a tensor value: `%t[i, j]`. Indices are integer expressions."""

    tensor: Value
    indices: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.indices

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return Load(self.tensor, children)


@dataclass(frozen=True)
class Unary(Expr):
    """`neg` (arithmetic negation) or `not` (logical negation)."""

    op: str
    x: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return Unary(self.op, children[0])


@dataclass(frozen=True)
class Binary(Expr):
    """An infix operator from BINARY_PRECEDENCE. `//` and `%` use floor semantics."""

    op: str
    a: Expr
    b: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.a, self.b)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return Binary(self.op, children[0], children[1])


@dataclass(frozen=True)
class Call(Expr):
    """An intrinsic function from INTRINSICS."""

    fn: str
    args: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.args

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return Call(self.fn, children)


@dataclass(frozen=True)
class Select(Expr):
    """`a if cond else b`; only the chosen branch's loads need be in bounds."""

    cond: Expr
    a: Expr
    b: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.cond, self.a, self.b)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return Select(*children)


@dataclass(frozen=True)
class Cast(Expr):
    """Convert to `dtype` (printed as `f32(x)`)."""

    dtype: DType
    x: Expr

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return Cast(self.dtype, children[0])


def loads(expr: Expr) -> Iterator[Load]:
    """Every load in `expr`, outermost first."""
    return (e for e in expr.walk() if isinstance(e, Load))


def index_names(expr: Expr) -> set[str]:
    """Names of the index variables `expr` mentions."""
    return {e.name for e in expr.walk() if isinstance(e, Index)}


def substitute_indices(expr: Expr, mapping: dict[str, Expr]) -> Expr:
    """Replace index variables by expressions."""
    return expr.map(lambda e: mapping.get(e.name) if isinstance(e, Index) else None)


def substitute_values(expr: Expr, mapping: dict[Value, Value]) -> Expr:
    """Replace the tensors that loads read."""
    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor in mapping:
            return Load(mapping[e.tensor], e.indices)
        return None
    return expr.map(fn)
