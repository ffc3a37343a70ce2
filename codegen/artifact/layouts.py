"""Laid-out parameters in the artifact (`parallel-fusion{layout=true}`): the optimizer state
of a laid-out parameter laid out like it, and the metadata's `views` of every part.

A parameter made by concatenating sibling weights carries `nf.layout = {parts, axis, offsets,
inits}`; outside the artifact each part keeps the name the unfused build gives it. A parameter
stored blocked by the `layout` pass carries `nf.layout = {kind = "blocked", shape, dims,
block}` (nfc.blocked); outside the artifact it keeps its name and logical shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nfc.blocked import BLOCKED, check_blocked, is_blocked
from nfc.codegen.artifact.initgen import layout_parts
from nfc.diagnostics import CompileError, error

if TYPE_CHECKING:
    from nfc.codegen.artifact.metadata import TensorInfo

__all__ = ["check_part_names", "state_layouts", "tensor_views"]


def state_layouts(tensors: list[TensorInfo]) -> list[TensorInfo]:
    """The optimizer state of a laid-out parameter `p` (`p_m`, `p_v`, `p_mom`: the names
    training-functions gives it, with p's type) laid out like it, with the parts' state
    names (`wq_m`, ...), so it is shown and checkpointed as the unfused build's."""
    tensors = [_named_blocked(t) for t in tensors]
    laid = {t.name: t for t in tensors if t.layout is not None and t.role == "param"}
    if not laid:
        return tensors
    out = []
    for t in tensors:
        if t.role == "opt_state" and t.layout is None:
            for pname, pt in laid.items():
                suffix = t.name[len(pname) + 1:] if t.name.startswith(pname + "_") else ""
                if suffix in ("m", "v", "mom") and pt.type == t.type and is_blocked(pt.layout):
                    t = _named_blocked(replace(t, layout={
                        k: v for k, v in (pt.layout or {}).items() if k not in ("name", "init")}))
                    break
                if suffix in ("m", "v", "mom") and pt.type == t.type:
                    lay = pt.layout or {}
                    t = replace(t, layout={
                        "parts": [f"{q}_{suffix}" for q in lay["parts"]],
                        "axis": lay["axis"], "offsets": list(lay["offsets"]),
                        "inits": [t.init for _ in lay["parts"]]})
                    break
        out.append(t)
    return out


def _named_blocked(t: TensorInfo) -> TensorInfo:
    """A tensor stored blocked (the `layout` pass) with its layout checked against its shape
    and completed by the name and initializer its logical form is drawn with."""
    if not is_blocked(t.layout):
        return t
    lay = dict(t.layout or {})
    try:
        check_blocked(lay, t.type.shape)
    except ValueError as exc:
        raise CompileError(error(f"'{t.name}': {exc}").diagnostics) from None
    lay.setdefault("name", t.name)
    lay.setdefault("init", t.init)
    return replace(t, layout=lay)


def tensor_views(tensors: Sequence[TensorInfo]) -> list[dict[str, Any]]:
    """The metadata's `views`: per part of a laid-out tensor its name, parent, axis, offset
    and shape (the names the unfused build gives these tensors); a tensor stored blocked
    (the `layout` pass) is one view of itself by its own name with `kind = "blocked"`, its
    logical `shape`, the blocked `dims`, the dims `split` in place and the `block`."""
    views = []
    for t in tensors:
        if t.layout is None:
            continue
        if is_blocked(t.layout):
            views.append({"name": t.name, "parent": t.name, "kind": BLOCKED,
                          "shape": [int(n) for n in t.layout["shape"]],
                          "dims": [int(d) for d in t.layout["dims"]],
                          "split": [int(d) for d in t.layout.get("split", ())],
                          "block": int(t.layout["block"])})
            continue
        for name, _init, shape, off, _size in layout_parts(t.type.shape, t.layout):
            views.append({"name": name, "parent": t.name, "axis": int(t.layout["axis"]),
                          "offset": off, "shape": list(shape)})
    return views


def check_part_names(tensors: Sequence[TensorInfo]) -> None:
    """A part's name names one tensor (`named_tensors`, checkpoints): refuse a part named like
    another tensor or part."""
    seen = {t.name for t in tensors}
    for t in tensors:
        for part in (t.layout or {}).get("parts", ()):
            if part in seen:
                raise CompileError(error(f"'{t.name}': nf.layout part '{part}' is the name "
                                         "of another tensor or part").diagnostics)
            seen.add(part)
