"""Plain PyTorch twins of nfc's benchmark models (examples/models/*.nf and a few examples/*.nf).

Each class mirrors one `.nf` model line for line: the same model parameters (constructor
keywords, same names and defaults), the same parameter and state names and shapes (linear
weights [in, out] as in std.nn, convolution weights [out, in / groups, kh, kw] as in torch),
the same forward computation and loss, and the model's `minimize ... with sgd(...)` as
`torch.optim.SGD` (nfc's SGD follows PyTorch's formulas). So the same numbers in give the same
numbers out:

    twin = TWINS["mlp3"](batch=4)              # keywords = the .nf model's params
    twin.load(arrays)                          # {name: numpy array} for params and state
    out = twin(**twin.torch_inputs(inputs))    # {"loss": ..., "logits": ...}
    twin.train_step(inputs)                    # forward, backward, SGD step; returns the loss
    twin.arrays()                              # {name: numpy array} after the step

`Twin.make_inputs(rng)` draws valid inputs (labels in range) as numpy arrays, keyed like the
`.nf` inputs. Nothing here imports nfc; `nfc bench` runs these files in fresh processes.

The twins live in three files beside this one: `torch_twin.py` (the `Twin` base, initializers,
batch norm), `torch_models_vision.py` (feed-forward and convolutional models) and
`torch_models_sequence.py` (recurrent and attention models); this module collects them.
"""

from __future__ import annotations

import pathlib
import sys

# benchmarks/ is not a package and this file is also loaded by path: make its siblings importable
_HERE = str(pathlib.Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

from torch_models_sequence import (  # noqa: E402
    BERT,
    LLTM,
    LSTMLM,
    MILSTM,
    SCRNN,
    RNNTwin,
    SubLSTM,
    char_corpus,
    lstm_gates,
)
from torch_models_vision import (  # noqa: E402
    MLP3,
    CapsNet,
    LeNet5,
    MatrixCapsule,
    MobileNet,
    ResNet18,
    ShuffleNetUnit,
    SqueezeNet,
    capsule_conv,
    capsule_length,
    margin_loss,
    squash,
)
from torch_twin import Arrays, BNTwin, Twin  # noqa: E402

__all__ = [
    "BERT", "LLTM", "LSTMLM", "MILSTM", "MLP3", "SCRNN", "TWINS", "Arrays", "BNTwin", "CapsNet",
    "LeNet5", "MatrixCapsule", "MobileNet", "RNNTwin", "ResNet18", "ShuffleNetUnit",
    "SqueezeNet", "SubLSTM", "Twin", "capsule_conv", "capsule_length", "char_corpus",
    "lstm_gates", "margin_loss", "squash",
]

#: Every twin by benchmark name.
TWINS: dict[str, type[Twin]] = {
    "mlp3": MLP3,
    "lenet5": LeNet5,
    "resnet18": ResNet18,
    "squeezenet": SqueezeNet,
    "lstm_lm": LSTMLM,
    "capsnet": CapsNet,
    "matrix_capsule": MatrixCapsule,
    "shufflenet_unit": ShuffleNetUnit,
    "mobilenet": MobileNet,
    "mi_lstm": MILSTM,
    "sc_rnn": SCRNN,
    "sublstm": SubLSTM,
    "lltm": LLTM,
    "bert": BERT,
}
