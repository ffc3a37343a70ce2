"""Helpers of the runtime tests: build models once per session, run the interpreter oracle."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path

import numpy as np

from nfc.ir import Module

ROOT = Path(__file__).resolve().parents[2]
MLP_DIGITS = ROOT / "examples" / "mlp_digits.nf"
RTOL_F32 = 1e-4

_TMP = Path(tempfile.mkdtemp(prefix="nfc-runtime-tests-"))
atexit.register(shutil.rmtree, _TMP, True)


def scratch(name: str) -> Path:
    """A fresh directory under the session's scratch folder."""
    d = _TMP / name
    if d.exists():
        shutil.rmtree(d)
    d.mkdir(parents=True)
    return d


@functools.cache
def training_module(source: str = str(MLP_DIGITS), settings: tuple[str, ...] = ()) -> Module:
    """The pipelined module of a model (cached; do not mutate)."""
    from nfc.runtime.build import model_module, parse_settings, run_pipeline

    params, opt = parse_settings(settings)
    return run_pipeline(model_module(source, params, opt))


@functools.cache
def built_library(source: str = str(MLP_DIGITS), settings: tuple[str, ...] = (),
                  profile: bool = False) -> str:
    """Path of the shared library of a model (built once per session, no cache)."""
    from nfc.runtime.build import build_library

    module = training_module(source, settings)
    out = _TMP / f"lib{abs(hash((source, settings, profile)))}.so"
    return build_library(module, str(out), profile=profile, use_cache=False).path


def interp_step(module: Module, func: str, inputs: Mapping[str, np.ndarray]
                ) -> dict[str, np.ndarray]:
    """The interpreter's results of `func` by result name (in-place ones as `param:w`...)."""
    from nfc.interp import run

    f = module.func(func)
    outs = run(f, dict(inputs), module=module)
    return dict(zip(f.attrs["nf.results"], outs, strict=True))


def assert_close(actual: np.ndarray, expected: np.ndarray, rtol: float = RTOL_F32,
                 what: str = "") -> None:
    """`actual` within `rtol` of `expected`, relative to expected's magnitude."""
    actual = np.asarray(actual, dtype=np.float64)
    expected = np.asarray(expected, dtype=np.float64)
    assert actual.shape == expected.shape, (what, actual.shape, expected.shape)
    scale = max(float(np.max(np.abs(expected))) if expected.size else 0.0, 1e-6)
    err = float(np.max(np.abs(actual - expected))) if expected.size else 0.0
    assert err <= rtol * scale, f"{what}: max error {err:.3g} > {rtol} * {scale:.3g}"


def digits_batch(batch: int = 64, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A random batch shaped like the digits model's inputs."""
    g = np.random.default_rng(seed)
    return (g.random((batch, 64), dtype=np.float32),
            g.integers(0, 10, batch).astype(np.int32))
