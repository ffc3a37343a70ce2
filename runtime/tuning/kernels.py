"""Kernel identity and the use of tuned schedules: what the tuner and the compiler agree on.

**Identity.** A kernel's cache key is a hash of its canonical structural text: the compute
(or the computes of an `nf.kernel`) exactly as the code generator receives it after the pass
pipeline (canonicalize included), with every name erased. Tensors become positions
(`%a0, %a1, ...` in first-use order, which is also codegen's operand order; results of a
group's inner computes `%t0, ...`), index variables become positions (`d0, d1, ...` for the
output axes, `r0, ...` for the reduction axes), and every tensor carries its shape, dtype and
strides. So the same layer in two models, or every step of an unrolled RNN, shares one key,
while any change of shape, dtype, layout or index expression gives another.

**Tuning.** The tuner measures `canonical_compute(op)`, the compute rebuilt with exactly those
positional names, so a recorded schedule speaks of axes `d0`, `r0`, ... and applies to every
kernel with the key: `localize` renames its axis-valued parameters to a given op's own axes.

**Use.** `schedules_from_cache` answers "which kernels have a tuned schedule" for an artifact
builder (`build_artifact(schedule_for=schedule_lookup(...))`); `apply_cached_schedules`
writes the answers into the IR as each op's `nf.schedule` attribute, which codegen honours,
the IR printer shows and the library cache's hash of the printed module covers.

**Trust.** The cache is data from disk, so compiling trusts nothing in it blindly: a cache
that is damaged (or unreadable, or of a newer schema) is not used at all, with a warning, and
every kernel gets its default schedule; of a usable cache each kernel takes the fastest
record whose schedule is valid in the kernel's own schedule space and whose time is not below
`time_floor` (the time to move the kernel's bytes at an absurd bandwidth), so a forged or
broken record costs at most its own use, never a wrong or failing build.
"""

from __future__ import annotations

import hashlib
import math
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from nfc.ir import (
    Axis,
    Binary,
    Call,
    Cast,
    ComputeOp,
    Const,
    Expr,
    Func,
    Index,
    KernelOp,
    Load,
    Module,
    Op,
    Select,
    Unary,
    Value,
    YieldOp,
    substitute_indices,
    substitute_values,
)

#: Version of the canonical text; bumping it gives every kernel a new key.
KEY_VERSION = 1
#: Prefix of every kernel key (`nfc cache list --prefix nfk1-`).
KEY_PREFIX = f"nfk{KEY_VERSION}-"
#: The op attribute the code generator reads a schedule from (nfc.codegen.jit.SCHEDULE_ATTR).
SCHEDULE_ATTR = "nf.schedule"
#: Bytes per second no CPU moves a kernel's operands at (100 TB/s: above the summed L1
#: bandwidth of every core of today's largest CPUs); `time_floor` divides by it.
ABSURD_BANDWIDTH = 1e14

Warn = Callable[[str], None]
"""Hears a warning about the tuning cache (default: `nfc: warning: ...` on stderr)."""


def warn_stderr(message: str) -> None:
    """The default `Warn`: one `nfc: warning:` paragraph on stderr."""
    print(f"nfc: warning: {message}", file=sys.stderr, flush=True)

KernelLike = ComputeOp | KernelOp


def strides(shape: Sequence[int]) -> tuple[int, ...]:
    """C-contiguous strides, in elements (every nfc tensor is laid out this way today)."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return tuple(reversed(out))


def _tensor_text(v: Value) -> str:
    shape = "x".join(str(d) for d in v.shape)
    return f"{v.dtype}[{shape}]/{','.join(str(s) for s in strides(v.shape))}"


class _Writer:
    """Writes computes as positional text; one per kernel (values numbered across a group)."""

    def __init__(self) -> None:
        self.inputs: dict[int, int] = {}   # id(value) -> position among external inputs
        self.input_values: list[Value] = []
        self.inner: dict[int, int] = {}    # id(result of an inner compute) -> position

    def value(self, v: Value) -> str:
        if id(v) in self.inner:
            return f"%t{self.inner[id(v)]}"
        if id(v) not in self.inputs:
            self.inputs[id(v)] = len(self.inputs)
            self.input_values.append(v)
        return f"%a{self.inputs[id(v)]}"

    def expr(self, e: Expr, names: Mapping[str, str]) -> str:
        if isinstance(e, Const):
            dt = "" if e.dtype is None else f":{e.dtype}"
            return f"{type(e.value).__name__}({e.value!r}){dt}"
        if isinstance(e, Index):
            return names[e.name]
        if isinstance(e, Load):
            idx = ",".join(self.expr(x, names) for x in e.indices)
            return f"{self.value(e.tensor)}[{idx}]"
        if isinstance(e, Unary):
            return f"({e.op} {self.expr(e.x, names)})"
        if isinstance(e, Binary):
            return f"({e.op} {self.expr(e.a, names)} {self.expr(e.b, names)})"
        if isinstance(e, Call):
            return f"({e.fn} {' '.join(self.expr(a, names) for a in e.args)})"
        if isinstance(e, Select):
            return (f"(select {self.expr(e.cond, names)} {self.expr(e.a, names)} "
                    f"{self.expr(e.b, names)})")
        if isinstance(e, Cast):
            return f"({e.dtype} {self.expr(e.x, names)})"
        raise AssertionError(f"kernel identity does not know {type(e).__name__}")

    def compute(self, op: ComputeOp) -> str:
        names = axis_names(op)
        dims = ",".join(f"{names[a.name]}:{a.extent}" for a in op.dims)
        red = ""
        if op.reduce is not None:
            red = f" {op.reduce}[" + ",".join(f"{names[a.name]}:{a.extent}"
                                               for a in op.raxes) + "]"
        body = self.expr(op.body, names)
        return f"compute[{dims}]{red} {body} -> {_tensor_text(op.result)}"


def axis_names(op: ComputeOp) -> dict[str, str]:
    """Each axis name of `op` -> its positional name (`d<n>` output, `r<n>` reduction)."""
    out = {a.name: f"d{n}" for n, a in enumerate(op.dims)}
    out.update({a.name: f"r{n}" for n, a in enumerate(op.raxes)})
    return out


def _computes(op: KernelLike) -> tuple[list[ComputeOp], list[Value]]:
    if isinstance(op, ComputeOp):
        return [op], [op.result]
    body = [o for o in op.body.ops if not isinstance(o, YieldOp)]
    if not all(isinstance(o, ComputeOp) for o in body):
        raise ValueError("a kernel op may only contain computes")
    term = op.body.ops[-1]
    assert isinstance(term, YieldOp)
    return [o for o in body if isinstance(o, ComputeOp)], list(term.values)


def canonical_text(op: KernelLike) -> str:
    """The name-free structural text of a kernel (see the module docstring)."""
    w = _Writer()
    cops, outs = _computes(op)
    lines = []
    for n, c in enumerate(cops):
        lines.append(w.compute(c))
        w.inner[id(c.result)] = n
    ins = ";".join(f"%a{n}:{_tensor_text(v)}" for n, v in enumerate(w.input_values))
    results = ",".join(w.value(v) for v in outs)
    kind = "compute" if isinstance(op, ComputeOp) else "kernel"
    return f"nfc-kernel v{KEY_VERSION} {kind}\ninputs {ins}\n" + "\n".join(lines) + \
        f"\nyield {results}"


def kernel_key(op: KernelLike) -> str:
    """The tuning-cache key of a kernel: `nfk1-` and 32 hex digits of its canonical text."""
    return KEY_PREFIX + hashlib.sha256(canonical_text(op).encode()).hexdigest()[:32]


def canonical_compute(op: ComputeOp) -> ComputeOp:
    """`op` rebuilt with positional names: inputs `%a<n>` (fresh argument values, in operand
    order), axes `d<n>`/`r<n>`, the result `%out`, and no attributes. Its key is `op`'s key."""
    names = axis_names(op)
    args = {v: Value(v.type, f"a{n}") for n, v in enumerate(op.operands)}
    body = substitute_indices(op.body, {k: Index(v) for k, v in names.items()})
    body = substitute_values(body, args)
    return ComputeOp(op.result.type, tuple(Axis(names[a.name], a.extent) for a in op.dims),
                     body, reduce=op.reduce,
                     raxes=tuple(Axis(names[a.name], a.extent) for a in op.raxes), name="out")


def localize(schedule: Mapping[str, Any], op: ComputeOp) -> dict[str, Any]:
    """A schedule recorded for the canonical compute, with axis-valued parameters renamed to
    `op`'s own axes (schedule-space parameters name axes only by their whole name)."""
    back = {v: k for k, v in axis_names(op).items()}
    return {k: back.get(v, v) if isinstance(v, str) else v for k, v in schedule.items()}


def describe(op: KernelLike) -> str:
    """A short human-readable description for listings: kind, axes and operand types."""
    if isinstance(op, KernelOp):
        cops, _ = _computes(op)
        return f"kernel of {len(cops)} computes -> " + ", ".join(
            str(v.type) for v in op.results)
    from nfc.codegen.space import match_gemm

    kind = "gemm" if match_gemm(op) is not None else (op.reduce or "map")
    dims = "x".join(str(a.extent) for a in op.dims) or "scalar"
    red = ("/" + "x".join(str(a.extent) for a in op.raxes)) if op.raxes else ""
    ins = ", ".join(f"{v.dtype}[{'x'.join(map(str, v.shape))}]" for v in op.operands)
    return f"{kind} {dims}{red} {op.result.dtype} ({ins})"


# ---------------------------------------------------------------------------------------------
# the kernels of a module


@dataclass
class Kernel:
    """One distinct kernel of a module and every place it runs."""

    key: str
    op: KernelLike
    """The first occurrence (the one tuned)."""
    desc: str
    sites: list[tuple[str, int]] = field(default_factory=list)
    """(function, op position) of every occurrence."""
    locs: list[str] = field(default_factory=list)
    """Source locations of the occurrences (distinct, in order)."""

    @property
    def count(self) -> int:
        """How many times one call of the functions runs this kernel."""
        return len(self.sites)

    @property
    def tunable(self) -> bool:
        """Whether the code generator has a schedule space for it (single computes so far)."""
        return isinstance(self.op, ComputeOp)


def kernel_ops(func: Func) -> list[tuple[int, KernelLike]]:
    """The ops of `func` that become kernels, with their positions."""
    return [(n, op) for n, op in enumerate(func.body.ops) if isinstance(op, ComputeOp | KernelOp)]


def _loc_text(op: Op) -> str:
    site = op.attrs.get("nf.callsite")
    if isinstance(site, str):
        return site
    return str(op.loc) if op.loc is not None else ""


def collect_kernels(module: Module, functions: Iterable[str] | None = None) -> list[Kernel]:
    """The distinct kernels of `functions` (default: all) in first-seen order."""
    funcs = [module.func(n) for n in functions] if functions is not None else module.funcs
    found: dict[str, Kernel] = {}
    for f in funcs:
        for n, op in kernel_ops(f):
            key = kernel_key(op)
            k = found.get(key)
            if k is None:
                k = found[key] = Kernel(key, op, describe(op))
            k.sites.append((f.name, n))
            loc = _loc_text(op)
            if loc and loc not in k.locs:
                k.locs.append(loc)
    return list(found.values())


def flops_bytes(op: KernelLike) -> tuple[float, int]:
    """FLOPs and compulsory bytes of a kernel (nfc.cost)."""
    from nfc.cost import compute_cost

    cops, outs = _computes(op)
    flops = sum(compute_cost(c).flops for c in cops)
    if isinstance(op, ComputeOp):
        return flops, compute_cost(op).bytes
    inner = {id(c.result) for c in cops}
    ins = {id(v): v for c in cops for v in c.operands if id(v) not in inner}
    return flops, sum(v.type.nbytes for v in (*ins.values(), *outs))


def roofline_seconds(op: KernelLike, peak_flops: float = 50e9, bandwidth: float = 15e9,
                     overhead: float = 2e-7) -> float:
    """A rough time estimate of a kernel: the larger of compute and memory time plus a call
    overhead (used to order kernels when no profile is available; only ratios matter)."""
    flops, nbytes = flops_bytes(op)
    return max(flops / peak_flops, nbytes / bandwidth) + overhead


def kernel_spec(k: Kernel) -> dict[str, Any]:
    """The JSON spec the measuring worker rebuilds the canonical compute from
    (nfc.codegen.kernel_spec), with integer inputs used as indices kept in bounds."""
    from nfc.codegen.kernel_spec import kernel_spec as codegen_spec

    assert isinstance(k.op, ComputeOp), "only single computes are tuned"
    op = canonical_compute(k.op)
    spec = codegen_spec(op)
    used_as_index = {id(ld.tensor) for outer in op.body.walk() if isinstance(outer, Load)
                     for x in outer.indices for ld in x.walk() if isinstance(ld, Load)}
    for desc, v in zip(spec["inputs"], op.operands, strict=True):
        if not v.dtype.is_float and id(v) in used_as_index:
            desc["low"], desc["high"] = 0, 1  # zeros index every dimension safely
    spec["key"] = k.key  # informative; the worker ignores it
    return spec


# ---------------------------------------------------------------------------------------------
# using the cache


def open_cache(db: str | Path | None = None, *, warn: Warn | None = None) -> Any:
    """The tuning cache at `db` (default: nfc's default path) for reading, or None when
    there is no cache file yet (compiling never creates one) or when it cannot be used
    (damaged, not a tuning cache, a newer schema: `warn` hears why, and compiling goes on
    with default schedules)."""
    from nfc.runtime.tuning.cache import TuningCache, default_cache_path
    from nfc.runtime.tuning.model import CacheError

    path = Path(db) if db is not None else default_cache_path()
    try:
        if path.stat().st_size == 0:
            return None  # created by a tuner stopped before its first write: nothing in it
    except OSError:
        return None  # no file: nothing tuned yet
    try:
        return TuningCache(path, create=False)
    except CacheError as err:
        (warn or warn_stderr)(f"{err}\n  compiling with default schedules")
        return None


def time_floor(op: KernelLike) -> float:
    """The least time a record of `op` may claim to be used: the larger of `MIN_TIME` and
    the time to move the kernel's compulsory bytes at `ABSURD_BANDWIDTH`."""
    from nfc.runtime.tuning.model import MIN_TIME

    try:
        _, nbytes = flops_bytes(op)
    except (ValueError, KeyError, TypeError):
        nbytes = 0
    return max(MIN_TIME, nbytes / ABSURD_BANDWIDTH)


def _acceptable(op: KernelLike | None, entry: Any, floor: float) -> bool:
    if entry.time is None or entry.time < floor:
        return False
    return op is None or not isinstance(op, ComputeOp) or _usable(op, entry.schedule) is not None


def _best(cache: Any, category: Mapping[str, Any], key: str, reproducible: bool,
          op: KernelLike | None = None) -> dict[str, Any] | None:
    """The fastest record of `key` that `op` can use (see the module docstring): the cache's
    best when it is, else the fastest acceptable one among every ok record, pruned ones
    included (an unusable record may have pushed the good ones off the Pareto front)."""
    floor = time_floor(op) if op is not None else 0.0
    entry = cache.best(category, key, reproducible=reproducible)
    if entry is None:
        return None
    if _acceptable(op, entry, floor):
        return dict(entry.schedule)
    rest = [e for e in cache.entries(category, key, include_failed=False, include_pruned=True)
            if e.time is not None and (e.reproducible or not reproducible)]
    for e in sorted(rest, key=lambda e: (e.time, e.workspace)):
        if _acceptable(op, e, floor):
            return dict(e.schedule)
    return None


def schedules_from_cache(module_or_kernels: Module | Iterable[KernelLike | Kernel], cache: Any,
                         category: Mapping[str, Any] | None = None, *,
                         reproducible: bool = False,
                         warn: Warn | None = None) -> dict[str, dict[str, Any]]:
    """The best cached schedule of every kernel that has one: key -> schedule (in canonical
    axis names; `localize` renames them for one op). Only records of `category` (default:
    this machine's, nfc.runtime.tuning.default_category) are considered; `reproducible`
    selects the best bitwise-reproducible entry instead of the fastest. Records an op cannot
    use are passed over (see the module docstring). Damage met while reading: `warn` hears
    it and the answer is empty (default schedules for all)."""
    from nfc.runtime.tuning.category import default_category
    from nfc.runtime.tuning.model import CacheError

    category = category if category is not None else default_category()
    ops: dict[str, KernelLike | None] = {}
    if isinstance(module_or_kernels, Module):
        ops = {k.key: k.op for k in collect_kernels(module_or_kernels)}
    else:
        for k in module_or_kernels:
            if isinstance(k, Kernel):
                ops.setdefault(k.key, k.op)
            else:
                ops.setdefault(kernel_key(k), k)
    out: dict[str, dict[str, Any]] = {}
    if cache is None:
        return out
    try:
        for key, op in ops.items():
            best = _best(cache, category, key, reproducible, op)
            if best is not None:
                out[key] = best
    except CacheError as err:
        (warn or warn_stderr)(f"{err}\n  compiling with default schedules")
        return {}
    return out


def _usable(op: Op, schedule: Mapping[str, Any]) -> dict[str, Any] | None:
    """`schedule` localized to `op` if the code generator accepts it for `op`."""
    if not isinstance(op, ComputeOp):
        return None  # fused kernels have no schedule space yet
    from nfc.codegen.space import schedule_space

    local = localize(schedule, op)
    try:
        return local if schedule_space(op).is_valid(local) else None
    except (KeyError, TypeError, ValueError):
        return None


def schedule_lookup(module: Module, cache: Any, category: Mapping[str, Any] | None = None, *,
                    reproducible: bool = False,
                    warn: Warn | None = None) -> Callable[[Op], dict[str, Any] | None]:
    """A `schedule_for(op)` callback for `build_artifact`: the op's best cached schedule
    (localized to its axes), or None to let the builder use the IR's or the default."""
    table = schedules_from_cache(module, cache, category, reproducible=reproducible, warn=warn)

    def schedule_for(op: Op) -> dict[str, Any] | None:
        if not isinstance(op, ComputeOp | KernelOp):
            return None
        sched = table.get(kernel_key(op))
        return None if sched is None else _usable(op, sched)
    return schedule_for


@dataclass(frozen=True)
class CacheUse:
    """What `apply_cached_schedules` did."""

    found: int
    """Distinct kernels given a tuned schedule from the cache."""
    total: int
    """Distinct kernels of the module."""
    calls_found: int
    """Kernel calls (ops) given a tuned schedule."""
    calls: int
    """Kernel calls (ops) of the module."""
    kept: int = 0
    """Ops that already carried an `nf.schedule` (left alone)."""
    path: str = ""
    """The cache file, empty when there is none."""
    problem: str = ""
    """Why the cache file was not used (damaged, unreadable); empty when it was."""

    def message(self) -> str:
        """One line for `nfc compile` / `nfc train`."""
        if self.problem:
            return (f"tuning cache: {self.path} not used ({self.problem}); default schedules "
                    f"for all {self.total} kernels")
        if not self.path:
            return f"tuning cache: none; default schedules for all {self.total} kernels"
        text = (f"tuning cache: {self.found} of {self.total} kernels found "
                f"({self.calls_found} of {self.calls} kernel calls) in {self.path}")
        if self.kept:
            text += f"; {self.kept} kept the schedule given in the IR"
        return text


def apply_cached_schedules(module: Module, cache: Any = None,
                           category: Mapping[str, Any] | None = None, *,
                           db: str | Path | None = None, reproducible: bool = False,
                           overwrite: bool = False, warn: Warn | None = None) -> CacheUse:
    """Give every kernel op with a tuned schedule in the cache that schedule, as its
    `nf.schedule` attribute (ops that already have one keep it unless `overwrite`).

    `cache` is an open TuningCache; without one the file `db` (default: nfc's default cache
    path) is opened read-only if it exists. Only records of `category` (default: this
    machine's) are used. A cache that cannot be used (damaged) is left alone: `warn` hears
    why (default: stderr) and every kernel keeps its default schedule.
    """
    from nfc.runtime.tuning.cache import default_cache_path

    problems: list[str] = []

    def note(message: str) -> None:
        problems.append(message)
        (warn or warn_stderr)(message)

    own = cache is None
    if own:
        cache = open_cache(db, warn=note)
    try:
        kernels = collect_kernels(module)
        table = schedules_from_cache(kernels, cache, category, reproducible=reproducible,
                                     warn=note)
        found: set[str] = set()
        calls_found = kept = 0
        for k in kernels:
            sched = table.get(k.key)
            for fname, n in k.sites:
                op = module.func(fname).body.ops[n]
                if SCHEDULE_ATTR in op.attrs and not overwrite:
                    kept += 1
                    continue
                local = None if sched is None else _usable(op, sched)
                if local is not None:
                    op.attrs[SCHEDULE_ATTR] = local
                    found.add(k.key)
                    calls_found += 1
        path = str(cache.path) if cache is not None else ""
        if problems:
            path = path or str(Path(db) if db is not None else default_cache_path())
        return CacheUse(len(found), len(kernels), calls_found, sum(k.count for k in kernels),
                        kept, path, ("damaged" if "damaged" in problems[0] else "unusable")
                        if problems else "")
    finally:
        if own and cache is not None:
            cache.close()


def geometric_mean(xs: Iterable[float]) -> float:
    """The geometric mean of positive numbers (1.0 for none)."""
    vals = [math.log(x) for x in xs if x > 0]
    return math.exp(sum(vals) / len(vals)) if vals else 1.0
