"""Rewriting the IR: a rewriter through which passes change it, and a pattern-rewrite walker.

The IR keeps use lists right by itself (`nfc.ir.Op`); the `Rewriter` adds the operations a
pass needs (insert, erase, replace, move, update in place), refuses the ones that would break
the IR (erasing an op whose results are read), and tells a listener what changed.
`PatternRewriteWalker` (xDSL's `PatternRewriteWalker`, MLIR's greedy driver) is that
listener: it applies patterns to the ops of a function from a worklist until none applies.

    class RemoveCopy(RewritePattern):
        def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
            if isinstance(op, ComputeOp) and (src := copy_source(op)) is not None:
                rewriter.replace_op(op, [], [src])

    PatternRewriteWalker([RemoveCopy()]).rewrite_module(module)

A pattern may also be a plain function `fn(op, rewriter)` (a table of small rules), and a
pattern that changes nothing must call no rewriter method: the walker knows a pattern applied
because the rewriter was used.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from nfc.ir import Block, Func, KernelOp, Module, Op, Value

__all__ = ["PatternRewriteWalker", "RewriteListener", "RewritePattern", "Rewriter", "walk_ops"]


class RewriteListener(Protocol):
    """What a rewriter reports (the walker's worklist listens)."""

    def op_inserted(self, op: Op) -> None:
        """`op` (and its nested ops) entered the IR."""

    def op_erased(self, op: Op) -> None:
        """`op` left the IR (erased, or detached to be moved)."""

    def op_modified(self, op: Op) -> None:
        """`op` changed in place (operands, body, attributes) or moved."""


class Rewriter:
    """Every change of a pattern (or a pass) goes through here; `changed` records that one
    happened."""

    def __init__(self, listener: RewriteListener | None = None) -> None:
        self.listener = listener
        self.changed = False

    # -- notifications

    def _inserted(self, op: Op) -> None:
        self.changed = True
        if self.listener is not None:
            self.listener.op_inserted(op)

    def _modified(self, op: Op) -> None:
        self.changed = True
        if self.listener is not None:
            self.listener.op_modified(op)

    # -- inserting and moving

    def insert_op_before(self, ops: Op | Sequence[Op], anchor: Op) -> None:
        """Insert `ops` (in no block yet), in order, just before `anchor`."""
        block = _block_of(anchor)
        for op in [ops] if isinstance(ops, Op) else ops:
            block.insert_before(op, anchor)
            self._inserted(op)

    def insert_op_after(self, ops: Op | Sequence[Op], anchor: Op) -> None:
        """Insert `ops` (in no block yet), in order, just after `anchor`."""
        block = _block_of(anchor)
        for op in [ops] if isinstance(ops, Op) else ops:
            block.insert_after(op, anchor)
            self._inserted(op)
            anchor = op

    def insert_op_at_end(self, ops: Op | Sequence[Op], block: Block) -> None:
        """Append `ops` to `block` (after its terminator, if it has one: build blocks with it)."""
        for op in [ops] if isinstance(ops, Op) else ops:
            if op.parent is not None:
                raise ValueError(f"{op!r} is already in a block; detach it first")
            block.ops.append(op)
            self._inserted(op)

    def move_op_before(self, op: Op, anchor: Op) -> None:
        """Move `op` (in a block) just before `anchor`; its results keep their uses."""
        if op is anchor:
            return
        _block_of(op).detach(op)
        _block_of(anchor).insert_before(op, anchor)
        self._modified(op)

    def detach_op(self, op: Op) -> Op:
        """Take `op` out of its block to put it into another (a new kernel's body, say);
        its results keep their uses. Returns `op`."""
        _block_of(op).detach(op)
        self.changed = True
        if self.listener is not None:
            self.listener.op_erased(op)
        return op

    # -- erasing and replacing

    def erase_op(self, op: Op) -> None:
        """Remove `op` and its nested ops for good; refused (ValueError) while one of its
        results is read."""
        _block_of(op).erase(op)
        self.changed = True
        if self.listener is not None:
            self.listener.op_erased(op)

    def replace_all_uses_with(self, old: Value, new: Value) -> None:
        """Make every reader of `old` read `new`."""
        self.replace_uses_with_if(old, new, lambda op: True)

    def replace_uses_with_if(self, old: Value, new: Value, pred: Callable[[Op], bool]) -> None:
        """Make the readers of `old` that satisfy `pred` read `new`."""
        if old is new:
            return
        users = [op for op in old.uses if pred(op)]
        chosen = set(users)
        old.replace_uses_with_if(new, lambda op: op in chosen)
        for op in users:
            self._modified(op)

    def replace_op(self, op: Op, new_ops: Op | Sequence[Op],
                   new_results: Sequence[Value] | None = None) -> None:
        """Insert `new_ops` before `op`, make the readers of `op`'s results read
        `new_results` (default: the last new op's results) and erase `op`."""
        new_ops = [new_ops] if isinstance(new_ops, Op) else list(new_ops)
        if new_results is None:
            new_results = new_ops[-1].results if new_ops else []
        if len(new_results) != len(op.results):
            raise ValueError(f"{op.opname} has {len(op.results)} results, "
                             f"{len(new_results)} replacements given")
        self.insert_op_before(new_ops, op)
        for old, new in zip(op.results, new_results, strict=True):
            self.replace_all_uses_with(old, new)
        self.erase_op(op)

    # -- changing an op in place

    def update(self, op: Op, **fields: Any) -> None:
        """Set fields of `op` in place (`update(op, body=e, raxes=())`, `values=[...]` of a
        return); use lists follow."""
        for name, value in fields.items():
            if not hasattr(op, name) or name.startswith("_") or name == "results":
                raise AttributeError(f"{op.opname} has no field '{name}' to update")
            setattr(op, name, value)
        self._modified(op)

    def erase_results(self, op: KernelOp, indices: Iterable[int]) -> None:
        """Drop results of kernel `op` (and what its yield gives for them); refused
        (ValueError) for a result that is read."""
        indices = list(indices)
        if not indices:
            return
        op.erase_results(indices)
        self._modified(op)
        self._modified(op.body.ops[-1])


def _block_of(op: Op) -> Block:
    if op.parent is None:
        raise ValueError(f"{op!r} is in no block")
    return op.parent


# ---------------------------------------------------------------------------------------------
# patterns and the walker


class RewritePattern:
    """A local rewrite: look at one op, change the IR through the rewriter or do nothing."""

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        """Rewrite at `op` if the pattern matches."""
        raise NotImplementedError


PatternFn = Callable[[Op, Rewriter], None]


@dataclass
class _FnPattern(RewritePattern):
    fn: PatternFn

    def match_and_rewrite(self, op: Op, rewriter: Rewriter) -> None:
        self.fn(op, rewriter)


def walk_ops(block: Block, *, reverse: bool = False) -> Iterator[Op]:
    """The ops of `block`, each followed by its nested ops (last op first when `reverse`, and
    nested blocks backwards too)."""
    for op in reversed(block.ops) if reverse else block.ops:
        yield op
        for region in op.regions():
            yield from walk_ops(region, reverse=reverse)


class _Worklist:
    """Ops to visit, in order, each at most once at a time; listens to the rewriter."""

    def __init__(self, ops: Iterable[Op], revisit: bool) -> None:
        self.queue: deque[Op] = deque(ops)
        self.pending: set[Op] = set(self.queue)
        self.revisit = revisit

    def pop(self) -> Op | None:
        while self.queue:
            op = self.queue.popleft()
            if op in self.pending:
                self.pending.discard(op)
                return op
        return None

    def push(self, op: Op) -> None:
        if op not in self.pending and op.attached:
            self.pending.add(op)
            self.queue.append(op)

    def op_inserted(self, op: Op) -> None:
        if self.revisit:
            self.push(op)
            for region in op.regions():
                for inner in walk_ops(region):
                    self.push(inner)

    def op_erased(self, op: Op) -> None:
        self.pending.discard(op)
        for region in op.regions():
            for inner in walk_ops(region):
                self.pending.discard(inner)
        if self.revisit:  # the ops feeding it may have lost their last reader
            for v in op.operands:
                if v.owner is not None and v.owner is not op:
                    self.push(v.owner)

    def op_modified(self, op: Op) -> None:
        if self.revisit:
            self.push(op)


@dataclass
class PatternRewriteWalker:
    """Apply patterns to every op of a function until none applies (MLIR's greedy driver).

    The worklist starts with every op in program order, each op followed by its nested ops
    (backwards with `walk_reverse`, the order for removing dead code). Each op is offered to
    the patterns in order until one changes something. With `apply_recursively` (the
    default), ops the rewriter inserted or modified are visited (again), and so are the
    producers of an erased op's operands, until the worklist is empty: the fixpoint.
    Without, every op present at the start is visited once.
    """

    patterns: Sequence[RewritePattern | PatternFn] | RewritePattern
    walk_reverse: bool = False
    apply_recursively: bool = True
    max_rewrites: int = 1_000_000
    """Rewrites in one function before giving up (patterns that undo each other)."""
    rewrites: int = field(default=0, init=False)
    """Rewrites done so far by this walker."""

    def _patterns(self) -> list[RewritePattern]:
        pats = [self.patterns] if isinstance(self.patterns, RewritePattern) else self.patterns
        return [p if isinstance(p, RewritePattern) else _FnPattern(p) for p in pats]

    def rewrite_module(self, module: Module) -> bool:
        """Rewrite every function of `module`; whether anything changed."""
        changed = False
        for func in list(module.funcs):
            changed |= self.rewrite_func(func)
        return changed

    def rewrite_func(self, func: Func) -> bool:
        """Rewrite the ops of `func` to a fixpoint; whether anything changed."""
        return self.rewrite_block(func.body)

    def rewrite_block(self, block: Block) -> bool:
        """Rewrite the ops of `block` (attached to a function) and of its nested blocks."""
        if not block.attached:
            raise ValueError("the walker rewrites blocks of functions")
        patterns = self._patterns()
        work = _Worklist(walk_ops(block, reverse=self.walk_reverse), self.apply_recursively)
        rewriter = Rewriter(work)
        count = 0
        while (op := work.pop()) is not None:
            for pattern in patterns:
                if not op.attached:
                    break  # erased by an earlier rewrite
                rewriter.changed = False
                pattern.match_and_rewrite(op, rewriter)
                if rewriter.changed:
                    count += 1
                    if count > self.max_rewrites:
                        raise RuntimeError(f"pattern rewriting did not converge after "
                                           f"{self.max_rewrites} rewrites (patterns that undo "
                                           "each other?)")
                    break
        self.rewrites += count
        return count > 0
