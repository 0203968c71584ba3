"""The answers the collapse rules judge: the measured shares of the most-predicted class, pooled over steps.

``pred_top_share`` is the share of the most-predicted class in one sampled batch. One batch is
few answers; :func:`pooled_answer` (one share at a time) and :func:`answer_levels` (an array,
for the batch path) give the same EWMA of them, weighted by the steps between shares.
"""

from __future__ import annotations

import numpy as np

from ._ops import step_weight, step_weights, stepwise_ewma

#: the share of the most-predicted class that is "one answer": nine answers in ten. The healthy
#: classifiers of the tuning suites (real and development) answer that concentrated at 0.4 % of
#: their steps after step 100 (99th percentile of the share: 0.81); a collapse answers one class.
ONE_ANSWER = 0.9
#: EWMA weight, a step, of the measured shares in the *answers* the collapse rules judge: the answers
#: of about the last ten steps' sampled batches (2 / (10 + 1), rounded). One batch is too few: the
#: eight answers of a classifier with two balanced classes all fall in one class once in 128 batches,
#: by chance. A share measured ``g`` steps after the one before weighs ``1 - 0.8 ** g``
#: (:func:`answer_weight`): in a log with a row every ten steps, the latest row's share is most of it.
ANSWER_ALPHA = 0.2


def answer_weight(gap: int) -> float:
    """The weight of a share measured ``gap`` steps after the one before: :data:`ANSWER_ALPHA` a
    step, compounded (``1 - (1 - ANSWER_ALPHA) ** gap``).

    >>> answer_weight(1), round(answer_weight(10), 4)
    (0.2, 0.8926)
    """
    return step_weight(ANSWER_ALPHA, gap)


def pooled_answer(level: float, share: float, gap: int = 1) -> float:
    """The answers after one more measured ``share`` (in [0, 1]), ``gap`` steps after the one
    before: the share itself when none came before (``level < 0``), else the EWMA
    ``a * share + (1 - a) * level`` with ``a = answer_weight(gap)`` (:func:`answer_levels` is the
    same recurrence over an array).
    """
    if level < 0.0:
        return share
    a = answer_weight(gap)
    return a * share + (1.0 - a) * level


def answer_levels(shares: np.ndarray, level: float, steps: np.ndarray, last: int) -> np.ndarray:
    """The answers at each of ``shares`` (taken at ``steps``; nan: none measured there), from
    ``level`` (last fed at step ``last``), as :func:`pooled_answer` gives them one share at a time:
    one stretch of equal weight at a time, each the recurrence ``lfilter`` runs.
    """
    with np.errstate(invalid="ignore"):
        meas = (shares >= 0.0) & (shares <= 1.0)
    seen = np.flatnonzero(meas)
    if not len(seen):
        return np.full(len(shares), level)
    x = shares[seen].astype(np.float64)
    gaps = np.diff(np.asarray(steps)[seen].astype(np.int64), prepend=last)
    if level < 0.0:  # the first share measured is the answers
        lev = np.concatenate((x[:1], stepwise_ewma(x[1:], step_weights(ANSWER_ALPHA, gaps[1:]), float(x[0]))))
    else:
        lev = stepwise_ewma(x, step_weights(ANSWER_ALPHA, gaps), level)
    k = np.cumsum(meas) - 1
    return np.where(k >= 0, lev[np.maximum(k, 0)], level)


def last_share_step(shares: np.ndarray, steps: np.ndarray, last: int) -> int:
    """The step of the last share measured among ``shares`` (``last`` when none is)."""
    with np.errstate(invalid="ignore"):
        seen = np.flatnonzero((shares >= 0.0) & (shares <= 1.0))
    return int(steps[seen[-1]]) if len(seen) else last


__all__ = ["ANSWER_ALPHA", "ONE_ANSWER", "answer_levels", "answer_weight", "last_share_step", "pooled_answer"]
