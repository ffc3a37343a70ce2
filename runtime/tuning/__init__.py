"""Kernel tuning: the persistent tuning cache, the genetic schedule search and safe measuring.

    cache = TuningCache()                                   # $NFC_CACHE_DIR or ~/.cache/nfc
    with Measurer(Task("pkg.mod:build", spec, reference="pkg.mod:ref")) as measure:
        result = tune(space, measure, cache=cache, category=cpu_category(), key=kernel_key)

Importing this package needs only the standard library; numpy is loaded by the worker.
See docs/tuning-cache.md.
"""

from nfc.runtime.tuning.cache import SCHEMA_VERSION, TuningCache, default_cache_path
from nfc.runtime.tuning.category import cpu_category, cuda_category, default_category
from nfc.runtime.tuning.measure import MeasureOptions, Measurer, MeasureSetupError, Task
from nfc.runtime.tuning.model import (
    CacheDamaged,
    CacheError,
    Entry,
    KeyInfo,
    Measurement,
    MergeStats,
    Mode,
    Status,
    category_id,
)
from nfc.runtime.tuning.search import (
    ScheduleSpace,
    SearchConfig,
    SearchResult,
    progress_bar,
    tune,
)

__all__ = [
    "SCHEMA_VERSION", "CacheDamaged", "CacheError", "Entry", "KeyInfo", "MeasureOptions",
    "MeasureSetupError", "Measurement", "Measurer", "MergeStats", "Mode", "ScheduleSpace",
    "SearchConfig", "SearchResult", "Status", "Task", "TuningCache", "category_id",
    "cpu_category", "cuda_category", "default_cache_path", "default_category", "progress_bar",
    "tune",
]
