# ruff: noqa: E501
"""Whole training steps on the CUDA backend's runtime, on the simulator: `build_cuda_step`
(every kernel of a model, one translation unit, the CPU's static memory plan), `CudaModel`
over the driver API and `FakeDriver` (cuda.bindings.driver with device memory in numpy and
kernels run by the simulator).

Tolerance of the comparisons with the CPU backend: both backends evaluate the same float32
computation in different orders, so neither is "the" answer. The oracle is
`nfc.testing.errbound.run_bounded`: the interpreter in float64 with a bound on the float32
error of any evaluation order, in its probabilistic form (`probable=True`: 8 standard
deviations of independent roundings, the form nfc.testing uses for deep computations). Results
and tensors must lie within `SLACK` (2) times the bound of the float64 reference
(`assert_within_bounds`), the criterion nfc.testing applies to CPU kernels:

- the three steps from the common start, both backends, with the bound carried from step to
  step (`errors=`: the parameters entering step k are known only within what step k - 1 left).
  This bound is loose wherever a ReLU input lies within its error of zero (both branches are
  admitted; up to 0.08 on the MLP's `w1` after three steps);
- each step on the device from the device's own state (exact float32 inputs): a tight bound,
  whose median must stay below 1% of how far the step moved each tensor, so a wrong kernel
  cannot hide inside it (dropping one launch of the step fails this test).
"""

from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from nfc.codegen.cuda.driver import CudaDriverError, Device, NoDriverError
from nfc.codegen.cuda.fakedriver import FakeDriver
from nfc.codegen.cuda.step import CudaStep, build_cuda_step
from nfc.diagnostics import CompileError
from nfc.runtime.cuda_model import CudaModel, simulated_model
from nfc.testing.errbound import assert_within_bounds, run_bounded

HAVE_CUDA_PYTHON = importlib.util.find_spec("cuda.bindings") is not None
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CASES = {"mlp": ("mlp.nf", {"batch": 4}), "lenet5": ("lenet5.nf", {"batch": 2}),
         "lstm_cell": ("lstm_cell.nf", {"batch": 2})}
PERSISTENT = ("param", "state", "opt_state")


@functools.cache
def _built(case: str):
    """(module, CudaStep, path of the CPU library) of a model, built once per session."""
    from nfc.runtime.build import build_library, build_module, pipeline_for

    name, params = CASES[case]
    src = EXAMPLES / name
    module, _ = build_module(src, params, {}, pipeline_for(src, tuning=False))
    step = build_cuda_step(module)
    return module, step, build_library(module).path


def _inputs(fn, rng) -> dict[str, np.ndarray]:
    out = {}
    for a in fn.inputs:
        if a.dtype.kind in "iu":
            out[a.name] = rng.integers(0, 4, a.shape).astype(a.dtype)
        else:
            out[a.name] = rng.standard_normal(a.shape).astype(a.dtype)
    return out


def _bounded(func, meta, state, errors, ins):
    """run_bounded of one function: (results by name, in-place updates by tensor name), each
    (float64 value, bound)."""
    values = {a.name: (state[a.name] if a.name in state else ins[a.name]) for a in func.args}
    outs = run_bounded(func, values, errors=errors, probable=True)
    res, upd = {}, {}
    for r, (v, e) in zip(meta["results"], outs, strict=True):
        if r["inplace"]:
            upd[r["inplace"]] = (v, e)
        else:
            res[r["name"]] = (v, e)
    return res, upd


class _Counting:
    """A driver (cuda.bindings.driver or a FakeDriver) whose calls are counted: what a model
    allocates, captures, launches and copies across the bus, on a GPU as on the simulator."""

    COUNT = {"cuMemAlloc": "mem_alloc", "cuMemFree": "mem_free",
             "cuStreamBeginCapture": "stream_capture", "cuGraphInstantiate": "graph_instantiate",
             "cuGraphLaunch": "graph_launch", "cuLaunchKernel": "launch_calls"}
    BYTES = {"cuMemcpyHtoDAsync": "h2d_bytes", "cuMemcpyDtoHAsync": "d2h_bytes",
             "cuMemcpyHtoD": "h2d_bytes", "cuMemcpyDtoH": "d2h_bytes"}

    def __init__(self, driver) -> None:
        from collections import Counter

        self._driver, self.counters = driver, Counter()

    def __getattr__(self, name: str):
        attr = getattr(self._driver, name)
        if name not in self.COUNT and name not in self.BYTES:
            return attr

        def call(*args):
            if name in self.COUNT:
                self.counters[self.COUNT[name]] += 1
            else:
                self.counters[self.BYTES[name]] += int(args[2])
            return attr(*args)
        return call


def _gpu_available() -> bool:
    if not HAVE_CUDA_PYTHON:
        return False
    try:
        Device().close()
    except NoDriverError:
        return False
    return True


GPU = _gpu_available()


@pytest.mark.parametrize("backend", ["simulator", pytest.param("gpu", marks=pytest.mark.skipif(
    not GPU, reason="no NVIDIA driver and GPU (scripts/gpu_check.sh runs this on one)"))])
@pytest.mark.parametrize("case", list(CASES))
def test_three_training_steps_match_the_cpu_backend(case, backend):
    from nfc.runtime.loader import load

    module, step, path = _built(case)
    cpu = load(path)
    if backend == "simulator":
        fake = FakeDriver(step.kernels)
        counting = _Counting(fake)
    else:
        from cuda.bindings import driver

        fake, counting = None, _Counting(driver)
    images = {"ptx": step.source.encode()} if fake is not None else step.compile()
    dev = CudaModel(step, images, driver=counting)
    counts = counting.counters
    cpu.init(seed=7)
    dev.init(seed=7)
    start = {n: a.copy() for n, a in cpu.tensors.items()}
    for n, a in dev.tensors.items():  # the host generator is the native one's oracle
        np.testing.assert_array_equal(a, start[n], err_msg=n)
    state = {n: a.astype(np.float64) for n, a in start.items()}
    errors: dict[str, np.ndarray] = {}
    rng = np.random.default_rng(1)
    train = module.func("train_step")
    meta = step.metadata["functions"]["train_step"]
    n_launch = len(step.funcs["train_step"].launches)
    for k in range(3):
        ins = _inputs(cpu.train_step, rng)
        pre = {n: a.astype(np.float64) for n, a in dev.tensors.items()}
        before, ran = dict(counts), fake.counters["launches"] if fake else 0
        got_cpu, got_dev = cpu.train_step(**ins), dev.train_step(*ins.values())
        delta = {c: counts[c] - before.get(c, 0) for c in counts}
        # only the inputs go to the device and only the results come back
        assert delta.get("h2d_bytes", 0) == sum(a.nbytes for a in ins.values())
        assert delta.get("d2h_bytes", 0) == sum(a.nbytes for a in got_dev.values())
        assert delta.get("mem_alloc", 0) == 0
        if fake is not None:
            assert fake.counters["launches"] - ran == n_launch
        # this step on the device against the oracle from the device's own state: a tight
        # bound (far below how far the step moves the tensors, so a wrong kernel shows)
        res, upd = _bounded(train, meta, pre, {}, ins)
        post = dev.tensors
        for name, (v, e) in upd.items():
            assert_within_bounds(post[name], v, e, name=f"{backend} step {k} {name}")
            moved = float(np.abs(v - pre[name]).max())
            assert float(np.median(e)) < 1e-2 * moved, (k, name, float(np.median(e)), moved)
        for name, (v, e) in res.items():
            assert_within_bounds(got_dev[name], v, e, name=f"{backend} step {k} {name}")
        # the three steps from the common start, bounds carried from step to step
        res, upd = _bounded(train, meta, state, errors, ins)
        for name, (v, e) in res.items():
            for who, got in (("cpu", got_cpu), (backend, got_dev)):
                assert_within_bounds(got[name], v, e, name=f"{who} step {k} {name}")
        for name, (v, e) in upd.items():
            state[name], errors[name] = v, e
    assert dev.step == cpu.step == 3
    final_cpu, final_dev = cpu.tensors, dev.tensors
    for name, v in state.items():
        e = errors.get(name, np.zeros(()))
        for who, got in (("cpu", final_cpu), (backend, final_dev)):
            assert_within_bounds(got[name], v, e, name=f"{who} {name} after 3 steps")
    # the graph: captured on the first call, replayed on the others; one allocation for the
    # persistent tensors and one (arena + inputs + outputs) per function
    assert counts["stream_capture"] == counts["graph_instantiate"] == 1
    assert counts["graph_launch"] == 3 and counts["launch_calls"] == n_launch
    assert counts["mem_alloc"] == 1 + len(step.funcs)
    # evaluation on the trained parameters, both backends within the bound
    for fname in ("eval", "forward"):
        ins = _inputs(getattr(cpu, fname), rng)
        res, _ = _bounded(module.func(fname), step.metadata["functions"][fname], state,
                          errors, ins)
        got_cpu, got_dev = getattr(cpu, fname)(**ins), getattr(dev, fname)(**ins)
        assert set(got_dev) == set(res)
        for name, (v, e) in res.items():
            assert_within_bounds(got_cpu[name], v, e, name=f"cpu {fname} {name}")
            assert_within_bounds(got_dev[name], v, e, name=f"{backend} {fname} {name}")
    dev.close()
    assert counts["mem_free"] == counts["mem_alloc"]
    assert fake is None or fake.allocations == {}


def test_launching_kernel_by_kernel_gives_the_same_bits(monkeypatch):
    _, step, _ = _built("lstm_cell")
    rng = np.random.default_rng(2)
    runs = []
    for graphs in ("1", "0"):
        monkeypatch.setenv("NFC_CUDA_GRAPHS", graphs)
        # a step read back from its JSON runs the same (the kernels come separately)
        again = CudaStep.from_json(json.loads(json.dumps(step.to_json())), step.kernels)
        m = simulated_model(again)
        m.init(seed=3)
        ins = _inputs(m.train_step, np.random.default_rng(2))
        outs = [m.train_step(**ins) for _ in range(2)]
        runs.append((outs, m.tensors, dict(m.device.d.counters)))
        m.close()
    (o1, t1, c1), (o2, t2, c2) = runs
    for a, b in zip(o1, o2, strict=True):
        for n in a:
            np.testing.assert_array_equal(a[n], b[n], err_msg=n)
    for n in t1:
        np.testing.assert_array_equal(t1[n], t2[n], err_msg=n)
    assert c1["graph_launch"] == 2 and c2.get("graph_launch", 0) == 0
    assert c2.get("stream_capture", 0) == 0 and c1["launches"] == c2["launches"]
    del rng


def test_state_dict_round_trip_and_call_errors():
    from nfc.runtime.loader import ArtifactError

    _, step, _ = _built("lstm_cell")
    with simulated_model(step) as m:
        m.init(seed=1)
        sd = m.state_dict()
        changed = {n: (a + 1 if m.specs[n].role == "param" else a) for n, a in sd.items()}
        m.load_state_dict(changed)
        for n, a in m.state_dict().items():
            np.testing.assert_array_equal(a, changed[n], err_msg=n)
        assert set(m.params) == {n for n, s in m.specs.items() if s.role == "param"}
        m.set_num_threads(4)
        assert m.get_num_threads() >= 1
        ins = _inputs(m.eval, np.random.default_rng(0))
        with pytest.raises(ArtifactError, match="missing input"):
            m.eval()
        with pytest.raises(ArtifactError, match="unknown input"):
            m.eval(**ins, bogus=1)
        with pytest.raises(ArtifactError, match="must have shape"):
            m.eval(**{k: v[:1] for k, v in ins.items()})
        with pytest.raises(AttributeError, match="no attribute or function 'nope'"):
            m.nope  # noqa: B018
        ms = m.time("eval", repeats=2)
        assert np.isfinite(ms) and ms >= 0
        # a bound call (the training loop's) is a call
        bound = m.eval.bind()
        for k, v in ins.items():
            bound.inputs[k][...] = v
        bound.rng[:] = (m.seed, m.step)
        got, want = bound(), m.eval(**ins)
        for n in want:
            np.testing.assert_array_equal(got[n], want[n], err_msg=n)
        with pytest.raises(ArtifactError, match="unknown input"):
            m.eval.bind({"bogus": np.zeros(1)})


def test_a_bad_pointer_is_an_illegal_address():
    _, step, _ = _built("lstm_cell")
    fake = FakeDriver(step.kernels)
    dev = Device(driver=fake)
    module = dev.load(_image(step))
    sym, k = next(iter(step.kernels.items()))
    fn = dev.function(module, sym)
    good = [dev.alloc(p.nbytes) for p in k.func.params]
    short = dev.alloc(k.func.params[0].nbytes - 4)  # a buffer running past its allocation
    with pytest.raises(CudaDriverError, match="cuLaunchKernel failed: "
                       "CUDA_ERROR_ILLEGAL_ADDRESS"):
        dev.launch(fn, k.grid, k.block, [short, *good[1:]])
    with pytest.raises(CudaDriverError, match="ILLEGAL_ADDRESS"):  # sticky, like the driver
        dev.synchronize()
    fake2 = FakeDriver(step.kernels)
    dev2 = Device(driver=fake2)
    fn2 = dev2.function(dev2.load(_image(step)), sym)
    with pytest.raises(CudaDriverError, match="ILLEGAL_ADDRESS"):
        dev2.launch(fn2, k.grid, k.block, [0xDEAD0] * len(k.func.params))
    dev3 = Device(driver=FakeDriver(step.kernels))
    fn3 = dev3.function(dev3.load(_image(step)), sym)
    with pytest.raises(CudaDriverError, match="CUDA_ERROR_INVALID_HANDLE"):  # not its own
        dev3.launch(fn2, k.grid, k.block, [0])
    with pytest.raises(CudaDriverError, match="CUDA_ERROR_INVALID_VALUE"):  # another shape
        dev3.launch(fn3, k.grid + 1, k.block, [0])


def _image(step):
    from nfc.codegen.cuda.nvrtc import CompiledModule

    return CompiledModule("sm_90", "ptx", step.source.encode(), "")


def test_graph_capture_refuses_host_copies_and_the_default_stream():
    _, step, _ = _built("lstm_cell")
    dev = Device(driver=FakeDriver(step.kernels))
    s = dev.stream()
    host = np.zeros(4, np.float32)
    p = dev.alloc(16)
    with pytest.raises(CudaDriverError, match="STREAM_CAPTURE_UNSUPPORTED"):
        dev.capture(s, lambda: dev.upload_async(p, host, s))
    with pytest.raises(CudaDriverError, match="cuStreamBeginCapture failed"):
        dev.capture(0, lambda: None)
    g = dev.capture(s, lambda: dev.copy_async(p, p, 16, s))  # the stream is usable again
    dev.graph_launch(g, s)
    assert dev.d.counters["d2d_bytes"] == 16


@pytest.mark.skipif(not HAVE_CUDA_PYTHON, reason="cuda-python is not installed")
def test_without_a_driver_the_model_says_so():
    _, step, _ = _built("lstm_cell")
    if GPU:
        pytest.skip("this machine has an NVIDIA driver")
    with pytest.raises(NoDriverError, match="^no NVIDIA driver"):
        CudaModel(step.to_json(), {"ptx": b""})


def test_data_parallel_steps_are_refused():
    from nfc.runtime.build import build_module

    src = EXAMPLES / "mlp.nf"
    pipe = "im2col,training-functions,data-parallel,inline,canonicalize,cse,dce"
    module, _ = build_module(src, {"batch": 4}, {}, pipe)
    with pytest.raises(CompileError, match="nf.allreduce .* not supported by the CUDA"):
        build_cuda_step(module, ["train_step"])


@pytest.mark.skipif(not HAVE_CUDA_PYTHON, reason="NVRTC (cuda-python) is not installed")
def test_the_translation_unit_compiles_for_sm80_and_sm90():
    from nfc.codegen.cuda.nvrtc import check_resources, compile_cuda

    _, step, _ = _built("mlp")
    assert step.source.count("extern \"C\" __global__") == len(step.kernels)
    for arch in ("sm_80", "sm_90"):
        compiled = compile_cuda(step.source, arch)
        assert set(compiled.resources) == set(step.kernels)
        for sym, k in step.kernels.items():
            assert not check_resources(k.block, compiled.resources[sym], arch), sym
    assert compile_cuda(step.source, "sm_90", ptx=True).image.startswith(b"//")


#: Results the memory plan cannot compute in place (nfc.codegen.artifact.plan): a parameter
#: read after its update, a permuted read, a swap (two results staged before three copies),
#: one value returned twice and an input returned as it is.
EDGE_CASES = """
nf.module @edge {
  nf.func @late_read(%x: tensor<8xf32> {nf.role = "input"}, %w: tensor<8xf32> {nf.role = "param"}) -> (tensor<8xf32>, tensor<f32>) attributes {nf.results = ["param:w", "s"], nf.inplace = {"0" = "w"}} {
    %w_new = nf.compute [i: 8] (%w[i] - 0.5 * %x[i]) : tensor<8xf32>
    %s = nf.compute [] sum [i: 8] (%w[i] * %w_new[i]) : tensor<f32>
    nf.return %w_new, %s : tensor<8xf32>, tensor<f32>
  }
  nf.func @flip(%w: tensor<8xf32> {nf.role = "param"}) -> tensor<8xf32> attributes {nf.results = ["param:w"], nf.inplace = {"0" = "w"}} {
    %r = nf.compute [i: 8] (%w[7 - i] * 2.0) : tensor<8xf32>
    nf.return %r : tensor<8xf32>
  }
  nf.func @swap(%p: tensor<8xf32> {nf.role = "param"}, %q: tensor<8xf32> {nf.role = "param"}) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) attributes {nf.results = ["param:p", "param:q", "p"], nf.inplace = {"0" = "p", "1" = "q"}} {
    nf.return %q, %p, %p : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
  nf.func @dup(%x: tensor<8xf32> {nf.role = "input"}) -> (tensor<8xf32>, tensor<8xf32>, tensor<8xf32>) attributes {nf.results = ["a", "b", "x"]} {
    %a = nf.compute [i: 8] (exp(%x[i])) : tensor<8xf32>
    nf.return %a, %a, %x : tensor<8xf32>, tensor<8xf32>, tensor<8xf32>
  }
}
"""


def test_the_plans_copies_run_on_the_device():
    from nfc.irparser import parse_module
    from nfc.testing import assert_matches_oracle

    module = parse_module(EDGE_CASES)
    step = build_cuda_step(module)
    assert len(step.funcs["swap"].copies) == 5 and step.funcs["flip"].copies
    rng = np.random.default_rng(0)
    with simulated_model(step) as m:
        for func in module.funcs:
            feeds = {a.name: rng.standard_normal(a.shape).astype(np.float32)
                     for a in func.args}
            state = m.state_dict()
            state.update({k: v for k, v in feeds.items() if k in state})
            m.load_state_dict(state)
            fn = m.functions[func.name]
            out = fn(**{a.name: feeds[a.name] for a in fn.inputs})
            after = m.tensors
            got = [after[r["inplace"]] if r["inplace"] else out[r["name"]]
                   for r in fn.results]
            assert_matches_oracle(func, feeds, got, module=module)


class _Bindings:
    """A FakeDriver whose every call is first made on the real `cuda.bindings.driver` with the
    same arguments: without a driver library that call must fail loading the library, not
    converting its arguments (a TypeError means the code does not match cuda-python's
    signatures)."""

    def __init__(self, fake: FakeDriver) -> None:
        from cuda.bindings import driver

        self._fake, self._real, self.calls = fake, driver, set()

    def __getattr__(self, name: str):
        attr = getattr(self._fake, name)
        if not name.startswith("cu"):
            return attr

        def call(*args):
            try:
                getattr(self._real, name)(*args)
            except TypeError as exc:
                raise AssertionError(f"{name}{args}: {exc}") from None
            except Exception as exc:  # noqa: BLE001 - the driver library is missing
                assert type(exc).__name__ == "DynamicLibNotFoundError", (name, exc)
            self.calls.add(name)
            return attr(*args)
        return call


@pytest.mark.skipif(not HAVE_CUDA_PYTHON, reason="cuda-python is not installed")
def test_the_driver_calls_match_the_cuda_python_signatures():
    _, step, _ = _built("lstm_cell")
    if GPU:
        pytest.skip("with a driver the real calls would run")
    checked = _Bindings(FakeDriver(step.kernels))
    with CudaModel(step, {"ptx": b"//"}, driver=checked) as m:
        m.init(seed=0)
        ins = _inputs(m.train_step, np.random.default_rng(0))
        m.train_step(**ins)
        m.train_step(**ins)
        m.time("eval", repeats=1)
    assert {"cuLaunchKernel", "cuStreamBeginCapture", "cuStreamEndCapture",
            "cuGraphInstantiate", "cuGraphLaunch", "cuMemcpyHtoDAsync", "cuMemcpyDtoHAsync",
            "cuEventElapsedTime", "cuMemAlloc", "cuMemFree"} <= checked.calls
    # activation offload (nfc.codegen.cuda.offload): pinned memory, a copy stream, events
    # forking and joining the capture, copies with host addresses
    from nfc.codegen.cuda.offload import OffloadOptions
    from nfc.runtime.build import build_module, pipeline_for

    src = EXAMPLES / "mlp.nf"
    module, _ = build_module(src, {"batch": 4}, {}, pipeline_for(src, tuning=False, fuse=False))
    off = build_cuda_step(module, ["train_step"],
                          offload=OffloadOptions(min_bytes=0, hidden_only=False, lead=1))
    for graphs in (True, False):
        checked = _Bindings(FakeDriver(off.kernels))
        with CudaModel(off, {"ptx": b"//"}, driver=checked, graphs=graphs) as m:
            m.init(seed=0)
            m.train_step(**_inputs(m.train_step, np.random.default_rng(0)))
        assert {"cuMemHostAlloc", "cuMemFreeHost", "cuStreamWaitEvent", "cuEventRecord",
                "cuEventCreate", "cuEventDestroy", "cuMemcpyHtoDAsync",
                "cuMemcpyDtoHAsync"} <= checked.calls


def test_schedule_for_chooses_the_kernels_schedules():
    from nfc.codegen.cuda.schedule import ElementwiseSchedule
    from nfc.codegen.lower import group_stages
    from nfc.contraction import match_contraction
    from nfc.ir import ComputeOp

    module, step, _ = _built("lstm_cell")
    chosen = ElementwiseSchedule(threads=32, items=2)

    def schedule_for(op):  # every elementwise stage, alone or in a group
        if isinstance(op, ComputeOp):
            return chosen if op.reduce is None else None
        return [chosen if st.reduce is None and match_contraction(st) is None else None
                for st, _ in group_stages(op, None)]

    other = build_cuda_step(module, ["eval"], schedule_for)
    assert set(other.funcs) == {"eval"}
    picked = [k for k in other.kernels.values() if k.schedule == chosen]
    assert picked and all(x.block == 32 for x in other.funcs["eval"].launches
                          if other.kernels[x.symbol].schedule == chosen)
    ins = _inputs(simulated_model(step).eval, np.random.default_rng(4))
    outs = []
    for s in (step, other):
        with simulated_model(s) as m:
            m.init(seed=2)
            outs.append(m.eval(**ins))
    for n in outs[0]:  # elementwise kernels compute each element alike, in any mapping
        np.testing.assert_array_equal(outs[0][n], outs[1][n], err_msg=n)


def test_only_kernels_updating_in_place_drop_restrict():
    """A launch passing one buffer as output and input (the optimizer's `p - lr * g` planned
    in place) gets a kernel without `__restrict__`; every other kernel keeps it."""
    _, step, _ = _built("mlp")
    launches = [x for f in step.funcs.values() for x in f.launches]
    aliased = set()
    for x in launches:
        k = step.kernels[x.symbol]
        outs, ins = set(x.params[:k.func.n_outputs]), set(x.params[k.func.n_outputs:])
        if outs & ins:
            aliased.add(x.symbol)
    assert aliased  # the training step updates its parameters in place
    for name, k in step.kernels.items():
        assert k.restrict == (name not in aliased), name
        head = next(line for line in step.source.splitlines()
                    if line.startswith('extern "C"') and f" {name}(" in line)
        assert ("__restrict__" in head) == (name not in aliased), head
