"""examples/c_driver: a C program links the library and runs one training step, which must
match the interpreter (and the Python loader) on the same inputs."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
from runtime_lib import (
    ROOT,
    assert_close,
    built_library,
    digits_batch,
    interp_step,
    scratch,
    training_module,
)

from nfc.codegen.artifact.header import c_header
from nfc.codegen.native import find_cc
from nfc.runtime.loader import load


def test_c_program_runs_a_training_step():
    so = built_library()
    d = scratch("cdriver")
    lib = d / "model.so"
    shutil.copyfile(so, lib)
    py = load(str(lib))
    meta = py.metadata
    (d / "model.h").write_text(c_header(meta))
    exe = d / "driver"
    subprocess.run([find_cc(), "-O2", "-Wall", "-Werror", f"-I{d}",
                    str(ROOT / "examples" / "c_driver" / "main.c"), "-o", str(exe), str(lib),
                    "-Wl,-rpath,$ORIGIN"], check=True, capture_output=True, text=True)
    x, y = digits_batch(seed=3)
    (d / "in.bin").write_bytes(x.tobytes() + y.tobytes())
    res = subprocess.run([str(exe), str(d / "in.bin"), str(d / "out.bin"), "11"],
                         check=True, capture_output=True, text=True, cwd=d)
    assert res.stdout.startswith("loss = ")

    # the same step through the interpreter, from the same seeded initial parameters
    py.init(seed=11)
    init = py.state_dict()
    module = training_module()
    ref = interp_step(module, "train_step", {**init, "x": x, "y": y})
    raw = (d / "out.bin").read_bytes()
    off = 0
    step = meta["functions"]["train_step"]
    got: dict[str, np.ndarray] = {}
    for r in step["results"]:
        if r["out"] is not None:
            n = int(np.prod(r["shape"])) * 4
            got[r["name"]] = np.frombuffer(raw[off:off + n], np.float32).reshape(r["shape"])
            off += n
    for t in meta["tensors"]:
        n = int(np.prod(t["shape"])) * 4
        got[t["name"]] = np.frombuffer(raw[off:off + n], np.float32).reshape(t["shape"])
        off += n
    assert off == len(raw)
    assert abs(float(res.stdout.split("=")[1]) - float(got["loss"])) < 1e-5
    assert_close(got["loss"], ref["loss"], what="loss")
    assert_close(got["logits"], ref["logits"], what="logits")
    for name, value in ref.items():
        if ":" in name:
            assert_close(got[name.split(":", 1)[1]], value, what=name)
    # and the Python loader gives the C program's numbers exactly (same code, same inputs)
    out = py.train_step(x=x, y=y, rng=(11, 0))
    assert np.array_equal(out["logits"], got["logits"])
    for t in meta["tensors"]:
        assert np.array_equal(py.tensors[t["name"]], got[t["name"]]), t["name"]
