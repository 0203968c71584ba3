"""TrendDivergence: a t-test on the slope of the loss over a window says it climbs."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input, Knob
from ._factors import expm1_or_inf, times
from ._ops import NEVER, column_log, first_true, log, quiet_after, shifted
from ._trend import PREFILTER_SLACK, batch_trend, noise_levels, noise_step, noise_warming, window_trend

#: at the start of a run the trend is fitted once the window is this full (a half: SlopeDivergence's
#: rule, so a run that diverges from its first steps is seen within half a window)
_FIRST_FILL = 0.5


class TrendDivergence(Detector):
    """Flags a slow divergence through noise: the window's least-squares slope is significantly up.

    On ``y = log(x)`` (scale-free), over the last ``window`` values (from ``window // 2`` values
    on, at the start of a run) the rule fires when the least-squares slope has t-statistic
    ``>= threshold`` and the fitted rise ``slope * (window - 1)`` is at least ``log(min_ratio)``.
    The fit (:func:`~trainsignals.detectors._trend.window_trend`) is only computed when the
    newest value sits ``max(log(min_ratio), noise)`` above the oldest, with ``noise`` the mean
    of the second differences ``|y[t] - 2y[t-1] + y[t-2]|`` so far (an EWMA of weight
    ``noise_alpha`` once a plain mean would weigh them less). A spike
    that recovers inflates the residuals and does not count.

    The event is a critical ``divergence``; ``onset_step`` is the window's lowest point. After
    an event the rule is quiet for ``cooldown`` steps, and until its window has passed (a log written
    every N steps: :func:`~trainsignals.detectors._ops.quiet_after`); no other re-arm condition: a
    loss still climbing after that is reported again. Non-positive and non-finite values are skipped.

    **Rate**: ``trend_divergence`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``trend_divergence`` 2 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        window: values in the trend window, >= 5.
        threshold: t-statistic of the slope that counts, > 0.
        min_ratio: smallest fitted rise over the window, as a factor, > 1.
        noise_alpha: EWMA weight of the noise scale, in (0, 1).
        cooldown: steps without events after an event, >= 0.
        signal: the signal it reads (and names in its events).

    Example:
        A loss that falls, then from step 200 climbs 2 % a step through 3 % noise (no run of
        rises long enough for :class:`~trainsignals.EarlyClimbDivergence`):

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(300)
        >>> loss = np.exp(-t / 200 + 0.02 * np.maximum(t - 200, 0) + rng.normal(0, 0.03, 300))
        >>> [(e.step, e.onset_step) for e in TrendDivergence().scan(loss=loss)]
        [(219, 200)]
    """

    knob = Knob("threshold", 2.0, 50.0)

    _state_keys = ("buf", "sbuf", "noise", "nd", "cooldown_until", "last_step")

    def __init__(self, window: int = 20, threshold: float = 6.0, min_ratio: float = 1.3,
                 noise_alpha: float = 0.05, cooldown: int = 100, signal: str = "loss") -> None:
        check_range("window", window, 5, None, integer=True)
        check_range("threshold", threshold, 0, None, lo_open=True)
        check_range("min_ratio", min_ratio, 1, None, lo_open=True)
        check_range("noise_alpha", noise_alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_signal("signal", signal)
        self.window = window
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.noise_alpha = noise_alpha
        self.cooldown = cooldown
        self.signal = signal
        self.inputs = (Input(signal),)
        self.logs = (signal,)
        self._a = float(noise_alpha)
        self._b = 1.0 - self._a
        self._rise = math.log(min_ratio)
        self._half = int(window * _FIRST_FILL)
        self._reset()

    def _reset(self) -> None:
        self._buf: deque[float] = deque(maxlen=self.window)  # the last window log values
        self._sbuf: deque[int] = deque(maxlen=self.window)  # and their steps
        self._noise = 0.0
        self._nd = 0  # second differences seen
        self._cooldown_until = NEVER
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._buf = deque(self._buf, maxlen=self.window)
        self._sbuf = deque(self._sbuf, maxlen=self.window)

    def _trend_ok(self, win: Sequence[float]) -> tuple[bool, float, float]:
        slope, t = window_trend(win)
        return (t >= self.threshold and slope * (len(win) - 1) >= self._rise), slope, t

    def _step(self, x: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        y = log(x) if log_x is None else log_x
        buf = self._buf
        noise_prev = self._noise
        self._noise, self._nd = noise_step(y, buf, noise_prev, self._nd, self._a, self._b)
        buf.append(y)
        self._sbuf.append(step)
        if step <= self._cooldown_until:
            return None
        rise = y - buf[0]
        nb = len(buf)
        if rise >= self._rise and rise >= noise_prev and nb >= self._half:
            ok, slope, t = self._trend_ok(buf)
            if ok:
                return self._event(step, slope, t)
        return None

    def _event(self, step: int, slope: float, t: float) -> Event:
        self._cooldown_until = quiet_after(step, self.cooldown, self._sbuf[0])
        buf = self._buf
        lo = min(range(len(buf)), key=buf.__getitem__)
        onset = self._sbuf[lo]
        span = len(buf) - 1 - lo  # a log written every N steps: the fit is per value, not per step
        over, per = (f"{span} steps", "step") if step - onset == span else (f"{span} values, {step - onset} steps", "value")
        msg = (f"{self.signal} trend turned upward at step {onset}: {times(buf[-1] - buf[lo])}x over {over} "
               f"({100 * expm1_or_inf(slope):.2g}% per {per}, t={t:.1f})")
        return make_event(Kind.DIVERGENCE, "critical", step, onset, type(self).__name__, self.signal,
                          t, self.threshold, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        w = self.window
        if len(self._buf) < w or noise_warming(self._nd, self._a):
            return 0
        y = column_log(arrays[0], i, j)
        lim = first_true(~np.isfinite(y))
        if lim == 0:
            return 0
        y = y[:lim]
        ext = np.concatenate((np.asarray(self._buf), y))
        noise = noise_levels(ext, w, self._a, self._b, self._noise, (arrays[0], i))
        st = steps[i:i + lim]
        span = ext[w:] - ext[1:1 + lim]  # the new values sit at ext[w:]
        cand = (st > self._cooldown_until) & (span >= self._rise) & (span >= shifted(noise, self._noise))
        k = lim
        cs = np.flatnonzero(cand)
        if len(cs):  # the windows the vectorised fit puts near the bars go to the scalar test, in order
            slope, t = batch_trend(np.lib.stride_tricks.sliding_window_view(ext, w)[cs + 1])
            keep = 1.0 - PREFILTER_SLACK
            cs = cs[(t >= keep * self.threshold) & (slope * (w - 1) >= keep * self._rise)]
        for c in cs.tolist():
            if self._trend_ok(ext[c + 1:c + w + 1].tolist())[0]:
                k = c
                break
        if k:
            self._buf = deque(ext[k:k + w].tolist(), maxlen=w)
            prev = np.asarray(self._sbuf, dtype=np.int64)
            self._sbuf = deque(np.concatenate((prev, st[:k]))[k:k + w].tolist(), maxlen=w)
            self._noise = float(noise[k - 1])
            self._nd += k
            self._last_step = int(st[k - 1])
        return k


__all__ = ["TrendDivergence"]
