"""LRScheduleMismatch: the learning rate a run logs is not the one its schedule plans."""

from __future__ import annotations

from collections.abc import Callable

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector, Input, Knob
from ._ops import NEVER

#: relative deviation from the plan that fires: float32 reprs and optimizer rounding stay far
#: below 1 % (the former LRAnomaly's ``rtol`` since the core engine, not tuned on a suite)
RTOL = 0.01
#: steps without another event after one (the former LRAnomaly's 50 values, one value a step)
COOLDOWN = 50


class LRScheduleMismatch(Detector):
    """Flags a learning rate that deviates from the schedule the user planned.

    When the plan is known (a callable ``step -> lr``: the scheduler's formula, a
    ``LambdaLR``'s lambda times the base rate), any relative deviation larger than ``rtol`` is
    a bug in how the schedule is applied: a scheduler stepped twice per step, or not at all
    after resuming, a warm-up skipped. The rule compares every logged rate with
    ``schedule(step)``; after an event it is quiet for ``cooldown`` steps. It is not in the
    default suite (it needs the plan): add it to a suite, e.g.
    ``suite = ts.default_suite(T); suite["lr_schedule"] = ts.LRScheduleMismatch(plan)``.

    Args:
        schedule: the intended learning rate per step (picklable when the detector is saved).
        rtol: relative deviation from the plan that fires, > 0.
        cooldown: steps without events after an event, >= 0.

    Example:
        >>> def plan(step):
        ...     return 0.1 if step < 50 else 0.01
        >>> lr = [0.1] * 50 + [0.1] * 5 + [0.01] * 45  # the decay applied 5 steps late
        >>> [e.step for e in LRScheduleMismatch(plan).scan(lr=lr)]
        [50]
    """

    inputs = (Input("lr"),)
    knob = Knob("rtol", 1e-4, 1.0)
    _state_keys = ("quiet_until", "last_step")

    def __init__(self, schedule: Callable[[int], float], rtol: float = RTOL, cooldown: int = COOLDOWN) -> None:
        if not callable(schedule):
            raise ValueError(f"schedule must be a callable step -> lr, got {schedule!r}")
        check_range("rtol", rtol, 0, None, lo_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.schedule = schedule
        self.rtol = rtol
        self.cooldown = cooldown
        self._reset()

    def _reset(self) -> None:
        self._quiet_until = NEVER
        self._last_step = -1

    def _step(self, lr: float, step: int) -> Event | None:
        self._last_step = step
        if lr - lr != 0.0 or lr < 0.0 or step <= self._quiet_until:
            return None
        want = float(self.schedule(step))
        err = abs(lr - want) / max(abs(want), 1e-300)
        if err <= self.rtol:
            return None
        self._quiet_until = step + self.cooldown
        msg = f"lr is {lr:.4g} at step {step} where the schedule says {want:.4g}"
        return make_event(Kind.LR_ANOMALY, "warning", step, step, type(self).__name__, "lr", err, self.rtol, msg)


__all__ = ["LRScheduleMismatch"]
