"""One op of a `.nf` file as native functions: its forward and its vector-Jacobian product.

This is the framework-neutral half of `nfc.torch` and `nfc.jax`; it speaks numpy and DLPack:

    op = NativeOp("capsule.nf", "capsule_conv", params={"stride": 2})
    op.result_types([(8, 2, 10, 10, 4, 4), (4, 2, 3, 3, 4, 4)], [DType.F32] * 2)
    y, = op(a, k)                                   # numpy/DLPack in, numpy out (or `out=`)
    da, dk = op.vjp([a, k], [dy], wrt=(0, 1))       # gradients of <y, dy> w.r.t. a and k

**Shapes.** The op's signature (`A: T[B, C, H, W, P, P]`) is its contract. `result_types`
unifies argument shapes and dtypes with it exactly as a call in a `.nf` model does
(nfc.frontend.shapes.unify_params) and evaluates the declared result types; it also works on
symbolic sizes (objects with `+ - * // %` and `==`, such as torch's SymInt), which is how a
fake tensor learns its shape under `torch.compile`.

**Compilation.** Each distinct tuple of argument types is compiled once (`compile_op`, the
im2col rewrite, then the pipeline of `nfc compile`: `inline,canonicalize,cse,dce`, tuned
schedules from the tuning cache, `fuse`) into a library kept in nfc's library cache
(nfc.runtime.build: `$NFC_CACHE_DIR/artifacts`, keyed by the final IR), loaded, and kept in
memory on this object. A second process, or a second `NativeOp` of the same op, finds the
library on disk and skips LLVM.

**Gradients.** `vjp_func` builds, for the inputs listed in `wrt`, the function
`(inputs..., dy_1..dy_k) -> (dx for x in wrt)`: it appends the scalar
`L = sum_j <y_j, dy_j>` to the op's function and differentiates `L` with the autodiff pass
(nfc.passes.autodiff.graph.reverse_mode), whose gradient w.r.t. `x` is exactly
`sum_j dy_j^T (dy_j/dx)`. Forward values the gradient reads (a sigmoid, say) are recomputed
inside the backward; linear ops such as capsule convolution need none and dead-code
elimination removes their forward from it.

**Arrays.** Arguments are taken by DLPack (numpy, torch, JAX CPU arrays) without a copy. They
must have exactly the compiled dtype and be C-contiguous: anything else is an `OpError`
naming the argument, unless `copy=True` (then a C-contiguous copy is made; never a silent
dtype conversion). Results are written into the `out` arrays when given (zero-copy into
memory another framework owns), else into fresh numpy arrays.

**16-bit floats.** f16 arrays are numpy `float16`, bf16 arrays `ml_dtypes.bfloat16` (what JAX
hands a callback; nfc.torch views a bfloat16 tensor's bits, which DLPack cannot carry as
bf16, as such an array). An op whose signature admits them (a dtype variable `T`, or `f16` /
`bf16` spelled out) compiles for them like any other dtype: tensors are stored in 16 bits,
arithmetic runs in f32 and rounds at every store (docs/codegen.md, "16-bit floats"). The
vjp of a 16-bit op is computed the same way, so its gradients are rounded to the format too.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np

import nfc.std
from nfc.diagnostics import CompileError
from nfc.frontend import ast
from nfc.frontend.ellipsis import leading
from nfc.frontend.shapes import (
    DTYPES,
    CTValue,
    Unbound,
    eval_ct,
    format_tensor_type,
    format_type,
    is_dtype_var,
    names_in,
    unify_params,
)
from nfc.ir import Axis, Binary, ComputeOp, DType, Func, Index, Load, Loc, TensorType, Value

#: The standard library, also reachable as `source="std.nn"`.
STD_NN = Path(nfc.std.__file__).parent / "nn.nf"

#: numpy dtypes the CPU backend compiles: bf16 is `ml_dtypes.bfloat16` (two bytes, as the
#: library stores it), f16 numpy's `float16` (docs/codegen.md, "16-bit floats").
NUMPY_DTYPES: dict[np.dtype, DType] = {np.dtype(n): d for n, d in (
    ("float32", DType.F32), ("float64", DType.F64), ("float16", DType.F16),
    ("int32", DType.I32), ("int64", DType.I64), ("bool", DType.I1))}
NUMPY_DTYPES[np.dtype(ml_dtypes.bfloat16)] = DType.BF16

Size = Any
"""A dimension: an int, or a symbolic size (torch.SymInt) while tracing."""


class OpError(ValueError):
    """A call the op's signature does not allow (shapes, dtypes, layout), or an op that cannot
    be loaded; the message names the argument and says what was expected."""


def as_array(value: Any, what: str = "argument") -> np.ndarray:
    """`value` as a numpy array sharing its memory (nfc.runtime.loader.as_array: DLPack)."""
    from nfc.runtime.loader import ArtifactError
    from nfc.runtime.loader import as_array as take

    try:
        return take(value, what)
    except ArtifactError as exc:
        raise OpError(str(exc)) from None


def dtype_of(arr: np.ndarray, what: str) -> DType:
    """The IR dtype of a numpy array, or an OpError for a dtype nfc does not compile."""
    dt = NUMPY_DTYPES.get(arr.dtype)
    if dt is None:
        raise OpError(f"{what} has dtype {arr.dtype.name}, which nfc does not compile; use "
                      f"one of {', '.join(d.name for d in NUMPY_DTYPES)}")
    return dt


# ---------------------------------------------------------------------------------------------
# the signature


def _read_op(source: str | Path, name: str,
             search_paths: Sequence[str] | None) -> tuple[Path, ast.OpDef]:
    from nfc.frontend.imports import Loader, suggest

    path = STD_NN if str(source) == "std.nn" else Path(source)
    if not path.is_file():
        raise OpError(f"no such .nf file: '{source}'")
    loader = Loader(list(search_paths or []))
    try:
        root = loader.load_root(path.read_text(encoding="utf-8"), str(path))
        if loader.diagnostics:
            raise CompileError(loader.diagnostics)
        found = root.lookup_op(name, Loc(str(path), 1, 1))
    except CompileError as err:
        raise OpError(f"cannot load op '{name}' from '{path}':\n{err}") from None
    if found is None:
        raise OpError(f"no op named '{name}' in '{path}'{suggest(name, root.op_names())}")
    return path, found[0]


def _resolve_params(op: ast.OpDef, given: Mapping[str, Any]) -> dict[str, CTValue]:
    """The op's compile-time arguments: `given`, then the declared defaults."""
    names = [c.name for c in op.cparams]
    unknown = sorted(set(given) - set(names))
    if unknown:
        have = ", ".join(f"{c.name}: {c.kind}" for c in op.cparams) or "none"
        raise OpError(f"op '{op.name}' has no compile-time parameter "
                      f"{', '.join(repr(u) for u in unknown)} (it has: {have})")
    out: dict[str, CTValue] = {}
    for c in op.cparams:
        if c.name in given:
            v = given[c.name]
            out[c.name] = tuple(int(x) for x in v) if c.kind == "ints" else v
        elif c.default is not None:
            out[c.name] = eval_ct(c.default, lambda n, loc: out[n] if n in out
                                  else _raise(Unbound(n)))
        else:
            raise OpError(f"op '{op.name}' needs its compile-time parameter '{c.name}: "
                          f"{c.kind}' (params={{'{c.name}': ...}})")
    return out


def _raise(exc: Exception) -> Any:
    raise exc


class OpSignature:
    """An op's parameters and results, with the shapes its signature allows."""

    def __init__(self, op: ast.OpDef, cvals: Mapping[str, CTValue]) -> None:
        self.op = op
        self.cvals = dict(cvals)
        self.inputs = [p.name for p in op.params]
        self.outputs = [p.name or "result" for p in op.outputs]
        self._known: dict[tuple[Any, ...], list[tuple[tuple[Size, ...], DType]]] = {}

    def describe(self) -> str:
        """`capsule_conv(A: T[B, C, ...], K: ...) -> T[...]`."""
        ins = ", ".join(f"{p.name}: {format_type(p.type)}" for p in self.op.params)
        outs = ", ".join((f"{p.name}: " if p.name else "") + format_type(p.type)
                         for p in self.op.outputs)
        return f"{self.op.name}({ins}) -> {outs if len(self.op.outputs) == 1 else f'({outs})'}"

    def result_types(self, shapes: Sequence[Sequence[Size]],
                     dtypes: Sequence[DType]) -> list[tuple[tuple[Size, ...], DType]]:
        """Shape and dtype of each result for arguments of these shapes and dtypes, or an
        OpError saying which argument the signature refuses. Sizes may be symbolic."""
        if len(shapes) != len(self.op.params):
            raise OpError(f"{self.op.name} takes {len(self.op.params)} tensor arguments "
                          f"({', '.join(self.inputs)}), got {len(shapes)}")
        concrete = all(type(d) is int for s in shapes for d in s)
        key = (tuple(map(tuple, shapes)), tuple(dtypes)) if concrete else None
        if key is not None and key in self._known:
            return self._known[key]
        if concrete:
            try:
                b = unify_params(self.op, [TensorType(tuple(s), dt) for s, dt in
                                           zip(shapes, dtypes, strict=True)],
                                 [self.op.loc] * len(shapes), self.cvals)
            except CompileError as err:
                raise OpError(f"{self.describe()}: {_first_line(err)}") from None
            dims, dvars, ell = dict(b.dims), dict(b.dtypes), b.ellipsis
        else:
            dims, dvars, ell = self._unify_symbolic(shapes, dtypes)

        def lookup(n: str, loc: Loc) -> CTValue:
            return self.cvals[n] if n in self.cvals else dims[n]

        out = []
        for p in self.op.outputs:
            exprs = p.type.dims[1:] if leading(p.type) else p.type.dims
            shape = tuple(ell or ()) if leading(p.type) else ()
            shape += tuple(eval_ct(e, lookup) for e in exprs)
            dt = dvars[p.type.dtype] if is_dtype_var(p.type.dtype) else DTYPES[p.type.dtype]
            for d in shape:
                if type(d) is int and d <= 0:
                    raise OpError(f"{self.describe()}: result {p.name or 'of the op'} would "
                                  f"have shape {list(shape)} for arguments of shapes "
                                  f"{[list(s) for s in shapes]}; every size must be positive")
            out.append((shape, dt))
        if key is not None:
            self._known[key] = out
        return out

    def _unify_symbolic(self, shapes: Sequence[Sequence[Size]], dtypes: Sequence[DType]
                        ) -> tuple[dict[str, Size], dict[str, DType], tuple[Size, ...] | None]:
        """unify_params for sizes that may be symbolic: bare names bind, a dimension affine
        in one unknown (`C * r * r`) is solved, every other dimension must be equal."""
        op = self.op
        dims: dict[str, Size] = {}
        dvars: dict[str, DType] = {}
        ell: tuple[Size, ...] | None = None

        def known(n: str, loc: Loc) -> CTValue:
            if n in self.cvals:
                return self.cvals[n]
            if n in dims:
                return dims[n]
            raise Unbound(n)

        pending: list[tuple[int, int, ast.Expr]] = []
        for i, (p, shape, dt) in enumerate(zip(op.params, shapes, dtypes, strict=True)):
            want = p.type.dtype
            if is_dtype_var(want):
                if dvars.setdefault(want, dt) != dt:
                    raise OpError(f"{self.describe()}: argument '{p.name}' has dtype {dt} but "
                                  f"{want} = {dvars[want]}")
            elif DTYPES[want] != dt:
                raise OpError(f"{self.describe()}: argument '{p.name}' has dtype {dt} but "
                              f"the signature says {want}")
            exprs = p.type.dims[1:] if leading(p.type) else p.type.dims
            if leading(p.type):
                if len(shape) < len(exprs):
                    raise OpError(f"{self.describe()}: argument '{p.name}' has rank "
                                  f"{len(shape)}, expected {len(exprs)} or more")
                lead = tuple(shape[:len(shape) - len(exprs)])
                if ell is None:
                    ell = lead
                elif len(lead) != len(ell) or any(a != b for a, b in zip(lead, ell,
                                                                          strict=True)):
                    raise OpError(f"{self.describe()}: the leading dimensions of "
                                  f"'{p.name}' differ from those '...' was bound to")
            elif len(exprs) != len(shape):
                raise OpError(f"{self.describe()}: argument '{p.name}' has rank {len(shape)}, "
                              f"expected {len(exprs)}")
            off = len(shape) - len(exprs)
            pending += [(i, d + off, e) for d, e in enumerate(exprs)]
        while pending:
            progress = False
            for item in list(pending):
                i, d, e = item
                actual = shapes[i][d]
                try:
                    value = eval_ct(e, known)
                except Unbound:
                    unknown = [n for n in names_in(e) if n not in self.cvals and n not in dims]
                    if len(unknown) != 1:
                        continue
                    dims[unknown[0]] = actual if isinstance(e, ast.Name) else \
                        _solve(e, actual, known, unknown[0])
                    value = eval_ct(e, known)
                pending.remove(item)
                progress = True
                if value != actual:
                    raise OpError(f"{self.describe()}: dimension {d} of argument "
                                  f"'{op.params[i].name}' does not fit the signature")
            if not progress:
                break
        if pending:
            raise OpError(f"{self.describe()}: cannot infer the sizes of argument "
                          f"'{op.params[pending[0][0]].name}' symbolically")
        return dims, dvars, ell


def _solve(e: ast.Expr, actual: Size, known: Callable[[str, Loc], CTValue], var: str) -> Size:
    """`var` with `e == actual` for `e` affine in `var` (checked by the caller)."""
    def at(v: int) -> Any:
        return eval_ct(e, lambda n, loc: v if n == var else known(n, loc))
    f0 = at(0)
    return (actual - f0) // (at(1) - f0)


def _first_line(err: CompileError) -> str:
    d = err.diagnostics[0]
    return d.message + "".join(f"; {n.message}" for n in d.notes)


# ---------------------------------------------------------------------------------------------
# the vector-Jacobian product


def vjp_func(func: Func, wrt: Sequence[int], name: str | None = None) -> Func:
    """`(args..., dy for each float result) -> (dx for args[i], i in wrt)`: the gradient of
    `sum_j <y_j, dy_j>` (module doc). `func` is left unchanged."""
    from nfc.passes.autodiff.graph import reverse_mode
    from nfc.rewrite import Rewriter

    f = func.clone(name or f"{func.name}_vjp")
    outs = [v for v in f.ret.values if v.dtype.is_float]
    if not outs:
        raise OpError(f"{func.name} has no float result to differentiate")
    grads = [Value(o.type, f"d_out{k}") for k, o in enumerate(outs)]
    f.args += grads
    f.arg_attrs += [{"nf.role": "input"} for _ in grads]
    ops: list[ComputeOp] = []
    for k, (o, g) in enumerate(zip(outs, grads, strict=True)):
        axes = tuple(Axis(f"i{j}", n) for j, n in enumerate(o.shape))
        idx = tuple(Index(a.name) for a in axes)
        ops.append(ComputeOp(TensorType((), o.dtype), (), Binary("*", Load(o, idx),
                                                                 Load(g, idx)),
                             reduce="sum" if axes else None, raxes=axes, name=f"vjp{k}"))
    if len(ops) > 1:
        total = Load(ops[0].result, ())
        for c in ops[1:]:
            total = Binary("+", total, Load(c.result, ()))
        ops.append(ComputeOp(TensorType((), outs[0].dtype), (), total, name="vjp"))
    rewriter = Rewriter()
    rewriter.insert_op_before(ops, f.ret)
    back, dxs = reverse_mode(f, ops[-1].result, [f.args[i] for i in wrt])
    rewriter.insert_op_before(back, f.ret)
    rewriter.update(f.ret, values=dxs)
    f.attrs["nf.results"] = [f"d_{f.args[i].name}" for i in wrt]
    return f


# ---------------------------------------------------------------------------------------------
# the op


class NativeOp:
    """An op of a `.nf` file, compiled per argument types on first use (module doc)."""

    def __init__(self, source: str | Path, name: str, params: Mapping[str, Any] | None = None,
                 *, search_paths: Sequence[str] | None = None, tuning: bool = True,
                 fuse: bool = True, use_cache: bool = True) -> None:
        self.path, op = _read_op(source, name, search_paths)
        self.name = name
        self.params = dict(params or {})
        self.signature = OpSignature(op, _resolve_params(op, self.params))
        self.search_paths = list(search_paths or [])
        self.tuning = tuning
        self.fuse = fuse
        self.use_cache = use_cache
        self._functions: dict[tuple[Any, ...], Any] = {}
        self._build_lock = threading.Lock()
        self._call_locks: dict[int, threading.Lock] = {}
        self.builds = 0
        """Libraries built or taken from the disk cache by this object (each once)."""
        self.threads: int | None = None
        """Team size of the parallel loops (None: libgomp's default, OMP_NUM_THREADS)."""

    def __repr__(self) -> str:
        params = "".join(f", {k}={v!r}" for k, v in self.params.items())
        return f"<nfc op {self.signature.describe()} from '{self.path}'{params}>"

    def set_num_threads(self, n: int) -> None:
        """Threads for the parallel loops of every function of this op, loaded or to come
        (libgomp's team size, set for the calling thread)."""
        self.threads = int(n)
        for fn in self._functions.values():
            fn.model.set_num_threads(self.threads)

    # -- types and arrays

    def check_arrays(self, arrays: Sequence[Any], *, copy: bool = False,
                     names: Sequence[str] | None = None) -> list[np.ndarray]:
        """The arguments as C-contiguous numpy arrays sharing their memory (DLPack), or an
        OpError naming the first that is not (with `copy`, such ones are copied)."""
        names = list(names or self.signature.inputs)
        out = []
        for arr, n in zip(arrays, names, strict=True):
            a = as_array(arr, f"{self.name}: argument '{n}'")
            dtype_of(a, f"{self.name}: argument '{n}'")
            if not a.flags.c_contiguous:
                if not copy:
                    raise OpError(f"{self.name}: argument '{n}' is not C-contiguous (strides "
                                  f"{list(a.strides)} bytes for shape {list(a.shape)}); pass a "
                                  f"contiguous array (`.contiguous()` in torch) or load the op "
                                  f"with copy=True")
                a = np.ascontiguousarray(a)
            out.append(a)
        return out

    def types_of(self, arrays: Sequence[np.ndarray]) -> tuple[TensorType, ...]:
        """The IR types of the arguments, checked against the signature."""
        if len(arrays) != len(self.signature.inputs):
            raise OpError(f"{self.name} takes {len(self.signature.inputs)} arguments "
                          f"({', '.join(self.signature.inputs)}), got {len(arrays)}")
        types = tuple(TensorType(tuple(int(d) for d in a.shape),
                                 dtype_of(a, f"{self.name}: argument '{n}'"))
                      for a, n in zip(arrays, self.signature.inputs, strict=True))
        self.signature.result_types([t.shape for t in types], [t.dtype for t in types])
        return types

    # -- compiled functions

    def forward_function(self, types: tuple[TensorType, ...]) -> Any:
        """The loaded native function computing the op for arguments of `types`."""
        return self._function(types, None)

    def backward_function(self, types: tuple[TensorType, ...], wrt: tuple[int, ...]) -> Any:
        """The loaded native vector-Jacobian product w.r.t. the inputs `wrt`."""
        bad = [self.signature.inputs[i] for i in wrt if not types[i].dtype.is_float]
        if bad:
            raise OpError(f"{self.name}: cannot differentiate w.r.t. the non-float "
                          f"argument(s) {', '.join(bad)}")
        return self._function(types, tuple(wrt))

    def _function(self, types: tuple[TensorType, ...], wrt: tuple[int, ...] | None) -> Any:
        key = (types, wrt)
        fn = self._functions.get(key)
        if fn is None:
            with self._build_lock:
                fn = self._functions.get(key)
                if fn is None:
                    fn = self._build(types, wrt)
                    self._call_locks[id(fn)] = threading.Lock()
                    self._functions[key] = fn
        return fn

    def compile_module(self, types: tuple[TensorType, ...], wrt: tuple[int, ...] | None) -> Any:
        """The IR module of the forward (`wrt` None) or of the vjp, through the pipeline."""
        from nfc.frontend import compile_op
        from nfc.ir import Module
        from nfc.passes.im2col import im2col_func
        from nfc.runtime.build import DEFAULT_PIPELINE, FUSE_PIPELINE, apply_tuning, run_pipeline

        try:
            module = compile_op(self.path, self.name, list(types), self.signature.cvals,
                                search_paths=self.search_paths)
        except CompileError as err:
            raise OpError(f"cannot compile {self.name} for argument types "
                          f"{', '.join(map(format_tensor_type, types))}:\n{err}") from None
        func = module.funcs[0]
        im2col_func(func)  # before autodiff, as nfc compile does: gradients become GEMMs too
        if wrt is not None:
            try:
                func = vjp_func(func, wrt)
            except CompileError as err:
                raise OpError(f"cannot differentiate {self.name}:\n{err}") from None
        module = Module(module.name, [func])
        run_pipeline(module, DEFAULT_PIPELINE)
        if self.tuning:
            apply_tuning(module)
        if self.fuse:
            run_pipeline(module, FUSE_PIPELINE)
        return module

    def _build(self, types: tuple[TensorType, ...], wrt: tuple[int, ...] | None) -> Any:
        from nfc.runtime.build import build_library
        from nfc.runtime.loader import load

        module = self.compile_module(types, wrt)
        built = build_library(module, use_cache=self.use_cache)
        self.builds += 1
        model = load(built.path)
        if self.threads is not None:
            model.set_num_threads(self.threads)
        return model.functions[module.funcs[0].name]

    # -- calls

    def run(self, fn: Any, arrays: Sequence[np.ndarray],
            out: Sequence[np.ndarray] | None) -> list[np.ndarray]:
        """Call the native `fn` on checked arrays; results into `out` when given."""
        outs = None
        if out is not None:
            outs = {spec.name: o for spec, o in zip(fn.outputs, out, strict=True)}
        with self._call_locks[id(fn)]:  # a Function's argument table is shared per call
            res = fn(*arrays, out=outs)
        return [res[spec.name] for spec in fn.outputs]

    def __call__(self, *arrays: Any, out: Sequence[Any] | None = None,
                 copy: bool = False) -> list[np.ndarray]:
        """The op's results for these arguments (numpy or any DLPack array), as numpy arrays
        (the `out` arrays, taken by DLPack, when given)."""
        args = self.check_arrays(arrays, copy=copy)
        fn = self.forward_function(self.types_of(args))
        return self.run(fn, args, None if out is None else
                        [as_array(o, f"{self.name}: out") for o in out])

    def vjp(self, arrays: Sequence[Any], grads: Sequence[Any], wrt: Sequence[int], *,
            out: Sequence[Any] | None = None, copy: bool = False) -> list[np.ndarray]:
        """Gradients w.r.t. the inputs `wrt` given the upstream gradients `grads` (one per
        float result, with the result's shape and dtype)."""
        args = self.check_arrays(arrays, copy=copy)
        types = self.types_of(args)
        res = self.signature.result_types([t.shape for t in types], [t.dtype for t in types])
        floats = [(s, dt) for s, dt in res if dt.is_float]
        names = [f"d_{n}" for n, (_, dt) in zip(self.signature.outputs, res, strict=True)
                 if dt.is_float]
        if len(grads) != len(floats):
            raise OpError(f"{self.name}: vjp takes {len(floats)} upstream gradient(s), got "
                          f"{len(grads)}")
        gs = self.check_arrays(grads, copy=copy, names=names)
        for g, n, (shape, dt) in zip(gs, names, floats, strict=True):
            if tuple(g.shape) != tuple(shape) or dtype_of(g, n) != dt:
                raise OpError(f"{self.name}: upstream gradient '{n}' must be "
                              f"{dt}{list(shape)}, got {g.dtype.name}{list(g.shape)}")
        fn = self.backward_function(types, tuple(wrt))
        return self.run(fn, [*args, *gs], None if out is None else
                        [as_array(o, f"{self.name}: out") for o in out])
