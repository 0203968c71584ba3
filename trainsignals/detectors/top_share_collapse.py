"""TopShareCollapse: predictions concentrate on one class while the training loss keeps falling."""

from __future__ import annotations

import math

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._answers import ONE_ANSWER
from ._base import Detector, Input, Knob
from ._interval import MIN_VALUES
from ._ops import log

#: Where ``onset_step`` is placed, and how far the share may stray and still teach the baseline:
#: a quarter of the way from the baseline to the threshold.
_ONSET_FRAC = 0.25
#: The rise must also be this many standard deviations of the smoothed share's own noise (its
#: batch-to-batch scatter around the slow level): a normal deviate beyond 6 sd comes once in
#: 10^9 values, far below the budget of one alarm per 10,000 healthy steps.
_NOISE_Z = 6.0


class TopShareCollapse(Detector):
    """Flags silent collapse: the most-predicted class takes over while the training loss falls.

    ``pred_top_share`` is the share of the most-predicted class among a sampled batch's
    predictions (:func:`trainsignals.adapters.torch.pred_top_share`). A healthy classifier
    predicts about as many classes as the batch holds: the share sits near the largest class
    frequency, whatever the untrained network did at initialisation. A model whose training
    labels collapsed to one class (a bad data stage, a label-mapping bug) fits them: its loss
    keeps falling, so loss-based rules see a run that learns, while its predictions pile onto
    one answer.

    The detector keeps a fast EWMA (weight ``alpha``) of the share, a slow one (weight
    ``slow``), the share's batch-to-batch scatter (a slow EWMA of half the squared change
    between successive values: a trend does not inflate it) and a fast EWMA of ``log(loss)``,
    fed at the steps that have both (on a log written every N steps, ``Monitor(log_every=N)``,
    ``alpha`` and ``warmup`` keep their memory in steps; ``slow`` stays a value's, which keeps it
    below ``alpha`` at any interval). The slow level follows the fast one down at once when the
    fast one is six standard deviations below it (the predictions spreading out after
    initialisation is a real fall, not noise). The *baseline* is the lowest level the share
    *held*: the slow level once the fast share has stayed within a quarter of the gap (below)
    of it, above or below, for ``warmup`` values in a row after its first ``warmup`` values
    (taken again, lower, each time the share holds a lower level that long), with the smoothed
    log loss at the step it was set. A network at or near initialisation answers as its random
    weights make it, often one class (its prior, or a random favourite: a character model's
    space, a ViT's first steps), and spreads its answers only as it learns, bunching up again
    now and then on the way; those answers are not a diversity the model held, so they set no
    baseline, and a model that never held a diverse level has none to lose: the rule stays
    quiet on it, and on a baseline of :data:`~trainsignals.detectors._answers.ONE_ANSWER`
    or more: answers already nine in ten one class hold no diversity to lose, and half the room
    left to 1 is less than a batch's scatter (a character model that answers spaces for 150 steps,
    then 95 % of the time). The slow level and the scatter learn only from
    values within a quarter of the way to the threshold, so a collapse never inflates the
    statistics it is measured against. It fires ``silent_collapse`` (a warning) when

    * the fast share rose ``rise`` of the way from the baseline to 1 (``share > base + rise *
      (1 - base)``: relative to the run's own level, so a 2-class and a 1000-class problem are
      judged alike), and at least six standard deviations of its own noise, and
    * the training loss kept falling: the smoothed loss is at most ``loss_tolerance`` times its
      level at the baseline (a loss that rises with the share is a divergence, left to the
      loss rules).

    While the collapse lasts it fires again after every ``cooldown`` steps (no event within
    ``cooldown`` steps of the last one), so the Monitor's ``collapsed`` status holds for as long
    as the share stays up; it stops once the share falls back under the threshold.
    ``onset_step`` is the last step the fast share was a quarter of the way to the threshold or
    lower. A non-finite share or loss leaves the statistics as they are; a loss of 0 (all
    confidence on the answer) leaves the smoothed loss where it was.

    The defaults were set on healthy runs only, with a budget of fewer than 1 alarm per 10,000
    healthy steps: on 600 healthy runs of the synthetic generator (seeds 7000-7199, every
    difficulty; 2 to 1000 classes, batches of 32 to 512 predictions every 1 to 5 steps) the
    largest ``(share - base) / (1 - base)`` that also cleared the noise condition was 0.39 (the
    runs' 99th percentile: 0.17); ``rise = 0.5`` lies above it, and no alarm fired in their
    580,000 steps (``benchmarks/probe_collapse_thresholds.py``). Real runs record the share too
    (the real-run builder, every step): with the baseline taken after the first ``warmup`` values,
    5 of the development suite's 32 healthy runs alarmed in their first 44 steps (a network
    answering one class before it has learned); with the held baseline none does (16,049
    steps), and of the 117 healthy runs of ``datasets/real`` (rebuilt with the share) one run
    does, a small-batch MLP at step 58: 1 alarm in 150,985 tuning healthy steps in all.

    **Rate**: ``pred_collapse`` 1 alarm in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``pred_collapse`` 1 alarm in 612,122 steps of 1,185 held-out healthy runs
    (``calibration.json``).

    Args:
        alpha: weight of the fast smoothed share and of the smoothed log loss, in (0, 1].
        slow: weight of the slow level and scatter of the share, in (0, alpha).
        rise: how far from the baseline toward 1 the share must rise, in (0, 1).
        warmup: the first values, which set no baseline (the untrained network's answers), and
            the values in a row the share must then hold still at a level before it becomes
            the baseline, >= 1.
        loss_tolerance: how much the smoothed loss may exceed its level at the baseline and
            still count as falling, >= 1.
        cooldown: steps after an event without a new one, >= 0.

    Example:
        Ten classes, batches of 256: the share sits near 0.12 until step 300, then every
        prediction drifts to one class over 40 steps while the loss keeps falling:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(600)
        >>> share = 0.12 + 0.85 * np.clip((t - 300) / 40, 0, 1) + rng.normal(0, 0.02, 600)
        >>> loss = 2.3 * np.exp(-t / 200)
        >>> det = TopShareCollapse()
        >>> [(e.kind.value, e.step, e.onset_step) for e in det.scan(pred_top_share=np.clip(share, 0, 1), loss=loss)]
        [('silent_collapse', 325, 308), ('silent_collapse', 426, 308), ('silent_collapse', 527, 308)]
    """

    knob = Knob("rise", 0.1, 0.95, log=False)
    spans = {"warmup": MIN_VALUES}
    rates = ("alpha",)

    inputs = (Input("pred_top_share"), Input("loss"))
    _state_keys = ("n", "f", "m", "v", "prev", "u", "base", "base_u", "held", "calm", "quiet", "last_step")

    def __init__(self, alpha: float = 0.2, slow: float = 0.01, rise: float = 0.5, warmup: int = 20,
                 loss_tolerance: float = 1.05, cooldown: int = 100) -> None:
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("slow", slow, 0, alpha, lo_open=True, hi_open=True)
        check_range("rise", rise, 0, 1, lo_open=True, hi_open=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("loss_tolerance", loss_tolerance, 1, None)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.alpha = alpha
        self.slow = slow
        self.rise = rise
        self.warmup = warmup
        self.loss_tolerance = loss_tolerance
        self.cooldown = cooldown
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._sa, self._sb = float(slow), 1.0 - float(slow)
        self._noise = alpha / (2.0 - alpha)  # variance of the fast EWMA of white noise, per unit variance
        self._ltol = math.log(loss_tolerance)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._f = 0.0  # fast smoothed share
        self._m = 0.0  # slow smoothed share
        self._v = 0.0  # the share's scatter: EWMA of half the squared change between successive values
        self._prev = 0.0  # the previous share
        self._u = 0.0  # smoothed log loss
        self._base: float | None = None  # the lowest slow level since warm-up
        self._base_u = 0.0  # the smoothed log loss when the baseline was set
        self._held = 0  # values in a row the share has held still at its slow level
        self._calm = -1  # the last step the share was near its baseline
        self._quiet = -1  # no event up to and including this step
        self._last_step = -1

    def _step(self, share: float, loss: float, step: int) -> Event | None:
        self._last_step = step
        if share - share != 0.0 or loss - loss != 0.0:
            return None
        self._n += 1
        if self._n == 1:
            self._f = self._m = self._prev = share
            self._u = log(loss) if loss > 0.0 else 0.0
        else:
            self._f = self._a * share + self._b * self._f
            if loss > 0.0:
                self._u = self._a * log(loss) + self._b * self._u
        base = self._base
        sd = math.sqrt(self._v * self._noise)  # the fast share's noise
        m = self._m  # holding still: the fast share within a quarter of the gap of the slow level, either way
        still = abs(self._f - m) <= _ONSET_FRAC * max(self.rise * (1.0 - m), _NOISE_Z * sd)
        gap = 0.0 if base is None else max(self.rise * (1.0 - base), _NOISE_Z * sd)
        if base is None or self._f <= base + _ONSET_FRAC * gap:  # near the baseline: learn from it
            self._calm = step
            if self._n > 1:
                d = share - self._prev
                self._v = self._sa * 0.5 * d * d + self._sb * self._v
                self._m = self._sa * share + self._sb * self._m
                if self._f < self._m - _NOISE_Z * sd:  # a real fall: the level follows it
                    self._m = self._f
        self._prev = share
        self._held = self._held + 1 if still and self._n > self.warmup else 0  # the first values: the network's own
        if self._held >= self.warmup and (base is None or self._m < base):  # a level it held: the baseline
            self._base, self._base_u = self._m, self._u
            return None
        if (base is None or base >= ONE_ANSWER or self._f <= base + gap or self._u > self._base_u + self._ltol
                or step <= self._quiet):
            return None
        self._quiet = step + self.cooldown
        return make_event(Kind.SILENT_COLLAPSE, "warning", step, self._calm, type(self).__name__, "pred_top_share",
                          self._f, base + gap,
                          f"{self._f:.0%} of the predictions go to one class (its baseline {base:.0%}) while the "
                          f"training loss keeps falling: the model answers one class")


__all__ = ["TopShareCollapse"]
