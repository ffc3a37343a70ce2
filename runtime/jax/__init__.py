"""`nfc.jax`: an op of a `.nf` file as a JAX function, forward and backward compiled by nfc.

    import nfc.jax
    lltm = nfc.jax.load_op("examples/models/lltm.nf", "lltm_cell")
    h, c = lltm(x, h, c, w, b)                       # jit-able: jax.pure_callback
    jax.grad(lambda w: lltm(x, h, c, w, b)[0].sum())(w)   # custom_vjp: nfc's backward

The op runs on the host through `jax.pure_callback` (result shapes from the `.nf` signature,
so `jax.jit` traces it), and `jax.custom_vjp` gives it nfc's derived backward
(nfc.runtime.native_op: the vector-Jacobian product compiled per argument types). Under
`jax.vmap` the callback runs once per batch element (`vmap_method="sequential"`). Arrays
reach the native code as numpy views of what the callback receives (copied only when not
C-contiguous). float16 and bfloat16 arrays are taken like the others where the op's
signature admits them (computed in f32, stored in 16 bits: docs/codegen.md, "16-bit
floats"), and so are their cotangents. JAX is imported here and nowhere else in nfc;
docs/torch.md describes the shared machinery.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

try:
    import jax
    import jax.numpy as jnp
except ImportError as exc:  # pragma: no cover - the test suite skips without jax
    raise ImportError("nfc.jax needs JAX: pip install 'nfc[jax]'") from exc

import numpy as np

from nfc.runtime.native_op import NUMPY_DTYPES, NativeOp, OpError, dtype_of

__all__ = ["load_op", "JaxOp", "OpError"]

_TO_NUMPY = {v: k for k, v in NUMPY_DTYPES.items()}


class JaxOp:
    """A loaded op, callable on JAX arrays (module doc); `.native` holds the compiled
    functions."""

    def __init__(self, native: NativeOp) -> None:
        self.native = native
        self.single = len(native.signature.outputs) == 1

        @jax.custom_vjp
        def call(*args: Any) -> Any:
            return self._forward(*args)

        def fwd(*args: Any) -> tuple[Any, tuple[Any, ...]]:
            return self._forward(*args), args

        def bwd(args: tuple[Any, ...], cts: Any) -> tuple[Any, ...]:
            return self._backward(args, cts if isinstance(cts, tuple) else (cts,))

        call.defvjp(fwd, bwd)
        self._call = call

    def __repr__(self) -> str:
        return f"<nfc.jax op {self.native.signature.describe()}>"

    def __call__(self, *args: Any) -> Any:
        """The op's result (a tuple for several)."""
        sig = self.native.signature
        if len(args) != len(sig.inputs):
            raise OpError(f"{self.native.name} takes {len(sig.inputs)} arrays "
                          f"({', '.join(sig.inputs)}), got {len(args)}")
        return self._call(*(jnp.asarray(a) for a in args))

    def _results(self, args: Sequence[Any]) -> list[jax.ShapeDtypeStruct]:
        dts = [dtype_of(np.empty(0, a.dtype), f"{self.native.name}: argument '{n}'")
               for a, n in zip(args, self.native.signature.inputs, strict=True)]
        res = self.native.signature.result_types([tuple(a.shape) for a in args], dts)
        return [jax.ShapeDtypeStruct(s, _TO_NUMPY[dt]) for s, dt in res]

    def _forward(self, *args: Any) -> Any:
        shapes = self._results(args)

        def host(*arrays: Any) -> tuple[np.ndarray, ...]:
            return tuple(self.native(*_host_arrays(arrays), copy=True))

        outs = jax.pure_callback(host, tuple(shapes), *args, vmap_method="sequential")
        return outs[0] if self.single else tuple(outs)

    def _backward(self, args: tuple[Any, ...], cts: tuple[Any, ...]) -> tuple[Any, ...]:
        results = self._results(args)
        floats = [i for i, r in enumerate(results) if jnp.issubdtype(r.dtype, jnp.floating)]
        wrt = tuple(i for i, a in enumerate(args) if jnp.issubdtype(a.dtype, jnp.floating))
        grads_in = [cts[i] for i in floats]

        def host(*arrays: Any) -> tuple[np.ndarray, ...]:
            n = len(args)
            arrays = _host_arrays(arrays)
            return tuple(self.native.vjp(arrays[:n], arrays[n:], wrt, copy=True))

        shapes = tuple(jax.ShapeDtypeStruct(args[i].shape, args[i].dtype) for i in wrt)
        got = iter(jax.pure_callback(host, shapes, *args, *grads_in,
                                     vmap_method="sequential") if wrt else ())
        # integer inputs take float0 cotangents (JAX's "no gradient")
        return tuple(next(got) if i in wrt else np.zeros(a.shape, jax.dtypes.float0)
                     for i, a in enumerate(args))


def _host_arrays(arrays: Sequence[Any]) -> list[np.ndarray]:
    """A callback's arguments as numpy arrays. JAX may hand over its own CPU arrays, whose
    bf16 DLPack cannot carry: `np.asarray` gives the `ml_dtypes.bfloat16` array (and shares
    the memory of the others)."""
    return [a if isinstance(a, np.ndarray) else np.asarray(a) for a in arrays]


def load_op(source: str | Path, name: str, params: Mapping[str, Any] | None = None, *,
            search_paths: Sequence[str] | None = None, tuning: bool = True,
            fuse: bool = True) -> JaxOp:
    """The op `name` of the `.nf` file `source` (or `"std.nn"`) with compile-time `params`, as
    a JAX-differentiable function (module doc)."""
    return JaxOp(NativeOp(source, name, params, search_paths=search_paths, tuning=tuning,
                          fuse=fuse))
