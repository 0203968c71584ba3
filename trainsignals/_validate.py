"""Input and configuration checks shared by the detectors and the Monitor."""

from __future__ import annotations

import math
import operator
from functools import cache
from typing import Any

import numpy as np

#: the largest count (window, patience, hold) a detector takes: 2**53, the last integer a float holds exactly
MAX_COUNT = 2 ** 53


def check_range(
    name: str,
    value: Any,
    lo: float | None = None,
    hi: float | None = None,
    lo_open: bool = False,
    hi_open: bool = False,
    integer: bool = False,
) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` lies in the interval.

    An integer (a count: a window, a patience, a hold) must also lie within ``MAX_COUNT`` of zero:
    beyond it a float no longer holds it exactly, and no run has that many values.
    """
    if integer:
        if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
            raise ValueError(f"{name} must be an integer, got {value!r}")
        if not -MAX_COUNT <= value <= MAX_COUNT:
            raise ValueError(f"{name} must be an integer of at most 2**53 in size, got {value!r}")
    elif isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"{name} must be a number, got {value!r}")
    try:
        v = float(value)
    except OverflowError:  # a Python int past the float range
        raise ValueError(f"{name} must be a number a float holds, got an integer of {len(str(abs(value)))} digits") from None
    if math.isnan(v):
        raise ValueError(f"{name} must be a number, got nan")
    bad = (
        (lo is not None and (v < lo or (lo_open and v == lo)))
        or (hi is not None and (v > hi or (hi_open and v == hi)))
    )
    if bad:
        left = "(" if lo_open else "["
        right = ")" if hi_open else "]"
        interval = f"{left}{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}{right}"
        raise ValueError(f"{name} must be in {interval}, got {value!r}")


def check_choice(name: str, value: Any, choices: tuple[Any, ...]) -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is one of ``choices``."""
    if value not in choices:
        raise ValueError(f"{name} must be one of {choices}, got {value!r}")


def to_float(name: str, x: Any) -> float:
    """Convert a scalar signal to a Python float, or raise ``TypeError`` naming the signal.

    Accepts Python numbers, NumPy scalars, 0-d arrays and anything with ``__float__``
    (a torch or JAX scalar works without the core importing a framework).
    """
    if type(x) is float:
        return x
    if isinstance(x, (str, bytes)) or isinstance(x, bool):
        raise TypeError(f"{name} must be a real number, got {type(x).__name__} {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real number, got {type(x).__name__}") from exc


_STEP_LIMIT = 2 ** 62  # steps are stored as int64 (traces, the batch path): far beyond any run


def to_step(x: Any) -> int:
    """Convert a step to ``int``; ``TypeError`` if it is not a whole number, ``ValueError`` if
    it does not fit the 64-bit steps of traces and the batch path.
    """
    if type(x) is int:  # the usual step
        s = x
    elif isinstance(x, (bool, np.bool_)):
        raise TypeError(f"step must be an integer, got {type(x).__name__} {x!r}")
    elif isinstance(x, (float, np.floating)) and math.isfinite(x) and float(x).is_integer():
        s = int(x)
    elif isinstance(x, np.ndarray) and x.ndim == 0 and x.dtype.kind in "iuf":  # a 0-d array, as signals take
        return to_step(x.item())
    else:
        try:  # NumPy integers, and the 0-d integer tensors of torch and JAX (a step counter)
            s = operator.index(x)
        except TypeError:
            raise TypeError(f"step must be an integer, got {type(x).__name__} {x!r}") from None
    if not -_STEP_LIMIT < s < _STEP_LIMIT:
        raise ValueError(f"step must be below 2**62 in size, got {s}")
    return s


def check_signal(name: str, value: Any, form: str = "scalar") -> None:
    """Raise ``ValueError`` naming ``name`` unless ``value`` is a signal of that form in the vocabulary."""
    ok = _signals_of(form)
    if value not in ok:
        raise ValueError(f"{name} must be one of {list(ok)}, got {value!r}")


@cache
def _signals_of(form: str) -> tuple[str, ...]:
    """The signals of one form, in the vocabulary's order."""
    from .signals import SIGNALS

    return tuple(k for k, sig in SIGNALS.items() if sig.form == form)
