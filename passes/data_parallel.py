"""The `data-parallel` pass: the gradient all-reduce of data-parallel training, in the IR.

    Before:  %g = nf.compute [...] sum [n: 4] (...)          {nf.phase = "backward"}
             %w2 = nf.compute [...] (%w[..] - 0.1 * %g[..])  {nf.phase = "update"}
    After:   %g = nf.compute [...] sum [n: 4] (...)          {nf.phase = "backward"}
             %g_ar = nf.allreduce %g {nf.bucket = 0, nf.compress = "none", nf.reduce = "mean"}
             %w2 = nf.compute [...] (%w[..] - 0.1 * %g_ar[..]) {nf.phase = "update"}

In `@train_step` (made by `training-functions`, whose optimizer computes carry
`nf.phase = "update"`), every value computed outside the update and read by it, that is every
gradient the update consumes, is replaced by its mean over the ranks of a data-parallel run.
Each rank runs the step on its shard of the batch (batch B/R on R ranks); the mean of the
per-rank gradients of a mean loss is the gradient of the whole batch, so R ranks compute the
parameters of one process with batch B (up to the order of f32 sums).

Gradients are grouped in buckets (PyTorch DDP's bucketing): in the order the backward
produces them, a bucket is closed when it holds `bucket-kb` KiB or more; one `nf.allreduce`
per bucket is placed right after the op producing its last gradient, so the runtime can
reduce it while the rest of the backward runs (nfc.runtime.distributed starts the collective
there and waits for it before the first op reading a result). `compress` (none, fp16, bf16)
asks the runtime to send the bucket in 16 bits with error feedback. `bn = sync` also averages
the `state:` results (batch-norm running statistics) over the ranks; `local` (the default)
leaves each rank its own, as PyTorch DDP without SyncBatchNorm (rank 0's are checkpointed).

Run right after `training-functions` (`nfc train` on several ranks inserts it there); the
cleanup passes and `fuse` leave an `nf.allreduce` where it is (it is never merged, fused or
inlined). In a process without a collective the native step copies the operands unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.diagnostics import error
from nfc.ir import AllReduceOp, Func, Module, Op, ReturnOp, Value
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import Rewriter

__all__ = ["COMPRESSIONS", "DataParallel", "data_parallel_func", "gradient_cut"]

#: Gradient encodings of the collective (`compress` option).
COMPRESSIONS = ("none", "fp16", "bf16")
PHASE = "nf.phase"
STATE_PREFIX = "state:"


def gradient_cut(func: Func) -> list[Value]:
    """The values computed outside the optimizer update and read by it (the gradients), in
    the order their producers come in the body."""
    update = {id(op) for op in func.body.ops if op.attrs.get(PHASE) == "update"}
    pos = {id(op): n for n, op in enumerate(func.body.ops)}
    seen: dict[int, Value] = {}
    for op in func.body.ops:
        if id(op) not in update:
            continue
        for v in op.operands:
            if isinstance(v.owner, Op) and id(v.owner) not in update and v.type.dtype.is_float:
                seen.setdefault(id(v), v)
    return sorted(seen.values(), key=lambda v: pos[id(v.owner)])


def _buckets(grads: list[Value], limit: int) -> list[list[Value]]:
    out: list[list[Value]] = []
    cur: list[Value] = []
    size = 0
    for g in grads:
        cur.append(g)
        size += g.type.nbytes
        if size >= limit:
            out.append(cur)
            cur, size = [], 0
    if cur:
        out.append(cur)
    return out


def _attrs(bucket: int, compress: str, what: str) -> dict[str, object]:
    return {"nf.bucket": bucket, "nf.compress": compress, "nf.reduce": "mean",
            "nf.collective": what}


def data_parallel_func(func: Func, bucket_bytes: int, compress: str = "none",
                       bn: str = "local") -> int:
    """Insert the all-reduces into `func` (see the module doc); returns the buckets made."""
    if any(isinstance(op, AllReduceOp) for op in func.body.ops):
        raise error(f"@{func.name} already has nf.allreduce ops: run data-parallel once",
                    func.loc)
    rw = Rewriter()
    pos = {id(op): n for n, op in enumerate(func.body.ops)}
    update = {id(op) for op in func.body.ops if op.attrs.get(PHASE) == "update"}
    n = 0
    for bucket in _buckets(gradient_cut(func), bucket_bytes):
        last = max(bucket, key=lambda v: pos[id(v.owner)]).owner
        assert isinstance(last, Op)
        op = AllReduceOp(list(bucket), loc=last.loc, attrs=_attrs(n, compress, "gradients"),
                         names=[f"{v.name or 'g'}_ar" for v in bucket])
        rw.insert_op_after(op, last)
        for g, r in zip(bucket, op.results, strict=True):
            rw.replace_uses_with_if(g, r, lambda user: id(user) in update)
        n += 1
    if bn == "sync":
        names = func.attrs.get("nf.results") or []
        ret = func.body.ops[-1]
        assert isinstance(ret, ReturnOp)
        state = [v for name, v in zip(names, ret.values, strict=False)
                 if str(name).startswith(STATE_PREFIX) and v.type.dtype.is_float]
        state = list({id(v): v for v in state}.values())
        if state:
            op = AllReduceOp(state, loc=ret.loc, attrs=_attrs(n, "none", "state"),
                             names=[f"{v.name or 's'}_ar" for v in state])
            rw.insert_op_before(op, ret)
            for v, r in zip(state, op.results, strict=True):
                rw.replace_uses_with_if(v, r, lambda user: user is ret)
            n += 1
    return n


@dataclass(frozen=True)
class DataParallel(ModulePass):
    """Average the gradients of `@train_step` over the ranks of a data-parallel run: one
    `nf.allreduce` per bucket of gradients between the backward and the optimizer update.

    Before:  %g = nf.compute [i: 4] sum [n: 8] (...) {nf.phase = "backward"}
             %w_new = nf.compute [i: 4] (%w[i] - 0.1 * %g[i]) {nf.phase = "update"}
    After:   %g = nf.compute [i: 4] sum [n: 8] (...) {nf.phase = "backward"}
             %g_ar = nf.allreduce %g {nf.bucket = 0, ..., nf.reduce = "mean"} : tensor<4xf32>
             %w_new = nf.compute [i: 4] (%w[i] - 0.1 * %g_ar[i]) {nf.phase = "update"}
    """

    name: ClassVar[str] = "data-parallel"
    bucket_kb: int = 25600
    """Close a bucket once it holds this many KiB of gradients (PyTorch DDP: 25 MiB)."""
    compress: str = "none"
    """Send gradients as none (f32), fp16 or bf16 (with error feedback, in the runtime)."""
    bn: str = "local"
    """Batch-norm running statistics: local to each rank, or sync (averaged every step)."""
    function: str = "train_step"

    def apply(self, ctx: Context, module: Module) -> None:
        """Insert the all-reduces (see the module doc)."""
        if self.compress not in COMPRESSIONS:
            raise error(f"data-parallel: compress must be one of {', '.join(COMPRESSIONS)}, "
                        f"not '{self.compress}'")
        if self.bn not in ("local", "sync"):
            raise error(f"data-parallel: bn must be local or sync, not '{self.bn}'")
        if self.bucket_kb < 1:
            raise error(f"data-parallel: bucket-kb must be at least 1, not {self.bucket_kb}")
        if not module.has_func(self.function):
            return
        buckets = data_parallel_func(module.func(self.function), self.bucket_kb * 1024,
                                     self.compress, self.bn)
        module.attrs["nf.data_parallel"] = {"buckets": buckets, "compress": self.compress,
                                            "bn": self.bn}
