"""JointCollapse: loss and grad norm fell orders of magnitude together, too fast for learning."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._answers import ONE_ANSWER, answer_levels, last_share_step, pooled_answer
from ._base import Input, Knob
from ._coupling import COUPLING_KEYS, LN10, CouplingLevels
from ._factors import times

#: the default ``span`` as a share of ``lag``: two fifths (100 values for the default lag of
#: 250), long enough for a collapse to one answer, which takes a few dozen steps
_SPAN_SHARE = (2, 5)
#: the share before any was measured (the gate is open)
_UNMEASURED = -1.0
#: how many times faster per value the loss must fall over the span than before it: a change of pace, not a
#: steady geometric fall (whose smoothed level, two memories in, falls at least half as fast as later)
PACE_CHANGE = 2.0


class JointCollapse(CouplingLevels):
    """Flags loss and grad norm collapsing together within a few dozen steps: one safe answer.

    A model that found one safe answer (every label the majority class, a constant target)
    drives its loss and its gradients toward zero within a few dozen steps; a healthy run that
    memorises its data gets there gradually, well under a decade per ``span`` steps. On the
    smoothed levels (EWMA, weight ``alpha``) of ``u = log(loss)`` and ``g = log(grad_norm)``
    the rule fires ``silent_collapse`` when over the last ``span`` values both levels fell at
    least ``orders`` decades, and the loss is ``orders`` decades below its level ``lag`` values
    earlier (or its first level) too, so a loss that comes back down after a blow-up does not
    count. "Too fast" is also against the run's own pace: the loss fell at least
    :data:`PACE_CHANGE` times as fast per value over the span as over the (up to ``span``) values
    before it, of which it needs ``2 / alpha`` (two memories of the levels), or as many as a short
    ``lag`` leaves (a log written every N steps). A model that
    converges at one pace from its first step (a least-squares or other convex problem, whose loss
    and gradient fall geometrically) is learning; a collapse is a change of pace. The rule watches
    the first ``lag`` steps too (from value ``span + 2 / alpha``), where a collapse to the
    majority class happens while the loss is still near chance.

    When the run measures its answers (``pred_top_share``, optional: the share of the
    most-predicted class in a sampled batch), the claim is checked on them: the rule fires only
    while the answers (the measured shares pooled over about the last ten steps:
    :func:`~trainsignals.detectors._answers.pooled_answer`) are at least
    :data:`~trainsignals.detectors._answers.ONE_ANSWER`. A classifier that interpolates a small
    training set drives loss and grad norm down as fast, but its answers keep the classes'
    spread. Without the share the rule judges the two levels alone.

    The event is a warning; ``onset_step`` is the first step of the held ``lag`` values at which
    the grad level fell a quarter of a decade below its highest level so far. After an event
    the rule re-arms once the grad level holds still (see
    :class:`~trainsignals.detectors._coupling.CouplingLevels`), and is quiet for ``cooldown``
    steps in any case.

    **Rate**: ``joint_collapse`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``joint_collapse`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        lag: values of history held (the loss's reference level), >= 2.
        span: the short span, in values, of the joint collapse, in [2, lag - 2] (room for the pace
            before it); ``None``: two fifths of ``lag``.
        alpha: weight of the smoothed levels, in (0, 1].
        orders: decades both must fall, > 0.
        cooldown: steps without events after an event, >= 0.

    Example:
        A loss near chance that drops 1000-fold in 40 steps from step 150, its grad norm
        100-fold (every label switched to one class):

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(400)
        >>> drop = np.clip((t - 150) / 40, 0, 1)
        >>> loss = 2.3 * 10.0 ** (-3 * drop) * np.exp(rng.normal(0, 0.05, 400))
        >>> grad = 10.0 ** (-2 * drop) * np.exp(rng.normal(0, 0.1, 400))
        >>> [(e.kind.value, e.step, e.onset_step) for e in JointCollapse().scan(loss=loss, grad_norm=grad)]
        [('silent_collapse', 189, 161)]

        The same fall with the answers measured: spread over the classes (a small training set
        learnt by heart) it is no collapse; on one class it is:

        >>> spread = np.full(400, 0.3)
        >>> JointCollapse().scan(loss=loss, grad_norm=grad, pred_top_share=spread)
        []
        >>> one = np.where(t >= 160, 1.0, 0.3)
        >>> [e.step for e in JointCollapse().scan(loss=loss, grad_norm=grad, pred_top_share=one)]
        [189]
    """

    knob = Knob("orders", 0.5, 5.0)
    inputs = (Input("loss"), Input("grad_norm"), Input("pred_top_share", required=False))
    _state_keys = (*COUPLING_KEYS, "share", "share_step")

    def __init__(self, lag: int = 250, span: int | None = None, alpha: float = 0.1, orders: float = 1.5,
                 cooldown: int = 0) -> None:
        check_range("lag", lag, 2, None, integer=True)
        if span is not None:
            check_range("span", span, 2, lag - 2, integer=True)
        self.span = span
        num, den = _SPAN_SHARE
        self._setup(lag, alpha, orders, cooldown, max(2, num * lag // den) if span is None else span)
        # values before the span that give the run's pace: two memories of the levels, or what a short lag leaves
        self._pace = min(math.ceil(2.0 / alpha), lag - self._span)

    def _reset(self) -> None:
        super()._reset()
        self._share = _UNMEASURED  # the answers: the EWMA of the shares of the most-predicted class measured
        self._share_step = -1  # the step of the last share measured

    def _step(self, loss: float, grad: float, share: float, step: int, log_loss: float | None = None,
              log_g: float | None = None) -> Event | None:
        before, at, n = self._share, self._share_step, self._n
        if 0.0 <= share <= 1.0:  # nan compares false: not measured
            self._share, self._share_step = pooled_answer(before, share, step - at), step
        ev = self._take(loss, grad, step, log_loss, log_g)
        if self._n == n:  # the levels refused the step (a non-finite or negative value): its share too
            self._share, self._share_step = before, at
        return ev

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        k = super()._fast(arrays, steps, i, j)
        if k:
            shares, st = arrays[2][i:i + k], steps[i:i + k]
            self._share = float(answer_levels(shares, self._share, st, self._share_step)[-1])
            self._share_step = last_share_step(shares, st, self._share_step)
        return k

    def _rule(self, step: int) -> Event | None:
        if self._share >= 0.0 and self._share < ONE_ANSWER:  # the answers measured, and spread
            return None
        us, span = self._us, self._span
        j = -span - 1
        start = max(0, len(us) - 1 - 2 * span)
        h = len(us) - 1 - span - start  # values before the span that give the pace
        ds = self._g - self._gs[j]
        dus = self._u - us[j]
        if (h >= self._pace and ds <= -self._gap and dus <= -self._gap and self._u - us[0] <= -self._gap
                and (us[j] - us[start]) * PACE_CHANGE * span >= dus * h):
            return self._event(step, ds, dus)
        return None

    def _hits(self, uu: np.ndarray, gg: np.ndarray, uext: np.ndarray, gext: np.ndarray,
              first: np.ndarray, back: np.ndarray) -> np.ndarray:
        gap, span = self._gap, self._span
        start = np.maximum(back - span, first)
        h = back - start  # values before the span that give the pace (where the span is held: back > 0)
        dus = uu - uext[back]
        return ((gg - gext[back] <= -gap) & (dus <= -gap) & (uu - uext[first] <= -gap) & (h >= self._pace)
                & ((uext[back] - uext[start]) * PACE_CHANGE * span >= dus * h))

    def _event(self, step: int, ds: float, dus: float) -> Event:
        self._fired(step)
        onset = self._onset(True)
        answers = "" if self._share < 0.0 else f"; {self._share:.0%} of the recent answers are one class"
        msg = (f"loss and grad_norm collapsed together over {self._span} values (since step {onset}): the loss fell "
               f"{times(-dus)}x and the grad norm {times(-ds)}x, too fast for learning{answers}: "
               "the model may have collapsed to one answer (labels of one class?)")
        return make_event(Kind.SILENT_COLLAPSE, "warning", step, onset, type(self).__name__, "loss",
                          min(-dus, -ds) / LN10, self.orders, msg)


__all__ = ["JointCollapse"]
