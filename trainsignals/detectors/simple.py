"""NonFinite: a NaN or infinite value of any signal."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_signal
from ._base import Detector, Input
from ._ops import first_unusable


class NonFinite(Detector):
    """Flags a NaN or infinite value: critical, once per run of non-finite values.

    **Rate**: not calibrated (no knob): a healthy run has no non-finite value, so the rule has no
    false alarm to budget.

    Example:
        >>> [e.step for e in NonFinite().scan(loss=[1.0, 0.9, float("nan"), float("nan"), 0.8, float("inf")])]
        [2, 5]
    """

    _state_keys = ("bad", "last_step")

    def __init__(self, signal: str = "loss") -> None:
        check_signal("signal", signal)
        self.signal = signal
        self.inputs = (Input(signal),)
        self._reset()

    def _reset(self) -> None:
        self._bad = False
        self._last_step = -1

    def _step(self, x: float, step: int) -> Event | None:
        self._last_step = step
        if x - x == 0.0:
            self._bad = False
            return None
        if self._bad:
            return None
        self._bad = True
        msg = f"{self.signal} is {x}: the run cannot recover from this"
        return make_event(Kind.NONFINITE, "critical", step, step, type(self).__name__, self.signal,
                          x, math.inf, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._bad:
            return 0
        k = first_unusable(arrays[0], i, j)
        if k:
            self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["NonFinite"]
