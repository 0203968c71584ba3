"""EarlyClimbDivergence: the loss rose at every one of its last few steps, geometrically."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input, Knob
from ._factors import times
from ._ops import NEVER, column_log, first_unusable, log, quiet_after
from ._trend import noise_levels, noise_step, noise_warming


class EarlyClimbDivergence(Detector):
    """Flags geometric growth of the loss from its first steps: a run of rises that adds up.

    On ``y = log(x)`` (scale-free), the rule fires when the last ``steps`` step-to-step changes
    are all rises, their total is at least ``max(log(min_ratio), noise_mult * noise)``, the climb
    ends above every one of the ``steps + 1`` values before it (a rise that stays within the range
    the loss just covered is a rebound in its noise, however regular), and either no single rise
    makes more than ``max_share`` of it, or the other rises alone already make such a climb: a
    lone spike at the end of small noise rises is not a climb; a climb that accelerates, each
    rise larger than the last as a run blows up, is. ``noise`` is the mean of the second
    differences ``|y[t] - 2y[t-1] + y[t-2]|`` so far, an EWMA of weight ``noise_alpha`` once a
    plain mean would weigh them less: the run's irregularity, which a steady geometric climb does
    not inflate. It catches a blow-up within
    ``steps + 1`` values, before the first NaN.

    The event is a critical ``divergence``; ``onset_step`` is the first step of the rising run.
    After an event the rule is quiet for ``cooldown`` steps, and until the rising run has passed
    (a log written every N steps: :func:`~trainsignals.detectors._ops.quiet_after`); no other
    re-arm condition: a run that keeps climbing after that is reported again. Non-positive and non-finite values are
    skipped.

    **Rate**: ``early_climb`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``early_climb`` 2 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        steps: consecutive rises that make a climb, >= 2.
        min_ratio: smallest total rise over them, as a factor, > 1.
        max_share: largest share of one rise in the climb, in (0, 1].
        noise_alpha: EWMA weight of the noise scale, in (0, 1).
        noise_mult: how many noise scales the climb must exceed, >= 0.
        cooldown: steps without events after an event, >= 0.
        signal: the signal it reads (and names in its events).

    Example:
        Gradient descent on (w - 3)**2 from w = 10 at lr 1.1:

        >>> det = EarlyClimbDivergence()
        >>> w, losses = 10.0, []
        >>> for _ in range(10):
        ...     w -= 1.1 * 2 * (w - 3)
        ...     losses.append((w - 3) ** 2)
        >>> [(e.step, e.onset_step) for e in det.scan(loss=losses)]
        [(4, 0)]
    """

    knob = Knob("noise_mult", 1.0, 100.0)

    _state_keys = ("buf", "sbuf", "noise", "nd", "cooldown_until", "last_step")

    def __init__(self, steps: int = 4, min_ratio: float = 1.25, max_share: float = 0.6,
                 noise_alpha: float = 0.05, noise_mult: float = 6.0, cooldown: int = 100,
                 signal: str = "loss") -> None:
        check_range("steps", steps, 2, None, integer=True)
        check_range("min_ratio", min_ratio, 1, None, lo_open=True)
        check_range("max_share", max_share, 0, 1, lo_open=True)
        check_range("noise_alpha", noise_alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("noise_mult", noise_mult, 0, None)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_signal("signal", signal)
        self.steps = steps
        self.min_ratio = min_ratio
        self.max_share = max_share
        self.noise_alpha = noise_alpha
        self.noise_mult = noise_mult
        self.cooldown = cooldown
        self.signal = signal
        self.inputs = (Input(signal),)
        self.logs = (signal,)
        self._a = float(noise_alpha)
        self._b = 1.0 - self._a
        self._rise = math.log(min_ratio)
        self._reset()

    def _reset(self) -> None:
        self._buf: deque[float] = deque(maxlen=2 * self.steps + 2)  # the last 2 (steps + 1) log values
        self._sbuf: deque[int] = deque(maxlen=self.steps + 1)  # and their steps
        self._noise = 0.0
        self._nd = 0  # second differences seen
        self._cooldown_until = NEVER
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._buf = deque(self._buf, maxlen=2 * self.steps + 2)
        self._sbuf = deque(self._sbuf, maxlen=self.steps + 1)

    def _shape_ok(self, win: Sequence[float], gate: float) -> bool:
        """The climb (the last ``steps + 1`` of ``win``) ends above the values before it, and no single
        rise dominates it, or the others alone make one.
        """
        values = list(win)
        tail, before = values[-self.steps - 1:], values[:-self.steps - 1]
        if before and tail[-1] <= max(before):
            return False
        total = tail[-1] - tail[0]
        biggest = max(tail[k + 1] - tail[k] for k in range(self.steps))
        rest = total - biggest
        return biggest <= self.max_share * total or (rest >= self._rise and rest >= gate)

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
        m = self.steps
        if step <= self._cooldown_until or len(buf) <= m:
            return None
        total = y - buf[-m - 1]
        gate = self.noise_mult * noise_prev
        if total >= self._rise and total >= gate:
            if all(buf[k + 1] > buf[k] for k in range(len(buf) - m - 1, len(buf) - 1)) and self._shape_ok(buf, gate):
                return self._event(step, total)
        return None

    def _event(self, step: int, total: float) -> Event:
        self._cooldown_until = quiet_after(step, self.cooldown, self._sbuf[0])
        onset = self._sbuf[0]
        msg = (f"{self.signal} rose {self.steps} times in a row, {times(total)}x since step {onset}: "
               f"geometric growth")
        return make_event(Kind.DIVERGENCE, "critical", step, onset, type(self).__name__, self.signal,
                          total, max(self._rise, 0.0), msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        m = self.steps
        if len(self._buf) <= m or noise_warming(self._nd, self._a):
            return 0
        lim = first_unusable(arrays[0], i, j, positive=True)
        if lim == 0:
            return 0
        y = column_log(arrays[0], i, i + lim)
        h, w = len(self._buf), 2 * m + 2  # the values held; the most the scalar step holds
        ext = np.concatenate((np.asarray(self._buf), y))  # the new values sit at ext[h:]
        noise = noise_levels(ext, h, self._a, self._b, self._noise, (arrays[0], i))
        st = steps[i:i + lim]
        total = ext[h:] - ext[h - m:h - m + lim]
        cs = np.flatnonzero(total >= self._rise)  # the rare rise large enough; then the other tests there
        cs = cs[st[cs] > self._cooldown_until]
        for k in range(1, m + 1):  # rising: ext[q + 1] - ext[q] > 0 over the last m steps
            cs = cs[ext[h - k + cs + 1] - ext[h - k + cs] > 0]
        gates = self.noise_mult * np.where(cs > 0, noise[np.maximum(cs - 1, 0)], self._noise)  # the noise before
        keep = total[cs] >= gates
        k = lim
        for c, gate in zip(cs[keep].tolist(), gates[keep].tolist()):
            if self._shape_ok(ext[max(0, h + c + 1 - w):h + c + 1].tolist(), gate):  # the scalar step's buffer
                k = int(c)
                break
        if k:
            self._buf = deque(ext[max(0, h + k - w):h + k].tolist(), maxlen=w)
            prev = np.asarray(self._sbuf, dtype=np.int64)
            self._sbuf = deque(np.concatenate((prev, st[:k]))[-(m + 1):].tolist(), maxlen=m + 1)
            self._noise = float(noise[k - 1])
            self._nd += k
            self._last_step = int(st[k - 1])
        return k


__all__ = ["EarlyClimbDivergence"]
