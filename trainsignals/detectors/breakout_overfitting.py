"""BreakoutOverfitting: the validation loss climbs steadily out of the range it wobbled in."""

from __future__ import annotations

import math

from .._events import Event
from .._validate import check_range
from ._base import Knob
from ._factors import expm1_or_inf
from ._trend import window_trend
from ._val_gap import METRIC_FREE_INPUTS, WOBBLE_KEYS, WobbleRule, t_quantile


class BreakoutOverfitting(WobbleRule):
    """Flags overfitting by a trend test: since its best, the validation loss climbs steadily.

    Train loss arrives every step, validation loss every N steps; either may be missing. On top
    of the gates every overfitting rule shares (``patience`` validations without a new best,
    the latest ``min_rise`` above the best, the smoothed train loss ``min_train_fall`` below its
    value at the best: see :class:`~trainsignals.detectors._val_gap.ValGapRule`), the rule needs

    * the least-squares slope of ``log(val_loss)`` over the ``n`` validations since the best (the
      best included, the latest ``max_window`` of them) positive in a one-sided Student-t test
      at level ``1 - confidence``: its t-statistic at least the ``confidence`` quantile of
      Student's t with ``n - 2`` degrees of freedom (4.30 on 2 degrees of freedom at 0.975,
      3.18 on 3, 2.45 on 6: a slope fitted to 4 noisy validations needs a large t);
    * each of the last ``patience`` validations further above the best than the wobble: the
      largest rise the validation loss made over the ``wobble_window`` validations before the
      best, and the largest fall it made from a peak since. A validation curve measured on a few
      hundred samples meanders by a few percent, slowly, and its best is often one low draw: a
      rise no larger than the meanders it already made is one more meander.

    The event is an ``overfitting`` warning whose ``onset_step`` (and :attr:`best_step`) is the
    best validation's step: the checkpoint to restore. The rule fires once per new best and
    re-arms once a validation has come back at least halfway, in log space, from the rise it
    reported towards the best; after an event it is quiet for ``cooldown`` steps in any case.

    **Rate**: ``breakout_overfitting`` 3 alarms in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``breakout_overfitting`` 33 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        patience: validations without improvement, >= 2.
        min_rise: relative rise above the best that counts as rising, >= 0.
        min_train_fall: relative fall of the train loss since the best validation, in [0, 1).
        max_window: most validations in the trend, >= patience + 1.
        wobble_window: validations before the best whose largest rise the climb must beat, >= 1.
        confidence: one-sided confidence of the trend test, in (0.5, 1).
        cooldown: steps without events after an event, >= 0.

    Example:
        >>> det = BreakoutOverfitting()
        >>> val = {100: 1.0, 200: 0.8, 300: 0.7, 400: 0.72, 500: 0.78, 600: 0.85}
        >>> evs = [det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s) for s in range(0, 601, 10)]
        >>> [(e.step, e.onset_step) for evl in evs for e in evl]
        [(600, 300)]

        A climb no larger than a rise the curve already made and took back (0.70 -> 0.74)
        is one more meander:

        >>> det = BreakoutOverfitting()
        >>> val = {100: 1.0, 200: 0.8, 300: 0.7, 400: 0.74, 500: 0.69, 600: 0.66, 700: 0.68, 800: 0.69, 900: 0.7}
        >>> [det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s) for s in range(0, 901, 10)].count([])
        91

        Three rises after the best make a slope with t = 3.9 on 2 degrees of freedom, short of
        the 4.30 that confidence 0.975 asks there; a fourth rise (critical value 3.18) makes it:

        >>> det = BreakoutOverfitting()
        >>> val = {100: 1.0, 200: 0.8, 300: 0.6, 400: 0.5, 500: 0.525, 600: 0.525, 700: 0.565, 800: 0.575}
        >>> evs = [det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s) for s in range(0, 801, 10)]
        >>> [(e.step, e.onset_step) for evl in evs for e in evl]
        [(800, 400)]
    """

    knob = Knob("min_rise", 0.002, 1.0)

    _state_keys = WOBBLE_KEYS + ("since",)
    #: a climb beyond the wobble is evidence on its own: the rule reads no validation metric
    inputs = METRIC_FREE_INPUTS

    def __init__(self, patience: int = 3, min_rise: float = 0.02, min_train_fall: float = 0.01,
                 max_window: int = 8, wobble_window: int = 32, confidence: float = 0.975,
                 cooldown: int = 0) -> None:
        check_range("patience", patience, 2, None, integer=True)
        check_range("max_window", max_window, patience + 1, None, integer=True)
        check_range("wobble_window", wobble_window, 1, None, integer=True)
        check_range("confidence", confidence, 0.5, 1, lo_open=True, hi_open=True)
        self.max_window = max_window
        self.wobble_window = wobble_window
        self.confidence = confidence
        self._setup(patience, min_rise, min_train_fall, cooldown, "max")

    def _step(self, loss: float, val: float, share: float, step: int, log_loss: float | None = None) -> Event | None:
        return self._take(loss, val, math.nan, share, step, log_loss)

    def _reset(self) -> None:
        super()._reset()
        self._since: list[float] = []  # the log validations since the best (the best first), at most max_window

    def _observe(self, v: float, new_best: bool) -> None:
        super()._observe(v, new_best)
        if new_best:
            self._since = [v]
            return
        self._since.append(v)
        if len(self._since) > self.max_window:
            del self._since[0]

    def _evidence(self, v: float, tr: float, best_train: float) -> str | None:
        wobble = self._beyond_wobble(self._since[-self.patience:])
        if wobble is None:
            return None
        if window_trend(self._since)[1] < t_quantile(float(self.confidence), len(self._since) - 2):
            return None
        return f"beyond its earlier wobble ({expm1_or_inf(wobble) * 100:.2g}%)"


__all__ = ["BreakoutOverfitting"]
