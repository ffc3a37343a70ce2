"""Train-step time of one model under two build pipelines, interleaved, CPU clock.

    .venv/bin/python benchmarks/pipeline_ab.py examples/models/bert.nf \
        'im2col,training-functions,inline,canonicalize,cse,dce,fuse' \
        'im2col,training-functions,inline,canonicalize,cse,dce,parallel-fusion,fuse'

Both builds start from the same initial parameters and inputs (the first losses must agree);
steps run through `Function.bind` on one thread, alternating A and B in rounds so that other
load on the machine hits both; process CPU time (robust to other load on a shared machine).
Prints the medians and the ratio A/B (above 1: B is faster).
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from fusion_step import _once  # noqa: E402


def _build(source: str, pipeline: str):

    from nfc.runtime.build import compile_model
    from nfc.runtime.loader import load
    from nfc.runtime.train import synthetic_train_step

    model = load(compile_model(source, pipeline=pipeline).path)
    model.set_num_threads(1)
    bound = synthetic_train_step(model)
    return model, bound, len(model.train_step.meta["kernels"]), float(bound()["loss"])


def main(argv: list[str]) -> int:
    source, pa, pb = argv[:3]
    rounds = int(argv[3]) if len(argv) > 3 else 15
    builds = [_build(source, pa), _build(source, pb)]
    la, lb = builds[0][3], builds[1][3]
    assert abs(la - lb) <= 1e-4 * max(1.0, abs(la)), f"losses differ {la} {lb}"
    reps = max(1, int(0.2 / max(1e-6, _once(builds[0][1]))))
    times: list[list[float]] = [[], []]
    for _ in range(rounds):
        for n, (_, step, _, _) in enumerate(builds):
            t = time.process_time()
            for _ in range(reps):
                step()
            times[n].append((time.process_time() - t) / reps)
    ma, mb = statistics.median(times[0]) * 1e3, statistics.median(times[1]) * 1e3
    print(f"{source}: A {ma:.3f} ms ({builds[0][2]} kernels)  B {mb:.3f} ms "
          f"({builds[1][2]} kernels)  A/B {ma / mb:.3f}  (median of {rounds} rounds, CPU time)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
