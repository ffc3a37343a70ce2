"""`to_nf`: a `torch.nn.Module` as a `.nf` model, through `torch.export` and Core ATen.

    imported = nfc.torch.to_nf(model, (x,), loss="cross_entropy", optimizer="sgd(lr = 0.1)")
    imported.write("mlp.nf")                       # a model of std.nn calls
    m = nfc.runtime.build.load_model("mlp.nf")     # compile, load
    imported.load_into(m)                          # the module's parameters and buffers
    m.train_step(x=x.numpy(), y=y.numpy().astype("int32"))

The module is exported (`torch.export.export`, then `run_decompositions()` to Core ATen), and
each node becomes one `.nf` statement calling the standard library (COVERED below). Parameter
and buffer names follow the module's (`fc1.weight` is `fc1_weight`), in PyTorch's layouts
(linear weights stay `[out, in]`: the model calls `linear(x, transpose2d(w), b)`), so the
module's values load as they are. The model's last user output is the network's output; the
loss is added on it (`cross_entropy`: `softmax_cross_entropy` against an `i32` label input
`y`; `mse`: against a `target` input of the output's shape). A module exported in training
mode (`model.train()`) becomes a model whose batch norms use batch statistics and update their
running statistics as PyTorch does; one exported in `eval()` mode uses the running ones.

Anything else is refused with the list of every node not covered (`UnsupportedError`), rather
than a model that computes something else.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

aten = torch.ops.aten

#: Core ATen ops the importer writes as .nf (what it does not list, it refuses).
COVERED = (
    "addmm (x @ w + b with a 1-D bias: linear), mm, permute/t of a 2-D tensor (transpose2d), "
    "convolution (2-D, not transposed, square stride/padding/dilation, groups), "
    "_native_batch_norm_legit_functional (training, running statistics updated), "
    "_native_batch_norm_legit_no_training (evaluation), max_pool2d_with_indices and "
    "avg_pool2d (square windows, no ceil_mode; avg with count_include_pad), "
    "relu, sigmoid, tanh, exp, log, sqrt, rsqrt, neg, add/sub/mul/div (tensors or scalars, "
    "broadcasting), view/_unsafe_view/reshape/clone/alias (copies of the same values), "
    "_log_softmax/_softmax over the last axis, mean over all but the first two axes of NCHW "
    "(global average pooling)")

_DTYPES = {torch.float32: "f32", torch.float64: "f64", torch.int32: "i32",
           torch.int64: "i64", torch.bool: "i1"}


class UnsupportedError(ValueError):
    """The module uses operators (or forms of them) the importer does not cover."""


@dataclass
class Imported:
    """The `.nf` source of an imported module and the values of its parameters and state."""

    source: str
    values: dict[str, np.ndarray] = field(default_factory=dict)
    """Parameters and buffers by their `.nf` names, as the module holds them."""
    names: dict[str, str] = field(default_factory=dict)
    """`.nf` name -> the module's (`fc1_weight` -> `fc1.weight`)."""

    def write(self, path: str | Path) -> Path:
        """Write the source to `path`."""
        p = Path(path)
        p.write_text(self.source, encoding="utf-8")
        return p

    def load_into(self, model: Any) -> None:
        """Copy the module's values into a loaded nfc model's tensors (in place), by their
        logical names and shapes (`state_dict`): a parameter the build stores laid out (the
        `layout` pass's blocked weights) is packed into its layout, not copied as raw bytes."""
        state = model.state_dict()
        for name, arr in self.values.items():
            state[name] = arr.reshape(state[name].shape).astype(state[name].dtype, copy=False)
        model.load_state_dict(state)


def _nf_name(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]", "_", text)
    return name if name[:1].isalpha() else f"v_{name}"


def _value_name(node: Any) -> str:
    """`t_<node name>`: never a keyword, a std.nn op or a declared name."""
    return "t_" + re.sub(r"[^A-Za-z0-9_]", "_", node.name.lstrip("_"))


def _type(val: Any) -> str:
    if val.dtype not in _DTYPES:
        raise UnsupportedError(f"dtype {val.dtype} has no .nf type")
    return f"{_DTYPES[val.dtype]}[{', '.join(str(int(d)) for d in val.shape)}]"


def _square(v: Any, what: str) -> int:
    vals = [int(x) for x in (v if isinstance(v, list | tuple) else [v])]
    if len(set(vals)) != 1:
        raise UnsupportedError(f"{what} {vals} is not square")
    return vals[0]


class _Writer:
    """Walks the exported graph and writes one statement per node."""

    def __init__(self, ep: Any) -> None:
        self.ep = ep
        self.sig = ep.graph_signature
        self.names: dict[Any, str] = {}       # node -> .nf value (a name or an expression)
        self.decls: list[str] = []
        self.body: list[str] = []
        self.values: dict[str, np.ndarray] = {}
        self.orig: dict[str, str] = {}
        self.skipped: set[Any] = set()
        self.unsupported: list[str] = []
        self.bn_stats: dict[Any, tuple[str, str]] = {}
        """Training batch norm node -> its new running mean and variance (expressions)."""

    def value(self, a: Any) -> str:
        if isinstance(a, torch.fx.Node):
            return self.names[a]
        if isinstance(a, bool):
            return "true" if a else "false"
        if isinstance(a, int | float):
            return repr(float(a)) if isinstance(a, float) else str(a)
        raise UnsupportedError(f"argument {a!r}")

    def placeholders(self) -> None:
        state = self.ep.state_dict
        consts = getattr(self.ep, "constants", {})
        params = self.sig.inputs_to_parameters
        buffers = self.sig.inputs_to_buffers
        for node in self.ep.graph.nodes:
            if node.op != "placeholder":
                continue
            val = node.meta["val"]
            if node.name in params or node.name in buffers:
                target = params.get(node.name) or buffers[node.name]
                tensor = state[target] if target in state else consts[target]
                if tensor.dtype == torch.int64 and node.name in buffers:
                    self.skipped.add(node)  # num_batches_tracked: a counter nfc does not keep
                    continue
                name = _nf_name(target)
                kind = "param" if node.name in params else "state"
                self.decls.append(f"  {kind} {name}: {_type(val)} = zeros")
                self.values[name] = tensor.detach().cpu().numpy().copy()
                self.orig[name] = target
            else:
                name = _nf_name(node.name)
                self.decls.append(f"  input  {name}: {_type(val)}")
            self.names[node] = name

    def assign(self, node: Any, expr: str) -> None:
        name = _value_name(node)
        self.body.append(f"  {name} = {expr}")
        self.names[node] = name

    def call(self, node: Any) -> None:  # noqa: C901 - one case per operator, a table in prose
        t, a = node.target, node.args
        v = self.value
        if any(isinstance(x, torch.fx.Node) and x in self.skipped for x in a):
            self.skipped.add(node)
            return
        binary = {aten.add.Tensor: "+", aten.sub.Tensor: "-", aten.mul.Tensor: "*",
                  aten.div.Tensor: "/", aten.add.Scalar: "+", aten.sub.Scalar: "-",
                  aten.mul.Scalar: "*", aten.div.Scalar: "/"}
        unary = {aten.relu.default: "relu", aten.sigmoid.default: "sigmoid",
                 aten.tanh.default: "tanh", aten.exp.default: "exp", aten.log.default: "log",
                 aten.sqrt.default: "sqrt", aten.rsqrt.default: "rsqrt"}
        if t in binary:
            if node.kwargs.get("alpha", 1) != 1 or len(a) > 2:
                raise UnsupportedError("add/sub with alpha")
            self.assign(node, f"{v(a[0])} {binary[t]} {v(a[1])}")
        elif t in unary:
            # std.nn's relu is rank-polymorphic; intrinsics work elementwise on any rank
            self.assign(node, f"{unary[t]}({v(a[0])})")
        elif t == aten.neg.default:
            self.assign(node, f"-{v(a[0])}")
        elif t == aten.addmm.default:
            if len(a) > 3 or node.kwargs or a[0].meta["val"].dim() != 1:
                raise UnsupportedError("addmm with beta/alpha or a 2-D bias")
            self.assign(node, f"linear({v(a[1])}, {v(a[2])}, {v(a[0])})")
        elif t == aten.mm.default:
            self.assign(node, f"matmul({v(a[0])}, {v(a[1])})")
        elif t in (aten.permute.default, aten.t.default):
            perm = [1, 0] if t == aten.t.default else list(a[1])
            if perm == [1, 0]:
                self.assign(node, f"transpose2d({v(a[0])})")
            else:
                self.assign(node, f"transpose<{perm}>({v(a[0])})")
        elif t in (aten.view.default, aten._unsafe_view.default, aten.reshape.default):
            shape = [int(d) for d in node.meta["val"].shape]
            self.assign(node, f"reshape<{shape}>({v(a[0])})")
        elif t in (aten.clone.default, aten.alias.default):
            self.names[node] = v(a[0])
        elif t == aten.convolution.default:
            x, w, b, stride, pad, dil, transposed, _, groups = a
            if transposed or len(w.meta["val"].shape) != 4:
                raise UnsupportedError("transposed or non-2-D convolution")
            s, p, d = _square(stride, "stride"), _square(pad, "padding"), \
                _square(dil, "dilation")
            conv = f"conv2d<stride = {s}, padding = {p}, dilation = {d}, groups = {groups}>" \
                   f"({v(x)}, {v(w)})"
            self.assign(node, f"bias_add_nchw({conv}, {v(b)})" if b is not None else conv)
        elif t == aten._native_batch_norm_legit_functional.default:
            x, g, b, rm, rv, training, momentum, eps = a
            if not training or g is None or b is None:
                raise UnsupportedError("batch norm without affine parameters")
            base = _value_name(node)
            self.body.append(f"  {base}_y, {base}_mean, {base}_var = "
                             f"batch_norm_train<eps = {float(eps)!r}>({v(x)}, {v(g)}, {v(b)})")
            shape = x.meta["val"].shape
            n = int(shape[0] * shape[2] * shape[3])
            m = float(momentum)
            # PyTorch keeps the unbiased batch variance in the running statistics
            self.bn_stats[node] = (f"{1 - m!r} * {v(rm)} + {m!r} * {base}_mean",
                                   f"{1 - m!r} * {v(rv)} + {m!r} * {base}_var * "
                                   f"{float(n) / (n - 1)!r}")
            self.names[node] = base
        elif t == aten._native_batch_norm_legit_no_training.default:
            x, g, b, rm, rv, _, eps = a
            self.assign(node, f"batch_norm_eval<eps = {float(eps)!r}>({v(x)}, {v(g)}, {v(b)}, "
                              f"{v(rm)}, {v(rv)})")
        elif t == operator.getitem:
            src, i = a
            if src.target == aten._native_batch_norm_legit_functional.default:
                base = self.names[src]
                if i == 0:
                    self.names[node] = f"{base}_y"
                elif i in (3, 4):
                    self.assign(node, self.bn_stats[src][i - 3])
                else:
                    raise UnsupportedError("batch norm's saved statistics")
            elif i == 0:
                self.names[node] = self.names[src]
            else:
                raise UnsupportedError(f"result {i} of {src.target}")
        elif t == aten.max_pool2d_with_indices.default:
            x, k, *rest = a
            stride = rest[0] if rest and rest[0] else k
            pad = rest[1] if len(rest) > 1 else 0
            if (len(rest) > 2 and _square(rest[2], "dilation") != 1) or \
                    (len(rest) > 3 and rest[3]):
                raise UnsupportedError("max pooling with dilation or ceil_mode")
            self.assign(node, f"max_pool2d<size = {_square(k, 'window')}, stride = "
                              f"{_square(stride, 'stride')}, padding = {_square(pad, 'padding')}>"
                              f"({v(x)})")
        elif t == aten.avg_pool2d.default:
            x, k, *rest = a
            stride = rest[0] if rest and rest[0] else k
            pad = rest[1] if len(rest) > 1 else 0
            if (len(rest) > 2 and rest[2]) or (len(rest) > 3 and not rest[3]) or \
                    (len(rest) > 4 and rest[4] is not None):
                raise UnsupportedError("average pooling with ceil_mode, count_include_pad "
                                       "false or a divisor")
            self.assign(node, f"avg_pool2d<size = {_square(k, 'window')}, stride = "
                              f"{_square(stride, 'stride')}, padding = {_square(pad, 'padding')}>"
                              f"({v(x)})")
        elif t in (aten._log_softmax.default, aten._softmax.default):
            x, dim, _ = a
            if dim not in (-1, len(x.meta["val"].shape) - 1):
                raise UnsupportedError("softmax over another axis than the last")
            fn = "log_softmax" if t == aten._log_softmax.default else "softmax"
            self.assign(node, f"{fn}({v(x)})")
        elif t == aten.mean.dim:
            x, dims, *rest = a
            shape = x.meta["val"].shape
            if len(shape) != 4 or sorted(d % 4 for d in dims) != [2, 3]:
                raise UnsupportedError("mean over other axes than H and W of NCHW")
            pooled = f"global_avg_pool({v(x)})"
            keep = rest[0] if rest else False
            self.assign(node, f"reshape<{[int(shape[0]), int(shape[1]), 1, 1]}>({pooled})"
                        if keep else pooled)
        else:
            raise UnsupportedError(str(t))


def to_nf(module: torch.nn.Module, example_inputs: Sequence[torch.Tensor], *,
          name: str = "imported", loss: str = "cross_entropy",
          optimizer: str = "sgd(lr = 0.1)") -> Imported:
    """The `.nf` model of `module` on inputs like `example_inputs` (module doc). The batch
    size and every shape are those of the example inputs."""
    ep = torch.export.export(module, tuple(example_inputs)).run_decompositions()
    w = _Writer(ep)
    w.placeholders()
    outputs = []
    for node in ep.graph.nodes:
        if node.op == "call_function":
            try:
                w.call(node)
            except UnsupportedError as exc:
                w.unsupported.append(f"{node.name}: {exc}")
                w.names[node] = "?"
        elif node.op == "output":
            outputs = list(node.args[0])
    if w.unsupported:
        raise UnsupportedError("the module uses what nfc.torch.to_nf does not cover:\n  "
                               + "\n  ".join(w.unsupported) + f"\ncovered: {COVERED}")
    updates = []
    user_outputs = []
    for spec, out in zip(ep.graph_signature.output_specs, outputs, strict=True):
        kind = spec.kind.name
        if kind == "BUFFER_MUTATION":
            if out in w.skipped:
                continue
            updates.append(f"  update {_nf_name(spec.target)} = {w.names[out]}")
        elif kind == "USER_OUTPUT":
            user_outputs.append(w.names[out])
        else:
            raise UnsupportedError(f"an output of kind {kind}")
    if not user_outputs:
        raise UnsupportedError("the module returns no tensor")
    out_node = outputs[[s.kind.name for s in ep.graph_signature.output_specs].index(
        "USER_OUTPUT")]
    val = out_node.meta["val"]
    lines = ["# Imported from PyTorch by nfc.torch.to_nf (torch.export, Core ATen -> std.nn).",
             "import std.nn", "", f"model {_nf_name(name)}() {{", *w.decls]
    if loss == "cross_entropy":
        if val.dim() != 2:
            raise UnsupportedError("cross_entropy needs [batch, classes] outputs")
        lines.append(f"  input  y: i32[{int(val.shape[0])}]")
        loss_expr = "softmax_cross_entropy(out, y)"
    elif loss == "mse":
        lines.append(f"  input  target: {_type(val)}")
        loss_expr = "mse(out, target)"
    else:
        raise ValueError(f"loss must be 'cross_entropy' or 'mse', not {loss!r}")
    lines += w.body + updates
    lines += [f"  out = {user_outputs[0]}", f"  loss = {loss_expr}", "  output out",
              f"  minimize loss with {optimizer}", "}", ""]
    return Imported("\n".join(lines), w.values, w.orig)
