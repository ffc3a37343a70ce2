"""Blocks (ordered op lists that keep parents and use lists right), functions and modules."""

from __future__ import annotations

import copy
from collections.abc import Iterable, Iterator
from typing import Any, SupportsIndex

from nfc.ir.ops import Op, ReturnOp
from nfc.ir.types import Loc, TensorType
from nfc.ir.values import Value


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
