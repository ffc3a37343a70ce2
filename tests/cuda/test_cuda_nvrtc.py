"""Rendering and NVRTC: every kernel of the corpus compiles for sm_80 and sm_90 with sane
resources; compile errors quote the source; the cache checks its entries; limits are enforced.
"""

from __future__ import annotations

import os
import re

import pytest
from cuda_lib import case_programs, matmul, softmax

pytest.importorskip("cuda.bindings.nvrtc", reason="cuda-python (the 'cuda' extra) is not "
                    "installed")

from nfc.codegen.cuda import nvrtc  # noqa: E402
from nfc.codegen.cuda.lower import lower_program  # noqa: E402
from nfc.codegen.cuda.nvrtc import (  # noqa: E402
    CudaToolchainError,
    NvrtcError,
    ResourceError,
    Resources,
    check_resources,
    compile_cuda,
)
from nfc.codegen.cuda.program import compile_program  # noqa: E402
from nfc.codegen.cuda.render import render_kernels, render_program  # noqa: E402
from nfc.codegen.cuda.schedule import GemmSchedule, GpuScheduleError  # noqa: E402

KERNELS = [k for _, _, p, _, _ in case_programs() for k in p.kernels]


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("NFC_CACHE_DIR", str(tmp_path / "cache"))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
def test_every_corpus_kernel_compiles_with_sane_resources(arch):
    compiled = compile_program(KERNELS, arch)  # raises ResourceError past the limits
    assert compiled.kind == "cubin" and compiled.image[:4] == b"\x7fELF"
    assert set(compiled.resources) == {k.func.name for k in KERNELS}
    for k in KERNELS:
        res = compiled.resources[k.func.name]
        assert 8 <= res.registers <= 255, (k.func.name, res)
        assert res.registers * k.block <= 65536
        assert res.spill_stores == res.spill_loads == 0
        # ptxas counts exactly the shared memory the lowering declared
        assert res.shared_bytes == k.shared_bytes, (k.func.name, res, k.shared_bytes)
        assert res.barriers == (1 if k.shared_bytes else 0), k.func.name


def test_ptx_for_both_architectures():
    src = render_program(lower_program(matmul(32, 32, 32, nvrtc_dtype()), name="mm"))
    for arch, target in (("sm_80", "sm_80"), ("sm_90", "sm_90")):
        ptx = compile_cuda(src, arch, ptx=True)
        assert ptx.kind == "ptx" and ptx.resources == {}
        text = ptx.image.decode(errors="replace")
        assert f".target {target}" in text and ".entry mm(" in text
        assert "wmma.mma.sync" in text


def nvrtc_dtype():
    from nfc.ir import DType

    return DType.F16


def test_rendered_source_is_readable():
    p = lower_program(softmax(), name="softmax")
    src = render_program(p)
    assert src.count('extern "C" __global__ void __launch_bounds__(') == 3
    assert "// softmax_0: reduce (strategy=warp" in src
    assert "// %m[i] = max[j: 45] %x[i, j]" in src
    assert "__shfl_xor_sync(0xffffffffu, acc, 16);" in src
    mm = render_program(lower_program(matmul(64, 64, 64, nvrtc_dtype()), name="mm"))
    assert "wmma::mma_sync(fc[x][y], fa[x], fb[y], fc[x][y]);" in mm
    assert "__shared__ __align__(32) __half As[64][40];" in mm
    assert mm.count("__syncthreads();") == 2 and mm.count("__syncwarp();") == 2


def test_source_location_in_the_kernel_comment():
    from nfc.ir import Loc

    op = matmul(16, 16, 16)
    op.loc = Loc("model.nf", 12, 7)
    assert "// at model.nf:12:7\n" in render_program(lower_program(op))


def test_compile_error_quotes_the_generated_line():
    src = 'extern "C" __global__ void k(float* out) {\n  out[0] = no_such_name;\n}\n'
    with pytest.raises(NvrtcError) as err:
        compile_cuda(src, "sm_80")
    text = str(err.value)
    assert "identifier \"no_such_name\" is undefined" in text
    assert re.search(r"\b2 \| +out\[0\] = no_such_name;", text)


def test_cache_hits_and_rejects_damaged_entries(tmp_path):
    src = render_program(lower_program(softmax(), name="sm"))
    first = compile_cuda(src, "sm_90")
    assert not first.cached
    second = compile_cuda(src, "sm_90")
    assert second.cached and second.image == first.image
    assert second.resources == first.resources
    entry = tmp_path / "cache" / "cuda" / f"{first.key}.nfcu"
    assert oct(entry.stat().st_mode & 0o777) == "0o600"
    assert oct(entry.parent.stat().st_mode & 0o777) == "0o700"
    data = bytearray(entry.read_bytes())
    data[-100] ^= 0x10  # a flipped bit in the cubin
    entry.write_bytes(bytes(data))
    third = compile_cuda(src, "sm_90")
    assert not third.cached and third.image == first.image
    assert compile_cuda(src, "sm_90").cached  # rewritten intact
    # another architecture or option is another key
    assert compile_cuda(src, "sm_80").key != first.key


def test_missing_headers_are_named(monkeypatch, tmp_path):
    monkeypatch.setattr(nvrtc, "include_candidates", lambda: [str(tmp_path)])
    src = render_program(lower_program(matmul(16, 16, 16, nvrtc_dtype())))
    with pytest.raises(CudaToolchainError, match=r"no CUDA headers: mma.h and cuda_fp16.h are "
                       r"in none of .*; install the CUDA toolkit headers or set "
                       r"NFC_CUDA_INCLUDE"):
        compile_cuda(src, "sm_80", use_cache=False)


def test_include_dir_from_the_environment(monkeypatch):
    real = nvrtc.include_dir()
    monkeypatch.setenv("NFC_CUDA_INCLUDE", real)
    assert nvrtc.include_candidates()[0] == real
    assert os.path.isfile(os.path.join(nvrtc.include_dir(), "mma.h"))


def test_resource_limits():
    assert check_resources(256, Resources(registers=64), "sm_80") == []
    problems = check_resources(1024, Resources(registers=128, spill_stores=8, spill_loads=8),
                               "sm_90")
    assert problems == ["128 registers x 1024 threads = 131072 registers, over the 65536 of an "
                        "SM", "register spills (8 bytes stored, 8 loaded)"]
    assert "static shared memory" in check_resources(
        32, Resources(registers=32, shared_bytes=64 * 1024), "sm_80")[0]
    assert check_resources(32, Resources(shared_bytes=200 * 1024), "sm_80")[1].endswith(
        "over the 167936 of an sm_80 SM")
    assert len(check_resources(32, Resources(shared_bytes=200 * 1024), "sm_90")) == 1


def test_compile_program_rejects_a_kernel_over_the_limits(monkeypatch):
    p = lower_program(matmul(16, 16, 16), name="mm")
    monkeypatch.setattr("nfc.codegen.cuda.program.check_resources",
                        lambda threads, res, arch: [f"{res.registers} registers (test)"])
    with pytest.raises(ResourceError, match=r"kernel 'mm' on sm_80: \d+ registers \(test\)"):
        compile_program(p, "sm_80")


def test_schedules_over_the_static_shared_memory_are_refused():
    with pytest.raises(GpuScheduleError, match="over the 49152 bytes of static shared memory"):
        lower_program(matmul(256, 256, 256), GemmSchedule("fma", 128, 128, 64, 8, 8))


def test_one_translation_unit_for_many_programs():
    ps = [lower_program(matmul(16, 16, 16), name=f"mm{n}") for n in range(3)]
    src = render_kernels([k for p in ps for k in p.kernels])
    assert src.count("__device__ __forceinline__ double nfc_philox") == 1
    assert set(compile_cuda(src, "sm_80").resources) == {"mm0", "mm1", "mm2"}
