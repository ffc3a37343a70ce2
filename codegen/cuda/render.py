"""CUDA C from the loop IR: one table per kind of node, then a small walker.

Expressions are rendered from tables keyed by operator-table row names (`nfc.ops`): `BINARY`
(infix operators and their C precedence), `CALLS` (intrinsics: a format per compute type, f32
and f64 spelled apart), `INT_CALLS`. A row missing from the tables is emitted through its
`lower["cuda"]` hook (`(args: list[str], ctype: DType) -> str`) or, failing that, through its
`expand` (the operator written with others); otherwise the renderer says it cannot emit it.
Types follow `nfc.codegen.cuda.types` (the simulator uses the same rules): f16/bf16 are loaded
into f32 and rounded when stored; weak literals take their context's type.

A kernel is `extern "C" __global__` with `__launch_bounds__(threads)`; outputs are `T*`, inputs
`const T*`, all `__restrict__` (the buffers of one kernel call never overlap; a kernel whose
launch updates a buffer in place has `GpuKernel.restrict` False and no `__restrict__`). Global
buffers are flat (row-major offsets written out), shared, register and fragment arrays keep
their dimensions. A comment above each kernel gives its kind, schedule, launch shape, shared memory,
the compute it runs and its source location.
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable, Mapping, Sequence

from nfc.codegen.cuda.gpuir import (
    FragFill,
    FragLoad,
    Fragment,
    FragMma,
    FragStore,
    VecLoad,
    WarpShuffle,
    ldm,
)
from nfc.codegen.cuda.lower import GpuKernel, GpuProgram
from nfc.codegen.cuda.types import BF16, F16, F32, F64, I1, I32, I64, Types, compute_type
from nfc.codegen.loops import (
    Allocate,
    Barrier,
    Buffer,
    BufLoad,
    Clamp,
    For,
    If,
    LoopKind,
    Scope,
    Seq,
    Stmt,
    Store,
)
from nfc.ir import Binary, Call, Cast, Const, DType, Expr, Index, Select, Unary
from nfc.ops import find

#: C spelling of element types (in memory).
CTYPE: dict[DType, str] = {F32: "float", F64: "double", I32: "int", I64: "long long",
                           I1: "bool", F16: "__half", BF16: "__nv_bfloat16"}
#: Infix operators: row name -> (C operator, precedence).
BINARY: dict[str, tuple[str, int]] = {
    "+": ("+", 12), "-": ("-", 12), "*": ("*", 13), "/": ("/", 13),
    "<": ("<", 10), "<=": ("<=", 10), ">": (">", 10), ">=": (">=", 10),
    "==": ("==", 9), "!=": ("!=", 9), "and": ("&&", 5), "or": ("||", 4),
}
#: Float intrinsics: row name -> (f32 format, f64 format).
CALLS: dict[str, tuple[str, str]] = {
    "exp": ("expf({0})", "exp({0})"), "log": ("logf({0})", "log({0})"),
    "sqrt": ("sqrtf({0})", "sqrt({0})"), "rsqrt": ("rsqrtf({0})", "rsqrt({0})"),
    "tanh": ("tanhf({0})", "tanh({0})"), "erf": ("erff({0})", "erf({0})"),
    "sigmoid": ("nfc_sigmoid({0})", "nfc_sigmoid({0})"),
    "softplus": ("nfc_softplus({0})", "nfc_softplus({0})"),
    "abs": ("fabsf({0})", "fabs({0})"), "max": ("fmaxf({0}, {1})", "fmax({0}, {1})"),
    "min": ("fminf({0}, {1})", "fmin({0}, {1})"), "pow": ("powf({0}, {1})", "pow({0}, {1})"),
    "log1p": ("log1pf({0})", "log1p({0})"), "expm1": ("expm1f({0})", "expm1({0})"),
    "atan2": ("atan2f({0}, {1})", "atan2({0}, {1})"),
    "isfinite": ("isfinite({0})", "isfinite({0})"),
    "//": ("floorf({0} / {1})", "floor({0} / {1})"),
    "%": ("nfc_floormod({0}, {1})", "nfc_floormod({0}, {1})"),
}
#: Integer intrinsics and operators: row name -> (i32 format, i64 format).
INT_CALLS: dict[str, tuple[str, str]] = {
    "abs": ("abs({0})", "llabs({0})"), "max": ("max({0}, {1})", "max({0}, {1})"),
    "min": ("min({0}, {1})", "min({0}, {1})"),
    "//": ("nfc_floordiv({0}, {1})", "nfc_floordiv({0}, {1})"),
    "%": ("nfc_floormod({0}, {1})", "nfc_floormod({0}, {1})"),
    "philox": ("nfc_philox({0}, {1})", "nfc_philox({0}, {1})"),
    "bit": ("((({0}) >> ({1})) & 1)", "((({0}) >> ({1})) & 1LL)"),
}
#: Reducing stores: reduction -> (compound operator or None, combine format for f32, f64,
#: integers).
REDUCE: dict[str, tuple[str | None, str, str, str]] = {
    "sum": ("+=", "{0} + {1}", "{0} + {1}", "{0} + {1}"),
    "prod": ("*=", "{0} * {1}", "{0} * {1}", "{0} * {1}"),
    "max": (None, "fmaxf({0}, {1})", "fmax({0}, {1})", "max({0}, {1})"),
    "min": (None, "fminf({0}, {1})", "fmin({0}, {1})", "min({0}, {1})"),
}
#: Conversions between compute types and 16-bit storage.
TO_STORAGE = {F16: "__float2half_rn({0})", BF16: "__float2bfloat16_rn({0})"}
FROM_STORAGE = {F16: "__half2float({0})", BF16: "__bfloat162float({0})"}
_PRIMARY, _UNARY, _TERNARY = 16, 15, 3

HELPERS = r"""
template <typename T> __device__ __forceinline__ T nfc_floordiv(T a, T b) {
  T q = a / b;
  return (q * b != a && ((a < 0) != (b < 0))) ? q - 1 : q;
}
template <typename T> __device__ __forceinline__ T nfc_floormod(T a, T b) {
  T r = a % b;
  return (r != 0 && ((r < 0) != (b < 0))) ? r + b : r;
}
__device__ __forceinline__ float nfc_floormod(float a, float b) {
  float r = fmodf(a, b);
  return (r != 0.0f && ((r < 0.0f) != (b < 0.0f))) ? r + b : r;
}
__device__ __forceinline__ double nfc_floormod(double a, double b) {
  double r = fmod(a, b);
  return (r != 0.0 && ((r < 0.0) != (b < 0.0))) ? r + b : r;
}
__device__ __forceinline__ float nfc_sigmoid(float x) { return 1.0f / (1.0f + expf(-x)); }
__device__ __forceinline__ double nfc_sigmoid(double x) { return 1.0 / (1.0 + exp(-x)); }
__device__ __forceinline__ float nfc_softplus(float x) {
  return fmaxf(x, 0.0f) + log1pf(expf(-fabsf(x)));
}
__device__ __forceinline__ double nfc_softplus(double x) {
  return fmax(x, 0.0) + log1p(exp(-fabs(x)));
}
// Philox-4x32-10 (nfc/philox.py): the first output word of (counter, 0, 0) under key, / 2^32
__device__ __forceinline__ double nfc_philox(long long key, long long counter) {
  unsigned int k0 = (unsigned int)key, k1 = (unsigned int)((unsigned long long)key >> 32);
  unsigned int c0 = (unsigned int)counter;
  unsigned int c1 = (unsigned int)((unsigned long long)counter >> 32), c2 = 0u, c3 = 0u;
  for (int r = 0; r < 10; ++r) {
    if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
    unsigned int hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
    unsigned int hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
    unsigned int n0 = hi1 ^ c1 ^ k0, n2 = hi0 ^ c3 ^ k1;
    c0 = n0; c1 = lo1; c2 = n2; c3 = lo0;
  }
  return (double)c0 * 2.3283064365386963e-10;
}
"""


class RenderError(NotImplementedError):
    """Loop IR the CUDA renderer cannot emit (an operator without a CUDA spelling)."""


def literal(value: int | float | bool, dt: DType) -> str:
    """A C literal of compute type `dt`."""
    if dt is I1:
        return "true" if value else "false"
    if dt.is_float:
        x = float(value)
        suffix = "f" if dt is F32 else ""
        if math.isnan(x):
            return "__int_as_float(0x7fffffff)" if dt is F32 else \
                "__longlong_as_double(0x7ff8000000000000LL)"
        if math.isinf(x):
            inf = "__int_as_float(0x7f800000)" if dt is F32 else \
                "__longlong_as_double(0x7ff0000000000000LL)"
            return inf if x > 0 else f"-{inf}"
        return f"{x!r}{suffix}"
    n = int(value)
    if dt is I64:
        return f"{n}LL" if n != -(1 << 63) else "(-9223372036854775807LL - 1)"
    return str(n) if n != -(1 << 31) else "(-2147483647 - 1)"


def _class(dt: DType) -> int:
    """0 for 32-bit (and narrower) compute types, 1 for 64-bit: the column of the tables."""
    return 1 if dt in (F64, I64) else 0


class KernelRenderer:
    """Renders one kernel (statements and expressions)."""

    def __init__(self, kernel: GpuKernel, relax: int = 0) -> None:
        self.kernel = kernel
        # register-pressure relief (render_kernels): 1 __launch_bounds__(threads, 1),
        # 2 also `#pragma unroll 1` on serial loops
        self.relax = relax
        self.types = Types()
        self.lines: list[str] = []
        self.once = _stored_once(kernel.func.body)
        self.nonneg: set[str] = set()

    # -- expressions -------------------------------------------------------------------------

    def expr(self, e: Expr, want: DType | None) -> str:
        """`e` as C text of compute type `want` (its own type when None)."""
        text, _ = self._expr(e, want)
        return text

    def _expr(self, e: Expr, want: DType | None) -> tuple[str, int]:
        t = self.types.result(e, want)
        text, prec = self._node(e, want, t)
        if want is not None and want != t:
            return f"({CTYPE[want]}){_wrap(text, prec, _UNARY)}", _UNARY
        return text, prec

    def _arg(self, e: Expr, want: DType | None, need: int) -> str:
        text, prec = self._expr(e, want)
        return _wrap(text, prec, need)

    def _node(self, e: Expr, want: DType | None, t: DType) -> tuple[str, int]:
        if isinstance(e, Const):
            text = literal(e.value, t)
            return text, _UNARY if text.startswith("-") else _PRIMARY
        if isinstance(e, Index):
            return e.name, _PRIMARY
        if isinstance(e, BufLoad):
            text = self.access(e.buffer, e.indices)
            conv = FROM_STORAGE.get(e.buffer.dtype)
            return (conv.format(text) if conv else text), _PRIMARY
        if isinstance(e, Clamp):
            return f"min({self.expr(e.x, t)}, {literal(e.hi, t)})", _PRIMARY
        if isinstance(e, Cast):
            if e.dtype in TO_STORAGE:  # round through the 16-bit type
                x = self.expr(e.x, None)
                return FROM_STORAGE[e.dtype].format(TO_STORAGE[e.dtype].format(x)), _PRIMARY
            return f"({CTYPE[t]}){self._arg(e.x, None, _UNARY)}", _UNARY
        opt = self.types.operand(e, want)
        if isinstance(e, Select):
            cond = self._arg(e.cond, I1, _TERNARY + 1)
            return (f"{cond} ? {self._arg(e.a, opt, _TERNARY + 1)} : "
                    f"{self._arg(e.b, opt, _TERNARY)}"), _TERNARY
        if isinstance(e, Unary):
            x = self._arg(e.x, opt, _UNARY)
            return (f"-{x}" if e.op == "neg" else f"!{x}"), _UNARY
        row = find(e)
        if row is None:
            raise RenderError(f"unknown operator in {e!r}")
        args = e.children()
        if isinstance(e, Binary) and e.op in ("//", "%") and not opt.is_float and \
                self._plain_division(e):
            op = "/" if e.op == "//" else "%"
            return f"{self._arg(e.a, opt, 13)} {op} {self._arg(e.b, opt, 14)}", 13
        if isinstance(e, Binary) and e.op in BINARY:
            op, p = BINARY[e.op]
            return f"{self._arg(e.a, opt, p)} {op} {self._arg(e.b, opt, p + 1)}", p
        table = CALLS if opt.is_float else INT_CALLS
        fmt = table.get(row.name)
        if fmt is not None:
            text = fmt[_class(opt)].format(*(self.expr(a, opt) for a in args))
            if row.name == "philox":  # a double in [0, 1), rounded to the context's type
                return f"({CTYPE[t]}){text}", _UNARY
            return text, _PRIMARY
        hook = row.lower.get("cuda")
        if hook is not None:
            fn: Callable[[list[str], DType], str] = _resolve(hook)
            return fn([self.expr(a, opt) for a in args], t), _PRIMARY
        if row.expand is not None and isinstance(e, Call):
            return self._expr(row.expand(*args), want)
        raise RenderError(f"the CUDA backend has no spelling of '{row.name}' for {opt}: add it "
                          "to nfc.codegen.cuda.render or a 'cuda' lower hook to its row")

    def _plain_division(self, e: Binary) -> bool:
        """`a // k` and `a % k` with a >= 0 and k > 0 are C's `/` and `%`."""
        return isinstance(e.b, Const) and int(e.b.value) > 0 and self._nonneg(e.a)

    def _nonneg(self, e: Expr) -> bool:
        if isinstance(e, Const):
            return not isinstance(e.value, float) and int(e.value) >= 0
        if isinstance(e, Index):
            return True  # loop variables
        if isinstance(e, BufLoad):
            return e.buffer.name in self.nonneg and not e.indices
        if isinstance(e, Clamp):
            return self._nonneg(e.x)
        if isinstance(e, Binary) and e.op in ("+", "*", "//", "%"):
            return self._nonneg(e.a) and self._nonneg(e.b)
        return False

    def access(self, b: Buffer, indices: Sequence[Expr]) -> str:
        """`b[...]`: a flat offset for global buffers, one subscript per dimension else."""
        if not indices:
            return f"{b.name}[0]" if b.scope is Scope.GLOBAL else b.name
        idx = [self.expr(i, I32) for i in indices]
        if b.scope is Scope.GLOBAL:
            off = idx[0]
            for n, i in enumerate(idx[1:], 1):
                off = f"({off}) * {b.shape[n]} + {i}" if " " in off else \
                    f"{off} * {b.shape[n]} + {i}"
            return f"{b.name}[{off}]"
        return b.name + "".join(f"[{i}]" for i in idx)

    # -- statements --------------------------------------------------------------------------

    def emit(self, text: str, depth: int) -> None:
        """Append one line."""
        self.lines.append("  " * depth + text)

    def stmt(self, s: Stmt, depth: int) -> None:
        """Render statement `s` at indentation `depth`."""
        if isinstance(s, Seq):
            for x in s.body:
                self.stmt(x, depth)
        elif isinstance(s, For):
            self._for(s, depth)
        elif isinstance(s, If):
            self.emit(f"if ({self.expr(s.cond, I1)}) {{", depth)
            self.stmt(s.then, depth + 1)
            if s.orelse is not None:
                self.emit("} else {", depth)
                self.stmt(s.orelse, depth + 1)
            self.emit("}", depth)
        elif isinstance(s, Allocate):
            self._allocate(s, depth)
        elif isinstance(s, Store):
            self._store(s, depth)
        elif isinstance(s, Barrier):
            self.emit("__syncthreads();" if s.scope == "block" else "__syncwarp();", depth)
        elif isinstance(s, WarpShuffle):
            dt = compute_type(s.dst.dtype)
            self.emit(f"{self.access(s.dst, s.index)} = __shfl_xor_sync(0xffffffffu, "
                      f"{self.expr(s.value, dt)}, {s.offset});", depth)
        else:
            self._fragment(s, depth)

    def _for(self, s: For, depth: int) -> None:
        if s.kind is LoopKind.BLOCK_X:
            self.emit(f"const int {s.var} = blockIdx.x;", depth)
            return self.stmt(s.body, depth)
        if s.kind is LoopKind.THREAD_X:
            self.emit(f"const int {s.var} = threadIdx.x;", depth)
            return self.stmt(s.body, depth)
        if s.kind.is_gpu:
            raise RenderError(f"loop kind {s.kind.value} is not used by the CUDA lowering")
        if s.kind is LoopKind.UNROLLED:
            self.emit("#pragma unroll", depth)
        elif self.relax >= 2:
            self.emit("#pragma unroll 1", depth)
        self.emit(f"for (int {s.var} = 0; {s.var} < {self.expr(s.extent, I32)}; ++{s.var}) {{",
                  depth)
        self.stmt(s.body, depth + 1)
        self.emit("}", depth)
        return None

    def _allocate(self, s: Allocate, depth: int) -> None:
        b = s.buffer
        if b.scope is Scope.SHARED:  # declared at the top of the kernel
            return self.stmt(s.body, depth)
        if isinstance(b, Fragment):
            self.emit(f"{fragment_type(b)} {b.name}{_dims(b.shape)};", depth)
            return self.stmt(s.body, depth)
        if b.scope is Scope.GLOBAL:
            raise RenderError("kernel workspace buffers are not supported by the CUDA backend")
        ct = CTYPE[compute_type(b.dtype)]
        body = s.body.body if isinstance(s.body, Seq) else (s.body,)
        first = body[0] if body else None
        if not b.shape and isinstance(first, Store) and first.buffer == b and \
                first.reduce is None:  # a let: declare with its value
            value = self.expr(first.value, compute_type(b.dtype))
            if b.name in self.once and not b.dtype.is_float and self._nonneg(first.value):
                self.nonneg.add(b.name)
            self.emit(f"{'const ' if b.name in self.once else ''}{ct} {b.name} = {value};",
                      depth)
            return self.stmt(Seq(tuple(body[1:])), depth)
        self.emit(f"{ct} {b.name}{_dims(b.shape)};", depth)
        return self.stmt(s.body, depth)

    def _store(self, s: Store, depth: int) -> None:
        b = s.buffer
        ct = compute_type(b.dtype)
        target = self.access(b, s.indices)
        value = self.expr(s.value, ct)
        if s.reduce is None:
            conv = TO_STORAGE.get(b.dtype)
            self.emit(f"{target} = {conv.format(value) if conv else value};", depth)
            return
        compound, *fmts = REDUCE[s.reduce]
        if compound is not None and b.dtype not in TO_STORAGE:
            self.emit(f"{target} {compound} {value};", depth)
            return
        old = FROM_STORAGE[b.dtype].format(target) if b.dtype in TO_STORAGE else target
        fmt = fmts[0 if ct is F32 else 1 if ct is F64 else 2]
        new = fmt.format(old, value)
        conv = TO_STORAGE.get(b.dtype)
        self.emit(f"{target} = {conv.format(new) if conv else new};", depth)

    def _fragment(self, s: Stmt, depth: int) -> None:
        def f(b: Buffer, idx: Sequence[Expr]) -> str:
            return b.name + "".join(f"[{self.expr(i, I32)}]" for i in idx)
        if isinstance(s, FragFill):
            self.emit(f"wmma::fill_fragment({f(s.frag, s.index)}, {self.expr(s.value, F32)});",
                      depth)
        elif isinstance(s, FragLoad):
            frag = f(s.frag, s.index)
            self.emit(f"wmma::load_matrix_sync({frag}, &{self.access(s.src, s.origin)}, "
                      f"{ldm(s.src)});", depth)
            if s.frag.precision == "tf32":
                self.emit("#pragma unroll", depth)
                self.emit(f"for (int t = 0; t < {frag}.num_elements; ++t) "
                          f"{frag}.x[t] = wmma::__float_to_tf32({frag}.x[t]);", depth)
        elif isinstance(s, FragMma):
            acc = f(s.acc, s.acc_index)
            self.emit(f"wmma::mma_sync({acc}, {f(s.a, s.a_index)}, {f(s.b, s.b_index)}, "
                      f"{acc});", depth)
        elif isinstance(s, FragStore):
            self.emit(f"wmma::store_matrix_sync(&{self.access(s.dst, s.origin)}, "
                      f"{f(s.frag, s.index)}, {ldm(s.dst)}, wmma::mem_row_major);", depth)
        elif isinstance(s, VecLoad):  # one 32/64/128-bit load of `width` elements
            et, n = CTYPE[s.src.dtype], s.width * s.src.dtype.itemsize
            conv = FROM_STORAGE.get(s.src.dtype, "{0}")
            self.emit(f"{{  // {8 * n}-bit load", depth)
            self.emit(f"struct alignas({n}) nfc_vec {{ {et} x[{s.width}]; }};", depth + 1)
            self.emit(f"const nfc_vec nfc_v = *reinterpret_cast<const nfc_vec*>("
                      f"&{self.access(s.src, s.index)});", depth + 1)
            for u in range(s.width):
                self.emit(f"{s.dst.name}[{u}] = {conv.format(f'nfc_v.x[{u}]')};", depth + 1)
            self.emit("}", depth)
        else:
            raise RenderError(f"unknown loop-IR statement {type(s).__name__}")

    # -- the kernel --------------------------------------------------------------------------

    def render(self) -> str:
        """The kernel's `__global__` function with its comment."""
        k = self.kernel
        f = k.func
        params = []
        for n, b in enumerate(f.params):
            const = "" if n < f.n_outputs else "const "
            params.append(f"{const}{CTYPE[b.dtype]}*{' __restrict__' if k.restrict else ''} "
                          f"{b.name}")
        from nfc.codegen.cuda.space import to_params

        sched = ", ".join(f"{a}={b}" for a, b in to_params(k.schedule).items())
        head = [f"// {f.name}: {k.kind} ({sched})",
                f"// launch: grid {k.grid} x block {k.block}, {k.shared_bytes} bytes shared"]
        if k.source:
            head.append(f"// {k.source}")
        if k.loc is not None:
            head.append(f"// at {k.loc}")
        bounds = f"{k.block}, 1" if self.relax else f"{k.block}"
        head.append(f'extern "C" __global__ void __launch_bounds__({bounds}) '
                    f"{f.name}({', '.join(params)}) {{")
        for s in f.body.walk():
            if isinstance(s, Allocate) and s.buffer.scope is Scope.SHARED:
                b = s.buffer
                head.append(f"  __shared__ __align__(32) {CTYPE[b.dtype]} "
                            f"{b.name}{_dims(b.shape)};")
        self.stmt(f.body, 1)
        return "\n".join([*head, *self.lines, "}"]) + "\n"


def fragment_type(b: Fragment) -> str:
    """The `wmma::fragment<...>` type of a fragment buffer."""
    m, n, k = b.mnk
    if b.role == "accumulator":
        return f"wmma::fragment<wmma::accumulator, {m}, {n}, {k}, float>"
    el = {"f16": "__half", "bf16": "__nv_bfloat16", "tf32": "wmma::precision::tf32"}[
        b.precision]
    return f"wmma::fragment<wmma::{b.role}, {m}, {n}, {k}, {el}, wmma::row_major>"


def _dims(shape: Sequence[int]) -> str:
    return "".join(f"[{d}]" for d in shape)


def _wrap(text: str, prec: int, need: int) -> str:
    return text if prec >= need else f"({text})"


def _resolve(hook: object) -> Callable[[list[str], DType], str]:
    if isinstance(hook, str):
        mod, _, attr = hook.partition(":")
        return getattr(importlib.import_module(mod), attr)  # type: ignore[no-any-return]
    return hook  # type: ignore[return-value]


def _stored_once(body: Stmt) -> set[str]:
    """Register scalars with exactly one store in the kernel (they can be `const`)."""
    count: dict[str, int] = {}
    for s in body.walk():
        if isinstance(s, Store | WarpShuffle):
            b = s.buffer if isinstance(s, Store) else s.dst
            count[b.name] = count.get(b.name, 0) + (2 if isinstance(s, Store) and s.reduce
                                                     else 1)
    return {n for n, k in count.items() if k == 1}


def _features(kernels: Sequence[GpuKernel]) -> set[str]:
    found: set[str] = set()
    for k in kernels:
        for b in k.func.params:
            found.add(b.dtype.value)
        for s in k.func.body.walk():
            if isinstance(s, Allocate):
                found.add(s.buffer.dtype.value)
                if isinstance(s.buffer, Fragment):
                    found.add("wmma")
    return found


def render_kernels(kernels: Sequence[GpuKernel], title: str = "", *,
                   relax: Mapping[str, int] | None = None) -> str:
    """One CUDA translation unit with `kernels` (names must differ). `relax` (kernel name ->
    level) eases the register pressure of kernels that spilled (see
    nfc.codegen.cuda.program.compile_program): level 1 declares
    `__launch_bounds__(threads, 1)` (ptxas may then use up to 65536 / threads registers),
    level 2 also keeps serial loops rolled (`#pragma unroll 1`)."""
    feats = _features(kernels)
    out = [f"// generated by nfc (nfc.codegen.cuda.render){': ' + title if title else ''}"]
    if "wmma" in feats:
        out.append("#include <mma.h>")
    if "f16" in feats:
        out.append("#include <cuda_fp16.h>")
    if "bf16" in feats:
        out.append("#include <cuda_bf16.h>")
    if "wmma" in feats:
        out.append("using namespace nvcuda;")
    out.append(HELPERS)
    out += [KernelRenderer(k, (relax or {}).get(k.func.name, 0)).render() for k in kernels]
    return "\n".join(out)


def render_program(p: GpuProgram) -> str:
    """The CUDA C of a program's kernels."""
    return render_kernels(p.kernels, p.name)


def render_kernel(k: GpuKernel) -> str:
    """The `__global__` function of one kernel (no includes or helpers)."""
    return KernelRenderer(k).render()
