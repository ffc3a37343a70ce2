"""The loop IR: what a compute becomes once a schedule is applied.

A `LoopFunc` is a kernel: typed buffer parameters (outputs first, then inputs) and a statement
tree of loops, stores, conditionals and buffer allocations. Scalar expressions are the nf IR's
expression nodes (`nfc.ir.Expr`), with loop variables as `Index` nodes, plus two nodes of this
level: `BufLoad` (an element of a buffer) and `Clamp` (an index that may run past the end of a
padded tile, whose value there is irrelevant).

Every loop has a kind: serial, parallel (CPU threads), vectorized (one SIMD vector: its extent
is the width), unrolled, or a GPU binding (block/thread axes) that the CUDA backend will use;
buffers have a scope: global (parameters and the kernel's workspace), local (private scratch),
register (accumulators kept in registers), and the GPU scopes shared and fragment. The printer
gives a stable text for golden tests (`nfc compile --emit=loops`); `map_exprs`, `map_stmt` and
`strip_clamps` rewrite the expressions of a statement tree.
"""

from __future__ import annotations

import enum
import math
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from nfc.ir import (
    Binary,
    Call,
    Cast,
    Const,
    DType,
    Expr,
    Index,
    Select,
    Unary,
    substitute_indices,
)
from nfc.printer import format_const


class Scope(enum.Enum):
    """Where a buffer lives."""

    GLOBAL = "global"
    """A kernel parameter, or a slice of the caller-provided workspace."""
    LOCAL = "local"
    """Private scratch memory of one thread (stack or heap)."""
    REGISTER = "register"
    """Small, constant-indexed: promoted to registers (accumulators)."""
    SHARED = "shared"
    """GPU: shared by the threads of a block."""
    FRAGMENT = "fragment"
    """GPU: a warp-level matrix fragment (WMMA/MMA)."""


class LoopKind(enum.Enum):
    """How a loop is executed."""

    SERIAL = "for"
    PARALLEL = "parallel"
    """Iterations spread over CPU threads (GOMP_parallel with an outlined body)."""
    VECTORIZED = "vectorized"
    """One SIMD vector; the extent is the vector width."""
    UNROLLED = "unrolled"
    BLOCK_X = "blockIdx.x"
    BLOCK_Y = "blockIdx.y"
    BLOCK_Z = "blockIdx.z"
    THREAD_X = "threadIdx.x"
    THREAD_Y = "threadIdx.y"
    THREAD_Z = "threadIdx.z"
    WARP = "warp"

    @property
    def is_gpu(self) -> bool:
        """True for GPU block/thread/warp bindings."""
        return self not in (LoopKind.SERIAL, LoopKind.PARALLEL, LoopKind.VECTORIZED,
                            LoopKind.UNROLLED)


@dataclass(frozen=True)
class Buffer:
    """A named, statically shaped, row-major array."""

    name: str
    shape: tuple[int, ...]
    dtype: DType
    scope: Scope = Scope.GLOBAL

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of storage."""
        return self.size * self.dtype.itemsize

    @property
    def strides(self) -> tuple[int, ...]:
        """Row-major strides in elements."""
        out, acc = [], 1
        for d in reversed(self.shape):
            out.append(acc)
            acc *= d
        return tuple(reversed(out))

    def __str__(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


@dataclass(frozen=True)
class BufLoad(Expr):
    """`buf[i, j]`: an element of a buffer."""

    buffer: Buffer
    indices: tuple[Expr, ...]

    def children(self) -> tuple[Expr, ...]:
        return self.indices

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return BufLoad(self.buffer, children)


@dataclass(frozen=True)
class Clamp(Expr):
    """An index `x` of a padded tile: equals `x` when `x <= hi`; beyond, some in-bounds index
    whose value does not matter (the lane or row is never stored). Scalar code computes
    `min(x, hi)`; vector code turns it into a masked load."""

    x: Expr
    hi: int

    def children(self) -> tuple[Expr, ...]:
        return (self.x,)

    def rebuild(self, children: tuple[Expr, ...]) -> Expr:
        return Clamp(children[0], self.hi)


class Stmt:
    """Base of loop-IR statements (frozen dataclasses)."""

    def children(self) -> tuple[Stmt, ...]:
        """Nested statements."""
        return ()

    def walk(self) -> Iterator[Stmt]:
        """This statement and every nested one, parents first."""
        yield self
        for c in self.children():
            yield from c.walk()


@dataclass(frozen=True)
class Seq(Stmt):
    """Statements in order."""

    body: tuple[Stmt, ...]

    def children(self) -> tuple[Stmt, ...]:
        return self.body


@dataclass(frozen=True)
class For(Stmt):
    """`for var in 0..extent` of a kind; `extent` may depend on outer loop variables."""

    var: str
    extent: Expr
    kind: LoopKind
    body: Stmt

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)

    @property
    def const_extent(self) -> int | None:
        """The extent when it is a constant."""
        return int(self.extent.value) if isinstance(self.extent, Const) else None


@dataclass(frozen=True)
class Store(Stmt):
    """`buf[idx] = value`, or with `reduce` (sum/max/min/prod) `buf[idx] op= value`.

    A reducing store may be reassociated (fast-math) and, inside a vectorized loop whose lanes
    all hit the same element, becomes a horizontal reduction."""

    buffer: Buffer
    indices: tuple[Expr, ...]
    value: Expr
    reduce: str | None = None


@dataclass(frozen=True)
class If(Stmt):
    """A guard; inside a vectorized loop a lane-dependent condition masks the stores."""

    cond: Expr
    then: Stmt
    orelse: Stmt | None = None

    def children(self) -> tuple[Stmt, ...]:
        return (self.then,) if self.orelse is None else (self.then, self.orelse)


@dataclass(frozen=True)
class Allocate(Stmt):
    """A buffer that exists while `body` runs."""

    buffer: Buffer
    body: Stmt

    def children(self) -> tuple[Stmt, ...]:
        return (self.body,)


@dataclass(frozen=True)
class Barrier(Stmt):
    """GPU: synchronise the threads of a block (or a warp)."""

    scope: str = "block"


@dataclass(frozen=True)
class LoopFunc:
    """A kernel: `params` are global buffers, outputs first (`n_outputs` of them)."""

    name: str
    params: tuple[Buffer, ...]
    n_outputs: int
    body: Stmt

    @property
    def workspace_buffers(self) -> list[Buffer]:
        """Global-scope allocations, carved out of the caller's workspace."""
        return [s.buffer for s in self.body.walk()
                if isinstance(s, Allocate) and s.buffer.scope is Scope.GLOBAL]

    @property
    def workspace_bytes(self) -> int:
        """Bytes of workspace the caller provides (each slice 64-byte aligned)."""
        return sum(_round_up(b.nbytes, 64) for b in self.workspace_buffers)


def stmt_cost(s: Stmt) -> float:
    """Roughly the LLVM instructions a statement emits: an unrolled loop repeats its body, a
    loop costs its body once plus its control, a store its expression nodes."""
    if isinstance(s, Seq):
        return sum(stmt_cost(c) for c in s.body)
    if isinstance(s, For):
        c = s.const_extent
        body = stmt_cost(s.body)
        return body * c if s.kind is LoopKind.UNROLLED and c is not None else body + 4
    if isinstance(s, Store):
        return 2.0 + sum(1 for _ in s.value.walk()) + sum(
            sum(1 for _ in i.walk()) for i in s.indices)
    if isinstance(s, If):
        return 2 + stmt_cost(s.then) + (0 if s.orelse is None else stmt_cost(s.orelse))
    if isinstance(s, Allocate):
        return 1 + stmt_cost(s.body)
    return 1.0


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


# ---------------------------------------------------------------------------------------------
# rewriting


def map_exprs(s: Stmt, ex: Callable[[Expr], Expr]) -> Stmt:
    """`s` with `ex` applied to every expression and loop extent."""
    if isinstance(s, Seq):
        return Seq(tuple(map_exprs(c, ex) for c in s.body))
    if isinstance(s, For):
        return For(s.var, ex(s.extent), s.kind, map_exprs(s.body, ex))
    if isinstance(s, Store):
        return Store(s.buffer, tuple(ex(i) for i in s.indices), ex(s.value), s.reduce)
    if isinstance(s, If):
        return If(ex(s.cond), map_exprs(s.then, ex),
                  None if s.orelse is None else map_exprs(s.orelse, ex))
    if isinstance(s, Allocate):
        return Allocate(s.buffer, map_exprs(s.body, ex))
    return s


def map_stmt(s: Stmt, mapping: dict[str, Expr]) -> Stmt:
    """`s` with index variables replaced (in every expression and loop extent)."""
    return map_exprs(s, lambda e: substitute_indices(e, mapping))


def strip_clamps(s: Stmt) -> Stmt:
    """`s` with every `Clamp(x, hi)` replaced by `x` (where no index can overshoot)."""
    def ex(e: Expr) -> Expr:
        return e.map(lambda x: ex(x.x) if isinstance(x, Clamp) else None)
    return map_exprs(s, ex)


def unique_name(hint: str | None, used: set[str], default: str) -> str:
    """A name for a buffer or loop from `hint` (made an identifier; `default` when empty) that
    is not in `used`, which it joins (`acc`, `acc_1`, ...)."""
    base = re.sub(r"[^A-Za-z0-9_]", "_", hint or "") or default
    if base[0].isdigit():
        base = f"{default}{base}"
    name, n = base, 1
    while name in used:
        name, n = f"{base}_{n}", n + 1
    used.add(name)
    return name


# ---------------------------------------------------------------------------------------------
# printing

_PREC = {"or": 1, "and": 2, "<": 4, "<=": 4, ">": 4, ">=": 4, "==": 4, "!=": 4,
         "+": 5, "-": 5, "*": 6, "/": 6, "//": 6, "%": 6}


def format_expr(e: Expr, ctx: int = 0) -> str:
    """A loop-IR expression as text."""
    if isinstance(e, Const):
        return format_const(e) if not (isinstance(e.value, int | float) and e.value < 0
                                       and ctx > 6) else f"({format_const(e)})"
    if isinstance(e, Index):
        return e.name
    if isinstance(e, BufLoad):
        return f"{e.buffer.name}[{', '.join(format_expr(i) for i in e.indices)}]"
    if isinstance(e, Clamp):
        return f"clamp({format_expr(e.x)}, {e.hi})"
    if isinstance(e, Binary):
        p = _PREC[e.op]
        text = f"{format_expr(e.a, p)} {e.op} {format_expr(e.b, p + 1)}"
        return f"({text})" if p < ctx else text
    if isinstance(e, Unary):
        text = f"-{format_expr(e.x, 7)}" if e.op == "neg" else f"not {format_expr(e.x, 3)}"
        return f"({text})" if ctx > 3 else text
    if isinstance(e, Call):
        return f"{e.fn}({', '.join(format_expr(a) for a in e.args)})"
    if isinstance(e, Select):
        return f"select({format_expr(e.cond)}, {format_expr(e.a)}, {format_expr(e.b)})"
    if isinstance(e, Cast):
        return f"{e.dtype}({format_expr(e.x)})"
    raise TypeError(f"unknown loop-IR expression {e!r}")


_REDUCE_OP = {"sum": "+=", "prod": "*=", "max": "max=", "min": "min="}


def _stmt_lines(s: Stmt, indent: str) -> list[str]:
    if isinstance(s, Seq):
        return [line for c in s.body for line in _stmt_lines(c, indent)]
    if isinstance(s, For):
        head = f"{indent}{s.kind.value} {s.var} in 0..{format_expr(s.extent)} {{"
        return [head, *_stmt_lines(s.body, indent + "  "), indent + "}"]
    if isinstance(s, Store):
        op = "=" if s.reduce is None else _REDUCE_OP[s.reduce]
        idx = ", ".join(format_expr(i) for i in s.indices)
        return [f"{indent}{s.buffer.name}[{idx}] {op} {format_expr(s.value)}"]
    if isinstance(s, If):
        lines = [f"{indent}if {format_expr(s.cond)} {{", *_stmt_lines(s.then, indent + "  ")]
        if s.orelse is not None:
            lines += [indent + "} else {", *_stmt_lines(s.orelse, indent + "  ")]
        return [*lines, indent + "}"]
    if isinstance(s, Allocate):
        b = s.buffer
        return [f"{indent}alloc {b.name}: {b} {b.scope.value} {{",
                *_stmt_lines(s.body, indent + "  "), indent + "}"]
    if isinstance(s, Barrier):
        return [f"{indent}barrier {s.scope}"]
    if hasattr(s, "text"):  # a backend's own leaf statement (nfc.codegen.cuda.gpuir)
        return [indent + s.text()]
    raise TypeError(f"unknown loop-IR statement {s!r}")


def print_loops(f: LoopFunc | Stmt) -> str:
    """The text of a kernel (or a statement) for golden tests; ends with a newline."""
    if isinstance(f, Stmt):
        return "\n".join(_stmt_lines(f, "")) + "\n"
    params = []
    for n, b in enumerate(f.params):
        role = "out" if n < f.n_outputs else "in"
        params.append(f"{b.name}: {b} {role}")
    head = f"kernel @{f.name}({', '.join(params)})"
    if f.workspace_bytes:
        head += f" workspace {f.workspace_bytes}"
    return "\n".join([head + " {", *_stmt_lines(f.body, "  "), "}"]) + "\n"
