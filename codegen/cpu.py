"""The CPU target: host detection and the LLVM target machine.

The schedule heuristics need the vector width and the number of vector registers; the emitter
needs the function attributes that make LLVM use them (`"prefer-vector-width"="512"` on
AVX-512 hosts, where LLVM otherwise stays at 256-bit). Everything comes from
`llvm.get_host_cpu_name()` and `get_host_cpu_features()`, so a host without AVX-512 (or without
AVX at all) gets a schedule and code that fit it.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

from nfc.ir import DType


@dataclass(frozen=True)
class CpuTarget:
    """What codegen needs to know about a CPU."""

    cpu: str
    """LLVM's CPU name (`znver3`, `sapphirerapids`, ...)."""
    features: str
    """LLVM feature string (`+avx2,+fma,-avx512f,...`)."""
    triple: str = "x86_64-unknown-linux-gnu"

    def has(self, feature: str) -> bool:
        """Whether the feature string enables `feature` (e.g. `avx512f`)."""
        return feature in self.enabled

    @property
    def enabled(self) -> frozenset[str]:
        """The features the string leaves enabled: the last `+f`/`-f` of each name wins, as
        in LLVM (so an override appended to the host's string, `...,+avx512f,-avx512f`,
        turns the feature off)."""
        state: dict[str, bool] = {}
        for item in self.features.split(","):
            if item[:1] in "+-" and len(item) > 1:
                state[item[1:]] = item[0] == "+"
        return frozenset(f for f, on in state.items() if on)

    @property
    def vector_bits(self) -> int:
        """Width of the vector registers the schedules use."""
        if self.has("avx512f"):
            return 512
        if self.has("avx"):
            return 256
        return 128

    @property
    def vector_registers(self) -> int:
        """Number of architectural vector registers."""
        return 32 if self.has("avx512f") else 16

    @property
    def fma(self) -> bool:
        """Fused multiply-add in hardware."""
        return self.has("fma") or self.has("avx512f")

    def lanes(self, dtype: DType) -> int:
        """Elements of `dtype` per vector register."""
        return max(1, self.vector_bits // (8 * dtype.itemsize))

    @property
    def function_attributes(self) -> tuple[str, ...]:
        """LLVM function attributes for kernels on this target."""
        attrs = [f'"target-cpu"="{self.cpu}"', f'"target-features"="{self.features}"',
                 f'"prefer-vector-width"="{self.vector_bits}"']
        return tuple(attrs)

    def key(self) -> str:
        """A string identifying the target (for caches): CPU name and enabled features."""
        on = sorted(f"+{f}" for f in self.enabled)
        return self.cpu + ":" + ",".join(on)


@functools.cache
def _init_llvm() -> None:
    import llvmlite.binding as llvm

    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()


@functools.cache
def host_target() -> CpuTarget:
    """The CPU this process runs on (`NFC_CPU_FEATURES` may override the features, e.g. to
    test the AVX2 path on an AVX-512 host: `-avx512f`)."""
    import llvmlite.binding as llvm

    _init_llvm()
    feats = llvm.get_host_cpu_features().flatten()
    extra = os.environ.get("NFC_CPU_FEATURES")
    if extra:
        feats = feats + "," + extra
    return CpuTarget(llvm.get_host_cpu_name(), feats, llvm.get_process_triple())


def target_machine(target: CpuTarget | None = None):  # -> llvm.TargetMachine
    """An LLVM target machine for `target` (the host by default): opt level 3, PIC."""
    import llvmlite.binding as llvm

    _init_llvm()
    t = target or host_target()
    return llvm.Target.from_triple(t.triple).create_target_machine(
        cpu=t.cpu, features=t.features, opt=3, reloc="pic", codemodel="default")
