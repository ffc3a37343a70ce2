"""`nfc.load(path)`: open a compiled model (`nfc compile model.nf -o model.so`) with ctypes.

The file is checked before any of its code runs: its trailer (nfc.codegen.artifact.container)
must be intact and its SHA-256 must match, so a truncated, damaged or foreign file is a clear
`ArtifactError` instead of SIGBUS or a constructor run from a stranger's library. The
metadata then gives the ABI version (it and the exported `nfc_abi_version()` must both equal
`ABI_VERSION`) and the CPU features the library was compiled for (every one must be present on
this host; a library built for AVX-512 would otherwise die of SIGILL). Only then is the library
mapped, from a private copy of the very bytes that were checked (`read_metadata` alone maps
nothing), after libgomp, which it links, has been loaded with nfc's wait policy (idle threads
back off to sleeping: nfc.codegen.jit._libgomp).

A `Model` owns the model's persistent tensors (parameters, state, optimizer state) as
64-byte-aligned numpy arrays; the native entries read and update them in place, zero-copy:

    m = nfc.load("mlp.so")
    m.init(seed=0)                                   # native, seeded (see initgen)
    out = m.train_step(x=xb, y=yb)                   # one native call: the whole step
    out["loss"], m.tensors["w1"]                     # results; w1 updated in place
    m.eval(x=xb, y=yb)["logits"]

Inputs are taken as they are when they already have the right dtype, shape and layout (no
copy), converted otherwise. Any array with `__dlpack__` (torch CPU tensors, JAX CPU arrays)
is taken through DLPack, sharing its memory; so are the `out` arrays, which lets results land
in memory another framework owns. Results are numpy arrays, themselves DLPack-capable
(`torch.from_dlpack(res["y"])` copies nothing). An `rng` argument defaults to `(seed, step)`
where `step` counts the calls of functions that update tensors in place.
"""

from __future__ import annotations

import ctypes
import itertools
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from nfc.blocked import is_blocked, pack, unpack

if TYPE_CHECKING:
    from nfc.codegen.artifact.container import Sealed

#: The ABI this loader speaks (nfc.codegen.artifact.assemble.ABI_VERSION).
ABI_VERSION = 1
ALIGN = 64

_DTYPES = {"f16": np.float16, "f32": np.float32, "f64": np.float64, "i1": np.bool_,
           "i32": np.int32, "i64": np.int64}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype of an IR dtype name in a library's memory: bf16 is `ml_dtypes.bfloat16`
    (2 bytes, as the kernels store it; the package comes with JAX), an ArtifactError without
    it."""
    if name == "bf16":
        try:
            import ml_dtypes
        except ImportError:
            raise ArtifactError("the model has bf16 tensors, which need the ml_dtypes "
                                "package (pip install ml_dtypes)") from None
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(_DTYPES[name])


class ArtifactError(Exception):
    """A library that cannot be used here: not an nfc artifact, another ABI, missing CPU
    features, or a call with wrong arguments."""


def aligned_empty(shape: tuple[int, ...], dtype: Any, align: int = ALIGN) -> np.ndarray:
    """An uninitialised C-contiguous array whose data starts at a multiple of `align`."""
    dt = np.dtype(dtype)
    n = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
    raw = np.empty(n + align, np.uint8)
    start = (-raw.ctypes.data) % align
    return raw[start:start + n].view(dt).reshape(shape)


def aligned_zeros(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """Like `aligned_empty`, filled with zeros."""
    a = aligned_empty(shape, dtype)
    a.fill(0)
    return a


def as_array(value: Any, what: str = "argument") -> np.ndarray:
    """`value` as a numpy array sharing its memory where it can: a numpy array as it is, any
    other array with `__dlpack__` (torch, JAX, ... on the CPU) through DLPack without a copy,
    anything else through `np.asarray`."""
    if isinstance(value, np.ndarray):
        return value
    if hasattr(value, "__dlpack__"):
        try:
            return np.from_dlpack(value)
        except (BufferError, RuntimeError, TypeError, ValueError) as exc:
            # a GPU array, a torch tensor that requires grad (detach it), ...
            raise ArtifactError(f"{what}: cannot take a {type(value).__name__} through "
                                f"DLPack: {exc}") from None
    return np.asarray(value)


def host_cpu_features() -> set[str]:
    """The CPU features LLVM reports for this host (`avx2`, `avx512f`, ...)."""
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    on: dict[str, bool] = {}
    for item in llvm.get_host_cpu_features().flatten().split(","):
        if item[:1] in "+-" and len(item) > 1:
            on[item[1:]] = item[0] == "+"
    return {f for f, v in on.items() if v}


@dataclass(frozen=True)
class TensorSpec:
    """A tensor described by the metadata."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    role: str = ""

    @staticmethod
    def of(d: Mapping[str, Any]) -> TensorSpec:
        """From a metadata entry."""
        return TensorSpec(str(d["name"]), tuple(int(x) for x in d["shape"]),
                          numpy_dtype(d["dtype"]), str(d.get("role", "")))


_copies = itertools.count()


def _open_library(path: str, elf: bytes) -> ctypes.CDLL:
    """dlopen the checked library bytes `elf` of `path` from a private copy.

    Mapping a copy means what runs is what was checked, whatever happens to `path` later (a
    rewrite in place, a truncation). The copy's name is new for every load in this process
    (its counter): dlopen hands back an already loaded library of the same name, and the
    mapping keeps the unlinked copy's inode, so its number is not reused either."""
    fd, copy = tempfile.mkstemp(prefix=f"nfc-{os.getpid()}-{next(_copies)}-", suffix=".so")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(elf)
        return ctypes.CDLL(copy, mode=ctypes.RTLD_LOCAL)
    except OSError as exc:
        raise ArtifactError(f"cannot load '{path}': {exc}") from None
    finally:
        os.unlink(copy)


def _sealed(path: str) -> Sealed:
    """The checked content of the artifact file `path` (nfc.codegen.artifact.container)."""
    from nfc.codegen.artifact.container import ArtifactFileError, read_artifact

    if not os.path.exists(path):
        raise ArtifactError(f"no such file: '{path}'")
    if os.path.isdir(path):
        raise ArtifactError(f"'{path}' is a directory, not an nfc artifact")
    try:
        return read_artifact(path)
    except ArtifactFileError as exc:
        raise ArtifactError(str(exc)) from None
    except OSError as exc:
        raise ArtifactError(f"cannot read '{path}': {exc.strerror or exc}") from None


def check_metadata(meta: Mapping[str, Any], path: str) -> None:
    """Raise ArtifactError unless the metadata has this loader's ABI version and the fields
    it needs."""
    if meta.get("abi_version") != ABI_VERSION:
        raise ArtifactError(f"'{path}' metadata says ABI version {meta.get('abi_version')} but "
                            f"this nfc loads version {ABI_VERSION}; recompile it")
    missing = [k for k in ("functions", "tensors", "target") if k not in meta]
    if missing:
        raise ArtifactError(f"'{path}' has incomplete metadata (no {', '.join(missing)})")


def read_metadata(path: str | os.PathLike[str]) -> dict[str, Any]:
    """The checked metadata of the artifact at `path`, without loading the library (nothing
    of it runs): for `nfc run --info` and `nfc compile --emit=header`."""
    p = os.fspath(path)
    meta = _sealed(p).metadata
    check_metadata(meta, p)
    return meta


def _check_abi(lib: ctypes.CDLL, path: str) -> None:
    """The library's own `nfc_abi_version()` must agree with its metadata."""
    try:
        abi = lib.nfc_abi_version
    except AttributeError:
        raise ArtifactError(f"'{path}' is not an nfc artifact (no nfc_abi_version)") from None
    abi.restype = ctypes.c_int32
    version = int(abi())
    if version != ABI_VERSION:
        raise ArtifactError(f"'{path}' has ABI version {version} but this nfc loads version "
                            f"{ABI_VERSION}; recompile it with `nfc compile`")


def check_cpu(meta: Mapping[str, Any], path: str, host: set[str] | None = None) -> None:
    """Raise ArtifactError when the library needs CPU features this host lacks."""
    need = set(meta.get("target", {}).get("features", []))
    have = host_cpu_features() if host is None else host
    missing = sorted(need - have)
    if missing:
        cpu = meta.get("target", {}).get("cpu", "?")
        raise ArtifactError(
            f"'{path}' was compiled for a CPU ({cpu}) with features this host lacks: "
            f"{', '.join(missing)}; recompile it here with `nfc compile`")


_Entry = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p)


class Function:
    """One native entry (`nfc_<name>`) of a model, callable on numpy arrays."""

    def __init__(self, model: Model, name: str, meta: Mapping[str, Any]) -> None:
        self.model = model
        self.name = name
        self.meta = meta
        self.args = [TensorSpec.of(a) for a in meta["args"]]
        self.results = meta["results"]
        self.outputs = [TensorSpec.of(r) for r in self.results if r.get("out") is not None]
        self.updates_in_place = any(r.get("inplace") for r in self.results)
        self.inputs = [a for a in self.args if a.role not in ("param", "state", "opt_state",
                                                              "rng")]
        self._fn = _Entry(ctypes.cast(model.symbol(meta["symbol"]), ctypes.c_void_p).value)
        nbytes = max(int(meta["arena_bytes"]), 1)
        try:
            self.arena = aligned_empty((nbytes,), np.uint8)
        except MemoryError:
            raise ArtifactError(f"'{model.path}': {name} needs an arena of {nbytes:,} bytes, "
                                "more memory than this process can allocate") from None
        self._argv = (ctypes.c_void_p * max(1, len(self.args)))()
        self._outv = (ctypes.c_void_p * max(1, len(self.outputs)))()
        self._argv_addr = ctypes.addressof(self._argv)
        self._outv_addr = ctypes.addressof(self._outv)
        self._arena_addr = self.arena.ctypes.data
        self._slots: dict[str, int] = {}
        for i, a in enumerate(self.args):
            if a.role in ("param", "state", "opt_state"):
                arr = model.tensors[a.name]
                self._argv[i] = arr.ctypes.data
            else:
                self._slots[a.name] = i
        self._rng = aligned_zeros((2,), np.int64)
        self._keep: list[np.ndarray] = []
        self._profile = None
        if model.metadata.get("profile"):
            prof = model.symbol(f"nfc_{name}_profile", restype=ctypes.POINTER(ctypes.c_int64))
            n = max(1, 2 * len(meta["kernels"]))
            self._profile = np.ctypeslib.as_array(prof(), shape=(n,))

    def __repr__(self) -> str:
        ins = ", ".join(f"{a.name}: {a.dtype}{list(a.shape)}" for a in self.inputs)
        outs = ", ".join(o.name for o in self.outputs)
        return f"<nfc function {self.name}({ins}) -> ({outs})>"

    def _input(self, spec: TensorSpec, value: Any) -> np.ndarray:
        arr = as_array(value, f"{self.name}: input '{spec.name}'")
        if arr.shape != spec.shape:
            raise ArtifactError(f"{self.name}: input '{spec.name}' must have shape "
                                f"{list(spec.shape)}, got {list(arr.shape)}")
        if arr.dtype != spec.dtype or not arr.flags.c_contiguous:
            arr = np.ascontiguousarray(arr, dtype=spec.dtype)
        return arr

    def __call__(self, *args: Any, rng: Any = None, out: Mapping[str, Any] | None = None,
                 **kwargs: Any) -> dict[str, np.ndarray]:
        """Run the entry on inputs (positional in order, or by name; numpy or any DLPack
        array); returns the results that are not updated in place, by name (`out` may supply
        their arrays, numpy or DLPack)."""
        if len(args) > len(self.inputs):
            raise ArtifactError(f"{self.name} takes {len(self.inputs)} inputs "
                                f"({', '.join(a.name for a in self.inputs)}), got {len(args)}")
        given = dict(zip((a.name for a in self.inputs), args, strict=False))
        for k, v in kwargs.items():
            if k in given:
                raise ArtifactError(f"{self.name}: input '{k}' given twice")
            given[k] = v
        keep = []
        for spec in self.inputs:
            if spec.name not in given:
                raise ArtifactError(f"{self.name}: missing input '{spec.name}'")
            arr = self._input(spec, given.pop(spec.name))
            keep.append(arr)
            self._argv[self._slots[spec.name]] = arr.ctypes.data
        if given:
            raise ArtifactError(f"{self.name}: unknown input(s) {', '.join(sorted(given))}")
        for spec in self.args:
            if spec.role == "rng":
                r = self._rng
                if rng is None:
                    r[0], r[1] = self.model.seed, self.model.step
                else:
                    r[:] = np.asarray(rng, dtype=np.int64).reshape(2)
                self._argv[self._slots[spec.name]] = r.ctypes.data
        results: dict[str, np.ndarray] = {}
        for j, spec in enumerate(self.outputs):
            arr = out.get(spec.name) if out else None
            if arr is not None:
                arr = as_array(arr, f"{self.name}: out['{spec.name}']")
            if arr is None:
                arr = np.empty(spec.shape, spec.dtype)
            elif (arr.shape != spec.shape or arr.dtype != spec.dtype
                  or not arr.flags.c_contiguous or not arr.flags.writeable):
                raise ArtifactError(f"{self.name}: out['{spec.name}'] must be a writable "
                                    f"C-contiguous {spec.dtype}{list(spec.shape)} array")
            self._outv[j] = arr.ctypes.data
            results[spec.name] = arr
        self._fn(self._argv_addr, self._outv_addr, self._arena_addr)
        if self.updates_in_place:
            self.model.step += 1
        return results

    def bind(self, inputs: Mapping[str, np.ndarray] | None = None) -> Bound:
        """A call with fixed buffers: fill `bound.inputs[...]` (e.g. `np.take(..., out=)`),
        set `bound.rng`, call `bound()`; results land in `bound.outputs`. Costs one ctypes
        call (about a microsecond), for loops where `__call__`'s argument handling shows."""
        return Bound(self, inputs)

    def profile_events(self) -> np.ndarray:
        """(kernels, 2) start and end times in ns of each kernel in the latest call (profiled
        builds only)."""
        if self._profile is None:
            raise ArtifactError(f"'{self.model.path}' was not compiled with profiling "
                                "(nfc compile --profile)")
        return self._profile.reshape(-1, 2).copy()


class Bound:
    """A `Function` bound to its own input, output and rng buffers (see `Function.bind`)."""

    def __init__(self, fn: Function, inputs: Mapping[str, np.ndarray] | None = None) -> None:
        self.fn = fn
        given = dict(inputs or {})
        self.inputs: dict[str, np.ndarray] = {}
        for spec in fn.inputs:
            arr = given.pop(spec.name, None)
            if arr is None:
                arr = aligned_zeros(spec.shape, spec.dtype)
            elif (arr.shape != spec.shape or arr.dtype != spec.dtype
                  or not arr.flags.c_contiguous):
                raise ArtifactError(f"{fn.name}: bound input '{spec.name}' must be a "
                                    f"C-contiguous {spec.dtype}{list(spec.shape)} array")
            self.inputs[spec.name] = arr
        if given:
            raise ArtifactError(f"{fn.name}: unknown input(s) {', '.join(sorted(given))}")
        self.outputs = {spec.name: aligned_empty(spec.shape, spec.dtype) for spec in fn.outputs}
        self.rng = aligned_zeros((2,), np.int64)
        self._argv = (ctypes.c_void_p * max(1, len(fn.args)))(*fn._argv)
        for spec in fn.args:
            slot = fn._slots.get(spec.name)
            if slot is None:
                continue
            arr = self.rng if spec.role == "rng" else self.inputs[spec.name]
            self._argv[slot] = arr.ctypes.data
        self._outv = (ctypes.c_void_p * max(1, len(fn.outputs)))(
            *[a.ctypes.data for a in self.outputs.values()])
        self._args = (ctypes.addressof(self._argv), ctypes.addressof(self._outv),
                      fn._arena_addr)

    def share_arena(self, other: Function) -> None:
        """Run on `other`'s arena instead of this function's own (the same memory plan, e.g. a
        profiled build of the same kernels; the two must never run at the same time)."""
        if other.meta["arena_bytes"] < self.fn.meta["arena_bytes"]:
            raise ArtifactError(f"{self.fn.name}: the arena of '{other.model.path}' is smaller "
                                "than this function's")
        self._args = (*self._args[:2], other._arena_addr)

    def __call__(self) -> dict[str, np.ndarray]:
        """Run the step on the bound buffers; returns `outputs` (overwritten next call)."""
        self.fn._fn(*self._args)
        if self.fn.updates_in_place:
            self.fn.model.step += 1
        return self.outputs


class Model:
    """A loaded artifact: its functions, metadata and the persistent tensors it owns."""

    def __init__(self, path: str, lib: ctypes.CDLL, meta: dict[str, Any]) -> None:
        self.path = path
        self.lib = lib
        self.metadata = meta
        self.seed = 0
        self.step = 0
        self.specs = {t["name"]: TensorSpec.of(t) for t in meta["tensors"]}
        self.tensors: dict[str, np.ndarray] = {
            name: aligned_zeros(s.shape, s.dtype) for name, s in self.specs.items()}
        self.functions = {name: Function(self, name, fm)
                          for name, fm in meta["functions"].items()}

    def symbol(self, name: str, restype: Any = None) -> Any:
        """An exported symbol of the library (a ctypes function)."""
        try:
            fn = getattr(self.lib, name)
        except AttributeError:
            raise ArtifactError(f"'{self.path}' does not export {name}") from None
        fn.restype = restype
        return fn

    def __getattr__(self, name: str) -> Function:
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or function '{name}' "
                             f"(functions: {', '.join(functions)})")

    def role(self, role: str) -> dict[str, np.ndarray]:
        """The persistent tensors with `role` ("param", "state", "opt_state"), by name."""
        return {n: a for n, a in self.tensors.items() if self.specs[n].role == role}

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The parameters (arrays owned by the model, updated in place by training)."""
        return self.role("param")

    def init(self, seed: int = 0) -> None:
        """Fill every persistent tensor from its initializer (native `nfc_init`); resets the
        step counter and sets the seed of the rng argument."""
        fn = self.symbol("nfc_init")
        fn.argtypes = [ctypes.c_void_p, ctypes.c_int64]
        table = (ctypes.c_void_p * max(1, len(self.tensors)))(
            *[a.ctypes.data for a in self.tensors.values()])
        fn(table, ctypes.c_int64(int(seed) & 0xFFFFFFFF))
        self.seed = int(seed)
        self.step = 0

    def set_num_threads(self, n: int) -> None:
        """Threads used by the parallel loops of every kernel (libgomp's team size)."""
        fn = self.symbol("nfc_set_num_threads")
        fn.argtypes = [ctypes.c_int32]
        fn(int(n))

    def get_num_threads(self) -> int:
        """Threads the parallel loops use."""
        return int(self.symbol("nfc_get_num_threads", restype=ctypes.c_int32)())

    def named_tensors(self) -> dict[str, np.ndarray]:
        """The persistent tensors by the names an unfused build gives them: `tensors`, except
        that a tensor laid out by `parallel-fusion{layout=true}` (metadata `views`) appears
        as its parts, each a (strided) numpy view of the buffer, so writes go into it. A
        tensor stored blocked by the `layout` pass (a view with `kind = "blocked"`) appears
        by its own name in its logical shape, as a read-only unpacked copy (use
        `load_state_dict` to write it). The same as `tensors` for a build without layout."""
        views = self.metadata.get("views") or []
        if not views:
            return dict(self.tensors)
        by_parent: dict[str, list[Mapping[str, Any]]] = {}
        for v in views:
            by_parent.setdefault(str(v["parent"]), []).append(v)
        out: dict[str, np.ndarray] = {}
        for name, arr in self.tensors.items():
            if name not in by_parent:
                out[name] = arr
                continue
            for v in by_parent[name]:
                if is_blocked(v):  # stored blocked (the layout pass): a read-only copy
                    a = unpack(arr, v)
                    a.flags.writeable = False
                    out[str(v["name"])] = a
                    continue
                axis, off, shape = int(v["axis"]), int(v["offset"]), tuple(v["shape"])
                sl = tuple(slice(off, off + shape[axis]) if k == axis else slice(None)
                           for k in range(arr.ndim))
                out[str(v["name"])] = arr[sl]
        return out

    def named_specs(self) -> dict[str, TensorSpec]:
        """`specs` of the persistent tensors by the names of `named_tensors`."""
        specs = {n: s for n, s in self.specs.items() if n in self.tensors}
        out: dict[str, TensorSpec] = {}
        for name, arr in self.named_tensors().items():
            s = specs.get(name)
            if s is not None and tuple(s.shape) != tuple(arr.shape):  # stored blocked
                s = TensorSpec(name, tuple(arr.shape), arr.dtype, s.role)
            elif s is None:
                parent = next(str(v["parent"]) for v in self.metadata["views"]
                              if v["name"] == name)
                s = TensorSpec(name, tuple(arr.shape), arr.dtype, specs[parent].role)
            out[name] = s
        return out

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the persistent tensors, by name (a laid-out tensor by its parts' names,
        `named_tensors`, so a state moves between builds with and without the layout)."""
        return {n: a.copy() for n, a in self.named_tensors().items()}

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Copy arrays into the persistent tensors (in place: bound pointers stay valid), by
        the names of `named_tensors` (a laid-out tensor's parts; its own name works too)."""
        targets = self.named_tensors()
        if set(self.tensors) <= set(arrays) and not set(targets) <= set(arrays):
            targets = self.tensors
        missing = sorted(set(targets) - set(arrays))
        if missing:
            raise ArtifactError(f"state is missing tensor(s) {', '.join(missing)}")
        blocked = {str(v["name"]): v for v in self.metadata.get("views") or []
                   if is_blocked(v)}
        for name, dst in targets.items():
            src = np.asarray(arrays[name])
            if name in blocked:  # stored blocked: the logical form packed, or the buffer's
                dst = self.tensors[name]
                if src.shape == tuple(blocked[name]["shape"]) != dst.shape:
                    src = pack(src, blocked[name])
            if src.shape != dst.shape or src.dtype != dst.dtype:
                raise ArtifactError(f"tensor '{name}' must be {dst.dtype}{list(dst.shape)}, "
                                    f"got {src.dtype}{list(src.shape)}")
            np.copyto(dst, src)


def load(path: str | os.PathLike[str], *, check_cpu_features: bool = True) -> Model:
    """Open the artifact at `path` (see the module doc); a CUDA artifact (`nfc compile
    --target cuda`) opens as a `nfc.runtime.cuda_model.CudaModel` with the same API, on the
    GPU (or the simulator with NFC_CUDA_SIMULATE=1; nfc.runtime.cuda_load)."""
    p = os.fspath(path)
    sealed = _sealed(p)
    meta = sealed.metadata
    check_metadata(meta, p)
    if sealed.kind == "cuda":  # a CUDA artifact: a CudaModel (nfc.runtime.cuda_load)
        from nfc.runtime.cuda_load import load_cuda

        return load_cuda(p, sealed)  # type: ignore[no-any-return]
    if check_cpu_features:
        check_cpu(meta, p)
    # libgomp (which the library links) first, so that its idle threads back off to sleeping
    # rather than spin (nfc.codegen.jit._libgomp): it reads its wait policy once, when loaded
    from nfc.codegen.jit import load_openmp

    load_openmp()
    lib = _open_library(p, sealed.elf)
    _check_abi(lib, p)
    return Model(p, lib, meta)
