"""`nfc cache`: inspect, share and repair the tuning cache.

    nfc cache [--db PATH] list [--category ID] [--prefix KEY]
    nfc cache show KEY [--category ID] [--all]
    nfc cache export [-o FILE] [--category ID] [--key KEY]
    nfc cache import FILE [--allow-foreign-category] [--category JSON|@FILE]
    nfc cache merge OTHER.sqlite
    nfc cache prune [--failed] [--keep-dominated] [--older-than DAYS] [--category ID] [--vacuum]
    nfc cache verify
    nfc cache repair [--force]

Category ids may be abbreviated to any unique prefix. Works standalone too:
`python -m nfc.cli.cache_cmd --db PATH verify`.
"""

from __future__ import annotations

import argparse
import io
import json
import sqlite3
import sys
import traceback
from pathlib import Path
from typing import Any

from nfc.fsutil import atomic_output
from nfc.runtime.tuning import exchange
from nfc.runtime.tuning.cache import CacheError, TuningCache, default_cache_path
from nfc.runtime.tuning.category import default_category, describe_category
from nfc.runtime.tuning.model import CacheDamaged, MergeStats

#: Rejected records listed one by one; the rest are only counted.
SHOW_REJECTED = 10


def _fmt_time(t: float | None) -> str:
    if t is None:
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if t >= scale:
            return f"{t / scale:.3g} {unit}"
    return f"{t / 1e-9:.3g} ns"


def _db_path(args: argparse.Namespace) -> Path:
    return Path(args.db) if getattr(args, "db", None) else default_cache_path()


def _open(args: argparse.Namespace, *, create: bool = False) -> TuningCache:
    return TuningCache(_db_path(args), create=create)


def _category(cache: TuningCache, prefix: str | None) -> str | None:
    if prefix is None:
        return None
    found = [cid for cid in cache.categories() if cid.startswith(prefix)]
    if len(found) != 1:
        what = "no category" if not found else f"{len(found)} categories"
        raise CacheError(f"{what} in '{cache.path}' match '{prefix}'")
    return found[0]


def _cmd_list(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        cats = cache.categories()
        keys = cache.list_keys(_category(cache, args.category), prefix=args.prefix)
    for cid, cat in cats.items():
        if any(k.category_id == cid for k in keys):
            print(f"category {cid[:12]}: {describe_category(cat)}")
    print(f"{'CATEGORY':<12}  {'OK':>3} {'PRUNED':>6} {'FAILED':>6} {'BEST':>10}  KEY  DESC")
    for k in keys:
        print(f"{k.category_id[:12]:<12}  {k.n_ok:>3} {k.n_pruned:>6} {k.n_failed:>6} "
              f"{_fmt_time(k.best_time):>10}  {k.key}  {k.desc}")
    print(f"{len(keys)} kernel(s)")
    return 0


def _cmd_show(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        cats = cache.categories()
        only = _category(cache, args.category)
        shown = 0
        for cid in cats:
            if only is not None and cid != only:
                continue
            entries = cache.entries(cid, args.key, include_pruned=args.all)
            if not entries:
                continue
            shown += 1
            print(f"category {cid[:12]} ({describe_category(cats[cid])}), key {args.key}")
            for e in entries:
                flags = "".join(c for c, on in (("R", e.reproducible), ("N", e.naive),
                                                 ("P", e.pruned)) if on and e.time is not None)
                spread = f"±{_fmt_time(e.spread)}" if e.spread is not None else ""
                print(f"  {e.status:<7} {_fmt_time(e.time):>10} {spread:<10} "
                      f"ws {e.workspace:<9} {flags:<3} {json.dumps(e.schedule, sort_keys=True)}"
                      + (f"  # {e.error.splitlines()[-1]}" if e.error else ""))
    if not shown:
        raise CacheError(f"no records for key '{args.key}'")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    with _open(args) as cache:
        cat = _category(cache, args.category)
        if args.output in (None, "-"):
            n = cache.export_jsonl(sys.stdout, category=cat, key=args.key)
        else:
            # all or nothing: a failure (a damaged row, a full disk) leaves no half export
            with atomic_output(args.output) as raw:
                fp = io.TextIOWrapper(raw, encoding="utf-8", newline="\n")
                n = cache.export_jsonl(fp, category=cat, key=args.key)
                fp.flush()
                fp.detach()  # atomic_output closes the file
    print(f"exported {n} record(s)", file=sys.stderr)
    return 0


def _current_category(text: str | None) -> dict[str, Any]:
    if text is None:
        return default_category()
    try:
        raw = Path(text[1:]).read_text(encoding="utf-8") if text.startswith("@") else text
        cat = json.loads(raw)
    except json.JSONDecodeError as err:
        raise CacheError(f"--category is not JSON: {err.msg}") from None
    except RecursionError:
        raise CacheError("--category is not a category: JSON nested too deeply") from None
    if not isinstance(cat, dict):
        raise CacheError("--category must be a JSON object")
    return cat


def _print_rejected(stats: MergeStats) -> None:
    if not stats.rejected:
        return
    print(f"rejected {len(stats.rejected)} implausible record(s) (not stored):",
          file=sys.stderr)
    for why in stats.rejected[:SHOW_REJECTED]:
        print(f"  {why}", file=sys.stderr)
    if len(stats.rejected) > SHOW_REJECTED:
        print(f"  ... and {len(stats.rejected) - SHOW_REJECTED} more", file=sys.stderr)


def _cmd_import(args: argparse.Namespace) -> int:
    current = _current_category(args.category)
    text = Path(args.file).read_text(encoding="utf-8")
    # validate before opening, so a refused import does not leave an empty cache behind
    records, _ = exchange.read_jsonl(io.StringIO(text), source=args.file)
    if not args.allow_foreign_category:
        exchange.check_categories(records, current)
    with _open(args, create=True) as cache:
        stats = cache.import_jsonl(io.StringIO(text), current_category=current,
                                   allow_foreign_category=args.allow_foreign_category,
                                   source=args.file)
    print(f"imported {stats.added} new, {stats.updated} updated, "
          f"{stats.skipped} skipped (not newer), {len(stats.rejected)} rejected")
    _print_rejected(stats)
    return 0


def _cmd_merge(args: argparse.Namespace) -> int:
    with _open(args, create=True) as cache:
        stats = cache.merge(args.other)
    print(f"merged {stats.added} new, {stats.updated} updated, {stats.skipped} skipped, "
          f"{len(stats.rejected)} rejected")
    _print_rejected(stats)
    return 0


def _cmd_prune(args: argparse.Namespace) -> int:
    older = None if args.older_than is None else args.older_than * 86400.0
    with _open(args) as cache:
        n = cache.prune(dominated=not args.keep_dominated, failed=args.failed,
                        older_than=older, category=_category(cache, args.category),
                        vacuum=args.vacuum)
    print(f"deleted {n} record(s)")
    return 0


def _cmd_verify(args: argparse.Namespace) -> int:
    path = _db_path(args)
    try:
        with TuningCache(path, create=False, check=False) as cache:
            problems = cache.verify()
    except CacheDamaged as err:  # so damaged that it does not even open
        problems = err.problems
    for p in problems:
        print(f"problem: {p}")
    if problems:
        raise CacheError(f"'{path}' has {len(problems)} problem(s); `nfc cache repair --db "
                         f"{path}` rebuilds it from the records that can still be read")
    print("ok")
    return 0


def _cmd_repair(args: argparse.Namespace) -> int:
    from nfc.runtime.tuning.repair import repair_cache

    result = repair_cache(_db_path(args), force=args.force)
    for p in result.problems[:SHOW_REJECTED]:
        print(f"problem: {p}", file=sys.stderr)
    print(result.message())
    for why in result.rejected[:SHOW_REJECTED]:
        print(f"  left out: {why}", file=sys.stderr)
    return 0


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--db", metavar="PATH", default=None,
                        help=f"cache file (default: {default_cache_path()}, or under "
                             "$NFC_CACHE_DIR)")
    db = argparse.ArgumentParser(add_help=False)
    db.add_argument("--db", metavar="PATH", default=argparse.SUPPRESS, help="cache file")
    sub = parser.add_subparsers(dest="cache_command", metavar="ACTION")

    def add(name: str, fn: Any, help_text: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, parents=[db], help=help_text, description=help_text)
        p.set_defaults(cache_func=fn)
        return p

    p = add("list", _cmd_list, "list tuned kernels")
    p.add_argument("--category", metavar="ID", help="only this category (id prefix)")
    p.add_argument("--prefix", default="", metavar="KEY", help="only keys starting so")
    p = add("show", _cmd_show, "show every measured schedule of one kernel")
    p.add_argument("key", help="the kernel's key")
    p.add_argument("--category", metavar="ID", help="only this category (id prefix)")
    p.add_argument("--all", action="store_true", help="include dominated (pruned) entries")
    p = add("export", _cmd_export, "write records as JSON lines")
    p.add_argument("-o", "--output", metavar="FILE", help="output file (default: stdout)")
    p.add_argument("--category", metavar="ID", help="only this category (id prefix)")
    p.add_argument("--key", help="only this kernel")
    p = add("import", _cmd_import, "add the records of an export")
    p.add_argument("file", help="a file written by `nfc cache export`")
    p.add_argument("--allow-foreign-category", action="store_true",
                   help="accept records measured under another category (device, version)")
    p.add_argument("--category", metavar="JSON|@FILE",
                   help="the current category (default: this machine's CPU)")
    p = add("merge", _cmd_merge, "add every record of another cache file")
    p.add_argument("other", help="another tuning cache (.sqlite)")
    p = add("prune", _cmd_prune, "delete dominated (and optionally failed or old) records")
    p.add_argument("--failed", action="store_true", help="also delete failed records")
    p.add_argument("--keep-dominated", action="store_true", help="keep dominated records")
    p.add_argument("--older-than", type=float, metavar="DAYS", help="delete older records")
    p.add_argument("--category", metavar="ID", help="only in this category (id prefix)")
    p.add_argument("--vacuum", action="store_true", help="compact the file afterwards")
    add("verify", _cmd_verify, "check integrity, JSON fields and the Pareto rule")
    p = add("repair", _cmd_repair, "rebuild a damaged cache from the records that still "
            "read back (the damaged file is kept as <file>.damaged-<time>)")
    p.add_argument("--force", action="store_true", help="rebuild even when verify finds "
                   "no problem")
    parser.set_defaults(func=run, cache_parser=parser)


def add_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `nfc cache` on the main CLI's subparsers; it dispatches through `args.func`."""
    parser = subparsers.add_parser("cache", help="inspect, share and repair the tuning cache",
                                   description="Inspect, share and repair the tuning cache.")
    _configure(parser)
    return parser


def run(args: argparse.Namespace) -> int:
    """Run the parsed `nfc cache` command; a user's mistake prints `nfc: error: ...` and
    returns 1."""
    fn = getattr(args, "cache_func", None)
    if fn is None:
        args.cache_parser.print_help(sys.stderr)
        return 1
    try:
        return int(fn(args))
    except CacheError as err:
        print(f"nfc: error: {err}", file=sys.stderr)
    except sqlite3.DatabaseError as err:
        print(f"nfc: error: the tuning cache is damaged: {err}", file=sys.stderr)
    except UnicodeDecodeError:
        print("nfc: error: the input is not UTF-8 text (not an nfc cache export)",
              file=sys.stderr)
    except OSError as err:
        where = f"'{err.filename}': " if err.filename else ""
        print(f"nfc: error: {where}{err.strerror or err}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Standalone entry point: `python -m nfc.cli.cache_cmd ...`."""
    parser = argparse.ArgumentParser(prog="nfc cache", description=__doc__.splitlines()[0])
    parser.add_argument("--traceback", action="store_true", help="show internal tracebacks")
    _configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except Exception as exc:  # noqa: BLE001 - never a traceback unless asked
        if args.traceback:
            traceback.print_exc()
        print(f"nfc: internal error: {type(exc).__name__}: {exc}\n"
              "  this is a bug in nfc; rerun with --traceback and report it", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
