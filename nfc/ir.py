"""The nf IR: types, scalar expressions, tensor-level ops, functions and modules.

The IR is single-level in the NeoFlow sense: tensor values are SSA, and the body of an
`nf.compute` is one scalar expression tree. Every tensor in the IR has a static shape; symbolic
shapes of the surface language are resolved by the frontend.

Expressions are immutable (frozen dataclasses, structural equality); ops, values, blocks,
functions and modules are mutable objects with identity, which passes rewrite in place.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    import numpy as np

# ---------------------------------------------------------------------------------------------
# types


class DType(enum.Enum):
    """Element types of tensors and scalar expressions."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    I1 = "i1"
    I32 = "i32"
    I64 = "i64"

    @property
    def is_float(self) -> bool:
        """True for the floating-point types."""
        return self in (DType.F16, DType.BF16, DType.F32, DType.F64)

    @property
    def is_int(self) -> bool:
        """True for integer types, the boolean `i1` included."""
        return not self.is_float

    @property
    def itemsize(self) -> int:
        """Bytes per element (i1 is stored as one byte)."""
        return {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i1": 1, "i32": 4, "i64": 8}[self.value]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype the interpreter computes in (bf16 is emulated in f32)."""
        import numpy as np  # imported here so that `nfc --help` does not load numpy

        return np.dtype(
            {"f16": "float16", "bf16": "float32", "f32": "float32", "f64": "float64",
             "i1": "bool", "i32": "int32", "i64": "int64"}[self.value])

    @staticmethod
    def parse(text: str) -> DType:
        """The dtype spelled `text`; raises ValueError for an unknown name."""
        return DType(text)

    def __str__(self) -> str:
        return self.value


#: Largest number of elements a tensor may have; bigger shapes are refused by the frontend
#: and the verifier rather than exhausting memory later.
MAX_ELEMENTS = 1 << 40


@dataclass(frozen=True)
class TensorType:
    """A statically shaped tensor type; rank 0 is a scalar."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of storage."""
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype}>"


# ---------------------------------------------------------------------------------------------
# source locations


@dataclass(frozen=True)
class Loc:
    """A source position: file, 1-based line and column, optional end column on that line."""

    file: str
    line: int
    col: int
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


# ---------------------------------------------------------------------------------------------
# values


class Value:
    """An SSA tensor value: a function argument or the result of an op.

    `name` is a hint the printer uses when it is unique; identity, not name, defines a value.
    """

    __slots__ = ("type", "name", "owner", "index", "__weakref__")

    def __init__(self, type: TensorType, name: str | None = None,
                 owner: Op | None = None, index: int = 0) -> None:
        self.type = type
        self.name = name
        self.owner = owner
        self.index = index

    @property
    def shape(self) -> tuple[int, ...]:
        """The static shape."""
        return self.type.shape

    @property
    def dtype(self) -> DType:
        """The element type."""
        return self.type.dtype

    def __repr__(self) -> str:
        return f"Value(%{self.name or '?'}: {self.type})"


# ---------------------------------------------------------------------------------------------
# scalar expressions

#: Binary operators and their printing precedence (higher binds tighter).
BINARY_PRECEDENCE: dict[str, int] = {
    "or": 1, "and": 2,
    "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
    "+": 5, "-": 5,
    "*": 6, "/": 6, "//": 6, "%": 6,
}
COMPARISONS = frozenset({"<", "<=", ">", ">=", "==", "!="})
LOGICAL = frozenset({"and", "or"})

#: Intrinsic functions: name -> number of arguments.
INTRINSICS: dict[str, int] = {
    "exp": 1, "log": 1, "sqrt": 1, "rsqrt": 1, "tanh": 1, "sigmoid": 1, "erf": 1, "abs": 1,
    "max": 2, "min": 2, "pow": 2,
    # A counter-based uniform random number in [0, 1): philox(key, counter) with integer
    # arguments; the same (key, counter) always gives the same number (Philox-4x32-10).
    "philox": 2,
}

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


# ---------------------------------------------------------------------------------------------
# ops


@dataclass(frozen=True)
class Axis:
    """A named iteration axis with its extent: `n: 256`."""

    name: str
    extent: int

    def __str__(self) -> str:
        return f"{self.name}: {self.extent}"


class Op:
    """Base of tensor-level operations."""

    opname: ClassVar[str] = "nf.op"

    def __init__(self, result_types: list[TensorType], *, loc: Loc | None = None,
                 attrs: dict[str, Any] | None = None, names: list[str | None] | None = None):
        names = names or [None] * len(result_types)
        self.results = [Value(t, n, self, i) for i, (t, n) in enumerate(zip(result_types, names,
                                                                           strict=True))]
        self.loc = loc
        self.attrs: dict[str, Any] = dict(attrs or {})

    @property
    def result(self) -> Value:
        """The only result (asserts there is exactly one)."""
        assert len(self.results) == 1, f"{self.opname} has {len(self.results)} results"
        return self.results[0]

    @property
    def operands(self) -> list[Value]:
        """Tensor values this op reads, in first-use order, without repeats."""
        return []

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        """Make this op read `mapping[v]` wherever it read `v`."""

    def regions(self) -> list[Block]:
        """Nested blocks (only kernel ops have one)."""
        return []

    def __repr__(self) -> str:
        return f"<{self.opname} -> {[str(r.type) for r in self.results]}>"


class ComputeOp(Op):
    """`%r = nf.compute [dims] reduce [raxes] (body) : type`.

    Element `r[dims]` is `reduce over raxes of body`, or plain `body` with no reduction. The
    body may mention dims and raxes as index variables and may not contain reductions.
    """

    opname = "nf.compute"

    def __init__(self, type: TensorType, dims: tuple[Axis, ...], body: Expr, *,
                 reduce: str | None = None, raxes: tuple[Axis, ...] = (),
                 loc: Loc | None = None, attrs: dict[str, Any] | None = None,
                 name: str | None = None) -> None:
        super().__init__([type], loc=loc, attrs=attrs, names=[name])
        self.dims = tuple(dims)
        self.reduce = reduce
        self.raxes = tuple(raxes)
        self.body = body

    @property
    def operands(self) -> list[Value]:
        seen: dict[int, Value] = {}
        for ld in loads(self.body):
            seen.setdefault(id(ld.tensor), ld.tensor)
        return list(seen.values())

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        self.body = substitute_values(self.body, mapping)

    @property
    def all_axes(self) -> tuple[Axis, ...]:
        """Output axes followed by reduction axes."""
        return self.dims + self.raxes


class CallOp(Op):
    """`%a, %b = nf.call @f(%x, %y) : (types) -> (types)`, removed by the inline pass."""

    opname = "nf.call"

    def __init__(self, callee: str, args: list[Value], result_types: list[TensorType], *,
                 loc: Loc | None = None, attrs: dict[str, Any] | None = None,
                 names: list[str | None] | None = None) -> None:
        super().__init__(result_types, loc=loc, attrs=attrs, names=names)
        self.callee = callee
        self.args = list(args)

    @property
    def operands(self) -> list[Value]:
        return list(self.args)

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        self.args = [mapping.get(a, a) for a in self.args]


class ReturnOp(Op):
    """`nf.return %a, %b : types` ends a function."""

    opname = "nf.return"

    def __init__(self, values: list[Value], *, loc: Loc | None = None) -> None:
        super().__init__([], loc=loc)
        self.values = list(values)

    @property
    def operands(self) -> list[Value]:
        return list(self.values)

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        self.values = [mapping.get(a, a) for a in self.values]


class YieldOp(ReturnOp):
    """`nf.yield %a : type` ends the body of a kernel op."""

    opname = "nf.yield"


class KernelOp(Op):
    """A group of computes that will become one kernel; its results are what the body yields.

    The body refers to outer values directly; it ends with an `nf.yield`.
    """

    opname = "nf.kernel"

    def __init__(self, body: Block, *, loc: Loc | None = None,
                 attrs: dict[str, Any] | None = None,
                 names: list[str | None] | None = None) -> None:
        term = body.ops[-1] if body.ops else None
        assert isinstance(term, YieldOp), "a kernel body ends with nf.yield"
        super().__init__([v.type for v in term.values], loc=loc, attrs=attrs, names=names)
        self.body = body

    @property
    def operands(self) -> list[Value]:
        inner = {id(r) for op in self.body.walk() for r in op.results}
        seen: dict[int, Value] = {}
        for op in self.body.walk():
            for v in op.operands:
                if id(v) not in inner:
                    seen.setdefault(id(v), v)
        return list(seen.values())

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        for op in self.body.ops:
            op.replace_uses(mapping)

    def regions(self) -> list[Block]:
        return [self.body]


@dataclass
class Block:
    """An ordered list of ops."""

    ops: list[Op] = field(default_factory=list)

    def walk(self) -> Iterator[Op]:
        """Every op, nested ones included, in order (an op before its nested ops)."""
        for op in self.ops:
            yield op
            for region in op.regions():
                yield from region.walk()


# ---------------------------------------------------------------------------------------------
# functions and modules


class Func:
    """`nf.func @name(args) -> (types) attributes {...} { body }`.

    Argument attributes (e.g. `nf.role`) live in `arg_attrs`, parallel to `args`.
    """

    def __init__(self, name: str, args: list[Value], body: Block | None = None, *,
                 arg_attrs: list[dict[str, Any]] | None = None,
                 attrs: dict[str, Any] | None = None, loc: Loc | None = None) -> None:
        self.name = name
        self.args = list(args)
        self.arg_attrs = arg_attrs if arg_attrs is not None else [{} for _ in args]
        self.body = body or Block()
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.loc = loc

    @property
    def ret(self) -> ReturnOp:
        """The terminating return op."""
        op = self.body.ops[-1]
        assert isinstance(op, ReturnOp) and not isinstance(op, YieldOp), "missing nf.return"
        return op

    @property
    def result_types(self) -> list[TensorType]:
        """Types of the returned values."""
        return [v.type for v in self.ret.values]

    def walk(self) -> Iterator[Op]:
        """Every op of the body, nested ones included."""
        return self.body.walk()

    def replace_all_uses(self, mapping: dict[Value, Value]) -> None:
        """Replace uses of values everywhere in the body."""
        for op in self.walk():
            op.replace_uses(mapping)

    def users(self) -> dict[int, list[Op]]:
        """id(value) -> ops (top-level or nested) that read it."""
        out: dict[int, list[Op]] = {}
        for op in self.walk():
            for v in op.operands:
                out.setdefault(id(v), []).append(op)
        return out

    def arg(self, name: str) -> Value:
        """The argument named `name`."""
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)


class Module:
    """`nf.module @name attributes {...} { funcs }`."""

    def __init__(self, name: str, funcs: list[Func] | None = None, *,
                 attrs: dict[str, Any] | None = None) -> None:
        self.name = name
        self.funcs = list(funcs or [])
        self.attrs: dict[str, Any] = dict(attrs or {})

    def func(self, name: str) -> Func:
        """The function named `name`."""
        for f in self.funcs:
            if f.name == name:
                return f
        raise KeyError(name)

    def has_func(self, name: str) -> bool:
        """Whether a function named `name` exists."""
        return any(f.name == name for f in self.funcs)
