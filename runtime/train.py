"""The static training loop behind `nfc train`: one native call per step.

    model = compile (or load) → init from the initializers with the seed (or resume)
    data  = the data set fitted to the model's inputs (nfc.runtime.adapters; `auto` picks it)
    for each epoch: for each shuffled full batch: train_step(x, y, rng=(seed, step))
                    evaluate on the test split → metrics, checkpoint, progress

Everything a step depends on is the model's tensors, the batch and `(seed, step)`; the batch
order is a seeded generator whose state is saved with the tensors (nfc.runtime.data,
nfc.runtime.checkpoint). So a run resumed from a checkpoint computes the very same steps as an
uninterrupted one and ends with bit-identical parameters (the native step is deterministic for
a fixed thread count: parallel loops split work statically, reductions are never atomic).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nfc.fsutil import atomic_write
from nfc.runtime import adapters
from nfc.runtime import checkpoint as ckpt
from nfc.runtime import data as datasets
from nfc.runtime.loader import ArtifactError, Model


class TrainError(ValueError):
    """A training setup that cannot work (wrong data for the model, missing function...)."""


@dataclass
class TrainConfig:
    """Options of a training run (the `nfc train` flags)."""

    source: str
    model: str | None = None
    """The model to compile when the file defines several (`nfc train --model`)."""
    data: str = "auto"
    """A data set name, or `auto`: the one that fits the model's inputs (adapters.choose)."""
    resize: str = "bilinear"
    """How images are resized to the model's input: bilinear or nearest."""
    epochs: int = 1
    batch: int | None = None
    lr: float | None = None
    seed: int = 0
    settings: tuple[str, ...] = ()
    metrics: str | None = None
    plot: str | None = None
    checkpoint: str | None = None
    every: int = 0
    """Checkpoint every this many steps (0: at the end of every epoch)."""
    resume: bool = False
    overwrite: bool = False
    """Start from scratch in a checkpoint directory that already holds checkpoints (which
    this run's checkpoints then replace); without it such a run is refused."""
    profile: bool = False
    trace: str | None = None
    threads: int | None = None
    """Threads of parallel loops (None: `default_threads`)."""
    progress: bool = True
    step_delay: float = 0.0
    max_steps: int | None = None
    use_cache: bool = True
    tuning: bool = True
    """Use tuned schedules from the tuning cache (nfc tune)."""
    fuse: bool = True
    """Group computes into kernels (the fuse pass) when compiling a model file."""
    im2col: bool = True
    """Gather convolution windows into columns (the im2col pass) when compiling."""
    layout: bool = True
    """Let the layout pass block activations and weights where it decides to (`--no-layout`
    removes it)."""
    pipeline: str | None = None
    """The whole pipeline run after the frontend when compiling (`-p`); None: the build
    pipeline (nfc.runtime.build.pipeline_for, which the three flags above edit)."""
    verify: bool = True
    """Verify the module after every pass of the pipeline."""
    print_ir_after: bool | tuple[str, ...] = ()
    """Passes after which the IR is printed to stderr (True: every pass)."""
    time_passes: bool = False
    """Print the time of the frontend, each pass and codegen to stderr."""
    keep: int = 3
    evaluate: bool = True
    """Evaluate on the test split after every epoch (and at the end)."""
    log: Callable[[str], None] = field(default=lambda s: print(s, file=sys.stderr))
    mode: str = "static"
    """`dynamic`: explore and swap in better kernels while training (nfc.runtime.dynamic)."""
    dynamic: Any = None
    """nfc.runtime.dynamic.DynamicOptions of a dynamic run (None: the defaults)."""
    distributed: Any = None
    """nfc.runtime.distributed.DistOptions of a data-parallel run under mpiexec (None: the
    defaults); `batch` is then per rank."""
    target: str = "cpu"
    """`cuda`: compile the model file for the GPU and train a CudaModel
    (nfc.runtime.cuda_load); a CUDA artifact (.so) is a CudaModel whatever the target."""
    simulate: bool = False
    """With a CUDA model: run its kernels on the simulator (also NFC_CUDA_SIMULATE=1)."""


@dataclass
class TrainResult:
    """What a run achieved."""

    steps: int
    epochs: float
    """Epochs done (fractional when stopped mid-epoch by --max-steps)."""
    losses: list[float]
    test_accuracy: float | None
    test_loss: float | None
    step_seconds: float
    """Median wall time of one step call (Python overhead included)."""
    model: Model
    threads: int = 1
    profile: Any = None
    data: str = ""
    """The data set used (`auto` resolved)."""
    data_note: str = ""
    """How the data was fitted to the model."""
    compile_seconds: float = 0.0
    """Time to compile (or find in the cache) and load the library."""
    cached: bool = False
    """Whether the library came from the cache (or a .so) rather than a fresh build."""
    dynamic: Any = None
    """nfc.runtime.dynamic.session.Summary of a dynamic run."""


#: Steps cheaper than this many FLOPs run on one thread by default: a parallel region costs a
#: few microseconds when the machine is idle, and on a busy machine a team waiting at a barrier
#: for a descheduled thread costs milliseconds, far more than such a step gains.
SMALL_STEP_FLOPS = 32e6


def default_threads(meta: Mapping[str, Any], function: str = "train_step") -> int:
    """Threads for `function` when none are asked for: 1 for small steps, else every core
    (`OMP_NUM_THREADS` when set)."""
    fm = meta["functions"].get(function) or next(iter(meta["functions"].values()))
    flops = sum(float(k.get("flops", 0)) for k in fm["kernels"])
    if flops < SMALL_STEP_FLOPS:
        return 1
    env = os.environ.get("OMP_NUM_THREADS", "")
    return int(env) if env.isdigit() and int(env) > 0 else (os.cpu_count() or 1)


def model_io(fmeta: Mapping[str, Any]) -> tuple[datasets.InputSpec, datasets.InputSpec | None]:
    """The feature input and the label input of a function, from its metadata
    (adapters.split_inputs)."""
    from nfc.runtime.loader import TensorSpec

    specs = [TensorSpec.of(a) for a in fmeta["args"] if a.get("role") == "input"]
    try:
        return adapters.split_inputs([datasets.InputSpec(a.name, a.shape, a.dtype)
                                      for a in specs])
    except datasets.DataError as exc:
        raise TrainError(str(exc)) from None


def synthetic_train_step(model: Any, *, seed: int = 0, classes: int = 2) -> Any:
    """`model.train_step` bound to a synthetic batch, the model initialised first
    (`model.init(seed)`): features 0.1 * N(0, 1), labels (if any) uniform below `classes`,
    both drawn from `seed`. Calling the result runs one step; the tuner's layout choice, A/B
    benchmarks and bit-identity tests give several builds the same state and batch this way."""
    model.init(seed=seed)
    fn = model.train_step
    x, y = model_io(fn.meta)
    rng = np.random.default_rng(seed)
    bound = fn.bind()
    bound.inputs[x.name][...] = (0.1 * rng.standard_normal(x.shape)).astype(x.dtype)
    if y is not None:
        bound.inputs[y.name][...] = rng.integers(0, classes, y.shape).astype(y.dtype)
    return bound


def model_classes(meta: Mapping[str, Any]) -> int:
    """Classes of the model: the last dimension of a `logits` (or `lengths`) result, else
    10."""
    return adapters.result_classes(meta) or 10


def evaluate(model: Model, ds: datasets.Dataset, function: str | None = None
             ) -> tuple[float | None, float | None]:
    """(accuracy, mean loss) of `model` on the test split (None where not available)."""
    if ds.x_test is None or ds.y_test is None:
        return None, None
    name = function or next((f for f in ("eval", "forward") if f in model.functions), None)
    if name is None:
        return None, None
    fn = model.functions[name]
    x, y = model_io(fn.meta)
    batch = x.shape[0]
    correct = 0
    loss_sum, loss_n = 0.0, 0
    outs = {o.name for o in fn.outputs}
    score = next((s for s in ("logits", "lengths") if s in outs), None)
    per = int(np.prod(ds.y_test.shape[1:]))  # labels per sample (sequence targets: many)
    for idx, real in datasets.eval_batches(len(ds.x_test), batch):
        feeds = {x.name: ds.x_test[idx]}
        if y is not None:
            feeds[y.name] = ds.y_test[idx]
        res = fn(rng=(model.seed, 0), **feeds)
        if score is not None:
            scores = res[score].reshape(batch, per, -1)
            pred = np.argmax(scores, axis=2)[:real]
            correct += int(np.sum(pred == ds.y_test[idx][:real].reshape(real, per)))
        if "loss" in res and real == batch:  # padded batches would count repeats
            loss_sum += float(res["loss"])
            loss_n += 1
    acc = correct / (len(ds.x_test) * per) if score is not None else None
    return acc, (loss_sum / loss_n if loss_n else None)


class _Progress:
    """tqdm when installed and stderr is a terminal, else a plain line every few seconds."""

    def __init__(self, total: int, initial: int, enabled: bool, log: Callable[[str], None]):
        self.bar = None
        self.log = log
        self.enabled = enabled
        self.total = total
        self.last = time.perf_counter()
        if enabled and sys.stderr.isatty():
            try:
                from tqdm import tqdm

                self.bar = tqdm(total=total, initial=initial, unit="step", dynamic_ncols=True)
            except ImportError:
                pass

    def update(self, step: int, epoch: int, loss: float, rate: float) -> None:
        if self.bar is not None:
            self.bar.set_postfix(epoch=epoch, loss=f"{loss:.4f}", refresh=False)
            self.bar.update(1)
        elif self.enabled and time.perf_counter() - self.last > 2.0:
            self.last = time.perf_counter()
            self.log(f"step {step}/{self.total} epoch {epoch} loss {loss:.4f} "
                     f"{rate:.0f} steps/s")

    def write(self, text: str) -> None:
        """A line that does not break the bar."""
        if self.bar is not None:
            self.bar.write(text, file=sys.stderr)
        else:
            self.log(text)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _metrics_file(path: str | None, resume_step: int | None):
    if path is None:
        return None
    p = Path(path)
    if resume_step is not None and p.exists():
        # drop what the interrupted run logged after the checkpoint we resume from
        kept = []
        for line in p.read_text().splitlines():
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                continue
            if int(rec.get("step", 0)) <= resume_step and rec.get("event") != "final":
                kept.append(line)
        atomic_write(p, "".join(x + "\n" for x in kept).encode())
        return open(p, "a", encoding="utf-8")
    p.parent.mkdir(parents=True, exist_ok=True)
    return open(p, "w", encoding="utf-8")


@dataclass
class _Opened:
    model: Model
    forward: Any
    """The IR @forward when compiled from a model file (exact input ranges), else None."""
    seconds: float
    cached: bool


def _open_cuda(cfg: TrainConfig) -> _Opened:
    """`--target cuda` (or a CUDA artifact): a CudaModel on the GPU or the simulator."""
    from nfc.codegen.artifact.container import is_library_path
    from nfc.runtime.cuda_load import build_cuda_module, cuda_artifact, load_cuda, open_step
    from nfc.runtime.loader import _sealed

    if cfg.profile or cfg.mode != "static":
        raise TrainError("--profile and --mode dynamic are not supported with CUDA models yet")
    t0 = time.perf_counter()
    forward = None
    cached = is_library_path(cfg.source)
    if cached:
        if cfg.settings or cfg.lr is not None:
            raise TrainError("--set and --lr apply when compiling a model file, not to a .so")
        sealed = _sealed(cfg.source)
        if sealed.kind != "cuda":
            raise TrainError(f"'{cfg.source}' is a CPU library; --target cuda needs a model "
                             "file or a CUDA artifact (nfc compile --target cuda)")
        model = load_cuda(cfg.source, sealed, simulate=cfg.simulate or None)
    else:
        from nfc.runtime.build import pipeline_for

        settings = list(cfg.settings)
        if cfg.batch is not None and not any(x.startswith("batch=") for x in settings):
            settings.append(f"batch={cfg.batch}")
        if cfg.lr is not None:
            settings.append(f"opt.lr={cfg.lr}")
        pipeline = pipeline_for(cfg.source, cfg.pipeline, im2col=cfg.im2col, tuning=cfg.tuning,
                                fuse=cfg.fuse, layout=cfg.layout, target="cuda")
        module = build_cuda_module(cfg.source, settings, pipeline=pipeline, model=cfg.model,
                                   verify=cfg.verify, print_ir_after=cfg.print_ir_after)
        from nfc.runtime.cuda_load import simulate_requested, tuned_gpu_schedules

        simulate = simulate_requested(cfg.simulate or None)
        choices: dict[str, Any] = {}
        if cfg.tuning and not simulate:
            choices, note = tuned_gpu_schedules(module)
            if cfg.progress:
                cfg.log(f"nfc: {note}")
        art = cuda_artifact(module, schedules=choices, compile=False)
        model = open_step(art.step, simulate=simulate, what=f"'{cfg.source}' for --target cuda")
        if module.has_func("forward"):
            forward = module.func("forward")
    if "train_step" not in model.functions:
        raise TrainError(f"'{cfg.source}' has no train_step: the model needs "
                         "`minimize <loss> with <optimizer>(...)`")
    return _Opened(model, forward, time.perf_counter() - t0, cached)


def _open_model(cfg: TrainConfig) -> _Opened:
    from nfc.codegen.artifact.container import file_kind, is_library_path
    from nfc.runtime.build import compile_model, load_model
    from nfc.runtime.loader import load

    if cfg.target == "cuda" or cfg.simulate:
        return _open_cuda(cfg)
    if is_library_path(cfg.source) and os.path.isfile(cfg.source) and \
            file_kind(cfg.source) == "artifact":
        from nfc.runtime.loader import _sealed

        if _sealed(cfg.source).kind == "cuda":  # a CUDA artifact trains as a CudaModel
            return _open_cuda(cfg)
    settings = list(cfg.settings)
    t0 = time.perf_counter()
    forward = None
    if is_library_path(cfg.source):
        if settings:
            raise TrainError("--set applies when compiling a model file, not to a .so")
        if cfg.lr is not None:
            raise TrainError("--lr applies when compiling a model file: the learning rate of "
                             "a .so is compiled in (nfc compile --set opt.lr=...)")
        model = load_model(cfg.source)
        cached = True
        if cfg.profile and not model.metadata.get("profile"):
            raise TrainError(f"'{cfg.source}' was compiled without profiling; use "
                             "`nfc compile --profile` or train the model file")
    else:
        if cfg.batch is not None and not any(s.startswith("batch=") for s in settings):
            settings.append(f"batch={cfg.batch}")
        if cfg.lr is not None:
            settings.append(f"opt.lr={cfg.lr}")
        built = compile_model(cfg.source, settings=settings, profile=cfg.profile,
                              use_cache=cfg.use_cache, tuning=cfg.tuning, fuse=cfg.fuse,
                              im2col=cfg.im2col, layout=cfg.layout, pipeline=cfg.pipeline,
                              verify=cfg.verify,
                              print_ir_after=cfg.print_ir_after,
                              time_passes=cfg.time_passes, model=cfg.model)
        if cfg.progress and built.tuning:
            cfg.log(f"nfc: {built.tuning}")
        if cfg.progress and built.layout:
            cfg.log(f"nfc: layout: {built.layout}")
        model = load(built.path)
        cached = built.cached
        if built.module.has_func("forward"):
            forward = built.module.func("forward")
    if "train_step" not in model.functions:
        raise TrainError(f"'{cfg.source}' has no train_step: the model needs "
                         "`minimize <loss> with <optimizer>(...)`")
    return _Opened(model, forward, time.perf_counter() - t0, cached)


def _find_checkpoint(cfg: TrainConfig, model: Model) -> ckpt.Loaded | None:
    """The checkpoint `--resume` continues from (verified against the model, falling back
    past damaged ones with a warning), or None to start from scratch."""
    if not cfg.resume:
        if cfg.checkpoint and (found := ckpt.checkpoints(cfg.checkpoint)):
            if not cfg.overwrite:  # never delete a user's checkpoints without being told to
                raise TrainError(
                    f"'{cfg.checkpoint}' already holds checkpoints (the newest "
                    f"'{found[0].name}'): pass --resume to continue from them, or "
                    "--overwrite-checkpoints to start from scratch and replace them")
            cfg.log(f"nfc: warning: '{cfg.checkpoint}' already holds checkpoints (the newest "
                    f"'{found[0].name}'); this run starts from scratch and its checkpoints "
                    "replace them")
        return None
    if not cfg.checkpoint:
        raise TrainError("--resume needs --checkpoint DIR")
    expect = {n: (a.shape, a.dtype) for n, a in model.named_tensors().items()}
    loaded = ckpt.load_latest(cfg.checkpoint, expect, warn=cfg.log)
    if loaded is None:
        cfg.log(f"nfc: no checkpoint in '{cfg.checkpoint}' yet; starting from scratch")
    return loaded


def _restore(cfg: TrainConfig, model: Model, order: datasets.BatchOrder, loaded: ckpt.Loaded,
             batch: int) -> None:
    """Put the model and the batch order where the checkpoint left them."""
    info = loaded.info
    if info.get("data") != cfg.data or info.get("seed") != cfg.seed:
        raise TrainError(f"checkpoint '{loaded.path}' was made with --data {info.get('data')} "
                         f"--seed {info.get('seed')}; resume with the same options")
    if info.get("batch", batch) != batch:
        raise TrainError(f"checkpoint '{loaded.path}' was made with batch {info['batch']}, "
                         f"this run has batch {batch} (ranks x --batch); resume with the same "
                         "global batch")
    try:
        order.restore(info["order"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ckpt.CheckpointCorrupt(f"checkpoint '{loaded.path}' has no usable batch order "
                                     f"({type(exc).__name__}: {exc})") from None
    if not 0 <= order.pos <= order.batches_per_epoch:
        raise TrainError(f"checkpoint '{loaded.path}' is at batch {order.pos} of an epoch of "
                         f"{order.batches_per_epoch}: made with other data; resume with the "
                         "same options")
    try:
        model.load_state_dict(loaded.tensors)
    except ArtifactError as exc:  # load_latest checked the tensors: a bug if reached
        raise AssertionError(f"checkpoint '{loaded.path}' passed its checks but: {exc}"
                             ) from None
    model.seed = cfg.seed
    model.step = loaded.step


def train(cfg: TrainConfig) -> TrainResult:
    """Run the training loop described by `cfg` (see the module doc)."""
    from nfc.runtime.profile import Profiler

    if cfg.mode == "dynamic":
        from nfc.runtime.dynamic.session import prepare_config

        cfg = prepare_config(cfg)
    from nfc.runtime.distributed import prepare

    cfg, dist = prepare(cfg)  # dist: this rank of a data-parallel run (None: one process)
    opened = dist.open(lambda: _open_model(cfg)) if dist else _open_model(cfg)
    model = opened.model
    step_fn = model.functions["train_step"]
    x_spec, y_spec = model_io(step_fn.meta)
    if y_spec is None:
        raise TrainError("nfc train needs a label input (an integer input such as y: i32[B])")
    batch = x_spec.shape[0]
    if cfg.batch is not None and cfg.batch != batch:
        raise TrainError(f"--batch {cfg.batch} but '{cfg.source}' was compiled for batch "
                         f"{batch}")
    threads = cfg.threads or default_threads(model.metadata)
    model.set_num_threads(threads)
    ranks = dist.size if dist else 1
    if dist:
        dist.attach(model, batch)
    inputs = adapters.model_inputs(model.metadata, "train_step", opened.forward)
    ds = adapters.load_for(cfg.data, inputs, resize=cfg.resize)
    if cfg.progress:
        cfg.log(f"nfc: data {ds.note or ds.name}: {len(ds.x_train)} training samples for "
                f"{inputs.describe()}")
    order = datasets.BatchOrder(len(ds.x_train), batch * ranks, cfg.seed)
    resume_step = None
    loaded = _find_checkpoint(cfg, model)
    if loaded is not None:
        _restore(cfg, model, order, loaded, batch * ranks)
        resume_step = model.step
        cfg.log(f"nfc: resumed from {loaded.path} (step {model.step}, epoch {order.epoch})")
    else:
        model.init(cfg.seed)
    metrics = _metrics_file(cfg.metrics, resume_step)
    profiler = Profiler(step_fn.meta["kernels"]) if cfg.profile else None
    total = cfg.epochs * order.batches_per_epoch
    if cfg.max_steps is not None:
        total = min(total, cfg.max_steps)
    progress = _Progress(total, model.step, cfg.progress, cfg.log)
    losses: list[float] = []
    times: list[float] = []
    acc = tloss = None
    bound = step_fn.bind()
    xb, yb = bound.inputs[x_spec.name], bound.inputs[y_spec.name]
    t_start = time.perf_counter()

    def save() -> None:
        if cfg.checkpoint and not (dist and not dist.is_root):
            if metrics is not None:  # what was logged up to the checkpoint survives a kill
                metrics.flush()
            ckpt.save(cfg.checkpoint, model.step, model.named_tensors(),
                      {"seed": cfg.seed, "data": cfg.data, "batch": batch * ranks,
                       "order": order.state(), "epoch": order.epoch,
                       "source": os.path.basename(cfg.source)},
                      keep=cfg.keep)

    def log(rec: dict[str, Any]) -> None:
        if metrics is not None:
            metrics.write(json.dumps(rec) + "\n")

    dyn = None
    if cfg.mode == "dynamic":
        from nfc.runtime.dynamic.session import start_session

        dyn = start_session(cfg, model, log, planned_steps=total)
        threads = dyn.training_threads(threads, cfg.threads)
        model.set_num_threads(threads)
        bound = dyn.wrap(bound)
    try:
        while order.epoch < cfg.epochs and model.step < total:
            epoch_losses = []
            for idx in order.epoch_batches():
                if dist:
                    idx = dist.shard(idx)
                np.take(ds.x_train, idx, axis=0, out=xb)
                np.take(ds.y_train, idx, axis=0, out=yb)
                bound.rng[0], bound.rng[1] = cfg.seed, model.step
                t0 = time.perf_counter()
                out = bound()
                dt = time.perf_counter() - t0
                if dyn is not None:
                    dyn.after_step(model.step, dt, threads)
                if profiler is not None:
                    profiler.add(bound.fn.profile_events(), model.step)
                loss = float(out["loss"]) if "loss" in out else float("nan")
                if dist:
                    loss = dist.after_step(loss)
                losses.append(loss)
                epoch_losses.append(loss)
                times.append(dt)
                log({"event": "step", "step": model.step, "epoch": order.epoch, "loss": loss,
                     "step_ms": dt * 1e3})
                progress.update(model.step, order.epoch, loss,
                                1.0 / max(np.median(times[-50:]), 1e-9))
                if cfg.checkpoint and cfg.every and model.step % cfg.every == 0:
                    save()
                if cfg.step_delay:
                    time.sleep(cfg.step_delay)
                if model.step >= total:
                    break
            if cfg.evaluate:
                acc, tloss = evaluate(model, ds)
            rec = {"event": "epoch", "epoch": order.epoch, "step": model.step,
                   "train_loss": float(np.mean(epoch_losses)) if epoch_losses else None,
                   "test_accuracy": acc, "test_loss": tloss,
                   "elapsed_s": time.perf_counter() - t_start}
            log(rec)
            if cfg.progress:
                progress.write(_epoch_line(rec))
            if cfg.checkpoint and not cfg.every:
                save()
            if order.pos >= order.batches_per_epoch:
                order.next_epoch()
        save()
    finally:
        summary = dyn.stop() if dyn is not None else None
        if dist:
            dist.close()
        progress.close()
        if metrics is not None:
            metrics.close()
    step_s = float(np.median(times)) if times else 0.0
    if cfg.metrics:
        with open(cfg.metrics, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"event": "final", "step": model.step, "test_accuracy": acc,
                                 "test_loss": tloss, "step_ms": step_s * 1e3,
                                 "data": ds.name, "data_note": ds.note,
                                 "compile_s": opened.seconds, "cached": opened.cached,
                                 "threads": threads}
                                | ({"dynamic": vars(summary)} if summary else {})) + "\n")
    if cfg.plot:
        plot_metrics(cfg.metrics, losses, cfg.plot, resume_step)
    if profiler is not None and cfg.trace:
        profiler.write_trace(cfg.trace)
    return TrainResult(model.step, model.step / order.batches_per_epoch, losses, acc, tloss,
                       step_s, model, threads, profiler, ds.name, ds.note, opened.seconds,
                       opened.cached, dynamic=summary)


def _epoch_line(rec: Mapping[str, Any]) -> str:
    parts = []
    if rec.get("train_loss") is not None:
        parts.append(f"train loss {rec['train_loss']:.4f}")
    if rec.get("test_accuracy") is not None:
        parts.append(f"test accuracy {rec['test_accuracy'] * 100:.2f}%")
    if rec.get("test_loss") is not None:
        parts.append(f"test loss {rec['test_loss']:.4f}")
    parts.append(f"{rec['elapsed_s']:.2f} s")
    return f"epoch {rec['epoch']} (step {rec['step']}): " + ", ".join(parts)


def plot_metrics(metrics: str | None, losses: list[float], path: str,
                 resume_step: int | None = None) -> None:
    """A PNG of the training loss per step (and test accuracy per epoch when logged)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise TrainError("--plot needs matplotlib: pip install matplotlib") from None
    steps: list[int] = []
    vals: list[float] = []
    accs: list[tuple[int, float]] = []
    if metrics and os.path.exists(metrics):
        for line in Path(metrics).read_text().splitlines():
            rec = json.loads(line)
            if rec.get("event") == "step":
                steps.append(rec["step"])
                vals.append(rec["loss"])
            elif rec.get("event") == "epoch" and rec.get("test_accuracy") is not None:
                accs.append((rec["step"], rec["test_accuracy"]))
    else:
        start = resume_step or 0
        steps, vals = list(range(start, start + len(losses))), list(losses)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(steps, vals, lw=0.8, color="tab:blue", label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    ax.set_yscale("log")
    if accs:
        ax2 = ax.twinx()
        ax2.plot([s for s, _ in accs], [a for _, a in accs], "o-", color="tab:orange",
                 label="test accuracy")
        ax2.set_ylabel("test accuracy")
        ax2.set_ylim(0, 1)
    ax.set_title("nfc train")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
