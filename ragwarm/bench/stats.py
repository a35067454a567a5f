"""Summary statistics shared by every benchmark (one definition of a percentile)."""

from __future__ import annotations

import math
from collections.abc import Sequence


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile, q in [0, 100], of `values`: linear interpolation between the
    closest ranks of the sorted values (numpy's default, "linear" / Hyndman-Fan type 7):
    position (n - 1) * q / 100, so p0 is the minimum, p100 the maximum and p50 the median.
    NaN for no values."""
    if not values:
        return math.nan
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q / 100.0
    low = math.floor(pos)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (pos - low)
