"""A model on an NVIDIA GPU: the loader's `Model` API over a `CudaStep` (nfc.codegen.cuda.step).

    step = build_cuda_step(module)                 # after the build pipeline
    m = CudaModel(step, step.compile())            # images: {"sm_80": cubin, ..., "ptx": ...}
    m.init(seed=0)                                 # on the host (initgen), then uploaded
    out = m.train_step(x=xb, y=yb)                 # one CUDA Graph launch per call
    out["loss"], m.tensors["w1"]                   # results; tensors downloaded on access
    m.time("train_step", repeats=20)               # ms per call, from CUDA events

    sim = simulated_model(step)                    # the same, every kernel on the simulator

Device memory: ONE allocation for every persistent tensor of the model (parameters, state,
optimizer state: each 256-byte aligned inside it, kept on the device between calls), and ONE
per function holding its arena (the static memory plan of nfc.codegen.artifact.plan: values
and workspaces at their planned offsets) followed by its inputs (the rng argument included)
and its results. A call copies the inputs to the device, runs the function, copies the
results back, on one non-blocking stream: only inputs and outputs cross the bus. The
function's kernels and its end-of-step copies are captured into a CUDA Graph on its first
call and the graph is replayed afterwards (`NFC_CUDA_GRAPHS=0`, or `graphs=False`, launches
them kernel by kernel instead; the results are the same bits).

A function with offloaded activations (`build_cuda_step(..., offload=...)`,
nfc.codegen.cuda.offload) also gets one pinned host buffer per value and, model-wide, a second
(copy) stream: after a value's producer the copy stream, waiting for an event of the compute
stream, copies it to the host; before the launch that reuses its bytes the compute stream
waits for that copy; at the prefetch point the copy stream, waiting for the compute stream
again, copies it back into its second arena slot, and the compute stream waits for that before
its first backward reader. The copy stream joins the compute stream at each of these waits,
so the whole call is still one CUDA Graph (a fork and a join per copy).

The step counter and the rng role are the loader's: an `rng` argument defaults to
`(seed, step)`, and `step` counts the calls of functions that update tensors in place.
`tensors`, `named_tensors()` and `state_dict()` download copies (writes to them do not reach
the device: use `load_state_dict`). `driver=` is any object with the `cuda.bindings.driver`
functions nfc.codegen.cuda.driver.Device calls: None is the real driver (NoDriverError, "no
NVIDIA driver: ...", where there is none), `FakeDriver` the simulator.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

import numpy as np

from nfc.codegen.artifact.plan import Slot
from nfc.codegen.cuda.driver import CudaDriverError, Device, NoDriverError
from nfc.codegen.cuda.nvrtc import CompiledModule
from nfc.runtime.loader import ArtifactError, Model, TensorSpec, as_array

__all__ = ["GRAPHS_ENV", "CudaBound", "CudaDriverError", "CudaFunction", "CudaModel",
           "NoDriverError", "pick_image", "simulated_model"]

#: `0` turns CUDA Graphs off (every kernel launched on each call).
GRAPHS_ENV = "NFC_CUDA_GRAPHS"
#: Alignment of every tensor in a device allocation.
ALIGN = 256
PERSISTENT = ("param", "state", "opt_state")


def _align(n: int) -> int:
    return -(-max(n, 1) // ALIGN) * ALIGN


class _HostView:
    """The attributes `Model.named_tensors` / `Model.load_state_dict` read, on host copies."""

    def __init__(self, metadata: Mapping[str, Any], tensors: dict[str, np.ndarray]) -> None:
        self.metadata = metadata
        self.tensors = tensors

    named_tensors = Model.named_tensors


class CudaFunction:
    """One function of a CudaModel, callable like the loader's `Function`."""

    def __init__(self, model: CudaModel, name: str, func: Any) -> None:
        self.model = model
        self.name = name
        self.func = func
        self.meta = model.metadata["functions"][name]
        self.args = [TensorSpec.of(a) for a in func.args]
        self.results = func.results
        self.outputs = [TensorSpec.of(r) for r in func.results if r.get("out") is not None]
        self.updates_in_place = any(r.get("inplace") for r in func.results)
        self.inputs = [a for a in self.args if a.role not in (*PERSISTENT, "rng")]
        dev = model.device
        # one allocation: the arena, then each non-persistent argument, then each output
        self.arena_bytes = _align(func.arena_bytes)
        size = self.arena_bytes
        io: dict[tuple[str, int], int] = {}
        for i, a in enumerate(self.args):
            if a.role not in PERSISTENT:
                io[("arg", i)], size = size, size + _align(a.dtype.itemsize * _count(a.shape))
        for j, o in enumerate(self.outputs):
            io[("out", j)], size = size, size + _align(o.dtype.itemsize * _count(o.shape))
        self.nbytes = size
        self.base = dev.alloc(size)
        model._allocs.append(self.base)
        self.arg_ptr: list[int] = []
        for i, a in enumerate(self.args):
            if a.role in PERSISTENT:
                self.arg_ptr.append(model._tensor_ptr[a.name])
            else:
                self.arg_ptr.append(self.base + io[("arg", i)])
        self.out_ptr = [self.base + io[("out", j)] for j in range(len(self.outputs))]
        self._functions = {x.symbol: dev.function(model._module, x.symbol)
                           for x in func.launches}
        self._graph: Any = None
        self._rng = np.zeros(2, np.int64)
        self._late_waits: frozenset[str] = frozenset()
        """Test hook: the waits ("sent", "fetched") moved to the end of the call (the streams
        still join, but a kernel may touch a buffer before its copy is done)."""
        self._events: list[Any] = []
        self._before: dict[int, list[tuple[str, int]]] = {}
        self._after: dict[int, list[tuple[str, int]]] = {}
        self._host: list[int] = []
        if func.offload:
            self._plan_offload()

    def _plan_offload(self) -> None:
        """Pinned host buffers, events and the actions around the launches (module doc)."""
        m, dev = self.model, self.model.device
        sizes = [_align(o.nbytes) for o in self.func.offload]
        base = dev.host_alloc(sum(sizes))
        m._host_allocs.append(base)
        for k, o in enumerate(self.func.offload):
            self._host.append(base + sum(sizes[:k]))
            self._events += [dev.event(timing=False) for _ in range(4)]
            self._after.setdefault(o.send_after, []).append(("send", k))
            for at, what in ((o.release_before, "sent"), (o.fetch_before, "fetch"),
                             (o.use_before, "fetched")):
                self._before.setdefault(at, []).append((what, k))
        for acts in self._before.values():  # waits for sends, then fetches, then their waits
            acts.sort(key=lambda a: ("sent", "fetch", "fetched").index(a[0]))

    def _offload_action(self, what: str, k: int) -> None:
        """One step of value k's round trip: events 4k..4k+3 are produced, sent, go, fetched."""
        m, dev, o = self.model, self.model.device, self.func.offload[k]
        produced, sent, go, fetched = self._events[4 * k:4 * k + 4]
        if what == "send":
            dev.record(produced, m.stream)
            dev.wait(m.copy_stream, produced)
            dev.to_host_async(self._host[k], self.base + o.src, o.nbytes, m.copy_stream)
            dev.record(sent, m.copy_stream)
        elif what == "fetch":
            dev.record(go, m.stream)
            dev.wait(m.copy_stream, go)
            dev.to_device_async(self.base + o.dst, self._host[k], o.nbytes, m.copy_stream)
            dev.record(fetched, m.copy_stream)
        else:
            dev.wait(m.stream, sent if what == "sent" else fetched)

    def __repr__(self) -> str:
        ins = ", ".join(f"{a.name}: {a.dtype}{list(a.shape)}" for a in self.inputs)
        outs = ", ".join(o.name for o in self.outputs)
        return f"<nfc cuda function {self.name}({ins}) -> ({outs})>"

    def _ptr(self, slot: Slot, extra: int = 0) -> int:
        if slot.kind == "arena":
            return self.base + slot.index + extra
        if slot.kind == "arg":
            return self.arg_ptr[slot.index] + extra
        return self.out_ptr[slot.index] + extra

    def _enqueue(self) -> None:
        """The function's work on the model's stream: launches (with the offload copies on
        the copy stream around them), then the plan's copies."""
        dev, stream = self.model.device, self.model.stream
        late: list[tuple[str, int]] = []
        for i, x in enumerate(self.func.launches):
            for what, k in self._before.get(i, ()):
                if what in self._late_waits:
                    late.append((what, k))
                else:
                    self._offload_action(what, k)
            dev.launch(self._functions[x.symbol], x.grid, x.block,
                       [self._ptr(s, off) for s, off in x.params], 0, stream)
            for what, k in self._after.get(i, ()):
                self._offload_action(what, k)
        for what, k in late:
            self._offload_action(what, k)
        for c in self.func.copies:
            dev.copy_async(self._ptr(c.dst), self._ptr(c.src), c.nbytes, stream)

    def run_device(self) -> None:
        """Enqueue one call on the device data as it is (no copies to or from the host): the
        graph (captured on first use) or the launches."""
        m = self.model
        if m.graphs:
            if self._graph is None:
                self._graph = m.device.capture(m.stream, self._enqueue)
            m.device.graph_launch(self._graph, m.stream)
        else:
            self._enqueue()

    def _gather(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, np.ndarray]:
        if len(args) > len(self.inputs):
            raise ArtifactError(f"{self.name} takes {len(self.inputs)} inputs "
                                f"({', '.join(a.name for a in self.inputs)}), got {len(args)}")
        given = dict(zip((a.name for a in self.inputs), args, strict=False))
        for k, v in kwargs.items():
            if k in given:
                raise ArtifactError(f"{self.name}: input '{k}' given twice")
            given[k] = v
        out: dict[str, np.ndarray] = {}
        for spec in self.inputs:
            if spec.name not in given:
                raise ArtifactError(f"{self.name}: missing input '{spec.name}'")
            arr = as_array(given.pop(spec.name), f"{self.name}: input '{spec.name}'")
            if arr.shape != spec.shape:
                raise ArtifactError(f"{self.name}: input '{spec.name}' must have shape "
                                    f"{list(spec.shape)}, got {list(arr.shape)}")
            out[spec.name] = np.ascontiguousarray(arr, dtype=spec.dtype)
        if given:
            raise ArtifactError(f"{self.name}: unknown input(s) {', '.join(sorted(given))}")
        return out

    def __call__(self, *args: Any, rng: Any = None, **kwargs: Any) -> dict[str, np.ndarray]:
        """Run the function on inputs (positional in order, or by name); the results that are
        not updated in place, by name."""
        self.model._check_open()
        host = self._gather(args, kwargs)
        if rng is None:
            self._rng[:] = (self.model.seed, self.model.step)
        else:
            self._rng[:] = np.asarray(rng, dtype=np.int64).reshape(2)
        results = {o.name: np.empty(o.shape, o.dtype) for o in self.outputs}
        self._run(host, self._rng, results)
        return results

    def _run(self, host: Mapping[str, np.ndarray], rng: np.ndarray,
             results: Mapping[str, np.ndarray]) -> None:
        """One call: inputs (C-contiguous, of the right dtypes) and the rng words up, the
        function, the results down into `results`; then the step counter."""
        m = self.model
        dev, stream = m.device, m.stream
        for i, spec in enumerate(self.args):
            if spec.role == "rng":
                dev.upload_async(self.arg_ptr[i], rng, stream)
            elif spec.name in host:
                dev.upload_async(self.arg_ptr[i], host[spec.name], stream)
        self.run_device()
        for ptr, o in zip(self.out_ptr, self.outputs, strict=True):
            dev.download_async(results[o.name], ptr, stream)
        dev.sync(stream)
        if self.updates_in_place:
            m.step += 1

    def bind(self, inputs: Mapping[str, np.ndarray] | None = None) -> CudaBound:
        """A call with fixed host buffers, like the loader's `Function.bind`: fill
        `bound.inputs[...]`, set `bound.rng`, call `bound()`; results land in
        `bound.outputs`."""
        return CudaBound(self, inputs)

    def close(self) -> None:
        if self._graph is not None:
            self.model.device.destroy_graph(self._graph)
            self._graph = None
        while self._events:
            self.model.device.destroy_event(self._events.pop())


class CudaBound:
    """A CudaFunction bound to its own host input, output and rng buffers (`bind`)."""

    def __init__(self, fn: CudaFunction, inputs: Mapping[str, np.ndarray] | None = None
                 ) -> None:
        self.fn = fn
        given = dict(inputs or {})
        self.inputs: dict[str, np.ndarray] = {}
        for spec in fn.inputs:
            arr = given.pop(spec.name, None)
            if arr is None:
                arr = np.zeros(spec.shape, spec.dtype)
            elif (arr.shape != spec.shape or arr.dtype != spec.dtype
                  or not arr.flags.c_contiguous):
                raise ArtifactError(f"{fn.name}: bound input '{spec.name}' must be a "
                                    f"C-contiguous {spec.dtype}{list(spec.shape)} array")
            self.inputs[spec.name] = arr
        if given:
            raise ArtifactError(f"{fn.name}: unknown input(s) {', '.join(sorted(given))}")
        self.outputs = {o.name: np.empty(o.shape, o.dtype) for o in fn.outputs}
        self.rng = np.zeros(2, np.int64)

    def __call__(self) -> dict[str, np.ndarray]:
        """Run the function on the bound buffers; returns `outputs` (overwritten next call)."""
        self.fn.model._check_open()
        self.fn._run(self.inputs, self.rng, self.outputs)
        return self.outputs


def _count(shape: tuple[int, ...]) -> int:
    return int(np.prod(shape, dtype=np.int64))


def pick_image(images: Mapping[str, bytes], arch: str, gpu: str = "this GPU") -> CompiledModule:
    """The image to load on a GPU of `arch` ("sm_86"): its own cubin, else the cubin of the
    newest arch of the same major version not above it (binary compatible), else the PTX
    (which the driver compiles; it must target an arch not above the GPU's)."""
    def cc(a: str) -> tuple[int, int]:
        digits = a.removeprefix("sm_")
        return int(digits[:-1]), int(digits[-1])

    if arch in images:
        return CompiledModule(arch, "cubin", images[arch], "")
    major, minor = cc(arch)
    same = [a for a in images if a.startswith("sm_") and cc(a)[0] == major
            and cc(a)[1] <= minor]
    if same:
        best = max(same, key=cc)
        return CompiledModule(best, "cubin", images[best], "")
    if "ptx" in images:
        return CompiledModule(arch, "ptx", images["ptx"], "")
    raise ArtifactError(f"no code for {gpu} ({arch}): the model has "
                        f"{', '.join(sorted(images)) or 'no images'}; recompile it for {arch}")


class CudaModel:
    """A CudaStep loaded on a device (module doc)."""

    def __init__(self, step: Any, images: Mapping[str, bytes] | None = None, *,
                 kernels: Mapping[str, Any] | None = None, driver: Any = None,
                 device: int = 0, graphs: bool | None = None) -> None:
        from nfc.codegen.cuda.step import CudaStep

        if not isinstance(step, CudaStep):
            step = CudaStep.from_json(step, kernels)
        self.cuda_step = step
        self.metadata = step.metadata
        self.path = f"<cuda {self.metadata.get('model', 'model')}>"
        self.graphs = (os.environ.get(GRAPHS_ENV, "1") != "0") if graphs is None else graphs
        self.seed = 0
        self.step = 0
        self._closed = True
        self.device = Device(device, driver=driver)  # NoDriverError without a driver
        self._allocs: list[int] = []
        self._host_allocs: list[int] = []
        self._closed = False
        try:
            self._open(dict(images or {}))
        except BaseException:
            self.close()
            raise

    def _open(self, images: dict[str, bytes]) -> None:
        dev = self.device
        self._module = dev.load(pick_image(images, dev.arch, dev.name))
        self.stream = dev.stream()
        self.copy_stream = (dev.stream() if any(f.offload for f in self.cuda_step.funcs.values())
                            else None)
        self.specs = {t["name"]: TensorSpec.of(t) for t in self.metadata["tensors"]}
        offsets: dict[str, int] = {}
        size = 0
        for name, s in self.specs.items():
            offsets[name], size = size, size + _align(s.dtype.itemsize * _count(s.shape))
        self.state_base = dev.alloc(size)
        self._allocs.append(self.state_base)
        self._tensor_ptr = {n: self.state_base + off for n, off in offsets.items()}
        self.functions = {name: CudaFunction(self, name, f)
                          for name, f in self.cuda_step.funcs.items()}

    def _check_open(self) -> None:
        if self._closed:
            raise ArtifactError(f"{self.path} is closed")

    def __getattr__(self, name: str) -> CudaFunction:
        functions = self.__dict__.get("functions", {})
        if name in functions:
            return functions[name]
        raise AttributeError(f"{type(self).__name__} has no attribute or function '{name}' "
                             f"(functions: {', '.join(functions)})")

    # -- persistent tensors ----------------------------------------------------------------------

    @property
    def tensors(self) -> dict[str, np.ndarray]:
        """Copies of the persistent tensors, downloaded from the device."""
        self._check_open()
        out = {n: np.empty(s.shape, s.dtype) for n, s in self.specs.items()}
        for n, arr in out.items():
            self.device.download_async(arr, self._tensor_ptr[n], self.stream)
        self.device.sync(self.stream)
        return out

    def _upload(self, arrays: Mapping[str, np.ndarray]) -> None:
        for n, arr in arrays.items():
            self.device.upload_async(self._tensor_ptr[n], np.ascontiguousarray(arr), self.stream)
        self.device.sync(self.stream)

    def role(self, role: str) -> dict[str, np.ndarray]:
        """The persistent tensors with `role`, by name (downloaded copies)."""
        return {n: a for n, a in self.tensors.items() if self.specs[n].role == role}

    @property
    def params(self) -> dict[str, np.ndarray]:
        """The parameters (downloaded copies)."""
        return self.role("param")

    def init(self, seed: int = 0) -> None:
        """Fill every persistent tensor from its initializer (the generator's numpy oracle,
        nfc.codegen.artifact.initgen, on the host, then uploaded); resets the step counter
        and sets the seed of the rng argument."""
        from nfc.codegen.artifact.initgen import reference_init, reference_init_layout
        from nfc.ir import DType

        self._check_open()
        arrays = {}
        for t in self.metadata["tensors"]:
            shape, dt = tuple(int(x) for x in t["shape"]), DType(t["dtype"])
            s = int(seed) & 0xFFFFFFFF
            a = (reference_init_layout(t["layout"], shape, dt, s) if t.get("layout")
                 else reference_init(t["name"], t["init"], shape, dt, s))
            arrays[t["name"]] = np.asarray(a).astype(self.specs[t["name"]].dtype)
        self._upload(arrays)
        self.seed = int(seed)
        self.step = 0

    def named_tensors(self) -> dict[str, np.ndarray]:
        """`tensors` by the names of an unfused build (the loader's `named_tensors`)."""
        return _HostView(self.metadata, self.tensors).named_tensors()

    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of the persistent tensors by the names of `named_tensors`."""
        return self.named_tensors()

    def load_state_dict(self, arrays: Mapping[str, np.ndarray]) -> None:
        """Upload arrays into the persistent tensors (names as `Model.load_state_dict`)."""
        view = _HostView(self.metadata, self.tensors)
        Model.load_state_dict(view, arrays)  # type: ignore[arg-type]
        self._upload(view.tensors)

    def set_num_threads(self, n: int) -> None:
        """No effect (the loader's API; the kernels' parallelism is the GPU's)."""

    def get_num_threads(self) -> int:
        """1: the host runs one stream."""
        return 1

    # -- timing and teardown -----------------------------------------------------------------------

    def time(self, fname: str, repeats: int = 10, warmup: int = 1) -> float:
        """Milliseconds per call of `fname` on the device data as it is (inputs of the last
        call, zeros never written: memory as allocated), measured with CUDA events around
        `repeats` calls after `warmup`; no host copies. A training step updates the
        parameters each time, as training would."""
        self._check_open()
        fn = self.functions[fname]
        dev = self.device
        for _ in range(warmup):
            fn.run_device()
        start, end = dev.event(), dev.event()
        try:
            dev.record(start, self.stream)
            for _ in range(repeats):
                fn.run_device()
            dev.record(end, self.stream)
            return dev.elapsed_ms(start, end) / max(1, repeats)
        finally:
            dev.destroy_event(start)
            dev.destroy_event(end)

    def close(self) -> None:
        """Free the device memory, graphs and stream; release the context. After a fault
        (a sticky driver error) every release is still attempted and the first error is
        raised at the end."""
        if self.__dict__.get("_closed", True):
            return
        self._closed = True
        dev = self.device
        failed: list[CudaDriverError] = []

        def attempt(fn: Any, *args: Any) -> None:
            try:
                fn(*args)
            except CudaDriverError as exc:
                failed.append(exc)

        for f in self.__dict__.get("functions", {}).values():
            attempt(f.close)
        if "stream" in self.__dict__:
            attempt(dev.sync, self.stream)
            attempt(dev.destroy_stream, self.stream)
        if self.__dict__.get("copy_stream") is not None:
            attempt(dev.sync, self.copy_stream)
            attempt(dev.destroy_stream, self.copy_stream)
        for p in self._allocs:
            attempt(dev.free, p)
        self._allocs.clear()
        for p in self._host_allocs:
            attempt(dev.host_free, p)
        self._host_allocs.clear()
        attempt(dev.close)
        if failed:
            raise failed[0]

    def __enter__(self) -> CudaModel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def simulated_model(step: Any, *, graphs: bool | None = None, **sim_options: Any) -> CudaModel:
    """A CudaModel whose every kernel runs on the simulator (nfc.codegen.cuda.fakedriver):
    `step` must hold its kernels (`build_cuda_step`'s result, or `CudaStep.from_json(d,
    kernels)`). `sim_options` go to `simulate_kernel` (`order`, `wave_blocks`, ...)."""
    from nfc.codegen.cuda.fakedriver import FakeDriver

    if not step.kernels:
        raise ArtifactError("simulating needs the step's kernels (loop IR); build the step "
                            "with build_cuda_step rather than loading its JSON alone")
    fake = FakeDriver(step.kernels, **sim_options)
    return CudaModel(step, {"ptx": step.source.encode()}, driver=fake, graphs=graphs)
