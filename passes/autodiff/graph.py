"""Graph-level reverse mode: chain the per-compute gradients of a function.

`reverse_mode` walks the computes of a function from the loss backwards. A tensor gets a
gradient when it both depends on a tensor we differentiate with respect to (`wrt`) and
influences the loss; everything else is pruned. Contributions of several consumers (and of
several loads in one consumer) are summed: elementwise contributions are folded into one
compute, reductions stay computes of their own and are read by it. A compute whose attributes
hold a true `nf.stop_gradient` passes no gradient to its inputs.

An `nf.allreduce` (mean over the ranks of a data-parallel run, e.g. the batch statistics of
synchronised batch norm, nfc.passes.data_parallel) is linear and the same on every rank: its
adjoint is the all-reduce (mean) of the adjoints of its results, one `nf.allreduce` in the
backward with `nf.collective` suffixed `-grad` (in one process both are copies).

The backward computes read forward values directly (the function is SSA), so every forward
value the backward needs stays alive; unused ones are left for dead-code elimination.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from nfc.diagnostics import CompileError, Diagnostic, note
from nfc.ir import (
    AllReduceOp,
    Axis,
    CallOp,
    ComputeOp,
    Const,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Op,
    TensorType,
    Value,
    substitute_indices,
)
from nfc.passes.autodiff import simp
from nfc.passes.autodiff.exprgrad import ComputeGrad, Contribution, Problem, value_loads
from nfc.printer import Namer
from nfc.rewrite import Rewriter

#: Attribute marking generated computes: "backward" (gradients) or "update" (optimizer).
PHASE = "nf.phase"


@dataclass
class _Grads:
    """Pending gradient contributions per tensor."""

    dims: dict[int, tuple[Axis, ...]] = field(default_factory=dict)
    parts: dict[int, list[Contribution]] = field(default_factory=dict)
    done: dict[int, Value] = field(default_factory=dict)


def _differentiable(v: Value) -> bool:
    return v.dtype.is_float


def _grad_dims(v: Value, load: Load | None) -> tuple[Axis, ...]:
    """Index names for `v`'s gradient: its producer's, else bare load indices, else i0, i1."""
    names: list[str | None] = [None] * len(v.shape)
    if isinstance(v.owner, ComputeOp):
        names = [a.name for a in v.owner.dims]
    elif load is not None:
        for j, idx in enumerate(load.indices):
            if isinstance(idx, Index):
                names[j] = idx.name
    used: set[str] = set()
    out = []
    for j, (n, ext) in enumerate(zip(names, v.shape, strict=True)):
        name = n if n is not None and n not in used else None
        if name is None:
            k = j
            while f"i{k}" in used or f"i{k}" in names:
                k += 1
            name = f"i{k}"
        used.add(name)
        out.append(Axis(name, ext))
    return tuple(out)


class ReverseMode:
    """Builds the backward computes of `func` for `loss` w.r.t. `wrt`; see `reverse_mode`."""

    def __init__(self, func: Func, loss: Value, wrt: list[Value]) -> None:
        self.func = func
        self.loss = loss
        self.wrt = wrt
        self.new_ops: list[ComputeOp | AllReduceOp] = []
        self.problems: list[Problem] = []
        self.g = _Grads()
        # gradient names follow the printed (unique) names of the forward values: %d_y_4
        self.namer = Namer()
        for a in func.args:
            self.namer.add(a)
        for op in func.walk():
            for r in op.results:
                self.namer.add(r)

    def grad_name(self, v: Value) -> str:
        """`d_<printed name of v>`."""
        return "d_" + self.namer(v)[1:]

    def emit(self, op: ComputeOp) -> Value:
        """Append a backward compute and return its result."""
        op.attrs.setdefault(PHASE, "backward")
        self.new_ops.append(op)
        return op.result

    def run(self) -> dict[int, Value]:
        """Gradients of every `wrt` value (by id); zeros when the loss does not depend on it."""
        ops = [op for op in self.func.body.ops if op.results]
        requires = {id(v) for v in self.wrt}
        for op in ops:
            if isinstance(op, ComputeOp):
                if op.attrs.get("nf.stop_gradient") is True:
                    continue
                if any(id(ld.tensor) in requires for ld in value_loads(op.body)
                       if _differentiable(ld.tensor)) and _differentiable(op.result):
                    requires.add(id(op.result))
            elif any(id(v) in requires for v in op.operands):
                requires.update(id(r) for r in op.results)
        needed = {id(self.loss)} & requires
        blockers: list[Op] = []
        for op in reversed(ops):
            if not any(id(r) in needed for r in op.results):
                continue
            if isinstance(op, ComputeOp):
                for ld in value_loads(op.body):
                    if id(ld.tensor) in requires:
                        needed.add(id(ld.tensor))
            elif isinstance(op, AllReduceOp):
                needed.update(id(v) for v in op.values if id(v) in requires)
            elif isinstance(op, CallOp | KernelOp):
                blockers.append(op)
        if blockers:
            raise CompileError([_blocker(op) for op in blockers])
        if id(self.loss) in needed:
            seed = ComputeOp(self.loss.type, tuple(Axis(f"i{j}", n) for j, n in
                                                  enumerate(self.loss.shape)), Const(1.0),
                             loc=self.loss.owner.loc if self.loss.owner else None,
                             name=self.grad_name(self.loss))
            self.g.done[id(self.loss)] = self.emit(seed)
        for op in reversed(ops):
            if isinstance(op, AllReduceOp):
                self.allreduce_adjoint(op, needed)
                continue
            if not isinstance(op, ComputeOp) or id(op.result) not in needed:
                continue
            dout = self.materialize(op.result)
            if dout is None:
                continue
            cg = ComputeGrad(op, dout, self.emit, self.problems, self.grad_name)
            for ld in value_loads(op.body):
                if id(ld.tensor) not in needed:
                    continue
                dims = self.g.dims.setdefault(id(ld.tensor), _grad_dims(ld.tensor, ld))
                self.g.parts.setdefault(id(ld.tensor), []).extend(cg.contributions(ld, dims))
        if self.problems:
            seen: dict[tuple[str, object], Problem] = {}
            for p in self.problems:
                seen.setdefault((p.message, p.loc), p)
            found = sorted(seen.values(), key=lambda p: (p.loc is None, p.loc.file if p.loc else "",
                                                        p.loc.line if p.loc else 0,
                                                        p.loc.col if p.loc else 0))
            raise CompileError([Diagnostic("error", p.message, p.loc) for p in found])
        out: dict[int, Value] = {}
        for v in self.wrt:
            g = self.materialize(v)
            if g is None:
                dims = _grad_dims(v, None)
                g = self.emit(ComputeOp(v.type, dims, Const(0.0), name=self.grad_name(v)))
            out[id(v)] = g
        return out

    def allreduce_adjoint(self, op: AllReduceOp, needed: set[int]) -> None:
        """The adjoint of an all-reduce (mean): the all-reduce (mean) of its results'
        adjoints, passed to the operands (see the module doc)."""
        pairs: list[tuple[Value, Value]] = []
        for v, r in zip(op.values, op.results, strict=True):
            if id(r) not in needed or id(v) not in needed:
                continue
            dout = self.materialize(r)
            if dout is not None:
                pairs.append((v, dout))
        if not pairs:
            return
        attrs = {k: v for k, v in op.attrs.items() if k != PHASE}
        what = str(attrs.get("nf.collective", "gradients"))
        attrs["nf.collective"] = f"{what}-grad"
        attrs[PHASE] = "backward"
        ar = AllReduceOp([d for _, d in pairs], loc=op.loc, attrs=attrs,
                         names=[self.grad_name(v) + "_ar" for v, _ in pairs])
        self.new_ops.append(ar)
        for (v, _), g in zip(pairs, ar.results, strict=True):
            dims = self.g.dims.setdefault(id(v), _grad_dims(v, None))
            self.g.parts.setdefault(id(v), []).append(Contribution(dims, value=g))

    def materialize(self, v: Value) -> Value | None:
        """The summed gradient of `v` as one value (None when nothing reached it)."""
        if id(v) in self.g.done:
            return self.g.done[id(v)]
        parts = self.g.parts.get(id(v), [])
        if not parts:
            return None
        dims = self.g.dims[id(v)]
        x = tuple(Index(a.name) for a in dims)
        if len(parts) == 1 and parts[0].value is not None:
            res = parts[0].value
        elif (len(parts) == 1 and isinstance(parts[0].body, Load) and parts[0].dims == dims
              and parts[0].body.indices == x and parts[0].body.tensor.type == v.type):
            res = parts[0].body.tensor  # the gradient passes through unchanged (x + b)
        else:
            total: Expr | None = None
            for p in parts:
                term = p.body if p.body is not None else Load(p.value, x)  # type: ignore[arg-type]
                if p.dims != dims:
                    term = substitute_indices(term, {a.name: Index(b.name) for a, b in
                                                     zip(p.dims, dims, strict=True)})
                total = simp.add(total, term)
            assert total is not None
            res = self.emit(ComputeOp(TensorType(v.shape, v.dtype), dims, total,
                                      loc=v.owner.loc if v.owner else None,
                                      name=self.grad_name(v)))
        self.g.done[id(v)] = res
        return res


def _blocker(op: Op) -> Diagnostic:
    if isinstance(op, CallOp):
        return Diagnostic("error", f"cannot differentiate through nf.call @{op.callee}", op.loc,
                          (note("run the inline pass before autodiff"),))
    return Diagnostic("error", "cannot differentiate through nf.kernel", op.loc,
                      (note("kernels are formed after autodiff; run it before fusion"),))


def reverse_mode(func: Func, loss: Value, wrt: list[Value]
                 ) -> tuple[list[ComputeOp | AllReduceOp], list[Value]]:
    """Backward computes of `func` (to be placed after its forward ops) and the gradient of
    the loss w.r.t. each `wrt` value, in order. Raises CompileError listing every construct on
    a gradient path that cannot be differentiated."""
    rm = ReverseMode(func, loss, wrt)
    grads = rm.run()
    return rm.new_ops, [grads[id(v)] for v in wrt]


def grad_func(func: Func, wrt_names: list[str], loss_index: int = 0,
              name: str | None = None) -> Func:
    """A copy of `func` returning the loss and its gradients w.r.t. the named arguments.

    Handy for tests and for users who want gradients without an optimizer.
    """
    f = func.clone(name or f"{func.name}_grad")
    loss = f.ret.values[loss_index]
    wrt = [f.arg(n) for n in wrt_names]
    ops, grads = reverse_mode(f, loss, wrt)
    ret = f.ret
    rewriter = Rewriter()
    rewriter.insert_op_before(ops, ret)
    rewriter.update(ret, values=[loss, *grads])
    f.attrs.pop("nf.results", None)
    f.attrs["nf.results"] = ["loss"] + [f"grad:{n}" for n in wrt_names]
    return f
