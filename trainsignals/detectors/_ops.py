"""Vectorised recurrences shared by the batch paths (the scalar paths write them out inline), and
the scalar ``log`` the per-step paths share.

The scalar paths use exactly these forms, ``m = a*x + b*m`` with ``b = 1 - a``, so that
``scipy.signal.lfilter`` and the Python loop evaluate the same expression.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

_mlog = math.log
#: the last two arguments of :func:`log` and their logs: ``(x, log x, x', log x')``
_MEMO: tuple[Any, float, Any, float] = (None, 0.0, None, 0.0)


def log(x: float) -> float:
    """``math.log(x)``, remembering the last two arguments (by identity) and their logs.

    A Monitor hands the same float objects to all its detectors at a step, so the log of each
    signal is taken once a step rather than once per detector (``math.log`` parses its
    arguments as a tuple: a look-up here costs a fraction of it). The memo is one tuple, replaced
    whole, so threads never see an argument with another's log.
    """
    global _MEMO
    m = _MEMO
    if x is m[0]:
        return m[1]
    if x is m[2]:
        return m[3]
    y = _mlog(x)
    _MEMO = (x, y, m[0], m[1])
    return y


def lfilter(*args: Any, **kwargs: Any) -> Any:
    """``scipy.signal.lfilter``, imported on first use: ``import trainsignals`` stays light."""
    from scipy.signal import lfilter as _lfilter

    return _lfilter(*args, **kwargs)


def ewma(x: np.ndarray, a: float, b: float, m0: float) -> np.ndarray:
    """``m[t] = a*x[t] + b*m[t-1]`` with ``m[-1] = m0``."""
    out, _ = lfilter([a], [1.0, -b], x, zi=[b * m0])
    return out  # type: ignore[no-any-return]


def ewvar(d2: np.ndarray, a: float, b: float, v0: float) -> np.ndarray:
    """``v[t] = b*v[t-1] + (b*a)*d2[t]`` with ``v[-1] = v0`` (West's EWMA variance)."""
    out, _ = lfilter([b * a], [1.0, -b], d2, zi=[b * v0])
    return out  # type: ignore[no-any-return]


def shifted(arr: np.ndarray, first: float) -> np.ndarray:
    """``[first, arr[0], ..., arr[-2]]``: the value before each position."""
    out = np.empty_like(arr)
    out[0] = first
    out[1:] = arr[:-1]
    return out


def first_true(mask: np.ndarray) -> int:
    """Index of the first True in ``mask``, or ``len(mask)``."""
    idx = int(np.argmax(mask)) if len(mask) else 0
    if len(mask) == 0 or not mask[idx]:
        return len(mask)
    return idx


#: a step before any step a run can have (steps lie above -2**62: trainsignals._validate.to_step);
#: the "no event yet" of the detectors' cooldowns
NEVER = -(2**62)
