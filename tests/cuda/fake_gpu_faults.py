"""Test hooks for the GPU measuring worker (nfc.runtime.tuning.gpu_worker): a FakeDriver whose
launches of chosen schedules hang, fault or kill the process. Only tests name it (as
`GpuWorkerOptions(driver="fake_gpu_faults:faulty_driver", driver_spec=...)`)."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Mapping
from typing import Any

from nfc.codegen.cuda.fakedriver import FakeDriver


def _key(schedule_dict: Mapping[str, Any]) -> str:
    return json.dumps(schedule_dict, sort_keys=True)


class FaultyFakeDriver(FakeDriver):
    """A FakeDriver where a launch of a kernel of a schedule listed under `hang` sleeps an
    hour, under `fault` is an illegal address (sticky: the launch succeeds, every later call
    fails, as a real fault surfaces), under `exit` ends the process with status 7, under
    `skip` does nothing (the outputs keep the fake's fresh 0xFF bytes: NaN, a wrong result)."""

    def __init__(self, spec: Mapping[str, Any]) -> None:
        super().__init__({})
        self.hooks = {_key(s): what for what in ("hang", "fault", "exit", "skip")
                      for s in spec.get(what, [])}

    def _launch(self, kernel: Any, pointers: list[int]) -> None:
        what = self.hooks.get(_key(kernel.schedule.to_dict()))
        if what == "hang":
            time.sleep(3600)
        elif what == "fault":
            self._sticky = "CUDA_ERROR_ILLEGAL_ADDRESS"
            return
        elif what == "exit":
            os._exit(7)
        elif what == "skip":
            return
        super()._launch(kernel, pointers)


def faulty_driver(spec: Mapping[str, Any]) -> FaultyFakeDriver:
    """The factory `GpuWorkerOptions.driver` names."""
    return FaultyFakeDriver(spec)
