"""The artifact file: the shared library, then its metadata and a checksum of both.

    +---------------------------+-----------------------+---------- footer, 64 bytes ----------+
    | ELF image (as `cc` wrote) | metadata JSON (UTF-8) | NFCMETA1 elf_len meta_len sha256   |
    |                           |                       |                          NFCART01  |
    +---------------------------+-----------------------+------------------------------------+

`elf_len` and `meta_len` are little-endian u64; `sha256` is the digest of the ELF image, the
metadata and the two lengths (as packed). The dynamic loader maps only the segments the ELF's
program headers name, which lie inside the image, so it never reads the bytes after it: the
file is an ordinary shared library (`dlopen`, `cc model.so`, `nm` and `objdump` work as before,
tested). The metadata is the same JSON that `nfc_metadata()` returns.

Readers (`read_artifact`) take the footer and the metadata with plain file reads (nothing of the
library runs) and check the hash before anyone maps the library; the runtime then maps the very
bytes it checked (nfc.runtime.loader). The hash detects damage (a truncated copy, a flipped bit,
a half-written file), not forgery: anyone who can write the file can also recompute it.

A CUDA artifact (`nfc compile --target cuda -o model.so`, nfc.codegen.cuda.artifact) has the
same footer and hash over a data payload instead of the ELF image: the payload starts with
`CUDA_MAGIC` (never `\x7fELF`), `Sealed.kind` tells the two apart, and readers check it the
same way before using any of it.

`file_kind(path)` tells an artifact, another ELF file, other binary data and text apart by their
first and last bytes, so that the CLI never parses a library as `.nf` source.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Magic at the start of the footer.
HEAD_MAGIC = b"NFCMETA1"
#: Magic in the last 8 bytes of every artifact (format version 1).
TAIL_MAGIC = b"NFCART01"
#: head magic, ELF length, metadata length, sha256, tail magic.
FOOTER = struct.Struct("<8sQQ32s8s")
ELF_MAGIC = b"\x7fELF"
#: First bytes of the payload of a CUDA artifact (nfc.codegen.cuda.artifact).
CUDA_MAGIC = b"NFCGPU01"
#: A symbol every nfc library exports: an ELF file holding it but no footer is a damaged
#: artifact (most likely cut short), not a foreign library.
_MARKER = b"nfc_abi_version"
#: Bytes read from the start of a file to tell text from binary data.
_SNIFF_BYTES = 8192


class ArtifactFileError(Exception):
    """A file that is not a usable artifact; `str()` is the message for the user."""


class NotAnArtifact(ArtifactFileError):
    """The file was never an nfc artifact (another library, text, random bytes)."""


class DamagedArtifact(ArtifactFileError):
    """The file was an nfc artifact but is truncated or damaged."""


def metadata_bytes(metadata: Mapping[str, Any]) -> bytes:
    """The canonical JSON of the metadata (what the footer and `nfc_metadata()` hold)."""
    return json.dumps(metadata, sort_keys=True).encode()


def _digest(elf: bytes, meta: bytes) -> bytes:
    h = hashlib.sha256()
    h.update(elf)
    h.update(meta)
    h.update(struct.pack("<QQ", len(elf), len(meta)))
    return h.digest()


def seal(elf: bytes, metadata: Mapping[str, Any]) -> bytes:
    """The artifact file of a linked library `elf` (or a CUDA payload starting with
    CUDA_MAGIC) with `metadata`."""
    if not elf.startswith((ELF_MAGIC, CUDA_MAGIC)):
        raise ValueError("not an ELF image or a CUDA payload")
    meta = metadata_bytes(metadata)
    return b"".join((elf, meta, FOOTER.pack(HEAD_MAGIC, len(elf), len(meta),
                                            _digest(elf, meta), TAIL_MAGIC)))


def default_mode(executable: bool = True) -> int:
    """Permission bits a new file gets from this process's umask (what `cc` would give a
    library: 0o777 & ~umask; 0o666 & ~umask for data)."""
    umask = 0o022
    try:
        with open("/proc/self/status", encoding="ascii") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    umask = int(line.split()[1], 8)
                    break
    except (OSError, ValueError):
        pass
    return (0o777 if executable else 0o666) & ~umask


@dataclass(frozen=True)
class Sealed:
    """A checked artifact file."""

    elf: bytes
    """The shared library (the bytes to map)."""
    metadata: dict[str, Any]
    digest: str
    """Hex SHA-256 from the footer (checked)."""
    data: bytes
    """The whole file as read."""

    @property
    def kind(self) -> str:
        """`elf` (a shared library for the CPU) or `cuda` (a CUDA payload)."""
        return "cuda" if self.elf.startswith(CUDA_MAGIC) else "elf"


def unseal(data: bytes, name: str) -> Sealed:
    """Check the bytes of an artifact file (`name` for messages); raises NotAnArtifact or
    DamagedArtifact."""
    what = f"'{name}'"
    if len(data) < FOOTER.size or data[-len(TAIL_MAGIC):] != TAIL_MAGIC:
        if not data:
            raise NotAnArtifact(f"{what} is not an nfc artifact (the file is empty)")
        if data.startswith(ELF_MAGIC):
            extent = elf_extent(data)
            if extent is None or extent > len(data):
                raise DamagedArtifact(f"{what} is truncated or damaged (an ELF file shorter "
                                      "than its headers say, without the nfc trailer)")
            if _MARKER in data:
                raise DamagedArtifact(f"{what} is truncated or damaged (the nfc trailer at "
                                      "its end is missing); recompile it with `nfc compile`")
            raise NotAnArtifact(f"{what} is not an nfc artifact (an ELF file without nfc "
                                "metadata)")
        if data.startswith(CUDA_MAGIC):
            raise DamagedArtifact(f"{what} is truncated or damaged (a CUDA artifact without "
                                  "the nfc trailer at its end); recompile it with `nfc "
                                  "compile --target cuda`")
        kind = "a text file" if _is_text(data[:_SNIFF_BYTES]) else "not an ELF library"
        raise NotAnArtifact(f"{what} is not an nfc artifact ({kind})")
    head, elf_len, meta_len, digest, _ = FOOTER.unpack_from(data, len(data) - FOOTER.size)
    if head != HEAD_MAGIC or elf_len + meta_len + FOOTER.size != len(data):
        raise DamagedArtifact(f"{what} is truncated or damaged (its trailer does not match "
                              f"its size of {len(data):,} bytes)")
    elf = data[:elf_len]
    meta = data[elf_len:elf_len + meta_len]
    if _digest(elf, meta) != digest:
        raise DamagedArtifact(f"{what} is truncated or damaged (hash mismatch)")
    if not elf.startswith((ELF_MAGIC, CUDA_MAGIC)):
        raise NotAnArtifact(f"{what} is not an nfc artifact (no ELF image)")
    try:
        parsed = json.loads(meta.decode())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DamagedArtifact(f"{what} has unreadable metadata: {exc}") from None
    if not isinstance(parsed, dict):
        raise DamagedArtifact(f"{what} has unreadable metadata (not a JSON object)")
    return Sealed(elf, parsed, digest.hex(), data)


def elf_extent(data: bytes) -> int | None:
    """The least size an ELF file with this header has: past its program and section header
    tables (None when the header itself is cut off or unreadable)."""
    if len(data) < 16 or data[4] not in (1, 2) or data[5] not in (1, 2):
        return None
    end = "<" if data[5] == 1 else ">"
    fmt = end + ("HHIQQQIHHHHHH" if data[4] == 2 else "HHIIIIIHHHHHH")
    try:
        (_, _, _, _, phoff, shoff, _, ehsize, phentsize, phnum, shentsize,
         shnum, _) = struct.unpack_from(fmt, data, 16)
    except struct.error:
        return None
    return max(ehsize, phoff + phentsize * phnum, shoff + shentsize * shnum)


def read_artifact(path: str | os.PathLike[str]) -> Sealed:
    """Read and check an artifact file (see `unseal`); OSError when it cannot be read."""
    return unseal(Path(path).read_bytes(), os.fspath(path))


def _is_text(head: bytes) -> bool:
    if b"\0" in head:
        return False
    try:
        head.decode("utf-8")
    except UnicodeDecodeError as exc:
        # a character cut by the end of the sniff window is no evidence of binary data
        return len(head) == _SNIFF_BYTES and exc.start >= len(head) - 3
    return True


def file_kind(path: str | os.PathLike[str]) -> str:
    """"artifact" (ends with the nfc footer, checked or not), "elf" (another ELF file, or an
    artifact that lost its footer), "binary" (other non-text data) or "text". OSError when
    the file cannot be read."""
    with open(path, "rb") as fh:
        head = fh.read(_SNIFF_BYTES)
        size = fh.seek(0, os.SEEK_END)
        tail = b""
        if size >= FOOTER.size:
            fh.seek(size - len(TAIL_MAGIC))
            tail = fh.read(len(TAIL_MAGIC))
    if tail == TAIL_MAGIC:
        return "artifact"
    if head.startswith(ELF_MAGIC):
        return "elf"
    return "text" if _is_text(head) else "binary"


def is_library_path(path: str | os.PathLike[str]) -> bool:
    """Whether `path` names a compiled library rather than a model source: a `.so` name, or
    content that is an artifact or an ELF file. A missing or unreadable file counts as a
    library only by its name."""
    if os.fspath(path).endswith(".so"):
        return True
    try:
        return file_kind(path) in ("artifact", "elf")
    except OSError:
        return False
