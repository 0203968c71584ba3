"""ValMetricChance: the validation metric falls back to chance while the training loss keeps falling."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range
from ._base import Detector, Input, Knob
from ._ops import add_shares, close_shares, first_true

_NOISE_WINDOW = 32  #: validations the metric's noise scale is taken over
#: The noise scale is the median absolute second difference of successive validations over
#: sqrt(3): for independent noise of standard deviation sd a second difference has sd
#: sqrt(6) sd and a first one sqrt(2) sd, so this is the median first difference the noise alone
#: would make, while a curve still climbing (a steady trend) adds nothing to it.
_D2_TO_D1 = 3.0 ** 0.5
#: The gain over chance must be this many times the noise scale before a loss of it counts: a
#: run that never left chance further than its own validation noise has nothing to lose.
_MIN_GAIN_NOISE = 4.0
#: Where ``onset_step`` is placed: the last validation within this share of the fall from the best.
_ONSET_FRAC = 0.25


class ValMetricChance(Detector):
    """Flags silent collapse: the validation metric lost its gain over chance, the loss still falling.

    ``val_metric`` is any validation metric (accuracy, F1, ...) with its direction ``mode``:
    ``"max"`` when higher is better, ``"min"`` for an error. *Chance* is the metric's level
    before the run learned anything: ``chance`` if given (``1 / classes`` for a balanced
    accuracy), else the first validation (the run's own starting level). The detector keeps
    the best level the metric *held* (the better of two successive validations' worse one: a
    best that the next validation does not confirm is one lucky draw) and fires
    ``silent_collapse`` (a warning) when

    * the metric gave back at least ``back`` of its gain over chance (``now <= chance + (1 -
      back) * (best - chance)``, in the metric's direction), the gain at least four times the
      metric's noise (the median absolute second difference of the latest 32 validations, which
      a steady climb does not inflate; for a metric that took one value twice there, at least
      its resolution: the smallest gap between two of its values, 1/N for an accuracy over N);
    * the training loss (the latest given) at most ``loss_tolerance`` times its value when the
      best was held: it kept fitting its labels (a loss that blew up is a divergence);
    * when the run measures its answers (``pred_top_share``), they concentrated: the mean share
      of the most-predicted class since the previous validation above its mean when the best
      was held.

    A model whose training labels collapsed to one class ends at the accuracy of always giving
    that answer, its answers piled onto it. An overfitting model loses a little of its gain; one
    that memorised a short text can lose most of it, its answers spreading out (the held-out
    builder's character models): no collapse to one answer. Without a loss or answers, the other
    conditions decide. No event before ``warmup`` validations; while the metric stays down it
    fires again at the first validation ``cooldown`` steps or more after the last event, so the
    Monitor's ``collapsed`` status holds. ``onset_step``: the last validation within a quarter
    of the fall from the best.

    ``back = 0.8`` was set on healthy runs only (budget: under 1 alarm per 10,000 healthy steps):
    600 healthy synthetic runs (seeds 7000-7199) gave back at most 0.62 of their gain after
    warm-up, no alarm in 580,000 steps (``benchmarks/probe_collapse_thresholds.py``); the held
    best alarms on none of ``datasets/real``'s 117 (a one-validation best did on 2).

    **Rate**: ``val_metric_chance`` 0 alarms in 304,819 tuning healthy steps, 0 in 879,581 held-out ones
    (1,478 runs; ``calibration.json``; budget 0.5 per 10,000).

    Args:
        mode: ``"max"`` or ``"min"``: the direction in which the metric improves.
        back: share of the gain over chance that must be lost, in (0, 1].
        chance: the metric's chance level, if known (``None``: the first validation).
        warmup: validations before any event, >= 2.
        loss_tolerance: how much the training loss may exceed its value when the best was held
            and still count as falling, >= 1.
        cooldown: steps after an event without a new one, >= 0.

    Example:
        Accuracy on 10 classes climbs to 0.9, then from step 1200 falls to 0.1 (every answer one
        class) while the training loss keeps falling (``cooldown = 100``: the event comes again
        at every other validation):

        >>> import numpy as np
        >>> steps = np.arange(0, 2000, 100)
        >>> acc = np.where(steps < 1200, 0.1 + 0.8 * (1 - np.exp(-steps / 300)), 0.1)
        >>> acc[steps == 1200] = 0.5
        >>> det = ValMetricChance()
        >>> evs = [det.update(step=int(s), val_metric=float(a), loss=float(np.exp(-s / 500))) for s, a in zip(steps, acc)]
        >>> [(e.kind.value, e.step, e.onset_step) for ev in evs for e in ev]
        [('silent_collapse', 1300, 1100), ('silent_collapse', 1500, 1100), ('silent_collapse', 1700, 1100), ('silent_collapse', 1900, 1100)]
    """

    knob = Knob("back", 0.3, 0.99, log=False)

    inputs = (Input("val_metric", required=False), Input("loss", required=False),
              Input("pred_top_share", required=False))
    _state_keys = ("n", "first", "prev", "prev2", "diffs", "best", "loss", "best_loss", "hist", "quiet", "last_step",
                   "answers", "best_share")

    def __init__(self, mode: str = "max", back: float = 0.8, chance: float | None = None, warmup: int = 3,
                 loss_tolerance: float = 1.2, cooldown: int = 100) -> None:
        check_choice("mode", mode, ("max", "min"))
        check_range("back", back, 0, 1, lo_open=True)
        if chance is not None:
            check_range("chance", chance)
        check_range("warmup", warmup, 2, None, integer=True)
        check_range("loss_tolerance", loss_tolerance, 1, None)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.mode, self.back, self.chance, self.warmup = mode, back, chance, warmup
        self.loss_tolerance, self.cooldown = loss_tolerance, cooldown
        self._sign = 1.0 if mode == "max" else -1.0
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._first: float | None = None  # chance, in the improving direction
        self._prev: float | None = None  # the last validation, and the one before it
        self._prev2: float | None = None
        self._diffs: deque[float] = deque(maxlen=_NOISE_WINDOW)  # |second differences|
        self._best: float | None = None
        self._loss: float | None = None  # the latest training loss (None: none given yet)
        self._best_loss: float | None = None  # the training loss when the best was held (None: not given)
        self._hist: deque[list[float]] = deque(maxlen=_NOISE_WINDOW)  # recent [step, metric]
        # the answer shares since the last validation: [sum, count, their mean at the last validation with
        # any (None: never measured)], and that mean when the best was held
        self._answers: list[Any] = [0.0, 0.0, None]
        self._best_share: float | None = None
        self._quiet = -1  # no event up to and including this step
        self._last_step = -1

    def _set_state(self, state: dict[str, object]) -> None:
        super()._set_state(state)
        self._diffs = deque(self._diffs, maxlen=_NOISE_WINDOW)
        self._hist = deque(self._hist, maxlen=_NOISE_WINDOW)

    def _step(self, metric: float, loss: float, share: float, step: int) -> Event | None:
        self._last_step = step
        if loss - loss == 0.0:
            self._loss = loss
        if 0.0 <= share <= 1.0:  # nan compares false: not measured
            self._answers[0] += share
            self._answers[1] += 1.0
        if metric - metric != 0.0:
            return None
        close_shares(self._answers)
        loss = math.nan if self._loss is None else self._loss
        m = self._sign * metric
        self._n += 1
        if self._first is None:
            self._first = m if self.chance is None else self._sign * self.chance
        if self._prev is not None and self._prev2 is not None:
            self._diffs.append(abs(m - 2.0 * self._prev + self._prev2))
        held = None if self._prev is None else min(self._prev, m)  # a level the next validation confirmed
        self._prev2, self._prev = self._prev, m
        self._hist.append([float(step), m])
        if held is None:
            return None
        if self._best is None or held > self._best:
            self._best, self._best_loss, self._best_share = held, (loss if loss - loss == 0.0 else None), self._answers[2]
            return None
        if self._n < self.warmup or step <= self._quiet:
            return None
        gain = self._best - self._first
        noise = sorted(self._diffs)[len(self._diffs) // 2] / _D2_TO_D1 if self._diffs else 0.0
        # a metric on discrete levels (steps of 1/N) zeroes most second differences; taking one value
        # twice shows it, and its noise is then at least the smallest gap between two of its values
        levels = sorted({v for _, v in self._hist})
        if 1 < len(levels) < len(self._hist):
            noise = max(noise, min(b - a for a, b in zip(levels, levels[1:])))
        if gain <= _MIN_GAIN_NOISE * noise or m > self._first + (1.0 - self.back) * gain:
            return None
        if loss - loss == 0.0 and self._best_loss is not None and loss > self.loss_tolerance * self._best_loss:
            return None
        if (now := self._answers[2]) is not None and self._best_share is not None and now <= self._best_share:
            return None  # the answers did not concentrate
        self._quiet = step + self.cooldown
        near = self._best - _ONSET_FRAC * (self._best - m)
        onset = int(max((s for s, v in self._hist if v >= near), default=step))
        level = self._sign * (self._first + (1.0 - self.back) * gain)
        return make_event(Kind.SILENT_COLLAPSE, "warning", step, onset, type(self).__name__, "val_metric",
                          metric, level,
                          f"validation metric {metric:.4g} is back near chance ({self._sign * self._first:.4g}; "
                          f"best {self._sign * self._best:.4g}) while the training loss keeps falling")

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        """Steps without a validation only move the latest training loss and the shares' sum."""
        metric = arrays[0][i:j]
        k = first_true(metric == metric)
        if k:
            losses = arrays[1][i:i + k]
            seen = np.flatnonzero(np.isfinite(losses))
            if len(seen):
                self._loss = float(losses[seen[-1]])
            add_shares(self._answers, arrays[2][i:i + k])
            self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["ValMetricChance"]
