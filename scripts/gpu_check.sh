#!/usr/bin/env bash
# GPU checks of the CUDA backend, for a machine with an NVIDIA GPU and driver (docs/cuda.md).
#
#   bash scripts/gpu_check.sh            # uses .venv/bin/python if present, else python3
#   PYTHON=python3 bash scripts/gpu_check.sh
#
# 1. the CUDA tests (tests/cuda): on a machine with a driver, test_cuda_driver.py runs every
#    kernel of the test corpus on the GPU and compares it with the interpreter; the rest
#    (lowering, simulator, NVRTC) runs as everywhere;
# 2. a tiny on-device check: a matmul (FMA and WMMA f16), a softmax group and an elementwise
#    kernel, run on the device and compared with numpy, plus each kernel's time;
# 3. benchmarks/cuda_step.py: the training step of mlp3, lenet5, lltm and resnet18 on the GPU
#    (one arena, CUDA Graph replay) against PyTorch CUDA eager, same initial state, first losses
#    compared (needs torch with CUDA; skipped without it).
#
# Needs numpy, pytest, cuda-python and nvidia-cuda-nvrtc (and lark for the model and CLI
# tests, which are skipped without it). On a lent device machine without lark, carry it as a
# wheel (see /work/.library/device/README.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x .venv/bin/python ]; then PY=.venv/bin/python; else PY=python3; fi
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,driver_version --format=csv || true

TESTS=(tests/cuda/test_cuda_driver.py tests/cuda/test_cuda_sim.py tests/cuda/test_cuda_nvrtc.py
       tests/cuda/test_cuda_schedules.py tests/cuda/test_cuda_gemm_knobs.py
       tests/cuda/test_cuda_gemm_pack.py)
if "$PY" -c "import lark" 2>/dev/null; then
  TESTS+=(tests/cuda/test_cuda_models.py tests/cuda/test_cuda_cli.py
          tests/cuda/test_cuda_artifact.py tests/cuda/test_cuda_target_cli.py
          tests/cuda/test_cuda_tuning.py tests/cuda/test_cuda_step.py
          tests/cuda/test_cuda_offload.py)
else
  echo "gpu_check: lark is missing: skipping the model and CLI tests"
fi
"$PY" -m pytest -q -p no:cacheprovider "${TESTS[@]}"

"$PY" - <<'EOF'
"""A tiny on-device check: kernels of each kind run on the GPU and agree with numpy."""
import time

import numpy as np

from nfc.codegen.cuda.program import compile_program
from nfc.codegen.cuda.driver import Device, NoDriverError, run_program
from nfc.codegen.cuda.lower import lower_program
from nfc.ir import Axis, Binary, Call, ComputeOp, DType, Index, Load, TensorType, Value

try:
    dev = Device()
except NoDriverError as exc:
    raise SystemExit(f"gpu_check: {exc}")
print(f"gpu_check: {dev.name} ({dev.arch})")
arch = dev.arch if dev.arch in ("sm_80", "sm_90") else "sm_80"


def matmul(n, dt):
    a = Value(TensorType((n, n), dt), "A")
    b = Value(TensorType((n, n), dt), "B")
    body = Binary("*", Load(a, (Index("i"), Index("k"))), Load(b, (Index("k"), Index("j"))))
    return ComputeOp(TensorType((n, n), dt), (Axis("i", n), Axis("j", n)), body, reduce="sum",
                     raxes=(Axis("k", n),))


def elementwise(n):
    x = Value(TensorType((n,), DType.F32), "x")
    return ComputeOp(TensorType((n,), DType.F32), (Axis("i", n),),
                     Call("tanh", (Load(x, (Index("i"),)),)))


rng = np.random.default_rng(0)
failed = 0
for name, op, ref in [
    ("matmul f32 fma 512", matmul(512, DType.F32), lambda a, b: a.astype(np.float64) @ b),
    ("matmul f16 wmma 512", matmul(512, DType.F16), lambda a, b: a.astype(np.float64) @ b),
    ("tanh 1M", elementwise(1 << 20), lambda x: np.tanh(x.astype(np.float64))),
]:
    prog = lower_program(op, name="k")
    ins = [rng.standard_normal(v.shape).astype(v.dtype.numpy) for v in op.operands]
    compiled = compile_program(prog, arch)
    got = run_program(dev, prog, compiled, ins)[0].astype(np.float64)
    want = ref(*ins)
    err = np.max(np.abs(got - want)) / max(1.0, np.max(np.abs(want)))
    t0 = time.perf_counter()
    for _ in range(5):
        run_program(dev, prog, compiled, ins)
    dt = (time.perf_counter() - t0) / 5
    ok = err < (2e-2 if "f16" in name else 1e-4)
    failed += not ok
    print(f"gpu_check: {name}: max error {err:.2e} ({'ok' if ok else 'WRONG'}), "
          f"{dt * 1e3:.2f} ms per call with copies")
dev.close()
if failed:
    raise SystemExit(1)
EOF

if "$PY" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
  "$PY" benchmarks/cuda_step.py --json gpu_step.json
else
  echo "gpu_check: PyTorch with CUDA is missing: skipping benchmarks/cuda_step.py"
fi
