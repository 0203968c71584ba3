"""EWMASpike: a value far above its own exponentially weighted recent level."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range
from ._base import Detector
from ._ops import ewma, ewvar, first_true, shifted


class EWMASpike(Detector):
    """Flags a value that jumps far above (or below) its exponentially weighted recent level.

    The detector keeps an EWMA level ``m`` (weight ``alpha``: fast, so a falling loss does not
    leave it lagging) and an EWMA variance ``v`` of the innovations (weight ``var_alpha``:
    slow, so the scale is stable) of ``y = log(x)`` (or ``x`` when ``log=False``)::

        d = y - m
        m <- alpha*y + (1-alpha)*m
        v <- (1-var_alpha) * (v + var_alpha*d*d)

    It fires when ``z = d / sqrt(v + floor**2) >= threshold`` **and** the value is at least
    ``min_ratio`` times its recent level (``d >= log(min_ratio)``), after ``warmup`` values
    (during which ``m`` and ``v`` are plain running averages). ``floor`` is ``1e-3`` in log
    space (0.1 %) and ``1e-3*|m|`` in linear space, so a perfectly flat history does not make
    every wiggle an alarm. Everything is relative to the stream's own history.

    Policies: an anomalous value (``z >= threshold``, whatever its ratio) does not update
    ``m``/``v`` (``learn_on_alarm=False``) so a jump does not inflate the statistics it is
    measured against; if anomalies persist for
    more than ``hold`` consecutive values, the level is taken as the new normal (``m = y``).
    After an event no new event is emitted for ``cooldown`` values. When ``escalate_after``
    events fall within ``escalate_window`` steps the event is ``critical`` (frequent spikes
    precede divergence).

    Args:
        alpha: EWMA weight of the newest value in the level, in (0, 1).
        var_alpha: EWMA weight of the newest innovation in the variance, in (0, 1).
        threshold: z-score that counts as anomalous, > 0.
        min_ratio: smallest jump factor that counts, >= 1.
        warmup: values seen before any alarm, >= 2.
        log: watch ``log(x)`` (for positive signals spanning orders of magnitude).
        direction: ``"up"``, ``"down"`` or ``"both"``.
        cooldown: values after an event during which no event is emitted, >= 0.
        hold: consecutive anomalous values after which the level is re-based, >= 1.
        learn_on_alarm: let anomalous values update the statistics.
        escalate_after: events within ``escalate_window`` that make an event critical (0: never).
        escalate_window: the window, in steps, for escalation.
        kind: the :class:`~trainsignals.Kind` value of its events.
        signal: the signal name used in events.
        severity: severity of a single event.
        persist_kind: when anomalies last more than ``hold`` values after a jump (a level that
            stepped up and stayed: the loss did not recover), emit a critical event of this kind
            with ``onset_step`` at the jump, before re-basing; None: just re-base.

    Example:
        A loss that falls with small noise, then jumps 4x for two steps at step 60:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> loss = 2.0 * np.exp(-np.arange(100) / 80) * np.exp(rng.normal(0, 0.02, 100))
        >>> loss[60:62] *= 4.0
        >>> [e.step for e in EWMASpike().scan(loss)]
        [60]
    """

    signals = ("x",)
    _state_keys = ("n", "mean", "var", "run", "run_start", "run_jumped", "cooldown_left", "alarms", "last_step")

    def __init__(
        self,
        alpha: float = 0.3,
        var_alpha: float = 0.05,
        threshold: float = 7.0,
        min_ratio: float = 1.5,
        warmup: int = 20,
        log: bool = True,
        direction: str = "up",
        cooldown: int = 5,
        hold: int = 10,
        learn_on_alarm: bool = False,
        escalate_after: int = 3,
        escalate_window: int = 200,
        kind: str = "loss_spike",
        signal: str = "loss",
        severity: str = "warning",
        persist_kind: str | None = None,
    ) -> None:
        check_range("alpha", alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("var_alpha", var_alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("threshold", threshold, 0, None, lo_open=True)
        check_range("min_ratio", min_ratio, 1, None)
        check_range("warmup", warmup, 2, None, integer=True)
        check_choice("direction", direction, ("up", "down", "both"))
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_range("hold", hold, 1, None, integer=True)
        check_range("escalate_after", escalate_after, 0, None, integer=True)
        check_range("escalate_window", escalate_window, 1, None, integer=True)
        check_choice("kind", kind, tuple(k.value for k in Kind))
        check_choice("severity", severity, ("info", "warning", "critical"))
        if persist_kind is not None:
            check_choice("persist_kind", persist_kind, tuple(k.value for k in Kind))
        self.alpha = alpha
        self.var_alpha = var_alpha
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.warmup = warmup
        self.log = bool(log)
        self.direction = direction
        self.cooldown = cooldown
        self.hold = hold
        self.learn_on_alarm = bool(learn_on_alarm)
        self.escalate_after = escalate_after
        self.escalate_window = escalate_window
        self.kind = kind
        self.signal = signal
        self.severity = severity
        self.persist_kind = persist_kind
        self._a = float(alpha)
        self._b = 1.0 - float(alpha)
        self._va = float(var_alpha)
        self._vb = 1.0 - float(var_alpha)
        self._vba = self._vb * self._va
        self._min_jump = math.log(min_ratio) if self.log else float(min_ratio) - 1.0
        self._kind = Kind(kind)
        self._sign = 1.0 if direction == "up" else -1.0
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._mean = 0.0
        self._var = 0.0
        self._run = 0
        self._run_start = -1
        self._run_jumped = False
        self._cooldown_left = 0
        self._alarms: list[int] = []
        self._last_step = -1

    def _floor2(self, mean: float) -> float:
        if self.log:
            return 1e-6
        f = 1e-3 * abs(mean)
        return f * f + 1e-300

    def _step(self, x: float, step: int) -> Event | None:  # noqa: C901
        self._last_step = step
        if x - x != 0.0 or (self.log and x <= 0.0):
            return None
        y = math.log(x) if self.log else x
        n = self._n
        if n < self.warmup:
            if n == 0:
                self._mean = y
                self._var = 0.0
            else:
                an = max(self._a, 1.0 / (n + 1))
                d = y - self._mean
                self._mean = self._mean + an * d
                self._var = (1.0 - an) * (self._var + an * d * d)
            self._n = n + 1
            return None
        mean = self._mean
        d = y - mean
        z = d / math.sqrt(self._var + self._floor2(mean))
        if self.direction == "both":
            za, da = abs(z), abs(d)
        else:
            za, da = self._sign * z, self._sign * d
        jump = da if self.log else da / (abs(mean) + 1e-300)
        suppress = self._cooldown_left > 0
        if suppress:
            self._cooldown_left -= 1
        self._n = n + 1
        if za >= self.threshold:
            self._run += 1
            if self._run == 1:
                self._run_start = step
                self._run_jumped = False
            big = jump >= self._min_jump
            self._run_jumped = self._run_jumped or big
            ev = None if suppress or not big else self._event(x, y, z, mean, step)
            if self._run > self.hold:
                if self.persist_kind is not None and self._run_jumped:
                    ev = self._persist_event(x, mean, step)
                self._mean = y
                self._run = 0
            elif self.learn_on_alarm:
                self._learn(y, d)
            return ev
        self._run = 0
        self._learn(y, d)
        return None

    def _learn(self, y: float, d: float) -> None:
        self._mean = self._a * y + self._b * self._mean
        self._var = self._vb * self._var + self._vba * (d * d)

    def _persist_event(self, x: float, mean: float, step: int) -> Event:
        level = math.exp(mean) if self.log else mean
        ratio = x / level if level != 0 else math.inf
        msg = (f"{self.signal} jumped at step {self._run_start} and did not come back: still {ratio:.3g}x its "
               f"earlier level {level:.4g} after {self.hold} steps")
        return make_event(Kind(self.persist_kind), "critical", step, self._run_start, type(self).__name__,
                          self.signal, ratio, self.min_ratio, msg)

    def _event(self, x: float, y: float, z: float, mean: float, step: int) -> Event:
        self._cooldown_left = self.cooldown
        alarms = [s for s in self._alarms if s > step - self.escalate_window]
        alarms.append(step)
        self._alarms = alarms
        severity = self.severity
        extra = ""
        if self.escalate_after and len(alarms) >= self.escalate_after:
            severity = "critical"
            extra = f"; {len(alarms)} such events within {self.escalate_window} steps"
        level = math.exp(mean) if self.log else mean
        ratio = x / level if level != 0 else math.inf
        word = "jumped" if (self.direction != "down" and z > 0) else "dropped"
        msg = f"{self.signal} {word} to {x:.4g}, {ratio:.3g}x its recent level {level:.4g} (z={z:.1f}){extra}"
        return make_event(self._kind, severity, step, step, type(self).__name__, self.signal,
                          z, self.threshold, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._n < self.warmup or self._cooldown_left or self._run:
            return 0
        x = arrays[0][i:j]
        if self.log:
            with np.errstate(divide="ignore", invalid="ignore"):
                y = np.log(x)
        else:
            y = x
        lim = first_true(~np.isfinite(y))
        if lim == 0:
            return 0
        y = y[:lim]
        m0, v0 = self._mean, self._var
        m = ewma(y, self._a, self._b, m0)
        mp = shifted(m, m0)
        d = y - mp
        v = ewvar(d * d, self._va, self._vb, v0)
        vp = shifted(v, v0)
        if self.log:
            z = d / np.sqrt(vp + 1e-6)
        else:
            f = 1e-3 * np.abs(mp)
            z = d / np.sqrt(vp + (f * f + 1e-300))
        za = np.abs(z) if self.direction == "both" else self._sign * z
        k = first_true(za >= self.threshold)
        if k:
            self._mean = float(m[k - 1])
            self._var = float(v[k - 1])
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k
