"""PeakRatioSpike: a value many times the largest of the run's recent values."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range, check_signal
from ._base import Detector, Input, Knob
from ._ewma_jump import ALPHA, HOLD, PEAK_RATIO, PEAK_WINDOW, WARMUP, first_peak
from ._interval import covered
from ._ops import column_log, first_unusable, log, rises, shared_ewma


class PeakRatioSpike(Detector):
    """Flags a positive value at least ``peak_ratio`` times the largest of the previous ``window`` values.

    The rule is a ratio to the recent maximum, in linear space. It catches the spike a z-score
    under-rates: a small loss whose minibatch noise is heavy-tailed in log space (values near
    zero swing ``log(x)`` down by decades, which inflates any log-space scale) can jump 30x while
    its z-score stays modest; the jump is still far above every value the run produced lately.
    Healthy runs' small spikes stay well inside the default ratio (PEAK_RATIO says where
    it comes from). The event reports ``x / max`` against ``peak_ratio``; its
    ``onset_step`` is its own step. Nothing fires until the rule is warm (about 20 values, or 8
    that cover 20 steps in a log written every N steps: :func:`~trainsignals.detectors._interval.covered`);
    non-finite and non-positive values are skipped. With ``min_ratio > 1`` the value must also be a jump of that
    factor over the signal's level, an EWMA of ``log(x)`` (weight 0.1, as the z-rule's level):
    the default suite's ``grad_peak`` asks a grad norm for 100x (orders of magnitude in one value).

    **Re-arm.** The spike joins the window, so a level that stays up is its own new peak (one
    event, not one per step); ``cooldown`` *steps* after an event raise no new one (by default
    as many as the z-rule's watch: one bad batch is one event).

    Per value the detector compares with the previous value first and takes the window's
    maximum only when that comparison passes.

    **Rate**: ``loss_peak`` 0 alarms in 304,819 steps; ``grad_peak`` 0 alarms in 304,819 steps of the tuning
    suites' healthy runs at its defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``loss_peak`` 1 alarm, ``grad_peak`` 0 alarms in 879,581 steps of 1,478 held-out healthy
    runs (``calibration.json``).

    Args:
        signal: the watched signal (positive).
        kind: the :class:`~trainsignals.Kind` value of its events.
        peak_ratio: how many times the recent peak a value must reach, > 1.
        window: how many previous values the peak is taken over, >= 1.
        min_ratio: how many times its level the value must also be, >= 1 (1: no level test).
        cooldown: steps after an event during which no event is raised, >= 0.

    Example:
        A small loss whose noise spans decades, then one bad batch 32x the recent peak:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> loss = 0.05 * np.exp(rng.normal(0, 1.0, 300))
        >>> loss[200] = 10.0
        >>> [(e.step, round(e.value, 1)) for e in PeakRatioSpike().scan(loss=loss)]
        [(200, 32.5)]
    """

    knob = Knob("peak_ratio", 2.0, 100.0)

    _state_keys = ("n", "recent", "level", "last_event", "first_step", "last_step")

    def __init__(self, signal: str = "loss", kind: str = "loss_spike", peak_ratio: float = PEAK_RATIO,
                 window: int = PEAK_WINDOW, min_ratio: float = 1.0, cooldown: int = HOLD) -> None:
        check_signal("signal", signal)
        check_choice("kind", kind, tuple(k.value for k in Kind))
        check_range("peak_ratio", peak_ratio, 1, None, lo_open=True)
        check_range("window", window, 1, None, integer=True)
        check_range("min_ratio", min_ratio, 1, None)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.signal, self.kind, self.peak_ratio, self.window = signal, kind, peak_ratio, window
        self.min_ratio, self.cooldown = min_ratio, cooldown
        self.inputs = (Input(signal),)
        self.logs = (signal,)
        self._kind = Kind(kind)
        self._r = float(peak_ratio)
        self._lj = math.log(min_ratio)  # 0.0: no level test, and no level kept
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._recent: deque[float] = deque(maxlen=self.window)
        self._level = 0.0
        self._last_event = -1
        self._first_step = self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._recent = deque(state["recent"], maxlen=self.window)

    def _step(self, x: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if not x > 0.0 or x - x != 0.0:
            return None
        rec = self._recent
        ev = None
        if not self._n:
            self._first_step = step
        elif x >= self._r * rec[-1] and covered(self._n - 1, self._first_step, step, WARMUP):
            top = max(rec)
            if (x >= self._r * top and (self._last_event < 0 or step - self._last_event > self.cooldown)
                    and (self._lj == 0.0 or (log(x) if log_x is None else log_x) - self._level >= self._lj)):
                self._last_event = step
                msg = (f"{self.signal} jumped to {x:.4g}, {x / top:.3g}x the largest of the previous "
                       f"{len(rec)} values ({top:.4g})")
                ev = make_event(self._kind, "warning", step, step, type(self).__name__, self.signal, x / top,
                                self._r, msg)
        rec.append(x)
        if self._lj:
            lx = log(x) if log_x is None else log_x
            self._level = ALPHA * lx + (1.0 - ALPHA) * self._level if self._n else lx
        self._n += 1
        return ev

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if not self._n or not covered(self._n - 1, self._first_step, int(steps[i]), WARMUP):
            return 0
        lim = first_unusable(arrays[0], i, j, positive=True)
        if lim == 0:
            return 0
        x = arrays[0][i:i + lim]
        # where the value is r times the one before it (max >= previous value): the column's, after the first
        cand = rises(arrays[0], i + 1, i + lim, self._r) - i
        k = first_peak(self._recent, x, np.r_[0, cand] if x[0] >= self._r * self._recent[-1] else cand, self._r)
        w = self.window
        if k:
            self._recent.extend(x[max(0, k - w):k].tolist())
            if self._lj:
                self._level = float(shared_ewma(arrays[0], i, "log", column_log(arrays[0], i, i + k), ALPHA,
                                                1.0 - ALPHA, self._level)[-1])
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k
