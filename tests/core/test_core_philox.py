"""Philox-4x32-10 (nfc.philox) against the Random123 known-answer vectors."""

from __future__ import annotations

import numpy as np
import pytest

from nfc.philox import philox4x32, philox_bits, philox_uniform

F = 0xFFFFFFFF
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((F, F, F, F), (F, F), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


@pytest.mark.parametrize(("ctr", "key", "want"), KAT)
def test_known_answers(ctr, key, want):
    assert tuple(int(x) for x in philox4x32(ctr, key)) == want


def test_vectorised_matches_scalar():
    ctr = (np.array([0, F, 0x243F6A88]), np.array([0, F, 0x85A308D3]),
           np.array([0, F, 0x13198A2E]), np.array([0, F, 0x03707344]))
    key = (np.array([0, F, 0xA4093822]), np.array([0, F, 0x299F31D0]))
    words = philox4x32(ctr, key)
    for lane, (_, _, want) in enumerate(KAT):
        assert tuple(int(w[lane]) for w in words) == want


def test_int64_mapping_is_the_documented_one():
    # key = k1:k0, counter = c1:c0 with c2 = c3 = 0; two's complement for negatives
    key = np.int64(-2)  # 0xFFFFFFFF_FFFFFFFE
    counter = np.int64((7 << 32) | 5)
    want = philox4x32((5, 7, 0, 0), (0xFFFFFFFE, 0xFFFFFFFF))[0]
    assert int(philox_bits(key, counter)) == int(want)
    assert float(philox_uniform(key, counter)) == int(want) * 2.0 ** -32
    assert int(philox_bits(0, 0)) == 0x6627E8D5


def test_uniform_is_deterministic_in_range_and_uniform():
    ctr = np.arange(200_000, dtype=np.int64)
    u = philox_uniform(np.int64(42), ctr)
    assert u.dtype == np.float64 and u.shape == ctr.shape
    assert np.array_equal(u, philox_uniform(np.int64(42), ctr))
    assert u.min() >= 0.0 and u.max() < 1.0
    assert abs(u.mean() - 0.5) < 0.005 and abs(u.var() - 1 / 12) < 0.002
    hist = np.bincount((u * 10).astype(int), minlength=10)
    assert hist.min() > 19_000
    assert not np.array_equal(u[:100], philox_uniform(np.int64(43), ctr[:100]))
    # broadcasting of key against counter
    grid = philox_uniform(np.arange(3)[:, None], np.arange(4)[None, :])
    assert grid.shape == (3, 4) and len(np.unique(grid)) == 12
