"""Small scalar detectors: non-finite values, the learning rate."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input, Knob
from ._ops import first_true, first_unusable


class NonFinite(Detector):
    """Flags a NaN or infinite value: critical, once per run of non-finite values.

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


class LRAnomaly(Detector):
    """Flags a learning rate that does not behave like a schedule.

    Without a plan it fires when the learning rate changes by a factor of at least
    ``jump_factor`` in one step — except an upward jump back to at most the run's peak so far
    (a warm restart) — or drops to exactly 0 from a schedule that was not decaying (a cosine
    ending at 0 is fine). Step decays (x0.1, x0.5) stay below the default factor.
    With ``schedule`` (a callable ``step -> lr``), it fires when the observed learning rate
    differs from the plan by more than ``rtol`` (relative). Quiet for ``cooldown`` steps after
    an event.

    Args:
        jump_factor: one-step change factor that fires, > 1.
        schedule: the intended learning rate per step, or None.
        rtol: relative tolerance against ``schedule``, > 0.
        cooldown: values without events after an event, >= 0.

    Example:
        >>> lr = [0.1] * 50 + [10.0] * 50
        >>> [e.step for e in LRAnomaly().scan(lr=lr)]
        [50]
    """

    inputs = (Input("lr"),)
    knob = Knob("jump_factor", 2.0, 1000.0)
    _state_keys = ("prev", "peak", "decaying", "cooldown_left", "last_step")

    def __init__(
        self,
        jump_factor: float = 20.0,
        schedule: Callable[[int], float] | None = None,
        rtol: float = 0.01,
        cooldown: int = 50,
    ) -> None:
        check_range("jump_factor", jump_factor, 1, None, lo_open=True)
        check_range("rtol", rtol, 0, None, lo_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        if schedule is not None and not callable(schedule):
            raise ValueError(f"schedule must be a callable step -> lr, got {schedule!r}")
        self.jump_factor = jump_factor
        self.schedule = schedule
        self.rtol = rtol
        self.cooldown = cooldown
        self._reset()

    def _reset(self) -> None:
        self._prev = -1.0
        self._peak = 0.0
        self._decaying = False
        self._cooldown_left = 0
        self._last_step = -1

    def _step(self, lr: float, step: int) -> Event | None:
        self._last_step = step
        if lr - lr != 0.0 or lr < 0.0:
            return None
        prev = self._prev
        if lr == prev and lr <= self._peak and self.schedule is None and not self._cooldown_left:
            self._prev = lr  # the same rate again (as given: a -0.0 after a 0.0 stays -0.0)
            return None  # no change: nothing fires, and only the step moves
        msg = None
        value = thr = 0.0
        if self.schedule is not None:
            want = float(self.schedule(step))
            err = abs(lr - want) / max(abs(want), 1e-300)
            if err > self.rtol:
                msg = f"lr is {lr:.4g} at step {step} where the schedule says {want:.4g}"
                value, thr = err, self.rtol
        elif prev > 0.0:
            if lr == 0.0:
                if not self._decaying:
                    msg = f"lr dropped from {prev:.4g} to 0 without a decay"
                    value, thr = math.inf, self.jump_factor
            else:
                r = lr / prev
                if r >= self.jump_factor and lr > self._peak:
                    msg = f"lr jumped {r:.3g}x to {lr:.4g}, above the run's peak {self._peak:.4g}"
                    value, thr = r, self.jump_factor
                elif r <= 1.0 / self.jump_factor:
                    msg = f"lr dropped {1 / r:.3g}x to {lr:.4g} in one step"
                    value, thr = 1.0 / r, self.jump_factor
        if prev >= 0.0 and lr != prev:
            self._decaying = lr < prev
        self._prev = lr
        if lr > self._peak:
            self._peak = lr
        if self._cooldown_left:
            self._cooldown_left -= 1
            return None
        if msg is None:
            return None
        self._cooldown_left = self.cooldown
        return make_event(Kind.LR_ANOMALY, "warning", step, step, type(self).__name__, "lr", value, thr, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self.schedule is not None or self._cooldown_left or self._prev <= 0.0:
            return 0
        lr = arrays[0][i:j]
        prev = np.empty_like(lr)
        prev[0] = self._prev
        prev[1:] = lr[:-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            r = lr / prev
        bad = ~np.isfinite(lr) | (lr <= 0.0) | ~(r < self.jump_factor) | (r <= 1.0 / self.jump_factor)
        k = first_true(bad)
        if k:
            seg = lr[:k]
            changed = np.flatnonzero(seg != prev[:k])
            if len(changed):
                c = changed[-1]
                self._decaying = bool(seg[c] < prev[c])
            self._peak = max(self._peak, float(seg.max()))
            self._prev = float(seg[-1])
            self._last_step = int(steps[i + k - 1])
        return k
