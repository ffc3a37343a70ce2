"""The numpy reference interpreter: the oracle every pass and backend is checked against.

`run(func, inputs, module=...)` executes a function op by op. A compute is evaluated over
broadcasting `np.arange` grids of all its axes (output axes then reduction axes): loads are
numpy fancy indexing, then the reduction axes are reduced. The iteration space is cut into
chunks of at most `CHUNK_ELEMENTS` points along the outermost axes (output axes first, then
reduction axes, with partial results accumulated), so no temporary grows beyond that.

Semantics (the verifier enforces the typing rules; the interpreter re-checks what it can):
- Every tensor is computed in its own dtype (`DType.numpy`). Weakly typed literals and index
  variables take the type of the other operand: `%x[i] * 2` is f32 for an f32 `%x`, and `i`
  becomes f32 in `f32 * i` (a weak float never meets an integer operand: that is an error).
  Weak-only sub-expressions are computed in int64/float64 and converted where they meet a
  typed one, or at the end to the result's dtype.
- bf16 is emulated: arithmetic in float32, every bf16 tensor (inputs too) rounded to bf16
  precision (nearest even) when it is stored. f16/bf16 `sum` and `prod` accumulate in f32.
- `//` and `%` have floor semantics for ints and floats; `/` needs a float type (on integer
  operands it is an error: use `//`); integer division by zero is an error; float casts to an
  integer type truncate toward zero; integer overflow wraps.
- `select(c, a, b)` evaluates both branches, but only the taken one must read in bounds:
  out-of-bounds indices in the other branch are clipped, while an out-of-bounds read in a
  taken branch raises `InterpError` naming the op, the tensor, the dimension, the index value
  and the iteration point. Data-dependent indices accepted by `nfc.bounds` are checked here.
- Operators and intrinsics compute what their row of the operator table (`nfc.ops`) says:
  its typing rule, then its numpy function on the operands converted to the operand type
  (float functions: float in, same float out; erf in float64 by `erf`; max and min propagate
  NaN; philox takes an integer key and counter and gives a weak float, see nfc.philox).
  Where a row's `defined` is false (an integer division by zero, a negative integer
  exponent) at a point that is taken, the run fails with the point.
- `nf.call` runs the callee of `module`; `nf.kernel` runs its body; reductions `max`/`min`
  propagate NaN; `nf.allreduce` is one process of a data-parallel run: it copies its operands.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from nfc import ops
from nfc.ir import (
    AllReduceOp,
    Block,
    Call,
    CallOp,
    Cast,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Module,
    Op,
    Select,
    TerminatorOp,
    Value,
)
from nfc.ops import Kind
from nfc.ops.lattice import SELECT
from nfc.ops.numerics import erf

__all__ = ["CHUNK_ELEMENTS", "InterpError", "erf", "run"]

#: Most points of the iteration space evaluated at once (bounds every temporary's size).
CHUNK_ELEMENTS = 1 << 24


class InterpError(RuntimeError):
    """A run-time failure of the interpreted program (out-of-bounds read, bad types, ...)."""


# ---------------------------------------------------------------------------------------------
# values: (numpy array or Python scalar, kind); kind is a DType or a weak kind (nfc.ops)


def _numpy_dtype(k: Kind) -> np.dtype:
    """The numpy dtype values of kind `k` are computed in (weak ones in int64 / float64)."""
    if isinstance(k, DType):
        return k.numpy
    return np.dtype(np.float64 if k is ops.WEAK_FLOAT else np.int64)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """Round float32 values to the nearest bfloat16 (ties to even), kept as float32."""
    shape = np.shape(x)  # ascontiguousarray makes a 0-d array 1-d
    x = np.ascontiguousarray(x, dtype=np.float32)
    u = x.view(np.uint32).astype(np.uint64)
    r = ((u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
    return np.where(np.isnan(x), x, r).reshape(shape)


# ---------------------------------------------------------------------------------------------
# evaluation of one chunk of a compute's body


class _Chunk:
    """The grid of one chunk: index arrays, the op (for messages) and the tensors."""

    def __init__(self, op: ComputeOp, env: dict[int, np.ndarray],
                 grids: dict[str, np.ndarray], starts: list[int], shape: tuple[int, ...]):
        self.op = op
        self.env = env
        self.grids = grids
        self.starts = starts
        self.shape = shape

    @property
    def where(self) -> str:
        loc = f"{self.op.loc}: " if self.op.loc is not None else ""
        return f"{loc}compute %{self.op.result.name or '?'}"

    def point(self, flat_mask: np.ndarray) -> str:
        """The iteration point of the first true element of `flat_mask`."""
        pos = np.argwhere(np.broadcast_to(flat_mask, self.shape))[0]
        axes = self.op.all_axes
        return ", ".join(f"{a.name}={int(p) + s}" for a, p, s in zip(axes, pos, self.starts,
                                                                      strict=True))

    def eval(self, e: Expr, mask: np.ndarray | None) -> tuple[Any, Kind]:
        """Value and kind of `e` where `mask` (None: everywhere) marks the taken points."""
        if isinstance(e, Const):
            if e.dtype is not None:
                return np.asarray(e.value, dtype=e.dtype.numpy), e.dtype
            if isinstance(e.value, bool):
                return np.asarray(e.value), DType.I1
            return e.value, ops.const_kind(e)
        if isinstance(e, Index):
            g = self.grids.get(e.name)
            if g is None:
                raise InterpError(f"{self.where}: unknown index variable '{e.name}'")
            return g, ops.WEAK_INT
        if isinstance(e, Load):
            return self._load(e, mask)
        if isinstance(e, Select):
            return self._select(e, mask)
        row = ops.find(e)
        if row is None:
            what = f"intrinsic '{e.fn}'" if isinstance(e, Call) else f"expression {e!r}"
            raise InterpError(f"{self.where}: unknown {what}")
        return self._apply(row, e, [self.eval(c, mask) for c in e.children()], mask)

    def _apply(self, row: ops.Op, e: Expr, args: list[tuple[Any, Kind]],
               mask: np.ndarray | None) -> tuple[Any, Kind]:
        """The operator of `row` on evaluated operands (the table's typing and numpy)."""
        def clash(msg: str) -> None:
            raise InterpError(f"{self.where}: {msg}")

        opk, res = ops.check(row, e, [k for _, k in args], clash)
        assert opk is not None and res is not None
        if isinstance(e, Cast):
            return np.asarray(args[0][0]).astype(e.dtype.numpy), e.dtype
        dt = _numpy_dtype(opk)
        first = 1 if row.operands == SELECT else 0  # a select's condition keeps its type
        vals = [np.asarray(v) if k == opk or i < first else np.asarray(v).astype(dt)
                for i, (v, k) in enumerate(args)]
        if row.defined is not None:
            bad = ~np.asarray(row.defined(opk, *vals), dtype=bool)
            if mask is not None:
                bad = bad & mask
            if np.any(bad):
                raise InterpError(f"{self.where}: {row.undefined} at {self.point(bad)}")
        assert row.numpy is not None
        out = row.numpy(*vals)
        if isinstance(res, DType):
            out = np.asarray(out).astype(res.numpy, copy=False)
        return out, res

    def _select(self, e: Select, mask: np.ndarray | None) -> tuple[Any, Kind]:
        """Both branches, each checked in bounds only where it is taken."""
        c, kc = self.eval(e.cond, mask)
        c = np.asarray(c)
        ma = c if mask is None else mask & c
        mb = ~c if mask is None else mask & ~c
        row = ops.find(e)
        assert row is not None
        return self._apply(row, e, [(c, kc), self.eval(e.a, ma), self.eval(e.b, mb)], mask)

    def _load(self, e: Load, mask: np.ndarray | None) -> tuple[Any, Kind]:
        t = e.tensor
        arr = self.env.get(id(t))
        if arr is None:
            raise InterpError(f"{self.where}: %{t.name or '?'} is used before it is defined")
        if len(e.indices) != arr.ndim:
            raise InterpError(f"{self.where}: %{t.name or '?'} has rank {arr.ndim} but is "
                              f"indexed with {len(e.indices)} indices")
        idxs = []
        for d, ie in enumerate(e.indices):
            v, k = self.eval(ie, mask)
            if ops.is_float(k):
                raise InterpError(f"{self.where}: index {d} of %{t.name or '?'} is a float")
            v = np.asarray(v)
            if v.dtype == np.bool_:
                v = v.astype(np.intp)
            size = arr.shape[d]
            if v.size and (v.min() < 0 or v.max() >= size):
                bad = (v < 0) | (v >= size)
                if mask is not None:
                    bad = bad & mask
                if np.any(bad):
                    value = int(np.broadcast_to(v, np.broadcast_shapes(v.shape, bad.shape))[
                        tuple(np.argwhere(bad)[0])])
                    raise InterpError(
                        f"{self.where}: read of %{t.name or '?'} out of bounds: dimension {d} "
                        f"index {value} is outside [0, {size - 1}] at {self.point(bad)}")
                v = np.clip(v, 0, size - 1)
            idxs.append(v)
        return arr[tuple(idxs)], t.dtype


# ---------------------------------------------------------------------------------------------
# computes


_REDUCE = {"sum": np.sum, "prod": np.prod, "max": np.max, "min": np.min}
_COMBINE = {"sum": np.add, "prod": np.multiply, "max": np.maximum, "min": np.minimum}


def _chunks(extents: list[int]) -> tuple[int, int]:
    """(k, block): axes before k are iterated one value at a time, axis k in blocks."""
    suffix = 1
    for k in range(len(extents) - 1, -1, -1):
        if suffix * extents[k] <= CHUNK_ELEMENTS:
            suffix *= extents[k]
            continue
        return k, max(1, CHUNK_ELEMENTS // suffix)
    return 0, max(extents[0], 1) if extents else 1


def _compute(op: ComputeOp, env: dict[int, np.ndarray]) -> np.ndarray:
    rt = op.result.type
    axes = op.all_axes
    nd = len(op.dims)
    extents = [a.extent for a in axes]
    red = op.reduce
    acc_dt = rt.dtype.numpy
    if red in ("sum", "prod") and rt.dtype in (DType.F16, DType.BF16):
        acc_dt = np.dtype(np.float32)  # half-precision sums lose too much otherwise
    out = np.empty(rt.shape, dtype=acc_dt)
    if any(e <= 0 for e in extents):
        raise InterpError(f"compute %{op.result.name or '?'} has an empty axis")
    k, block = _chunks(extents) if extents else (0, 1)
    prefix = [range(e) for e in extents[:k]]
    with np.errstate(all="ignore"):
        for pre in itertools.product(*prefix):
            for start in range(0, extents[k] if extents else 1, block):
                starts = list(pre) + [start] + [0] * (len(extents) - k - 1)
                stops = [s + 1 for s in pre]
                if extents:
                    stops += [min(start + block, extents[k])] + extents[k + 1:]
                starts, stops = starts[:len(extents)], stops[:len(extents)]
                part = _eval_chunk(op, env, starts, stops, acc_dt)
                sl = tuple(slice(s, t) for s, t in zip(starts[:nd], stops[:nd], strict=True))
                first = all(s == 0 for s in starts[nd:])
                if first or red is None:
                    out[sl] = part
                else:
                    out[sl] = _COMBINE[red](out[sl], part)
    if rt.dtype == DType.BF16:
        return _round_bf16(out)
    return out.astype(rt.dtype.numpy, copy=False)


def _eval_chunk(op: ComputeOp, env: dict[int, np.ndarray], starts: list[int],
                stops: list[int], acc_dt: np.dtype) -> np.ndarray:
    axes = op.all_axes
    n = len(axes)
    shape = tuple(t - s for s, t in zip(starts, stops, strict=True))
    grids = {}
    for j, (a, s, t) in enumerate(zip(axes, starts, stops, strict=True)):
        grids[a.name] = np.arange(s, t, dtype=np.int64).reshape(
            [1] * j + [t - s] + [1] * (n - j - 1))
    chunk = _Chunk(op, env, grids, starts, shape)
    v, k = chunk.eval(op.body, None)
    rdt = op.result.type.dtype
    if isinstance(k, DType) and k != rdt:
        raise InterpError(f"{chunk.where}: the body has type {k} but the result is {rdt}")
    if k is ops.WEAK_FLOAT and not rdt.is_float:
        raise InterpError(f"{chunk.where}: a float body for an integer result ({rdt})")
    full = np.broadcast_to(np.asarray(v).astype(acc_dt, copy=False), shape)
    if op.reduce is None:
        return full
    raxes = tuple(range(len(op.dims), n))
    fn = _REDUCE[op.reduce]
    if op.reduce in ("sum", "prod"):
        return fn(full, axis=raxes, dtype=acc_dt)
    return fn(full, axis=raxes)


# ---------------------------------------------------------------------------------------------
# functions


def _bind(func: Func, inputs: Sequence[Any] | Mapping[str, Any]) -> list[np.ndarray]:
    if isinstance(inputs, Mapping):
        names = [a.name for a in func.args]
        unknown = sorted(set(inputs) - set(n for n in names if n is not None))
        if unknown:
            raise ValueError(f"@{func.name} has no argument named {', '.join(unknown)}")
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ValueError(f"missing argument '%{missing[0]}' of @{func.name}")
        values = [inputs[n] for n in names]  # type: ignore[index]
    else:
        values = list(inputs)
        if len(values) != len(func.args):
            raise ValueError(f"@{func.name} takes {len(func.args)} arguments, "
                             f"{len(values)} given")
    out = []
    for a, x in zip(func.args, values, strict=True):
        arr = np.asarray(x)
        want = a.dtype.numpy
        if arr.shape != a.shape:
            raise ValueError(f"argument '%{a.name}' of @{func.name} has shape {arr.shape}, "
                             f"expected {a.shape} ({a.type})")
        if arr.dtype != want:
            raise ValueError(f"argument '%{a.name}' of @{func.name} has dtype {arr.dtype}, "
                             f"expected {want} ({a.type})")
        out.append(_round_bf16(arr) if a.dtype == DType.BF16 else arr)
    return out


def _run_block(block: Block, env: dict[int, np.ndarray], module: Module | None
               ) -> list[np.ndarray]:
    for op in block.ops:
        if isinstance(op, TerminatorOp):
            return [_get(env, v, op) for v in op.values]
        _run_op(op, env, module)
    raise InterpError("a block ends without nf.return or nf.yield")


def _get(env: dict[int, np.ndarray], v: Value, op: Op) -> np.ndarray:
    arr = env.get(id(v))
    if arr is None:
        raise InterpError(f"{op.opname}: %{v.name or '?'} is used before it is defined")
    return arr


def _run_op(op: Op, env: dict[int, np.ndarray], module: Module | None) -> None:
    if isinstance(op, ComputeOp):
        env[id(op.result)] = _compute(op, env)
    elif isinstance(op, CallOp):
        if module is None or not module.has_func(op.callee):
            raise InterpError(f"nf.call of unknown function @{op.callee} (pass module=)")
        args = [_get(env, v, op) for v in op.args]
        results = run(module.func(op.callee), args, module=module)
        for r, arr in zip(op.results, results, strict=True):
            env[id(r)] = arr
    elif isinstance(op, KernelOp):
        results = _run_block(op.body, env, module)
        for r, arr in zip(op.results, results, strict=True):
            env[id(r)] = arr
    elif isinstance(op, AllReduceOp):  # one rank: the mean over the ranks is the operand
        for r, v in zip(op.results, op.values, strict=True):
            env[id(r)] = _get(env, v, op).copy()
    else:
        raise InterpError(f"cannot interpret {op.opname}")


def run(func: Func, inputs: Sequence[Any] | Mapping[str, Any], *,
        module: Module | None = None) -> list[np.ndarray]:
    """Run `func` on `inputs` (positional, or by argument name) and return its results.

    Inputs must have exactly the argument's shape and numpy dtype (`DType.numpy`: float32 for
    bf16, bool for i1). Raises ValueError naming the argument when one does not, and
    InterpError when the program fails (see the module docstring). Results are fresh arrays.
    """
    args = _bind(func, inputs)
    env: dict[int, np.ndarray] = {id(a): arr for a, arr in zip(func.args, args, strict=True)}
    results = _run_block(func.body, env, module)
    inputs_ids = {id(x) for x in args}
    return [np.array(r, copy=True) if id(r) in inputs_ids else r for r in results]
