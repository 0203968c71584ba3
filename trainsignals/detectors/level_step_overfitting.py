"""LevelStepOverfitting: the validation loss jumped onto a higher level and stays there."""

from __future__ import annotations

import math

from .._validate import check_range
from ._base import Knob
from ._factors import expm1_or_inf
from ._val_gap import WobbleRule, t_quantile


class LevelStepOverfitting(WobbleRule):
    """Flags overfitting by a two-sample test: the validation loss stepped up while the train loss fell.

    A model that memorises a small training set within a few evaluations makes its validation
    loss jump onto a higher level: no steady climb for a trend test, and a dip after the jump
    breaks a run of rises. On top of the gates every overfitting rule shares (see
    :class:`~trainsignals.detectors._val_gap.ValGapRule`), the rule needs

    * the last ``patience`` log validations above the ``patience + 1`` up to and including the
      best in a one-sided Welch two-sample t-test at ``confidence`` (Welch-Satterthwaite
      degrees of freedom, so a noisy new level needs a larger gap);
    * each of them beyond the wobble (the largest rise over the ``wobble_window`` validations
      before the best, and the largest fall from a peak since);
    * the smoothed train loss down by ``train_fall`` (relative) since the best: a bump of the
      validation loss while the train loss creeps is a meander that a healthy run takes back,
      while a gap that widens by ``1 / (1 - train_fall)`` is not.

    The event is an ``overfitting`` warning whose ``onset_step`` (and :attr:`best_step`) is the
    best validation's step. The rule fires once per new best and re-arms once a validation has
    come back at least halfway, in log space, from the rise it reported towards the best; after
    an event it is quiet for ``cooldown`` steps in any case.

    **Rate**: ``level_step_overfitting`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``level_step_overfitting`` 1 alarm in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        patience: validations without improvement (and on each level of the test), >= 2.
        min_rise: relative rise above the best that counts as rising, >= 0.
        min_train_fall: relative fall of the train loss since the best validation, in [0, 1).
        wobble_window: validations held for the wobble and the test, >= 1.
        train_fall: relative fall of the smoothed train loss since the best, in (0, 1).
        confidence: one-sided confidence of the Welch test, in (0.5, 1).
        cooldown: steps without events after an event, >= 0.
        mode: the direction in which ``val_metric`` improves, ``"max"`` or ``"min"``.

    Example:
        The validation loss, flat near 0.5 up to its best at step 400, jumps to about 0.8 (no
        steady climb, no run of rises) while the train loss falls a decade per 100 steps:

        >>> det = LevelStepOverfitting()
        >>> val = {100: 0.53, 200: 0.51, 300: 0.52, 400: 0.5, 500: 0.9, 600: 0.8, 700: 0.82, 800: 0.81}
        >>> loss = lambda s: 1.0 / (1 + s / 100) if s <= 400 else 0.2 * 10 ** ((400 - s) / 100)
        >>> evs = [det.update(loss=loss(s), val_loss=val.get(s), step=s) for s in range(0, 801, 10)]
        >>> [(e.step, e.onset_step) for evl in evs for e in evl]
        [(700, 400)]
    """

    knob = Knob("min_rise", 0.002, 1.0)

    def __init__(self, patience: int = 3, min_rise: float = 0.02, min_train_fall: float = 0.01,
                 wobble_window: int = 32, train_fall: float = 0.5, confidence: float = 0.975,
                 cooldown: int = 0, mode: str = "max") -> None:
        check_range("wobble_window", wobble_window, 1, None, integer=True)
        check_range("train_fall", train_fall, 0, 1, lo_open=True, hi_open=True)
        check_range("confidence", confidence, 0.5, 1, lo_open=True, hi_open=True)
        self.wobble_window = wobble_window
        self.train_fall = train_fall
        self.confidence = confidence
        self._ctf = -math.log1p(-train_fall)
        self._setup(patience, min_rise, min_train_fall, cooldown, mode)

    def _evidence(self, v: float, tr: float, best_train: float) -> str | None:
        if tr > best_train - self._ctf or not self._stepped_up():
            return None
        wobble = self._beyond_wobble(self._hist[-self.patience:])
        if wobble is None:
            return None
        return (f"on a level above the one it held up to its best, beyond its earlier wobble "
                f"({expm1_or_inf(wobble) * 100:.2g}%)")

    def _stepped_up(self) -> bool:
        """Whether the last ``patience`` log validations sit above the ``patience + 1`` up to and
        including the best: a one-sided Welch test at ``confidence``.
        """
        k = self.patience
        end = len(self._hist) - 1 - self._bad  # the best's place in the history
        if end + 1 < k + 1:
            return False
        post = self._hist[-k:]
        pre = self._hist[end - k:end + 1]
        mp, mq = sum(post) / k, sum(pre) / (k + 1)
        vp = sum((x - mp) ** 2 for x in post) / (k - 1) / k
        vq = sum((x - mq) ** 2 for x in pre) / k / (k + 1)
        se2 = vp + vq
        if se2 <= 0.0:
            return mp > mq
        dof = se2 * se2 / (vp * vp / (k - 1) + vq * vq / k)  # Welch-Satterthwaite
        return (mp - mq) / math.sqrt(se2) >= t_quantile(float(self.confidence), max(1, int(dof)))


__all__ = ["LevelStepOverfitting"]
