"""Activation offload on the CUDA runtime (nfc.codegen.cuda.offload), on the simulator:
`build_cuda_step(..., offload=...)` sends saved activations to pinned host memory on a copy
stream and fetches them back before the backward pass; `FakeDriver` runs the kernels and
checks the streams' ordering contract (nfc.codegen.cuda.fakestreams).

The models are built without fusion: after `fuse` the small test batches put forward and
backward computes into the same few kernels, whose saved values are workspace temporaries
(not candidates). Offload changes no kernel, only where buffers live and the copies, so the
results must be the same bits as without it.
"""

from __future__ import annotations

import functools
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from nfc.codegen.cuda.driver import CudaDriverError, Device
from nfc.codegen.cuda.fakedriver import FakeDriver
from nfc.codegen.cuda.fakestreams import StreamOrderError
from nfc.codegen.cuda.offload import OffloadOptions, apply_offload
from nfc.codegen.cuda.step import OFFLOAD_FORMAT, STEP_FORMAT, CudaStep, build_cuda_step
from nfc.diagnostics import CompileError
from nfc.passes.memplan import LiveBuffer, check_plan, lower_bound, plan_offsets
from nfc.passes.offload import _late
from nfc.runtime.cuda_model import CudaModel, simulated_model

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CASES = {"lenet5": ("lenet5.nf", {"batch": 2}), "mlp": ("mlp.nf", {"batch": 4})}
#: Every saved activation, fetched one op before its first backward reader.
EVERYTHING = OffloadOptions(min_bytes=0, hidden_only=False, lead=1)


@functools.cache
def _built(case: str):
    """(module, step without offload, step offloading EVERYTHING) of an unfused model."""
    from nfc.runtime.build import build_module, pipeline_for

    name, params = CASES[case]
    src = EXAMPLES / name
    module, _ = build_module(src, params, {}, pipeline_for(src, tuning=False, fuse=False))
    return module, build_cuda_step(module), build_cuda_step(module, offload=EVERYTHING)


def _inputs(fn, rng) -> dict[str, np.ndarray]:
    return {a.name: (rng.integers(0, 4, a.shape) if a.dtype.kind in "iu"
                     else rng.standard_normal(a.shape)).astype(a.dtype) for a in fn.inputs}


class _Counting:
    """A driver (cuda.bindings.driver or a FakeDriver) whose calls are counted, on a GPU as on
    the simulator: allocations, captures, launches, bytes copied (`pinned_*`: copies with a
    host address, which the runtime passes only for its pinned buffers)."""

    COUNT = {"cuMemAlloc": "mem_alloc", "cuMemFree": "mem_free", "cuMemHostAlloc": "host_alloc",
             "cuMemFreeHost": "host_free", "cuStreamBeginCapture": "stream_capture",
             "cuGraphInstantiate": "graph_instantiate", "cuGraphLaunch": "graph_launch",
             "cuLaunchKernel": "launch_calls"}
    BYTES = {"cuMemcpyHtoDAsync": ("h2d", 1), "cuMemcpyDtoHAsync": ("d2h", 0)}

    def __init__(self, driver) -> None:
        self._driver, self.counters = driver, Counter()

    def __getattr__(self, name: str):
        attr = getattr(self._driver, name)
        if name not in self.COUNT and name not in self.BYTES:
            return attr

        def call(*args):
            if name in self.COUNT:
                self.counters[self.COUNT[name]] += 1
            else:
                kind, host = self.BYTES[name]
                self.counters[f"{kind}_bytes"] += int(args[2])
                if isinstance(args[host], int):
                    self.counters[f"pinned_{kind}_bytes"] += int(args[2])
            return attr(*args)
        return call


def _gpu_available() -> bool:
    try:
        Device().close()
    except Exception:  # noqa: BLE001 - no cuda-python, no driver or no device
        return False
    return True


GPU = _gpu_available()
BACKENDS = ["simulator", pytest.param("gpu", marks=pytest.mark.skipif(
    not GPU, reason="no NVIDIA driver and GPU (scripts/gpu_check.sh runs this on one)"))]


def _train(step, steps: int = 3, graphs: bool = True, backend: str = "simulator"):
    """Losses, final tensors and the driver's counters of `steps` training steps from seed 5;
    checks the bytes each step moves."""
    if backend == "simulator":
        fake = FakeDriver(step.kernels)
        driver, images = _Counting(fake), {"ptx": step.source.encode()}
    else:
        from cuda.bindings import driver as real

        fake, driver, images = None, _Counting(real), step.compile()
    moved = sum(o.nbytes for o in step.funcs["train_step"].offload)
    m = CudaModel(step, images, driver=driver, graphs=graphs)
    m.init(seed=5)
    rng = np.random.default_rng(11)
    c = driver.counters
    outs = []
    for _ in range(steps):
        ins = _inputs(m.train_step, rng)
        before, ran = dict(c), dict(fake.counters) if fake is not None else {}
        out = m.train_step(**ins)
        delta = Counter({k: c[k] - before.get(k, 0) for k in c})
        # the calls: inputs in and results out on every call, nothing allocated
        assert delta["h2d_bytes"] - delta["pinned_h2d_bytes"] == sum(a.nbytes for a in ins.values())
        assert delta["d2h_bytes"] - delta["pinned_d2h_bytes"] == sum(a.nbytes for a in out.values())
        assert delta["mem_alloc"] == delta["host_alloc"] == 0
        if fake is not None:  # what ran: the offloaded bytes went out and back once
            done = Counter({k: fake.counters[k] - ran.get(k, 0) for k in fake.counters})
            assert done["pinned_d2h_bytes"] == done["pinned_h2d_bytes"] == moved
            assert done["h2d_bytes"] == moved + sum(a.nbytes for a in ins.values())
            assert done["d2h_bytes"] == moved + sum(a.nbytes for a in out.values())
        outs.append(out)
    # the copies' calls: captured once into the graph, or made on every call
    assert c["pinned_d2h_bytes"] == c["pinned_h2d_bytes"] == moved * (1 if graphs else steps)
    tensors = m.tensors
    m.close()
    assert c["mem_free"] == c["mem_alloc"]
    assert c["host_alloc"] == c["host_free"] == (1 if moved else 0)
    if fake is not None:
        assert fake.allocations == {} and fake.host_allocations == {}
    return outs, tensors, c


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", list(CASES))
def test_offloaded_training_is_bit_identical_in_one_graph(case, backend):
    _, base, off = _built(case)
    assert off.funcs["train_step"].offload
    (o1, t1, _), (o2, t2, c) = _train(base, backend=backend), _train(off, backend=backend)
    for a, b in zip(o1, o2, strict=True):
        for n in a:
            np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    for n in t1:
        np.testing.assert_array_equal(t1[n], t2[n], err_msg=n)
    # one capture (the copy stream forked and joined), replayed on every step
    assert c["stream_capture"] == c["graph_instantiate"] == 1 and c["graph_launch"] == 3
    assert c["launch_calls"] == len(off.funcs["train_step"].launches)


def test_kernel_by_kernel_offload_gives_the_same_bits():
    _, base, off = _built("mlp")
    (o1, t1, _), (o2, t2, c) = _train(base, 2), _train(off, 2, graphs=False)
    for n in t1:
        np.testing.assert_array_equal(t1[n], t2[n], err_msg=n)
    assert o1[-1]["loss"] == o2[-1]["loss"]
    assert c["stream_capture"] == 0 and c["launch_calls"] == 2 * len(
        off.funcs["train_step"].launches)


def _value_id(func, o):
    (v,) = func.body.ops[o.producer].results
    return id(v)


@pytest.mark.parametrize("case", list(CASES))
def test_offloaded_values_have_two_lifetimes_in_the_arena(case):
    module, base, off = _built(case)
    func = module.func("train_step")
    f0, f1 = base.funcs["train_step"], off.funcs["train_step"]
    ops = func.body.ops
    split = {_value_id(func, o): o for o in f1.offload}
    for vid, o in split.items():  # the positions: the IR's readers, one op of lead
        readers = [n for n, op in enumerate(ops) if any(id(v) == vid for v in op.operands)]
        fwd = [n for n in readers if not _late(ops[n])]
        late = [n for n in readers if _late(ops[n])]
        assert o.release == max([o.producer, *fwd]) + 1 and o.first_use == min(late)
        assert o.fetch == o.first_use - 1 > o.release
    # the arena is re-planned with [producer, release - 1] and [fetch, last use]
    buffers = []
    for b in f0.plan.buffers:
        o = split.get(b.key[1]) if b.key[0] == "v" else None
        if o is None:
            buffers.append(b)
        else:
            buffers += [LiveBuffer(b.key, b.size, b.start, o.release - 1),
                        LiveBuffer(("fetch", b.key[1]), b.size, o.fetch, b.end)]
    assert f1.arena_bytes == plan_offsets(buffers).peak
    check_plan(buffers, f1.plan.memory)
    meta = off.metadata["functions"]["train_step"]["offload"]
    assert meta == {"values": len(f1.offload), "bytes": sum(o.nbytes for o in f1.offload),
                    "arena_without": f0.arena_bytes}
    saving = f0.arena_bytes - f1.arena_bytes
    if case == "lenet5":  # the saved activations set LeNet-5's peak: it really drops
        assert saving > 0 and lower_bound(buffers) < lower_bound(f0.plan.buffers)
    else:  # the MLP's peak is its weight gradients: nothing to gain, nothing lost
        assert saving >= 0
    # forward readers read the value's first slot, backward readers the fetched copy
    for o in f1.offload:
        readers = {n for n, op in enumerate(ops)
                   if any(id(v) == _value_id(func, o) for v in op.operands)}
        for x in f1.launches:
            if x.op_index in readers:
                slots = {s.index for s, _ in x.params if s.kind == "arena"}
                assert (o.dst if x.op_index >= o.fetch else o.src) in slots, (o, x.label)


def test_offload_of_nothing_is_no_offload():
    module, base, _ = _built("lenet5")
    for nothing in (OffloadOptions(values=()), OffloadOptions(min_bytes=1 << 40), False, None):
        assert build_cuda_step(module, offload=nothing).to_json() == base.to_json()
    # at this tiny batch an H100 runs every op too fast to hide a PCIe 5 round trip
    assert build_cuda_step(module, offload=True).to_json() == base.to_json()
    assert base.to_json()["format"] == STEP_FORMAT


def test_a_missing_wait_is_a_stream_order_error():
    _, _, off = _built("mlp")
    for graphs in (True, False):
        for late, match in (("fetched", "reads bytes .* that a host-to-device copy"),
                            ("sent", "writes bytes .* that a device-to-host copy")):
            m = simulated_model(off, graphs=graphs)
            m.init(seed=1)
            m.train_step._late_waits = frozenset({late})
            with pytest.raises(StreamOrderError, match=match):
                m.train_step(**_inputs(m.train_step, np.random.default_rng(0)))
            m.close()


def test_a_capture_must_join_the_streams_it_forks():
    _, _, off = _built("mlp")
    dev = Device(driver=FakeDriver(off.kernels))
    s, copy = dev.stream(), dev.stream()
    fork, join = dev.event(timing=False), dev.event(timing=False)
    a, b = dev.alloc(64), dev.alloc(64)
    host = dev.host_alloc(64)

    def forked(joined: bool):
        def enqueue():
            dev.record(fork, s)
            dev.wait(copy, fork)
            dev.to_host_async(host, a, 64, copy)  # pinned memory: captured
            dev.to_device_async(b, host, 64, copy)
            if joined:
                dev.record(join, copy)
                dev.wait(s, join)
        return enqueue

    with pytest.raises(CudaDriverError, match="CUDA_ERROR_STREAM_CAPTURE_UNJOINED"):
        dev.capture(s, forked(False))
    dev.upload(a, np.arange(16, dtype=np.float32))
    g = dev.capture(s, forked(True))
    assert dev.d.counters["pinned_d2h_bytes"] == 0  # captured, not run
    dev.graph_launch(g, s)
    dev.sync(s)
    out = np.zeros(16, np.float32)
    dev.download(out, b)
    np.testing.assert_array_equal(out, np.arange(16, dtype=np.float32))
    # pageable host memory still cannot be captured, on a forked stream either
    with pytest.raises(CudaDriverError, match="STREAM_CAPTURE_UNSUPPORTED"):
        dev.capture(s, lambda: (dev.record(fork, s), dev.wait(copy, fork),
                                dev.download_async(out, a, copy)))
    dev.host_free(host)
    assert dev.d.host_allocations == {}


def test_the_step_json_round_trips_and_old_readers_refuse_it():
    _, _, off = _built("mlp")
    d = json.loads(json.dumps(off.to_json()))
    assert d["format"] == OFFLOAD_FORMAT
    again = CudaStep.from_json(d, off.kernels)
    assert again.funcs["train_step"].offload == off.funcs["train_step"].offload
    with simulated_model(again) as m:  # runs the copies from the JSON form
        m.init(seed=0)
        m.train_step(**_inputs(m.train_step, np.random.default_rng(0)))
        assert m.device.d.counters["pinned_h2d_bytes"] > 0
    with pytest.raises(ValueError, match="format 3"):
        CudaStep.from_json({**d, "format": 3})


def test_offload_options_are_checked():
    module, base, _ = _built("mlp")
    with pytest.raises(CompileError, match="cannot offload %nope"):
        build_cuda_step(module, offload=OffloadOptions(values=("nope",)))
    with pytest.raises(CompileError, match="device must be one of"):
        build_cuda_step(module, offload=OffloadOptions(device="abacus"))
    plan = base.funcs["eval"].plan  # no backward pass: nothing to offload
    assert apply_offload(module.func("eval"), plan, EVERYTHING) == (plan, [])


def test_the_cost_model_places_the_copies():
    from nfc.passes.offload import LINKS, plan_offload

    module, base, _ = _built("lenet5")
    # a slow device (the CPU roofline) over PCIe 5: the ops hide most round trips
    opts = OffloadOptions("cpu", "pcie5", min_bytes=0)
    off = build_cuda_step(module, ["train_step"], offload=opts)
    moved = off.funcs["train_step"].offload
    func = module.func("train_step")
    plan = plan_offload(func, "cpu", "pcie5", 0)
    chosen = {c.producer: c for c in plan.chosen}
    t, (gbs, lat_us) = plan.prefix, LINKS["pcie5"]
    assert moved and {o.producer for o in moved} <= set(chosen)
    for o in moved:
        c = chosen[o.producer]
        one_way = o.nbytes / (gbs * 1e9) + lat_us * 1e-6
        # the D2H is waited for once the compute after the producer covers it (or at once)
        assert o.release == c.last_forward + 1 or (
            t[o.release] - t[o.producer + 1] >= one_way > t[o.release - 1] - t[o.producer + 1])
        # the H2D starts at the latest op whose compute until the reader covers it
        assert t[o.first_use] - t[o.fetch] >= one_way > t[o.first_use] - t[o.fetch + 1]
        assert o.release < o.fetch <= o.first_use == c.first_backward
    assert off.funcs["train_step"].arena_bytes < base.funcs["train_step"].arena_bytes
    (_, t1, _), (_, t2, _) = _train(base, 2), _train(off, 2)
    for n in t1:
        np.testing.assert_array_equal(t1[n], t2[n], err_msg=n)
