"""Printed names are unique, prefer their hints, and cost linear work however many values
share a hint (the report: 20,000 `h = h * 1.0` took 21 s to print)."""

from __future__ import annotations

from nfc.ir import DType, TensorType, Value
from nfc.printer import Namer

T = TensorType((2,), DType.F32)


class CountingSet(set[str]):
    """A set that counts membership tests."""

    lookups = 0

    def __contains__(self, item: object) -> bool:
        CountingSet.lookups += 1
        return super().__contains__(item)


def name_all(hints: list[str | None]) -> tuple[list[str], int]:
    namer = Namer()
    namer.used = CountingSet()
    CountingSet.lookups = 0
    values = [Value(T, h) for h in hints]
    for v in values:
        namer.add(v)
    return [namer(v) for v in values], CountingSet.lookups


def test_repeated_hints_are_named_in_linear_work() -> None:
    for n in (1000, 8000):
        names, lookups = name_all(["h"] * n)
        assert names == ["%h"] + [f"%h_{k}" for k in range(1, n)]
        # a quadratic search would test about n * n / 2 names
        assert lookups <= 2 * n


def test_suffixes_skip_names_taken_by_hints() -> None:
    names, _ = name_all(["h", "h_2", "h", "h", "h", None, "0", None, "a-b", "a_b"])
    assert names == ["%h", "%h_2", "%h_1", "%h_3", "%h_4", "%0", "%0_1", "%1", "%a_b",
                     "%a_b_1"]


def test_a_value_is_named_once() -> None:
    namer = Namer()
    v = Value(T, "x")
    namer.add(v)
    namer.add(v)
    assert namer(v) == "%x" and namer(Value(T, "x")).startswith("%<<unknown")
