"""Dynamic mode (`nfc train --mode dynamic`): train at once on the schedules the tuning cache
has, explore better kernel schedules in a background process, and swap a verified library
built with them into the running training loop at a step boundary. See docs/dynamic.md.

| module | what it does |
|---|---|
| `compat.py` | the ABI check: may library B replace library A (same tensors, arguments, results)? |
| `swap.py` | `SwappableStep`: the loop's step (library swapped between steps, profiled twin) |
| `verify.py` | a step of both libraries on copies of a live state, compared (child process) |
| `explorer.py` | background: rank by the loop's reports, search, build, verify, offer, twins |
| `session.py` | the trainer's side: start, poll offers, swap, report kernels, log, account |
| `plot.py` | `nfc train --plot-steps`: the step time over a run, swaps marked |
"""

from typing import Any

__all__ = ["DynamicOptions", "DynamicSession"]


def __getattr__(name: str) -> Any:
    # lazy: `python -m nfc.runtime.dynamic.verify` (and .explorer) must not find their module
    # imported by the package first
    if name in __all__:
        from nfc.runtime.dynamic import session

        return getattr(session, name)
    raise AttributeError(name)
