"""CPU target feature strings: the last +/- of a feature wins, as in LLVM."""

from nfc.codegen.cpu import CpuTarget


def _target(features: str) -> CpuTarget:
    return CpuTarget("znver4", features, "x86_64-unknown-linux-gnu")


def test_override_appended_to_host_features_disables_avx512():
    host = "+avx,+avx2,+fma,+avx512f,+avx512bw"
    t = _target(host + ",-avx512f,-avx512bw")
    assert not t.has("avx512f") and t.has("avx2")
    assert t.vector_bits == 256 and t.vector_registers == 16 and t.fma
    assert _target(host).vector_bits == 512


def test_key_lists_enabled_features_once():
    t = _target("+avx2,+fma,+avx512f,-avx512f,+fma")
    assert t.key() == "znver4:+avx2,+fma"
    assert t.enabled == frozenset({"avx2", "fma"})
