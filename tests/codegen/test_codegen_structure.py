"""The shape of the code generator's source: small functions, small modules, and every module
that decides generated code in the object cache's fingerprint."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from nfc.codegen.artifact.kcache import CODEGEN_MODULES

ROOT = Path(__file__).resolve().parents[2]
CODEGEN = ROOT / "codegen"
#: Most lines a module of codegen/ may have (docs/codegen.md: split along a line a reader
#: would recognise before this).
MAX_LINES = 600
#: Most cyclomatic complexity (ruff's C901) of a function in codegen/ (pyproject.toml).
MAX_COMPLEXITY = 20


def _ruff() -> str | None:
    exe = Path(sys.executable).parent / "ruff"
    return str(exe) if exe.exists() else shutil.which("ruff")


def test_no_function_in_codegen_is_too_complex():
    ruff = _ruff()
    if ruff is None:
        pytest.skip("ruff is not installed")
    proc = subprocess.run(
        [ruff, "check", "--no-cache", "--select", "C901", "--config",
         f"lint.mccabe.max-complexity={MAX_COMPLEXITY}", "codegen/"],
        cwd=ROOT, capture_output=True, text=True, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_no_module_in_codegen_is_too_long():
    long = {str(p.relative_to(ROOT)): n for p in CODEGEN.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_LINES}
    assert not long, long


def test_lowering_and_emission_modules_are_fingerprinted():
    # a module that shapes generated code but is missing here would let the object cache
    # reuse objects compiled by an older code generator
    for folder in ("lowering", "llvm"):
        for p in sorted((CODEGEN / folder).glob("*.py")):
            if p.name == "__init__.py":
                continue
            name = f"nfc.codegen.{folder}.{p.stem}"
            assert name in CODEGEN_MODULES, name
    assert "nfc.simplify.rules" in CODEGEN_MODULES  # codegen's index simplification
