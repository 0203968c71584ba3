"""LRJumpAnomaly: the learning rate changes by a large factor in one step, unlike a schedule."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector, Input, Knob
from ._ops import NEVER, first_true

#: one-step change factor that fires: a step decay (x0.1, x0.5) stays below it; the former
#: LRAnomaly's default since the core engine, not tuned on a suite
JUMP_FACTOR = 20.0
#: how far a schedule's own move may exceed what the rate showed before: a log written every N steps sees
#: the rate only at its logged steps, so a warm restart may land above the peak it saw, and the end of a
#: decay to 0 may drop further than the decay's last logged step did; 2x is the smallest step a step
#: schedule takes (ReduceLROnPlateau's x0.5)
SLACK = 2.0
#: steps without another event after one (the former LRAnomaly's 50 values, one value a step)
COOLDOWN = 50


class LRJumpAnomaly(Detector):
    """Flags a one-step change of the learning rate by at least ``jump_factor``.

    Schedules move the learning rate smoothly (warm-up, cosine, linear decay) or in steps of a
    few x (step decay x0.1, ReduceLROnPlateau x0.5); a one-step change of 20x is a bug: a
    scheduler stepped per batch instead of per epoch, a rate set in the wrong unit, a
    checkpoint loaded with a fresh scheduler. The rule fires when ``lr / previous`` is at least
    ``jump_factor`` or at most ``1 / jump_factor``; a drop to exactly 0 counts as an infinite
    drop. Two schedules do that on purpose and stay quiet: a warm restart (an upward jump back
    to at most :data:`SLACK` = 2 times the run's peak so far: a sparse log sees the peak only at
    its logged steps) and a decay that ends at 0 (a drop to 0 while the rate was already
    falling, or a drop by at most :data:`SLACK` times the fall of the value before: a linear or
    cosine decay's last logged steps fall by a large factor, not by a large amount; a step
    schedule, which holds its rate between steps, has no such fall). On a log whose rows lie more
    than one step apart, the rate moves between them unseen: a cosine with warm restarts that a
    log sees in a few rows a cycle rises at the restart and falls 40x by the next row, as smoothly
    as any schedule, so across such a gap a drop right after a rise does not count (a drop from a
    held or falling rate still does). After an event the rule is quiet for ``cooldown`` steps.

    **Rate**: ``lr_anomaly`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``lr_anomaly`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        jump_factor: one-step change factor that fires, > 1.
        cooldown: steps without events after an event, >= 0.

    Example:
        >>> lr = [0.1] * 50 + [10.0] * 50
        >>> [e.step for e in LRJumpAnomaly().scan(lr=lr)]
        [50]
        >>> LRJumpAnomaly().scan(lr=[0.1] * 50 + [0.01] * 50)  # a step decay
        []
    """

    inputs = (Input("lr"),)
    knob = Knob("jump_factor", 2.0, 1000.0)
    _state_keys = ("prev", "prev_step", "rose", "peak", "decaying", "fall", "quiet_until", "last_step")

    def __init__(self, jump_factor: float = JUMP_FACTOR, cooldown: int = COOLDOWN) -> None:
        check_range("jump_factor", jump_factor, 1, None, lo_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.jump_factor = jump_factor
        self.cooldown = cooldown
        self._reset()

    def _reset(self) -> None:
        self._prev = -1.0  # the previous usable rate (-1: none yet)
        self._prev_step = -1  # its step
        self._rose = False  # whether it rose above the one before it
        self._peak = 0.0
        self._decaying = False  # whether the last change was downward
        self._fall = 0.0  # how much the previous value took off the rate (0: it did not fall)
        self._quiet_until = NEVER
        self._last_step = -1

    def _step(self, lr: float, step: int) -> Event | None:
        self._last_step = step
        if lr - lr != 0.0 or lr < 0.0:
            return None
        prev = self._prev
        gap, self._prev_step = step - self._prev_step, step
        if lr == prev:
            self._prev = lr  # the same rate again (as given: a -0.0 after a 0.0 stays -0.0)
            self._fall = 0.0  # held: a step schedule, not a decay at every value
            self._rose = False
            return None
        msg = None
        value = 0.0
        if prev > 0.0:
            if lr == 0.0:
                if not self._decaying:
                    msg, value = f"lr dropped from {prev:.4g} to 0 without a decay", math.inf
            else:
                r = lr / prev
                if r >= self.jump_factor and lr > SLACK * self._peak:
                    msg = f"lr jumped {r:.3g}x to {lr:.4g}, {lr / self._peak:.3g}x the run's peak {self._peak:.4g}"
                    value = r
                elif r <= 1.0 / self.jump_factor and prev - lr > SLACK * self._fall and (gap <= 1 or not self._rose):
                    drop = prev / lr  # (not 1 / r: a ratio that underflowed to 0 has no inverse)
                    msg, value = f"lr dropped {drop:.3g}x to {lr:.4g} in one step", drop
        if prev >= 0.0:
            self._decaying = lr < prev
            self._fall = prev - lr if lr < prev else 0.0
        self._prev, self._rose = lr, prev >= 0.0 and lr > prev
        if lr > self._peak:
            self._peak = lr
        if msg is None or step <= self._quiet_until:
            return None
        self._quiet_until = step + self.cooldown
        return make_event(Kind.LR_ANOMALY, "warning", step, step, type(self).__name__, "lr", value,
                          self.jump_factor, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        """The values before the first one-step change that could fire, in one vectorised pass."""
        if self._prev <= 0.0:
            return 0
        lr = arrays[0][i:j]
        prev = np.empty_like(lr)
        prev[0] = self._prev
        prev[1:] = lr[:-1]
        with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
            r = lr / prev
        bad = ~np.isfinite(lr) | (lr <= 0.0) | ~(r < self.jump_factor) | (r <= 1.0 / self.jump_factor)
        k = first_true(bad)
        if k:
            seg = lr[:k]
            changed = np.flatnonzero(seg != prev[:k])
            if len(changed):
                c = changed[-1]
                self._decaying = bool(seg[c] < prev[c])
            self._fall = float(prev[k - 1] - seg[k - 1]) if seg[k - 1] < prev[k - 1] else 0.0
            self._peak = max(self._peak, float(seg.max()))
            self._rose = bool(seg[-1] > prev[k - 1])
            self._prev = float(seg[-1])
            self._last_step = self._prev_step = int(steps[i + k - 1])
        return k


__all__ = ["LRJumpAnomaly"]
