"""Philox-4x32-10, the counter-based random number generator of the `philox` intrinsic.

Salmon et al., "Parallel random numbers: as easy as 1, 2, 3" (SC 2011), as in Random123:
a 128-bit counter (four 32-bit words c0..c3) and a 64-bit key (k0, k1) go through 10 rounds

    hi0:lo0 = 0xD2511F53 * c0          (32 x 32 -> 64-bit products)
    hi1:lo1 = 0xCD9E8D57 * c2
    (c0, c1, c2, c3) = (hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0)

with the key bumped by (0x9E3779B9, 0xBB67AE85) (mod 2**32) before every round but the first.

The intrinsic `philox(key, counter)` maps its two int64 arguments to the generator's input in
the simplest way, which the LLVM and CUDA backends implement identically:

    k0 = key & 0xFFFFFFFF          k1 = (key >> 32) & 0xFFFFFFFF      (two's complement)
    c0 = counter & 0xFFFFFFFF      c1 = (counter >> 32) & 0xFFFFFFFF   c2 = c3 = 0

and returns the first output word x0 scaled to [0, 1): `x0 * 2**-32`, computed in float64 (it
is exact there). A result of a narrower type is that float64 rounded to nearest, so in f32 a
value within 2**-25 of 1 rounds up to 1.0 (probability 2**-25 per draw).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

_MASK = np.uint64(0xFFFFFFFF)
_M0 = np.uint64(0xD2511F53)
_M1 = np.uint64(0xCD9E8D57)
_W0 = np.uint64(0x9E3779B9)
_W1 = np.uint64(0xBB67AE85)
_SHIFT = np.uint64(32)

ROUNDS = 10


def philox4x32(counter: tuple[ArrayLike, ArrayLike, ArrayLike, ArrayLike],
               key: tuple[ArrayLike, ArrayLike], rounds: int = ROUNDS
               ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The four 32-bit output words (as uint64 arrays) for counter words and key words.

    Arguments broadcast against each other; each word must lie in [0, 2**32).
    """
    c0, c1, c2, c3 = (np.asarray(c, dtype=np.uint64) for c in counter)
    k0, k1 = (np.asarray(k, dtype=np.uint64) for k in key)
    for r in range(rounds):
        if r:
            k0 = (k0 + _W0) & _MASK
            k1 = (k1 + _W1) & _MASK
        # a 32x32 product fits in 64 bits, so uint64 arithmetic is exact
        p0 = _M0 * c0
        p1 = _M1 * c2
        c0, c1, c2, c3 = ((p1 >> _SHIFT) ^ c1 ^ k0, p1 & _MASK,
                          (p0 >> _SHIFT) ^ c3 ^ k1, p0 & _MASK)
    return c0, c1, c2, c3


def _words(x: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Low and high 32-bit words of int64 values (two's complement)."""
    u = np.asarray(x, dtype=np.int64).astype(np.uint64)
    return u & _MASK, u >> _SHIFT


def philox_bits(key: ArrayLike, counter: ArrayLike) -> np.ndarray:
    """The first 32-bit output word (uint64 array) for int64 keys and counters."""
    k0, k1 = _words(key)
    c0, c1 = _words(counter)
    zero = np.zeros((), dtype=np.uint64)
    return philox4x32((c0, c1, zero, zero), (k0, k1))[0]


def philox_uniform(key: ArrayLike, counter: ArrayLike) -> np.ndarray:
    """A float64 array in [0, 1): `philox_bits(key, counter) * 2**-32`, broadcast shape."""
    return philox_bits(key, counter).astype(np.float64) * (2.0 ** -32)
