"""Artifacts are checked before any of their code runs: foreign libraries (with constructors),
libraries named like anything, artifacts without functions, files changed after loading, the
private library cache, and concurrent compiles writing one output."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from runtime_lib import ROOT

from nfc.cli import main
from nfc.codegen.artifact.container import (
    ArtifactFileError,
    read_artifact,
    seal,
)
from nfc.codegen.native import find_cc

TINY = str(ROOT / "tests" / "runtime" / "models" / "tiny.nf")
LIBM = "/lib/x86_64-linux-gnu/libm.so.6"
#: A library whose constructor leaves a mark: nfc must never run it while checking it.
EVIL_C = r"""
#include <stdio.h>
#include <stdlib.h>
__attribute__((constructor)) static void mark(void) {
  const char *p = getenv("NFC_TEST_MARK");
  if (p) { FILE *f = fopen(p, "w"); if (f) { fputs("ran", f); fclose(f); } }
}
int other(void) { return 1; }
"""


def _nfc(*args: str, env: dict[str, str] | None = None, timeout: float = 120
         ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "nfc", *args], capture_output=True,
                          text=True, timeout=timeout, env=env)


@pytest.fixture(scope="module")
def cache_env(tmp_path_factory):
    """Environment of nfc subprocesses: a private cache, one compile process."""
    d = tmp_path_factory.mktemp("cache")
    return {**os.environ, "NFC_CACHE_DIR": str(d), "NFC_COMPILE_JOBS": "1"}


@pytest.fixture(scope="module")
def tiny_so(tmp_path_factory, cache_env):
    out = tmp_path_factory.mktemp("tiny") / "tiny.so"
    res = _nfc("compile", TINY, "-o", str(out), env=cache_env)
    assert res.returncode == 0, res.stderr
    return out


def test_foreign_library_constructors_never_run(tmp_path, capsys, monkeypatch):
    src = tmp_path / "evil.c"
    src.write_text(EVIL_C)
    evil = tmp_path / "evil.so"
    subprocess.run([find_cc(), "-shared", "-fPIC", "-o", str(evil), str(src)], check=True)
    mark = tmp_path / "mark"
    monkeypatch.setenv("NFC_TEST_MARK", str(mark))
    for argv in (["run", str(evil), "--info"], ["run", str(evil)],
                 ["compile", str(evil), "--emit=header"], ["train", str(evil), "--quiet"]):
        assert main(argv) == 1, argv
        err = capsys.readouterr().err
        assert f"'{evil}' is not an nfc artifact (an ELF file without nfc metadata)" in err
        assert not mark.exists(), argv
    # sealed like an artifact: --info and the header read the metadata and load nothing
    sealed = tmp_path / "sealed.so"
    meta = {"abi_version": 1, "model": "evil", "nfc_version": "0", "functions": {},
            "tensors": [], "target": {"cpu": "x", "features": []},
            "init": {"generator": "g: x"}}
    sealed.write_bytes(seal(evil.read_bytes(), meta))
    assert main(["run", str(sealed), "--info"]) == 0
    assert "no functions" in capsys.readouterr().out
    assert main(["compile", str(sealed), "--emit=header", "-o", str(tmp_path / "e.h")]) == 0
    assert not mark.exists()


def test_libraries_are_recognised_by_content_not_name(tiny_so, tmp_path, capsys):
    if os.path.exists(LIBM):
        assert main(["run", LIBM, "--data", "synthetic"]) == 1
        assert "is not an nfc artifact" in capsys.readouterr().err
    renamed = tmp_path / "model.bin"
    shutil.copyfile(tiny_so, renamed)
    assert main(["run", str(renamed), "--data", "synthetic", "--json"]) == 0
    assert '"accuracy"' in capsys.readouterr().out
    noise = tmp_path / "noise.nf"
    noise.write_bytes(bytes(range(256)) * 8)
    assert main(["run", str(noise)]) == 1
    assert "is neither an nfc artifact nor a model file (binary data)" in capsys.readouterr().err
    text = tmp_path / "notes.so"
    text.write_text("not a library\n")
    assert main(["run", str(text), "--info"]) == 1
    assert "is not an nfc artifact (a text file)" in capsys.readouterr().err


def test_artifact_without_functions_and_unknown_function(tiny_so, tmp_path, capsys,
                                                         monkeypatch):
    from nfc.codegen.artifact import build_artifact
    from nfc.irparser import parse_module

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))
    empty = build_artifact(parse_module("nf.module @empty {\n}\n")).write_shared(
        str(tmp_path / "empty.so"))
    assert main(["run", empty]) == 1
    assert f"'{empty}' has no functions" in capsys.readouterr().err
    assert main(["run", empty, "--info"]) == 0
    assert "no functions" in capsys.readouterr().out
    assert main(["run", str(tiny_so), "--function", "nope"]) == 1
    err = capsys.readouterr().err
    assert "has no function 'nope' (it has: " in err and "train_step" in err


def test_a_loaded_library_is_immune_to_later_changes_of_its_file(tiny_so, tmp_path):
    """The library is mapped from a private copy of the checked bytes: truncating the file
    in place after loading it (which killed the process with SIGBUS) changes nothing."""
    victim = tmp_path / "victim.so"
    shutil.copyfile(tiny_so, victim)
    script = f"""
import numpy as np, nfc
m = nfc.load({str(victim)!r}); m.init(0)
x = np.ones((16, 64), np.float32); y = np.zeros(16, np.int32)
before = float(m.train_step(x=x, y=y)["loss"])
with open({str(victim)!r}, "r+b") as f:
    f.truncate(100)
m.init(0)
after = float(m.train_step(x=x, y=y)["loss"])
print(before == after)
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert res.returncode == 0 and res.stdout.strip() == "True", (res.returncode, res.stderr)


def test_library_cache_is_private_checked_and_rebuilt_when_damaged(tmp_path, monkeypatch,
                                                                   capsys):
    from nfc.runtime.build import compile_model

    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "c"))
    first = compile_model(TINY, settings=("batch=4",))
    assert not first.cached
    path = Path(first.path)
    for d in (path.parent, tmp_path / "c" / "objects"):
        assert d.stat().st_mode & 0o777 == 0o700, d
        for f in d.iterdir():
            assert f.stat().st_mode & 0o777 == 0o600, f
    good = path.read_bytes()
    assert compile_model(TINY, settings=("batch=4",)).cached
    for damage in (good[: len(good) // 2], good[:-1] + bytes([good[-1] ^ 1]),
                   good[:200] + bytes([good[200] ^ 0x80]) + good[201:]):
        path.write_bytes(damage)
        again = compile_model(TINY, settings=("batch=4",))
        assert not again.cached and again.path == str(path)
        assert "warning: cached library unusable" in capsys.readouterr().err
        assert read_artifact(path).data == good  # rebuilt: the same bytes


def _batch(sealed) -> int:
    """The batch size an artifact of the tiny model was compiled for."""
    return sealed.metadata["functions"]["train_step"]["args"][0]["shape"][0]


def test_concurrent_compiles_to_one_output_leave_one_complete_artifact(tmp_path, cache_env):
    """8 processes compile two models (of other sizes) to the same file at once: every one
    succeeds, and the file is at every moment missing or one complete artifact (its hash
    verifies) of one of the two models. (Digests are not compared with separate builds:
    other work on the code generator's sources changes kernel symbols between builds.)"""
    models = {16: [TINY], 4: [TINY, "--set", "batch=4", "--no-fuse"]}
    out = tmp_path / "same.so"
    seen: list[int | str] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            try:
                seen.append(_batch(read_artifact(out)))
            except FileNotFoundError:
                pass
            except ArtifactFileError as exc:  # half a file: the bug this test is about
                seen.append(f"bad: {exc}")
            time.sleep(0.002)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        procs = [subprocess.Popen([sys.executable, "-m", "nfc", "compile", *argv, "-o", str(out)],
                                  env=cache_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True) for argv in [*models.values()] * 4]
        results = [(p.wait(timeout=300), p.stderr.read()) for p in procs]
        for p in procs:
            p.stdout.close()
            p.stderr.close()
    finally:
        stop.set()
        watcher.join()
    assert all(rc == 0 for rc, _ in results), results
    seen.append(_batch(read_artifact(out)))  # the final file, whatever the watcher saw
    assert [s for s in seen if s not in models] == []
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".nfctmp")]
