"""`load_op`: a `.nf` op registered as a `torch.library.custom_op`.

Two custom ops are registered per loaded op, in the namespace `nfc` (`torch.ops.nfc.*`):

    nfc::<op>_<key>(Tensor A, Tensor K) -> Tensor                       the forward
    nfc::<op>_<key>_backward(Tensor[] inputs, Tensor[] grads, bool[] wrt) -> Tensor[]

`<key>` is a hash of the file's content, its path, the op and its compile-time parameters, so
two parameterisations of one op are two operators. The forward's autograd formula
(`register_autograd`) saves the inputs and calls the backward op with `wrt` =
`ctx.needs_input_grad`, so only the gradients that are needed are compiled and computed. Both
ops have fake implementations computed from the `.nf` signature (nfc.runtime.native_op:
OpSignature.result_types), symbolic sizes included: `torch.compile(fullgraph=True)` traces
them without a graph break, with static or dynamic shapes.

Tensors go to the native code by DLPack, without a copy: inputs must be CPU tensors of a dtype
nfc compiles (float32, float64, float16, bfloat16, int32, int64, bool; a bfloat16 tensor
travels as its 16-bit pattern, since DLPack has no bf16 numpy can read) and contiguous, or
the call raises
`OpError` naming the argument. `load_op(..., copy=True)` instead copies non-contiguous inputs
(explicitly, once per call). Upstream gradients are made contiguous in the backward (PyTorch
often hands over expanded, stride-0 ones; that copy is the one the backward makes). Results
are allocated by PyTorch and written in place by the native function.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import torch

from nfc.ir import DType
from nfc.runtime.native_op import NativeOp, OpError, as_array

#: Tensor dtypes nfc compiles (16-bit floats: docs/codegen.md, "16-bit floats").
TORCH_DTYPES: dict[torch.dtype, DType] = {
    torch.float32: DType.F32, torch.float64: DType.F64, torch.float16: DType.F16,
    torch.bfloat16: DType.BF16, torch.int32: DType.I32, torch.int64: DType.I64,
    torch.bool: DType.I1}
_FROM_IR = {v: k for k, v in TORCH_DTYPES.items()}

#: One TorchOp per (file content, op, parameters, options): a custom op is registered once.
_LOADED: dict[str, TorchOp] = {}


def _ir_dtype(t: torch.Tensor, what: str) -> DType:
    dt = TORCH_DTYPES.get(t.dtype)
    if dt is None:
        raise OpError(f"{what} has dtype {t.dtype}, which nfc does not compile; use "
                      f"torch.float32, float64, float16, bfloat16, int32, int64 or bool")
    return dt


def _numpy(t: torch.Tensor, what: str) -> np.ndarray:
    """`t` as a numpy array sharing its memory (DLPack). DLPack's bf16 is not one numpy
    reads, so a bfloat16 tensor goes as its bits (int16) and is viewed as
    `ml_dtypes.bfloat16`, the array type nfc's bf16 functions take."""
    if t.dtype == torch.bfloat16:
        return as_array(t.view(torch.int16), what).view(ml_dtypes.bfloat16)
    return as_array(t, what)


class TorchOp:
    """A loaded op: call it on tensors; `.op` and `.backward_op` are the registered custom ops,
    `.native` the compiled functions (nfc.runtime.native_op.NativeOp)."""

    def __init__(self, native: NativeOp, qualname: str, copy: bool) -> None:
        self.native = native
        self.copy = copy
        self.qualname = qualname
        sig = native.signature
        self.inputs = list(sig.inputs)
        self.outputs = list(sig.outputs)
        self.single = len(self.outputs) == 1
        args = ", ".join(f"Tensor {_schema_name(n, i)}" for i, n in enumerate(self.inputs))
        rets = "Tensor" if self.single else "(" + ", ".join("Tensor" for _ in self.outputs) + ")"
        self.op = torch.library.custom_op(qualname, self._forward, mutates_args=(),
                                          schema=f"({args}) -> {rets}")
        self.op.register_fake(self._forward_fake)
        self.backward_op = torch.library.custom_op(
            qualname + "_backward", self._backward, mutates_args=(),
            schema="(Tensor[] inputs, Tensor[] grads, bool[] wrt) -> Tensor[]")
        self.backward_op.register_fake(self._backward_fake)
        self.op.register_autograd(self._autograd_backward, setup_context=self._setup_context)

    def __repr__(self) -> str:
        return f"<nfc.torch op torch.ops.{self.qualname.replace('::', '.')}: " \
               f"{self.native.signature.describe()}>"

    def __call__(self, *tensors: torch.Tensor) -> Any:
        """The op's result (a tuple for several)."""
        if len(tensors) != len(self.inputs):
            raise OpError(f"{self.native.name} takes {len(self.inputs)} tensors "
                          f"({', '.join(self.inputs)}), got {len(tensors)}")
        return self.op(*tensors)

    # -- arrays

    def _arrays(self, tensors: Sequence[torch.Tensor], names: Sequence[str]) -> list[np.ndarray]:
        for t, n in zip(tensors, names, strict=True):
            what = f"{self.native.name}: argument '{n}'"
            if not isinstance(t, torch.Tensor):
                raise OpError(f"{what} must be a torch.Tensor, got {type(t).__name__}")
            if t.device.type != "cpu":
                raise OpError(f"{what} is on {t.device}; nfc.torch runs CPU tensors only")
            _ir_dtype(t, what)
        # detach: a view without autograd history (DLPack refuses tensors requiring grad)
        return self.native.check_arrays(
            [_numpy(t.detach(), f"{self.native.name}: argument '{n}'")
             for t, n in zip(tensors, names, strict=True)], copy=self.copy, names=names)

    def _result_types(self, tensors: Sequence[torch.Tensor]) -> list[tuple[tuple[Any, ...],
                                                                          DType]]:
        dtypes = [_ir_dtype(t, f"{self.native.name}: argument '{n}'")
                  for t, n in zip(tensors, self.inputs, strict=True)]
        return self.native.signature.result_types([tuple(t.shape) for t in tensors], dtypes)

    # -- forward

    def _forward(self, *tensors: torch.Tensor) -> Any:
        arrays = self._arrays(tensors, self.inputs)
        types = self.native.types_of(arrays)
        fn = self.native.forward_function(types)
        outs = [torch.empty(shape, dtype=_FROM_IR[dt])
                for shape, dt in self._result_types(tensors)]
        self.native.run(fn, arrays, [_numpy(o, 'result') for o in outs])
        return outs[0] if self.single else tuple(outs)

    def _forward_fake(self, *tensors: torch.Tensor) -> Any:
        outs = [tensors[0].new_empty(shape, dtype=_FROM_IR[dt])
                for shape, dt in self._result_types(tensors)]
        return outs[0] if self.single else tuple(outs)

    # -- backward

    def _setup_context(self, ctx: Any, inputs: tuple[torch.Tensor, ...], output: Any) -> None:
        ctx.save_for_backward(*inputs)

    def _autograd_backward(self, ctx: Any, *grads: torch.Tensor | None) -> tuple[Any, ...]:
        inputs = ctx.saved_tensors
        wrt = [bool(n) and inputs[i].dtype.is_floating_point
               for i, n in enumerate(ctx.needs_input_grad)]
        if not any(wrt):
            return tuple(None for _ in inputs)
        ups = []
        for (shape, dt), g in zip(self._result_types(inputs), grads, strict=True):
            if not dt.is_float:
                continue  # integer results have no gradient
            ups.append(torch.zeros(shape, dtype=_FROM_IR[dt]) if g is None
                       else g.contiguous())  # expanded (stride-0) gradients are common
        got = iter(self.backward_op(list(inputs), ups, wrt))
        return tuple(next(got) if w else None for w in wrt)

    def _backward(self, inputs: list[torch.Tensor], grads: list[torch.Tensor],
                  wrt: list[bool]) -> list[torch.Tensor]:
        arrays = self._arrays(inputs, self.inputs)
        names = [f"d_{n}" for n, (_, dt) in zip(self.outputs, self._result_types(inputs),
                                                strict=True) if dt.is_float]
        gs = self._arrays(grads, names)
        index = tuple(i for i, w in enumerate(wrt) if w)
        outs = [torch.empty(inputs[i].shape, dtype=inputs[i].dtype) for i in index]
        self.native.vjp(arrays, gs, index, out=[_numpy(o, 'gradient') for o in outs])
        return outs

    def _backward_fake(self, inputs: list[torch.Tensor], grads: list[torch.Tensor],
                       wrt: list[bool]) -> list[torch.Tensor]:
        return [torch.empty_like(t, memory_format=torch.contiguous_format)
                for t, w in zip(inputs, wrt, strict=True) if w]


def _schema_name(name: str, i: int) -> str:
    """A schema argument name for the op parameter `name` (schemas reserve a few words)."""
    return name if name not in ("self", "out", "Tensor", "int", "float", "bool") else f"{name}_{i}"


def load_op(source: str | Path, name: str, params: Mapping[str, Any] | None = None, *,
            search_paths: Sequence[str] | None = None, copy: bool = False,
            tuning: bool = True, fuse: bool = True) -> TorchOp:
    """The op `name` of the `.nf` file `source` (or `"std.nn"`, the standard library) with
    compile-time parameters `params`, as a PyTorch custom op (module doc).

    `copy`: copy non-contiguous inputs instead of refusing them. `tuning`: use tuned schedules
    from nfc's tuning cache; `fuse`: run the fusion pass (both as `nfc compile`). Loading the
    same op again returns the same object; an op whose file changed is a new operator.
    """
    from nfc.codegen.cpu import host_target

    native = NativeOp(source, name, params, search_paths=search_paths, tuning=tuning, fuse=fuse)
    h = hashlib.sha256()
    # the target too: code built for other CPU features (NFC_CPU_FEATURES) is another op
    for part in (str(native.path.resolve()), native.path.read_bytes().hex(), name,
                 repr(sorted((k, repr(v)) for k, v in native.signature.cvals.items())),
                 repr(list(search_paths or [])), repr((copy, tuning, fuse)),
                 host_target().key()):
        h.update(part.encode())
        h.update(b"\0")
    key = h.hexdigest()[:12]
    found = _LOADED.get(key)
    if found is not None:
        return found
    qualname = f"nfc::{re.sub(r'[^A-Za-z0-9_]', '_', name)}_{key}"
    op = TorchOp(native, qualname, copy)
    _LOADED[key] = op
    return op
