"""Kernel identity and the persistent per-kernel object cache.

A model repeats kernels: the evaluation function repeats the forward pass, unrolled RNN steps
and repeated blocks repeat whole layers, and the backward pass of one layer looks like another's.
The artifact builder compiles each *structurally distinct* kernel once and calls it with
different buffers; `kernel_key` names a kernel by what decides its machine code:

- the kernel's structure (`structural_text`): input types, axes, reductions, bodies, with
  values renamed by position (`%in0`, `%t1`) and the attributes that only label an op
  (`LABEL_ATTRS`: the call site, the autodiff phase, the fusion record) left out;
- the schedule it is compiled with (`null`: the default schedule, which depends on the above
  and the target only);
- the target: triple, CPU name, feature string;
- the nfc version and `codegen_fingerprint()`: a hash of the source of every module that
  shapes the generated code (schedules, lowering, LLVM emission, the optimisation pipeline)
  and of the llvmlite/LLVM versions, so a changed compiler never reuses stale objects.

`ObjectCache` keeps one ELF object per key under `$NFC_CACHE_DIR/objects` (default
`~/.cache/nfc/objects`, a 0700 directory of 0600 files): `<key>.nfo`, a 48-byte header (magic
`NFCOBJ01`, the SHA-256 of the key and the object code, the code's length) and the raw object
code; data only (no pickle, nothing executed when reading). Like ccache's, every entry is
checked before use: `get` returns the object code only when the header matches the file, its
length and the key; a damaged entry (truncated, a flipped bit, copied under another key) is
deleted and counted, `report_damaged` warns once per build, and the kernel is compiled afresh.
The bytes checked are the bytes handed to the linker (never the file's later content). Writes
are atomic (nfc.fsutil: unique temporary name, fsync, rename); a hit refreshes the file's
modification time so `prune` removes the least recently used objects first.
`NFC_OBJECT_CACHE=0` turns the cache off; `NFC_OBJECT_CACHE_MB` bounds its size (default 1024).
The object of a kernel defines one hidden function, `kernel_symbol(key)`, so an object
compiled for one model links into any other that has the same kernel.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import struct
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from nfc import __version__
from nfc.codegen.cpu import CpuTarget
from nfc.codegen.lower import group_of
from nfc.fsutil import atomic_write, private_dir, remove_stale_temporaries
from nfc.ir import Call, ComputeOp, KernelOp, Value
from nfc.ops import plugin_fingerprint
from nfc.printer import format_attr_dict, format_expr

#: Op attributes that label an op for people (profiles, diagnostics, the fuse pass's record of
#: its estimates) and never change its code. Every other attribute is part of the key: an
#: attribute codegen may read one day can only cost a missed deduplication, never a wrong one.
LABEL_ATTRS = frozenset({"nf.callsite", "nf.phase", "nf.fusion"})
#: Bumped when the meaning of a key or the layout of the cache changes.
KEY_VERSION = "nfc-kernel-key-2"
#: Modules whose source decides the code of a kernel (part of `codegen_fingerprint`).
CODEGEN_MODULES = (
    "nfc.ir", "nfc.ir.types", "nfc.ir.values", "nfc.ir.expr", "nfc.ir.ops", "nfc.ir.block",
    "nfc.affine", "nfc.codegen.cpu", "nfc.codegen.jit", "nfc.codegen.loops",
    "nfc.codegen.lower", "nfc.codegen.lowering.axes", "nfc.codegen.lowering.tails",
    "nfc.codegen.lowering.packing", "nfc.codegen.lowering.reductions",
    "nfc.codegen.lowering.stage", "nfc.codegen.lowering.slices",
    "nfc.codegen.lowering.horizontal", "nfc.simplify",
    "nfc.simplify.rules", "nfc.simplify.pattern",
    "nfc.codegen.schedule", "nfc.codegen.space", "nfc.codegen.gemm_space", "nfc.codegen.native",
    "nfc.codegen.llvm.emitter", "nfc.codegen.llvm.exprs", "nfc.codegen.llvm.fold",
    "nfc.codegen.llvm.intrinsics", "nfc.codegen.llvm.render", "nfc.codegen.llvm.parallel",
    "nfc.codegen.llvm.bf16dot", "nfc.codegen.llvm.threadpool", "nfc.codegen.llvm.hoist",
    "nfc.codegen.artifact.kcache", "nfc.codegen.artifact.parallel",
    # the operator table: kernels are typed, folded and emitted by its rows
    "nfc.ops", "nfc.ops.lattice", "nfc.ops.table", "nfc.ops.registry", "nfc.ops.infer",
    "nfc.ops.numerics", "nfc.simplify.fold",
)
_ELF_MAGIC = b"\x7fELF"
#: Header of a cached object: magic, sha256(key, object code), length of the object code.
OBJ_HEADER = struct.Struct("<8s32sQ")
OBJ_MAGIC = b"NFCOBJ01"
#: File name suffix of cached objects (`.o` files of older versions are never read, only
#: pruned).
OBJ_SUFFIX = ".nfo"


@functools.cache
def codegen_fingerprint() -> str:
    """A hash of the code generator's source and of the llvmlite and LLVM versions."""
    import llvmlite
    import llvmlite.binding as llvm

    h = hashlib.sha256()
    h.update(f"{llvmlite.__version__} {llvm.llvm_version_info}".encode())
    for name in CODEGEN_MODULES:
        spec = importlib.util.find_spec(name)
        origin = spec.origin if spec is not None else None
        h.update(name.encode() + b"\0")
        if origin and os.path.exists(origin):
            h.update(Path(origin).read_bytes())
    return h.hexdigest()


def _attrs(attrs: Mapping[str, Any]) -> str:
    kept = {k: attrs[k] for k in sorted(attrs) if k not in LABEL_ATTRS}
    return format_attr_dict(kept) if kept else ""


def structural_text(op: ComputeOp | KernelOp) -> str:
    """The kernel's structure as text: equal for kernels that compile to the same code."""
    cops, outs, ins = group_of(op)
    names: dict[int, str] = {id(v): f"in{n}" for n, v in enumerate(ins)}
    names.update({id(c.result): f"t{n}" for n, c in enumerate(cops)})

    def name(v: Value) -> str:
        return "%" + names[id(v)]

    lines = ["in " + ", ".join(f"{name(v)}: {v.type}" for v in ins)]
    if isinstance(op, KernelOp):
        lines.append("kernel " + _attrs(op.attrs))
    for c in cops:
        text = f"{name(c.result)} = [{', '.join(str(a) for a in c.dims)}]"
        if c.reduce is not None:
            text += f" {c.reduce} [{', '.join(str(a) for a in c.raxes)}]"
        text += f" ({format_expr(c.body, name)}) {_attrs(c.attrs)} : {c.result.type}"
        lines.append(text)
    lines.append("out " + ", ".join(name(v) for v in outs))
    return "\n".join(lines)


def schedule_json(schedule: Any) -> str:
    """A schedule (object, dict or None) as canonical JSON."""
    if schedule is not None and hasattr(schedule, "to_dict"):
        schedule = schedule.to_dict()
    return json.dumps(schedule, sort_keys=True, default=str)


def target_text(target: CpuTarget) -> str:
    """What decides code besides the kernel: triple, CPU, features, function attributes, the
    LLVM pipeline options and the code generator's switches (`NFC_STRIDED_LOADS=0`,
    `NFC_HFUSE=0`)."""
    from nfc.codegen.jit import pipeline_options
    from nfc.codegen.llvm.exprs import strided_loads
    from nfc.codegen.lowering.horizontal import enabled as hfuse

    feats = ",".join(sorted(f for f in target.features.split(",") if f))
    return (f"{target.triple}|{target.cpu}|{feats}|{'|'.join(target.function_attributes)}|"
            f"{json.dumps(pipeline_options(), sort_keys=True)}"
            + ("" if strided_loads() else "|strided-loads=0") + ("" if hfuse() else "|hfuse=0"))


def kernel_key(op: ComputeOp | KernelOp, schedule: Any, target: CpuTarget, *,
               version: str | None = None, fingerprint: str | None = None) -> str:
    """The hex SHA-256 naming the object code of `op` compiled with `schedule` for `target`
    (`version`: the nfc version, default this one's)."""
    h = hashlib.sha256()
    for part in (KEY_VERSION, version or __version__, fingerprint or codegen_fingerprint(),
                 target_text(target),
                 schedule_json(schedule), structural_text(op)):
        h.update(part.encode())
        h.update(b"\0")
    plugins = plugin_fingerprint(e.fn for o in _computes(op) for e in o.body.walk()
                                 if isinstance(e, Call))
    if plugins:  # a plugin's intrinsic: its code decides the kernel's too
        h.update(plugins.encode())
    return h.hexdigest()


def _computes(op: ComputeOp | KernelOp) -> list[ComputeOp]:
    if isinstance(op, ComputeOp):
        return [op]
    return [o for o in op.body.walk() if isinstance(o, ComputeOp)]


def kernel_symbol(key: str) -> str:
    """The (hidden) symbol of the kernel with this key in every object and library."""
    return f"nfc_k_{key[:24]}"


def _object_digest(key: str, data: bytes) -> bytes:
    h = hashlib.sha256(key.encode())
    h.update(b"\0")
    h.update(data)
    return h.digest()


class ObjectCache:
    """Object files by kernel key in one directory (see the module docstring)."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = Path(root)
        self.damaged: list[str] = []
        """Entries found damaged (and deleted) since the last `report_damaged`."""

    @staticmethod
    def default() -> ObjectCache | None:
        """The cache under `$NFC_CACHE_DIR` (or ~/.cache/nfc); None when `NFC_OBJECT_CACHE`
        is 0/off."""
        if os.environ.get("NFC_OBJECT_CACHE", "1").strip().lower() in ("0", "off", "no",
                                                                        "false"):
            return None
        base = os.environ.get("NFC_CACHE_DIR") or os.path.join(Path.home(), ".cache", "nfc")
        return ObjectCache(Path(base) / "objects")

    def path(self, key: str) -> Path:
        """Where the object of `key` lives (whether or not it exists)."""
        return self.root / f"{key}{OBJ_SUFFIX}"

    def get(self, key: str) -> bytes | None:
        """The checked object code of `key`, or None (missing, unreadable or damaged: a
        damaged entry is deleted and recorded in `damaged`)."""
        p = self.path(key)
        try:
            data = p.read_bytes()
        except OSError:
            return None
        why = self._check(key, data)
        if why is not None:
            self.damaged.append(f"{p.name}: {why}")
            self.discard(key)
            return None
        with contextlib.suppress(OSError):
            os.utime(p)  # recently used: pruned last
        return data[OBJ_HEADER.size:]

    @staticmethod
    def _check(key: str, data: bytes) -> str | None:
        """Why `data` is not a valid entry for `key` (None when it is)."""
        if len(data) < OBJ_HEADER.size:
            return "truncated"
        magic, digest, length = OBJ_HEADER.unpack_from(data)
        if magic != OBJ_MAGIC:
            return "bad header"
        body = data[OBJ_HEADER.size:]
        if len(body) != length:
            return f"{len(body)} bytes of object code, the header says {length}"
        if _object_digest(key, body) != digest:
            return "hash mismatch"
        if not body.startswith(_ELF_MAGIC):
            return "not an object file"
        return None

    def put(self, key: str, data: bytes) -> None:
        """Store an object (atomically; errors are ignored: the cache is an optimisation)."""
        if not data.startswith(_ELF_MAGIC):
            return
        header = OBJ_HEADER.pack(OBJ_MAGIC, _object_digest(key, data), len(data))
        with contextlib.suppress(OSError):
            private_dir(self.root)
            atomic_write(self.path(key), header + data, 0o600)

    def discard(self, key: str) -> None:
        """Forget one object (e.g. one the linker refused)."""
        with contextlib.suppress(OSError):
            self.path(key).unlink()

    def report_damaged(self) -> int:
        """Warn (on stderr, once) about the damaged entries found since the last call and
        forget them; returns how many there were."""
        n = len(self.damaged)
        if n:
            first = self.damaged[0]
            more = f" and {n - 1} more" if n > 1 else ""
            print(f"nfc: warning: discarded {n} damaged cached kernel object(s) in "
                  f"'{self.root}' ({first}{more}); they are compiled again", file=sys.stderr)
            self.damaged.clear()
        return n

    def prune(self, max_bytes: int | None = None) -> int:
        """Delete the least recently used objects until the cache holds at most `max_bytes`
        (default `NFC_OBJECT_CACHE_MB` MiB, 1024), objects of older cache layouts, and
        temporary files of killed writers; returns how many objects were deleted."""
        if max_bytes is None:
            env = os.environ.get("NFC_OBJECT_CACHE_MB", "")
            max_bytes = (int(env) if env.isdigit() else 1024) << 20
        remove_stale_temporaries(self.root)
        entries = []
        removed = 0
        try:
            for e in os.scandir(self.root):
                if e.name.endswith(".o"):  # the layout before checksums: never read
                    with contextlib.suppress(OSError):
                        os.unlink(e.path)
                        removed += 1
                elif e.name.endswith(OBJ_SUFFIX):
                    with contextlib.suppress(OSError):
                        st = e.stat()
                        entries.append((st.st_mtime, st.st_size, e.path))
        except OSError:
            return removed
        total = sum(size for _, size, _ in entries)
        for _, size, path in sorted(entries):
            if total <= max_bytes:
                break
            try:
                os.unlink(path)
                total -= size
                removed += 1
            except OSError:
                pass
        return removed
