"""Laid-out parameters in the artifact (`parallel-fusion{layout=true}`): the optimizer state
of a laid-out parameter laid out like it, and the metadata's `views` of every part.

A parameter made by concatenating sibling weights carries `nf.layout = {parts, axis, offsets,
inits}`; outside the artifact each part keeps the name the unfused build gives it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from nfc.codegen.artifact.initgen import layout_parts
from nfc.diagnostics import CompileError, error

if TYPE_CHECKING:
    from nfc.codegen.artifact.metadata import TensorInfo

__all__ = ["check_part_names", "state_layouts", "tensor_views"]


def state_layouts(tensors: list[TensorInfo]) -> list[TensorInfo]:
    """The optimizer state of a laid-out parameter `p` (`p_m`, `p_v`, `p_mom`: the names
    training-functions gives it, with p's type) laid out like it, with the parts' state
    names (`wq_m`, ...), so it is shown and checkpointed as the unfused build's."""
    laid = {t.name: t for t in tensors if t.layout is not None and t.role == "param"}
    if not laid:
        return tensors
    out = []
    for t in tensors:
        if t.role == "opt_state" and t.layout is None:
            for pname, pt in laid.items():
                suffix = t.name[len(pname) + 1:] if t.name.startswith(pname + "_") else ""
                if suffix in ("m", "v", "mom") and pt.type == t.type:
                    lay = pt.layout or {}
                    t = replace(t, layout={
                        "parts": [f"{q}_{suffix}" for q in lay["parts"]],
                        "axis": lay["axis"], "offsets": list(lay["offsets"]),
                        "inits": [t.init for _ in lay["parts"]]})
                    break
        out.append(t)
    return out


def tensor_views(tensors: Sequence[TensorInfo]) -> list[dict[str, Any]]:
    """The metadata's `views`: per part of a laid-out tensor its name, parent, axis, offset
    and shape (the names the unfused build gives these tensors)."""
    views = []
    for t in tensors:
        if t.layout is None:
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
