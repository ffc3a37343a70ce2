"""Device parameters of the fusion reward: bandwidth, peak compute, launch overheads.

The `fuse` pass estimates `R = ΔT/P_d + ΔC/P_c + ΔK·L` for every candidate merge. The device
enters only through the numbers here. Passes may not import the backend or the runtime
(layering), so these are plain data with defaults of a 2-vCPU server core (the machine
behind a run may be an AVX2-only or an AVX-512 CPU: measure it) and are given to the pass as
options:

    nfc opt model.nf -p 'fuse{bandwidth-gbs=15,peak-gflops=80,region-us=2}'

`nfc.codegen.devbench.measure()` measures them on the machine with JIT-compiled
micro-kernels, and `nfc.runtime.device_params.device_params()` caches that measurement in the
tuning cache (keyed by the CPU category) and prints the option string for the pipeline;
`fuse{params=measured}` reads that cached measurement (`measured_device_params`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class DeviceParams:
    """What the fusion reward needs to know about the device.

    On a CPU a "kernel launch" has two parts: the call of the kernel function (the entry of
    a compiled step calls its kernels directly; this is loop prologue and pointer setup) and,
    when a loop nest runs on threads, the start of a libgomp parallel region. The reward
    counts both: `ΔK·L = Δkernels · launch_us + Δregions · region_us`.
    """

    bandwidth_gbs: float = 15.0
    """P_d: off-chip (DRAM) bandwidth of one core in GB/s (≈15 GB/s for `a + b` on one core)."""
    peak_gflops: float = 80.0
    """P_c: sustained fp32 compute of one core in GFLOP/s (half the FMA peak: the FLOP counts
    of nfc.cost count an FMA as two, and generic loop nests do not reach the peak)."""
    elementwise_gflops: float = 4.0
    """Rate of transcendental functions in elementwise code, in nfc.cost FLOPs (one per
    `exp`, `tanh`, `sigmoid`, ...) per second: vectorised polynomials of 10-20 instructions
    each. The arithmetic around them (adds, multiplies, compares, selects) runs at
    `peak_gflops` (before this split every elementwise FLOP ran at this rate, which priced
    recomputing `mm + b` or a relu mask as if it were an `exp`)."""
    launch_us: float = 0.01
    """Overhead of one kernel call in microseconds: a direct call plus loop set-up (measured
    ≈ 2 ns for a one-element kernel; rounded up for the pointer set-up of a real call)."""
    region_us: float = 2.0
    """Overhead of one libgomp parallel region (fork/join of the thread team) in µs."""
    cache_kib: int = 512
    """An intermediate up to this size (KiB) that a kernel writes and reads back stays in the
    core's L2 cache, so its traffic is free; bigger ones go to DRAM (512 KiB: the L2 of one
    Zen 3 core, a quarter of a Sapphire Rapids core's)."""
    parallel_work: int = 1 << 16
    """Iteration points (output times reduction) from which codegen's schedule marks a loop
    nest parallel (mirrors `nfc.codegen.space.PARALLEL_WORK`)."""
    parallel_min_work: int = 200_000
    """Estimated work (a store plus its value's operations, per vector of `vector_lanes`)
    below which the emitter runs a parallel-marked nest serially, without a parallel region
    (mirrors `nfc.codegen.llvm.parallel.PARALLEL_MIN_WORK`)."""
    vector_lanes: int = 8
    """f32 lanes of a vector register (8: AVX2, 16: AVX-512), for that work estimate."""

    @property
    def cache_bytes(self) -> int:
        """`cache_kib` in bytes."""
        return self.cache_kib * 1024

    def seconds(self, nbytes: float, flops: float, kernels: float, regions: float,
                elementwise_flops: float = 0.0) -> float:
        """The optimistic time of `nbytes` of traffic, `flops` (of which `elementwise_flops`
        are transcendental functions in elementwise code), kernel calls and parallel
        regions."""
        return (nbytes / (self.bandwidth_gbs * 1e9)
                + (flops - elementwise_flops) / (self.peak_gflops * 1e9)
                + elementwise_flops / (self.elementwise_gflops * 1e9)
                + kernels * self.launch_us * 1e-6 + regions * self.region_us * 1e-6)

    def pipeline_options(self) -> str:
        """These parameters as `fuse` options: `bandwidth-gbs=15.0,peak-gflops=80.0,...`."""
        return ",".join(f"{f.name.replace('_', '-')}={getattr(self, f.name)}"
                        for f in fields(self))


#: The defaults, for the machine class the project targets.
DEFAULT_DEVICE = DeviceParams()


#: Entry-point group of the functions that return this machine's measured parameters, or
#: None when nothing was measured (nfc.runtime registers the tuning cache's lookup; passes
#: may not import the runtime).
PROVIDERS_GROUP = "nfc.device_params"


def measured_device_params() -> DeviceParams | None:
    """This machine's measured parameters from the first provider that has them, else None.
    Nothing is measured here: a provider only looks its cache up."""
    from importlib.metadata import entry_points

    for ep in sorted(entry_points(group=PROVIDERS_GROUP), key=lambda e: e.name):
        found = ep.load()()
        if found is not None:
            return found
    return None
