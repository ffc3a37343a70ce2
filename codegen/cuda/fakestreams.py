"""Streams, events, graphs and pinned host memory of `nfc.codegen.cuda.fakedriver.FakeDriver`,
with the ordering contract of CUDA streams checked.

The fake runs every operation when it is enqueued (or, captured, when its graph is launched),
so results never depend on the streams; what the fake checks is that the program would be
correct on a GPU, where streams run concurrently. `StreamOrder` keeps a vector clock per
stream: each operation ticks its stream's clock; `cuEventRecord` snapshots the clock,
`cuStreamWaitEvent` merges the snapshot into the waiting stream's clock, synchronising the
host with a stream or an event merges it into the host's clock, which every later operation
starts from. Each operation's device byte ranges (and pinned host ranges) are logged as read
or written; an operation touching bytes that another stream wrote (or reads while it writes
bytes another stream read) at a point its clock does not cover is a `StreamOrderError`: a
kernel reading a prefetched buffer without waiting for the copy's event, a kernel
overwriting a buffer a copy is still reading, a copy reading a value before its producer.

Capture (`cuStreamBeginCapture`): work on the capturing stream is recorded, not run; an event
recorded on it and waited for by another stream makes that stream join the capture (a fork);
at `cuStreamEndCapture` every joined stream's last operation must be ordered before the
capturing stream's end (joined back), else `CUDA_ERROR_STREAM_CAPTURE_UNJOINED` as in CUDA.
`cuGraphLaunch` replays the recorded work on the recorded streams (each starting after the
launching stream's prior work, which waits for all of them at the end), checked the same way.
Copies between pinned host memory (`cuMemHostAlloc`) and the device may be captured; copies to
or from pageable memory may not (`CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED`).
"""

from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from nfc.codegen.cuda.simexpr import SimError

__all__ = ["StreamOrder", "StreamOrderError", "StreamsMixin"]

Clock = dict[int, int]
Range = tuple[int, int, bool]
"""[lo, hi) and whether the operation writes it."""


class StreamOrderError(SimError):
    """Two streams touched the same bytes with no event ordering them: on a GPU the result
    would depend on timing."""


def _merge(into: Clock, other: Clock) -> None:
    for k, v in other.items():
        if into.get(k, 0) < v:
            into[k] = v


class StreamOrder:
    """Vector clocks of streams and the log of their memory accesses (module doc)."""

    def __init__(self) -> None:
        self.clocks: dict[int, Clock] = {}
        self.host: Clock = {}
        self._seqs: dict[int, list[int]] = {}
        self._log: dict[int, list[tuple[int, int, int, bool, str]]] = {}

    def clock(self, stream: int) -> Clock:
        """The stream's clock (it has seen what the host has)."""
        c = self.clocks.setdefault(stream, {})
        _merge(c, self.host)
        return c

    def tick(self, stream: int) -> int:
        """One more operation on `stream`; its sequence number."""
        c = self.clock(stream)
        c[stream] = c.get(stream, 0) + 1
        return c[stream]

    def access(self, stream: int, ranges: list[Range], what: str) -> None:
        """An operation on `stream` touching `ranges`; StreamOrderError if it races with an
        operation of another stream."""
        seq = self.tick(stream)
        c = self.clocks[stream]
        for other, seqs in self._seqs.items():
            if other == stream:
                continue
            log = self._log[other]
            for lo, hi, _q, w, who in log[bisect.bisect_right(seqs, c.get(other, 0)):]:
                for a, b, wr in ranges:
                    if (wr or w) and a < hi and lo < b:
                        raise StreamOrderError(
                            f"{what} on stream {stream} {'writes' if wr else 'reads'} bytes "
                            f"[{max(a, lo):#x}, {min(b, hi):#x}) that {who} on stream {other} "
                            f"{'writes' if w else 'reads'}, with no event ordering the two "
                            "(a missing cuStreamWaitEvent)")
        self._seqs.setdefault(stream, []).extend(seq for _ in ranges)
        self._log.setdefault(stream, []).extend((a, b, seq, w, what) for a, b, w in ranges)

    def snapshot(self, stream: int) -> Clock:
        """What an event recorded on `stream` now has seen (the record is an operation)."""
        self.tick(stream)
        return dict(self.clocks[stream])

    def wait(self, stream: int, snap: Clock) -> None:
        """`stream` waits for an event's snapshot."""
        _merge(self.clock(stream), snap)

    def sync(self, snap: Clock | None = None) -> None:
        """The host waited for a stream or an event (`snap`), or for everything (None); the
        log of what every later operation is ordered after is dropped."""
        if snap is None:
            for c in self.clocks.values():
                _merge(self.host, c)
        else:
            _merge(self.host, snap)
        for s, seqs in self._seqs.items():
            k = bisect.bisect_right(seqs, self.host.get(s, 0))
            del seqs[:k]
            del self._log[s][:k]


@dataclass(eq=False)
class Capture:
    """A capture in progress: its origin stream, the streams joined, the work recorded as
    (stream, op), and why it is invalidated."""

    origin: int
    streams: set[int] = field(default_factory=set)
    ops: list[tuple[int, tuple[Any, ...]]] = field(default_factory=list)
    invalid: str = ""


def unjoined(ops: list[tuple[int, tuple[Any, ...]]], origin: int) -> list[int]:
    """The streams of a captured sequence whose last operation the origin's end does not
    follow (a fork not joined back)."""
    order = StreamOrder()
    events: dict[int, Clock] = {}
    last: dict[int, int] = {}
    for s, op in ops:
        if op[0] == "record":
            events[op[1]] = order.snapshot(s)
        elif op[0] == "wait":
            order.wait(s, events.get(op[1], {}))
            last[s] = order.tick(s)
        else:
            last[s] = order.tick(s)
    end = order.clock(origin)
    return sorted(s for s, q in last.items() if s != origin and end.get(s, 0) < q)


class StreamsMixin:
    """The stream, event, graph and pinned-memory calls of FakeDriver (module doc); the
    driver provides `_ok`, `_err`, `_guard`, `_call`, `_handle`, `_obj`, `_run`, `counters`
    and `order` (a StreamOrder)."""

    order: StreamOrder
    counters: Any
    CUresult: Any
    _objects: dict[int, Any]
    _pinned: dict[int, np.ndarray]

    if TYPE_CHECKING:  # FakeDriver's
        def _ok(self, *values: Any) -> tuple[Any, ...]: ...
        def _err(self, name: str, n_values: int = 0) -> tuple[Any, ...]: ...
        def _guard(self, n_values: int = 0) -> tuple[Any, ...] | None: ...
        def _call(self, fn: Any, n_values: int = 0) -> tuple[Any, ...]: ...
        def _handle(self, kind: str, data: Any = None) -> Any: ...
        def _obj(self, handle: Any, kind: str) -> Any: ...
        def _run(self, op: tuple[Any, ...], stream: int) -> None: ...
        def _destroy(self, handle: Any, kind: str) -> tuple[Any, ...]: ...

    def _capture_of(self, stream: Any) -> Capture | None:
        st = self._obj(stream, "stream")
        return st.data if st is not None else None

    def _number(self, stream: Any) -> int:
        return int(stream) if stream is not None else 0

    def _submit(self, stream: Any, op: tuple[Any, ...]) -> tuple[Any, ...]:
        """Run `op` on `stream` now, or record it when the stream is in a capture."""
        cap = self._capture_of(stream)
        if cap is not None:
            cap.ops.append((self._number(stream), op))
            if op[0] == "launch":
                self.counters["launches_captured"] += 1
            return self._ok()
        return self._call(lambda: self._run(op, self._number(stream)))

    # -- pinned host memory ------------------------------------------------------------------

    def cuMemHostAlloc(self, bytesize: int, Flags: int) -> tuple[Any, ...]:  # noqa: N802, N803
        if (g := self._guard(1)) is not None:
            return g
        arr = np.full(max(1, int(bytesize)), 0xFF, np.uint8)
        self._pinned[arr.ctypes.data] = arr
        self.counters["host_alloc"] += 1
        return self._ok(arr.ctypes.data)

    def cuMemFreeHost(self, p: Any) -> tuple[Any, ...]:  # noqa: N802
        if self._pinned.pop(int(p), None) is None:
            return self._err("CUDA_ERROR_INVALID_VALUE")
        self.counters["host_free"] += 1
        return self._ok()

    @property
    def host_allocations(self) -> dict[int, int]:
        """Live pinned host allocations: address -> bytes."""
        return {p: a.size for p, a in self._pinned.items()}

    def pinned(self, host: Any, nbytes: int) -> bool:
        """Whether `host` (an address) lies inside one pinned allocation."""
        if not isinstance(host, int):
            return False
        for base, arr in self._pinned.items():
            if base <= host and host + nbytes <= base + arr.size:
                return True
        return False

    # -- streams -------------------------------------------------------------------------------

    def cuStreamCreate(self, Flags: int) -> tuple[Any, ...]:  # noqa: N802, N803
        return self._guard(1) or self._ok(self._handle("stream"))

    def cuStreamDestroy(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        return self._destroy(hStream, "stream")

    def cuStreamSynchronize(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        if (g := self._guard()) is not None:
            return g
        self.order.sync(dict(self.order.clock(self._number(hStream))))
        return self._ok()

    def cuStreamBeginCapture(self, hStream: Any, mode: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        if (g := self._guard()) is not None:
            return g
        st = self._obj(hStream, "stream")
        if st is None:  # the legacy default stream cannot be captured
            return self._err("CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED")
        if st.data is not None:
            return self._err("CUDA_ERROR_ILLEGAL_STATE" if hasattr(
                self.CUresult, "CUDA_ERROR_ILLEGAL_STATE") else "CUDA_ERROR_INVALID_VALUE")
        st.data = Capture(st.number, {st.number})
        self.counters["stream_capture"] += 1
        return self._ok()

    def cuStreamEndCapture(self, hStream: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        cap = self._capture_of(hStream)
        if cap is None:
            return self._err("CUDA_ERROR_INVALID_VALUE", 1)
        if cap.origin != self._number(hStream):
            return self._err("CUDA_ERROR_STREAM_CAPTURE_UNMATCHED", 1)
        for s in cap.streams:  # every stream leaves the capture
            if s in self._objects:
                self._objects[s].data = None
        if cap.invalid:
            return self._err("CUDA_ERROR_STREAM_CAPTURE_INVALIDATED", 1)
        if unjoined(cap.ops, cap.origin):
            return self._err("CUDA_ERROR_STREAM_CAPTURE_UNJOINED", 1)
        return self._ok(self._handle("graph", cap.ops))

    # -- graphs --------------------------------------------------------------------------------

    def cuGraphInstantiate(self, hGraph: Any, flags: int) -> tuple[Any, ...]:  # noqa: N802, N803
        graph = self._obj(hGraph, "graph")
        if graph is None:
            return self._err("CUDA_ERROR_INVALID_VALUE", 1)
        self.counters["graph_instantiate"] += 1
        return self._ok(self._handle("graph_exec", list(graph.data)))

    def cuGraphDestroy(self, hGraph: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        return self._destroy(hGraph, "graph")

    def cuGraphExecDestroy(self, hGraphExec: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        return self._destroy(hGraphExec, "graph_exec")

    def cuGraphLaunch(self, hGraphExec: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        if (g := self._guard()) is not None:
            return g
        exe = self._obj(hGraphExec, "graph_exec")
        if exe is None:
            return self._err("CUDA_ERROR_INVALID_VALUE")
        self.counters["graph_launch"] += 1
        launcher = self._number(hStream)

        def replay() -> None:
            order = self.order
            streams = {s for s, _ in exe.data}
            start = order.snapshot(launcher)
            for s in streams:
                order.wait(s, start)
            events: dict[int, Clock] = {}
            for s, op in exe.data:
                if op[0] == "record":
                    events[op[1]] = order.snapshot(s)
                elif op[0] == "wait":
                    order.wait(s, events[op[1]])
                else:
                    self._run(op, s)
            for s in streams:
                order.wait(launcher, order.snapshot(s))
        return self._call(replay)

    # -- events --------------------------------------------------------------------------------

    def cuEventCreate(self, Flags: int) -> tuple[Any, ...]:  # noqa: N802, N803
        return self._ok(self._handle("event", [0.0, {}, None]))

    def cuEventRecord(self, hEvent: Any, hStream: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        ev = self._obj(hEvent, "event")
        if ev is None:
            return self._err("CUDA_ERROR_INVALID_HANDLE")
        cap = self._capture_of(hStream)
        if cap is not None:  # a node of the graph; waiting for it joins the capture
            cap.ops.append((self._number(hStream), ("record", ev.number)))
            ev.data[2] = cap
            return self._ok()
        ev.data[:] = [time.perf_counter(), self.order.snapshot(self._number(hStream)), None]
        return self._ok()

    def cuStreamWaitEvent(self, hStream: Any, hEvent: Any, Flags: int  # noqa: N802, N803
                          ) -> tuple[Any, ...]:
        ev = self._obj(hEvent, "event")
        st = self._obj(hStream, "stream")
        if ev is None or (st is None and self._number(hStream) != 0):
            return self._err("CUDA_ERROR_INVALID_HANDLE")
        cap, mine = ev.data[2], self._capture_of(hStream)
        if cap is not None and cap.origin in self._objects and (
                self._objects[cap.origin].data is cap):
            if st is None or (mine is not None and mine is not cap):
                return self._err("CUDA_ERROR_STREAM_CAPTURE_ISOLATION")
            st.data = cap  # the stream joins the capture (a fork)
            cap.streams.add(st.number)
            cap.ops.append((st.number, ("wait", ev.number)))
            return self._ok()
        if mine is not None:  # an event from outside the capture
            mine.invalid = "a wait for an event recorded outside the capture"
            return self._err("CUDA_ERROR_STREAM_CAPTURE_ISOLATION")
        self.order.wait(self._number(hStream), ev.data[1])
        return self._ok()

    def cuEventSynchronize(self, hEvent: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        if (g := self._guard()) is not None:
            return g
        ev = self._obj(hEvent, "event")
        if ev is None:
            return self._err("CUDA_ERROR_INVALID_HANDLE")
        self.order.sync(ev.data[1])
        return self._ok()

    def cuEventElapsedTime(self, hStart: Any, hEnd: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        a, b = self._obj(hStart, "event"), self._obj(hEnd, "event")
        if a is None or b is None:
            return self._err("CUDA_ERROR_INVALID_HANDLE", 1)
        return self._ok((b.data[0] - a.data[0]) * 1e3)

    def cuEventDestroy(self, hEvent: Any) -> tuple[Any, ...]:  # noqa: N802, N803
        return self._destroy(hEvent, "event")
