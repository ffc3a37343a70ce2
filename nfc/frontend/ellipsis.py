"""Rank polymorphism: `...` for the leading dimensions of an op's tensors.

    op layer_norm<eps: float = 1e-5>(x: T[..., D], g: T[D], b: T[D]) -> T[..., D] {
      mu[...] = (sum(d) x[..., d]) / D
      y[..., d] = (x[..., d] - mu[...]) * ...
    }

First in a type, `...` matches any number (zero included) of leading dimensions; every `...`
of a call binds the same dimensions. First in a comprehension's index list it stands for as
many output indices, ranging over those dimensions; first in a subscript of that
comprehension it stands for the same indices. The elaborator keeps the bound dimensions under
the name ELLIPSIS in the op's environment.
"""

from __future__ import annotations

import dataclasses

from nfc.diagnostics import error
from nfc.frontend import ast

#: The name under which a call binds the leading dimensions (not a valid identifier).
ELLIPSIS = "..."

#: What `...` may be, for diagnostics.
WHERE = ("'...' stands for leading dimensions: write it first in an op's parameter type "
         "`x: T[..., D]`, in an index list `y[..., d] = ...` and in a subscript `x[..., d]`")


def leading(t: ast.TypeExpr) -> bool:
    """Whether a type starts with `...`."""
    return bool(t.dims) and isinstance(t.dims[0], ast.EllipsisExpr)


def ellipsis_names(count: int) -> list[str]:
    """Surface names of the indices `...` stands for (not writable by users)."""
    return [f"{ELLIPSIS}{k}" for k in range(count)]


def ir_name(name: str, count: int) -> str:
    """The IR name of one of them: `n` alone (the usual batch index), else n0, n1, ..."""
    k = int(name[len(ELLIPSIS):])
    return "n" if count == 1 else f"n{k}"


def type_errors(t: ast.TypeExpr) -> list[tuple[ast.EllipsisExpr, str]]:
    """The misplaced `...` of a type, with a message (the first dimension is its place)."""
    bad = []
    for k, d in enumerate(t.dims):
        stack = [d]
        while stack:
            x = stack.pop()
            if isinstance(x, ast.EllipsisExpr) and (k > 0 or x is not d):
                msg = ("'...' appears twice in a type; one '...' stands for all the leading "
                       "dimensions" if leading(t) else
                       "'...' may only be the first dimension of a type (it stands for the "
                       "leading dimensions)")
                bad.append((x, msg))
            stack.extend(x.children())
    return bad


def expand(e: ast.Expr, names: list[str] | None) -> ast.Expr:
    """`e` with every subscript `x[..., i]` written `x[n0, n1, i]` for the index names
    `names` (None: the left-hand side has no `...`, so a subscript with one is an error)."""
    if isinstance(e, ast.EllipsisExpr):
        raise error(WHERE, e.loc)
    if isinstance(e, ast.Subscript) and e.indices and isinstance(e.indices[0],
                                                                  ast.EllipsisExpr):
        if names is None:
            raise error("'...' in a subscript stands for the '...' indices of the left-hand "
                        "side, which has none: write `y[..., d] = x[..., d]`", e.indices[0].loc)
        lead = tuple(ast.Name(e.indices[0].loc, n) for n in names)
        rest = tuple(expand(ix, names) for ix in e.indices[1:])
        return dataclasses.replace(e, indices=lead + rest)
    if isinstance(e, ast.BinOp | ast.BoolOp):  # a loop along the chain: chains may be long
        first, links = ast.chain(e)
        acc = expand(first, names)
        for link in links:
            b = expand(link.b, names)
            acc = link if acc is link.a and b is link.b else dataclasses.replace(link, a=acc, b=b)
        return acc
    changes = {}
    for f in dataclasses.fields(e):
        v = getattr(e, f.name)
        if isinstance(v, ast.Expr):
            new = expand(v, names)
            if new is not v:
                changes[f.name] = new
        elif isinstance(v, tuple) and v and all(isinstance(x, ast.Expr) for x in v):
            items = tuple(expand(x, names) for x in v)
            if any(a is not b for a, b in zip(items, v, strict=True)):
                changes[f.name] = items
    return dataclasses.replace(e, **changes) if changes else e


def lhs_errors(indices: tuple[ast.LhsIndex, ...]) -> list[ast.LhsIndex]:
    """The `...` of an index list that are not first."""
    return [ix for k, ix in enumerate(indices) if ix.name == ELLIPSIS and k > 0]
