"""The CUDA backend: GPU schedules, GPU lowering to the loop IR, CUDA C, NVRTC, a simulator, a
driver runtime (docs/cuda.md).

    compute + GpuSchedule ──lower──▶ loop IR with blockIdx/threadIdx loops, shared memory,
      (schedule.py, space.py)          barriers, shuffles, WMMA fragments (lower.py, gemm.py,
                                       gpuir.py)
        ├──render.py──▶ CUDA C ──nvrtc.py──▶ cubin (sm_80, sm_90) ──driver.py──▶ GPU
        └──sim.py (numpy, race and bounds checks) ──▶ compared with nfc.interp

Nothing here imports cuda-python until NVRTC or the driver is used (`nvrtc.py`, `driver.py`),
so building, rendering and simulating work without it.
"""

from __future__ import annotations

__all__ = ["driver", "gemm", "gpuir", "lower", "nvrtc", "program", "render", "schedule", "sim",
           "simexpr", "space", "types"]
