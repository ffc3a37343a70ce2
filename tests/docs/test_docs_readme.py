"""The README's promises: the two opening commands, and the complete example compiles."""

import re
from pathlib import Path

import numpy as np

from nfc.frontend import compile_source
from nfc.interp import run
from nfc.verifier import verify

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def test_readme_opens_with_the_two_commands_and_ci_runs_the_test_one():
    first_block = re.search(r"```\n(.*?)```", README, re.S).group(1).strip().splitlines()
    commands = [line.split("#")[0].strip() for line in first_block]
    assert commands == ["bash scripts/demo.sh", "bash scripts/test.sh"]
    for cmd in commands:
        assert (ROOT / cmd.split()[1]).is_file()
    assert "bash scripts/test.sh" in (ROOT / ".ci" / "run").read_text()


def test_readme_example_compiles_and_runs():
    code = re.search(r"```\n(# tiny\.nf.*?)```", README, re.S).group(1)
    module = compile_source(code, "tiny.nf", params={"batch": 4})
    verify(module)
    f = module.func("forward")
    rng = np.random.default_rng(0)
    inputs = {}
    for a in f.args:
        if a.dtype.is_float:
            inputs[a.name] = rng.standard_normal(a.shape).astype(a.dtype.numpy)
        else:
            inputs[a.name] = rng.integers(0, 10, a.shape).astype(a.dtype.numpy)
    loss, logits = run(f, inputs)
    assert logits.shape == (4, 10) and np.isfinite(loss) and loss > 0
