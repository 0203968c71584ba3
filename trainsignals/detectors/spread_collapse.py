"""SpreadCollapse: a regression's predictions lose their spread while the training loss keeps falling."""

from __future__ import annotations

import math

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector, Input, Knob
from ._interval import MIN_VALUES
from ._ops import log

#: Where ``onset_step`` is placed, and how far the level may stray below its peak and still teach
#: the statistics: a quarter of the fall the rule needs.
_ONSET_FRAC = 0.25
#: The fall must also be this many standard deviations of the smoothed level's own noise (its
#: batch-to-batch scatter): a normal deviate beyond 6 sd comes once in 10^9 values.
_NOISE_Z = 6.0
#: A spread of exactly 0 (one constant answer) is taken as this many nats below the peak: far past
#: any fall the rule asks for, and finite, so the smoothed level can come back from it.
_ZERO_DEPTH = 20.0


class SpreadCollapse(Detector):
    """Flags silent collapse in a regression: its predictions stop varying while its loss falls.

    ``pred_spread`` is the spread of a sampled batch's predictions: their standard deviation
    across the batch, averaged over the outputs (:func:`trainsignals.adapters.torch.pred_spread`).
    A healthy regression's predictions vary as its targets do, so the spread grows from the
    untrained network's to the targets' own and stays there; a model whose training targets
    collapsed to one value (a data stage that writes the mean, a mask that zeroes the targets)
    fits them: its loss keeps falling while its predictions shrink to one answer. It is the
    regression's form of what :class:`TopShareCollapse` sees in a classifier.

    The detector keeps a fast EWMA (weight ``alpha``) of ``log(spread)``, a slow one (weight
    ``slow``), the fast level's noise (a slow EWMA of half the squared change between successive
    values: a trend does not inflate it) and a fast EWMA of ``log(loss)``, fed at the steps that
    have both (on a log written every N steps, ``Monitor(log_every=N)``, ``alpha`` and ``warmup``
    keep their memory in steps). The *peak* is the highest slow level after the first ``warmup``
    values (the untrained network's spread is its random weights', not the model's: the slow level
    starts over from the fast one there), with the
    smoothed log loss at the step it was reached; the slow level and the noise learn only from
    values within a quarter of the fall of the peak, so a collapse never inflates the statistics
    it is measured against. It fires ``silent_collapse`` (a warning) when

    * the fast level fell ``fall`` times below the peak (``fall = 4``: three quarters of the
      spread gone; a batch of 8 predictions scatters its standard deviation by about a quarter,
      ``log 4`` is five such scatters) and at least six standard deviations of its own noise, and
    * the training loss kept falling: the smoothed loss is at most ``loss_tolerance`` times its
      level at the peak (a loss that rises as the spread shrinks is a divergence or dead units,
      left to those rules).

    While the collapse lasts it fires again after every ``cooldown`` steps, so the Monitor's
    ``collapsed`` status holds; it stops once the level is back within the fall. ``onset_step``
    is the last step the fast level was within a quarter of the fall of the peak. A non-finite
    spread or loss leaves the statistics as they are; a spread of 0 counts as a total collapse.

    **Rate**: ``spread_collapse`` not measured: no healthy run of the tuning suites is a regression
    (``calibration.json``; budget 0.5 per 10,000 steps); the defaults follow from the batch
    scatter above, not from a count. **Held out**: ``spread_collapse`` 0 alarms in 144,523 steps of
    150 held-out healthy runs (the regressions of the held-out suite and draws 5084-5107).

    Args:
        alpha: weight of the fast smoothed level and of the smoothed log loss, in (0, 1].
        slow: weight of the slow level and the noise, in (0, alpha).
        fall: how many times the fast spread must fall below the peak, > 1.
        warmup: the first values, which set no peak (the untrained network's spread), >= 1.
        loss_tolerance: how much the smoothed loss may exceed its level at the peak and still
            count as falling, >= 1.
        cooldown: steps after an event without a new one, >= 0.

    Example:
        A regression whose predictions spread to about 1.0, then shrink to a constant from
        step 300 over 40 steps while the loss keeps falling:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(600)
        >>> spread = np.minimum(1.0, 0.1 + t / 100) * np.exp(-5 * np.clip((t - 300) / 40, 0, 1))
        >>> spread = spread * np.exp(rng.normal(0, 0.1, 600))
        >>> loss = np.exp(-t / 200)
        >>> [(e.step, e.onset_step) for e in SpreadCollapse().scan(pred_spread=spread, loss=loss)]
        [(316, 305), (417, 305), (518, 305)]
    """

    knob = Knob("fall", 1.5, 1000.0)
    spans = {"warmup": MIN_VALUES}
    rates = ("alpha",)

    inputs = (Input("pred_spread"), Input("loss"))
    _state_keys = ("n", "f", "m", "v", "prev", "u", "peak", "peak_u", "calm", "quiet", "last_step")

    def __init__(self, alpha: float = 0.2, slow: float = 0.02, fall: float = 4.0, warmup: int = 20,
                 loss_tolerance: float = 1.05, cooldown: int = 100) -> None:
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("slow", slow, 0, alpha, lo_open=True, hi_open=True)
        check_range("fall", fall, 1, None, lo_open=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("loss_tolerance", loss_tolerance, 1, None)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.alpha, self.slow, self.fall, self.warmup = alpha, slow, fall, warmup
        self.loss_tolerance, self.cooldown = loss_tolerance, cooldown
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._sa, self._sb = float(slow), 1.0 - float(slow)
        self._noise = alpha / (2.0 - alpha)  # variance of the fast EWMA of white noise, per unit variance
        self._lf, self._ltol = math.log(fall), math.log(loss_tolerance)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._f = self._m = self._v = self._prev = self._u = 0.0  # fast, slow level; noise; last value; log loss
        self._peak: float | None = None  # the highest slow level after warm-up, and the log loss there
        self._peak_u = 0.0
        self._calm = self._quiet = self._last_step = -1  # near the peak; no event up to; the last step

    def _step(self, spread: float, loss: float, step: int) -> Event | None:
        self._last_step = step
        if spread - spread != 0.0 or loss - loss != 0.0:
            return None
        y = log(spread) if spread > 0.0 else (self._f if self._peak is None else self._peak) - _ZERO_DEPTH
        self._n += 1
        if self._n == 1:
            self._f = self._m = self._prev = y
            self._u = log(loss) if loss > 0.0 else 0.0
            return None
        self._f = self._a * y + self._b * self._f
        if loss > 0.0:
            self._u = self._a * log(loss) + self._b * self._u
        if self._n == self.warmup + 1:  # the slow level starts over: the untrained network's spread is not the model's
            self._m = self._f
        peak = self._peak
        need = max(self._lf, _NOISE_Z * math.sqrt(self._v * self._noise))  # the fall that counts
        if peak is None or self._f >= peak - _ONSET_FRAC * need:  # near the peak: learn from it
            self._calm = step
            d = y - self._prev
            self._v = self._sa * 0.5 * d * d + self._sb * self._v
            self._m = self._sa * y + self._sb * self._m
            if self._n > self.warmup and (peak is None or self._m > peak):
                self._peak, self._peak_u = self._m, self._u
        self._prev = y
        if peak is None or self._f > peak - need or self._u > self._peak_u + self._ltol or step <= self._quiet:
            return None
        self._quiet = step + self.cooldown
        ratio = math.exp(peak - self._f)
        return make_event(Kind.SILENT_COLLAPSE, "warning", step, self._calm, type(self).__name__, "pred_spread",
                          ratio, math.exp(need),
                          f"the predictions' spread fell to 1/{ratio:.3g} of its peak {math.exp(peak):.4g} while the "
                          f"training loss keeps falling: the model gives one answer")


__all__ = ["SpreadCollapse"]
