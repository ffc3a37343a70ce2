"""`nfc run`: evaluate a compiled model on data, or describe it.

    nfc run model.so --data digits --checkpoint ckpt/     # accuracy with trained parameters
    nfc run model.so --data digits --seed 3               # freshly initialised parameters
    nfc run model.nf --data synthetic --set batch=32      # compiles first
    nfc run model.so --info                               # functions, tensors, target

Evaluation uses the model's `eval` function (else `forward`) on the test split, in batches of
the compiled size; the last batch is padded and the padding is not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

from nfc.cli import UsageError
from nfc.cli.pipeline_args import add_model_argument


def add_parser(subparsers: Any) -> None:
    """Register `nfc run`."""
    p = subparsers.add_parser("run", help="evaluate a compiled model", description=__doc__,
                              formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("file", help="a compiled .so, or a .nf model to compile")
    p.add_argument("--data", default="auto",
                   help="auto (what nfc train picks for the model), digits, mnist1d, text or "
                        "synthetic")
    p.add_argument("--resize", default="bilinear", choices=("bilinear", "nearest"),
                   help="how images are fitted to the model's input size")
    p.add_argument("--function", default=None, help="function to run (default eval/forward)")
    p.add_argument("--checkpoint", metavar="DIR|FILE.json",
                   help="parameters from a checkpoint (its directory: the latest)")
    p.add_argument("--seed", type=int, default=0, help="init seed when no checkpoint")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="K=V",
                   help="a model parameter, or opt.<name> for the optimizer, when compiling a "
                        "model file (repeatable)")
    p.add_argument("--threads", type=int, default=None, metavar="N",
                   help="threads of parallel loops (default: as nfc train picks them)")
    add_model_argument(p)
    p.add_argument("--info", action="store_true", help="describe the library and exit")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    p.set_defaults(func=run)


def _info(path: str, meta: dict[str, Any]) -> None:
    t = meta["target"]
    where = (f"CUDA {', '.join(t.get('archs', []))}" if t.get("kind") == "cuda" else
             f"{t.get('cpu')} ({len(t.get('features', []))} features)")
    print(f"{path}: model '{meta.get('model')}', nfc {meta.get('nfc_version')}, ABI "
          f"{meta['abi_version']}, {where}"
          + (", profiled" if meta.get("profile") else ""))
    if not meta["functions"]:
        print("  no functions")
    for name, fm in meta["functions"].items():
        ins = ", ".join(f"{a['name']}: {a['dtype']}{a['shape']} ({a['role']})"
                        for a in fm["args"] if a["role"] in ("input", "rng"))
        outs = ", ".join(r["name"] for r in fm["results"] if r["out"] is not None)
        upd = sum(1 for r in fm["results"] if r["inplace"])
        print(f"  {name}({ins}) -> ({outs})" + (f", {upd} in-place updates" if upd else "")
              + f"; {len(fm['kernels'])} kernels, arena {fm['arena_bytes']:,} B")
    for tm in meta["tensors"]:
        print(f"  {tm['role']:<9} {tm['name']}: {tm['dtype']}{tm['shape']} = {tm['init']}")


def _describe(args: argparse.Namespace) -> None:
    """`--info`: from the artifact's checked metadata alone; the library is not loaded, so
    none of its code runs (a model file is compiled first)."""
    from nfc.codegen.artifact.container import is_library_path
    from nfc.runtime.build import SettingError, compile_model
    from nfc.runtime.loader import read_metadata

    path = args.file
    if is_library_path(path):
        if args.settings:
            raise SettingError("--set applies when compiling; a .so is already compiled")
    else:
        path = compile_model(path, settings=args.settings, model=args.model).path
    _info(path, read_metadata(path))


def _function(model: Any, asked: str | None) -> str:
    """The function to evaluate: `asked`, else eval, else forward."""
    have = list(model.functions)
    if not have:
        raise UsageError(f"'{model.path}' has no functions (was it compiled from an empty "
                         "model?)")
    if asked is not None:
        if asked not in model.functions:
            raise UsageError(f"'{model.path}' has no function '{asked}' (it has: "
                             f"{', '.join(have)})")
        return asked
    name = next((f for f in ("eval", "forward") if f in model.functions), None)
    if name is None:
        raise UsageError(f"'{model.path}' has neither an eval nor a forward function (it has: "
                         f"{', '.join(have)}); choose one with --function")
    return name


def _load_checkpoint(model: Any, where: str) -> None:
    """Parameters and state from the checkpoint `where` (a JSON file, or a directory: its
    newest intact checkpoint, with a warning for each damaged one passed over). Optimizer
    state is loaded when the checkpoint has the model's (evaluation does not read it), so a
    checkpoint of another optimizer serves as well."""
    from nfc.runtime import checkpoint as ckpt

    named = model.named_tensors()  # a laid-out parameter by its parts' names
    expect = {n: (a.shape, a.dtype) for n, a in named.items()}
    optional = {n for n, s in model.named_specs().items() if s.role == "opt_state"}
    if os.path.isdir(where):
        found = ckpt.load_latest(where, expect, extra_ok=True, optional=optional)
        if found is None:
            raise UsageError(f"no checkpoint in '{where}'")
        tensors, info = found.tensors, found.info
    elif os.path.exists(where):
        tensors, info = ckpt.load(where, expect, extra_ok=True, optional=optional)
    else:
        raise UsageError(f"no such checkpoint file or directory: '{where}'")
    model.load_state_dict({n: tensors.get(n, a) for n, a in named.items()})
    seed = info.get("seed", 0)
    model.seed = seed if isinstance(seed, int) else 0


def run(args: argparse.Namespace) -> int:
    """Load (or compile), then describe or evaluate."""
    from nfc.runtime import adapters
    from nfc.runtime import checkpoint as ckpt
    from nfc.runtime.build import SettingError, load_model
    from nfc.runtime.data import DataError
    from nfc.runtime.loader import ArtifactError
    from nfc.runtime.train import default_threads, evaluate

    try:
        if args.info:
            _describe(args)
            return 0
        model = load_model(args.file, settings=args.settings, model=args.model)
        name = _function(model, args.function)
        model.set_num_threads(args.threads or default_threads(model.metadata, name))
        if args.checkpoint:
            _load_checkpoint(model, args.checkpoint)
        else:
            model.init(args.seed)
        ds = adapters.load_for(args.data, adapters.model_inputs(model.metadata, name),
                               resize=args.resize)
        t0 = time.perf_counter()
        acc, loss = evaluate(model, ds, name)
        dt = time.perf_counter() - t0
    except (ArtifactError, DataError, SettingError, ckpt.CheckpointError, ValueError) as exc:
        raise UsageError(str(exc)) from None
    n = 0 if ds.x_test is None else len(ds.x_test)
    result = {"data": ds.name, "function": name, "samples": n, "accuracy": acc,
              "loss": loss, "seconds": dt}
    if args.json:
        print(json.dumps(result))
    else:
        parts = [f"{n} test samples"]
        if acc is not None:
            parts.append(f"accuracy {acc * 100:.2f}%")
        if loss is not None:
            parts.append(f"loss {loss:.4f}")
        parts.append(f"{dt * 1e3:.1f} ms")
        print(f"{ds.note or ds.name} ({name}): " + ", ".join(parts))
    return 0
