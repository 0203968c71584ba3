"""The early-stopping bookkeeping the overfitting rules share, written once.

:class:`~trainsignals.BreakoutOverfitting`, :class:`~trainsignals.LevelStepOverfitting` and
:class:`~trainsignals.MemorisationClimbOverfitting` each judge whether a validation loss that
stopped improving overfits; the smoothed train loss, the best validation, the gates every alarm
needs, the re-arm, the event and the batch path live here.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range
from ._answers import ONE_ANSWER
from ._base import Detector, Input
from ._factors import expm1_or_inf
from ._interval import RATE_CAP
from ._ops import (
    NEVER,
    add_shares,
    close_shares,
    column_log,
    ewma,
    first_unusable,
    first_usable,
    log,
    shared_ewma,
    step_weight,
    step_weights,
    stepwise_ewma,
)

#: relative improvement that counts as a new best validation: the default of the former
#: TrainValGap since the core engine (commit 9dbceb6), not tuned on a suite
MIN_DELTA = 1e-3
#: EWMA weight of ``log(train loss)`` a step (a memory of about 40 steps): the default of the former
#: TrainValGap since the core engine (commit 9dbceb6), not tuned on a suite
TRAIN_ALPHA = 0.05
#: the weight the smoothed level keeps a step
TRAIN_B = 1.0 - TRAIN_ALPHA
#: share of the reported rise that a validation must take back (towards the best) to re-arm
_REARM_SHARE = 0.5
#: the state every overfitting rule keeps (a rule adds its own keys to these)
RULE_KEYS: tuple[str, ...] = ("train", "best", "best_step", "best_train", "bad", "fired", "cooldown_until",
                              "mrec", "last_step", "train_step", "answers")
#: and the state of a rule that compares with the wobble
WOBBLE_KEYS: tuple[str, ...] = RULE_KEYS + ("hist", "wobble", "peak", "fall")


class ValGapRule(Detector):
    """Base of the overfitting rules: the best validation, the gates, the re-arm and the event.

    The detector keeps an EWMA of ``log(train loss)`` (weight :data:`TRAIN_ALPHA` a step: a loss
    ``g`` steps after the last one taken weighs :func:`train_weight` ``(g)``, so a log written
    every N steps keeps the same memory in steps, never less than a few rows) and, at each
    validation, the best ``log(val_loss)``; a validation that does not beat the best by
    ``log(1 + MIN_DELTA)`` counts toward ``patience``. Every alarm needs ``patience``
    validations in a row that failed to improve, the latest at least ``min_rise`` (relative)
    above the best, and the smoothed train loss at least ``min_train_fall`` (relative) below its
    value at the best validation (both rising is a divergence, not overfitting); then the
    subclass's evidence (``_evidence``). The *memorisation* rules (the ones that read a widening
    gap from a train loss that collapses, as it also does in a healthy run that interpolates a
    small data set) read the validation metric too, when the run reports one (``val_metric``,
    improving in direction ``mode``), and need it to have stopped improving: the mean of the
    ``patience`` latest metrics since the best validation loss no better than the best metric up
    to it. A validation loss that rises while the metric still improves is a model growing more
    confident in answers it gets right and wrong, not one getting worse on held-out data; a rule
    whose own evidence is a significant climb beyond the wobble
    (:class:`~trainsignals.BreakoutOverfitting`) reads no metric. When the run measures its
    answers (``pred_top_share``) and at least :data:`~trainsignals.detectors._answers.ONE_ANSWER`
    of them went to one class since the previous validation (their mean share), no rule fires: a
    validation loss that climbs while the model gives one answer is a collapse, the collapse
    rules' to name. ``onset_step`` and
    :attr:`best_step` are the step of the best validation. A rule fires once per new best, and re-arms once a validation has come back
    at least halfway (in log space) from the rise it reported towards the best; after an event
    it is quiet for ``cooldown`` steps in any case.
    """

    inputs: tuple[Input, ...] = (Input("loss", required=False), Input("val_loss", required=False),
                                 Input("val_metric", required=False), Input("pred_top_share", required=False))
    logs = ("loss",)
    _state_keys = RULE_KEYS

    def _setup(self, patience: int, min_rise: float, min_train_fall: float, cooldown: int, mode: str) -> None:
        check_range("patience", patience, 2, None, integer=True)
        check_range("min_rise", min_rise, 0, None)
        check_range("min_train_fall", min_train_fall, 0, 1, hi_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_choice("mode", mode, ("max", "min"))
        self.patience = patience
        self.min_rise = min_rise
        self.min_train_fall = min_train_fall
        self.cooldown = cooldown
        self.mode = mode
        self._ld = math.log1p(MIN_DELTA)
        self._lr = math.log1p(min_rise)
        self._tf = -math.log1p(-min_train_fall)
        self._reset()

    def _reset(self) -> None:
        self._train: float | None = None
        self._best: float | None = None  # the best log validation, its step, the smoothed train loss there
        self._best_train: float | None = None
        self._best_step, self._bad = -1, 0
        self._fired: float | None = None  # the log rise above the best that alarmed (None: armed)
        self._cooldown_until, self._last_step = NEVER, -1
        self._train_step = -1  # the step of the last train loss taken
        # the answer shares measured since the last validation: [their sum, their count, their mean at the
        # last validation that had any (None: never measured)]
        self._answers: list[Any] = [0.0, 0.0, None]
        # the validation metric, signed (higher is better): [the best so far, the best as it was at the best
        # validation loss, the latest patience since that best]
        self._mrec: list[Any] = [None, None, []]

    @property
    def best_step(self) -> int:
        """Step of the best validation loss so far (-1 before any): the checkpoint to keep."""
        return self._best_step

    def _observe(self, v: float, new_best: bool) -> None:
        """Take one log validation into the subclass's own state (before the best moves)."""

    def _evidence(self, v: float, tr: float, best_train: float) -> str | None:
        """The rule: how the validation overfits (words for the message), or ``None``."""
        raise NotImplementedError

    def _val(self, val: float, step: int) -> Event | None:
        if val - val != 0.0 or val <= 0.0:
            return None
        close_shares(self._answers)  # the answers since the previous validation
        v = log(val)
        new_best = self._best is None or v < self._best - self._ld
        self._observe(v, new_best)
        if new_best:
            self._best, self._best_step, self._best_train, self._bad, self._fired = v, step, self._train, 0, None
            rec = self._mrec
            rec[1], rec[2] = rec[0], []
            return None
        best = self._best
        assert best is not None
        self._bad += 1
        if self._fired is not None:
            if v - best <= _REARM_SHARE * self._fired:  # the rise it reported taken back: re-armed
                self._fired = None
            return None
        if step <= self._cooldown_until or self._bad < self.patience or v - best < self._lr:
            return None
        if (share := self._answers[2]) is not None and share >= ONE_ANSWER:  # one answer: a collapse, not overfitting
            return None
        tr, bt = self._train, self._best_train
        if tr is None or bt is None or tr > bt - self._tf or self._metric_improves() or (
                how := self._evidence(v, tr, bt)) is None:
            return None
        self._fired = v - best
        self._cooldown_until = step + self.cooldown
        msg = (f"val_loss {val:.4g} is {expm1_or_inf(v - best) * 100:.2g}% above its best {math.exp(best):.4g} "
               f"(step {self._best_step}) after {self._bad} evaluations, {how}, while the train loss "
               f"fell {-math.expm1(tr - bt) * 100:.2g}% since the best: restore the step-{self._best_step} checkpoint")
        return make_event(Kind.OVERFITTING, "warning", step, self._best_step, type(self).__name__, "val_loss",
                          v - best, self._lr, msg)

    def _metric_improves(self) -> bool:
        """Whether the latest ``patience`` metrics since the best validation loss beat the best before it."""
        at, got = self._mrec[1], self._mrec[2]
        return at is not None and len(got) >= self.patience and sum(got) > at * len(got)

    def _metric(self, metric: float) -> None:
        """Take one finite validation metric into the record."""
        m = metric if self.mode == "max" else -metric
        rec = self._mrec
        if rec[0] is None or m > rec[0]:
            rec[0] = m
        rec[2].append(m)
        if len(rec[2]) > self.patience:
            del rec[2][0]

    def _take(self, loss: float, val: float, metric: float, share: float, step: int,
              log_loss: float | None = None) -> Event | None:
        """One step: the train loss into its EWMA, the metric into its record, the answers into their
        mean, a validation judged.
        """
        self._last_step = step
        if 0.0 <= share <= 1.0:  # nan compares false: not measured
            self._answers[0] += share
            self._answers[1] += 1.0
        if loss - loss == 0.0 and loss > 0.0:
            u = log(loss) if log_loss is None else log_loss
            if self._train is None:
                self._train = u
            elif step - self._train_step <= 1:
                self._train = TRAIN_ALPHA * u + TRAIN_B * self._train
            else:  # a sparse log: the weight of the steps since the last loss
                a = train_weight(step - self._train_step)
                self._train = a * u + (1.0 - a) * self._train
            self._train_step = step
        if metric - metric == 0.0:  # a finite metric (nan: none at this step)
            self._metric(metric)
        return self._val(val, step) if val == val else None

    #: the per-step entry: ``(loss, val_loss, val_metric, pred_top_share, step, log_loss)``
    _step: Callable[..., Event | None] = _take

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        """Steps without a validation only move the smoothed train level: one vectorised EWMA."""
        k = first_usable(arrays[1], i, j)
        if len(arrays) > 3:  # a rule that reads the metric stops at it too
            k = min(k, first_usable(arrays[2], i, j))
        if k:
            add_shares(self._answers, arrays[-1][i:i + k])
            u = column_log(arrays[0], i, i + k)
            whole = first_unusable(arrays[0], i, i + k, positive=True) == k
            ok = None if whole else np.isfinite(u)
            ug = u if ok is None else u[ok]  # _step skips non-finite and non-positive losses
            if len(ug):
                st = steps[i:i + k] if ok is None else steps[i:i + k][ok]
                if self._train is None:
                    self._train, self._train_step, ug, st = float(ug[0]), int(st[0]), ug[1:], st[1:]
                    whole = False
                if len(ug):
                    gaps = np.diff(st, prepend=self._train_step)
                    if (gaps <= 1).all():  # a whole stretch of the column: shared with the other rules of the batch run
                        self._train = float((shared_ewma(arrays[0], i, "log", ug, TRAIN_ALPHA, TRAIN_B, self._train)
                                             if whole else ewma(ug, TRAIN_ALPHA, TRAIN_B, self._train))[-1])
                    else:
                        self._train = sparse_ewma(ug, gaps, self._train)
                    self._train_step = int(st[-1])
            self._last_step = int(steps[i + k - 1])
        return k


#: the inputs of a rule whose own evidence needs no validation metric: the train loss, the validation
#: loss and the answers (its ``_step`` passes ``nan`` for the metric to ``_take``)
METRIC_FREE_INPUTS: tuple[Input, ...] = ValGapRule.inputs[:2] + ValGapRule.inputs[3:]


class WobbleRule(ValGapRule):
    """A rule that compares the rise with the validation loss's own wobble.

    It keeps the latest ``wobble_window`` log validations; the wobble is the larger of the
    largest rise ``log(val[j]) - min(log(val[i]), i < j)`` among them at the best, and the
    largest fall the validation loss made from a peak since the best.
    """

    _state_keys = WOBBLE_KEYS
    wobble_window: int

    def _reset(self) -> None:
        super()._reset()
        self._hist: list[float] = []  # the latest wobble_window log validation losses
        self._wobble = 0.0  # the largest rise among them, taken at the best
        self._peak = 0.0  # the highest log validation since the best
        self._fall = 0.0  # the largest fall from a peak since the best

    def _observe(self, v: float, new_best: bool) -> None:
        if new_best:
            self._wobble = largest_rise(self._hist)
            self._peak, self._fall = v, 0.0
        elif v > self._peak:
            self._peak = v
        elif self._peak - v > self._fall:
            self._fall = self._peak - v
        self._hist.append(v)
        if len(self._hist) > self.wobble_window:
            del self._hist[0]

    def _beyond_wobble(self, recent: list[float]) -> float | None:
        """The wobble, when each of the ``recent`` log validations lies beyond it; else ``None``."""
        assert self._best is not None
        wobble = max(self._wobble, self._fall)
        return wobble if min(recent) - self._best > wobble else None


@functools.lru_cache(maxsize=1024)
def train_weight(gap: int) -> float:
    """The weight of a train loss ``gap`` steps after the last one: :data:`TRAIN_ALPHA` a step,
    compounded (``1 - (1 - TRAIN_ALPHA) ** gap``), at most :data:`~trainsignals.detectors._interval.RATE_CAP`
    (a memory of a few rows, as the other rules keep on a sparse log).

    >>> train_weight(1), round(train_weight(2), 4), round(train_weight(500), 4)
    (0.05, 0.0975, 0.2222)
    """
    return step_weight(TRAIN_ALPHA, gap, RATE_CAP)


def sparse_ewma(u: np.ndarray, gaps: np.ndarray, m0: float) -> float:
    """The smoothed train level after ``u`` (taken ``gaps`` steps apart) from ``m0``: the scalar
    path's recurrence, one stretch of equal weight at a time.
    """
    return float(stepwise_ewma(u, step_weights(TRAIN_ALPHA, gaps, RATE_CAP), m0)[-1])


@functools.lru_cache(maxsize=256)
def t_quantile(confidence: float, dof: int) -> float:
    """Student's t quantile at ``confidence`` with ``dof`` degrees of freedom, cached."""
    from scipy.stats import t as student_t  # SciPy on first use: `import trainsignals` stays light

    return float(student_t.ppf(confidence, dof))


def largest_rise(v: list[float]) -> float:
    """``max(v[j] - min(v[:j]))`` over ``j`` (0 for a series that never rises)."""
    best = 0.0
    lo = math.inf
    for x in v:
        if x - lo > best:
            best = x - lo
        if x < lo:
            lo = x
    return best


__all__ = ["METRIC_FREE_INPUTS", "MIN_DELTA", "RULE_KEYS", "TRAIN_ALPHA", "TRAIN_B", "WOBBLE_KEYS", "ValGapRule", "WobbleRule", "largest_rise",
           "sparse_ewma", "t_quantile", "train_weight"]
