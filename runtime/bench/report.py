"""The comparison tables of `nfc bench`, from its records (the JSON lines).

    model        batch thr     nfc ms       torch ms   torch-compile ms         jax ms
    mlp3           256   1      7.950   12.100 1.52x     10.300 1.30x   9.800 1.23x

A ratio is the framework's step time over nfc's (above 1: nfc is faster). Failed cases show
their status with a note number; the notes list the reasons under the table.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

Record = Mapping[str, Any]


def _key(r: Record) -> tuple[str, int]:
    return (str(r["model"]), int(r["threads"]))


class _Notes:
    """Numbered reasons, one per distinct text."""

    def __init__(self) -> None:
        self.texts: list[str] = []

    def ref(self, text: str) -> int:
        if text not in self.texts:
            self.texts.append(text)
        return self.texts.index(text) + 1


def _cell(r: Record | None, notes: _Notes, ratio: bool) -> str:
    if r is None:
        return "-"
    if r.get("status") != "ok" or r.get("step_ms") is None:
        reason = f"{r.get('framework')}: {r.get('status')}: {r.get('error') or 'no result'}"
        return f"{r.get('status')} [{notes.ref(reason)}]"
    text = _ms(r["step_ms"])
    if ratio and r.get("ratio_to_nfc") is not None:
        text += f" {r['ratio_to_nfc']:.2f}x"
    return text


def _ms(v: float) -> str:
    return f"{v:.3f}" if v < 100 else f"{v:.1f}"


def _order(records: Iterable[Record]) -> tuple[list[tuple[str, int]], list[str]]:
    rows: list[tuple[str, int]] = []
    fws: list[str] = []
    for r in records:
        if _key(r) not in rows:
            rows.append(_key(r))
        if r["framework"] not in fws:
            fws.append(str(r["framework"]))
    return rows, fws


def time_table(records: Sequence[Record]) -> str:
    """Median step time per model, thread count and framework, with the ratio to nfc."""
    rows, fws = _order(records)
    by = {(_key(r), r["framework"]): r for r in records}
    notes = _Notes()
    width = {fw: 9 if fw == "nfc" else 15 for fw in fws}
    head = f"{'model':<16} {'batch':>5} {'thr':>3} " + " ".join(
        f"{fw + ' ms':>{width[fw]}}" for fw in fws)
    lines = [head]
    for key in rows:
        batch = next((r.get("batch") for (k, _), r in by.items() if k == key and r.get("batch")),
                     None)
        cells = [f"{_cell(by.get((key, fw)), notes, fw != 'nfc'):>{width[fw]}}" for fw in fws]
        lines.append(f"{key[0]:<16} {batch or '-':>5} {key[1]:>3} " + " ".join(cells))
    lines.append("ratio = the framework's step time / nfc's step time (above 1: nfc is faster)")
    lines += [f"[{i}] {t}" for i, t in enumerate(notes.texts, 1)]
    return "\n".join(lines)


def cost_table(records: Sequence[Record]) -> str:
    """Per model: compile time (cold, s) and peak RSS (MB) of each framework's process,
    on the first thread count that has them."""
    rows, fws = _order(records)
    by: dict[tuple[str, str], Record] = {}
    for r in records:
        if r.get("status") == "ok":
            by.setdefault((str(r["model"]), str(r["framework"])), r)
    models = list(dict.fromkeys(m for m, _ in rows))
    comp = [fw for fw in fws if fw != "torch"]
    head = (f"{'model':<16} " + " ".join(f"{fw + ' s':>16}" for fw in comp) + "  "
            + " ".join(f"{fw + ' MB':>16}" for fw in fws))
    lines = ["compile time (s, cold unless marked) and peak RSS of the process (MB):", head]
    for m in models:
        cells = []
        for fw in comp:
            r = by.get((m, fw))
            c = None if r is None else r.get("compile_s")
            mark = "" if r is None or r.get("compile_kind") in (None, "cold") else "*"
            cells.append(f"{'-' if c is None else f'{c:.1f}{mark}':>16}")
        mem = []
        for fw in fws:
            r = by.get((m, fw))
            v = None if r is None else r.get("peak_rss_mb")
            mem.append(f"{'-' if v is None else f'{v:.0f}':>16}")
        lines.append(f"{m:<16} " + " ".join(cells) + "  " + " ".join(mem))
    if any(r.get("compile_kind") == "cached" for r in records):
        lines.append("* from the library cache (--quick), not a cold compile")
    return "\n".join(lines) + "\n\n" + memory_table(records)


def step_peak_mb(r: Record) -> float | None:
    """The training step's own peak memory in MB: the process's peak RSS minus its RSS after
    the imports (case file read, framework imported, nothing built), measured alike in every
    framework's worker; None when either is missing."""
    v = r.get("step_peak_mb")
    if v is not None:
        return float(v)
    peak, base = r.get("peak_rss_mb"), r.get("rss_after_import_mb")
    if peak is None or base is None:
        return None
    return float(peak) - float(base)


def memory_table(records: Sequence[Record]) -> str:
    """Per model: each framework's step peak (`step_peak_mb`) side by side, with the ratio to
    nfc's, and nfc's static plan (parameters, optimizer state, inputs, outputs and arena) on
    the first thread count that has them."""
    rows, fws = _order(records)
    by: dict[tuple[str, str], Record] = {}
    for r in records:
        if r.get("status") == "ok" and step_peak_mb(r) is not None:
            by.setdefault((str(r["model"]), str(r["framework"])), r)
    models = list(dict.fromkeys(m for m, _ in rows))
    head = f"{'model':<16} {'nfc plan MB':>12} " + " ".join(f"{fw + ' MB':>18}" for fw in fws)
    lines = ["peak memory of the step (MB: peak RSS minus RSS after the imports):", head]
    for m in models:
        nfc = by.get((m, "nfc"))
        base = None if nfc is None else step_peak_mb(nfc)
        plan = None if nfc is None else nfc.get("planned_mb")
        cells = []
        for fw in fws:
            r = by.get((m, fw))
            v = None if r is None else step_peak_mb(r)
            text = "-" if v is None else f"{v:.1f}"
            if v is not None and fw != "nfc" and base:
                text += f" {v / base:.2f}x"
            cells.append(f"{text:>18}")
        lines.append(f"{m:<16} {'-' if plan is None else f'{plan:.1f}':>12} " + " ".join(cells))
    lines.append("ratio = the framework's step peak / nfc's (above 1: nfc uses less)")
    return "\n".join(lines)


def behind(records: Sequence[Record], n: int = 3) -> list[tuple[Record, Record]]:
    """The `n` (nfc record, fastest other record) pairs where nfc is slower than the fastest
    other framework, furthest behind first."""
    best: dict[tuple[str, int], Record] = {}
    nfc: dict[tuple[str, int], Record] = {}
    for r in records:
        if r.get("status") != "ok" or r.get("step_ms") is None:
            continue
        if r["framework"] == "nfc":
            nfc[_key(r)] = r
        elif _key(r) not in best or r["step_ms"] < best[_key(r)]["step_ms"]:
            best[_key(r)] = r
    pairs = [(nfc[k], best[k]) for k in nfc if k in best
             and nfc[k]["step_ms"] > best[k]["step_ms"]]
    pairs.sort(key=lambda p: -p[0]["step_ms"] / p[1]["step_ms"])
    return pairs[:n]


def behind_text(records: Sequence[Record], n: int = 3) -> str:
    """The cases where nfc is furthest behind, with the slowest kernels when profiled."""
    lines = []
    for a, b in behind(records, n):
        lines.append(f"{a['model']} ({a['threads']} thread{'s' if a['threads'] > 1 else ''}): "
                     f"nfc {_ms(a['step_ms'])} ms vs {b['framework']} {_ms(b['step_ms'])} ms "
                     f"({a['step_ms'] / b['step_ms']:.1f}x slower)")
        prof = a.get("profile")
        for k in (prof or {}).get("top", [])[:4]:
            lines.append(f"    {k['percent']:5.1f}%  {k['ms']:8.3f} ms  {k['gflops']:7.2f} GFLOP/s "
                         f"{k['gbytes']:6.2f} GB/s  {k['label'][:90]}")
    return "\n".join(lines)


def markdown(records: Sequence[Record]) -> str:
    """The step times as a Markdown table: one row per model and thread count, each framework's
    median ms and its ratio to nfc; failures as their status with the reason in a note."""
    rows, fws = _order(records)
    by = {(_key(r), r["framework"]): r for r in records}
    notes = _Notes()
    lines = ["| model | batch | threads | " + " | ".join(fws) + " |",
             "|---|---:|---:|" + "---:|" * len(fws)]
    for key in rows:
        batch = next((r.get("batch") for (k, _), r in by.items() if k == key and r.get("batch")),
                     None)
        cells = []
        for fw in fws:
            r = by.get((key, fw))
            if r is None:
                cells.append("-")
            elif r.get("status") != "ok" or r.get("step_ms") is None:
                reason = f"{fw}: {r.get('status')}: {r.get('error') or 'no result'}"
                cells.append(f"{r.get('status')} [{notes.ref(reason)}]")
            elif fw == "nfc" or r.get("ratio_to_nfc") is None:
                cells.append(_ms(r["step_ms"]))
            else:
                cells.append(f"{_ms(r['step_ms'])} ({r['ratio_to_nfc']:.2f}x)")
        lines.append(f"| {key[0]} | {batch or '-'} | {key[1]} | " + " | ".join(cells) + " |")
    lines += [""] + [f"[{i}] {t.replace('|', '/')}" for i, t in enumerate(notes.texts, 1)]
    return "\n".join(lines)


def profile_text(records: Sequence[Record], top: int = 5) -> str:
    """nfc's slowest kernels per profiled case (`nfc bench --profile`): share of the kernel
    time, ms per step, achieved GFLOP/s and GB/s (nfc.cost counts over the measured time)."""
    lines = []
    for r in records:
        prof = r.get("profile")
        if r.get("framework") != "nfc" or not prof:
            continue
        lines.append(f"{r['model']} ({r['threads']} thread{'s' if r['threads'] > 1 else ''}): "
                     f"{prof['kernel_ms']:.3f} ms in {prof['kernels']} kernel calls per step")
        for name, g in (prof.get("groups") or {}).items():
            lines.append(f"    {name}: {g['kernels']} kernels, {g['percent']:.1f}% of the time, "
                         f"{g['gflops']:.2f} GFLOP/s")
        for k in prof["top"][:top]:
            lines.append(f"    {k['percent']:5.1f}%  {k['ms']:9.3f} ms  {k['gflops']:7.2f} GFLOP/s "
                         f"{k['gbytes']:6.2f} GB/s  {k['label'][:100]}")
    return "\n".join(lines)
