"""The GPU statements of the loop IR: warp shuffles and WMMA (Tensor Core) fragments.

The loop IR (`nfc.codegen.loops`) already has the GPU loop kinds (`blockIdx.x`, `threadIdx.x`),
the scopes `shared` and `fragment`, and `Barrier`. What the CUDA lowering needs beyond that is
here, as leaf statements the loop printer shows through their `text()`:

- `WarpShuffle`: `dst = value` taken from lane `lane ^ offset` of the warp (`__shfl_xor_sync`);
  every lane of the warp must execute it.
- `Fragment`, a buffer of scope `fragment`: an array of WMMA fragments held by a warp, each an
  `m x k` (matrix_a), `k x n` (matrix_b) or `m x n` (accumulator) tile.
- `FragFill`, `FragLoad`, `FragMma`, `FragStore`: `wmma::fill_fragment`, `load_matrix_sync`,
  `mma_sync` (acc += a @ b), `store_matrix_sync`. A load or store names the buffer element at
  the tile's corner (`origin`); rows are `buffer.shape[-1]` elements apart (row-major, the
  leading dimension `ldm`). Warp-collective: the origin must be the same in every lane.
- `VecLoad`: a 2- or 4-element vector load from global memory into registers (GEMM tiles).

Everything here runs per warp; the simulator (nfc.codegen.cuda.sim) checks that it is used that
way and the CUDA renderer (nfc.codegen.cuda.render) emits the `wmma::` calls.
"""

from __future__ import annotations

from dataclasses import dataclass

from nfc.codegen.loops import Buffer, Scope, Stmt, format_expr
from nfc.ir import Expr

#: Fragment roles, as `wmma::` spells them.
ROLES = ("matrix_a", "matrix_b", "accumulator")
#: Input precisions of a WMMA multiply and the `(m, n, k)` shape each uses.
WMMA_SHAPES: dict[str, tuple[int, int, int]] = {"f16": (16, 16, 16), "bf16": (16, 16, 16),
                                                "tf32": (16, 16, 8)}


@dataclass(frozen=True)
class Fragment(Buffer):
    """An array (`shape`) of WMMA fragments of one role, held collectively by a warp."""

    role: str = "accumulator"
    """`matrix_a`, `matrix_b` or `accumulator`."""
    mnk: tuple[int, int, int] = (16, 16, 16)
    """The WMMA shape (m, n, k)."""
    precision: str = "f32"
    """Element precision: `f16`, `bf16`, `tf32` for inputs; `f32` for accumulators."""

    def __post_init__(self) -> None:
        assert self.scope is Scope.FRAGMENT and self.role in ROLES

    @property
    def tile(self) -> tuple[int, int]:
        """Rows and columns of one fragment."""
        m, n, k = self.mnk
        return {"matrix_a": (m, k), "matrix_b": (k, n), "accumulator": (m, n)}[self.role]

    def __str__(self) -> str:
        m, n, k = self.mnk
        return f"{self.role}<{m}x{n}x{k}, {self.precision}>[{', '.join(map(str, self.shape))}]"


def _ix(frag: Buffer, index: tuple[Expr, ...]) -> str:
    return f"{frag.name}[{', '.join(format_expr(i) for i in index)}]" if index else frag.name


def ldm(buf: Buffer) -> int:
    """The leading dimension a fragment load/store uses for `buf`: its row length."""
    return buf.shape[-1]


@dataclass(frozen=True)
class WarpShuffle(Stmt):
    """`dst[index] = value` read from lane `lane ^ offset` of the same warp."""

    dst: Buffer
    index: tuple[Expr, ...]
    value: Expr
    offset: int

    def text(self) -> str:
        """The statement as loop-IR text."""
        return f"{_ix(self.dst, self.index)} = shfl_xor({format_expr(self.value)}, {self.offset})"


@dataclass(frozen=True)
class FragFill(Stmt):
    """Every element of fragment `frag[index]` becomes `value`."""

    frag: Fragment
    index: tuple[Expr, ...]
    value: Expr

    def text(self) -> str:
        """The statement as loop-IR text."""
        return f"wmma.fill {_ix(self.frag, self.index)}, {format_expr(self.value)}"


@dataclass(frozen=True)
class FragLoad(Stmt):
    """Load fragment `frag[index]` from the tile of `src` whose corner is `src[origin]`."""

    frag: Fragment
    index: tuple[Expr, ...]
    src: Buffer
    origin: tuple[Expr, ...]

    def text(self) -> str:
        """The statement as loop-IR text."""
        return (f"wmma.load {_ix(self.frag, self.index)}, &{_ix(self.src, self.origin)}, "
                f"ldm={ldm(self.src)}")


@dataclass(frozen=True)
class FragMma(Stmt):
    """`acc[acc_index] += a[a_index] @ b[b_index]` (inputs rounded to their precision, the
    products summed in f32)."""

    acc: Fragment
    acc_index: tuple[Expr, ...]
    a: Fragment
    a_index: tuple[Expr, ...]
    b: Fragment
    b_index: tuple[Expr, ...]

    def text(self) -> str:
        """The statement as loop-IR text."""
        c = _ix(self.acc, self.acc_index)
        return f"wmma.mma {c}, {_ix(self.a, self.a_index)}, {_ix(self.b, self.b_index)}, {c}"


@dataclass(frozen=True)
class FragStore(Stmt):
    """Store fragment `frag[index]` into the tile of `dst` whose corner is `dst[origin]`."""

    dst: Buffer
    origin: tuple[Expr, ...]
    frag: Fragment
    index: tuple[Expr, ...]

    def text(self) -> str:
        """The statement as loop-IR text."""
        return (f"wmma.store &{_ix(self.dst, self.origin)}, {_ix(self.frag, self.index)}, "
                f"ldm={ldm(self.dst)}")


@dataclass(frozen=True)
class VecLoad(Stmt):
    """`dst[w] = src[index with its last coordinate + w]` for w < `width`: one vector load of
    `width` consecutive elements (at most 16 bytes) of a global buffer into a register array.
    The first element's flat position must be a multiple of `width` (aligned)."""

    dst: Buffer
    src: Buffer
    index: tuple[Expr, ...]
    width: int

    def text(self) -> str:
        """The statement as loop-IR text."""
        return f"{self.dst.name}[0:{self.width}] = vload{self.width} &{_ix(self.src, self.index)}"


#: The statements of this module (what a walker that knows them may meet).
GPU_STMTS = (WarpShuffle, FragFill, FragLoad, FragMma, FragStore, VecLoad)
