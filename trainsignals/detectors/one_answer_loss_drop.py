"""OneAnswerLossDrop: the loss drops orders of magnitude within a few dozen steps while the model gives one answer."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._answers import ONE_ANSWER, answer_levels, last_share_step, pooled_answer
from ._base import Detector, Input, Knob
from ._interval import MIN_VALUES
from ._ops import column_log, first_unusable, first_usable, log, shared_ewma

_LN10 = math.log(10.0)
#: a quarter of a decade, in log units: how far below the span's highest level the fall has begun
_QUARTER = 0.25 * _LN10


class OneAnswerLossDrop(Detector):
    """Flags silent collapse: the loss falls ``orders`` decades in ``span`` values while one class takes the answers.

    A model whose training labels collapsed to one class (a bad data stage, a label-mapping bug)
    answers that class and fits the labels at once: within a few dozen steps its loss falls by
    orders of magnitude. A healthy classifier that learns its data by heart gets there gradually,
    and keeps its answers spread over the classes. The rule reads the measured answers
    (``pred_top_share``: the share of the most-predicted class in a sampled batch, pooled over
    about the last ten steps: :func:`~trainsignals.detectors._answers.pooled_answer`) and
    the smoothed level of ``log(loss)`` (EWMA, weight ``alpha``). It fires ``silent_collapse`` (a
    warning) when the answers are at least
    :data:`~trainsignals.detectors._answers.ONE_ANSWER` (nine in ten one class), and the level
    fell ``orders`` decades over the last ``span`` values and lies ``orders`` decades below its
    level ``lag`` values earlier (or its first level: a loss that comes back down after a blow-up
    does not count). :class:`JointCollapse` asks the same fall of the grad norm too, which a
    model with one answer left reaches only as its gradients fade, often a hundred steps later;
    with the answers measured, they are the direct evidence. Until a share is measured the rule
    does nothing (its level starts with the first one): a run that never measures its answers
    pays a call a step.

    ``onset_step`` is the last step of the span whose level was within a quarter of a decade of the
    span's highest: where the fall began. While the collapse lasts (the answers at least
    ``ONE_ANSWER``, the level ``orders`` decades below the span's highest) the rule fires again every
    ``cooldown`` steps, so the Monitor's ``collapsed`` status holds; it ends, and the rule watches
    for a new fall, once either gives way. A non-finite or non-positive loss refuses the step (its
    share too); a non-finite share, or one outside [0, 1], is not a measure.

    The defaults: ``orders`` and ``lag`` are :class:`JointCollapse`'s; ``span`` is "a few dozen
    steps", the time a collapse to one answer takes. On the healthy runs of the tuning suites
    (``datasets/real`` and ``datasets/real_dev``, 146 runs that measure their answers) the level
    fell at most 0.23 decades in 50 values (0.24 in 100) at a step whose answers were
    ``ONE_ANSWER`` or more (untrained character models, which answer one character;
    ``benchmarks/probe_one_answer_margin.py``): no alarm in the tuning
    healthy steps, against a budget of one per 20,000 (``trainsignals/calibration.json``).

    **Rate**: ``one_answer`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``one_answer`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        orders: decades the loss level must fall, > 0.
        span: values over which it must fall, in [2, lag].
        lag: values of history held (the level the loss must also be below), >= 2.
        alpha: weight of the smoothed level, in (0, 1].
        cooldown: steps between the events of one collapse, >= 0.

    Example:
        Ten classes; from step 200 every label is class 0: the model answers it within ten steps
        and its loss falls from 2.3 to 0.002 over 40 (and stays there: the collapse lasts, its
        event comes again 100 steps later):

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(400)
        >>> loss = 2.3 * np.exp(-t / 400) * 10.0 ** (-3 * np.clip((t - 200) / 40, 0, 1)) * np.exp(rng.normal(0, 0.05, 400))
        >>> share = np.where(t >= 210, 1.0, 0.12)
        >>> [(e.kind.value, e.step, e.onset_step) for e in OneAnswerLossDrop().scan(loss=loss, pred_top_share=share)]
        [('silent_collapse', 228, 207), ('silent_collapse', 329, 207)]

        The same fall with the answers spread over the classes (a small set learnt by heart) is no collapse:

        >>> OneAnswerLossDrop().scan(loss=loss, pred_top_share=np.full(400, 0.12))
        []
    """

    knob = Knob("orders", 0.5, 5.0)
    spans = {"span": MIN_VALUES, "lag": "span"}  # on a log every N steps: as many steps (JointCollapse's too)
    rates = ("alpha",)
    inputs = (Input("loss"), Input("pred_top_share", required=False))
    logs = ("loss",)
    _state_keys = ("level", "levels", "steps", "share", "share_step", "top", "onset", "quiet_until", "last_step")

    def __init__(self, orders: float = 1.5, span: int = 50, lag: int = 250, alpha: float = 0.1,
                 cooldown: int = 100) -> None:
        check_range("orders", orders, 0, None, lo_open=True)
        check_range("lag", lag, 2, None, integer=True)
        check_range("span", span, 2, lag, integer=True)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.orders, self.span, self.lag, self.alpha, self.cooldown = orders, span, lag, alpha, cooldown
        self._a, self._b, self._gap = float(alpha), 1.0 - float(alpha), orders * _LN10
        self._reset()

    def _reset(self) -> None:
        self._level = 0.0  # smoothed log(loss) (none before the first loss: no levels held)
        self._levels: deque[float] = deque(maxlen=self.lag + 1)  # the level after each of the last lag + 1 losses
        self._steps: deque[int] = deque(maxlen=self.span + 1)  # their steps (the last span + 1)
        self._share = -1.0  # the answers: the measured shares pooled (-1: none measured yet)
        self._share_step = -1  # the step of the last share measured
        self._top = 0.0  # in a collapse: the level before the fall (0 with onset -1: no collapse)
        self._onset = -1  # the collapse's onset step (-1: none lasts)
        self._quiet_until = self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._levels = deque(state["levels"], maxlen=self.lag + 1)
        self._steps = deque(state["steps"], maxlen=self.span + 1)

    def _step(self, loss: float, share: float, step: int, log_loss: float | None = None) -> Event | None:
        self._last_step = step
        if not (loss - loss == 0.0 and loss > 0.0):  # refused, its share with it (as a step without a loss)
            return None
        if 0.0 <= share <= 1.0:  # nan compares false: not measured
            self._share, self._share_step = pooled_answer(self._share, share, step - self._share_step), step
        elif self._share < 0.0:  # no answers measured yet: nothing to watch (the level starts with them)
            return None
        y = log(loss) if log_loss is None else log_loss
        levels = self._levels
        lev = self._level = self._a * y + self._b * self._level if levels else y
        levels.append(lev)
        self._steps.append(step)
        if self._onset >= 0:  # a collapse lasts while the answers stay one class and the loss stays down
            if self._share < ONE_ANSWER or lev > self._top - self._gap:
                self._onset = -1
            elif step > self._quiet_until:
                return self._event(step, lev, "is still")
            return None
        if (self._share < ONE_ANSWER or step <= self._quiet_until
                or levels[max(0, len(levels) - 1 - self.span)] - lev < self._gap or levels[0] - lev < self._gap):
            return None
        recent = list(levels)[-len(self._steps):]
        self._top = max(recent)
        self._onset = self._steps[max(t for t, v in enumerate(recent) if v >= self._top - _QUARTER)]
        return self._event(step, lev, f"fell in {len(recent) - 1} values and is")

    def _event(self, step: int, lev: float, how: str) -> Event:
        self._quiet_until = step + self.cooldown
        fell = (self._top - lev) / _LN10
        return make_event(Kind.SILENT_COLLAPSE, "warning", step, self._onset, type(self).__name__, "loss", fell,
                          self.orders, f"the loss {how} {fell:.2g} decades below its level at step {self._onset} "
                          f"while {self._share:.0%} of the recent answers are one class: the model answers one class "
                          "(labels of one class?)")

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._share < 0.0:  # no answers measured yet: up to the first one, nothing changes
            if k := first_usable(arrays[1], i, j):
                self._last_step = int(steps[i + k - 1])
            return k
        if not self._levels or not (lim := first_unusable(arrays[0], i, j, True)):
            return 0
        share = answer_levels(arrays[1][i:i + lim], self._share, steps[i:i + lim], self._share_step)  # at each value
        lev = shared_ewma(arrays[0], i, "log", column_log(arrays[0], i, i + lim), self._a, self._b, self._level)
        ext = np.concatenate((np.asarray(self._levels, dtype=np.float64), lev))
        pos = np.arange(len(self._levels), len(ext))
        back = ext[np.maximum(0, pos - self.span)] - lev
        first = ext[np.maximum(0, pos - self.lag)] - lev
        due = steps[i:i + lim] > self._quiet_until
        if self._onset >= 0:  # in a collapse: its end, or its next event
            stop = (share < ONE_ANSWER) | (lev > self._top - self._gap) | due
        else:
            stop = (share >= ONE_ANSWER) & (back >= self._gap) & (first >= self._gap) & due
        k = int(np.argmax(stop)) if stop.any() else lim  # the first such value is left to the scalar step
        if k:
            self._share = float(share[k - 1])
            self._share_step = last_share_step(arrays[1][i:i + k], steps[i:i + k], self._share_step)
            self._level = float(lev[k - 1])
            self._levels.extend(lev[max(0, k - self.lag - 1):k].tolist())
            self._steps.extend(steps[i + max(0, k - self.span - 1):i + k].tolist())
            self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["OneAnswerLossDrop"]
