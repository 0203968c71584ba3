"""MemorisationClimbOverfitting: the validation loss rises at every evaluation as the train loss collapses."""

from __future__ import annotations

import math

from .._validate import check_range
from ._base import Knob
from ._val_gap import RULE_KEYS, ValGapRule


class MemorisationClimbOverfitting(ValGapRule):
    """Flags overfitting by a run of rises: validation up at each evaluation, train loss collapsing.

    A model that starts memorising a small training set right after a noisy phase makes its
    validation loss climb inside the range it meandered over before, where a trend test against
    that wobble sees nothing yet. On top of the gates every overfitting rule shares (see
    :class:`~trainsignals.detectors._val_gap.ValGapRule`), the rule needs the validation loss to
    have risen at each of the last ``rises`` validations while the smoothed train loss fell by at
    least ``train_fall`` (relative) over that run of rises: the generalisation gap widening by a
    factor ``1 / (1 - train_fall)`` or more in a few validations is the definition of
    overfitting, not a meander (on a plateau the train loss creeps, it does not halve in a few
    evaluations).

    The event is an ``overfitting`` warning whose ``onset_step`` (and :attr:`best_step`) is the
    best validation's step. The rule fires once per new best and re-arms once a validation has
    come back at least halfway, in log space, from the rise it reported towards the best; after
    an event it is quiet for ``cooldown`` steps in any case.

    **Rate**: ``climb_overfitting`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``climb_overfitting`` 10 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        patience: validations without improvement, >= 2.
        min_rise: relative rise above the best that counts as rising, >= 0.
        min_train_fall: relative fall of the train loss since the best validation, in [0, 1).
        rises: validations in a row that must each rise over the one before, >= 2.
        train_fall: relative fall of the smoothed train loss over that run of rises, in (0, 1).
        cooldown: steps without events after an event, >= 0.
        mode: the direction in which ``val_metric`` improves, ``"max"`` or ``"min"``.

    Example:
        A climb inside an earlier wobble (0.70 -> 0.90) that rises at each of three validations
        while the train loss collapses:

        >>> det = MemorisationClimbOverfitting()
        >>> val = {100: 1.0, 200: 0.7, 300: 0.9, 400: 0.69, 500: 0.70, 600: 0.71, 700: 0.72, 800: 0.73}
        >>> loss = lambda s: 1.0 / (1 + s / 100) if s <= 400 else 0.2 * 10 ** ((400 - s) / 200)
        >>> evs = [det.update(loss=loss(s), val_loss=val.get(s), step=s) for s in range(0, 801, 10)]
        >>> [(e.step, e.onset_step) for evl in evs for e in evl]
        [(700, 400)]
    """

    knob = Knob("min_rise", 0.002, 1.0)

    _state_keys = RULE_KEYS + ("prev", "run", "run_train")

    def __init__(self, patience: int = 3, min_rise: float = 0.02, min_train_fall: float = 0.01,
                 rises: int = 3, train_fall: float = 0.5, cooldown: int = 0, mode: str = "max") -> None:
        check_range("rises", rises, 2, None, integer=True)
        check_range("train_fall", train_fall, 0, 1, lo_open=True, hi_open=True)
        self.rises = rises
        self.train_fall = train_fall
        self._ctf = -math.log1p(-train_fall)
        self._setup(patience, min_rise, min_train_fall, cooldown, mode)

    def _reset(self) -> None:
        super()._reset()
        self._prev: float | None = None  # the previous log validation
        self._run = 0  # validations in a row, up to the latest, that rose over the one before
        self._run_train: float | None = None  # smoothed log train loss where that run began

    def _observe(self, v: float, new_best: bool) -> None:
        if self._prev is not None and v > self._prev:
            self._run += 1
        else:
            self._run = 0
            self._run_train = self._train
        self._prev = v

    def _evidence(self, v: float, tr: float, best_train: float) -> str | None:
        start = self._run_train
        if self._run < self.rises or start is None or tr > start - self._ctf:
            return None
        return (f"rising at each of the last {self._run} evaluations as the train loss fell "
                f"{-math.expm1(tr - start) * 100:.3g}% over them (memorising)")


__all__ = ["MemorisationClimbOverfitting"]
