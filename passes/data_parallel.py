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
asks the runtime to send the bucket in 16 bits with error feedback. `bn = local` (the
default) leaves batch norm to each rank, as PyTorch DDP without SyncBatchNorm: every rank
normalises with its own shard's statistics and keeps its own running statistics (rank 0's
are checkpointed).

`bn = sync` is synchronised batch norm (PyTorch's SyncBatchNorm): every rank normalises with
the statistics of the whole global batch, so R ranks x B/R compute what one process with
batch B computes, batch-norm models included.

    Before (@forward):  %s = nf.compute [c: 4] sum [n: 8, h: 6, w: 6] (%x[n, c, h, w])
                        %mean = nf.compute [c: 4] (%s[c] / 288.0)
    After:              %s = nf.compute [c: 4] sum [n: 8, h: 6, w: 6] (%x[n, c, h, w])
                        %s_ar = nf.allreduce %s {nf.collective = "batch-stats", ...}
                        %mean = nf.compute [c: 4] (%s_ar[c] / 288.0)

A batch statistic is found by pattern, so the std `batch_norm_train`/`batch_norm1d_train`
and batch norms written by hand are caught alike: a `sum` over the batch axis of the model's
inputs (followed through the computes that keep it as a plain index) whose result has no
batch axis and is read, through computes without a batch axis, by a compute with one (the
statistic is broadcast back over the batch; a loss summed over the batch is not). Each is
replaced by its mean over the ranks; with equal shards the mean of the per-rank sums over
the local count is the global mean (the same for the sum of squared deviations from the
already global mean, so the variance is the global batch's, computed as one process does).
A reduction over the batch other than `sum` (max, min, prod) is left per rank.

The statistics must be reduced before autodiff, since the backward of batch norm depends on
them: the pass, which runs after `training-functions`, inserts them into a copy of `@forward`
and differentiates that copy again (the `@train_step` `training-functions` made is replaced;
`@forward` and `@eval` keep no all-reduce, evaluation stays per rank). Autodiff's rule for
`nf.allreduce` (nfc.passes.autodiff.graph) gives each one an adjoint `nf.allreduce`
(`nf.collective = "batch-stats-grad"`) in the backward: the adjoint of a mean over the ranks
is the mean over the ranks of the adjoints, which with the gradient all-reduce after it makes
the gradient that of the global batch. In one process both are copies, so `bn = sync` and
`bn = local` compute the same step. `sync` also averages the `state:` results (running
statistics, already global with the synchronised statistics; exact for any others). Batch
statistics and running statistics are never compressed (the runtime sends them in full
precision whatever `compress` says). `bn = sync` needs `@forward` in the module and the
default `function` (a `.nfir` given with its `@train_step` only gets the running statistics
averaged).

Run right after `training-functions` (`nfc train` on several ranks inserts it there); the
cleanup passes and `fuse` leave an `nf.allreduce` where it is (it is never merged, fused or
inlined). In a process without a collective the native step copies the operands unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from nfc.diagnostics import error
from nfc.ir import AllReduceOp, ComputeOp, Func, Index, Module, Op, ReturnOp, Value
from nfc.passmanager import Context, ModulePass
from nfc.rewrite import Rewriter

__all__ = ["COMPRESSIONS", "DataParallel", "batch_statistics", "data_parallel_func",
           "gradient_cut", "sync_batch_statistics"]

#: Gradient encodings of the collective (`compress` option).
COMPRESSIONS = ("none", "fp16", "bf16")
PHASE = "nf.phase"
STATE_PREFIX = "state:"
#: `nf.collective` of the batch-statistics all-reduces (`bn = sync`); autodiff's adjoints
#: carry it with `-grad`.
BATCH_STATS = "batch-stats"


def _batch_axes(func: Func) -> dict[int, int]:
    """value id -> the position of its batch axis: axis 0 of the `input` arguments, followed
    through the computes that read it with a plain index that is one of their output axes."""
    out: dict[int, int] = {}
    for a, attrs in zip(func.args, func.arg_attrs, strict=False):
        if attrs.get("nf.role") == "input" and a.type.shape:
            out[id(a)] = 0
    for op in func.body.ops:
        if not isinstance(op, ComputeOp):
            continue
        names = [ax.name for ax in op.dims]
        for ld in _loads(op):
            p = out.get(id(ld.tensor))
            if p is None or p >= len(ld.indices):
                continue
            idx = ld.indices[p]
            if isinstance(idx, Index) and idx.name in names:
                out[id(op.result)] = names.index(idx.name)
                break
    return out


def _loads(op: ComputeOp) -> list:
    from nfc.passes.autodiff.exprgrad import value_loads

    return list(value_loads(op.body))


def batch_statistics(func: Func) -> list[ComputeOp]:
    """The computes of `func` that are batch statistics (see the module doc), in order."""
    batched = _batch_axes(func)
    ops = [op for op in func.body.ops if isinstance(op, ComputeOp)]
    # values read, through computes without a batch axis, by a compute with one
    reaches: set[int] = set()
    for op in reversed(ops):
        if id(op.result) in batched or id(op.result) in reaches:
            reaches.update(id(ld.tensor) for ld in _loads(op))
    out = []
    for op in ops:
        if op.reduce != "sum" or id(op.result) in batched or id(op.result) not in reaches \
                or not op.result.type.dtype.is_float:
            continue
        raxes = {ax.name for ax in op.raxes}
        for ld in _loads(op):
            p = batched.get(id(ld.tensor))
            if p is not None and p < len(ld.indices) and isinstance(ld.indices[p], Index) \
                    and ld.indices[p].name in raxes:
                out.append(op)
                break
    return out


def sync_batch_statistics(func: Func) -> int:
    """Replace every batch statistic of `func` by its mean over the ranks (one
    `nf.allreduce {nf.collective = "batch-stats"}` right after it); returns how many."""
    rw = Rewriter()
    stats = batch_statistics(func)
    for op in stats:
        v = op.result
        ar = AllReduceOp([v], loc=op.loc, attrs=_attrs(0, "none", BATCH_STATS),
                         names=[f"{v.name or 'stat'}_ar"])
        rw.insert_op_after(ar, op)
        rw.replace_uses_with_if(v, ar.results[0], lambda user, ar=ar: user is not ar)
    return len(stats)


def _resync_train_step(module: Module, function: str) -> int:
    """`@function` differentiated again from a copy of `@forward` whose batch statistics are
    all-reduced (see the module doc); returns how many statistics (0: left as it was)."""
    from nfc.passes.autodiff.train import build_train_step

    if function != "train_step" or not module.has_func("forward"):
        return 0  # only the step `training-functions` makes from @forward can be remade
    tmp = module.func("forward").clone("forward_batch_stats_synced")
    n = sync_batch_statistics(tmp)
    if not n:
        return 0
    old = module.func(function)
    module.funcs.append(tmp)
    try:
        step = build_train_step(module, tmp.name, function)
    finally:
        module.funcs.remove(tmp)
    module.funcs[module.funcs.index(old)] = step
    return n


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
    if any(isinstance(op, AllReduceOp) and not str(op.attrs.get("nf.collective", ""))
           .startswith(BATCH_STATS) for op in func.body.ops):
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
    k = n
    for op in func.body.ops:  # the batch statistics and their adjoints: buckets after those
        if isinstance(op, AllReduceOp) and op.attrs.get("nf.collective") in \
                (BATCH_STATS, f"{BATCH_STATS}-grad"):
            op.attrs["nf.bucket"] = k
            k += 1
    return n


@dataclass(frozen=True)
class DataParallel(ModulePass):
    """Average the gradients of `@train_step` over the ranks of a data-parallel run: one
    `nf.allreduce` per bucket of gradients between the backward and the optimizer update;
    with `bn=sync` also the batch statistics of the forward (and their adjoints) and the
    running statistics.

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
    """Batch norm: local to each rank, or sync (global batch statistics; running statistics
    averaged every step)."""
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
        func = module.func(self.function)
        if any(isinstance(op, AllReduceOp) for op in func.body.ops):
            raise error(f"@{func.name} already has nf.allreduce ops: run data-parallel once",
                        func.loc)
        stats = _resync_train_step(module, self.function) if self.bn == "sync" else 0
        buckets = data_parallel_func(module.func(self.function), self.bucket_kb * 1024,
                                     self.compress, self.bn)
        module.attrs["nf.data_parallel"] = {"buckets": buckets, "compress": self.compress,
                                            "bn": self.bn}
        if stats:
            module.attrs["nf.data_parallel"]["batch_stats"] = stats
