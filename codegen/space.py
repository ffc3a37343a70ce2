"""Schedule spaces: every tunable parameter of a compute's schedule with its candidate values,
the heuristic default, validity, and the mapping from a parameter dict to a `Schedule`.

Two templates:
- `GemmSpace` for contractions recognised by pattern (`match_gemm`): one sum axis `k`, a
  product of two loads indexed `(.., i, .., k)` and `(.., k, .., j)` (plus shared batch axes).
  The schedule packs B into zero-padded panels of NR columns (and optionally A into panels of
  MR rows), blocks K by KC and M by MC for the caches, and runs an MR x NR register-blocked
  micro-kernel (broadcast A, vector loads of B, FMAs into MR*NR/W vector accumulators) with
  the k loop unrolled.
- `LoopSpace` for everything else: a vectorized axis (an output axis, or a reduction axis
  with per-lane partial results), a register tile of vectors and of a second output axis for
  reductions, an unrolled innermost reduction, and fused parallel outer loops.

The tuner (nfc.runtime.tuning.search) searches `params`; `to_schedule(cfg)` gives the schedule.

Checking schedules that come from outside (an `nf.schedule` attribute in IR text, a record of
an imported tuning cache): `schedule_problem(op, value)` says why a value cannot be `op`'s
schedule, `template_problem(cfg)` why a parameter dict fits neither template when the kernel
is unknown. Both accept what a machine with other vector registers may have chosen: the
register limits and the vector widths of the host are the tuner's concern, not a reason to
refuse a schedule that lowers correctly on any target.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nfc.affine import to_affine
from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.schedule import SCHEDULE_VERSION, Pack, Schedule, Split
from nfc.contraction import flatten, match_contraction, plain_names
from nfc.ir import Binary, ComputeOp, Const, Expr, Func, Index, KernelOp, Load, Op, index_names

#: Below this many multiply-adds a kernel runs on one thread (GOMP start-up costs ~ 2-5 us).
PARALLEL_WORK = 1 << 16
#: Contractions with fewer multiply-adds (batch included) get the loop template's default
#: schedule (`default_schedule`; their space stays the GEMM template for the tuner): packing B
#: and the 6 x 16 micro-kernel do not pay for themselves there. Measured (one thread, Zen 3) the
#: loop template ran 64x64x64 in 7.3 us vs 9.4, 64x10x64 in 2.6 vs 3.3, and compiled in a
#: third of the time (~300 vs ~1,100 lines of LLVM IR); 128^3 is where the GEMM template wins.
SMALL_GEMM_WORK = 1 << 18
#: The op attribute holding a schedule recorded in IR (nfc.codegen.jit.SCHEDULE_ATTR).
SCHEDULE_ATTR = "nf.schedule"

#: The GEMM template's parameters and candidate values (the same on every target).
GEMM_PARAMS: dict[str, tuple[int, ...]] = {
    "mr": (1, 2, 3, 4, 5, 6, 8, 10, 12, 14),
    "nv": (1, 2, 3, 4),
    "mc_tiles": tuple(range(1, 49)),
    "kc": tuple(range(16, 513, 16)),
    "ku": (1, 2, 4, 8),
    "pack_a": (0, 1),
    "parallel": (0, 1),
}
#: The loop template's parameters whose candidate values do not depend on the kernel or the
#: target (`vec_axis`, `tile_axis` and `vec` do).
LOOP_FIXED_PARAMS: dict[str, tuple[int, ...]] = {
    "nvec": (1, 2, 4, 8, 16, 32, 64),
    "vec_split": (1, 2, 3, 4),
    "tile": (1, 2, 3, 4, 6, 8),
    "kunroll": (1, 2, 4, 8),
    "parallel": (0, 1),
}
#: The loop template's parameters.
LOOP_PARAM_NAMES = frozenset({"vec_axis", "vec", "tile_axis", *LOOP_FIXED_PARAMS})
#: Vector widths (elements) the loop template offers on some target: `{1, w/2, w, 2w}` for
#: `w` lanes, so the powers of two up to twice the lanes of one-byte elements in a 512-bit
#: (AVX-512) register.
ANY_VEC = (1, 2, 4, 8, 16, 32, 64, 128)
#: Most vector registers of any CPU target nfc generates code for (AVX-512: 32).
MAX_VECTOR_REGISTERS = 32


@dataclass(frozen=True)
class GemmPattern:
    """Roles of the axes and operands of a GEMM-like compute."""

    i: str
    j: str
    k: str
    batch: tuple[str, ...]
    a: int
    """Operand number (in `op.operands`) of the load indexed by i and k."""
    b: int
    """Operand number of the load indexed by k and j."""
    a_dim: int
    """Dimension of A indexed by i."""
    b_dim: int
    """Dimension of B indexed by j."""
    kouter: tuple[str, ...] = ()
    """Reduction axes looped outside the GEMM (C accumulates over them)."""


def match_gemm(op: ComputeOp) -> GemmPattern | None:
    """The GEMM roles of `op`, or None when it is not `sum_k A[.., i, .., k] * B[.., k, .., j]`
    with single axes i, j, k (nfc.contraction: other output axes are batch loops, other
    reduction axes outer reduction loops). A contraction over runs of axes (a convolution over
    gathered columns) is matched on its flattened view (nfc.contraction.flatten)."""
    c = match_contraction(op)
    if c is None or not c.is_gemm:
        return None
    operands = op.operands
    a = next(n for n, v in enumerate(operands) if v is c.a.tensor)
    b = next(n for n, v in enumerate(operands) if v is c.b.tensor)
    na, nb = plain_names(c.a), plain_names(c.b)
    assert na is not None and nb is not None
    return GemmPattern(c.i[0], c.j[0], c.k[0], c.batch, a, b, na.index(c.i[0]),
                       nb.index(c.j[0]), c.kouter)


def _ceil_to(x: int, m: int) -> int:
    return -(-x // m) * m


class GemmSpace:
    """The schedule space of a GEMM-like compute (see the module docstring)."""

    kind = "gemm"

    def __init__(self, op: ComputeOp, pattern: GemmPattern, target: CpuTarget | None = None):
        self.op, self.p = op, pattern
        self.target = target or host_target()
        ext = {a.name: a.extent for a in op.all_axes}
        self.m, self.n, self.kk = ext[pattern.i], ext[pattern.j], ext[pattern.k]
        self.w = self.target.lanes(op.result.dtype)
        self.params: dict[str, list[Any]] = {k: list(v) for k, v in GEMM_PARAMS.items()}

    def default(self) -> dict[str, Any]:
        """The heuristic: 6x16 (AVX2) or 12x32 (AVX-512) micro-kernel, MC x KC of A in L2."""
        regs = self.target.vector_registers
        mr, nv = (12, 2) if regs >= 32 else (6, 2)
        while nv > 1 and (nv - 1) * self.w >= self.n:
            nv -= 1
        mr = min(mr, max(1, self.m))
        if mr not in self.params["mr"]:
            mr = max(x for x in self.params["mr"] if x <= mr)
        # K blocks of at most 256, balanced (784 -> 4 x 196, rounded up to 208)
        kc = min(512, _ceil_to(-(-self.kk // -(-self.kk // 256)), 16))
        work = self.m * self.n * self.kk
        parallel = work >= PARALLEL_WORK and self.m > mr
        # M blocks of at most 24 micro-tiles (A block of MC x KC in L2), balanced, and an even
        # number of them when parallel so two threads get the same work
        tiles = -(-self.m // mr)
        blocks = -(-tiles // 24)
        if parallel and tiles >= 2:
            blocks = max(2, blocks + blocks % 2)
        mc_tiles = min(48, -(-tiles // blocks))
        ku = next(x for x in (4, 2, 1) if self.kk % x == 0)
        return {"mr": mr, "nv": nv, "mc_tiles": mc_tiles, "kc": kc, "ku": ku,
                "pack_a": 1 if self.m >= 2 * mr and self.kk >= 64 else 0,
                "parallel": 1 if parallel else 0}

    def is_valid(self, cfg: dict[str, Any]) -> bool:
        """Registers suffice (accumulators + B vectors + a broadcast) and KC is a multiple
        of the k unroll."""
        try:
            mr, nv, ku, kc = int(cfg["mr"]), int(cfg["nv"]), int(cfg["ku"]), int(cfg["kc"])
            mct = int(cfg["mc_tiles"])
        except (KeyError, TypeError, ValueError):
            return False
        if any(cfg.get(k) not in v for k, v in self.params.items()):
            return False
        if mr * nv + nv + 1 > self.target.vector_registers:
            return False
        return kc % ku == 0 and mct >= 1  # gemm_rule_problem, for values of the space

    def to_schedule(self, cfg: dict[str, Any]) -> Schedule:
        """The schedule of a parameter dict."""
        p = self.p
        mr, nv, kc, ku = int(cfg["mr"]), int(cfg["nv"]), int(cfg["kc"]), int(cfg["ku"])
        mc = mr * int(cfg["mc_tiles"])
        nr = nv * self.w
        splits = [Split(p.i, (mc, mr)), Split(p.j, (nr, self.w) if nv > 1 else (self.w,)),
                  Split(p.k, (kc, ku))]
        jl = [f"{p.j}.0", f"{p.j}.1", f"{p.j}.2"] if nv > 1 else [f"{p.j}.0", f"{p.j}.1"]
        # outer reduction axes run inside the micro-tile, around its k loop: the accumulator
        # tile stays in registers over all of them (a short K per GEMM, as in a convolution's
        # input gradient over [p, d] capsule axes, would otherwise reload C for each)
        order = [*p.batch, f"{p.i}.0", f"{p.k}.0", jl[0], f"{p.i}.1", *p.kouter, f"{p.k}.1",
                 f"{p.k}.2", f"{p.i}.2", *jl[1:]]
        unroll = [f"{p.k}.2", f"{p.i}.2", *jl[1:-1]]
        par = [*p.batch, f"{p.i}.0"] if cfg.get("parallel") else []
        packs = [Pack(p.b, p.b_dim, nr)]
        if cfg.get("pack_a"):
            packs.append(Pack(p.a, p.a_dim, mr))
        return Schedule(splits=tuple(splits), order=tuple(order), vectorize=jl[-1],
                        unroll=tuple(unroll), parallel=tuple(par),
                        cache_write=p.kouter[0] if p.kouter else f"{p.k}.1",
                        pack=tuple(packs))


class LoopSpace:
    """The schedule space of a generic compute (see the module docstring)."""

    kind = "loop"

    def __init__(self, op: ComputeOp, target: CpuTarget | None = None) -> None:
        self.op = op
        self.target = target or host_target()
        self.dims = [a.name for a in op.dims]
        self.raxes = [a.name for a in op.raxes]
        self.ext = {a.name: a.extent for a in op.all_axes}
        w = self.target.lanes(op.result.dtype)
        axes = [a for a in self.dims + self.raxes if self.ext[a] > 1]
        self.params: dict[str, list[Any]] = {
            "vec_axis": ["", *axes],
            "vec": sorted({1, max(1, w // 2), w, 2 * w}),
            "nvec": list(LOOP_FIXED_PARAMS["nvec"]),
            "vec_split": list(LOOP_FIXED_PARAMS["vec_split"]),
            "tile_axis": ["", *[a for a in self.dims if self.ext[a] > 1]],
            "tile": list(LOOP_FIXED_PARAMS["tile"]),
            "kunroll": list(LOOP_FIXED_PARAMS["kunroll"]),
            "parallel": list(LOOP_FIXED_PARAMS["parallel"]),
        }

    def _score(self, a: str) -> float:
        """How well vectorizing `a` suits the memory accesses: loads and the store that
        are contiguous in `a` (last index exactly `a`), weighted, scaled by extent."""
        s = 0.0
        if a in self.dims and self.dims[-1] == a:
            s += 1
        for ld in self.op.body.walk():
            if isinstance(ld, Load) and ld.indices:
                last = ld.indices[-1]
                if isinstance(last, Index) and last.name == a:
                    s += 2
                elif a in index_names(last) and not any(
                        a in index_names(x) for x in ld.indices[:-1]):
                    s += 1.5
                elif any(a in index_names(x) for x in ld.indices):
                    s -= 1  # a strided access would become a gather
        w = self.target.lanes(self.op.result.dtype)
        return s * min(1.0, self.ext[a] / w)

    def default(self) -> dict[str, Any]:
        """Vectorize the best-scoring axis; register-tile reductions; parallel if big."""
        w = self.target.lanes(self.op.result.dtype)
        cands = [a for a in self.params["vec_axis"] if a]
        best = max(cands, key=lambda a: (self._score(a), a in self.dims), default="")
        if best and self._score(best) <= 0:
            best = ""
        vec = w
        if best:
            while vec > 1 and vec // 2 >= self.ext[best]:
                vec //= 2
            if vec not in self.params["vec"]:
                vec = max(x for x in self.params["vec"] if x <= vec)
        cfg: dict[str, Any] = {"vec_axis": best if vec > 1 else "", "vec": vec if best else 1,
                               "nvec": 1, "vec_split": 1, "tile_axis": "", "tile": 1,
                               "kunroll": 1, "parallel": 0}
        stride = self._residue_stride(best) if best in self.dims and vec > 1 else 1
        if stride > 1:
            cfg["vec_split"] = stride
            return self._finish(cfg)
        if self.raxes and best in self.dims:
            if self.ext[best] >= 2 * vec:
                cfg["nvec"] = 2
            if self._reduction_is_outer(best):
                # a column-style reduction: a long accumulator row (in L1) per sweep over
                # the reduction axis keeps the loads contiguous
                most = max(1, min(32, self.ext[best] // vec))
                cfg["nvec"] = max(x for x in self.params["nvec"] if x <= most)
            # a second output axis whose tile reuses the loads that do not depend on it
            # (a reused vector load saves more than a reused broadcast)
            others = [a for a in self.dims if a != best and self.ext[a] >= 2]
            gain = {a: sum(2 if best in index_names(ld) else 1
                           for ld in self.op.body.walk()
                           if isinstance(ld, Load) and a not in index_names(ld))
                    for a in others}
            if gain and max(gain.values()) > 0 and cfg["nvec"] <= 4:
                t = max(others, key=lambda a: (gain[a], self.ext[a]))
                cfg["tile_axis"] = t
                want = 8 if cfg["nvec"] == 1 else 4  # about 8 vector accumulators
                cfg["tile"] = next((x for x in (want, 6, 4, 3, 2)
                                    if x <= want and self.ext[t] % x == 0), min(want, 4))
        return self._finish(cfg)

    def _finish(self, cfg: dict[str, Any]) -> dict[str, Any]:
        red = math.prod(self.ext[a] for a in self.raxes)
        out = math.prod(self.ext[a] for a in self.dims)
        par_ext = self._parallel_extent(cfg)
        cfg["parallel"] = 1 if out * red >= PARALLEL_WORK and par_ext > 1 else 0
        return cfg

    def _residue_stride(self, a: str) -> int:
        """S > 1 when the loads (and guards) read axis `a` only through `a // S` and `a % S`
        (the gradient of a stride-S window): split `a = S*q + p` and vectorize q, so those
        reads are contiguous in the lanes; else 1."""
        found: set[int] = set()

        def strip(e: Expr) -> Expr | None:
            if (isinstance(e, Binary) and e.op in ("//", "%") and isinstance(e.b, Const)
                    and not e.b.is_float and a in index_names(e.a)):
                form = to_affine(e.a)  # `a` with coefficient 1, plus anything else
                if form is not None and form.coeff(a) == 1:
                    found.add(int(e.b.value))
                    return Const(0)
            return None

        rest = self.op.body.map(strip)
        if len(found) != 1 or a in index_names(rest):
            return 1
        stride = found.pop()
        return stride if stride in self.params["vec_split"] and stride > 1 else 1
    def _reduction_is_outer(self, vaxis: str) -> bool:
        """Whether every load is contiguous in `vaxis` and indexed by a reduction axis in an
        outer dimension (column sums): then no output axis besides `vaxis` reuses loads."""
        lds = [x for x in self.op.body.walk() if isinstance(x, Load)]
        return bool(lds) and len(self.dims) == 1 and all(
            x.indices and isinstance(x.indices[-1], Index) and x.indices[-1].name == vaxis
            and any(r in index_names(i) for i in x.indices[:-1] for r in self.raxes)
            for x in lds)

    def is_valid(self, cfg: dict[str, Any]) -> bool:
        """Known values, a register tile that fits the vector registers, distinct axes."""
        if any(cfg.get(k) not in v for k, v in self.params.items()):
            return False
        if loop_rule_problem(cfg, lambda a: a in self.dims, bool(self.raxes)):
            return False
        nv = cfg["nvec"] if cfg["vec_axis"] else 1
        w = self.target.lanes(self.op.result.dtype)
        regs = cfg["tile"] * min(nv, 4) * max(1, cfg["vec"] // w)
        return regs <= self.target.vector_registers - 2

    def _parallel_extent(self, cfg: dict[str, Any]) -> int:
        sched = self.to_schedule({**cfg, "parallel": 1})
        if not sched.parallel:
            return 1
        ext = 1
        for loop in sched.parallel:
            name, _, lvl = loop.partition(".")
            sizes = sched.split_of(name)
            ext *= -(-self.ext[name] // sizes[0]) if sizes and lvl == "0" else self.ext[name]
        return ext

    def to_schedule(self, cfg: dict[str, Any]) -> Schedule:
        """The schedule of a parameter dict."""
        va, vw, nv = cfg.get("vec_axis") or "", int(cfg.get("vec", 1)), int(cfg.get("nvec", 1))
        ta, tile = cfg.get("tile_axis") or "", int(cfg.get("tile", 1))
        vs = int(cfg.get("vec_split", 1))
        ku = int(cfg.get("kunroll", 1))
        splits: list[Split] = []
        outer: list[str] = []
        inner: list[str] = []
        unroll: list[str] = []
        vec_loop: str | None = None
        for a in self.dims:
            if a == va and vw > 1 and vs > 1:
                # a = vs*(vw*a.0 + a.1) + a.2: the residue a.2 outside, a // vs = vw*a.0 + a.1
                # vectorized
                splits.append(Split(a, (vw * vs, vs)))
                outer += [f"{a}.0", f"{a}.2"]
                inner.append(f"{a}.1")
                vec_loop = f"{a}.1"
            elif a == va and vw > 1:
                if nv > 1:
                    splits.append(Split(a, (nv * vw, vw)))
                    outer.append(f"{a}.0")
                    inner += [f"{a}.1", f"{a}.2"]
                    if nv <= 4:
                        unroll.append(f"{a}.1")
                    vec_loop = f"{a}.2"
                else:
                    splits.append(Split(a, (vw,)))
                    outer.append(f"{a}.0")
                    inner.append(f"{a}.1")
                    vec_loop = f"{a}.1"
            elif a == ta and tile > 1:
                splits.append(Split(a, (tile,)))
                outer.append(f"{a}.0")
                inner.insert(0, f"{a}.1")
                unroll.append(f"{a}.1")
            else:
                outer.append(a)
        red: list[str] = []
        for n, r in enumerate(self.raxes):
            if r == va and vw > 1:
                splits.append(Split(r, (vw,)))
                red.append(f"{r}.0")
                inner.append(f"{r}.1")
                vec_loop = f"{r}.1"
            elif n == len(self.raxes) - 1 and ku > 1:
                splits.append(Split(r, (ku,)))
                red += [f"{r}.0", f"{r}.1"]
                unroll.append(f"{r}.1")
            else:
                red.append(r)
        order = outer + red + inner
        par: list[str] = []
        if cfg.get("parallel"):
            total = 1
            for loop in outer:
                name, _, lvl = loop.partition(".")
                sizes = next((s.sizes for s in splits if s.axis == name), ())
                par.append(loop)
                total *= -(-self.ext[name] // sizes[0]) if sizes and lvl == "0" else (
                    self.ext[name])
                if total >= 64:
                    break
        return Schedule(splits=tuple(splits), order=tuple(order), vectorize=vec_loop,
                        unroll=tuple(unroll), parallel=tuple(par),
                        cache_write=red[0] if red else None)


def schedule_space(op: ComputeOp, target: CpuTarget | None = None) -> GemmSpace | LoopSpace:
    """The schedule space of a compute: the GEMM template when the pattern matches (directly,
    or on the flattened view of a contraction over runs of axes), else the loop template."""
    p = match_gemm(op)
    if p is not None:
        return GemmSpace(op, p, target)
    view = flatten(op)
    if view is not None:
        fp = match_gemm(view.op)
        assert fp is not None, "a flattened contraction is a GEMM"
        return GemmSpace(view.op, fp, target)
    return LoopSpace(op, target)


def default_schedule(op: ComputeOp, target: CpuTarget | None = None) -> Schedule:
    """The heuristic schedule of a compute: its space's default, except that contractions
    with fewer than `SMALL_GEMM_WORK` multiply-adds take the loop template's default."""
    space = schedule_space(op, target)
    if isinstance(space, GemmSpace) and math.prod(a.extent for a in op.all_axes) < (
            SMALL_GEMM_WORK):
        space = LoopSpace(op, target)
    return space.to_schedule(space.default())


# ---------------------------------------------------------------------------------------------
# checking schedules from outside: IR attributes, imported tuning records


def loop_rule_problem(cfg: Mapping[str, Any], is_output_axis: Callable[[str], bool],
                      has_reduction: bool | None) -> str:
    """Why the loop template's parameters `cfg` (values already in range) do not go
    together, empty when they do. `is_output_axis` tells output from reduction axes;
    `has_reduction` None when unknown. `LoopSpace.is_valid` applies exactly these rules."""
    va, ta = cfg["vec_axis"], cfg["tile_axis"]
    if ta and ta == va:
        return "'tile_axis' and 'vec_axis' name the same axis"
    if ta and cfg["tile"] == 1 or not ta and cfg["tile"] != 1:
        return "'tile' must be above 1 exactly when 'tile_axis' names an axis"
    if (not va) != (cfg["vec"] == 1):
        return "'vec' must be above 1 exactly when 'vec_axis' names an axis"
    if va and not is_output_axis(va) and (cfg["nvec"] != 1 or cfg["kunroll"] != 1):
        return "a vectorized reduction axis takes 'nvec' = 1 and 'kunroll' = 1"
    if cfg["vec_split"] != 1 and (not va or not is_output_axis(va) or cfg["nvec"] != 1):
        return "'vec_split' needs a vectorized output axis and 'nvec' = 1"
    if has_reduction is False and (cfg["kunroll"] != 1 or ta):
        return "a compute without reduction takes no 'kunroll' and no 'tile_axis'"
    if (cfg["nvec"] if va else 1) > 4 and cfg["tile"] != 1:
        return "a long accumulator row ('nvec' above 4) is not also tiled"
    return ""


def gemm_rule_problem(cfg: Mapping[str, Any], registers: int = MAX_VECTOR_REGISTERS) -> str:
    """Why the GEMM template's parameters `cfg` (values already in range) do not go together
    on a target with `registers` vector registers, empty when they do."""
    if cfg["mr"] * cfg["nv"] + cfg["nv"] + 1 > registers:
        return (f"a {cfg['mr']} x {cfg['nv']} micro-kernel needs more than the {registers} "
                "vector registers of any target")
    if cfg["kc"] % cfg["ku"]:
        return f"'kc' = {cfg['kc']} is not a multiple of 'ku' = {cfg['ku']}"
    return ""


def _domain_problem(cfg: Mapping[str, Any], domains: Mapping[str, Any]) -> str:
    """Missing or unknown parameter names, values out of their candidate lists."""
    missing = sorted(set(domains) - set(cfg))
    unknown = sorted(set(cfg) - set(domains))
    if missing or unknown:
        parts = []
        if missing:
            parts.append("missing " + ", ".join(f"'{k}'" for k in missing))
        if unknown:
            parts.append("unknown " + ", ".join(f"'{k}'" for k in unknown))
        return "parameters " + "; ".join(parts)
    for k, allowed in domains.items():
        v = cfg[k]
        if isinstance(v, bool) or v not in allowed or type(v) is not type(allowed[0]):
            shown = ", ".join(repr(x) for x in allowed[:12]) + (", ..." if len(allowed) > 12
                                                                 else "")
            return f"'{k}' = {v!r} is not one of {shown}"
    return ""


_POSITIONAL_AXIS = re.compile(r"[dr](0|[1-9][0-9]{0,2})")


def template_problem(cfg: Mapping[str, Any]) -> str:
    """Why `cfg`, a schedule recorded for a canonical kernel (axes `d0`, `r0`, ...; see
    nfc.runtime.tuning.kernels) of an unknown kind, is a parameter dict of neither template,
    or breaks a rule that holds on every target; empty when it could be a schedule."""
    if "mr" in cfg or set(cfg) <= set(GEMM_PARAMS):
        why = _domain_problem(cfg, GEMM_PARAMS)
        return (f"as a gemm schedule: {why}" if why else
                ("as a gemm schedule: " + w if (w := gemm_rule_problem(cfg)) else ""))
    def axis(v: Any) -> bool:
        return isinstance(v, str) and (v == "" or _POSITIONAL_AXIS.fullmatch(v) is not None)
    domains: dict[str, Any] = {**LOOP_FIXED_PARAMS, "vec": ANY_VEC}
    why = _domain_problem({k: v for k, v in cfg.items() if k not in ("vec_axis", "tile_axis")},
                          domains)
    if not why:
        for k in ("vec_axis", "tile_axis"):
            if k not in cfg:
                why = f"parameters missing '{k}'"
            elif not axis(cfg[k]):
                why = f"'{k}' = {cfg[k]!r} is not an axis of a canonical kernel (d0, r0, ...)"
            if why:
                break
    if not why and cfg["tile_axis"].startswith("r"):
        why = "'tile_axis' must be an output axis (d0, d1, ...)"
    if not why:
        why = loop_rule_problem(cfg, lambda a: a.startswith("d"),
                                True if cfg["vec_axis"].startswith("r") else None)
    return f"as a loop schedule: {why}" if why else ""


def schedule_problem(op: Op, value: Any, target: CpuTarget | None = None) -> str:
    """Why `value`, an `nf.schedule` attribute, cannot be the schedule of `op`; empty when it
    can. A compute takes its space's parameter dict (every parameter, each value one of the
    template's, the axes its own) or a `Schedule.to_dict()` form; an `nf.kernel` a
    `GroupSchedule.to_dict()` form; explicit forms must lower."""
    from nfc.codegen.lower import ScheduleError, lower
    from nfc.codegen.schedule import schedule_from_dict

    if not isinstance(value, dict):
        return f"a schedule is a dictionary of parameters, not {type(value).__name__}"
    if not isinstance(op, ComputeOp | KernelOp):
        return f"'{op.opname}' has no schedule"
    if "version" in value or "kind" in value:
        kind = value.get("kind", "compute")
        want = "compute" if isinstance(op, ComputeOp) else "group"
        if kind != want:
            return f"a schedule of kind '{kind}' given to a {want} op (want kind '{want}')"
        try:
            sched = schedule_from_dict(value)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            return f"malformed {kind} schedule: {err}"
        try:
            lower(op, sched)
        except ScheduleError as err:
            return str(err)
        except (KeyError, TypeError, IndexError, ValueError) as err:
            # a hand-written schedule may break lowering's assumptions in other ways
            return f"the schedule does not fit this op ({type(err).__name__}: {err})"
        return ""
    if not isinstance(op, ComputeOp):
        return "an nf.kernel needs a group schedule (kind 'group'), not space parameters"
    space = schedule_space(op, target)
    domains: dict[str, Any] = dict(space.params)
    if isinstance(space, LoopSpace):
        domains["vec"] = ANY_VEC  # another target's vector width lowers all the same
    why = _domain_problem(value, {k: tuple(v) for k, v in domains.items()})
    if not why:
        if isinstance(space, GemmSpace):
            why = gemm_rule_problem(value)
        else:
            why = loop_rule_problem(value, lambda a: a in space.dims, bool(space.raxes))
    return f"not a schedule of this op's {space.kind} space: {why}" if why else ""


def check_schedule_attrs(funcs: Iterable[Func], target: CpuTarget | None = None) -> None:
    """Raise CompileError with one located diagnostic per op of `funcs` (computes inside
    `nf.kernel` ops included) whose `nf.schedule` attribute `schedule_problem` refuses."""
    from nfc.diagnostics import CompileError, Diagnostic

    found: list[Diagnostic] = []
    for f in funcs:
        for op in f.body.ops:
            inner = op.body.ops if isinstance(op, KernelOp) else []
            for o in (op, *inner):
                if SCHEDULE_ATTR in o.attrs:
                    why = schedule_problem(o, o.attrs[SCHEDULE_ATTR], target)
                    if why:
                        # IR without `loc(...)` has no op location: name the op as well
                        names = ", ".join(f"%{v.name}" for v in o.results if v.name)
                        what = f"{names} ({o.opname} in @{f.name})" if names else o.opname
                        found.append(Diagnostic(
                            "error", f"invalid '{SCHEDULE_ATTR}' of {what}: {why}",
                            o.loc or f.loc))
    if found:
        raise CompileError(found)


__all__ = ["ANY_VEC", "GEMM_PARAMS", "LOOP_FIXED_PARAMS", "SCHEDULE_VERSION", "GemmPattern",
           "GemmSpace", "LoopSpace", "check_schedule_attrs", "default_schedule",
           "gemm_rule_problem", "loop_rule_problem", "match_gemm", "schedule_problem",
           "schedule_space", "template_problem"]
