"""Shared helpers of the model tests (imported as `models_lib`; conftest names clash across
folders): the models at test size, their PyTorch twins, and running `@forward` /
`@train_step` through the interpreter with named arrays."""

from __future__ import annotations

import importlib.util
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from nfc.ir import Func, Module

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Case:
    """A model at test size: its twin's name in benchmarks/torch_models.py, the .nf file and
    the model params that shrink it, and the shape of its second result."""

    name: str
    path: str
    params: dict[str, Any] = field(default_factory=dict)
    output: tuple[int, ...] | None = None


CASES = [
    Case("mlp3", "examples/mlp.nf", {"batch": 3, "inputs": 20, "hidden1": 16, "hidden2": 12},
         (3, 10)),
    Case("lenet5", "examples/lenet5.nf", {"batch": 2}, (2, 10)),
    Case("resnet18", "examples/models/resnet18.nf", {"batch": 2, "image": 16, "width": 2},
         (2, 10)),
    Case("squeezenet", "examples/models/squeezenet.nf", {"batch": 2, "image": 16, "squeeze": 2},
         (2, 10)),
    Case("lstm_lm", "examples/models/lstm_lm.nf",
         {"batch": 2, "steps": 4, "vocab": 16, "embed": 6, "hidden": 8}),
    Case("capsnet", "examples/models/capsnet.nf",
         {"batch": 2, "image": 12, "kernel": 3, "channels": 6, "types": 2, "pdim": 4, "ddim": 4,
          "classes": 5}, (2, 5)),
    Case("matrix_capsule", "examples/capsule.nf", {"batch": 2}, (2, 10)),
    Case("shufflenet_unit", "examples/shufflenet_unit.nf", {"batch": 2}, (2, 10)),
    Case("mobilenet", "examples/models/mobilenet.nf", {"batch": 2, "image": 8, "width": 3},
         (2, 10)),
    Case("mi_lstm", "examples/models/mi_lstm.nf",
         {"batch": 3, "steps": 3, "inputs": 7, "hidden": 6, "classes": 4}, (3, 4)),
    Case("sc_rnn", "examples/models/sc_rnn.nf",
         {"batch": 3, "steps": 3, "inputs": 7, "hidden": 6, "context": 4, "classes": 4}, (3, 4)),
    Case("sublstm", "examples/models/sublstm.nf",
         {"batch": 3, "steps": 3, "inputs": 7, "hidden": 6, "classes": 4}, (3, 4)),
    Case("lltm", "examples/models/lltm.nf",
         {"batch": 3, "steps": 3, "inputs": 7, "state_size": 6, "classes": 4}, (3, 4)),
    Case("bert", "examples/models/bert.nf",
         {"batch": 2, "seq": 5, "vocab": 11, "hidden": 8, "heads": 2, "ffn": 12, "layers": 2},
         (2, 2)),
]


def load_benchmark(name: str) -> ModuleType:
    """benchmarks/<name>.py as a module (benchmarks/ is not a package)."""
    key = f"_nfc_benchmarks_{name}"
    if key not in sys.modules:
        spec = importlib.util.spec_from_file_location(key, ROOT / "benchmarks" / f"{name}.py")
        assert spec is not None and spec.loader is not None
        mod = importlib.util.module_from_spec(spec)
        sys.modules[key] = mod
        spec.loader.exec_module(mod)
    return sys.modules[key]


def arg_roles(func: Func) -> dict[str, str]:
    """{argument name: nf.role}."""
    return {a.name or "": attrs.get("nf.role", "") for a, attrs in
            zip(func.args, func.arg_attrs, strict=True)}


def run_named(func: Func, module: Module, args: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Run `func` on arguments by name; its results by `nf.results` name."""
    from nfc.interp import run
    outs = run(func, {a.name: args[a.name] for a in func.args}, module=module)
    names = func.attrs["nf.results"]
    return {n: np.asarray(o) for n, o in zip(names, outs, strict=True)}


def perturbed(arrays: dict[str, np.ndarray], inits: dict[str, str],
              rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Initial values with the constant initializers (zeros, ones, const) perturbed, so that
    biases, scales and running statistics are not trivially uniform in the tests."""
    out = {}
    for name, a in arrays.items():
        init = inits.get(name, "")
        if init.startswith(("zeros", "ones", "const")):
            noise = rng.standard_normal(a.shape).astype(a.dtype)
            # "ones" initialises scales and running variances: keep them positive
            a = a + (0.3 * np.abs(noise) if init == "ones" else 0.1 * noise)
        out[name] = a
    return out


def char_corpus() -> np.ndarray:
    """Python's documentation topics as int32 ASCII codes (non-ASCII -> '?')."""
    import pydoc_data.topics

    text = "".join(pydoc_data.topics.topics[k] for k in sorted(pydoc_data.topics.topics))
    return np.frombuffer(text.encode("ascii", errors="replace"), dtype=np.uint8).astype(np.int32)


_MODULES: dict[tuple[str, bool], Module] = {}


def training_module(case: Case) -> Module:
    """`case` compiled in training mode with `@train_step` and `@eval` (cached per session)."""
    key = (case.name, True)
    if key not in _MODULES:
        from nfc.passes.autodiff.train import build_training_module
        _MODULES[key] = build_training_module(str(ROOT / case.path), dict(case.params))
    return _MODULES[key]


def forward_module(case: Case, training: bool) -> Module:
    """`case` compiled by the frontend alone (cached per session)."""
    key = (case.name + ":forward", training)
    if key not in _MODULES:
        from nfc.frontend import compile_file
        _MODULES[key] = compile_file(str(ROOT / case.path), params=dict(case.params),
                                     training=training)
    return _MODULES[key]


def by_name(cases: list[Case]) -> list[Any]:
    """pytest params with the case names as ids."""
    import pytest
    return [pytest.param(c, id=c.name) for c in cases]
