"""SharpTurnOverfitting: right after its best, the validation loss turns up by many times its own noise."""

from __future__ import annotations

import math

from .._events import Event
from .._validate import check_range
from ._base import Knob
from ._factors import expm1_or_inf
from ._val_gap import METRIC_FREE_INPUTS, RULE_KEYS, ValGapRule

#: The median absolute deviation of a normal sample times this is its standard deviation.
MAD_TO_SD = 1.4826
#: Fewest validations up to the best the noise is measured on (four interpolation residuals).
MIN_NOISE_VALUES = 6
#: A noise below this (in log units: 0.0001 % a validation) is rounding, not measured scatter: the
#: event says so rather than giving a ratio to it.
QUIET = 1e-6


class SharpTurnOverfitting(ValGapRule):
    """Flags overfitting by a noise-scaled rise: the first validations after the best sit far above it.

    Train loss arrives every step, validation loss every N steps; either may be missing. A
    model that starts to memorise turns its validation loss up at once, and a validation set
    of any size scores the turn the more surely the smoother its curve was before. The rule
    measures that smoothness: the noise ``s`` of ``log(val_loss)`` over the ``noise_window``
    validations before the turn (the best and any that meandered near it since), from how far
    each lies from the line through its two neighbours (a smooth trend, falling fast or slowly,
    keeps them near 0; white noise of standard deviation ``s`` gives a residual between
    neighbours ``a`` and ``b`` steps away a standard deviation ``s * sqrt(1 + (a**2 + b**2) / (a
    + b)**2)``, ``sqrt(1.5) s`` at a steady cadence), robustly (the median of the residuals so
    scaled, so the early fast fall of a run does not inflate it). On top of the
    gates every overfitting rule shares (see :class:`~trainsignals.detectors._val_gap.ValGapRule`),
    it judges a *turn*: the ``patience``-th validation in a row at least ``min_rise`` (relative)
    above the best, and there only. It needs

    * the mean log of those ``patience`` validations at least ``z`` noise units above the log
      of the best.

    A healthy curve measured on a few hundred samples scatters by a few percent and the rise
    after its best is of that size: a few units. A best that was one low draw, followed by a
    few validations level with it, is no obstacle: the turn is judged where it happens. A
    slower climb, whose first validations above the best lie within the noise, is
    :class:`~trainsignals.BreakoutOverfitting`'s. It reads no validation
    metric. The event is an ``overfitting`` warning whose ``onset_step`` (and :attr:`best_step`)
    is the best validation's step: the checkpoint to restore.

    ``z = 12.3`` is where the tail method puts this rule's share of the run-level budget (3 % of
    healthy runs split among the rules: about 1 in 1,200) on the tuning suites' healthy runs
    (``python -m trainsignals.eval.calibrate --entry sharp_turn_overfitting``): their largest
    turns were 11.8, 6.6 and 5.8 noise units. ``patience = 2``: the turn must show before the
    other rules' three validations, or it adds nothing to them.

    **Rate**: ``sharp_turn_overfitting`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``sharp_turn_overfitting`` 1 alarm in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        patience: validations in a row above the best that make the turn, >= 2.
        z: noise units the mean of those validations must lie above the best, > 0.
        min_rise: relative rise above the best that counts as above it, >= 0.
        min_train_fall: relative fall of the train loss since the best validation, in [0, 1).
        noise_window: validations before the turn the noise is measured on, >= 6.
        cooldown: steps without events after an event, >= 0.

    Example:
        A validation loss that falls smoothly to its best at step 500 and rises 6 % and 9 % at
        the next two validations while the train loss keeps falling:

        >>> det = SharpTurnOverfitting()
        >>> val = {s: 2.0 * (1 - s / 1250) * (1 + 0.002 * (-1) ** (s // 50)) for s in range(50, 501, 50)}
        >>> val.update({550: val[500] * 1.06, 600: val[500] * 1.09})
        >>> evs = [det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s) for s in range(0, 601, 10)]
        >>> [(e.step, e.onset_step) for evl in evs for e in evl]
        [(600, 500)]

        The same rise after a curve that scattered by 5 % is within its noise:

        >>> det = SharpTurnOverfitting()
        >>> val = {s: 2.0 * (1 - s / 1250) * (1 + 0.05 * (-1) ** (s // 50)) for s in range(50, 451, 50)}
        >>> val.update({500: val[450] * 0.9, 550: val[450] * 0.9 * 1.06, 600: val[450] * 0.9 * 1.09})
        >>> [det.update(loss=1.0 / (1 + s / 100), val_loss=val.get(s), step=s) for s in range(0, 601, 10)].count([])
        61
    """

    knob = Knob("z", 2.0, 50.0)

    _state_keys = RULE_KEYS + ("hist", "hsteps", "above")
    #: a turn many times the curve's own noise is evidence on its own: the rule reads no validation metric
    inputs = METRIC_FREE_INPUTS

    def __init__(self, patience: int = 2, z: float = 12.3, min_rise: float = 0.02, min_train_fall: float = 0.01,
                 noise_window: int = 16, cooldown: int = 0) -> None:
        check_range("z", z, 0, None, lo_open=True)
        check_range("noise_window", noise_window, MIN_NOISE_VALUES, None, integer=True)
        self.z = z
        self.noise_window = noise_window
        self._setup(patience, min_rise, min_train_fall, cooldown, "max")

    def _step(self, loss: float, val: float, share: float, step: int, log_loss: float | None = None) -> Event | None:
        return self._take(loss, val, math.nan, share, step, log_loss)

    def _reset(self) -> None:
        super()._reset()
        self._hist: list[float] = []  # the latest noise_window + patience log validations
        self._hsteps: list[int] = []  # and their steps
        self._above = 0  # validations in a row at least min_rise above the best

    def _observe(self, v: float, new_best: bool) -> None:
        self._above = 0 if new_best or self._best is None or v - self._best < self._lr else self._above + 1
        self._hist.append(v)
        self._hsteps.append(self._last_step)  # the validation's own step (the step _take is at)
        if len(self._hist) > self.noise_window + self.patience:
            del self._hist[0], self._hsteps[0]

    def _evidence(self, v: float, tr: float, best_train: float) -> str | None:
        k = self.patience
        if self._above != k:  # a turn is judged once, at the patience-th validation in a row above the best
            return None
        best = self._best
        assert best is not None
        post = self._hist[-k:]
        pre = self._hist[-k - self.noise_window:-k]  # the validations before the turn
        if len(pre) < MIN_NOISE_VALUES:
            return None
        noise = residual_noise(pre, self._hsteps[-k - len(pre):-k])
        rise = sum(post) / k - best
        if rise < self.z * noise or rise <= 0.0:
            return None
        if noise < QUIET:
            return "a turn on a curve without measurable noise before it"
        return f"a turn of {rise / noise:.3g} times its own noise ({expm1_or_inf(noise) * 100:.2g}% a validation)"


def residual_noise(y: list[float], steps: list[int]) -> float:
    """The noise of ``y`` (taken at ``steps``) about its local trend: the median, times
    :data:`MAD_TO_SD`, of each inner value's distance from the line through its neighbours, scaled
    by that distance's standard deviation in units of the noise (0 for fewer than three values).

    >>> round(residual_noise([0.0, 0.1, 0.0, 0.1, 0.0], [0, 10, 20, 30, 40]), 4)   # a 0.1 zigzag
    0.1211
    >>> residual_noise([3.0, 2.0, 1.0, 0.5, 0.0], [0, 10, 20, 40, 60])   # two lines, uneven steps: no noise
    0.0
    """
    scaled = []
    for i in range(1, len(y) - 1):
        a, b = steps[i] - steps[i - 1], steps[i + 1] - steps[i]
        if a <= 0 or b <= 0:  # validations at one step: no line through them
            continue
        wa, wb = b / (a + b), a / (a + b)  # the line's weights on the neighbour before and after
        scaled.append(abs(y[i] - (wa * y[i - 1] + wb * y[i + 1])) / math.sqrt(1.0 + wa * wa + wb * wb))
    if not scaled:
        return 0.0
    scaled.sort()
    mid = len(scaled) // 2
    return MAD_TO_SD * (scaled[mid] if len(scaled) % 2 else 0.5 * (scaled[mid - 1] + scaled[mid]))


__all__ = ["SharpTurnOverfitting", "residual_noise"]
