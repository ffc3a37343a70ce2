"""Verify a candidate library against the running one: `python -m nfc.runtime.dynamic.verify`.

In a child process (a candidate that crashes or hangs kills or stalls only the child): load
both libraries, give each its own copy of a snapshot of the live training state and batch,
run one `train_step` of each with the same rng, and compare every result and every updated
tensor. Schedules change the order of summation, so results may differ by rounding, within
`tolerance` (relative to the largest magnitude of each tensor); a wrong schedule, a missing or
doubled block of terms, or another computation is off by far more.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from dataclasses import dataclass
from typing import Any

import numpy as np

#: Unit roundoff of f32, the dtype the CPU backend computes in.
EPS_F32 = 2.0 ** -24


def tolerance(max_terms: int) -> float:
    """Relative tolerance for results whose longest sum has `max_terms` terms: a reassociated
    sum of R terms moves a result by up to ~R ulps of its magnitude (in the worst case; the
    errors of a step's successive kernels add), so 8·eps·R, at least 1e-5."""
    return max(1e-5, 8.0 * EPS_F32 * max(1, max_terms))


def save_snapshot(path: str, model: Any, inputs: dict[str, np.ndarray], rng: np.ndarray) -> None:
    """The live state (every persistent tensor), one batch and the rng pair, as an .npz."""
    arrays = {f"t:{n}": a for n, a in model.tensors.items()}
    arrays.update({f"i:{n}": a for n, a in inputs.items()})
    arrays["rng"] = np.asarray(rng, np.int64)
    tmp = f"{path}.{os.getpid()}.tmp.npz"
    np.savez(tmp, **arrays)
    os.replace(tmp, path)


def _step(path: str, snap: Any, function: str) -> dict[str, np.ndarray]:
    from nfc.runtime.loader import load

    m = load(path)
    m.set_num_threads(1)
    m.load_state_dict({k[2:]: snap[k] for k in snap.files if k.startswith("t:")})
    fn = m.functions[function]
    feeds = {k[2:]: snap[k] for k in snap.files if k.startswith("i:")}
    out = fn(rng=tuple(int(v) for v in snap["rng"]), **feeds)
    res = {f"out:{k}": np.array(v) for k, v in out.items()}
    res.update({f"tensor:{k}": v.copy() for k, v in m.tensors.items()})
    return res


def compare(ref: dict[str, np.ndarray], got: dict[str, np.ndarray], rtol: float) -> str | None:
    """Why `got` is not `ref` within `rtol` (relative to each array's largest magnitude)."""
    for name, a in ref.items():
        b = got.get(name)
        if b is None or b.shape != a.shape:
            return f"{name}: missing or of another shape"
        if a.dtype.kind not in "fc":
            if not np.array_equal(a, b):
                return f"{name}: differs"
            continue
        fa, fb = np.isfinite(a), np.isfinite(b)
        if not np.array_equal(fa, fb):
            return f"{name}: non-finite values where the running library has none (or back)"
        if not fa.any():
            continue
        scale = float(np.max(np.abs(a[fa]))) or 1.0
        err = float(np.max(np.abs(a[fa].astype(np.float64) - b[fa].astype(np.float64))))
        if err > rtol * scale:
            return (f"{name}: off by {err:.3g} (allowed {rtol * scale:.3g}, "
                    f"{rtol:.2g} of its largest magnitude {scale:.3g})")
    return None


@dataclass(frozen=True)
class Verdict:
    ok: bool
    status: str
    """ok, wrong, failed (crashed or raised), timeout."""
    reason: str = ""


def verify_candidate(current: str, candidate: str, snapshot: str, *, rtol: float,
                     timeout: float = 120.0, function: str = "train_step") -> Verdict:
    """Run the check in a child process; never raises for what the candidate does."""
    cmd = [sys.executable, "-m", "nfc.runtime.dynamic.verify", "--current", current,
           "--candidate", candidate, "--snapshot", snapshot, "--rtol", repr(rtol),
           "--function", function]
    from nfc.runtime.tuning.measure import _child_env

    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout,
                              env=_child_env())
    except subprocess.TimeoutExpired:
        return Verdict(False, "timeout", f"no verdict within {timeout:g} s")
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        how = (f"killed by signal {-proc.returncode}" if proc.returncode < 0
               else f"exit code {proc.returncode}")
        tail = proc.stderr.strip().splitlines()[-1:] or [""]
        return Verdict(False, "failed", f"verifier {how}: {tail[0][:300]}")
    msg = json.loads(lines[-1])
    return Verdict(msg["status"] == "ok", msg["status"], msg.get("reason", ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m nfc.runtime.dynamic.verify")
    ap.add_argument("--current", required=True)
    ap.add_argument("--candidate", required=True)
    ap.add_argument("--snapshot", required=True)
    ap.add_argument("--rtol", type=float, required=True)
    ap.add_argument("--function", default="train_step")
    a = ap.parse_args(argv)
    snap = np.load(a.snapshot, allow_pickle=False)
    ref = _step(a.current, snap, a.function)
    try:
        got = _step(a.candidate, snap, a.function)
    except Exception as exc:  # noqa: BLE001 - any failure of the candidate is its verdict
        print(json.dumps({"status": "failed", "reason": f"{type(exc).__name__}: {exc}"}))
        return 0
    why = compare(ref, got, a.rtol)
    print(json.dumps({"status": "ok" if why is None else "wrong", "reason": why or ""}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

__all__ = ["Verdict", "compare", "save_snapshot", "tolerance", "verify_candidate"]
