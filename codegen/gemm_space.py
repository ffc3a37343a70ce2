"""The GEMM template's schedule space (`GemmSpace`, re-exported by nfc.codegen.space): for
contractions recognised by pattern (`match_gemm`), B packed into zero-padded panels of NR
columns (and optionally A into panels of MR rows), K blocked by KC and M by MC for the caches,
an MR x NR register-blocked micro-kernel (broadcast A, vector loads of B, FMAs into MR*NR/W
vector accumulators) with the k loop unrolled; the micro-kernel chosen per GEMM shape, B left
unpacked where its panels would be read too few times, and the orientation swapped (`C^T =
B^T A^T`) where B's panels would be a transposing pack of the larger operand or of an N
narrower than a vector; B's panels looped outermost, the batch inside, where B is shared by
the batch and larger than an L2 (`jouter`) (docs/codegen.md, "Schedule spaces").
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from nfc.codegen.cpu import CpuTarget, host_target
from nfc.codegen.schedule import Pack, Schedule, Split
from nfc.contraction import GatherView, match_contraction, plain_names
from nfc.ir import ComputeOp, DType, Index, Load

__all__ = ["GEMM_DEFAULTS", "GEMM_PARAMS", "PACK_B_TILES", "GemmPattern", "GemmSpace",
           "match_gemm"]

#: B is packed into panels when the micro-kernel's rows cover M in more than this many tiles:
#: with fewer, every panel of B is read that few times, and the copy (a read and a write of
#: all of B) costs more than the strided reads it saves. Measured on one Zen 5 thread (1 MiB
#: L2), B unpacked vs packed: 64 x 1024 x 1024 230 vs 191 GFLOP/s, 64 x 256 x 256 236 vs 217,
#: the forward convolutions of ResNet-18 with 16, 32 and 64 output channels 157 vs 76, 215 vs
#: 162, 243 vs 213, LeNet-5's second 162 vs 105; but 256 x 1024 x 1024 170 vs 194 and an
#: input-gradient GEMM of M = 144, K = 16 (24 tiles) 99 vs 180.
PACK_B_TILES = 12
#: The GEMM template's parameters and candidate values (the same on every target).
GEMM_PARAMS: dict[str, tuple[int, ...]] = {
    "mr": (1, 2, 3, 4, 5, 6, 8, 10, 12, 14),
    "nv": (1, 2, 3, 4),
    "mc_tiles": tuple(range(1, 49)),
    "kc": tuple(range(16, 513, 16)),
    "ku": (1, 2, 4, 8),
    "pack_a": (0, 1),
    "pack_b": (0, 1),
    "swap": (0, 1),
    "parallel": (0, 1),
    "jouter": (0, 1),
}
#: GEMM parameters added after records were first stored, with the value a record that lacks
#: one meant (a record without `pack_b` packed B, one without `swap` did not swap, one
#: without `jouter` ran the batch loops outermost).
GEMM_DEFAULTS: dict[str, int] = {"pack_b": 1, "swap": 0, "jouter": 0}
#: Whether the default schedule runs a parallel GEMM without batch loops over B's panels when
#: they split more evenly over two threads than its M blocks (`GemmSpace._panels_balance`;
#: off only to measure the rule: benchmarks/gemm_balance_ab.py).
BALANCE_PANELS = True


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

    def pattern(self, swap: bool) -> GemmPattern:
        """The roles the schedule gives the axes: with `swap` (tensor swapping) the GEMM is run
        as `C^T = B^T A^T`: the lanes run along i (A packed into panels along i, B broadcast)
        and the tile is stored transposed, a scatter once per tile."""
        p = self.p
        if not swap:
            return p
        return GemmPattern(p.j, p.i, p.k, p.batch, p.b, p.a, p.b_dim, p.a_dim, p.kouter)

    def default_swap(self) -> bool:
        """Swap when B's j is not its last dimension (its panels are a transposing pack) and
        A, the operand the swapped schedule packs, is no larger: a weight gradient over im2col
        columns `dW[o, crs] = sum dY[o, ij] cols[crs, ij]` packs dY, not the columns
        (measured on one thread: ResNet-18's 16 x 144 x 16384 weight gradient at 170 GFLOP/s
        swapped vs 41, LeNet-5's second at 160 vs 72)."""
        size = [math.prod(v.type.shape) for v in self.op.operands]
        if self._rows_contiguous(self.p):
            return False
        return size[self.p.a] <= size[self.p.b] or self._narrow_n()

    def _narrow_n(self) -> bool:
        """Whether N is narrower than a vector and M fills the lanes better: a batched GEMM
        with a short last axis, such as the capsule convolution of CapsNet (`y[n, p, ij, d]`,
        N = d = 8 of 16 AVX-512 lanes, M = ij = 36), computes half-empty vectors and packs B
        zero-padded to twice its size (the capsule weights: 40.5 MiB of panels for 20.2 MiB);
        swapped, the lanes run along M (36 of 48) and B is read as broadcasts, unpacked."""
        def fill(x: int) -> float:
            return x / (-(-x // self.w) * self.w)

        return self.n < self.w and fill(self.m) > fill(self.n)

    def micro_tile(self, m: int | None = None, n: int | None = None) -> tuple[int, int]:
        """(mr, nv) of the default micro-kernel for a GEMM of M = `m`, N = `n` (default the
        unswapped M and N).

        With 32 vector registers (AVX-512) the tile is chosen by a model: a k step of an
        mr x nv tile costs `max(mr*nv, 2*(mr + nv)) + 8` (FMAs, or loads: nv vectors of B and
        mr broadcasts of A at half the FMA rate, plus the loop and the tile's share of C),
        scaled by the fraction of the computed tile that M and N fill; nv of 1, 2 or 4 (a
        48-column panel leaves ragged tails: 70 vs 165 GFLOP/s on a convolution with
        N = 1024), and 3 where that leaves none: N of 33 to 48 (one tile: CapsNet's 36 grid
        cells) or a multiple of 48 (its weight gradient, N = 20736: 8 x 3 instead of 4 x 4,
        the step 1.04-1.2x faster). It picks 6 x 64 for large GEMMs (measured on one Zen 5
        thread: 1024^3 at 222 GFLOP/s vs 193 with the former 12 x 32) and for M = 16 (a 12-row
        tile computes 24 rows: 161 vs 118 GFLOP/s at 16 x 1024 x 1024). With fewer registers
        (AVX2) the 6 x 16 tile (two vectors) stays."""
        regs = self.target.vector_registers
        m = self.m if m is None else m
        n = self.n if n is None else n
        if regs < 32:
            mr, nv = 6, 2
            while nv > 1 and (nv - 1) * self.w >= n:
                nv -= 1
            mr = min(mr, max(1, m))
            if mr not in self.params["mr"]:
                mr = max(x for x in self.params["mr"] if x <= mr)
            return mr, nv
        best: tuple[float, int, int, int] = (-1.0, 0, 0, 0)
        for mr in self.params["mr"]:
            for nv in (1, 2, 3, 4):
                if mr * nv + nv + 1 > regs or mr > max(1, m) or (
                        nv > 1 and (nv - 1) * self.w >= n) or (
                        nv == 3 and n > 3 * self.w and n % (3 * self.w)):
                    continue
                nr = nv * self.w
                fill = (m / (-(-m // mr) * mr)) * (n / (-(-n // nr) * nr))
                score = fill * mr * nv / (max(mr * nv, 2 * (mr + nv)) + 8)
                best = max(best, (round(score, 6), mr * nv, nv, mr))
        return best[3], best[2]

    def default(self) -> dict[str, Any]:
        """The heuristic: the orientation of `default_swap`, the micro-kernel of `micro_tile`,
        MC x KC of A in L2."""
        swap = self.default_swap()
        p = self.pattern(swap)
        m, n = (self.n, self.m) if swap else (self.m, self.n)
        mr, nv = self.micro_tile(m, n)
        # K blocks of at most 256, balanced (784 -> 4 x 196, rounded up to 208)
        kc = min(512, _ceil_to(-(-self.kk // -(-self.kk // 256)), 16))
        work = self.m * self.n * self.kk
        from nfc.codegen.space import PARALLEL_WORK

        # a GEMM swapped for its narrow N (`_narrow_n`) runs one row tile per batch element:
        # parallel over the batch loops
        ext = {a.name: a.extent for a in self.op.all_axes}
        batch = math.prod(ext[a] for a in p.batch) if swap else 1
        parallel = work >= PARALLEL_WORK and (m > mr or (batch >= 2 and self._narrow_n()))
        # M blocks of at most 24 micro-tiles (A block of MC x KC in L2), balanced, and an even
        # number of them when parallel so two threads get the same work
        tiles = -(-m // mr)
        blocks = -(-tiles // 24)
        if parallel and tiles >= 2:
            blocks = max(2, blocks + blocks % 2)
        mc_tiles = min(48, -(-tiles // blocks))
        ku = next(x for x in (4, 2, 1) if self.kk % x == 0)
        jouter = self._jouter(p, n, nv * self.w)
        if jouter:
            parallel = work >= PARALLEL_WORK and n > nv * self.w
        elif parallel and not p.batch and BALANCE_PANELS and self._panels_balance(
                m, n, mr, mc_tiles, nv * self.w):
            jouter = 1  # parallel over B's panels (`_panels_balance`)
        return {"mr": mr, "nv": nv, "mc_tiles": mc_tiles, "kc": kc, "ku": ku, "jouter": jouter,
                "pack_a": 1 if m >= 2 * mr and self.kk >= 64 and not swap else 0,
                "pack_b": 1 if tiles > PACK_B_TILES or not self._rows_contiguous(p) or (
                    self._mixed()) or isinstance(self.op.operands[p.b], GatherView) else 0,
                "swap": 1 if swap else 0, "parallel": 1 if parallel else 0}

    def _jouter(self, p: GemmPattern, n: int, nr: int) -> int:
        """1 when the panels of B (the vector operand) should be the outermost loop, the
        batch loops inside them: B is indexed by no batch axis, larger than an L2 (1 MiB), and
        reading A once per panel costs less than reading B once per batch iteration. CapsNet's
        weight gradient `dkp[p, d, crs] = sum dy[n, p, ij, d] cols[n, ij, crs]` (with the
        `layout` pass: stored columns, 47.8 MB at batch 16) streamed all the columns once per
        capsule type p; with its 48-column panels outermost they stay in L2 over the 32 p's:
        106.6 -> 25.9 ms at batch 16 on one Zen 5 thread (57 -> 237 GFLOP/s), and its input
        gradient, whose B is the capsule weights shared by the batch, 39.4 -> 28.1 ms."""
        if not p.batch or n <= nr:  # (one panel: nothing to run the batch inside of)
            return 0
        ops = self.op.operands
        b_axes = {ix.name for ld in self.op.body.walk() if isinstance(ld, Load)
                  and ld.tensor is ops[p.b] for ix in ld.indices if isinstance(ix, Index)}
        if set(p.batch) & b_axes:
            return 0
        nbytes = [math.prod(v.type.shape) * v.type.dtype.itemsize for v in ops]
        ext = {a.name: a.extent for a in self.op.all_axes}
        batch = math.prod(ext[a] for a in p.batch)
        return int(nbytes[p.b] > 1 << 20 and nbytes[p.a] * -(-n // nr) < nbytes[p.b] * batch)

    @staticmethod
    def _panels_balance(m: int, n: int, mr: int, mc_tiles: int, nr: int) -> bool:
        """Whether two threads get more even shares of a GEMM without batch loops from B's
        panels (NR columns each) than from its M blocks (MC rows each). With few rows the M
        blocks split unevenly: M = 16 in 6-row tiles is blocks of 12 and 4 rows (the LSTM LM's
        gate GEMM, 16 x 320 x 1024: two threads at most 1.33x one), M = 64 blocks of 36 and
        28 (SC-RNN's 64 x 784 x 128). The busier of two threads gets the first half of the
        blocks (rounded up): min(M, ceil(B/2)·MC) / M of the rows, or min(N, ceil(P/2)·NR) / N
        of the columns with P panels; the panels are chosen when that share is at least 10 %
        smaller (not for a share of 0.505 against 0.5: M = 784 in blocks of 132 rows). Run
        over the panels (the panel loop outermost, as `jouter`), the sums keep their order."""
        mc = mr * mc_tiles
        blocks, panels = -(-m // mc), -(-n // nr)
        rows = min(m, -(-blocks // 2) * mc) / m
        cols = min(n, -(-panels // 2) * nr) / n
        return panels >= 2 and cols * 1.1 <= rows

    def _mixed(self) -> bool:
        """Whether a type is not f32 (the bf16 micro-kernel's paired dot products, `vdpbf16ps`,
        read the packed panels; unpacked B was measured for f32 only)."""
        return any(v.type.dtype != DType.F32 for v in (*self.op.operands, self.op.result))

    def _rows_contiguous(self, p: GemmPattern) -> bool:
        """Whether the vector operand's j dimension is its last (unpacked, it is read in
        unit-stride vectors; else only the pack makes it so)."""
        return p.b_dim == len(self.op.operands[p.b].type.shape) - 1

    def is_valid(self, cfg: dict[str, Any]) -> bool:
        """Registers suffice (accumulators + B vectors + a broadcast) and KC is a multiple
        of the k unroll."""
        try:
            mr, nv, ku, kc = int(cfg["mr"]), int(cfg["nv"]), int(cfg["ku"]), int(cfg["kc"])
            mct = int(cfg["mc_tiles"])
        except (KeyError, TypeError, ValueError):
            return False
        cfg = {**GEMM_DEFAULTS, **cfg}
        if any(cfg.get(k) not in v for k, v in self.params.items()):
            return False
        if mr * nv + nv + 1 > self.target.vector_registers:
            return False
        return kc % ku == 0 and mct >= 1  # gemm_rule_problem, for values of the space

    def to_schedule(self, cfg: dict[str, Any]) -> Schedule:
        """The schedule of a parameter dict."""
        p = self.pattern(bool(cfg.get("swap", 0)))
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
        if cfg.get("jouter"):  # the panels of B outermost, the batch loops inside (`_jouter`)
            order = [jl[0], *[x for x in order if x != jl[0]]]
            par = [jl[0]] if cfg.get("parallel") else []
        packs = [Pack(p.b, p.b_dim, nr)] if cfg.get("pack_b", 1) else []
        if cfg.get("pack_a"):
            packs.append(Pack(p.a, p.a_dim, mr))
        return Schedule(splits=tuple(splits), order=tuple(order), vectorize=jl[-1],
                        unroll=tuple(unroll), parallel=tuple(par),
                        cache_write=p.kouter[0] if p.kouter else f"{p.k}.1",
                        pack=tuple(packs))
