"""Every benchmark model compiles (at test size and at its default size) and runs forward
through the interpreter with finite results of the right shapes, in both modes."""

from __future__ import annotations

import numpy as np
import pytest
from models_lib import CASES, ROOT, Case, by_name, forward_module

from nfc.ir import Func

MODELS_DIR = ROOT / "examples" / "models"


def random_args(func: Func, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """Arguments by role: integer inputs in {0, 1} (valid labels and token ids for every
    model), small parameters, positive states (they include running variances)."""
    out = {}
    for arg, attrs in zip(func.args, func.arg_attrs, strict=True):
        role = attrs.get("nf.role")
        dt = arg.dtype.numpy
        if arg.dtype.is_int:
            out[arg.name] = rng.integers(0, 2, size=arg.shape).astype(dt)
        elif role == "param":
            out[arg.name] = (0.2 * rng.standard_normal(arg.shape)).astype(dt)
        elif role == "state":
            out[arg.name] = (0.5 + rng.random(arg.shape)).astype(dt)
        else:
            out[arg.name] = rng.standard_normal(arg.shape).astype(dt)
    return out


@pytest.mark.parametrize("training", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("case", by_name(CASES))
def test_forward_runs(case: Case, training: bool) -> None:
    from nfc.interp import run

    module = forward_module(case, training)
    func = module.func("forward")
    assert module.attrs["nf.loss"] == "loss"
    assert module.attrs["nf.optimizer"]["name"] == "sgd"
    args = random_args(func, np.random.default_rng(1))
    names = func.attrs["nf.results"]
    results = dict(zip(names, run(func, args, module=module), strict=True))
    assert names[0] == "loss" and np.asarray(results["loss"]).shape == ()
    if case.output is not None:
        assert np.asarray(results[names[1]]).shape == case.output
    states = [n for n in names if n.startswith("state:")]
    if not training:
        assert not states, "evaluation must not update state"
    for n in states:
        assert results[n].shape == args[n[len("state:"):]].shape
    for n, value in results.items():
        assert value.dtype == np.float32, f"{n} is {value.dtype}"
        assert np.isfinite(value).all(), f"{n} is not finite"


def test_batch_norm_models_update_running_statistics() -> None:
    for name in ("resnet18", "mobilenet"):
        case = next(c for c in CASES if c.name == name)
        names = forward_module(case, True).func("forward").attrs["nf.results"]
        assert sum(n.startswith("state:") for n in names) >= 10, name


# the default (benchmark) sizes: (file, a parameter, its shape)
DEFAULT_SIZES = [
    ("resnet18.nf", "s4b_k2", (128, 128, 3, 3)),
    ("squeezenet.nf", "f5_k3", (128, 32, 3, 3)),
    ("capsnet.nf", "wd", (1152, 10, 16, 8)),
    ("mobilenet.nf", "p2_k", (128, 64, 1, 1)),
    ("lstm_lm.nf", "w", (64 + 256, 1024)),
    ("mi_lstm.nf", "u", (1024, 4096)),
    ("sc_rnn.nf", "p", (64, 128)),
    ("sublstm.nf", "w", (784 + 128, 512)),
    ("lltm.nf", "w", (128 + 784, 384)),
    ("bert.nf", "w1", (2, 64, 256)),
]


@pytest.mark.parametrize("file,param,shape", DEFAULT_SIZES, ids=[d[0] for d in DEFAULT_SIZES])
def test_default_size_compiles(file: str, param: str, shape: tuple[int, ...]) -> None:
    from nfc.frontend import compile_file

    func = compile_file(str(MODELS_DIR / file)).func("forward")
    args = {a.name: a for a in func.args}
    assert args[param].shape == shape
    assert func.ret.values[0].shape == ()


def test_every_model_file_is_tested() -> None:
    files = {p.name for p in MODELS_DIR.glob("*.nf")} - {"layers.nf"}
    assert files == {c.path.rsplit("/", 1)[1] for c in CASES if "/models/" in c.path}
    assert files == {d[0] for d in DEFAULT_SIZES}


def test_capsnet_routing_is_unrolled_three_times() -> None:
    case = next(c for c in CASES if c.name == "capsnet")
    func = forward_module(case, True).func("forward")
    # each round computes one coupling softmax: a max over the classes of the routing logits
    maxes = [op for op in func.body.ops if getattr(op, "reduce", None) == "max"]
    assert len(maxes) == 3
