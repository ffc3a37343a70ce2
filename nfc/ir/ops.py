"""Tensor-level ops: the `Op` base with its use tracking, operand lists, and the concrete ops
(`nf.compute`, `nf.call`, `nf.return`, `nf.yield`, `nf.kernel`, `nf.allreduce`)."""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from nfc.ir.expr import Expr, loads, substitute_values
from nfc.ir.types import Loc, TensorType
from nfc.ir.values import Value

if TYPE_CHECKING:
    from nfc.ir.block import Block


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


class AllReduceOp(Op):
    """`%a, %b = nf.allreduce %x, %y {nf.bucket = 0, nf.reduce = "mean"} : types`: every
    result is its operand reduced over the ranks of a data-parallel run (one bucket of
    gradients, one collective call). Inserted by the `data-parallel` pass
    (nfc.passes.data_parallel); the native step calls the runtime's collective at this point
    (nfc.runtime.distributed), and a process without one copies the operands unchanged."""

    opname = "nf.allreduce"

    def __init__(self, values: list[Value], *, loc: Loc | None = None,
                 attrs: dict[str, Any] | None = None,
                 names: list[str | None] | None = None) -> None:
        super().__init__([v.type for v in values], loc=loc, attrs=attrs, names=names)
        self.values = values

    values = _operand_list("values", "The tensors reduced (one result each).")

    @property
    def operands(self) -> list[Value]:
        return list(dict.fromkeys(self.values))

    def replace_uses(self, mapping: dict[Value, Value]) -> None:
        self.values = [mapping.get(a, a) for a in self.values]

    def _clone(self, mapping: dict[Value, Value]) -> Op:
        return AllReduceOp([mapping.get(a, a) for a in self.values], loc=self.loc,
                           attrs=copy.deepcopy(self.attrs),
                           names=[r.name for r in self.results])
