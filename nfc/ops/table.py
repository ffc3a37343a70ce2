"""The rows of the operator table: every operator and intrinsic of the IR.

Adding an intrinsic is adding a row to `ROWS` (and, for a backend that should emit it natively
rather than through `expand`, an entry in that backend's renderer; docs/operators.md).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nfc.ir import Binary, Call, Cast, Const, DType, Expr, Select, Unary
from nfc.ops import numerics as N
from nfc.ops.lattice import (
    ANY,
    BOOL,
    CAST,
    FLOAT,
    FLOAT_OR_WEAK,
    INT,
    NUM,
    REAL,
    SELECT,
    WEAK_FLOAT,
    Kind,
    is_float,
)
from nfc.ops.numerics import np


class Grad(Protocol):
    """What a derivative rule gets from autodiff (nfc.passes.autodiff.exprgrad).

    `None` stands for an exact zero everywhere: `d(i)` is None when operand `i` does not
    depend on the variable, and the builders treat None as zero (so no `x * 0.0`, which is
    NaN for an infinite x, is ever written).
    """

    e: Expr
    """The node being differentiated."""
    args: tuple[Expr, ...]
    """Its operands (`e.children()`)."""

    def d(self, i: int) -> Expr | None:
        """The derivative of operand `i`."""

    def add(self, a: Expr | None, b: Expr | None) -> Expr | None:
        """`a + b`."""

    def sub(self, a: Expr | None, b: Expr | None) -> Expr | None:
        """`a - b`."""

    def mul(self, a: Expr | None, b: Expr | None) -> Expr | None:
        """`a * b`."""

    def div(self, a: Expr | None, b: Expr) -> Expr | None:
        """`a / b`."""

    def neg(self, a: Expr | None) -> Expr | None:
        """`-a`."""

    def select(self, c: Expr, a: Expr | None, b: Expr | None) -> Expr | None:
        """`select(c, a, b)`."""

    def problem(self, message: str) -> None:
        """Report that the node has no usable gradient."""


@dataclass(frozen=True, eq=False)
class Op:
    """One row: an operator or intrinsic and everything the compiler knows about it."""

    name: str
    """The IR spelling: `+`, `neg`, `exp`, `select`, `cast`."""
    node: type[Expr]
    """The IR node it appears as: Binary, Unary, Call (intrinsics), Select or Cast."""
    arity: int
    operands: str
    """The operand class (nfc.ops.lattice): what the operands may be, what the result is."""
    result: Kind | None = None
    """The result's kind, None for the operands' kind."""
    numpy: Callable[..., Any] | None = None
    """The semantics on numpy arrays already converted to the operand kind's dtype (the
    interpreter; constant folding in the literals' dtype)."""
    scalar: Callable[..., Any] | None = None
    """The value for compile-time constants of the surface language (Python numbers; an
    exception means undefined). None: the numpy function in float64."""
    fold: bool = True
    """Whether literal operands are folded (`philox` draws stay visible)."""
    defined: Callable[..., Any] | None = None
    """`(operand kind, *operand values) -> bool or bool array`: where the operator has a value
    (None: everywhere). Folding leaves the rest alone, the interpreter reports it."""
    undefined: str = ""
    """What the interpreter says where `defined` is false ("integer division by zero")."""
    grad: Callable[[Grad], Expr | None] | None = None
    """The derivative of the node (see Grad); None: it has none (a use on a gradient path is
    reported)."""
    flops: float = 0.0
    """FLOPs per evaluation on float operands (integer index arithmetic is free)."""
    commutes: str | None = None
    """`"bits"`: swapping the operands changes no bit of the result; `"value"`: only equal
    values (`max(0.0, -0.0)`); None: not commutative."""
    lower: Mapping[str, Any] = field(default_factory=dict)
    """Backend name -> emission hook (a function, or "module:attribute" imported on first
    use). Built-in rows are emitted by each backend's own renderer table, by name."""
    expand: Callable[..., Expr] | None = None
    """The operator written with other operators (operand expressions -> expression), for a
    backend that has no hook for it."""
    surface: bool = True
    """Whether `.nf` source may call it (intrinsics only)."""
    doc: str = ""
    """One line for docs and listings."""

    def fold_on(self, k: Kind, *args: Const) -> bool:
        """Whether folding may evaluate this operator on literals of operand kind `k`."""
        return self.fold and (self.defined is None or bool(
            np.all(self.defined(k, *(a.value for a in args)))))

    def scalar_fn(self) -> Callable[..., Any]:
        """`scalar`, or the numpy function on float64 values (a non-finite result of finite
        operands raises ValueError: undefined there, as for Python's math)."""
        if self.scalar is not None:
            return self.scalar
        fn = self.numpy
        assert fn is not None, f"row '{self.name}' has no numpy semantics"

        def scalar(*xs: Any) -> Any:
            with np.errstate(all="ignore"):
                r = np.asarray(fn(*(np.asarray(float(x)) for x in xs))).item()
            if isinstance(r, float) and not math.isfinite(r) and all(
                    math.isfinite(float(x)) for x in xs):
                raise ValueError(f"{self.name} is undefined for {xs}")
            return r
        return scalar


# ---------------------------------------------------------------------------------------------
# derivative rules


def zero(g: Grad) -> None:
    """The derivative of a piecewise constant or boolean operator: zero."""
    return None


def _piecewise(g: Grad) -> None:
    g.d(0)
    g.d(1)
    g.problem(f"'{g.e.op}' of floating-point values has no useful gradient (it is piecewise "  # type: ignore[attr-defined]
              "constant in its operands)")
    return None


def _grad_mul(g: Grad) -> Expr | None:
    (a, b), da, db = g.args, g.d(0), g.d(1)
    return g.add(g.mul(da, b), g.mul(a, db))


def _grad_div(g: Grad) -> Expr | None:
    (a, b), da, db = g.args, g.d(0), g.d(1)
    t = g.div(da, b)
    if db is not None:
        t = g.sub(t, g.div(g.mul(db, Binary("/", a, b)), b))
    return t


def _grad_mod(g: Grad) -> Expr | None:
    da, db = g.d(0), g.d(1)
    return da if db is None else _piecewise(g)


def _grad_cast(g: Grad) -> Expr | None:
    dx = g.d(0)
    dtype = g.e.dtype  # type: ignore[attr-defined]
    return Cast(dtype, dx) if dtype.is_float and dx is not None else None


def _grad_extremum(cmp: str) -> Callable[[Grad], Expr | None]:
    # ties go to the second operand: max(x, 0.0) (relu) has gradient 0 at 0, as in PyTorch
    def rule(g: Grad) -> Expr | None:
        a, b = g.args
        return g.select(Binary(cmp, a, b), g.d(0), g.d(1))
    return rule


def _grad_pow(g: Grad) -> Expr | None:
    (a, b), e = g.args, g.e
    da, db = g.d(0), g.d(1)
    out = None
    if da is not None:
        if isinstance(b, Const) and not isinstance(b.value, bool):
            k = float(b.value)
            if k == 2.0:
                f: Expr = Binary("*", Const(2.0), a)
            elif k == 1.0:
                f = Const(1.0)
            else:
                f = Binary("*", Const(k), Call("pow", (a, Const(k - 1.0))))
        else:
            f = Binary("*", b, Call("pow", (a, Binary("-", b, Const(1.0)))))
        out = g.mul(da, f)
    if db is not None:
        out = g.add(out, g.mul(db, Binary("*", e, Call("log", (a,)))))
    return out


def _grad_abs(g: Grad) -> Expr | None:
    du = g.d(0)
    if du is None:
        return None
    u = g.args[0]  # gradient 0 at 0
    return Select(Binary(">", u, Const(0.0)), du,
                  Select(Binary("<", u, Const(0.0)), Unary("neg", du), Const(0.0)))


def chain(rule: Callable[[Expr, Expr], Expr]) -> Callable[[Grad], Expr | None]:
    """The derivative of a one-operand function f(u) with f' = `rule(e, u)` (`e` the node,
    which a rule may reuse: d exp(u) = exp(u) du)."""
    def grad(g: Grad) -> Expr | None:
        du = g.d(0)
        return None if du is None else g.mul(du, rule(g.e, g.args[0]))
    return grad


def _grad_atan2(g: Grad) -> Expr | None:
    (y, x), dy, dx = g.args, g.d(0), g.d(1)
    r2 = Binary("+", Binary("*", x, x), Binary("*", y, y))
    return g.add(g.mul(dy, Binary("/", x, r2)), g.mul(dx, Binary("/", Unary("neg", y), r2)))


_TWO_OVER_SQRT_PI = 2.0 / math.sqrt(math.pi)

# ---------------------------------------------------------------------------------------------
# domains


def _nonzero_divisor(k: Kind, a: Any, b: Any) -> Any:
    return True if is_float(k) else np.asarray(b) != 0


def _pow_defined(k: Kind, a: Any, b: Any) -> Any:
    if is_float(k):
        return True
    if isinstance(a, int) and isinstance(b, int):
        # exact (literal) integers: refuse results beyond 64 bits rather than compute them
        return b >= 0 and b * max(1, abs(a)).bit_length() <= 64
    return np.asarray(b) >= 0


# ---------------------------------------------------------------------------------------------
# the rows

I1 = DType.I1


def _binary(name: str, cls: str, numpy: Callable[..., Any], scalar: Callable[..., Any],
            grad: Callable[[Grad], Expr | None] | None, flops: float = 1.0, *,
            result: Kind | None = None, commutes: str | None = None,
            defined: Callable[..., Any] | None = None, undefined: str = "") -> Op:
    return Op(name, Binary, 2, cls, result, numpy, scalar, defined=defined,
              undefined=undefined, grad=grad, flops=flops, commutes=commutes)


def _compare(name: str, numpy: Callable[..., Any], scalar: Callable[..., Any],
             commutes: str | None = None) -> Op:
    return _binary(name, ANY, numpy, scalar, zero, result=I1, commutes=commutes)


def _fn(name: str, arity: int, cls: str, numpy: Callable[..., Any],
        scalar: Callable[..., Any] | None, grad: Callable[[Grad], Expr | None] | None,
        doc: str, *, flops: float = 1.0, result: Kind | None = None,
        commutes: str | None = None, **kw: Any) -> Op:
    return Op(name, Call, arity, cls, result, numpy, scalar, grad=grad, flops=flops,
              commutes=commutes, doc=doc, **kw)


ROWS: tuple[Op, ...] = (
    # arithmetic (floor semantics for // and %)
    _binary("+", NUM, lambda a, b: np.add(a, b), operator.add,
            lambda g: g.add(g.d(0), g.d(1)), commutes="bits"),
    _binary("-", NUM, lambda a, b: np.subtract(a, b), operator.sub,
            lambda g: g.sub(g.d(0), g.d(1))),
    _binary("*", NUM, lambda a, b: np.multiply(a, b), operator.mul, _grad_mul, commutes="bits"),
    _binary("/", REAL, lambda a, b: np.true_divide(a, b), operator.truediv, _grad_div),
    _binary("//", NUM, lambda a, b: np.floor_divide(a, b), operator.floordiv, _piecewise,
            defined=_nonzero_divisor, undefined="integer division by zero"),
    _binary("%", NUM, lambda a, b: np.remainder(a, b), operator.mod, _grad_mod,
            defined=_nonzero_divisor, undefined="integer division by zero"),
    # comparisons (`!=` is true for NaN operands, the others false)
    _compare("<", lambda a, b: np.less(a, b), operator.lt),
    _compare("<=", lambda a, b: np.less_equal(a, b), operator.le),
    _compare(">", lambda a, b: np.greater(a, b), operator.gt),
    _compare(">=", lambda a, b: np.greater_equal(a, b), operator.ge),
    _compare("==", lambda a, b: np.equal(a, b), operator.eq, commutes="bits"),
    _compare("!=", lambda a, b: np.not_equal(a, b), operator.ne, commutes="bits"),
    # logic
    _binary("and", BOOL, lambda a, b: np.logical_and(a, b), lambda a, b: bool(a and b), zero,
            0.0, result=I1, commutes="bits"),
    _binary("or", BOOL, lambda a, b: np.logical_or(a, b), lambda a, b: bool(a or b), zero,
            0.0, result=I1, commutes="bits"),
    Op("not", Unary, 1, BOOL, I1, lambda a: np.logical_not(a), operator.not_, grad=zero),
    Op("neg", Unary, 1, NUM, None, lambda a: np.negative(a), operator.neg,
       grad=lambda g: g.neg(g.d(0))),
    Op("select", Select, 3, SELECT, None, lambda c, a, b: np.where(c, a, b),
       lambda c, a, b: a if c else b,
       grad=lambda g: g.select(g.args[0], g.d(1), g.d(2))),
    Op("cast", Cast, 1, CAST, grad=_grad_cast),
    # intrinsics, in the order the parser lists them
    _fn("exp", 1, FLOAT, lambda v: np.exp(v), math.exp, chain(lambda e, u: e), "e**x"),
    _fn("log", 1, FLOAT, lambda v: np.log(v), math.log,
        chain(lambda e, u: Binary("/", Const(1.0), u)), "natural logarithm"),
    _fn("sqrt", 1, FLOAT, lambda v: np.sqrt(v), math.sqrt,
        chain(lambda e, u: Binary("/", Const(0.5), e)), "square root"),
    _fn("rsqrt", 1, FLOAT, lambda v: np.reciprocal(np.sqrt(v)),
        lambda x: 1.0 / math.sqrt(x),
        chain(lambda e, u: Binary("/", Binary("*", Const(-0.5), e), u)), "1 / sqrt(x)"),
    _fn("tanh", 1, FLOAT, lambda v: np.tanh(v), math.tanh,
        chain(lambda e, u: Binary("-", Const(1.0), Binary("*", e, e))), "hyperbolic tangent"),
    _fn("sigmoid", 1, FLOAT, N.sigmoid, lambda x: 1.0 / (1.0 + math.exp(-x)),
        chain(lambda e, u: Binary("*", e, Binary("-", Const(1.0), e))), "1 / (1 + e**-x)"),
    _fn("erf", 1, FLOAT, N.erf, math.erf,
        chain(lambda e, u: Binary("*", Const(_TWO_OVER_SQRT_PI),
                                  Call("exp", (Unary("neg", Binary("*", u, u)),)))),
        "the error function"),
    _fn("abs", 1, NUM, lambda v: np.abs(v), abs, _grad_abs, "absolute value (gradient 0 at 0)"),
    _fn("max", 2, NUM, lambda a, b: np.maximum(a, b), max, _grad_extremum(">"),
        "the larger operand (NaN propagates in the interpreter, not in compiled code)",
        commutes="value"),
    _fn("min", 2, NUM, lambda a, b: np.minimum(a, b), min, _grad_extremum("<"),
        "the smaller operand", commutes="value"),
    _fn("pow", 2, FLOAT_OR_WEAK, lambda a, b: np.power(a, b), math.pow, _grad_pow,
        "a ** b", defined=_pow_defined, undefined="a negative integer exponent"),
    _fn("philox", 2, INT, N.philox, None, zero,
        "a uniform number in [0, 1) from an integer key and counter (Philox-4x32-10)",
        flops=0.0, result=WEAK_FLOAT, fold=False, surface=False),
    _fn("softplus", 1, FLOAT, N.softplus, N.scalar_softplus,
        chain(lambda e, u: Call("sigmoid", (u,))), "log(1 + e**x), without overflow"),
    _fn("log1p", 1, FLOAT, lambda v: np.log1p(v), math.log1p,
        chain(lambda e, u: Binary("/", Const(1.0), Binary("+", Const(1.0), u))),
        "log(1 + x), accurate for small x"),
    _fn("expm1", 1, FLOAT, lambda v: np.expm1(v), math.expm1,
        chain(lambda e, u: Call("exp", (u,))), "e**x - 1, accurate for small x"),
    _fn("atan2", 2, FLOAT, lambda y, x: np.arctan2(y, x), math.atan2, _grad_atan2,
        "the angle of the point (x, y), in [-pi, pi]"),
    _fn("isfinite", 1, FLOAT, lambda v: np.isfinite(v), math.isfinite, zero,
        "true unless x is infinite or NaN", result=I1),
    _fn("bit", 2, INT, lambda w, j: np.bitwise_and(np.right_shift(w, j), 1).astype(bool),
        lambda w, j: bool((w >> j) & 1), zero,
        "bit j (0 = least significant) of the two's-complement integer w, 0 <= j < its width "
        "(the packed masks of compress-activations)", flops=0.0, result=I1, surface=False),
)
