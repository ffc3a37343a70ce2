"""The models `nfc bench` knows: each example `.nf` file, its twin in benchmarks/ (the key of
`torch_models.TWINS` and `jax_models.MODELS`, when it has one) and the sizes benchmarked.

The benchmark sizes are the models' own defaults (the seed papers' shapes) except where a note
says otherwise: `nfc bench --all` must finish in half an hour on a 2-core machine, which bounds
the largest steps (CapsNet's primary capsule convolution alone is ~3 GFLOP per forward pass at
batch 16). `--set batch=N` (or any model param) overrides them for a run.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import nfc

#: The repository checkout nfc runs from (examples/ and benchmarks/ live there).
ROOT = Path(nfc.__file__).resolve().parent.parent


@dataclass(frozen=True)
class BenchModel:
    """One benchmark model."""

    name: str
    """The benchmark name: the twin's key, else the file's stem."""
    path: str
    """The `.nf` file, relative to the repository root (or absolute for a user's model)."""
    twin: str | None = None
    """Key of the PyTorch/JAX twins in benchmarks/, None when there is none."""
    params: Mapping[str, Any] = field(default_factory=dict)
    """Model params benchmarked (over the file's defaults)."""
    quick: Mapping[str, Any] = field(default_factory=dict)
    """Model params of `--quick` (a smoke run: small, so compiling and stepping are fast)."""
    int_bounds: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    """Integer inputs that index a tensor: input -> (tensor name, axis whose size bounds it).
    Other integer inputs are class labels, bounded by the classes of the model's output."""
    note: str = ""
    """Why the benchmarked sizes differ from the defaults, if they do."""
    model: str | None = None
    """The model of a file that defines several (`--model`); None: the file's only model."""

    @property
    def file(self) -> Path:
        """The absolute path of the model file."""
        p = Path(self.path)
        return p if p.is_absolute() else ROOT / p

    def settings(self, quick: bool = False, extra: Mapping[str, Any] | None = None
                 ) -> dict[str, Any]:
        """The model params of a run: benchmark (or quick) sizes, then `extra` (--set)."""
        return {**self.params, **(self.quick if quick else {}), **(extra or {})}


_IDS = {"ids": ("tok", 0)}
_LM = {"ids": ("emb", 0), "targets": ("emb", 0)}

#: Every example model, in the order of the table (the TVM_T models, the NeoFlow models, the
#: recurrent cells, then the small examples without twins).
MODELS: tuple[BenchModel, ...] = (
    BenchModel("mlp3", "examples/mlp.nf", "mlp3", quick={"batch": 16}),
    BenchModel("lenet5", "examples/lenet5.nf", "lenet5", quick={"batch": 4}),
    BenchModel("resnet18", "examples/models/resnet18.nf", "resnet18",
               quick={"batch": 2, "image": 8, "width": 4}),
    BenchModel("squeezenet", "examples/models/squeezenet.nf", "squeezenet",
               quick={"batch": 2, "image": 16, "squeeze": 4}),
    BenchModel("capsnet", "examples/models/capsnet.nf", "capsnet", {"batch": 4},
               quick={"batch": 2, "image": 12, "kernel": 3, "channels": 8, "types": 2},
               note="batch 4 (default 16): about 9 GFLOP per step at batch 16"),
    BenchModel("matrix_capsule", "examples/capsule.nf", "matrix_capsule", quick={"batch": 2}),
    BenchModel("shufflenet_unit", "examples/shufflenet_unit.nf", "shufflenet_unit",
               quick={"batch": 2}),
    BenchModel("mobilenet", "examples/models/mobilenet.nf", "mobilenet",
               quick={"batch": 2, "image": 8, "width": 4}),
    BenchModel("lstm_lm", "examples/models/lstm_lm.nf", "lstm_lm", int_bounds=_LM,
               quick={"batch": 2, "steps": 4, "hidden": 16, "embed": 8}),
    BenchModel("mi_lstm", "examples/models/mi_lstm.nf", "mi_lstm",
               quick={"batch": 4, "steps": 2, "inputs": 16, "hidden": 16}),
    BenchModel("sc_rnn", "examples/models/sc_rnn.nf", "sc_rnn",
               quick={"batch": 4, "steps": 2, "inputs": 16}),
    BenchModel("sublstm", "examples/models/sublstm.nf", "sublstm",
               quick={"batch": 4, "steps": 2, "inputs": 16}),
    BenchModel("lltm", "examples/models/lltm.nf", "lltm",
               quick={"batch": 4, "steps": 2, "inputs": 16}),
    BenchModel("bert", "examples/models/bert.nf", "bert", int_bounds=_IDS,
               quick={"batch": 2, "seq": 8, "hidden": 16, "ffn": 32, "layers": 1}),
    BenchModel("mlp_digits", "examples/mlp_digits.nf", quick={"batch": 8}),
    BenchModel("lstm_cell", "examples/lstm_cell.nf", quick={"batch": 2}),
    BenchModel("milstm", "examples/milstm.nf", quick={"batch": 2}),
    BenchModel("resnet_block", "examples/resnet_block.nf", quick={"batch": 2}),
)


class UnknownModel(ValueError):
    """A model name or file `nfc bench` cannot resolve."""


def resolve(spec: str) -> BenchModel:
    """The benchmark model named `spec` (a benchmark name, or a `.nf` path: a known example's
    entry, else a model without twins benchmarked at its own defaults)."""
    by_name = {m.name: m for m in MODELS}
    if spec in by_name:
        return by_name[spec]
    p = Path(spec)
    if p.suffix != ".nf":
        raise UnknownModel(f"'{spec}' is neither a .nf file nor a benchmark model "
                           f"({', '.join(by_name)})")
    if not p.exists() and not p.is_absolute() and (ROOT / p).exists():
        p = ROOT / p  # `nfc bench examples/mlp.nf` (its help's example) from any directory
    if not p.exists():
        raise UnknownModel(f"no such file: '{spec}'")
    real = p.resolve()
    for m in MODELS:
        if m.file.resolve() == real:
            return m
    return BenchModel(p.stem, str(real))


def unlisted_examples() -> list[Path]:
    """Example model files that MODELS does not cover (a test keeps this empty)."""
    known = {m.file.resolve() for m in MODELS}
    files = sorted((ROOT / "examples").glob("*.nf")) + sorted(
        (ROOT / "examples" / "models").glob("*.nf"))
    return [f for f in files if f.resolve() not in known
            and any(line.startswith("model ") for line in f.read_text().splitlines())]
