"""The out-of-tree pass plugin in examples/plugin, installed the way a user would install it.

The package is pip-installed (no network, no build isolation) into a scratch directory that a
fresh `nfc` process gets on PYTHONPATH: the pass is found through its `nfc.passes` entry point
alone. A hand-made distribution that reuses a registered name shows duplicates are refused.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = """nf.module @m {
  nf.func @f(%x: tensor<4x8xf32>) -> (tensor<4xf32>, tensor<4x8xf32>) {
    %s = nf.compute [i: 4] sum [k: 8] (%x[i, k] * 2.0) : tensor<4xf32>
    %t = nf.compute [i: 4, j: 8] (%x[i, j]) : tensor<4x8xf32>
    nf.return %s, %t : tensor<4xf32>, tensor<4x8xf32>
  }
}
"""


def nfc_cmd() -> list[str]:
    script = Path(sys.executable).parent / "nfc"
    return [str(script)] if script.exists() else [sys.executable, "-m", "nfc"]


def run(args: list[str], pythonpath: Path, stdin: str | None = None):
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(pythonpath), env.get("PYTHONPATH", "")])
    return subprocess.run([*nfc_cmd(), *args], input=stdin, capture_output=True, text=True,
                          env=env, timeout=120)


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """examples/plugin installed into a scratch directory (built from a copy, so the source
    tree gets no build/ or egg-info)."""
    tmp = tmp_path_factory.mktemp("plugin")
    src = tmp / "src"
    shutil.copytree(ROOT / "examples/plugin", src,
                    ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__"))
    target = tmp / "site"
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
         "--no-index", "--disable-pip-version-check", "--target", str(target), str(src)],
        capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (target / "nfc_flops").is_dir()
    return target


def test_installed_plugin_is_listed_with_its_options(site):
    proc = run(["passes", "annotate-flops"], site)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("annotate-flops\n  nfc_flops:AnnotateFlops (from nfc-flops)")
    assert "min-flops: int (default 0)" in proc.stdout
    assert "Computes cheaper than this are left without the attribute." in proc.stdout
    listing = run(["passes"], site)
    assert "\nannotate-flops\n" in f"\n{listing.stdout}" and "\ncse\n" in listing.stdout


def test_installed_plugin_runs_in_a_pipeline(site):
    proc = run(["opt", "-", "-p", "cse,annotate-flops{min-flops=40,attr=x.flops}"], site,
               stdin=MODULE)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    # %s: 4*8 points x (one multiply + the sum) = 64; %t copies: 0 FLOPs, below min-flops
    assert "(%x[i, k] * 2.0) {x.flops = 64} : tensor<4xf32>" in out
    assert "(%x[i, j]) : tensor<4x8xf32>" in out
    assert out.startswith("nf.module @m attributes {x.flops = 64} {")
    bad = run(["opt", "-", "-p", "annotate-flops{min-flops=-1}"], site, stdin=MODULE)
    assert bad.returncode == 1
    assert "annotate-flops: min-flops must be >= 0, got -1" in bad.stderr


def test_the_plugin_without_installing_it(tmp_path):
    path = tmp_path / "m.nfir"
    path.write_text(MODULE)
    plugin = ROOT / "examples/plugin/nfc_flops/__init__.py"
    proc = run(["opt", str(path), "--load-plugin", f"{plugin}:AnnotateFlops", "-p",
                "annotate-flops"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "{nf.flops = 64}" in proc.stdout


def test_a_second_registration_of_a_name_is_refused(tmp_path):
    dist = tmp_path / "evil_cse-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: evil-cse\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[nfc.passes]\ncse = evil_cse:CSE\n")
    proc = run(["passes"], tmp_path)  # lists every pass; the ambiguous one as an error
    assert proc.returncode == 1
    assert ("pass 'cse' is registered twice: by evil_cse:CSE (from evil-cse) and by "
            "nfc.passes.cse:CSE (from nfc)") in proc.stdout
    assert "\ndce\n" in proc.stdout
