"""The nf IR: types, scalar expressions, tensor-level ops, functions and modules.

The IR is single-level in the NeoFlow sense: tensor values are SSA, and the body of an
`nf.compute` is one scalar expression tree. Every tensor in the IR has a static shape; symbolic
shapes of the surface language are resolved by the frontend.

Expressions are immutable (frozen dataclasses, structural equality); ops, values, blocks,
functions and modules are mutable objects with identity, which passes rewrite in place.
"""

from __future__ import annotations

import copy
import enum
import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar, SupportsIndex

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
    `uses` lists the ops that read the value; the IR keeps it up to date under every mutation
    (see `Op`).
    """

    __slots__ = ("type", "name", "owner", "index", "_uses", "__weakref__")

    def __init__(self, type: TensorType, name: str | None = None,
                 owner: Op | None = None, index: int = 0) -> None:
        self.type = type
        self.name = name
        self.owner = owner
        self.index = index
        self._uses: dict[Op, None] = {}  # an ordered set

    @property
    def shape(self) -> tuple[int, ...]:
        """The static shape."""
        return self.type.shape

    @property
    def dtype(self) -> DType:
        """The element type."""
        return self.type.dtype

    @property
    def uses(self) -> tuple[Op, ...]:
        """The ops that read this value, each once, in the order they started to. Only ops
        that are part of a function body count (`Op.attached`); an op under construction or
        in a block of no function reads nothing yet."""
        return tuple(self._uses)

    @property
    def has_uses(self) -> bool:
        """Whether any op reads this value."""
        return bool(self._uses)

    def replace_all_uses_with(self, new: Value) -> None:
        """Make every op that reads this value read `new` instead."""
        self.replace_uses_with_if(new, lambda op: True)

    def replace_uses_with_if(self, new: Value, pred: Callable[[Op], bool]) -> None:
        """Make the ops that read this value and satisfy `pred` read `new` instead."""
        if new is self:
            return
        for op in tuple(self._uses):
            if pred(op):
                op.replace_uses({self: new})

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
    """Base of tensor-level operations.

    An op sits in at most one block (`parent`). While it is part of a function body, nested
    blocks included (`attached`), it is in the use list of every value it reads, and the IR
    keeps it so under every mutation: adding or removing ops through `Block.ops`, assigning
    or editing an op's operand lists and body, replacing a kernel's or a function's body.
    Passes make their changes through `nfc.rewrite.Rewriter`, which builds on these.
    """

    opname: ClassVar[str] = "nf.op"
    #: Trait: the op ends its block (`nf.return`, `nf.yield`); see `TerminatorOp`.
    is_terminator: ClassVar[bool] = False

    def __init__(self, result_types: list[TensorType], *, loc: Loc | None = None,
                 attrs: dict[str, Any] | None = None, names: list[str | None] | None = None):
        self._parent: Block | None = None
        self._attached = False
        self._reads: tuple[Value, ...] = ()  # the values whose use lists hold this op
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
    def parent(self) -> Block | None:
        """The block holding this op, None while it is in none."""
        return self._parent

    @property
    def attached(self) -> bool:
        """Whether the op is part of a function body (directly or in a nested block)."""
        return self._attached

    @property
    def operands(self) -> list[Value]:
        """Tensor values this op reads, in first-use order, without repeats."""
        return []

    @property
    def direct_operands(self) -> list[Value]:
        """The values this op itself reads: its operands, except for an op with a body,
        whose nested ops are the readers."""
        return self.operands

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        """Make this op read `mapping[v]` wherever it read `v`."""

    def regions(self) -> list[Block]:
        """Nested blocks (only kernel ops have one)."""
        return []

    def clone(self, mapping: dict[Value, Value] | None = None) -> Op:
        """A copy in no block, reading `mapping[v]` wherever this op reads a mapped `v`.

        The copy's results are fresh values with the same types and name hints, added to
        `mapping` (as are the results of nested ops, whose blocks are copied too), so cloning
        ops in order with one mapping copies a whole block. Attributes are deep-copied; the
        location is kept.
        """
        mapping = {} if mapping is None else mapping
        new = self._clone(mapping)
        mapping.update(zip(self.results, new.results, strict=True))
        return new

    def _clone(self, mapping: dict[Value, Value]) -> Op:
        raise NotImplementedError(f"{self.opname} cannot be cloned")

    def _track(self) -> None:
        """Be in the use lists of exactly the values this op reads now (none if detached)."""
        new = tuple(dict.fromkeys(self.direct_operands)) if self._attached else ()
        old = self._reads
        if new == old:
            return
        keep = set(new)
        for v in old:
            if v not in keep:
                v._uses.pop(self, None)
        for v in new:
            v._uses[self] = None
        self._reads = new

    def _attach(self, attached: bool) -> None:
        self._attached = attached
        self._track()
        for region in self.regions():
            region._attach(attached)

    def __repr__(self) -> str:
        return f"<{self.opname} -> {[str(r.type) for r in self.results]}>"


class _OperandList(list):  # type: ignore[type-arg]
    """An op's list of operand values: every change updates the op's uses."""

    __slots__ = ("_op",)

    def __init__(self, op: Op, values: Iterable[Value] = ()) -> None:
        super().__init__(values)
        self._op = op


def _operand_list_method(name: str) -> Callable[..., Any]:
    method = getattr(list, name)

    def changed(self: _OperandList, *args: Any) -> Any:
        out = method(self, *args)
        self._op._track()
        return out

    changed.__name__ = name
    return changed


for _name in ("append", "extend", "insert", "pop", "remove", "clear", "__setitem__",
              "__delitem__", "__iadd__", "__imul__"):
    setattr(_OperandList, _name, _operand_list_method(_name))


def _operand_list(name: str, doc: str) -> Any:
    """A property holding a list of operands; assigning any iterable keeps the uses right."""
    attr = "_" + name

    def get(op: Op) -> list[Value]:
        return getattr(op, attr)

    def set(op: Op, values: Iterable[Value]) -> None:
        setattr(op, attr, _OperandList(op, values))
        op._track()

    return property(get, set, doc=doc)


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
    def body(self) -> Expr:
        """The scalar expression computing one element."""
        return self._body

    @body.setter
    def body(self, body: Expr) -> None:
        self._body = body
        self._track()

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

    def _clone(self, mapping: dict[Value, Value]) -> Op:
        return ComputeOp(self.result.type, self.dims, substitute_values(self.body, mapping),
                         reduce=self.reduce, raxes=self.raxes, loc=self.loc,
                         attrs=copy.deepcopy(self.attrs), name=self.result.name)


class CallOp(Op):
    """`%a, %b = nf.call @f(%x, %y) : (types) -> (types)`, removed by the inline pass."""

    opname = "nf.call"

    def __init__(self, callee: str, args: list[Value], result_types: list[TensorType], *,
                 loc: Loc | None = None, attrs: dict[str, Any] | None = None,
                 names: list[str | None] | None = None) -> None:
        super().__init__(result_types, loc=loc, attrs=attrs, names=names)
        self.callee = callee
        self.args = args

    args = _operand_list("args", "The arguments passed to the callee.")

    @property
    def operands(self) -> list[Value]:
        return list(self.args)

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        self.args = [mapping.get(a, a) for a in self.args]

    def _clone(self, mapping: dict[Value, Value]) -> Op:
        return CallOp(self.callee, [mapping.get(a, a) for a in self.args],
                      [r.type for r in self.results], loc=self.loc,
                      attrs=copy.deepcopy(self.attrs), names=[r.name for r in self.results])


class TerminatorOp(Op):
    """Base of the ops that end a block and hand its `values` out (`is_terminator`)."""

    is_terminator = True

    def __init__(self, values: list[Value], *, loc: Loc | None = None) -> None:
        super().__init__([], loc=loc)
        self.values = values

    values = _operand_list("values", "The values handed out of the block.")

    @property
    def operands(self) -> list[Value]:
        return list(self.values)

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        self.values = [mapping.get(a, a) for a in self.values]

    def _clone(self, mapping: dict[Value, Value]) -> Op:
        return type(self)([mapping.get(v, v) for v in self.values], loc=self.loc)


class ReturnOp(TerminatorOp):
    """`nf.return %a, %b : types` ends a function."""

    opname = "nf.return"


class YieldOp(TerminatorOp):
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
        self._body: Block | None = None
        self.body = body

    @property
    def body(self) -> Block:
        """The kernel's block; assigning one makes this op its owner (a block has one)."""
        assert self._body is not None
        return self._body

    @body.setter
    def body(self, body: Block) -> None:
        self._body = body._adopt(self, self._body, self._attached)

    @property
    def operands(self) -> list[Value]:
        inner = {id(r) for op in self.body.walk() for r in op.results}
        seen: dict[int, Value] = {}
        for op in self.body.walk():
            for v in op.operands:
                if id(v) not in inner:
                    seen.setdefault(id(v), v)
        return list(seen.values())

    @property
    def direct_operands(self) -> list[Value]:
        return []

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        for op in self.body.ops:
            op.replace_uses(mapping)

    def regions(self) -> list[Block]:
        return [self.body]

    def erase_results(self, indices: Iterable[int]) -> None:
        """Drop the results at `indices` (and the values the yield gives for them); refused
        for a result that is still read."""
        drop = set(indices)
        for n in sorted(drop):
            r = self.results[n]
            if r.has_uses:
                raise ValueError(f"cannot drop result {n} (%{r.name or '?'}) of nf.kernel: "
                                 f"{len(r.uses)} op(s) still read it")
        term = self.body.ops[-1]
        assert isinstance(term, YieldOp)
        keep = [n for n in range(len(self.results)) if n not in drop]
        term.values = [term.values[n] for n in keep]
        for n in drop:
            self.results[n].owner = None
        self.results = [self.results[n] for n in keep]
        for n, r in enumerate(self.results):
            r.index = n

    def _clone(self, mapping: dict[Value, Value]) -> Op:
        return KernelOp(self.body.clone(mapping), loc=self.loc, attrs=copy.deepcopy(self.attrs),
                        names=[r.name for r in self.results])


class _OpList(list):  # type: ignore[type-arg]
    """A block's list of ops: an op added is linked to the block (and counted as a user of
    what it reads when the block is part of a function); an op removed is unlinked.

    An op belongs in one block. Adding it to a second one is not refused here, so that tests
    can build broken IR for the verifier; the op then belongs to the block it entered last,
    and the verifier reports the other. `Rewriter` refuses it.
    """

    __slots__ = ("_block",)

    def __init__(self, block: Block, ops: Iterable[Op] = ()) -> None:
        super().__init__()
        self._block = block
        self.extend(ops)

    @staticmethod
    def _check(ops: list[Op]) -> list[Op]:
        for op in ops:
            if not isinstance(op, Op):
                raise TypeError(f"a block holds ops, not {op!r}")
        return ops

    def _link(self, op: Op) -> None:
        op._parent = self._block
        if op._attached != self._block._attached:
            op._attach(self._block._attached)

    def _unlink(self, op: Op, remaining: Iterable[Op] | None = None) -> None:
        """Unlink `op`, removed from this list, unless it belongs elsewhere or is still here
        (`remaining`: the ops left, default all of them)."""
        if op._parent is not self._block:
            return
        if any(x is op for x in (self if remaining is None else remaining)):
            return
        op._parent = None
        if op._attached:
            op._attach(False)

    def append(self, op: Op) -> None:
        super().append(self._check([op])[0])
        self._link(op)

    def insert(self, index: SupportsIndex, op: Op) -> None:
        super().insert(index, self._check([op])[0])
        self._link(op)

    def extend(self, ops: Iterable[Op]) -> None:
        new = self._check(list(ops))
        super().extend(new)
        for op in new:
            self._link(op)

    def __iadd__(self, ops: Iterable[Op]) -> _OpList:  # type: ignore[override,misc]
        self.extend(ops)
        return self

    def __imul__(self, n: SupportsIndex) -> _OpList:  # type: ignore[override,misc]
        raise TypeError("an op cannot be in a block twice")

    def pop(self, index: SupportsIndex = -1) -> Op:
        op = super().pop(index)
        self._unlink(op)
        return op

    def remove(self, op: Op) -> None:
        super().pop(self.index(op))
        self._unlink(op)

    def clear(self) -> None:
        old = list(self)
        super().clear()
        for op in old:
            self._unlink(op, ())

    def __setitem__(self, key: Any, value: Any) -> None:
        if not isinstance(key, slice):
            old = super().__getitem__(key)
            super().__setitem__(key, self._check([value])[0])
            if old is not value:
                self._unlink(old)
                self._link(value)
            return
        old = super().__getitem__(key)
        new = self._check(list(value))
        super().__setitem__(key, new)
        remaining = {id(op) for op in self}
        was = {id(op) for op in old}
        for op in old:
            if id(op) not in remaining:
                self._unlink(op, ())
        for op in new:
            if id(op) not in was:
                self._link(op)

    def __delitem__(self, key: Any) -> None:
        old = super().__getitem__(key)
        super().__delitem__(key)
        if not isinstance(key, slice):
            self._unlink(old)
            return
        remaining = {id(op) for op in self}
        for op in old:
            if id(op) not in remaining:
                self._unlink(op, ())


def _free(op: Op) -> Op:
    if op.parent is not None:
        raise ValueError(f"{op!r} is already in a block; detach it first or insert a clone")
    return op


class Block:
    """An ordered list of ops, owned by a kernel op or a function (`parent`).

    `ops` is a list; changing it (append, insert, slice assignment, `del`, assigning a new
    list) keeps every op's `parent` and the use lists right. An op is in one block at most.
    """

    def __init__(self, ops: Iterable[Op] = ()) -> None:
        self._owner: Op | Func | None = None
        self._attached = False
        self._ops = _OpList(self, ops)

    @property
    def ops(self) -> list[Op]:
        """The ops, in order."""
        return self._ops

    @ops.setter
    def ops(self, ops: Iterable[Op]) -> None:
        self._ops[:] = list(ops)

    @property
    def parent(self) -> Op | Func | None:
        """The kernel op or function whose body this block is."""
        return self._owner

    @property
    def attached(self) -> bool:
        """Whether the block is part of a function body (its ops count as users)."""
        return self._attached

    @property
    def terminator(self) -> Op | None:
        """The last op if it is a terminator."""
        return self._ops[-1] if self._ops and self._ops[-1].is_terminator else None

    def walk(self) -> Iterator[Op]:
        """Every op, nested ones included, in order (an op before its nested ops)."""
        for op in self.ops:
            yield op
            for region in op.regions():
                yield from region.walk()

    def index(self, op: Op) -> int:
        """The position of `op` (ValueError when it is not in this block)."""
        if op._parent is not self:
            raise ValueError(f"{op!r} is not in this block")
        return self._ops.index(op)

    def insert_before(self, op: Op, anchor: Op) -> None:
        """Put `op` (in no block yet) just before `anchor`."""
        self._ops.insert(self.index(anchor), _free(op))

    def insert_after(self, op: Op, anchor: Op) -> None:
        """Put `op` (in no block yet) just after `anchor`."""
        self._ops.insert(self.index(anchor) + 1, _free(op))

    def detach(self, op: Op) -> Op:
        """Take `op` out of this block (to move it elsewhere); it stops reading anything, but
        its results keep their uses."""
        self._ops.pop(self.index(op))
        return op

    def erase(self, op: Op) -> None:
        """Remove `op` for good; refused (ValueError) while one of its results is read."""
        for r in op.results:
            if r.has_uses:
                users = ", ".join(u.opname for u in r.uses[:3])
                raise ValueError(f"cannot erase {op.opname} defining %{r.name or '?'}: still "
                                 f"read by {len(r.uses)} op(s) ({users})")
        self.detach(op)

    def clone(self, mapping: dict[Value, Value] | None = None) -> Block:
        """A copy of every op (see `Op.clone`), in a new block of no owner."""
        mapping = {} if mapping is None else mapping
        return Block([op.clone(mapping) for op in self.ops])

    def _adopt(self, owner: Op | Func, old: Block | None, attached: bool) -> Block:
        """Become `owner`'s body in place of `old` (which is released); returns self."""
        if old is not self:
            if old is not None and old._owner is owner:
                old._set_owner(None, False)
            self._set_owner(owner, attached)
        return self

    def _set_owner(self, owner: Op | Func | None, attached: bool) -> None:
        self._owner = owner
        if attached != self._attached:
            self._attach(attached)

    def _attach(self, attached: bool) -> None:
        self._attached = attached
        for op in self._ops:
            op._attach(attached)

    def __repr__(self) -> str:
        return f"Block({len(self._ops)} ops)"


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
        self._body: Block | None = None
        self.body = body or Block()
        self.attrs: dict[str, Any] = dict(attrs or {})
        self.loc = loc

    @property
    def body(self) -> Block:
        """The function's block; its ops are attached (they count as users)."""
        assert self._body is not None
        return self._body

    @body.setter
    def body(self, body: Block) -> None:
        self._body = body._adopt(self, self._body, True)

    @property
    def ret(self) -> ReturnOp:
        """The terminating return op."""
        op = self.body.ops[-1]
        assert isinstance(op, ReturnOp), "missing nf.return"
        return op

    @property
    def result_types(self) -> list[TensorType]:
        """Types of the returned values."""
        return [v.type for v in self.ret.values]

    def walk(self) -> Iterator[Op]:
        """Every op of the body, nested ones included."""
        return self.body.walk()

    def arg(self, name: str) -> Value:
        """The argument named `name`."""
        for a in self.args:
            if a.name == name:
                return a
        raise KeyError(name)

    def clone(self, name: str | None = None,
              mapping: dict[Value, Value] | None = None) -> Func:
        """A deep copy (fresh argument and op values with the same names, attributes copied)
        named `name` (default: the same); `mapping` receives old value -> new value."""
        mapping = {} if mapping is None else mapping
        args = []
        for a in self.args:
            mapping[a] = b = Value(a.type, a.name)
            args.append(b)
        return Func(self.name if name is None else name, args, self.body.clone(mapping),
                    arg_attrs=copy.deepcopy(self.arg_attrs), attrs=copy.deepcopy(self.attrs),
                    loc=self.loc)


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
