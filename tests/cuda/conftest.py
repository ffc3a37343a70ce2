"""CUDA tests compile into a private cache directory per session, never the user's."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _private_cuda_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "nfc-cache"))
