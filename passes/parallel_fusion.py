"""The `parallel-fusion` pass: NeoFlow's parallel fusion (section 4) of sibling computes."""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

from nfc.ir import (
    Axis,
    Binary,
    Block,
    ComputeOp,
    Const,
    DType,
    Expr,
    Func,
    Index,
    Load,
    Module,
    Op,
    Select,
    TensorType,
    Value,
    index_names,
    substitute_indices,
)
from nfc.passes.cse import INFO_ATTRS
from nfc.passmanager import Context, ModulePass
from nfc.printer import format_attr_dict
from nfc.rewrite import Rewriter

#: Stands for every tensor in a body template (two bodies with equal templates differ only in
#: which tensors they load).
_SLOT = Value(TensorType((1,), DType.F32), "_slot")


@dataclass(frozen=True)
class ParallelFusion(ModulePass):
    """Merge computes that share an input and have no data dependence into one compute.

    Before:  %a = nf.compute [i: 64, j: 128] sum [k: 256] (%x[i, k] * %w1[k, j]) ...
             %b = nf.compute [i: 64, j: 128] sum [k: 256] (%x[i, k] * %w2[k, j]) ...
    After:   %w = nf.compute [d0: 256, d1: 256] (%w1[d0, d1] if d1 < 128 else %w2[d0, d1 - 128])
             %ab = nf.compute [i: 64, j: 256] sum [k: 256] (%x[i, k] * %w[k, j]) ...
             %a = nf.compute [i: 64, j: 128] (%ab[i, j])
             %b = nf.compute [i: 64, j: 128] (%ab[i, j + 128])

    Computes of one block are siblings when their bodies are equal once their axes are renamed
    by position and the tensors they load are ignored, their reductions and attributes agree,
    at least one load reads the same tensor in all of them (the shared input), and none depends
    on another. They fuse along the first output dimension `j` (in order) such that: their
    extents agree on every other dimension; the shared loads do not mention `j`; every other
    load (a differing operand) has `j` alone as one index, not in the others, and the tensor's
    size there is the compute's extent along `j`; and `j` appears nowhere else in the body.
    Each differing operand is concatenated along that index (a select on `j`), the fused
    compute runs over the summed extent, and each original becomes a slice of it with an
    offset (the `fuse` pass usually folds the slices into their readers). At most `max_width`
    computes are merged into one. Ops between the first and the last sibling that depend on
    an earlier sibling are moved after the fused group.

    The concatenation of weights is a compute like any other: in a train step it runs every
    step. With `layout=true` (NeoFlow's weight pre-transformation; run it on `@forward`
    before `training-functions`) a concatenation of trainable parameter arguments that
    nothing else reads becomes the parameter itself: the parts' arguments are replaced by one
    argument of the concatenated shape carrying `nf.layout = {parts, axis, offsets, inits}`,
    so autodiff and the optimizer work on the fused parameter and no copy is made per step.
    """

    name: ClassVar[str] = "parallel-fusion"

    max_width: int = 8
    """Most computes merged into one."""
    min_reduction: int = 1
    """Only computes with a reduction of at least this many elements (1: all computes with
    a reduction; 0: elementwise computes too)."""
    layout: bool = False
    """Fuse only groups whose differing operands are trainable parameters (or whole slices
    of them) and make each concatenation the parameters' layout: one fused parameter
    argument with `nf.layout` instead of a concatenation computed every step (only before
    `training-functions`, and only with an elementwise optimizer)."""

    def apply(self, ctx: Context, module: Module) -> None:
        """Fuse siblings in every function of `module`."""
        n = 0
        record: dict[str, list[tuple[ComputeOp, list[Value], int]]] = {}
        for func in module.funcs:
            record[func.name] = []
            n += fuse_func(func, self, record[func.name])
        msg = f"{n} groups of parallel computes fused"
        if self.layout:
            fused = layout_params(module, record)
            msg += f"; {len(fused)} fused parameter(s) laid out: " + (
                ", ".join(f"{k} = [{', '.join(v)}]" for k, v in fused.items()) or "none")
        ctx.remarks[self.name] = msg


def fuse_func(func: Func, opts: ParallelFusion,
              record: list[tuple[ComputeOp, list[Value], int]] | None = None) -> int:
    """Fuse sibling computes of the top-level block of `func`; the number of groups fused.
    Each concatenation made is appended to `record` (the op, its tensors, the axis)."""
    rewriter = Rewriter()
    keys: dict[Op, object] = {op: _template(op) for op in func.body.ops
                              if isinstance(op, ComputeOp)}
    counts: dict[object, int] = {}
    for k in keys.values():
        counts[k] = counts.get(k, 0) + 1
    count = 0
    for op in list(func.body.ops):
        if op.attached and counts.get(keys.get(op), 0) >= 2 and _try_fuse(
                op, func.body, opts, rewriter, keys, record, func):
            count += 1
    return count


# ---------------------------------------------------------------------------------------------
# matching


def _loads_post(body: Expr) -> list[Load]:
    """The loads of `body` in the order `Expr.map` visits them (children first)."""
    out: list[Load] = []

    def visit(e: Expr) -> None:
        if isinstance(e, Load):
            out.append(e)

    body.map(lambda e: visit(e))  # type: ignore[func-returns-value]
    return out


def _renamed(op: ComputeOp) -> Expr:
    """The body with axes renamed by position (`_000`, ...)."""
    names = {a.name: Index(f"_{n:03d}") for n, a in enumerate(op.all_axes)}
    return substitute_indices(op.body, names)


def _template(op: ComputeOp) -> tuple[object, ...]:
    """A key equal for computes that are siblings up to which tensors they load."""
    if op.reduce is None and not op.raxes:
        reduce_size = 0
    else:
        reduce_size = 1
        for a in op.raxes:
            reduce_size *= a.extent
    body = _renamed(op).map(lambda e: Load(_SLOT, e.indices) if isinstance(e, Load) else None)
    attrs = format_attr_dict({k: v for k, v in op.attrs.items() if k not in INFO_ATTRS})
    return (op.result.dtype, len(op.dims), op.reduce, tuple(a.extent for a in op.raxes), body,
            attrs, reduce_size)


def _ancestor_in(op: Op, block: Block) -> Op | None:
    """`op` or the op containing it that sits in `block`."""
    while op is not None and op.parent is not block:
        parent = op.parent.parent if op.parent is not None else None
        op = parent if isinstance(parent, Op) else None  # type: ignore[assignment]
    return op


@dataclass
class _Group:
    members: list[ComputeOp]
    moved: list[Op]           # ops between first and last member that depend on a member
    shared: list[bool]        # per load slot
    dim: int                  # the output dimension fused along
    axes: list[int]           # per differing slot: the index position that is the dim


def _fusible_dim(a: ComputeOp, b: ComputeOp, shared: list[bool]) -> tuple[int, list[int]] | None:
    """The first output dimension along which `a` and `b` fuse, with per slot the index
    position of each differing load along it."""
    la, lb = _loads_post(_renamed(a)), _loads_post(_renamed(b))
    body = _renamed(a)
    for p in range(len(a.dims)):
        if any(x.extent != y.extent for q, (x, y) in enumerate(zip(a.dims, b.dims, strict=True))
               if q != p):
            continue
        name = f"_{p:03d}"
        axes: list[int] = []
        ok = True
        for s, (x, y) in enumerate(zip(la, lb, strict=True)):
            if shared[s]:
                if any(name in index_names(i) for i in x.indices):
                    ok = False
                continue
            pos = [q for q, i in enumerate(x.indices) if i == Index(name)]
            others = [q for q, i in enumerate(x.indices) if q not in pos and name in index_names(i)]
            if len(pos) != 1 or others or any(_loads_post(i) for i in x.indices):
                ok = False
                break
            q = pos[0]
            if (x.tensor.shape[q] != a.dims[p].extent or y.tensor.shape[q] != b.dims[p].extent
                    or x.tensor.dtype != y.tensor.dtype
                    or [d for k, d in enumerate(x.tensor.shape) if k != q]
                    != [d for k, d in enumerate(y.tensor.shape) if k != q]):
                ok = False
                break
            axes.append(q)
        if not ok:
            continue
        # `j` anywhere but in a differing load: not fusible along it
        rest = body.map(lambda e: Const(0) if isinstance(e, Load) else None)
        if name in index_names(rest):
            continue
        return p, axes
    return None


def _find_group(first: ComputeOp, block: Block, opts: ParallelFusion,
                keys: dict[Op, object]) -> _Group | None:
    key = keys[first]
    if key is None or key[-1] < max(opts.min_reduction, 0) or (
            opts.min_reduction > 0 and first.reduce is None):
        return None
    ops = block.ops
    start = ops.index(first)
    first_loads = _loads_post(first.body)
    members = [first]
    dependent: set[Op] = set()
    moved: list[Op] = []
    shared: list[bool] | None = None
    found: tuple[int, list[int]] | None = None
    taken: set[Op] = {first}
    for op in ops[start + 1:]:
        if len(members) >= opts.max_width:
            break
        depends = any((o := v.owner) is not None and (anc := _ancestor_in(o, block)) is not None
                      and (anc in taken or anc in dependent) for v in op.operands)
        if depends:
            dependent.add(op)
            moved.append(op)
            continue
        if not isinstance(op, ComputeOp) or keys.get(op) != key:
            continue
        loads = _loads_post(op.body)
        same = [x.tensor is y.tensor for x, y in zip(first_loads, loads, strict=True)]
        if shared is None:
            if not any(same):
                continue
            fd = _fusible_dim(first, op, same)
            if fd is None:
                continue
            shared, found = same, fd
        else:
            if any(s and not m for s, m in zip(shared, same, strict=True)):
                continue
            fd = _fusible_dim(first, op, shared)
            if fd is None or fd[0] != found[0]:  # type: ignore[index]
                continue
        members.append(op)
        taken.add(op)
    if len(members) < 2 or shared is None or found is None:
        return None
    last = members[-1]
    moved = [m for m in moved if ops.index(m) < ops.index(last)]
    return _Group(members, moved, shared, found[0], found[1])


# ---------------------------------------------------------------------------------------------
# rewriting


def _concat(tensors: list[Value], axis: int, loc: object) -> ComputeOp:
    """`%t = nf.compute [d0: .., dq: n1 + n2 + ..] (%t1[..] if dq < n1 else %t2[.., dq - n1])`."""
    shape = list(tensors[0].shape)
    sizes = [t.shape[axis] for t in tensors]
    shape[axis] = sum(sizes)
    dims = tuple(Axis(f"d{k}", n) for k, n in enumerate(shape))
    idx: list[Expr] = [Index(a.name) for a in dims]
    q = Index(dims[axis].name)
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]

    def part(k: int) -> Expr:
        at = list(idx)
        at[axis] = q - Const(offsets[k]) if offsets[k] else q
        return Load(tensors[k], tuple(at))

    body = part(len(tensors) - 1)
    for k in range(len(tensors) - 2, -1, -1):
        body = Select(Binary("<", q, Const(offsets[k] + sizes[k])), part(k), body)
    return ComputeOp(TensorType(tuple(shape), tensors[0].dtype), dims, body,
                     loc=loc)  # type: ignore[arg-type]


def _try_fuse(op: Op, block: Block, opts: ParallelFusion, rewriter: Rewriter,
              keys: dict[Op, object],
              record: list[tuple[ComputeOp, list[Value], int]] | None = None,
              func: Func | None = None) -> bool:
    if not isinstance(op, ComputeOp) or opts.max_width < 2:
        return False
    group = _find_group(op, block, opts, keys)
    if group is None:
        return False
    first, p = group.members[0], group.dim
    sizes = [m.dims[p].extent for m in group.members]
    offsets = [sum(sizes[:k]) for k in range(len(sizes))]
    member_loads = [_loads_post(m.body) for m in group.members]
    if opts.layout and func is not None and not _params_only(group, member_loads, func):
        return False
    new_ops: list[Op] = []
    replacement: list[Load] = []
    d = 0
    concats: dict[tuple[int, ...], Value] = {}
    for s, ld in enumerate(member_loads[0]):
        if group.shared[s]:
            replacement.append(ld)
            continue
        tensors = [loads[s].tensor for loads in member_loads]
        axis = group.axes[d]
        d += 1
        key = (axis, *(id(t) for t in tensors))
        if key not in concats:
            cat = _concat(tensors, axis, first.loc)
            new_ops.append(cat)
            if record is not None:
                record.append((cat, tensors, axis))
            concats[key] = cat.result
        replacement.append(Load(concats[key], ld.indices))
    it = iter(replacement)
    body = first.body.map(lambda e: next(it) if isinstance(e, Load) else None)
    dims = list(first.dims)
    dims[p] = Axis(dims[p].name, sum(sizes))
    shape = list(first.result.type.shape)
    shape[p] = sum(sizes)
    fused = ComputeOp(TensorType(tuple(shape), first.result.dtype), tuple(dims), body,
                      reduce=first.reduce, raxes=first.raxes, loc=first.loc,
                      attrs=dict(first.attrs))
    new_ops.append(fused)
    slices: list[ComputeOp] = []
    for m, off in zip(group.members, offsets, strict=True):
        at: list[Expr] = [Index(a.name) for a in m.dims]
        if off:
            at[p] = at[p] + Const(off)
        slices.append(ComputeOp(m.result.type, m.dims, Load(fused.result, tuple(at)),
                                loc=m.loc, attrs=dict(m.attrs), name=m.result.name))
    new_ops.extend(slices)
    last = group.members[-1]
    anchor = block.ops[block.ops.index(last) + 1]
    rewriter.insert_op_before(new_ops, anchor)
    for m in group.moved:
        rewriter.move_op_before(m, anchor)
    for m, sl in zip(group.members, slices, strict=True):
        rewriter.replace_all_uses_with(m.result, sl.result)
        rewriter.erase_op(m)
    return True


# ---------------------------------------------------------------------------------------------
# the concatenated weight as the parameters' layout (`layout=true`)

#: Optimizers that update every element on its own (global-norm clipping included: the norm
#: over all parameters does not depend on how they are split), so a fused parameter follows
#: the same trajectory as its parts.
ELEMENTWISE_OPTIMIZERS = frozenset({"sgd", "adam", "adamw"})
#: The attribute of a fused parameter argument.
LAYOUT_ATTR = "nf.layout"


def _optimizer_ok(module: Module) -> bool:
    opt = module.attrs.get("nf.optimizer")
    if opt is None:
        return True
    return isinstance(opt, dict) and str(opt.get("name", "")).lower() in ELEMENTWISE_OPTIMIZERS


def _source(t: Value, func: Func) -> tuple[Value, tuple[int, ...], ComputeOp | None] | None:
    """`t` as a part of an argument: the argument itself, or a compute that is a whole slice
    `%p[c0, .., d0, d1, ..]` of argument `p` at leading constants (BERT's per-layer weight
    `%wq[l, k, m]`): the argument, the constants and the slice compute."""
    if t in func.args:
        return t, (), None
    op = t.owner
    if (not isinstance(op, ComputeOp) or op.reduce is not None or op.raxes
            or not isinstance(op.body, Load) or op.body.tensor not in func.args):
        return None
    p, idx = op.body.tensor, op.body.indices
    lead = len(idx) - len(op.dims)
    if lead < 0 or p.shape[lead:] != t.shape or p.dtype != t.dtype:
        return None
    if any(i != Index(a.name) for i, a in zip(idx[lead:], op.dims, strict=True)):
        return None
    consts = []
    for i in idx[:lead]:
        if not isinstance(i, Const) or not isinstance(i.value, int) or isinstance(i.value, bool):
            return None
        consts.append(i.value)
    return p, tuple(consts), op


def _groups(func: Func, record: list[tuple[ComputeOp, list[Value], int]]
            ) -> dict[tuple[tuple[str, ...], int], list[tuple[ComputeOp, tuple[int, ...],
                                                            list[ComputeOp]]]]:
    """The concatenations of `func` whose operands are parts of arguments, by (argument
    names, axis in the arguments): each with its leading constants and slice computes."""
    out: dict[tuple[tuple[str, ...], int], list[tuple[ComputeOp, tuple[int, ...],
                                                       list[ComputeOp]]]] = {}
    for cat, tensors, axis in record:
        if not cat.attached:
            continue
        srcs = [_source(t, func) for t in tensors]
        if any(x is None for x in srcs):
            continue
        leads = {x[1] for x in srcs if x is not None}
        if len(leads) != 1:
            continue
        lead = leads.pop()
        names = tuple(x[0].name or "" for x in srcs if x is not None)
        slices = [x[2] for x in srcs if x is not None and x[2] is not None]
        out.setdefault((names, axis + len(lead)), []).append((cat, lead, slices))
    return out


def _params_only(group: _Group, member_loads: list[list[Load]], func: Func) -> bool:
    """Whether every differing operand of `group` is a trainable parameter argument of
    `func` or a whole slice of one (what `layout=true` fuses: other groups would concatenate
    activations every step)."""
    attrs = {a: at for a, at in zip(func.args, func.arg_attrs, strict=True)}
    for s, shared in enumerate(group.shared):
        if shared:
            continue
        for loads in member_loads:
            src = _source(loads[s].tensor, func)
            if src is None or not _trainable_param(attrs.get(src[0])):
                return False
    return True


def layout_params(module: Module, record: dict[str, list[tuple[ComputeOp, list[Value], int]]]
                  ) -> dict[str, list[str]]:
    """Replace, in `@forward` (and the other functions with the same parameters), every
    concatenation of trainable parameter arguments (or of whole slices of them at constant
    leading indices) that only such concatenations of the same parts read by one fused
    parameter argument with `nf.layout`. Returns the fused names and their parts. Nothing is
    done after `training-functions` (the train step's signature is fixed by then) or with an
    optimizer that is not elementwise."""
    if not module.has_func("forward") or module.has_func("train_step"):
        return {}
    if not _optimizer_ok(module):
        return {}
    fwd = module.func("forward")
    attrs_of = {a.name: at for a, at in zip(fwd.args, fwd.arg_attrs, strict=True)}
    arg_of = {a.name: a for a in fwd.args}
    claimed: set[str] = set()
    used_names = {a.name for f in module.funcs for a in f.args if a.name}
    groups = {f.name: _groups(f, record.get(f.name, [])) for f in module.funcs}
    out: dict[str, list[str]] = {}
    for (names, axis), cats in groups["forward"].items():
        parts = list(names)
        if (len(set(parts)) != len(parts) or not all(parts) or claimed & set(parts)
                or any(not _trainable_param(attrs_of.get(n)) or LAYOUT_ATTR in attrs_of[n]
                       for n in parts)):
            continue
        args = [arg_of[n] for n in parts]
        readers = {c for c, _, sl in cats for c in (c, *sl)}
        slices = {s for _, _, sl in cats for s in sl}
        if any(set(a.uses) - readers for a in args) or any(
                set(s.result.uses) - readers for s in slices):
            continue
        shape0 = args[0].shape
        if any(a.dtype != args[0].dtype or len(a.shape) != len(shape0)
               or any(x != y for k, (x, y) in enumerate(zip(a.shape, shape0, strict=True))
                      if k != axis) for a in args):
            continue
        claimed.update(parts)
        sizes = [a.shape[axis] for a in args]
        offsets = [sum(sizes[:k]) for k in range(len(sizes))]
        name = "_".join(parts)
        k = 1
        while name in used_names:
            k += 1
            name = f"{'_'.join(parts)}_{k}"
        used_names.add(name)
        layout = {"parts": parts, "axis": axis, "offsets": offsets,
                  "inits": [str(attrs_of[n].get("nf.init", "zeros")) for n in parts]}
        attrs = {"nf.role": "param", "nf.init": "zeros", "nf.trainable": True,
                 LAYOUT_ATTR: layout}
        shape = list(shape0)
        shape[axis] = sum(sizes)
        ftype = TensorType(tuple(shape), args[0].dtype)
        for func in module.funcs:
            _relayout(func, parts, axis, offsets, ftype, name, attrs,
                      groups[func.name].get((names, axis), []))
        out[name] = parts
    return out


def _trainable_param(attrs: dict[str, object] | None) -> bool:
    return (attrs is not None and attrs.get("nf.role") == "param"
            and attrs.get("nf.trainable", True) is not False)


def _slice_of(new: Value, t: TensorType, lead: tuple[int, ...], axis: int, off: int,
              loc: object, name: str | None) -> ComputeOp:
    """`nf.compute [d..] (%new[lead.., d.. (+ off along axis)])`: a part of the fused
    parameter (or, off 0 and the whole extent, a concatenation of parts of one layer)."""
    dims = tuple(Axis(f"d{k}", n) for k, n in enumerate(t.shape))
    at: list[Expr] = [Const(c) for c in lead] + [Index(a.name) for a in dims]
    if off:
        at[axis] = at[axis] + Const(off)
    return ComputeOp(t, dims, Load(new, tuple(at)), loc=loc,  # type: ignore[arg-type]
                     name=name)


def _relayout(func: Func, parts: list[str], axis: int, offsets: list[int], ftype: TensorType,
              name: str, attrs: dict[str, object],
              cats: list[tuple[ComputeOp, tuple[int, ...], list[ComputeOp]]]) -> None:
    """In `func`: the argument `name` of type `ftype` replaces the arguments `parts`; the
    concatenations `cats` become the argument (or a slice of it at their leading
    constants), any other reader of a part reads a slice of it."""
    pos = {a.name: k for k, a in enumerate(func.args)}
    if not all(p in pos for p in parts):
        return
    old = [func.args[pos[p]] for p in parts]
    new = Value(ftype, name)
    rewriter = Rewriter()
    for cat, lead, slices in cats:
        if lead:
            sl = _slice_of(new, cat.result.type, lead, axis - len(lead), 0, cat.loc, None)
            rewriter.insert_op_before(sl, cat)
            rewriter.replace_all_uses_with(cat.result, sl.result)
        else:
            rewriter.replace_all_uses_with(cat.result, new)
        rewriter.erase_op(cat)
        for s in slices:
            if s.attached and not s.result.has_uses:
                rewriter.erase_op(s)
    made: list[tuple[Value, ComputeOp]] = []
    for v, off in zip(old, offsets, strict=True):
        if v.has_uses:
            made.append((v, _slice_of(new, v.type, (), axis, off, func.loc, v.name)))
    if made:
        rewriter.insert_op_before([sl for _, sl in made], func.body.ops[0])
        for v, sl in made:
            rewriter.replace_uses_with_if(v, sl.result, lambda op, sl=sl: op is not sl)
    first = min(pos[p] for p in parts)
    args, arg_attrs = [], []
    for k, (a, at) in enumerate(zip(func.args, func.arg_attrs, strict=True)):
        if k == first:
            args.append(new)
            arg_attrs.append(copy.deepcopy(attrs))
        elif a not in old:
            args.append(a)
            arg_attrs.append(at)
    func.args, func.arg_attrs = args, arg_attrs


#: What `with_param_layout` puts before `training-functions`: the cleanup parallel fusion
#: needs (calls inlined, duplicates merged), then the pass with the layout.
LAYOUT_PIPELINE = "inline,canonicalize,cse,dce,parallel-fusion{layout=true}"


def with_param_layout(pipeline: str) -> str:
    """`pipeline` with `LAYOUT_PIPELINE` before its first `training-functions` (`nfc compile`
    and `nfc train --param-layout concat`); unchanged when it has none or already lays out."""
    from nfc.passmanager import build_pipeline, format_pipeline

    passes = build_pipeline(pipeline)
    names = [p.name for p in passes]
    if "training-functions" not in names or any(
            isinstance(p, ParallelFusion) and p.layout for p in passes):
        return pipeline
    k = names.index("training-functions")
    return format_pipeline([*passes[:k], *build_pipeline(LAYOUT_PIPELINE), *passes[k:]])
