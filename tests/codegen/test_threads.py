"""Threads: the serial path of small parallel loops, results that do not depend on the thread
count, and libgomp's wait policy (idle threads sleep) in every path that runs native code.

No timing here: which path a loop takes is read from the emitted LLVM IR, and the wait policy
libgomp actually uses from its own report (`OMP_DISPLAY_ENV=verbose` prints its settings
when it initialises, `GOMP_SPINCOUNT = '0'` for sleeping idle threads).
"""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from codegen_lib import F32, assert_matches, compute, inputs_of, ld, matmul, random_inputs, tensor

from nfc.codegen.jit import compile_kernel, get_num_threads, lower_kernel, set_num_threads
from nfc.codegen.llvm import emitter, parallel
from nfc.codegen.llvm.parallel import PARALLEL_MIN_WORK, parallel_work
from nfc.codegen.loops import Buffer, For, LoopFunc, LoopKind, Store
from nfc.codegen.schedule import Schedule
from nfc.ir import Const, Index

ROOT = Path(__file__).resolve().parents[2]
MODEL = ROOT / "examples" / "mlp_digits.nf"
#: libgomp's report of its spin count when it initialises (OMP_DISPLAY_ENV=verbose).
SPIN = re.compile(r"GOMP_SPINCOUNT = '(\w+)'")


def forks(ir_text: str) -> int:
    """Calls of nfc_parallel (nfc.codegen.llvm.threadpool) in LLVM IR text (parallel regions
    the code can start)."""
    return sum(1 for line in ir_text.splitlines()
               if "call" in line and "nfc_parallel" in line)


@pytest.fixture
def threads():
    old = get_num_threads()
    yield set_num_threads
    set_num_threads(old)


# --- the serial path below the work threshold ------------------------------------------------


def _scale_op(n: int):
    x = tensor("x", (n,))
    return compute({"i": n}, ld(x, "i") * Const(2.0) + Const(1.0))


def _work_per_iteration(op, schedule) -> int:
    from nfc.codegen.cpu import host_target
    from nfc.ir import DType

    loops = [s for s in lower_kernel(op, schedule).loops.body.walk()
             if isinstance(s, For) and s.kind is LoopKind.PARALLEL]
    assert len(loops) == 1
    return parallel_work(loops[0].body, {}, host_target().lanes(DType.F32))


def test_parallel_loop_below_the_threshold_runs_serially(threads):
    sched = Schedule(parallel=("i",))
    w = _work_per_iteration(_scale_op(16), sched)
    small = (PARALLEL_MIN_WORK - 1) // w  # the most trips that stay below the threshold
    big = -(-PARALLEL_MIN_WORK // w)  # the fewest that reach it
    assert small * w < PARALLEL_MIN_WORK <= big * w
    threads(2)
    for n, expect in ((small, 0), (big, 1)):
        op = _scale_op(n)
        k = compile_kernel(op, sched)
        assert forks(k.ir_text) == expect, (n, w)
        ins = random_inputs(inputs_of(op), seed=n)
        assert_matches(op, ins, [k(*ins)])


def test_a_loop_backing_off_runs_alone_and_counts_down(threads):
    """While a loop's back-off counter (set after a region that was slower than the caller
    alone, `parallel._judge`) is positive, its regions run on the caller alone, each one
    counting it down and timed; the result is the same either way."""
    op = _scale_op(-(-PARALLEL_MIN_WORK // _work_per_iteration(_scale_op(16),
                                                                 Schedule(parallel=("i",)))))
    k = compile_kernel(op, Schedule(parallel=("i",)))
    assert forks(k.ir_text) == 1 and "llvm.readcyclecounter" in k.ir_text
    (site,) = re.findall(r'@"([\w.]+\.par\d+)\.skip" = internal global', k.ir_text)
    skip, solo = (ctypes.c_int64.from_address(k.engine.get_global_value_address(f"{site}.{g}"))
                  for g in ("skip", "solo"))
    ins = random_inputs(inputs_of(op), seed=4)
    threads(2)
    skip.value, solo.value = 3, 0
    for left in (2, 1, 0):
        assert_matches(op, ins, [k(*ins)])
        assert skip.value == left
    assert solo.value > 0  # the runs alone were timed: the reference a team region must beat
    threads(1)  # one thread: no team, the counter stays
    skip.value = 3
    k(*ins)
    assert skip.value == 3


def test_threshold_off_forks_every_parallel_loop(monkeypatch):
    """The threshold is what decides: at 0 even a 16-trip loop starts a region."""
    monkeypatch.setattr(parallel, "PARALLEL_MIN_WORK", 0)
    text = compile_kernel(_scale_op(16), Schedule(parallel=("i",))).ir_text
    assert forks(text) == 1 and ".skip" in text


def test_devbench_regions_are_always_regions():
    """What devbench times as a parallel region is one: no serial path, no back-off."""
    from nfc.codegen.devbench import always_parallel

    with always_parallel():
        text = compile_kernel(_scale_op(16), Schedule(parallel=("i",))).ir_text
    assert forks(text) == 1 and ".skip" not in text
    assert parallel.BACKOFF and parallel.PARALLEL_MIN_WORK == PARALLEL_MIN_WORK  # restored


def test_trip_count_known_at_run_time_is_tested_at_run_time(threads):
    """`for o in 0..4 { parallel i in 0..(o + 1) * m { out[i] = 2 * x[i] } }`: the emitter
    cannot decide, so the code compares the trip count with the threshold's and holds both
    the region and the serial loop; m puts two trip counts below it and two above."""
    import llvmlite.binding as llvm

    from nfc.codegen.cpu import host_target, target_machine
    from nfc.codegen.jit import _pool, new_module, optimize
    from nfc.codegen.loops import BufLoad
    from nfc.ir import DType

    lanes = host_target().lanes(DType.F32)
    x, out = Buffer("x", (1,), F32), Buffer("out", (1,), F32)
    i = Index("i")
    body = Store(out, (i,), BufLoad(x, (i,)) * Const(2.0))
    w = parallel_work(body, {}, lanes)
    few = -(-PARALLEL_MIN_WORK // w)
    m = few * 2 // 5  # trips m, 2m (serial), 3m, 4m (parallel)
    n = 4 * m
    x, out = Buffer("x", (n,), F32), Buffer("out", (n,), F32)
    body = Store(out, (i,), BufLoad(x, (i,)) * Const(2.0))
    inner = For("i", (Index("o") + Const(1)) * Const(m), LoopKind.PARALLEL, body)
    f = LoopFunc("dyn", (out, x), 1, For("o", Const(4), LoopKind.SERIAL, inner))
    _pool()  # libgomp and nfc's thread pool, which the parallel loop calls
    module = new_module("dyn")
    emitter.emit_function(module, f, "dyn", host_target())
    text = str(module)
    assert forks(text) == 1
    assert re.search(rf"icmp sge i64 %[\w.\"]+, {few}\b", text), "no run-time test of the trips"
    engine = llvm.create_mcjit_compiler(optimize(module), target_machine())
    engine.finalize_object()
    fn = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(engine.get_function_address("dyn"))
    xs = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    for t in (1, 2):
        threads(t)
        ys = np.full(n, np.nan, np.float32)
        buf = (ctypes.c_void_p * 2)(ys.ctypes.data, xs.ctypes.data)
        fn(ctypes.addressof(buf))
        np.testing.assert_array_equal(ys, xs * np.float32(2.0))


# --- results do not depend on the thread count -----------------------------------------------


def test_matmul_same_result_on_1_and_2_threads(threads):
    op = matmul(256, 192, 128)
    k = compile_kernel(op)
    assert forks(k.ir_text) >= 1  # the default schedule runs it on threads
    ins = random_inputs(inputs_of(op), seed=3)
    got = {}
    for t in (1, 2):
        threads(t)
        got[t] = k(*ins)
    np.testing.assert_array_equal(got[1], got[2])  # same chunks' arithmetic, only split
    assert_matches(op, ins, [got[2]])


@pytest.fixture(scope="module")
def model_so(tmp_path_factory):
    """mlp_digits at batch 512 (its GEMMs big enough for threads), built once."""
    from nfc.runtime.build import build_library, build_module, parse_settings, pipeline_for

    params, opt = parse_settings(["batch=512"])
    module, _ = build_module(str(MODEL), params, opt, pipeline_for(str(MODEL)))
    out = tmp_path_factory.mktemp("threads") / "model.so"
    built = build_library(module, str(out), use_cache=False)
    return built


def _has_region(built) -> bool:
    from nfc.codegen.cpu import host_target
    from nfc.ir import DType

    lanes = host_target().lanes(DType.F32)
    for info in built.artifact.kernels.values():
        for s in info.loops.body.walk():
            if (isinstance(s, For) and s.kind is LoopKind.PARALLEL and s.const_extent
                    and s.const_extent * parallel_work(
                        s.body, {s.var: (0, s.const_extent - 1)}, lanes) >= PARALLEL_MIN_WORK):
                return True
    return False


def test_training_step_same_on_1_and_2_threads(model_so):
    from nfc.runtime.loader import load

    assert _has_region(model_so)
    m = load(model_so.path)
    m.init(seed=5)
    start = m.state_dict()
    rng = np.random.default_rng(1)
    x = rng.random((512, 64), dtype=np.float32)
    y = rng.integers(0, 10, 512).astype(np.int32)
    res = {}
    for t in (1, 2):
        m.load_state_dict(start)
        m.set_num_threads(t)
        assert m.get_num_threads() == t
        out = m.train_step(x=x, y=y, rng=(5, 0))
        res[t] = ({k: v.copy() for k, v in out.items()}, m.state_dict())
    for k in res[1][0]:
        np.testing.assert_allclose(res[2][0][k], res[1][0][k], rtol=1e-6, atol=1e-7)
    for k in res[1][1]:
        np.testing.assert_allclose(res[2][1][k], res[1][1][k], rtol=1e-6, atol=1e-7)


# --- the wait policy in every entry path ------------------------------------------------------


def _run(code: str | list[str], env_extra: dict[str, str] | None = None, **kw
         ) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_DISPLAY_ENV")}
    env.update({"OMP_DISPLAY_ENV": "verbose", **(env_extra or {})})
    argv = [sys.executable, "-c", code] if isinstance(code, str) else code
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, **kw)


def _spin(proc: subprocess.CompletedProcess) -> str:
    """The spin count the process's (last initialised) libgomp reported."""
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = SPIN.findall(proc.stderr)
    assert found, f"libgomp reported nothing:\n{proc.stderr[-2000:]}"
    return found[-1]


def test_jit_loads_libgomp_with_sleeping_threads():
    code = ("import os\nfrom nfc.codegen.jit import openmp_wait_policy\n"
            "print(openmp_wait_policy()); print(os.environ.get('OMP_WAIT_POLICY'))")
    proc = _run(code)
    assert _spin(proc) == "0"
    policy, env_after = proc.stdout.split("\n")[:2]
    assert policy.endswith("(nfc)") and env_after == "None"  # the environment is restored
    # a choice of the user's stands
    proc = _run(code, {"GOMP_SPINCOUNT": "1234"})
    assert _spin(proc) == "1234" and "(user)" in proc.stdout


def test_loader_loads_libgomp_with_sleeping_threads(model_so):
    # nfc run, nfc bench's timing process and nfc.torch ops all load libraries through here
    proc = _run(f"from nfc.runtime.loader import load\nm = load({model_so.path!r})\n"
                "m.set_num_threads(2)\nprint(m.get_num_threads())")
    assert _spin(proc) == "0" and proc.stdout.strip() == "2"


def test_nfc_train_runs_with_sleeping_threads(model_so):
    exe = Path(sys.executable).parent / "nfc"
    cmd = [str(exe) if exe.exists() else sys.executable, *([] if exe.exists() else
           ["-m", "nfc"]), "train", model_so.path, "--data", "synthetic", "--max-steps", "2",
           "--threads", "2", "--no-eval", "--quiet"]
    assert _spin(_run(cmd)) == "0"


def test_nfc_torch_gives_pytorch_nfc_libgomp():
    pytest.importorskip("torch")
    proc = _run("import nfc.torch\nfrom nfc.codegen.jit import openmp_wait_policy\n"
                "print(openmp_wait_policy())\n"
                "print(sorted({l.split()[-1] for l in open('/proc/self/maps') "
                "if 'libgomp' in l}))")
    assert _spin(proc) == "0"
    lines = proc.stdout.strip().splitlines()
    assert lines[0].endswith("(nfc)")
    assert "torch" not in lines[1]  # one libgomp, loaded by nfc, serves PyTorch too


def test_c_driver_runs_with_sleeping_threads(model_so, tmp_path):
    import shutil

    from nfc.codegen.artifact.header import c_header
    from nfc.codegen.native import find_cc
    from nfc.runtime.loader import read_metadata

    lib = tmp_path / "model.so"
    shutil.copyfile(model_so.path, lib)
    (tmp_path / "model.h").write_text(c_header(read_metadata(lib)))
    exe = tmp_path / "driver"
    subprocess.run([find_cc(), "-O2", "-Wall", "-Werror", f"-I{tmp_path}",
                    str(ROOT / "examples" / "c_driver" / "main.c"), "-o", str(exe), str(lib),
                    "-Wl,-rpath,$ORIGIN"], check=True, capture_output=True, text=True)
    (tmp_path / "in.bin").write_bytes(np.zeros(512 * 64, np.float32).tobytes()
                                      + np.zeros(512, np.int32).tobytes())
    proc = _run([str(exe), str(tmp_path / "in.bin"), str(tmp_path / "out.bin")], cwd=tmp_path)
    assert _spin(proc) == "0" and proc.stdout.startswith("loss = ")


_STEP = r"""
import sys
import numpy as np
from nfc.runtime.loader import load
m = load(sys.argv[1])
rng = np.random.default_rng(1)
x = rng.random((512, 64), dtype=np.float32)
y = rng.integers(0, 10, 512).astype(np.int32)
m.init(seed=5)
start = m.state_dict()
res = {}
for t in (1, 2):
    m.load_state_dict(start)
    m.set_num_threads(t)
    for _ in range(3):  # a few steps: regions of the library's pool after its workers start
        out = m.train_step(x=x, y=y, rng=(5, 0))
    res.update({f"{t}.out.{k}": v for k, v in out.items()})
    res.update({f"{t}.state.{k}": v for k, v in m.state_dict().items()})
np.savez(sys.argv[2], **res)
"""


def test_library_same_bits_with_either_thread_backend(model_so, tmp_path):
    """A compiled library's training steps (its own copy of nfc's thread pool, or libgomp with
    NFC_THREADS_BACKEND=gomp) on 1 and 2 threads: the same bits."""
    got = {}
    for be in ("nfc", "gomp"):
        out = tmp_path / f"{be}.npz"
        proc = subprocess.run([sys.executable, "-c", _STEP, model_so.path, str(out)],
                              env={**os.environ, "NFC_THREADS_BACKEND": be},
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        with np.load(out) as z:
            got[be] = {k: z[k] for k in z.files}
    ref = got["nfc"]
    assert ref and set(got["gomp"]) == set(ref)
    for k, v in ref.items():
        np.testing.assert_array_equal(got["gomp"][k], v, err_msg=k)
        t, rest = k.split(".", 1)
        np.testing.assert_array_equal(ref[f"1.{rest}"], v, err_msg=k)
