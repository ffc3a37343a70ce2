"""Checks shared by the tests of parameter layouts (concatenated: test_param_layout.py;
blocked: test_layout.py): a laid-out native build against the interpreter, checkpoints
exchanged with the plain build, one more step within the plain step's error bound."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from nfc.ir import Module
from nfc.runtime import checkpoint as ckpt
from nfc.testing import assert_matches_oracle, assert_within_bounds, run_bounded


def check_laid_out_build(laid: Any, plain: Any, lmod: Module, pmod: Module,
                         batches: list[dict[str, np.ndarray]], tmp_path: Path) -> None:
    """Two train steps of `laid` (IR `lmod`) against the interpreter (float32 error bound),
    `plain` stepped alike; a checkpoint of either build resumes in the other, every tensor
    equal; then one more step of `laid` on `batches[2]` within the error bound of `plain`'s
    step (IR `pmod`) in the interpreter."""
    f = lmod.func("train_step")
    for bt in batches[:2]:
        args = [bt[x.name] if x.name in bt else laid.tensors[x.name].copy() for x in f.args]
        got = laid.train_step(**bt)
        res = [got[n] if n in got else laid.tensors[n.split(":", 1)[1]]
               for n in f.attrs["nf.results"]]
        assert_matches_oracle(f, args, res, module=lmod)
        plain.train_step(**bt)
    # a checkpoint of either build resumes in the other
    for writer, reader, d in ((laid, plain, tmp_path / "l2p"), (plain, laid, tmp_path / "p2l")):
        ckpt.save(d, writer.step, writer.named_tensors(), {})
        expect = {n: (x.shape, x.dtype) for n, x in reader.named_tensors().items()}
        loaded = ckpt.load_latest(d, expect)
        assert loaded is not None
        saved = writer.state_dict()
        reader.init(99)  # another starting point: the load must overwrite every part
        assert any(not np.array_equal(reader.state_dict()[k], v) for k, v in saved.items())
        reader.load_state_dict(loaded.tensors)
        after = reader.state_dict()
        for k, v in saved.items():
            np.testing.assert_array_equal(after[k], v, err_msg=k)
    # the same state and batch: one more step of the laid-out build from the exchanged
    # checkpoint, its loss within the float32 error bound of the plain step's
    pf = pmod.func("train_step")
    bt = batches[2]
    args = [bt[x.name] if x.name in bt else plain.tensors[x.name].copy() for x in pf.args]
    value, err = run_bounded(pf, args, module=pmod)[0]
    assert_within_bounds(laid.train_step(**bt)["loss"], value, err, name="loss")
