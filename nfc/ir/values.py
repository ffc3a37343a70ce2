"""SSA tensor values and their use lists."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from nfc.ir.types import DType, TensorType

if TYPE_CHECKING:
    from nfc.ir.ops import Op


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
