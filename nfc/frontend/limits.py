"""Limits that keep the frontend's time and memory bounded on hostile input.

Each limit is refused with a located diagnostic, never a hang or a crash. Fixed limits protect
the compiler itself (stack depth, number sizes); the *budgets* (`Budget`) bound what a program
asks for (statements after unrolling, iteration points of a compute, bytes of parameters and of
tensors) and can be raised with an environment variable that every message names. Budgets are
checked before the work they bound: a loop is estimated before it is unrolled, a compute is
measured before it is emitted, a declaration before it is made.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nfc.diagnostics import CompileError, Diagnostic, error
from nfc.ir import MAX_ELEMENTS, Loc

#: Largest source file read, in bytes.
MAX_SOURCE_BYTES = 16 * 1024 * 1024
#: Deepest nesting of brackets and of expressions. Continuing a left-associative chain of
#: operators of one precedence level (`a + b - c + d`, `a * b / c`, `p and q and r`) does not
#: nest: such chains may be as long as the source allows.
MAX_NESTING = 200
#: Deepest scalar expression the frontend emits into one compute: a longer operator chain is
#: split, its first part becoming a compute of its own (passes and code generators walk
#: expressions recursively).
MAX_EXPR_DEPTH = 64
#: Deepest subscript or condition of `a if c else b` (and weakly typed value), which cannot be
#: split that way (an index would become data, a guard would lose the facts of the bounds
#: proof): deeper ones are refused.
MAX_KEPT_DEPTH = 128
#: Default of the budget of statements elaborated for one compilation (loops unrolled, ops
#: inlined); see STATEMENTS.
MAX_UNROLLED = 1_000_000
#: Deepest chain of op calls being inlined.
MAX_CALL_DEPTH = 100
#: Largest number of elements of any tensor (the IR's limit).
MAX_TENSOR_ELEMENTS = MAX_ELEMENTS
#: Longest integer literal, in digits (Python refuses to convert very long ones).
MAX_INT_DIGITS = 30
#: Largest magnitude of a compile-time integer; beyond it arithmetic is refused, so that
#: repeated multiplication cannot build enormous numbers.
MAX_CT_INT = 1 << 62

_OPEN = {"(": ")", "[": "]", "{": "}"}


def check_size(text: str, file: str) -> None:
    """Refuse sources larger than MAX_SOURCE_BYTES."""
    if len(text) > MAX_SOURCE_BYTES:
        raise error(f"source file is {len(text)} bytes, more than the limit of "
                    f"{MAX_SOURCE_BYTES}", Loc(file, 1, 1))


def check_nesting(text: str, file: str) -> None:
    """Refuse bracket nesting deeper than MAX_NESTING before the parser sees the text.

    Brackets in comments are skipped. Unbalanced brackets are left to the parser, which
    reports them better.
    """
    if sum(text.count(c) for c in _OPEN) <= MAX_NESTING:
        return
    depth = 0
    line, col = 1, 0
    in_comment = False
    for ch in text:
        col += 1
        if ch == "\n":
            line, col, in_comment = line + 1, 0, False
            continue
        if in_comment:
            continue
        if ch == "#":
            in_comment = True
        elif ch in _OPEN:
            depth += 1
            if depth > MAX_NESTING:
                raise error(f"brackets nested more than {MAX_NESTING} deep", Loc(file, line, col))
        elif ch in ")]}":
            depth = max(0, depth - 1)


def check_elements(shape: tuple[int, ...], what: str, loc: Loc | None) -> None:
    """Refuse shapes with non-positive dimensions or more than MAX_TENSOR_ELEMENTS elements."""
    for d, n in enumerate(shape):
        if n <= 0:
            raise error(f"{what} has size {n} in dimension {d}; sizes must be positive", loc)
    size = 1
    for n in shape:
        size *= n
        if size > MAX_TENSOR_ELEMENTS:
            break
    if size > MAX_TENSOR_ELEMENTS:
        dims = ", ".join(str(n) for n in shape)
        raise error(f"{what} of shape [{dims}] has more than 2^40 elements "
                    "(the limit of this compiler)", loc)


# ---------------------------------------------------------------------------------------------
# budgets


@dataclass(frozen=True)
class Budget:
    """A resource budget with a default, raised by setting the environment variable `env`."""

    env: str
    default: int
    what: str
    """What is counted, for messages: "statements after unrolling loops and inlining ops"."""

    def value(self) -> int:
        """The budget in force: `env` when set (a positive integer), else the default."""
        text = os.environ.get(self.env)
        if text is None or not text.strip():
            return self.default
        try:
            v = int(text.strip().replace("_", ""))
        except ValueError:
            v = 0
        if v <= 0:
            raise CompileError([Diagnostic(
                "error", f"environment variable {self.env} must be a positive integer "
                f"(the budget of {self.what}), not '{text[:40]}'")])
        return v

    def hint(self) -> str:
        """How to raise the budget, for the end of a message."""
        return f"set {self.env} to raise it"


#: Statements elaborated for one function: every statement of every unrolled iteration and
#: inlined op body, and each loop iteration itself.
STATEMENTS = Budget("NFC_MAX_STATEMENTS", MAX_UNROLLED,
                    "statements after unrolling loops and inlining ops")
#: Iteration points of one compute: the product of its output and reduction extents (a
#: matmul [n, m] sum [k] has n*m*k points). 1e11 points take seconds even on a GPU.
POINTS = Budget("NFC_MAX_POINTS", 10**11, "iteration points of one compute")
#: Bytes of a model's trained parameters (`param`).
PARAM_BYTES = Budget("NFC_MAX_PARAM_BYTES", 32 << 30, "bytes of parameters")
#: Bytes of every tensor of one function, counted without reuse: arguments (inputs,
#: parameters, state) and the result of every compute the frontend emits.
TENSOR_BYTES = Budget("NFC_MAX_TENSOR_BYTES", 256 << 30, "bytes of tensors")


def human_bytes(n: int) -> str:
    """`34359738368 bytes (32 GiB)`."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift:
            v = n / (1 << shift)
            shown = f"{v:.0f}" if v >= 100 or v == int(v) else f"{v:.1f}"
            return f"{n} bytes ({shown} {unit})"
    return f"{n} bytes"
