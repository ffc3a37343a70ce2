"""The generated CUDA C, compiled by the host C++ compiler and run on CPU threads.

The simulator (nfc.codegen.cuda.sim) executes the loop IR, so it cannot see a mistake of the
renderer (a missing parenthesis, a wrong conversion, a helper that computes something else).
This runs the renderer's output itself: `HOST_SHIM` maps the CUDA C the renderer uses onto C++20
(each GPU thread an OS thread, `__syncthreads()` a `std::barrier` of the block, `__syncwarp()` and
`__shfl_xor_sync` a barrier and an exchange slot per warp, `__shared__` arrays `static`, blocks run
one after the other by the same threads, `__half` as `_Float16`, `__nv_bfloat16` rounded to nearest
even, WMMA fragments of any M x N x K shape as whole tiles per thread multiplied in f32), and
`run_host(program, inputs)` compiles the translation unit with `c++ -std=c++20` into a shared
library, launches each kernel with its grid and block, and returns the outputs. It is a check of the
CUDA C text on a machine without a GPU, not a model of GPU timing or memory semantics (the simulator
checks races; this one has real ones as C++ data races).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from nfc.codegen.cuda.driver import from_device_layout, host_buffer, to_device_layout
from nfc.codegen.cuda.lower import GpuKernel, GpuProgram
from nfc.codegen.cuda.render import CTYPE, render_kernels

HOST_SHIM = r"""
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <algorithm>
#include <barrier>
#include <cmath>
#include <memory>
#include <thread>
#include <type_traits>
#include <vector>

struct nfc_dim3 { unsigned x = 0, y = 0, z = 0; };
static thread_local nfc_dim3 threadIdx, blockIdx;
static thread_local int nfc_tid;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(n)
#define __restrict__ __restrict
#define __align__(n) __attribute__((aligned(n)))
#define __shared__ static
using std::isfinite;
using std::max;
using std::min;

struct nfc_warp {
  std::barrier<> bar{32};
  unsigned long long slot[32];
};
static std::barrier<>* nfc_block_barrier;
static std::vector<std::unique_ptr<nfc_warp>> nfc_warps;

inline void __syncthreads() { nfc_block_barrier->arrive_and_wait(); }
inline void __syncwarp() { nfc_warps[nfc_tid / 32]->bar.arrive_and_wait(); }
template <typename T> T __shfl_xor_sync(unsigned, T v, int off) {
  nfc_warp& w = *nfc_warps[nfc_tid / 32];
  memcpy(&w.slot[nfc_tid % 32], &v, sizeof(T));
  w.bar.arrive_and_wait();
  T r;
  memcpy(&r, &w.slot[(nfc_tid % 32) ^ off], sizeof(T));
  w.bar.arrive_and_wait();
  return r;
}
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float __int_as_float(int i) { float f; memcpy(&f, &i, 4); return f; }
inline double __longlong_as_double(long long i) { double f; memcpy(&f, &i, 8); return f; }
inline unsigned __umulhi(unsigned a, unsigned b) {
  return (unsigned)(((unsigned long long)a * b) >> 32);
}

typedef _Float16 __half;
inline __half __float2half_rn(float x) { return (__half)x; }
inline float __half2float(__half x) { return (float)x; }
struct __nv_bfloat16 { uint16_t bits; };
inline __nv_bfloat16 __float2bfloat16_rn(float x) {
  uint32_t u; memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {(uint16_t)((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return {(uint16_t)(u >> 16)};
}
inline float __bfloat162float(__nv_bfloat16 x) {
  uint32_t u = (uint32_t)x.bits << 16; float f; memcpy(&f, &u, 4); return f;
}

namespace nvcuda { namespace wmma {
struct matrix_a {}; struct matrix_b {}; struct accumulator {}; struct row_major {};
namespace precision { struct tf32 {}; }
enum layout_t { mem_row_major };
template <class Use, int M, int N, int K, class T, class Layout = void> struct fragment {
  static constexpr int rows = std::is_same_v<Use, matrix_b> ? K : M;
  static constexpr int cols = std::is_same_v<Use, matrix_a> ? K : N;
  static constexpr int num_elements = rows * cols;
  float x[rows * cols];
};
inline float nfc_value(__half v) { return (float)v; }
inline float nfc_value(__nv_bfloat16 v) { return __bfloat162float(v); }
inline float nfc_value(float v) { return v; }
inline float __float_to_tf32(float x) {
  uint32_t u; memcpy(&u, &x, 4);
  if ((u & 0x7f800000u) != 0x7f800000u) { u += 0xfffu + ((u >> 13) & 1u); u &= 0xffffe000u; }
  float f; memcpy(&f, &u, 4); return f;
}
template <class F> void fill_fragment(F& f, float v) {
  for (int i = 0; i < F::num_elements; ++i) f.x[i] = v;
}
template <class F, class T> void load_matrix_sync(F& f, const T* p, unsigned ldm) {
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) f.x[r * F::cols + c] = nfc_value(p[r * ldm + c]);
}
template <class D, class A, class B, class C> void mma_sync(D& d, const A& a, const B& b,
                                                            const C& c) {
  float out[D::num_elements];
  for (int i = 0; i < D::rows; ++i)
    for (int j = 0; j < D::cols; ++j) {
      float s = c.x[i * D::cols + j];
      for (int k = 0; k < A::cols; ++k) s += a.x[i * A::cols + k] * b.x[k * B::cols + j];
      out[i * D::cols + j] = s;
    }
  memcpy(d.x, out, sizeof(out));
}
template <class F> void store_matrix_sync(float* p, const F& f, unsigned ldm, layout_t) {
  if (nfc_tid % 32) return;  // one lane stores; the others read after __syncwarp()
  for (int r = 0; r < F::rows; ++r)
    for (int c = 0; c < F::cols; ++c) p[r * ldm + c] = f.x[r * F::cols + c];
}
}}  // namespace nvcuda::wmma

template <class F> void nfc_launch(int grid, int block, F kernel) {
  std::barrier<> bar(block);
  nfc_block_barrier = &bar;
  nfc_warps.clear();
  for (int w = 0; w < (block + 31) / 32; ++w) nfc_warps.emplace_back(new nfc_warp());
  std::vector<std::thread> threads;
  for (int t = 0; t < block; ++t)
    threads.emplace_back([&, t] {
      nfc_tid = t;
      threadIdx.x = t;
      for (int b = 0; b < grid; ++b) {
        blockIdx.x = b;
        kernel();
        bar.arrive_and_wait();
      }
    });
  for (auto& th : threads) th.join();
}
"""


class HostCompileError(RuntimeError):
    """The host C++ compiler rejected the generated CUDA C (with the shim)."""


def host_compiler() -> str | None:
    """The C++ compiler (`$CXX`, `c++`, `g++`, `clang++`), None when there is none."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return name
    return None


def _launcher(k: GpuKernel) -> str:
    f = k.func
    args = ", ".join(f"({'' if n < f.n_outputs else 'const '}{CTYPE[b.dtype]}*)a[{n}]"
                     for n, b in enumerate(f.params))
    return (f'extern "C" void nfc_host_{f.name}(void** a) {{\n'
            f"  nfc_launch({k.grid}, {k.block}, [&] {{ {f.name}({args}); }});\n}}\n")


def build_host(kernels: Sequence[GpuKernel], workdir: str | os.PathLike[str] | None = None
               ) -> ctypes.CDLL:
    """Compile the rendered kernels with the shim into a loaded shared library."""
    cxx = host_compiler()
    if cxx is None:
        raise HostCompileError("no host C++ compiler (set CXX)")
    cuda = "\n".join(line for line in render_kernels(kernels).splitlines()
                     if not line.startswith("#include"))  # the shim stands in for them
    source = HOST_SHIM + cuda + "\n" + "".join(_launcher(k) for k in kernels)
    digest = hashlib.sha256(source.encode()).hexdigest()[:16]
    tmp = Path(workdir or tempfile.mkdtemp(prefix="nfc-host-"))
    src, lib = tmp / f"k_{digest}.cpp", tmp / f"k_{digest}.so"
    src.write_text(source)
    cmd = [cxx, "-std=c++20", "-O1", "-shared", "-fPIC", "-pthread", "-w", "-o", str(lib),
           str(src)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise HostCompileError(f"{' '.join(cmd)} failed:\n{done.stderr[-4000:]}")
    return ctypes.CDLL(str(lib))


def run_host(program: GpuProgram, inputs: Sequence[Any] | Mapping[str, Any],
             lib: ctypes.CDLL | None = None) -> list[np.ndarray]:
    """`program`'s outputs computed by its CUDA C on CPU threads (`lib`: from `build_host`
    over its kernels, built here when None)."""
    lib = lib if lib is not None else build_host(program.kernels)
    ins = program.params[program.n_outputs:]
    values = [inputs[b.name] for b in ins] if isinstance(inputs, Mapping) else list(inputs)
    arrays = {b.name: to_device_layout(x, b).copy() for b, x in zip(ins, values, strict=True)}
    for b in (*program.params[:program.n_outputs], *program.temps):
        arrays[b.name] = host_buffer(b)
        arrays[b.name].fill(0)
    for k in program.kernels:
        ptrs = (ctypes.c_void_p * len(k.func.params))(
            *[arrays[b.name].ctypes.data for b in k.func.params])
        getattr(lib, f"nfc_host_{k.func.name}")(ptrs)
    return [from_device_layout(arrays[b.name], b) for b in program.params[:program.n_outputs]]
