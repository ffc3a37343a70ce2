"""Types of the nf IR (`DType`, `TensorType`) and source locations (`Loc`)."""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


class DType(enum.Enum):
    """Element types of tensors and scalar expressions."""

    F16 = "f16"
    BF16 = "bf16"
    F32 = "f32"
    F64 = "f64"
    I1 = "i1"
    I32 = "i32"
    I64 = "i64"

    @property
    def is_float(self) -> bool:
        """True for the floating-point types."""
        return self in (DType.F16, DType.BF16, DType.F32, DType.F64)

    @property
    def is_int(self) -> bool:
        """True for integer types, the boolean `i1` included."""
        return not self.is_float

    @property
    def itemsize(self) -> int:
        """Bytes per element (i1 is stored as one byte)."""
        return {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i1": 1, "i32": 4, "i64": 8}[self.value]

    @property
    def numpy(self) -> np.dtype:
        """The numpy dtype the interpreter computes in (bf16 is emulated in f32)."""
        import numpy as np  # imported here so that `nfc --help` does not load numpy

        return np.dtype(
            {"f16": "float16", "bf16": "float32", "f32": "float32", "f64": "float64",
             "i1": "bool", "i32": "int32", "i64": "int64"}[self.value])

    @staticmethod
    def parse(text: str) -> DType:
        """The dtype spelled `text`; raises ValueError for an unknown name."""
        return DType(text)

    def __str__(self) -> str:
        return self.value


#: Largest number of elements a tensor may have; bigger shapes are refused by the frontend
#: and the verifier rather than exhausting memory later.
MAX_ELEMENTS = 1 << 40


@dataclass(frozen=True)
class TensorType:
    """A statically shaped tensor type; rank 0 is a scalar."""

    shape: tuple[int, ...]
    dtype: DType

    @property
    def rank(self) -> int:
        """Number of dimensions."""
        return len(self.shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of storage."""
        return self.size * self.dtype.itemsize

    def __str__(self) -> str:
        dims = "".join(f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.dtype}>"


# ---------------------------------------------------------------------------------------------
# source locations


@dataclass(frozen=True)
class Loc:
    """A source position: file, 1-based line and column, optional end column on that line."""

    file: str
    line: int
    col: int
    end_col: int | None = None

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"
