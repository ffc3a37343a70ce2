"""The pattern language of the simplifier's rule tables.

    B("+", V("x"), K("c", 0))          # x + 0, with x and the literal bound to names
    S(V("c"), V("a"), V("a"))          # select(c, a, a): a second use must match the first
    F("max", V("a"), V("b"))           # commutative operators also match swapped

A rule is `(pattern, function)`; the function gets the bindings as attributes of one
namespace (plus `e`, the matched node, and `cx`, the simplifier) and returns the replacement,
or None to decline.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nfc.ir import Binary, Call, Cast, Const, Expr, Index, Load, Select, Unary
from nfc.ops import ROWS

#: Operators whose patterns also match with the two arguments swapped (the operator table's
#: `commutes`).
COMMUTATIVE = frozenset(r.name for r in ROWS if r.commutes is not None)
#: Operators whose arguments can be swapped without changing even a float result's bits
#: (IEEE `+` and `*` commute; `max(0.0, -0.0)` and `max(-0.0, 0.0)` may differ in sign).
EXACTLY_COMMUTATIVE = frozenset(r.name for r in ROWS if r.commutes == "bits")


def same(a: Expr, b: Expr) -> bool:
    """Structural equality that tells `1` from `1.0`, `true` from `1` and `0.0` from `-0.0`."""
    return a is b or structural_key(a) == structural_key(b)


def structural_key(e: Expr, *, commutative: bool = False) -> tuple[Any, ...]:
    """A hashable key equal for structurally identical expressions (values by identity).

    With `commutative`, the arguments of commutative operators are put in a fixed order, so
    `a + b` and `b + a` get the same key.
    """
    if isinstance(e, Const):
        v = e.value
        return ("c", type(v).__name__, repr(v) if isinstance(v, float) else v, e.dtype)
    if isinstance(e, Index):
        return ("i", e.name)
    if isinstance(e, Load):
        head: tuple[Any, ...] = ("l", id(e.tensor))
    elif isinstance(e, Unary | Binary):
        head = (type(e).__name__, e.op)
    elif isinstance(e, Call):
        head = ("f", e.fn)
    elif isinstance(e, Cast):
        head = ("cast", e.dtype)
    else:
        head = (type(e).__name__,)
    kids = [structural_key(k, commutative=commutative) for k in e.children()]
    if commutative and len(kids) == 2 and op_of(e) in EXACTLY_COMMUTATIVE:
        kids.sort(key=repr)
    return head + tuple(kids)


@dataclass(frozen=True)
class Pat:
    """A pattern: node class, operator (Binary/Unary op, Call fn; None = any), argument
    patterns, a name to bind the matched node to, and for literals a required value."""

    cls: type[Expr] | None = None
    op: str | None = None
    args: tuple[Pat, ...] = ()
    name: str | None = None
    value: Any = None


def V(name: str) -> Pat:
    """Any expression, bound to `name` (a second use of the name must match the same one)."""
    return Pat(name=name)


def K(name: str | None = None, value: Any = None) -> Pat:
    """A literal, with the given value if any (`0` matches `0`, `0.0` and `f32(0.0)`)."""
    return Pat(Const, name=name, value=value)


def B(op: str | None, a: Pat, b: Pat) -> Pat:
    """A binary operator; commutative ones also match with the arguments swapped."""
    return Pat(Binary, op, (a, b))


def U(op: str, x: Pat) -> Pat:
    """A unary operator (`neg` or `not`)."""
    return Pat(Unary, op, (x,))


def F(fn: str | None, *args: Pat) -> Pat:
    """An intrinsic call."""
    return Pat(Call, fn, args)


def S(c: Pat, a: Pat, b: Pat) -> Pat:
    """`select(c, a, b)`."""
    return Pat(Select, None, (c, a, b))


def C(x: Pat) -> Pat:
    """A cast of any dtype."""
    return Pat(Cast, None, (x,))


def op_of(e: Expr) -> str | None:
    """The operator of a Binary or Unary node, the function of a Call, else None."""
    if isinstance(e, Binary | Unary):
        return e.op
    return e.fn if isinstance(e, Call) else None


def match(p: Pat, e: Expr, env: dict[str, Expr]) -> bool:
    """Whether `e` matches `p`, extending `env` with the bindings (undone on failure)."""
    if p.cls is not None and not isinstance(e, p.cls):
        return False
    if p.op is not None and op_of(e) != p.op:
        return False
    if p.value is not None:
        assert isinstance(e, Const)
        if isinstance(e.value, bool) != isinstance(p.value, bool) or e.value != p.value:
            return False
    if p.name is not None:
        if p.name in env:
            return same(env[p.name], e)
        env[p.name] = e
    if not p.args:
        return True
    kids = e.children()
    saved = dict(env)
    if _args_match(p.args, kids, env):
        return True
    env.clear()
    env.update(saved)
    if len(kids) == 2 and op_of(e) in COMMUTATIVE and _args_match(p.args, kids[::-1], env):
        return True
    env.clear()
    env.update(saved)
    if p.name is not None:
        env.pop(p.name, None)
    return False


def _args_match(ps: tuple[Pat, ...], kids: tuple[Expr, ...], env: dict[str, Expr]) -> bool:
    return len(ps) == len(kids) and all(match(p, k, env) for p, k in zip(ps, kids, strict=True))


#: A rule: a pattern and the function computing the replacement (see the module docstring).
Rule = tuple[Pat, Callable[[Any], Expr | None]]

