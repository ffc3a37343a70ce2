"""Blocked tensor layouts (`layout` pass): the shape arithmetic and the numpy pack/unpack.

A tensor of logical shape `L` blocked along dims `D` (in the order of its inner blocks) with
block `b` is stored with shape `[L[k] // b if k in D else L[k] for k] + [b for d in D]`: the
logical element `t[i_0, .., i_r]` lives at `s[.., i_k // b (k in D), .., i_d % b (d in D)]`.
`NCHW` blocked along `C` is `NCHW[c]c`; a convolution weight `OIHW` blocked along `I, O`
(dims `[1, 0]`) is `O/b I/b H W [i] [o]`.

A dim may instead be split in place (`split`): `[.., L[k] // b, b, ..]`, a reshape that moves
nothing (a dense weight `W[K, M]` read with `K` split as `W[K/b, b, M]`).

The layout attribute of a parameter stored so (`nf.layout` on a function argument) is
`{kind = "blocked", shape = L, dims = D, block = b}` (with `split = S` when there are such
dims).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

__all__ = ["BLOCKED", "blocked_index_map", "blocked_shape", "check_blocked", "is_blocked",
           "pack", "unpack"]

#: The `kind` of a blocked `nf.layout`.
BLOCKED = "blocked"


def is_blocked(layout: object) -> bool:
    """Whether `layout` (an `nf.layout` attribute or a metadata entry) is a blocked layout."""
    return isinstance(layout, Mapping) and layout.get("kind") == BLOCKED


def blocked_shape(shape: Sequence[int], dims: Sequence[int], block: int,
                  split: Sequence[int] = ()) -> tuple[int, ...]:
    """The stored shape of a tensor of logical `shape` blocked along `dims` (inner blocks
    moved to the end) and `split` (inner blocks kept in place) by `block`."""
    out: list[int] = []
    for k, n in enumerate(shape):
        if k in dims:
            out.append(n // block)
        elif k in split:
            out += [n // block, block]
        else:
            out.append(n)
    return tuple(out) + tuple(block for _ in dims)


def _fields(layout: Mapping[str, Any]) -> tuple[tuple[int, ...], tuple[int, ...], int,
                                                 tuple[int, ...]]:
    shape = tuple(int(n) for n in layout["shape"])
    dims = tuple(int(d) for d in layout["dims"])
    block = int(layout["block"])
    split = tuple(int(d) for d in layout.get("split", ()))
    return shape, dims, block, split


def check_blocked(layout: Mapping[str, Any], stored: Sequence[int]) -> tuple[
        tuple[int, ...], tuple[int, ...], int, tuple[int, ...]]:
    """`(logical shape, dims, block, split)` of a blocked layout; ValueError when it is
    malformed or does not describe a tensor of shape `stored`."""
    try:
        shape, dims, block, split = _fields(layout)
    except (KeyError, TypeError, ValueError):
        raise ValueError("a blocked nf.layout needs shape, dims and block") from None
    both = dims + split
    if block < 1 or not both or len(set(both)) != len(both) or any(
            not 0 <= d < len(shape) or shape[d] % block for d in both):
        raise ValueError(f"blocked nf.layout: dims {list(both)} of {list(shape)} cannot be "
                         f"blocked by {block}")
    if blocked_shape(shape, dims, block, split) != tuple(stored):
        raise ValueError(f"blocked nf.layout of {list(shape)} (dims {list(dims)}, split "
                         f"{list(split)}, block {block}) does not give the tensor's shape "
                         f"{list(stored)}")
    return shape, dims, block, split


def _split(layout: Mapping[str, Any]) -> tuple[list[int], list[int]]:
    """The logical tensor reshaped with each blocked dim split in (outer, inner), and the
    permutation of that reshape giving the stored order."""
    shape, dims, block, split = _fields(layout)
    sizes: list[int] = []
    order: list[int] = []
    inner_pos: dict[int, int] = {}
    for k, n in enumerate(shape):
        if k in dims or k in split:
            order.append(len(sizes))
            if k in split:
                order.append(len(sizes) + 1)
            inner_pos[k] = len(sizes) + 1
            sizes += [n // block, block]
        else:
            order.append(len(sizes))
            sizes.append(n)
    return sizes, order + [inner_pos[d] for d in dims]


def pack(arr: np.ndarray, layout: Mapping[str, Any]) -> np.ndarray:
    """The logical array `arr` in the blocked layout (a new array)."""
    sizes, perm = _split(layout)
    return np.ascontiguousarray(np.asarray(arr).reshape(sizes).transpose(perm))


def unpack(arr: np.ndarray, layout: Mapping[str, Any]) -> np.ndarray:
    """The blocked array `arr` in its logical layout (a new array)."""
    shape = _fields(layout)[0]
    sizes, perm = _split(layout)
    inv = [0] * len(perm)
    for k, p in enumerate(perm):
        inv[p] = k
    return np.ascontiguousarray(
        np.asarray(arr).reshape([sizes[p] for p in perm]).transpose(inv).reshape(shape))


def blocked_index_map(layout: Mapping[str, Any]) -> list[tuple[int, int, int, int]]:
    """The stored position of logical element `i` (row-major) as terms `(div, mod, q, stride)`:
    position = sum over terms of `((i // div) % mod) // q * stride` when `q > 0`, or of
    `((i // div) % mod) % -q * stride` when `q < 0` (`q = 1`: the digit itself)."""
    shape, dims, block, split = _fields(layout)
    sizes, perm = _split(layout)
    stored = [sizes[p] for p in perm]
    strides = [math.prod(stored[k + 1:]) for k in range(len(stored))]
    where = {p: k for k, p in enumerate(perm)}  # split position -> stored position
    terms = []
    pos = 0
    for k, n in enumerate(shape):
        div = math.prod(shape[k + 1:])
        if k in dims or k in split:
            terms.append((div, n, block, strides[where[pos]]))
            terms.append((div, n, -block, strides[where[pos + 1]]))
            pos += 2
        else:
            terms.append((div, n, 1, strides[where[pos]]))
            pos += 1
    return terms
