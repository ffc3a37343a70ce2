"""Schedule spaces: every tunable parameter of a compute's schedule with its candidate values,
the heuristic default, validity, and the mapping from a parameter dict to a `Schedule`.

Two templates:
- `GemmSpace` for contractions recognised by pattern (`match_gemm`): one sum axis `k`, a
  product of two loads indexed `(.., i, .., k)` and `(.., k, .., j)` (plus shared batch axes).
  The schedule packs B into zero-padded panels of NR columns (and optionally A into panels of
  MR rows), blocks K by KC and M by MC for the caches, and runs an MR x NR register-blocked
  micro-kernel (broadcast A, vector loads of B, FMAs into MR*NR/W vector accumulators) with
  the k loop unrolled (nfc.codegen.gemm_space, re-exported here).
- `LoopSpace` for everything else: a vectorized axis (an output axis, or a reduction axis
  with per-lane partial results), a register tile of vectors and of a second output axis for
  reductions, an unrolled innermost reduction, and fused parallel outer loops, or, with
  `parallel_reduce` = P > 0, the reduction itself cut into P chunks spread over threads
  (`Schedule.parallel_reduce`: the result does not depend on the thread count). A parameter
  dict without `parallel_reduce` (recorded before the knob) takes the heuristic choice.

The tuner (nfc.runtime.tuning.search) searches `params`; `to_schedule(cfg)` gives the schedule.

Checking schedules that come from outside (an `nf.schedule` attribute in IR text, a record of
an imported tuning cache; nfc.codegen.schedule_check, re-exported here):
`schedule_problem(op, value)` says why a value cannot be `op`'s
schedule, `template_problem(cfg)` why a parameter dict fits neither template when the kernel
is unknown. Both accept what a machine with other vector registers may have chosen: the
register limits and the vector widths of the host are the tuner's concern, not a reason to
refuse a schedule that lowers correctly on any target.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

from nfc.affine import to_affine
from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.gemm_space import (
    GEMM_DEFAULTS,
    GEMM_PARAMS,
    GemmPattern,
    GemmSpace,
    match_gemm,
)
from nfc.codegen.lowering.reductions import parallel_chunks
from nfc.codegen.lowering.stage import flat_index
from nfc.codegen.schedule import SCHEDULE_VERSION, Pack, Schedule, Split
from nfc.contraction import flatten
from nfc.ir import Binary, ComputeOp, Const, Expr, Index, Load, index_names

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

#: The loop template's parameters whose candidate values do not depend on the kernel or the
#: target (`vec_axis`, `tile_axis` and `vec` do).
LOOP_FIXED_PARAMS: dict[str, tuple[int, ...]] = {
    "nvec": (1, 2, 4, 8, 16, 32, 64),
    "vec_split": (1, 2, 3, 4),
    "tile": (1, 2, 3, 4, 6, 8),
    "kunroll": (1, 2, 4, 8),
    "parallel": (0, 1),
    "parallel_reduce": (0, 8, 64),
}
#: `parallel_reduce` when a parameter dict leaves it out (one recorded before the knob, or
#: written by hand): the heuristic choice of `LoopSpace` (`parallel_chunks`).
AUTO = -1
#: The loop template's parameters.
LOOP_PARAM_NAMES = frozenset({"vec_axis", "vec", "tile_axis", *LOOP_FIXED_PARAMS})
#: Vector widths (elements) the loop template offers on some target: `{1, w/2, w, 2w}` for
#: `w` lanes, so the powers of two up to twice the lanes of one-byte elements in a 512-bit
#: (AVX-512) register.
ANY_VEC = (1, 2, 4, 8, 16, 32, 64, 128)
#: Most vector registers of any CPU target nfc generates code for (AVX-512: 32).
MAX_VECTOR_REGISTERS = 32


def _strip_residue(e: Expr, a: str, stride: int) -> Expr:
    """`e` with `x // stride` replaced by `x` and `x % stride` by 0 where `x` is affine in `a`
    (the reads of axis `a // stride` once `a` is split by the stride)."""
    def strip(x: Expr) -> Expr | None:
        if (isinstance(x, Binary) and x.op in ("//", "%") and isinstance(x.b, Const)
                and not x.b.is_float and int(x.b.value) == stride and a in index_names(x.a)):
            return x.a if x.op == "//" else Const(0)
        return None

    return e.map(strip)


def phase_packs(op: ComputeOp, axis: str) -> tuple[Pack, ...]:
    """Phase packs (`Pack.kind` "phase") for the operands that the vectorized `axis` reads
    with a stride: a dimension indexed `S*axis + e` (S > 1, `e` free of `axis`, which indexes
    no other dimension of the load) is split into its S phases, so the lanes read unit-stride
    (a stride-2 depthwise convolution and its weight gradient: gathers otherwise). Only for
    operands the nest reads at least twice per element on average: the copy costs one read
    and one write of the operand (a 1 x 1 stride-2 gather reads a quarter of its input once:
    4x slower with the copy)."""
    if not axis:
        return ()
    reads = math.prod(a.extent for a in op.all_axes)
    found: dict[tuple[int, int], int] = {}
    for ld in op.body.walk():
        if not isinstance(ld, Load):
            continue
        uses = [d for d, ix in enumerate(ld.indices) if axis in index_names(ix)]
        if len(uses) != 1:
            continue
        form = to_affine(ld.indices[uses[0]])
        stride = form.coeff(axis) if form is not None else 0
        if isinstance(stride, int) and stride > 1 and reads >= 2 * math.prod(
                ld.tensor.type.shape):
            n = next(k for k, v in enumerate(op.operands) if v is ld.tensor)
            key = (n, uses[0])
            if found.setdefault(key, stride) != stride:
                found[key] = 0  # read with two strides: no single phase layout
    return tuple(Pack(n, d, s, "phase") for (n, d), s in sorted(found.items()) if s > 1)


class LoopSpace:
    """The schedule space of a generic compute (see the module docstring)."""

    kind = "loop"

    def __init__(self, op: ComputeOp, target: CpuTarget | None = None) -> None:
        self.op = op
        self.target = target or host_target()
        self.dims = [a.name for a in op.dims]
        self.ext = {a.name: a.extent for a in op.all_axes}
        self.raxes = self._memory_order([a.name for a in op.raxes])
        w = self.target.lanes(op.result.dtype)
        axes = [a for a in self.dims + self.raxes if self.ext[a] > 1]
        self.params: dict[str, list[Any]] = {
            "vec_axis": ["", *axes],
            # a quarter vector too: a 4-wide axis (the 4 x 4 maps of ResNet-18's last stage)
            # in one xmm register, not scalar code
            "vec": sorted({1, max(1, w // 4), max(1, w // 2), w, 2 * w}),
            "nvec": list(LOOP_FIXED_PARAMS["nvec"]),
            "vec_split": list(LOOP_FIXED_PARAMS["vec_split"]),
            "tile_axis": ["", *[a for a in self.dims if self.ext[a] > 1]],
            "tile": list(LOOP_FIXED_PARAMS["tile"]),
            "kunroll": list(LOOP_FIXED_PARAMS["kunroll"]),
            "parallel": list(LOOP_FIXED_PARAMS["parallel"]),
            "parallel_reduce": list(LOOP_FIXED_PARAMS["parallel_reduce"]),
        }

    def _score(self, a: str) -> float:
        """How well vectorizing `a` suits the memory accesses: loads and the store that
        are contiguous in `a` (last index exactly `a`), weighted, scaled by extent. An axis
        read only through `a // S` and `a % S` (`_residue_stride`) is scored on the reads
        of its split, `a // S` vectorized: a stride-S window's gradient reads contiguously."""
        s = 0.0
        if a in self.dims and self.dims[-1] == a:
            s += 1
        body = self.op.body
        if a in self.dims and (stride := self._residue_stride(a)) > 1:
            body = _strip_residue(body, a, stride)
        for ld in body.walk():
            if isinstance(ld, Load) and ld.indices:
                flat = flat_index(ld.indices, ld.tensor.shape)  # through a flattening reshape
                indices = ld.indices if flat is None else (flat,)
                last = indices[-1]
                wt = self._load_weight(ld)
                if isinstance(last, Index) and last.name == a:
                    s += 2 * wt
                elif a in index_names(last) and not any(
                        a in index_names(x) for x in indices[:-1]):
                    s += 1.5 * wt
                elif any(a in index_names(x) for x in indices):
                    s -= wt  # a strided access would become a gather
        w = self.target.lanes(self.op.result.dtype)
        return s * min(1.0, self.ext[a] / w)

    def _memory_order(self, raxes: list[str]) -> list[str]:
        """The reduction axes in the order the largest load lays them out (outermost
        dimension first; an axis it does not read goes outside), so the innermost reduction
        loop walks it contiguously. Autodiff leaves batch norm's gradient sums as
        `sum [h, w, n] dy[n, c, h, w] ..`, whose innermost `n` strode by a whole image:
        ResNet-18's 4 x 4 ones took 0.3-0.4 ms per 32K-term channel sum in that order."""
        loads = [x for x in self.op.body.walk() if isinstance(x, Load) and x.indices]
        if len(raxes) < 2 or not loads:
            return raxes

        def span(ld: Load) -> int:
            return math.prod(self.ext.get(n, 1) for n in set().union(
                *map(index_names, ld.indices)))

        big = max(loads, key=span)  # the first of the largest

        def pos(r: str) -> int:
            return next((n for n, ix in enumerate(big.indices) if r in index_names(ix)), -1)

        return sorted(raxes, key=pos)

    def _load_weight(self, ld: Load) -> float:
        """How much a load's access pattern matters: 1 for a load that spans (about) as many
        elements as the largest access of the compute (the store included), less for a small
        one, down to 1/16 (a per-channel vector read beside a whole activation). Loads of
        small tensors are loop-invariant in most loops and their vectors stay in registers
        or L1, while a gather of a large one runs lane by lane on every iteration: batch
        norm's `y[n, c, h, w] = x[n, c, h, w] * s[c] + b[c]` was vectorized along `c`
        (three contiguous loads against one gather and a scatter), 4-8x slower than along
        `w`."""
        def span(names: set[str]) -> int:
            return math.prod(self.ext.get(n, 1) for n in names)

        loads = [x for x in self.op.body.walk() if isinstance(x, Load) and x.indices]
        biggest = max([span(set(self.dims)),
                       *(span(set().union(*map(index_names, x.indices))) for x in loads)])
        mine = span(set().union(*map(index_names, ld.indices)))
        return max(1 / 16, min(1.0, 4 * mine / max(biggest, 1)))

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
            if vec not in self.params["vec"] or (vec < w // 2 and self.ext[best] % vec):
                # a quarter vector only where it fills: masked xmm code on a 3-wide axis
                # (the momentum update of a 3 x 3 kernel) ran 4x slower than scalar code
                vec = max(x for x in self.params["vec"] if x <= vec and (
                    x >= w // 2 or self.ext[best] % x == 0))
            if best in self.raxes and self.ext[best] >= 8 * w and 2 * w in self.params["vec"]:
                vec = 2 * w  # a long rfactor: two vectors of partial sums, two add chains
        cfg: dict[str, Any] = {"vec_axis": best if vec > 1 else "", "vec": vec if best else 1,
                               "nvec": 1, "vec_split": 1, "tile_axis": "", "tile": 1,
                               "kunroll": 1, "parallel": 0}
        stride = self._residue_stride(best) if best in self.dims and vec > 1 else 1
        if stride == 1 and best in self.dims and self.ext[best] > w and not self.raxes:
            # (one block of lanes or less: the plain gathers measured faster, 2.5x at 16)
            stride = self._gathered_stride(best)
        if stride > 1 and self.ext[best] <= max(self.params["vec"]) and (
                window := self._window_unroll(best)):
            # the gradient of a stride-S window (col2im, a strided depthwise convolution's
            # input gradient): vectorized plainly, the window axis read with `best` unrolled
            # whole (its `// S` and `% S` lane patterns become constants, the gathers of
            # neighbouring lanes share addresses) and a second output axis tiled. The residue
            # split below stores with stride S, lane by lane: 2.5-6x slower on MobileNet's
            # and ResNet-18's 2 x 2 ones (docs/performance.md, "Depthwise convolutions"),
            # and `best` in one block of lanes: with a loop over blocks its `// S` would be
            # computed lane by lane (ResNet-18's 32-wide one 3x slower with 2 blocks of 16)
            cfg["kunroll"] = window
            cfg["vec"] = min(v for v in self.params["vec"] if v >= self.ext[best])
            others = [a for a in self.dims if a != best and self.ext[a] >= 4]
            others.sort(key=lambda a: (self._residue_stride(a) > 1, self.dims.index(a)))
            if others:
                t = others[-1]
                cfg["tile_axis"], cfg["tile"] = t, (4 if self.ext[t] % 4 == 0 else 2)
            return self._finish(cfg)
        if stride > 1:
            cfg["vec_split"] = stride
            # the lanes run over `best // stride`: no wider than its extent
            quot = -(-self.ext[best] // stride)
            while vec > 1 and vec // 2 >= quot and vec // 2 in self.params["vec"]:
                vec //= 2
            cfg["vec"] = vec
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
        elif best in self.raxes and vec > 1:
            # a vectorized reduction (a depthwise convolution's weight gradient): a short
            # output axis tiled whole gives independent accumulator chains and reuses the
            # loads that do not depend on it (MobileNet's 3 x 3 ones 1.2-1.4x faster)
            others = [a for a in self.dims if self.ext[a] in self.params["tile"][1:]]
            gain = {a: sum(1 for ld in self.op.body.walk()
                           if isinstance(ld, Load) and a not in index_names(ld))
                    for a in others}
            if gain and max(gain.values()) > 0:
                t = max(others, key=lambda a: (gain[a], self.ext[a]))
                cfg["tile_axis"], cfg["tile"] = t, self.ext[t]
        return self._finish(cfg)

    def _window_unroll(self, a: str) -> int:
        """`kunroll` that unrolls the last reduction axis whole when it is a short window
        axis read together with output axis `a` (in one index of a load); else 0."""
        if not self.raxes:
            return 0
        r = self.raxes[-1]
        paired = any(a in index_names(ix) and r in index_names(ix)
                     for ld in self.op.body.walk() if isinstance(ld, Load)
                     for ix in ld.indices)
        fits = [k for k in self.params["kunroll"] if k >= self.ext[r]]
        return min(fits) if paired and fits and self.ext[r] > 1 else 0

    def _finish(self, cfg: dict[str, Any]) -> dict[str, Any]:
        red = math.prod(self.ext[a] for a in self.raxes)
        out = math.prod(self.ext[a] for a in self.dims)
        par_ext = self._parallel_extent(cfg)
        cfg["parallel"] = 1 if out * red >= PARALLEL_WORK and (
            par_ext > 1 or self._chunks(cfg)) else 0
        cfg["parallel_reduce"] = self._chunks(cfg) if cfg["parallel"] else 0
        return cfg

    def _chunks(self, cfg: Mapping[str, Any]) -> int:
        """`Schedule.parallel_reduce` when `parallel` spreads the reduction over threads."""
        return parallel_chunks(self._parallel_extent(cfg), math.prod(self.ext.values())) if (
            self.raxes) else 0

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
    def _gathered_stride(self, a: str) -> int:
        """S > 1 when a large load reads `a` only through `a // S` and `a % S` while the
        others read it plainly (the gradient of a stride-S 1 x 1 convolution added to a
        full-size one): vectorized plainly that load is a gather lane by lane; the residue
        split (`vec_split`) reads it contiguously and the others with stride S, a wide load
        and a shuffle (ResNet-18's shortcut gradients 2.3x faster); else 1."""
        found: set[int] = set()
        for ld in self.op.body.walk():
            if not (isinstance(ld, Load) and ld.indices and self._load_weight(ld) >= 0.25):
                continue
            strides, plain = set(), False
            for x in ld.indices:
                if a not in index_names(x):
                    continue
                if (isinstance(x, Binary) and x.op in ("//", "%") and isinstance(x.b, Const)
                        and not x.b.is_float):
                    strides.add(int(x.b.value))
                else:
                    plain = True
            if strides and not plain:
                found |= strides
        s = found.pop() if len(found) == 1 else 1
        return s if s in self.params["vec_split"] else 1

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
        cfg = {"parallel_reduce": AUTO, **cfg}  # left out: the heuristic choice
        if any(cfg.get(k) not in v for k, v in self.params.items()
               if not (k == "parallel_reduce" and cfg[k] == AUTO)):
            return False
        if loop_rule_problem(cfg, lambda a: a in self.dims, bool(self.raxes)):
            return False
        nv = cfg["nvec"] if cfg["vec_axis"] else 1
        w = self.target.lanes(self.op.result.dtype)
        regs = cfg["tile"] * min(nv, 4) * max(1, cfg["vec"] // w)
        return regs <= self.target.vector_registers - 2

    def _parallel_extent(self, cfg: Mapping[str, Any]) -> int:
        sched = self.to_schedule({**cfg, "parallel": 1}, reduce_in_parallel=False)
        if not sched.parallel:
            return 1
        ext = 1
        for loop in sched.parallel:
            name, _, lvl = loop.partition(".")
            sizes = sched.split_of(name)
            ext *= -(-self.ext[name] // sizes[0]) if sizes and lvl == "0" else self.ext[name]
        return ext

    def to_schedule(self, cfg: Mapping[str, Any], *, reduce_in_parallel: bool = True
                    ) -> Schedule:
        """The schedule of a parameter dict. `parallel` spreads the output loops over threads,
        or the reduction when that is the whole work (`_chunks`)."""
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
        chunks = 0
        if cfg.get("parallel") and reduce_in_parallel and self.raxes:
            pr = int(cfg.get("parallel_reduce", AUTO))
            chunks = self._chunks(cfg) if pr == AUTO else pr
        par = [] if chunks else par
        return Schedule(splits=tuple(splits), order=tuple(order), vectorize=vec_loop,
                        unroll=tuple(unroll), parallel=tuple(par),
                        cache_write=red[0] if red else None, parallel_reduce=chunks,
                        pack=phase_packs(self.op, va if vw > 1 and vs == 1 else ""))


def schedule_space(op: ComputeOp, target: CpuTarget | None = None) -> GemmSpace | LoopSpace:
    """The schedule space of a compute: the GEMM template when the pattern matches (directly,
    or on the flattened view of a contraction over runs of axes), else the loop template."""
    p = match_gemm(op)
    if p is not None:
        return GemmSpace(op, p, target)
    view = flatten(op, implicit=True)
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
    if cfg.get("parallel_reduce", AUTO) not in (0, AUTO) and (
            not cfg["parallel"] or has_reduction is False):
        return "'parallel_reduce' above 0 needs 'parallel' = 1 and a reduction"
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


# the checks of schedules from outside live in nfc.codegen.schedule_check (re-exported here)
from nfc.codegen.schedule_check import (  # noqa: E402
    check_schedule_attrs,
    schedule_problem,
    template_problem,
)

__all__ = ["ANY_VEC", "GEMM_DEFAULTS", "GEMM_PARAMS", "LOOP_FIXED_PARAMS", "SCHEDULE_VERSION",
           "GemmPattern", "GemmSpace", "LoopSpace", "check_schedule_attrs", "default_schedule",
           "gemm_rule_problem", "loop_rule_problem", "match_gemm", "schedule_problem",
           "schedule_space", "template_problem"]
