"""Fit a data set to a model by reading what the model takes.

A model's training step declares its inputs in the metadata (`role = "input"`, name, shape,
dtype). `model_inputs` splits them into the feature input and the label input and learns the
range of integer inputs: the classes a label can name, the vocabulary of token ids. The IR says
it exactly when the model was compiled from source (`input_ranges`: an id that indexes a tensor
dimension, a label compared with an index variable); a compiled library alone falls back on its
results (`logits`/`lengths` give the classes) and parameters (`emb`/`tok` tables give the
vocabulary).

The inputs' per-sample shapes give the model's *kind*, which picks the data set for
`--data auto` and how a data set is shaped to fit:

    kind      per-sample inputs                  auto     how data fits
    flat      x: f32[F]                          digits   F = 64 as is; F = S*S: the 8x8 image
                                                          resized to SxS, flattened
    image     x: f32[C, H, W]                    digits   resized to HxW, channels replicated
    sequence  x: f32[S, F]                       digits   resized to an SxF image whose row t is
                                                          step t ("rows as a sequence")
    tokens    ids: i32[S], y: i32[]              text     S characters, the class of the next one
    lm        ids: i32[S], targets: i32[S]       text     S characters and the S next ones (the
                                                          window shifted by one)
    tensor    any other float input              synthetic

Resizing is bilinear with pixel centres aligned (or nearest, `resize="nearest"`). A model with
fewer classes than digits' 10 trains on the digits below its class count. `text` maps
characters to ids by frequency (the vocabulary's most frequent characters, the rest to one
"other" id); float inputs take characters one-hot; its test split is the first 1,024 windows
of the last 10% of the text. `synthetic` is a learnable task drawn from a fixed seed (64
batches or 2,048 samples to train on, whichever is more; 8 batches or 256 to test): Gaussian
features labelled by a random linear teacher, token sequences labelled by a random
bag-of-tokens teacher, or, for language models, a random Markov chain whose next token is a
fixed permutation of the current one four times out of five. Impossible fits raise `DataError`
naming both shapes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from nfc.ir import Binary, Block, Cast, ComputeOp, Expr, Func, Index, KernelOp, Load, YieldOp
from nfc.runtime import data as ds_mod
from nfc.runtime.data import DataError, Dataset, InputSpec

#: Input names taken as the features / the labels before falling back on dtypes.
FEATURE_NAMES = ("x", "ids", "tokens", "inputs", "input", "images", "features")
LABEL_NAMES = ("y", "targets", "labels", "target", "label")
#: Parameter names whose first dimension is the vocabulary (for libraries without their IR).
EMBEDDING_NAMES = ("emb", "embedding", "embed", "tok", "tokens", "wte", "token_embedding")
RESIZE_MODES = ("bilinear", "nearest")
#: Test windows of `text` (the first of the held-out last 10%): evaluating thousands of
#: windows after every epoch would cost more than a short run's training.
TEXT_TEST_WINDOWS = 1024
AUTO = "auto"


@dataclass(frozen=True)
class ModelInputs:
    """The feature and label inputs of a model's step, with the ranges of integer values."""

    x: InputSpec
    y: InputSpec | None
    classes: int
    """Labels are 0 <= y < classes."""
    vocab: int | None = None
    """Token ids are 0 <= x < vocab (integer features only; None when unknown)."""

    @property
    def batch(self) -> int:
        """The compiled batch size (the leading dimension of the features)."""
        return self.x.shape[0] if self.x.shape else 1

    @property
    def sample(self) -> tuple[int, ...]:
        """The per-sample feature shape."""
        return self.x.shape[1:]

    @property
    def kind(self) -> str:
        """flat, image, sequence, tokens, lm or tensor (see the module doc)."""
        if self.x.dtype.kind in "iu":
            if self.y is not None and self.y.shape[1:] == self.sample and self.sample:
                return "lm"
            return "tokens"
        return {1: "flat", 2: "sequence", 3: "image"}.get(len(self.sample), "tensor")

    def describe(self) -> str:
        """`x: f32[8, 784] -> y: i32[8] (10 classes)`-style summary."""
        def one(s: InputSpec) -> str:
            return f"{s.name}: {_dtype_name(s.dtype)}{list(s.shape)}"
        tail = f" -> {one(self.y)}" if self.y is not None else ""
        vocab = f", vocabulary {self.vocab}" if self.vocab else ""
        return f"{one(self.x)}{tail} ({self.classes} classes{vocab})"


def _dtype_name(dt: np.dtype) -> str:
    if dt.name == "bfloat16":
        return "bf16"
    return {"f": "f", "i": "i", "u": "u", "b": "i"}.get(dt.kind, "?") + str(8 * dt.itemsize)


def split_inputs(inputs: Sequence[InputSpec]) -> tuple[InputSpec, InputSpec | None]:
    """(features, labels) among a step's inputs: by name first (`x`, `ids`... / `y`,
    `targets`...), else the first float input and the first other integer input. Raises
    DataError when inputs are left over (nfc train feeds exactly two)."""
    if not inputs:
        raise DataError("the model has no inputs to feed data into")
    by_name = {a.name: a for a in inputs}
    x = next((by_name[n] for n in FEATURE_NAMES if n in by_name), None)
    x = x or next((a for a in inputs if a.dtype.kind == "f"), inputs[0])
    rest = [a for a in inputs if a is not x]
    y = next((by_name[n] for n in LABEL_NAMES if n in by_name and by_name[n] is not x), None)
    y = y or next((a for a in rest if a.dtype.kind in "iu"), None)
    extra = [a.name for a in rest if a is not y]
    if extra:
        raise DataError(f"the model has inputs {', '.join(extra)} besides '{x.name}' and "
                        f"'{y.name if y else '-'}'; nfc train feeds one feature and one "
                        "label input")
    return x, y


def input_ranges(func: Func) -> dict[str, int]:
    """Exclusive upper bounds of the integer inputs of `func`, from their uses: an id that
    indexes dimension k of a tensor is below that extent; a label compared (`==`) with an index
    variable is below the variable's extent. Copies (`x_t[n] = ids[n, t]`) carry the input
    along. Inputs used neither way are absent."""
    carriers: dict[int, str] = {}
    for v, attrs in zip(func.args, func.arg_attrs, strict=True):
        if attrs.get("nf.role") == "input" and v.dtype.is_int and v.name:
            carriers[id(v)] = v.name
    bounds: dict[str, int] = {}

    def source(e: Expr) -> str | None:
        while isinstance(e, Cast):
            e = e.x
        return carriers.get(id(e.tensor)) if isinstance(e, Load) else None

    def note(name: str, extent: int) -> None:
        bounds[name] = min(bounds.get(name, extent), extent)

    def visit(block: Block) -> None:
        for op in block.ops:
            if isinstance(op, KernelOp):
                visit(op.body)
                term = op.body.ops[-1]
                assert isinstance(term, YieldOp)
                for r, v in zip(op.results, term.values, strict=True):
                    if id(v) in carriers:
                        carriers[id(r)] = carriers[id(v)]
                continue
            if not isinstance(op, ComputeOp):
                continue
            extents = {a.name: a.extent for a in op.all_axes}
            for e in op.body.walk():
                if isinstance(e, Load):
                    for k, idx in enumerate(e.indices):
                        if (s := source(idx)) is not None:
                            note(s, e.tensor.shape[k])
                elif isinstance(e, Binary) and e.op == "==":
                    for a, b in ((e.a, e.b), (e.b, e.a)):
                        s = source(a)
                        if s is not None and isinstance(b, Index) and b.name in extents:
                            note(s, extents[b.name])
            if op.reduce is None and (s := source(op.body)) is not None:
                carriers[id(op.result)] = s

    visit(func.body)
    return bounds


def result_classes(meta: Mapping[str, Any]) -> int | None:
    """The last dimension of a `logits` (or capsule `lengths`) result, if any."""
    for name in ("logits", "lengths"):
        for fname in ("eval", "forward", "train_step"):
            for r in (meta["functions"].get(fname) or {}).get("results", []):
                if r["name"] == name and r["shape"]:
                    return int(r["shape"][-1])
    return None


def _embedding_rows(meta: Mapping[str, Any]) -> int | None:
    for t in meta.get("tensors", []):
        if (t.get("role") == "param" and len(t["shape"]) == 2
                and t["name"].lower() in EMBEDDING_NAMES):
            return int(t["shape"][0])
    return None


def model_inputs(meta: Mapping[str, Any], function: str = "train_step",
                 func: Func | None = None) -> ModelInputs:
    """What `function` of a compiled model takes (see the module doc); `func` is the model's
    IR @forward when known, for exact value ranges."""
    fm = meta["functions"].get(function) or next(iter(meta["functions"].values()))
    specs = [InputSpec(str(a["name"]), tuple(int(d) for d in a["shape"]),
                       _np_dtype(a["dtype"]))
             for a in fm["args"] if a.get("role") == "input"]
    x, y = split_inputs(specs)
    ranges = input_ranges(func) if func is not None else {}
    vocab = None
    if x.dtype.kind in "iu":
        vocab = ranges.get(x.name) or _embedding_rows(meta)
    classes = ranges.get(y.name) if y is not None else None
    classes = classes or result_classes(meta)
    if classes is None and y is not None and y.shape[1:] == x.shape[1:] and vocab:
        classes = vocab  # a language model predicts its own tokens
    return ModelInputs(x, y, classes or 10, vocab)


_NP_DTYPES = {"f32": "float32", "f64": "float64", "i32": "int32", "i64": "int64",
              "i1": "bool", "f16": "float16"}


def _np_dtype(name: str) -> np.dtype:
    if name == "bf16":  # 2-byte ml_dtypes.bfloat16, as the library stores it
        from nfc.runtime.loader import numpy_dtype

        return numpy_dtype(name)
    return np.dtype(_NP_DTYPES.get(name, name))


def choose(mi: ModelInputs) -> str:
    """The data set `--data auto` takes for `mi` (see the module doc)."""
    if mi.kind in ("tokens", "lm"):
        return "text"
    if mi.kind in ("flat", "image", "sequence") and mi.classes >= 2 and _digits_fit(mi):
        return "digits"
    return "synthetic"


def _digits_fit(mi: ModelInputs) -> bool:
    if mi.y is not None and mi.y.shape[1:]:
        return False
    if mi.kind == "flat":
        f = mi.sample[0]
        return f == 64 or math.isqrt(f) ** 2 == f
    return True


def load_for(name: str, mi: ModelInputs, *, resize: str = "bilinear") -> Dataset:
    """Data set `name` (or `auto`) fitted to the model inputs `mi`."""
    if resize not in RESIZE_MODES:
        raise DataError(f"unknown resize mode '{resize}' (known: {', '.join(RESIZE_MODES)})")
    if name == AUTO:
        name = choose(mi)
    if mi.classes < 2:
        raise DataError(f"the model's labels have {mi.classes} class; nothing to learn")
    if name == "digits":
        return _fit_images(ds_mod.digits(), mi, resize)
    if name == "mnist1d":
        return _fit_images(ds_mod.mnist1d(), mi, resize)
    if name == "text":
        return _text(mi)
    if name == "synthetic":
        return _synthetic(mi)
    raise DataError(f"unknown data set '{name}' (known: {AUTO}, {', '.join(ds_mod.DATASETS)})")


# ---------------------------------------------------------------------------------------------
# images (digits, mnist1d)


def resize_images(images: np.ndarray, h: int, w: int, mode: str = "bilinear") -> np.ndarray:
    """(N, H0, W0) images resized to (N, h, w): bilinear with pixel centres aligned, or
    nearest (each output pixel takes the input pixel its centre falls in)."""
    n, h0, w0 = images.shape
    if (h0, w0) == (h, w):
        return images.astype(np.float32)
    if mode == "nearest":
        rows = np.minimum((np.arange(h) * h0) // h, h0 - 1)
        cols = np.minimum((np.arange(w) * w0) // w, w0 - 1)
        return images[:, rows][:, :, cols].astype(np.float32)

    def axis(src: int, dst: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        pos = np.clip((np.arange(dst) + 0.5) * src / dst - 0.5, 0, src - 1)
        lo = np.floor(pos).astype(np.int64)
        hi = np.minimum(lo + 1, src - 1)
        return lo, hi, (pos - lo).astype(np.float32)

    ylo, yhi, fy = axis(h0, h)
    xlo, xhi, fx = axis(w0, w)
    top = images[:, ylo][:, :, xlo] * (1 - fx) + images[:, ylo][:, :, xhi] * fx
    bot = images[:, yhi][:, :, xlo] * (1 - fx) + images[:, yhi][:, :, xhi] * fx
    return (top * (1 - fy)[:, None] + bot * fy[:, None]).astype(np.float32)


def _shape_images(arr: np.ndarray, ds: Dataset, mi: ModelInputs, resize: str
                  ) -> tuple[np.ndarray, str]:
    """Features of `ds` in the model's per-sample shape, and how they were made."""
    n, want = len(arr), mi.sample
    flat = arr.reshape(n, -1)
    replicate = ds.image is not None and mi.kind == "image" and want[0] > 1
    if flat.shape[1] == math.prod(want) and not replicate:
        return flat.reshape(n, *want), "as is"
    if ds.image is not None:
        imgs = flat.reshape(n, *ds.image)
        src = f"{ds.image[0]}x{ds.image[1]}"
        if mi.kind == "flat" and math.isqrt(want[0]) ** 2 == want[0]:
            side = math.isqrt(want[0])
            out = resize_images(imgs, side, side, resize).reshape(n, want[0])
            return out, f"{src} -> {side}x{side} {resize}, flattened"
        if mi.kind == "image":
            c, h, w = want
            out = np.repeat(resize_images(imgs, h, w, resize)[:, None], c, axis=1)
            rep = f", {c} channels" if c > 1 else ""
            return out, f"{src} -> {h}x{w} {resize}{rep}"
        if mi.kind == "sequence":
            s, f = want
            return resize_images(imgs, s, f, resize), f"{src} -> {s} rows of {f} ({resize})"
    raise DataError(f"data '{ds.name}' has {flat.shape[1]} features per sample but input "
                    f"'{mi.x.name}' takes {list(want)}; compile the model for "
                    f"{flat.shape[1]} inputs (e.g. --set inputs={flat.shape[1]}) or use "
                    "--data synthetic")


def _fit_images(ds: Dataset, mi: ModelInputs, resize: str) -> Dataset:
    if mi.x.dtype.kind != "f":
        raise DataError(f"data '{ds.name}' has float features but input '{mi.x.name}' takes "
                        f"{_dtype_name(mi.x.dtype)} token ids; use --data text or synthetic")
    if mi.y is not None and mi.y.shape[1:]:
        raise DataError(f"data '{ds.name}' has one label per sample but input '{mi.y.name}' "
                        f"takes {list(mi.y.shape[1:])} per sample")
    note = ""
    if mi.classes < ds.classes:  # keep the classes the model can name
        keep_tr = ds.y_train < mi.classes
        keep_te = ds.y_test < mi.classes if ds.y_test is not None else None
        ds = replace(ds, x_train=ds.x_train[keep_tr], y_train=ds.y_train[keep_tr],
                     x_test=None if keep_te is None else ds.x_test[keep_te],
                     y_test=None if keep_te is None else ds.y_test[keep_te],
                     classes=mi.classes)
        note = f", classes 0-{mi.classes - 1} only"
    xtr, how = _shape_images(ds.x_train, ds, mi, resize)
    xte = None if ds.x_test is None else _shape_images(ds.x_test, ds, mi, resize)[0]
    ydt = mi.y.dtype if mi.y is not None else np.dtype(np.int32)
    if how == "as is":
        how = f"{ds.image[0]}x{ds.image[1]} as is" if ds.image else f"{xtr[0].size} as is"
    return replace(ds, x_train=xtr.astype(mi.x.dtype), y_train=ds.y_train.astype(ydt),
                   x_test=None if xte is None else xte.astype(mi.x.dtype),
                   y_test=None if ds.y_test is None else ds.y_test.astype(ydt),
                   note=f"{ds.name} ({how}{note})")


# ---------------------------------------------------------------------------------------------
# text


def _need_vocab(mi: ModelInputs, data: str) -> int:
    if mi.vocab is None:
        raise DataError(f"cannot tell the range of the token ids of input '{mi.x.name}' from a "
                        f"compiled library; train the model file to use --data {data}")
    if mi.vocab < 2:
        raise DataError(f"input '{mi.x.name}' takes ids below {mi.vocab}; nothing to learn")
    return mi.vocab


def _text(mi: ModelInputs) -> Dataset:
    if mi.y is not None and mi.y.dtype.kind not in "iu":
        raise DataError(f"data 'text' has integer labels but input '{mi.y.name}' is float")
    kind = mi.kind
    ydt = mi.y.dtype if mi.y is not None else np.dtype(np.int32)
    if kind == "lm":
        vocab = _need_vocab(mi, "text")
        v = min(vocab, mi.classes)  # targets must be valid labels as well as valid ids
        x, y, cut = ds_mod.text_lm(math.prod(mi.sample), v)
        x, y = x.reshape(-1, *mi.sample), y.reshape(-1, *mi.sample)
        note = f"text: {v}-character vocabulary, targets = ids shifted by one"
    elif mi.y is not None and mi.y.shape[1:]:
        raise DataError(f"data 'text' gives one label per window, or next-character targets "
                        f"of the window's shape; input '{mi.y.name}' takes "
                        f"{list(mi.y.shape[1:])} per sample and '{mi.x.name}' "
                        f"{list(mi.sample)}")
    elif kind == "tokens":
        vocab = _need_vocab(mi, "text")
        x, y, cut = ds_mod.text_windows(math.prod(mi.sample), vocab, mi.classes)
        x = x.reshape(-1, *mi.sample)
        note = f"text: {vocab}-character vocabulary, next character in {mi.classes} classes"
    else:  # float features: characters one-hot
        if kind == "sequence":
            window, vocab = mi.sample
        else:
            vocab = mi.classes
            window = math.prod(mi.sample) // vocab
            if window < 1 or window * vocab != math.prod(mi.sample):
                raise DataError(f"input '{mi.x.name}' {list(mi.sample)} cannot hold a one-hot "
                                f"text window over {vocab} characters")
        ids, y, cut = ds_mod.text_windows(window, vocab, mi.classes)
        x = np.eye(vocab, dtype=np.float32)[ids].reshape(len(ids), *mi.sample)
        note = f"text: {window} characters one-hot over {vocab}, next character"
    end = cut + TEXT_TEST_WINDOWS
    return Dataset("text", x[:cut].astype(mi.x.dtype), y[:cut].astype(ydt),
                   x[cut:end].astype(mi.x.dtype), y[cut:end].astype(ydt), mi.classes,
                   note=note)


# ---------------------------------------------------------------------------------------------
# synthetic


def _synthetic(mi: ModelInputs, seed: int = 1234) -> Dataset:
    g = np.random.Generator(np.random.PCG64(seed))
    n_train, n_test = max(64 * mi.batch, 2048), max(8 * mi.batch, 256)
    n = n_train + n_test
    ydt = mi.y.dtype if mi.y is not None else np.dtype(np.int32)
    per = math.prod(mi.sample)
    if mi.kind == "lm":
        v = min(_need_vocab(mi, "synthetic"), mi.classes)
        perm = g.permutation(v)
        seq = np.empty((n, per + 1), dtype=np.int64)
        seq[:, 0] = g.integers(0, v, n)
        jump = g.random((n, per)) >= 0.8
        noise = g.integers(0, v, (n, per))
        for t in range(per):
            seq[:, t + 1] = np.where(jump[:, t], noise[:, t], perm[seq[:, t]])
        x = seq[:, :-1].reshape(n, *mi.sample)
        y = seq[:, 1:].reshape(n, *mi.sample)
        note = f"synthetic: Markov chain over {v} tokens"
    elif mi.y is not None and mi.y.shape[1:]:
        raise DataError(f"synthetic data has one label per sample; input '{mi.y.name}' "
                        f"takes {list(mi.y.shape[1:])} per sample")
    elif mi.kind == "tokens":
        v = _need_vocab(mi, "synthetic")
        x = g.integers(0, v, (n, per))
        teacher = g.standard_normal((v, mi.classes))
        y = np.argmax(teacher[x].sum(axis=1), axis=1)
        x = x.reshape(n, *mi.sample)
        note = f"synthetic: {v} tokens, bag-of-tokens teacher"
    else:
        x = g.standard_normal((n, per)).astype(np.float32)
        w = g.standard_normal((per, mi.classes)).astype(np.float32)
        y = np.argmax(x @ w, axis=1)
        x = x.reshape(n, *mi.sample)
        note = "synthetic: Gaussian features, linear teacher"
    xd, yd = x.astype(mi.x.dtype), y.astype(ydt)
    return Dataset("synthetic", xd[:n_train], yd[:n_train], xd[n_train:], yd[n_train:],
                   mi.classes, note=note)
