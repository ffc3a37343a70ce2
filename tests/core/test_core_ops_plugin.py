"""The out-of-tree intrinsic plugin in examples/intrinsic_plugin, installed the way a user
would install it.

The package is pip-installed (no network, no build isolation) into a scratch directory that a
fresh Python process gets on PYTHONPATH: `softsign` is found through its `nfc.intrinsics`
entry point alone, loaded only when a program uses it, and works in the parser, the verifier,
the frontend, the interpreter, autodiff, the cost model and the CPU backend (through the
plugin's LLVM hook, imported only when a kernel needs it).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent('''
    import sys
    import numpy as np
    from nfc import ops
    from nfc.ops import registry

    assert "softsign" not in registry._added          # nothing loaded yet
    assert "softsign" in ops.intrinsic_names()         # but the entry point is known
    assert "nfc_softsign" not in sys.modules

    from nfc.irparser import parse_module
    from nfc.verifier import verify
    m = parse_module("""nf.func @f(%x: tensor<37xf32>, %w: tensor<37xf32>) -> (tensor<37xf32>) {
      %y = nf.compute [i: 37] (softsign(%x[i] * %w[i])) : tensor<37xf32>
      nf.return %y : tensor<37xf32>
    }""", "t.nfir")
    verify(m)
    assert "nfc_softsign" in sys.modules and "nfc_softsign.llvm" not in sys.modules

    from nfc.interp import run
    f = m.func("f")
    rng = np.random.default_rng(0)
    x = (rng.standard_normal(37) * 3).astype(np.float32)
    w = rng.standard_normal(37).astype(np.float32)
    (y,) = run(f, [x, w])
    np.testing.assert_allclose(y, x * w / (1 + np.abs(x * w)), rtol=1e-6)

    from nfc.cost import compute_cost
    op = f.body.ops[0]
    assert compute_cost(op).flops == 37 * 2

    from nfc.codegen.jit import compile_kernel
    got = compile_kernel(op)(x, w)
    assert "nfc_softsign.llvm" in sys.modules          # the plugin's LLVM hook emitted it
    np.testing.assert_allclose(got, y, rtol=1e-6)

    # autodiff: the plugin's derivative rule against central differences, in float64
    from nfc.passes.autodiff.graph import grad_func
    m64 = parse_module("""nf.func @g(%x: tensor<5xf64>) -> (tensor<f64>) {
      %y = nf.compute [] sum [i: 5] (softsign(%x[i] * 2.0)) : tensor<f64>
      nf.return %y : tensor<f64>
    }""", "g.nfir")
    g = grad_func(m64.func("g"), ["x"])
    x64 = np.array([-3.0, -0.5, 0.1, 1.0, 4.0])
    (_, dx) = run(g, [x64])
    eps = 1e-6
    for k in range(5):
        e = np.zeros(5)
        e[k] = eps
        num = (run(m64.func("g"), [x64 + e])[0] - run(m64.func("g"), [x64 - e])[0]) / (2 * eps)
        assert abs(num - dx[k]) <= 1e-6 * max(1.0, abs(num)), (k, num, dx[k])

    # .nf source: calls fold for constants and lower to the intrinsic otherwise
    from nfc.frontend import compile_source
    mod = compile_source("""
    model m(n = 4) {
      input x: f32[n]
      y = softsign(x) + softsign(3.0)
      output y
    }""", "m.nf")
    (z,) = run(mod.func("forward"), {"x": np.array([-1, 0, 1, 3], np.float32)})
    np.testing.assert_allclose(z, [0.25, 0.75, 1.25, 1.5], rtol=1e-6)
    print("ok")
''')

NF = """
model m(n = 8) {
  input x: f32[n]
  param w: f32[n] = ones
  y = softsign(x * w)
  loss = sum(i) y[i]
  output y
  minimize loss with sgd(lr = 0.1)
}
"""


def env_with(path: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(path), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """examples/intrinsic_plugin installed into a scratch directory (built from a copy, so the
    source tree gets no build/ or egg-info)."""
    tmp = tmp_path_factory.mktemp("intrinsic_plugin")
    src = tmp / "src"
    shutil.copytree(ROOT / "examples/intrinsic_plugin", src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "nfc_softsign").is_dir()
    return target


def test_installed_intrinsic_in_every_layer(site: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True,
                          env=env_with(site), timeout=300)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stdout + proc.stderr


def test_installed_intrinsic_from_the_command_line(site: Path, tmp_path: Path) -> None:
    model = tmp_path / "m.nf"
    model.write_text(NF)
    proc = subprocess.run([sys.executable, "-m", "nfc", "opt", str(model), "--pass", "autodiff"],
                          capture_output=True, text=True, env=env_with(site), timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "(softsign(%x[i0] * %w[i0]))" in proc.stdout
    backward = [line for line in proc.stdout.splitlines() if "%d_w" in line and "abs(" in line]
    assert backward, proc.stdout  # the plugin's derivative rule: 1 / (1 + |u|)**2
    without = subprocess.run([sys.executable, "-m", "nfc", "opt", str(model)],
                             capture_output=True, text=True, timeout=300)
    assert without.returncode == 1 and "softsign" in without.stderr
