"""Helpers of the fusion tests: training modules of the examples, the graph of a function's
top-level ops, and running a function kernel by kernel through the JIT."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import networkx as nx
import numpy as np

from nfc.ir import Func, KernelOp, Module, ReturnOp

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

#: Small sizes of examples/mlp.nf so the interpreter and the JIT stay fast.
SMALL_MLP = {"batch": 8, "inputs": 16, "hidden1": 12, "hidden2": 10, "classes": 4}


def train_module(name: str, params: dict[str, Any] | None = None) -> Module:
    """The cleaned-up module of an example with its @train_step (what `nfc compile` builds
    before the fusion pass)."""
    from nfc.passmanager import PassManager, build_pipeline
    from nfc.runtime.build import DEFAULT_PIPELINE, model_module

    module = model_module(EXAMPLES / name, params=params)
    PassManager(build_pipeline(DEFAULT_PIPELINE), verify=False).run(module)
    return module


def step_inputs(func: Func, seed: int = 0) -> list[np.ndarray]:
    """Small floats (so losses do not overflow) and labels in [0, 4)."""
    rng = np.random.default_rng(seed)
    out = []
    for a in func.args:
        if a.dtype.is_float:
            out.append((0.1 * rng.standard_normal(a.shape)).astype(a.dtype.numpy))
        else:
            out.append(rng.integers(0, 4, a.shape).astype(a.dtype.numpy))
    return out


def top_graph(func: Func) -> nx.DiGraph:
    """The graph of `func`'s top-level ops (the quotient graph of a partition): an edge from
    each op to every op reading one of its results."""
    ops = [op for op in func.body.ops if not isinstance(op, ReturnOp)]
    producer = {id(r): n for n, op in enumerate(ops) for r in op.results}
    g = nx.DiGraph()
    g.add_nodes_from(range(len(ops)))
    for n, op in enumerate(ops):
        for v in op.operands:
            if id(v) in producer:
                g.add_edge(producer[id(v)], n)
    return g


def jit_step(func: Func) -> tuple[Callable[[Sequence[np.ndarray]], list[np.ndarray]], int]:
    """(run, number of kernels): `func` compiled one kernel per top-level op (computes and
    kernels alike) into one LLVM module, run in program order on numpy buffers."""
    from nfc.codegen.jit import compile_kernels

    ops = [op for op in func.body.ops if not isinstance(op, ReturnOp)]
    kernels = compile_kernels(ops)

    def run(inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        env = {id(a): x for a, x in zip(func.args, inputs, strict=True)}
        for op, k in zip(ops, kernels, strict=True):
            outs = [np.empty(v.shape, v.dtype.numpy) for v in k.info.outputs]
            k.run(outs, [env[id(v)] for v in k.info.inputs])
            # a kernel's outputs are its body's yielded values, in the order of its results
            for r, arr in zip(op.results, outs, strict=True):
                env[id(r)] = arr
        return [env[id(v)] for v in func.ret.values]
    return run, len(ops)


def kernel_count(func: Func) -> tuple[int, int]:
    """(top-level ops, of which nf.kernel groups)."""
    ops = [op for op in func.body.ops if not isinstance(op, ReturnOp)]
    return len(ops), sum(isinstance(op, KernelOp) for op in ops)
