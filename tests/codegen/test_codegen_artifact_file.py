# ruff: noqa: E501
"""The artifact file (nfc.codegen.artifact.container): a shared library sealed with its
metadata and a SHA-256; what readers say about foreign, truncated and damaged files; the
entries' own arena (heap, so arenas past 2 GiB link) and the static-data limit."""

from __future__ import annotations

import ctypes
import json
import subprocess

import numpy as np
import pytest

from nfc.codegen.artifact import assemble as artifact_build
from nfc.codegen.artifact import build_artifact
from nfc.codegen.artifact.container import (
    FOOTER,
    DamagedArtifact,
    NotAnArtifact,
    file_kind,
    is_library_path,
    read_artifact,
    seal,
    unseal,
)
from nfc.codegen.native import find_cc
from nfc.diagnostics import CompileError
from nfc.irparser import parse_module

SMALL = """
nf.module @small {
  nf.func @step(%x: tensor<8x16xf32> {nf.role = "input"}, %w: tensor<16x4xf32> {nf.role = "param"}) -> (tensor<8x4xf32>) attributes {nf.results = ["y"]} {
    %h = nf.compute [n: 8, m: 4] sum [k: 16] (%x[n, k] * %w[k, m]) : tensor<8x4xf32>
    %y = nf.compute [n: 8, m: 4] (tanh(%h[n, m])) : tensor<8x4xf32>
    nf.return %y : tensor<8x4xf32>
  }
}
"""

# Two functions whose intermediates take 3 GiB each: with static arenas in .bss the second
# one was out of reach of 32-bit PC-relative offsets ("relocation truncated to fit").
N_BIG = 805306368


def _big_func(name: str) -> str:
    t = f"tensor<{N_BIG}xf32>"
    return f"""
  nf.func @{name}(%x: {t} {{nf.role = "input"}}) -> ({t}) attributes {{nf.results = ["y"]}} {{
    %a = nf.compute [n: {N_BIG}] (exp(%x[n])) : {t}
    %y = nf.compute [n: {N_BIG}] (%a[n] * 2.0) : {t}
    nf.return %y : {t}
  }}"""


BIG = "nf.module @big {" + _big_func("f") + _big_func("g") + "\n}\n"


@pytest.fixture(scope="module")
def small_lib(tmp_path_factory):
    """A built artifact of SMALL (path), with a private object cache."""
    d = tmp_path_factory.mktemp("small")
    mp = pytest.MonkeyPatch()
    mp.setenv("NFC_CACHE_DIR", str(d / "cache"))
    try:
        path = build_artifact(parse_module(SMALL)).write_shared(str(d / "small.so"))
    finally:
        mp.undo()
    return path


def test_sealed_file_is_an_ordinary_library_with_checked_metadata(small_lib):
    sealed = read_artifact(small_lib)
    data = sealed.data
    assert data.startswith(sealed.elf) and data.endswith(b"NFCART01")
    assert len(data) == len(sealed.elf) + len(json.dumps(sealed.metadata, sort_keys=True)) + FOOTER.size
    assert sealed.metadata["model"] == "small" and "step" in sealed.metadata["functions"]
    # the dynamic loader ignores the bytes after the ELF image: dlopen the file as it is
    lib = ctypes.CDLL(small_lib)
    lib.nfc_metadata.restype = ctypes.c_char_p
    assert json.loads(lib.nfc_metadata()) == sealed.metadata  # the same JSON, both ways
    assert lib.nfc_abi_version() == 1
    # binutils read it too
    nm = subprocess.run(["nm", "-D", small_lib], capture_output=True, text=True)
    if nm.returncode == 0:
        assert "nfc_step" in nm.stdout
    assert file_kind(small_lib) == "artifact" and is_library_path(small_lib)


def test_foreign_truncated_and_damaged_files_are_told_apart(small_lib, tmp_path):
    sealed = read_artifact(small_lib)
    data = sealed.data
    n_elf = len(sealed.elf)

    def verdict(blob: bytes) -> tuple[type, str]:
        with pytest.raises((NotAnArtifact, DamagedArtifact)) as info:
            unseal(blob, "x.so")
        return info.type, str(info.value)

    assert verdict(b"") == (NotAnArtifact, "'x.so' is not an nfc artifact (the file is empty)")
    assert verdict(b"model tiny() {}\n")[1].endswith("(a text file)")
    assert verdict(np.random.default_rng(0).bytes(4096))[1].endswith("(not an ELF library)")
    # another library: an ELF file without the trailer or nfc's symbols
    src = tmp_path / "other.c"
    src.write_text("int other(void) { return 1; }\n")
    other = tmp_path / "libother.so"
    subprocess.run([find_cc(), "-shared", "-fPIC", "-o", str(other), str(src)], check=True)
    assert verdict(other.read_bytes()) == (
        NotAnArtifact, "'x.so' is not an nfc artifact (an ELF file without nfc metadata)")
    assert file_kind(other) == "elf" and file_kind(src) == "text"
    # truncated anywhere: inside the ELF image, the metadata or the footer
    for cut in (4, 64, n_elf // 2, n_elf, n_elf + 10, len(data) - FOOTER.size, len(data) - 1):
        kind, msg = verdict(data[:cut])
        assert kind is DamagedArtifact and "is truncated or damaged" in msg, (cut, msg)
    # one flipped bit anywhere: the ELF header, the code, the metadata, each footer field
    for pos in (0, 17, n_elf // 2, n_elf + 3, len(data) - 60, len(data) - 50, len(data) - 20,
                len(data) - 1):
        blob = bytearray(data)
        blob[pos] ^= 0x04
        kind, msg = verdict(bytes(blob))
        assert kind is DamagedArtifact and "is truncated or damaged" in msg, (pos, msg)
    assert "hash mismatch" in verdict(data[:100] + bytes([data[100] ^ 1]) + data[101:])[1]
    # appended bytes: the footer is no longer at the end
    assert verdict(data + b"\0")[0] is DamagedArtifact
    # a valid seal round-trips; a non-ELF image is refused when sealing
    assert unseal(seal(sealed.elf, {"a": 1}), "y").metadata == {"a": 1}
    with pytest.raises(ValueError):
        seal(b"not elf", {})


def test_entries_allocate_their_own_arena_when_given_none(small_lib):
    from nfc.runtime.loader import load

    m = load(small_lib)
    rng = np.random.default_rng(1)
    m.tensors["w"][...] = rng.standard_normal((16, 4)).astype(np.float32)
    x = rng.standard_normal((8, 16)).astype(np.float32)
    want = m.functions["step"](x=x)["y"]
    fn = m.functions["step"]
    y = np.zeros((8, 4), np.float32)
    argv = (ctypes.c_void_p * 2)(x.ctypes.data, m.tensors["w"].ctypes.data)
    outv = (ctypes.c_void_p * 1)(y.ctypes.data)
    for _ in range(2):  # the first call allocates, the second reuses
        y[...] = 0
        fn._fn(ctypes.addressof(argv), ctypes.addressof(outv), None)
        np.testing.assert_array_equal(y, want)


def test_arenas_past_2_gib_link(tmp_path, monkeypatch):
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))
    art = build_artifact(parse_module(BIG), split=1)
    path = art.write_shared(str(tmp_path / "big.so"))
    meta = read_artifact(path).metadata
    assert [meta["functions"][f]["arena_bytes"] for f in "fg"] == [3 * 2**30] * 2
    lib = ctypes.CDLL(path)  # loads; running it would take 9 GiB
    lib.nfc_g_arena_bytes.restype = ctypes.c_int64
    assert lib.nfc_g_arena_bytes() == 3 * 2**30


def test_static_data_past_the_limit_is_a_clear_error(monkeypatch):
    monkeypatch.setattr(artifact_build, "STATIC_DATA_LIMIT", 1000)
    with pytest.raises(CompileError) as info:
        build_artifact(parse_module(SMALL))
    msg = str(info.value.diagnostics[0].message)
    assert "static data" in msg and "more than the limit of 1,000" in msg
