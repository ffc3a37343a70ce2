"""Limits that keep the frontend's time and memory bounded on hostile input.

Each limit is refused with a located diagnostic, never a hang or a crash.
"""

from __future__ import annotations

from nfc.diagnostics import error
from nfc.ir import MAX_ELEMENTS, Loc

#: Largest source file read, in bytes.
MAX_SOURCE_BYTES = 16 * 1024 * 1024
#: Deepest nesting of brackets and of expressions.
MAX_NESTING = 200
#: Most statements elaborated for one compilation (loops unrolled, ops inlined).
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
