"""Factors kept as logs, turned back into numbers and words without overflowing.

The rules compare logs: a loss of 1e-300 and one of 1e+300 lie 1,382 apart in natural log.
``math.exp``, ``math.expm1`` and ``10 ** d`` raise ``OverflowError`` beyond a float's range
(about 1.8e308), where NumPy returns ``inf``; a detector must not raise on any value it is fed,
so every factor a rule turns back from a difference of logs goes through here. As a number it is
``inf`` beyond the range; in words it keeps its size.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable

__all__ = ["EXP_MAX", "exp_or_inf", "expm1_or_inf", "mean_or_inf", "pow10_or_inf", "times"]

#: the largest argument of ``math.exp`` kept as a number (the log of the largest float, 709.78, rounded down)
EXP_MAX = 709.0
#: the same for ``10 ** d`` (the largest float is 1.8e308)
_POW10_MAX = 308.0
_LN10 = math.log(10.0)


def exp_or_inf(d: float) -> float:
    """``math.exp(d)``, or ``inf`` where that would overflow.

    >>> exp_or_inf(0.0), exp_or_inf(800.0)
    (1.0, inf)
    """
    return math.exp(d) if d < EXP_MAX else math.inf


def expm1_or_inf(d: float) -> float:
    """``math.expm1(d)`` (a log rise as a relative change), or ``inf`` where that would overflow."""
    return math.expm1(d) if d < EXP_MAX else math.inf


def pow10_or_inf(d: float) -> float:
    """``10 ** d``, or ``inf`` where that would overflow."""
    return 10.0 ** d if d < _POW10_MAX else math.inf


def times(d: float, base10: bool = False) -> str:
    """The factor ``exp(d)`` (``10 ** d`` with ``base10``) in ``.3g`` words, however large.

    >>> times(math.log(2.5)), times(2.0, base10=True), times(1382.0), times(-800.0)
    ('2.5', '100', '1.57e+600', '0')
    """
    e10 = d if base10 else d / _LN10
    if not e10 >= 300.0 or e10 == math.inf:  # nan, inf and every factor a float holds
        return f"{10.0 ** e10:.3g}" if e10 != math.inf else "inf"
    k = math.floor(e10)
    m = float(f"{10.0 ** (e10 - k):.3g}")
    if m >= 10.0:  # 9.9996 rounds to 10: one decade up
        m, k = m / 10.0, k + 1
    return f"{m:.3g}e+{k}"


def mean_or_inf(values: Iterable[float]) -> float:
    """``statistics.fmean(values)``, or ``inf`` where its exact sum overflows (values near 1e308 that add up
    past the range: a signed loss in its own units).
    """
    try:
        return statistics.fmean(values)
    except OverflowError:
        return math.inf
