"""Compressed saved activations: keep what the backward pass needs of a forward value in a
smaller form (docs/memory.md).

**Masks (exact).** A ReLU's backward reads its input only to ask whether it was positive:
`select(%a[n, m] > 0.0, %g[n, m], 0.0)`. When every backward reader uses a saved value only in
one comparison with a constant, the pass computes that comparison once in the forward pass,
right after the value, as a boolean tensor (`i1`, one byte per element instead of four), and
the backward readers read the mask instead. The value itself then dies with its last forward
reader. The results are bit for bit the same.

Before:  %a = nf.compute [n: 64, m: 128] (%0[n, m] + %b[m])
         %h = nf.compute [n: 64, m: 128] (max(%a[n, m], 0.0))
         ...
         %d_a = nf.compute [n: 64, m: 128] (select(%a[n, m] > 0.0, %d_h[n, m], 0.0))
                {nf.phase = "backward"}
After:   %a = ...; %a_mask = nf.compute [n: 64, m: 128] (%a[n, m] > 0.0)
                {nf.compress = "mask"} : tensor<64x128xi1>
         %h = ...
         %d_a = nf.compute [n: 64, m: 128] (select(%a_mask[n, m], %d_h[n, m], 0.0))

**Narrow storage (lossy, opt-in).** With `dtype = "bf16"` (or `"f16"`), saved f32 activations
that the backward pass only multiplies into sums (the inputs of weight gradients: im2col
columns, a dense layer's input; `narrow_ok`) are stored rounded to 16 bits:
`%v_h = nf.compute (bf16(%v[...]))` after the value, and the backward readers read
`f32(%v_h[...])`. The forward pass is unchanged; the gradients
see activations rounded to 8 (bf16) or 11 (f16) significant bits. docs/memory.md has the effect
on the loss.

Each change is kept only if it does not raise the arena's lower bound (`memplan.lower_bound`:
a mask or a narrow copy lives beside its value until the value's last forward reader); then,
with the build's memory model (`Context.memory_model`, as `remat` uses it), the whole result is
kept only if the measured arena is not larger than without the pass. Run it after `cse` and
before `remat` and `fuse` (`nfc compile --compress-activations` puts it there):

    nfc compile model.nf -p 'im2col,training-functions,inline,canonicalize,cse,dce,
                             compress-activations,apply-tuning,fuse'
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import ComputeOp, DType, Func, Module, TensorType, Value
from nfc.ir.expr import Binary, Cast, Const, Expr, Index, Load
from nfc.passes.memplan import (
    LATE_PHASES,
    MemoryReport,
    function_buffers,
    lower_bound,
    memory_report,
)
from nfc.passmanager import Context, ModulePass

COMPARES = ("<", "<=", ">", ">=", "==", "!=")


def _late(op) -> bool:
    return op.attrs.get("nf.phase") in LATE_PHASES


def _saved_computes(func: Func) -> list[tuple[ComputeOp, list[ComputeOp]]]:
    """Forward computes whose value late computes read (and the function does not return),
    with those readers; None when a late reader is not a compute."""
    returned = {id(v) for v in func.ret.values}
    out = []
    for op in func.body.ops:
        if not isinstance(op, ComputeOp) or _late(op) or op.attrs.get("nf.compress"):
            continue
        v = op.result
        if id(v) in returned:
            continue
        late = [u for u in v.uses if _late(u)]
        if late and all(isinstance(u, ComputeOp) for u in late):
            out.append((op, list(dict.fromkeys(late))))
    return out


def mask_test(value: Value, readers: list[ComputeOp]) -> tuple[str, Const, bool] | None:
    """(comparison, constant, value on the left) when every load of `value` in `readers`
    is one side of the same comparison with the same constant; else None."""
    seen: set[tuple[str, Const, bool]] = set()
    for op in readers:
        total = sum(1 for e in op.body.walk() if isinstance(e, Load) and e.tensor is value)
        found = 0
        for e in op.body.walk():
            if not isinstance(e, Binary) or e.op not in COMPARES:
                continue
            for left, a, b in ((True, e.a, e.b), (False, e.b, e.a)):
                if isinstance(a, Load) and a.tensor is value and isinstance(b, Const):
                    seen.add((e.op, b, left))
                    found += 1
        if found != total:
            return None
    return next(iter(seen)) if len(seen) == 1 else None


def narrow_ok(value: Value, readers: list[ComputeOp]) -> bool:
    """Whether rounding `value` only scales the error of products: every late reader is a
    sum whose every load of `value` is a factor of a `*` (a weight gradient reading the
    saved input, `sum(x[...] * dy[...])`). Values compared (max-pool's argmax), shifted
    (softmax's `exp(y - m)`) or divided are left in f32."""
    for op in readers:
        if op.reduce != "sum":
            return False
        total = sum(1 for e in op.body.walk() if isinstance(e, Load) and e.tensor is value)
        factors = sum(1 for e in op.body.walk() if isinstance(e, Binary) and e.op == "*"
                      for x in (e.a, e.b) if isinstance(x, Load) and x.tensor is value)
        if factors != total:
            return False
    return True


def _with_mask(op: ComputeOp, test: tuple[str, Const, bool]) -> ComputeOp:
    cmp, const, left = test
    here = Load(op.result, tuple(Index(d.name) for d in op.dims))
    body = Binary(cmp, here, const) if left else Binary(cmp, const, here)
    mask = ComputeOp(TensorType(op.result.type.shape, DType.I1), op.dims, body, loc=op.loc,
                     name=f"{op.result.name}_mask" if op.result.name else None)
    for k in ("nf.callsite",):
        if k in op.attrs:
            mask.attrs[k] = op.attrs[k]
    mask.attrs["nf.compress"] = "mask"
    return mask


def _rewrite(reader: ComputeOp, fn) -> None:
    reader.body = reader.body.map(fn)


def compress_mask(func: Func, op: ComputeOp, readers: list[ComputeOp],
                  test: tuple[str, Const, bool]) -> ComputeOp:
    """Insert the mask of `op` after it and make `readers` read it (see the module doc)."""
    mask = _with_mask(op, test)
    func.body.insert_after(mask, op)
    v = op.result
    cmp, const, left = test

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Binary) and e.op == cmp:
            side, other = (e.a, e.b) if left else (e.b, e.a)
            if isinstance(side, Load) and side.tensor is v and other == const:
                return Load(mask.result, side.indices)
        return None

    for r in readers:
        _rewrite(r, fn)
    return mask


def compress_narrow(func: Func, op: ComputeOp, readers: list[ComputeOp], dtype: DType
                    ) -> ComputeOp:
    """Store `op`'s value rounded to `dtype` for `readers` (see the module doc)."""
    v = op.result
    narrow = ComputeOp(TensorType(v.type.shape, dtype), op.dims,
                       Cast(dtype, Load(v, tuple(Index(d.name) for d in op.dims))), loc=op.loc,
                       name=f"{v.name}_{dtype.value}" if v.name else None)
    if "nf.callsite" in op.attrs:
        narrow.attrs["nf.callsite"] = op.attrs["nf.callsite"]
    narrow.attrs["nf.compress"] = dtype.value
    func.body.insert_after(narrow, op)

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Load) and e.tensor is v:
            return Cast(v.type.dtype, Load(narrow.result, e.indices))
        return None

    for r in readers:
        _rewrite(r, fn)
    return narrow


def _undo(func: Func, new: ComputeOp, op: ComputeOp, readers: list[ComputeOp]) -> None:
    v, c = op.result, new.result
    if new.attrs.get("nf.compress") == "mask":
        cmp = new.body
        assert isinstance(cmp, Binary)

        def fn(e: Expr) -> Expr | None:
            if isinstance(e, Load) and e.tensor is c:  # back to the comparison
                here = Load(v, e.indices)
                return (Binary(cmp.op, here, cmp.b) if isinstance(cmp.a, Load)
                        else Binary(cmp.op, cmp.a, here))
            return None
    else:
        def fn(e: Expr) -> Expr | None:
            if isinstance(e, Cast) and isinstance(e.x, Load) and e.x.tensor is c:
                return Load(v, e.x.indices)
            return None

    for r in readers:
        _rewrite(r, fn)
    func.body.ops.remove(new)


def compress_func(func: Func, masks: bool = True, dtype: DType | None = None) -> dict[str, int]:
    """Compress the saved activations of `func` (in place) where that does not raise the
    arena's lower bound; returns {"masks": n, "narrow": n, "bytes": saved bytes no longer kept in
    full}."""
    stats = {"masks": 0, "narrow": 0, "bytes": 0}
    if not any(_late(op) for op in func.body.ops):
        return stats
    bound = lower_bound(function_buffers(func))
    for op, readers in _saved_computes(func):
        v = op.result
        if not v.type.dtype.is_float:
            continue
        test = mask_test(v, readers) if masks else None
        if test is not None:
            new = compress_mask(func, op, readers, test)
            kind = "masks"
        elif dtype is not None and v.type.dtype == DType.F32 and narrow_ok(v, readers):
            new = compress_narrow(func, op, readers, dtype)
            kind = "narrow"
        else:
            continue
        b = lower_bound(function_buffers(func))
        if b <= bound:  # fewer bytes held across the step, the peak no higher
            bound = b
            stats[kind] += 1
            stats["bytes"] += v.type.nbytes
        else:
            _undo(func, new, op, readers)
    return stats


@dataclass(frozen=True)
class CompressActivations(ModulePass):
    """Keep saved activations in a smaller form (see the module doc): `masks` (default true:
    values the backward pass only compares with a constant become `i1` masks, exact) and
    `dtype` (`bf16` or `f16`: saved f32 values the backward pass only multiplies into sums,
    the weight gradients' inputs, stored rounded, lossy; default none).
    Kept only where it does not raise the arena's lower bound, and as a whole only if the measured
    arena (`Context.memory_model`, else the IR level plan) is not larger. Records
    `nf.compress = {masks = n, narrow = n, bytes = b, arena_before = a0, arena_after = a1}`."""

    name: ClassVar[str] = "compress-activations"
    uses_memory_model: ClassVar[bool] = True
    masks: bool = True
    dtype: str = ""

    def apply(self, ctx: Context, module: Module) -> None:
        """Compress in every function with a backward pass."""
        if self.dtype not in ("", "bf16", "f16"):
            ctx.error(f"compress-activations: dtype must be bf16 or f16 (got '{self.dtype}')")
            return
        dtype = DType(self.dtype) if self.dtype else None
        model = getattr(ctx, "memory_model", None) or memory_report
        notes = []
        for f in module.funcs:
            if not f.body.ops or not any(_late(op) for op in f.body.ops):
                continue
            before: MemoryReport = model(f.clone())
            trial = f.clone()
            stats = compress_func(trial, self.masks, dtype)
            if not stats["masks"] and not stats["narrow"]:
                continue
            after: MemoryReport = model(trial.clone())
            if after.arena > before.arena:
                notes.append(f"@{f.name}: not kept (arena {before.arena:,} -> "
                             f"{after.arena:,} bytes)")
                continue
            compress_func(f, self.masks, dtype)  # deterministic: the same as on the trial
            f.attrs["nf.compress"] = {**stats, "arena_before": before.arena,
                                      "arena_after": after.arena}
            notes.append(f"@{f.name}: {stats['masks']} masks, {stats['narrow']} narrowed, "
                         f"arena {before.arena:,} -> {after.arena:,} bytes")
        ctx.remarks[self.name] = "; ".join(notes) or "nothing to compress"



#: `--compress-activations` values: masks only (exact), or masks and 16-bit storage.
MODES = ("masks", "bf16", "f16")


def with_compression(pipeline: str, mode: str = "masks") -> str:
    """`pipeline` with `compress-activations` for `--compress-activations MODE` (`masks`,
    `bf16`, `f16`): set on the pipeline's pass when it has one, else inserted before `remat`
    (before `apply-tuning`, then `fuse`, last without any). Raises ValueError for a bad mode."""
    import dataclasses

    from nfc.passmanager import build_pipeline, format_pipeline

    if mode not in MODES:
        raise ValueError(f"'{mode}' is not a compression mode (one of {', '.join(MODES)})")
    p = CompressActivations(dtype="" if mode == "masks" else mode)
    passes = build_pipeline(pipeline) if pipeline else []
    names = [x.name for x in passes]
    if p.name in names:
        at = names.index(p.name)
        passes[at] = dataclasses.replace(passes[at], dtype=p.dtype)
        return format_pipeline(passes)
    at = next((names.index(n) for n in ("remat", "apply-tuning", "fuse") if n in names),
              len(passes))
    passes.insert(at, p)
    return format_pipeline(passes)
