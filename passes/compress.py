"""Compressed saved activations: keep what the backward pass needs of a forward value in a
smaller form (docs/memory.md).

**Masks (exact).** A ReLU's backward reads its input only to ask whether it was positive:
`select(%a[n, m] > 0.0, %g[n, m], 0.0)`. When every backward reader uses a saved value only in
one comparison with a constant, the pass computes that comparison once in the forward pass,
right after the value, as a boolean tensor (`i1`, one byte per element instead of four), and
the backward readers read the mask instead. The value itself then dies with its last forward
reader. The results are bit for bit the same. With `bits` (below) the byte mask lives only
until it is packed 32 to an `i32` word, and the backward reads the words with `bit(w, j)`.

Before:  %a = nf.compute [n: 64, m: 128] (%0[n, m] + %b[m])
         %h = nf.compute [n: 64, m: 128] (max(%a[n, m], 0.0))
         ...
         %d_a = nf.compute [n: 64, m: 128] (select(%a[n, m] > 0.0, %d_h[n, m], 0.0))
                {nf.phase = "backward"}
After:   %a = ...; %a_mask = nf.compute [n: 64, m: 128] (%a[n, m] > 0.0)
                {nf.compress = "mask"} : tensor<64x128xi1>
         %h = ...
         %d_a = nf.compute [n: 64, m: 128] (select(%a_mask[n, m], %d_h[n, m], 0.0))

Packed (`bits`, `_with_bits`): the value's axes split into leading ones (flattened to a row
r) and trailing ones j, bit k of word [q, j...] is row 32 q + k (0 past the last row):

         %a_mask = ... {nf.compress = "mask-bytes"}
         %a_bits = nf.compute [q: 2, m: 128] (select(%a_mask[q * 32, m], i32(1), i32(0))
                     + ... + select(%a_mask[q * 32 + 31, m], i32(-2147483648), i32(0)))
                {nf.compress = "bits"} : tensor<2x128xi32>
         %d_a = nf.compute [n: 64, m: 128] (select(bit(%a_bits[n // 32, m], n % 32), ...))

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

from nfc.ir import Axis, ComputeOp, DType, Func, Module, TensorType, Value
from nfc.ir.expr import Binary, Call, Cast, Const, Expr, Index, Load, Select
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


#: Mask bits per packed word (`i32` words; bit 31 is the sign bit, which `bit` reads as any
#: other).
WORD_BITS = 32


def _int(x: int) -> Const:
    return Const(x)


def _flat(indices: tuple[Expr, ...], shape: tuple[int, ...]) -> Expr:
    """The row-major position of element `indices` of a tensor of `shape`."""
    flat: Expr | None = None
    for i, n in zip(indices, shape, strict=True):
        flat = i if flat is None else Binary("+", Binary("*", flat, _int(n)), i)
    return flat if flat is not None else _int(0)


def _unflat(flat: Expr, shape: tuple[int, ...]) -> tuple[Expr, ...]:
    """The indices of row-major position `flat` (0 <= flat < prod(shape))."""
    out: list[Expr] = []
    inner = 1
    for n in reversed(shape):
        q = flat if inner == 1 else Binary("//", flat, _int(inner))
        out.append(q if inner * n == _size(shape) else Binary("%", q, _int(n)))
        inner *= n
    return tuple(reversed(out))


def _size(shape: tuple[int, ...]) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _split(shape: tuple[int, ...]) -> int:
    """How many leading axes of `shape` the bits are packed along: the split with the fewest
    words (the leading axes' element count rounded up to 32, times the rest), the fewest
    leading axes among equals (the packing and unpacking loops then run over whole trailing
    rows, unit stride, and vectorise)."""
    best, at = None, len(shape)
    for k in range(1, len(shape) + 1):
        words = -(-_size(shape[:k]) // WORD_BITS) * _size(shape[k:])
        if best is None or words < best:
            best, at = words, k
    return at


def _with_bits(op: ComputeOp, bytes_: ComputeOp) -> ComputeOp:
    """`%v_bits[q, j...]`: with the value's axes split into leading ones (row r, row-major) and
    trailing ones (j...; `_split`), bit k of word [q, j...] is byte mask `bytes_` at
    [row 32 q + k, j...] (0 past the last row): an explicit sum of 32 selects of the powers of
    two. (Packed from the byte mask, not from the value: the byte mask is elementwise in the
    value, so fusion computes it in the value's producer and the f32 value need not be
    stored for the packing; the byte mask dies right after it.)"""
    v = op.result
    m = bytes_.result
    shape = tuple(v.type.shape)
    k_lead = _split(shape)
    lead, rest = shape[:k_lead], shape[k_lead:]
    rows = _size(lead)
    words = -(-rows // WORD_BITS)
    taken = {d.name for d in op.dims[k_lead:]}
    q = next(n for n in ("q", "q_", "q__", "q_w") if n not in taken)
    trailing = tuple(Index(d.name) for d in op.dims[k_lead:])
    body: Expr | None = None
    for k in range(WORD_BITS):
        row = Binary("*", Index(q), _int(WORD_BITS))
        row = row if k == 0 else Binary("+", row, _int(k))
        past = rows % WORD_BITS and k >= rows % WORD_BITS  # past the last row in the last word
        at = Call("min", (row, _int(rows - 1))) if past else row  # loads stay in bounds
        cond: Expr = Load(m, _unflat(at, lead) + trailing)
        if past:
            cond = Binary("and", Binary("<", row, _int(rows)), cond)
        term = Select(cond, Const(-(2 ** 31) if k == 31 else 2 ** k, DType.I32),
                      Const(0, DType.I32))
        body = term if body is None else Binary("+", body, term)
    assert body is not None
    bits = ComputeOp(TensorType((words, *rest), DType.I32),
                     (Axis(q, words), *op.dims[k_lead:]), body, loc=op.loc,
                     name=f"{v.name}_bits" if v.name else None)
    if "nf.callsite" in op.attrs:
        bits.attrs["nf.callsite"] = op.attrs["nf.callsite"]
    bits.attrs["nf.compress"] = "bits"
    return bits


def compress_mask(func: Func, op: ComputeOp, readers: list[ComputeOp],
                  test: tuple[str, Const, bool], bits: bool = True) -> ComputeOp:
    """Insert the mask of `op` after it (packed 32 to an `i32` word with `bits`, else one
    `i1` byte an element) and make `readers` read it (see the module doc)."""
    bits = bits and bool(op.result.type.shape)  # a scalar's mask stays one byte
    mask = _with_mask(op, test)
    func.body.insert_after(mask, op)
    if bits:
        mask.attrs["nf.compress"] = "mask-bytes"  # only read by the packing
        packed = _with_bits(op, mask)
        func.body.insert_after(packed, mask)
        mask = packed
    v = op.result
    shape = tuple(v.type.shape)
    cmp, const, left = test

    k_lead = _split(shape)

    def read(indices: tuple[Expr, ...]) -> Expr:
        if not bits:
            return Load(mask.result, indices)
        row = _flat(indices[:k_lead], shape[:k_lead])
        word = (Binary("//", row, _int(WORD_BITS)), *indices[k_lead:])
        return Call("bit", (Load(mask.result, word), Binary("%", row, _int(WORD_BITS))))

    def fn(e: Expr) -> Expr | None:
        if isinstance(e, Binary) and e.op == cmp:
            side, other = (e.a, e.b) if left else (e.b, e.a)
            if isinstance(side, Load) and side.tensor is v and other == const:
                return read(side.indices)
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


def _undo(func: Func, new: ComputeOp, saved: list[tuple[ComputeOp, Expr]]) -> None:
    for r, body in saved:
        r.body = body
    func.body.ops.remove(new)
    if new.attrs.get("nf.compress") == "bits":  # and the byte mask it was packed from
        func.body.ops.remove(next(op for op in new.body.walk() if isinstance(op, Load)
                                  ).tensor.owner)


def compress_func(func: Func, masks: bool = True, dtype: DType | None = None,
                  bits: bool = True) -> dict[str, int]:
    """Compress the saved activations of `func` (in place) where that does not raise the
    arena's lower bound (masks packed to bits with `bits`, else bytes); returns
    {"masks": n, "narrow": n, "bytes": saved bytes no longer kept in full}."""
    stats = {"masks": 0, "narrow": 0, "bytes": 0}
    if not any(_late(op) for op in func.body.ops):
        return stats
    bound = lower_bound(function_buffers(func))
    for op, readers in _saved_computes(func):
        v = op.result
        if not v.type.dtype.is_float:
            continue
        test = mask_test(v, readers) if masks else None
        saved = [(r, r.body) for r in readers]
        if test is not None:
            new = compress_mask(func, op, readers, test, bits)
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
            _undo(func, new, saved)
    return stats


@dataclass(frozen=True)
class CompressActivations(ModulePass):
    """Keep saved activations in a smaller form (see the module doc): `masks` (default true:
    values the backward pass only compares with a constant become masks, exact), `bits`
    (`true`: masks packed 32 to an `i32` word; `false`: one `i1` byte an element; `auto`, the
    default: whichever the memory model finds smaller, bits on a tie) and `dtype` (`bf16` or
    `f16`: saved f32 values the backward pass only multiplies into sums, the weight gradients'
    inputs, stored rounded, lossy; default none).
    Kept only where it does not raise the arena's lower bound, and as a whole only if the measured
    arena (`Context.memory_model`, else the IR level plan) is not larger. Records
    `nf.compress = {masks = n, narrow = n, bytes = b, arena_before = a0, arena_after = a1,
    bits = true|false}`."""

    name: ClassVar[str] = "compress-activations"
    uses_memory_model: ClassVar[bool] = True
    masks: bool = True
    dtype: str = ""
    bits: str = "auto"

    def apply(self, ctx: Context, module: Module) -> None:
        """Compress in every function with a backward pass."""
        if self.dtype not in ("", "bf16", "f16"):
            ctx.error(f"compress-activations: dtype must be bf16 or f16 (got '{self.dtype}')")
            return
        if self.bits not in ("auto", "true", "false"):
            ctx.error(f"compress-activations: bits must be auto, true or false "
                      f"(got '{self.bits}')")
            return
        tries = {"auto": (True, False), "true": (True,), "false": (False,)}[self.bits]
        dtype = DType(self.dtype) if self.dtype else None
        model = getattr(ctx, "memory_model", None) or memory_report
        notes = []
        for f in module.funcs:
            if not f.body.ops or not any(_late(op) for op in f.body.ops):
                continue
            before: MemoryReport = model(f.clone())
            # bit masks, and byte masks where the model finds them smaller (bit masks are packed
            # in a kernel of their own, which can change what the fusion keeps)
            best = None
            for bits in tries if self.masks else (False,):
                trial = f.clone()
                stats = compress_func(trial, self.masks, dtype, bits)
                if not stats["masks"] and not stats["narrow"]:
                    break
                after: MemoryReport = model(trial.clone())
                if best is None or after.arena < best[1].arena:
                    best = (bits, after, stats)
            if best is None:
                continue
            bits, after, stats = best
            if after.arena > before.arena:
                notes.append(f"@{f.name}: not kept (arena {before.arena:,} -> "
                             f"{after.arena:,} bytes)")
                continue
            compress_func(f, self.masks, dtype, bits)  # the same as on the trial
            f.attrs["nf.compress"] = {**stats, "arena_before": before.arena,
                                      "arena_after": after.arena, "bits": bits}
            notes.append(f"@{f.name}: {stats['masks']} {'bit' if bits else 'byte'} masks, "
                         f"{stats['narrow']} narrowed, "
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
