"""Numerics shared by the loss-trend rules (divergence and overfitting): written once here.

The streaming and the batch paths of :class:`~trainsignals.EarlyClimbDivergence`,
:class:`~trainsignals.TrendDivergence`, :class:`~trainsignals.LostProgress` and the
overfitting rules call these same functions, so both paths compute the same values.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from ._ops import column_id, column_log, ewma, shared, shared_ewma

__all__ = ["NOISE_PER_SD", "PREFILTER_SLACK", "batch_line", "batch_trend", "noise_levels", "noise_step", "noise_warming",
           "window_trend"]

#: E|y[t] - 2y[t-1] + y[t-2]| of white noise, in units of its standard deviation:
#: sqrt(6) * sqrt(2/pi) (the second difference of white noise has variance 6, its mean
#: absolute value is sqrt(2/pi) standard deviations)
NOISE_PER_SD = math.sqrt(12.0 / math.pi)
#: added to the slope's variance so a window of identical values gives a finite t-statistic
#: (a numerical floor, far below any real loss's residual variance)
_VAR_FLOOR = 1e-18
#: relative slack of :func:`batch_trend` used as a pre-filter: NumPy sums in another order than
#: :func:`window_trend`, so a window the vectorised figures put within 0.1 % of a bar is handed to
#: the scalar function, which decides (rounding differs in the last bits, far inside this margin)
PREFILTER_SLACK = 1e-3


def _second_differences(col: np.ndarray) -> np.ndarray:
    """``|(y[t] - y[t-1]) - (y[t-1] - y[t-2])|`` of ``y = log(col)`` at each ``t >= 2`` (nan before)."""
    out = np.full(len(col), np.nan)
    with np.errstate(invalid="ignore"):  # around an unusable value: nan (no stretch reads it)
        d = np.diff(column_log(col, 0, len(col)))
        np.abs(d[1:] - d[:-1], out=out[2:])
    return out


def window_trend(win: Sequence[float]) -> tuple[float, float]:
    """Least-squares slope of ``win`` against its index, and the slope's t-statistic.

    Pure Python so the streaming and the batch path share it value for value.
    """
    w = len(win)
    c = (w - 1) / 2.0
    mean = sum(win) / w
    skk = w * (w * w - 1) / 12.0
    sxy = 0.0
    for k, y in enumerate(win):
        sxy += (k - c) * (y - mean)
    slope = sxy / skk
    ss = 0.0
    for k, y in enumerate(win):
        r = y - mean - slope * (k - c)
        ss += r * r
    se = math.sqrt(ss / (w - 2) / skk + _VAR_FLOOR)
    return slope, slope / se


def batch_line(wins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise least-squares line of the rows of ``wins`` against their index: slopes and residuals."""
    w = wins.shape[1]
    kc = np.arange(w) - (w - 1) / 2.0
    dev = wins - wins.mean(axis=1, keepdims=True)
    slope = dev @ kc / float(kc @ kc)
    return slope, dev - slope[:, None] * kc[None, :]


def batch_trend(wins: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Row-wise :func:`window_trend` of the rows of ``wins`` (the same formula, NumPy's summation).

    Equal to :func:`window_trend` up to rounding: a pre-filter for the batch paths, whose
    decisions are taken by :func:`window_trend` on every row near a bar (:data:`PREFILTER_SLACK`).
    """
    w = wins.shape[1]
    slope, res = batch_line(wins)
    skk = w * (w * w - 1) / 12.0
    se = np.sqrt(np.einsum("ij,ij->i", res, res) / (w - 2) / skk + _VAR_FLOOR)
    return slope, slope / se


def noise_step(y: float, buf: Sequence[float], noise: float, nd: int, a: float, b: float) -> tuple[float, int]:
    """One value ``y`` of the noise scale: the EWMA of ``|y - 2 buf[-1] + buf[-2]|`` and its count.

    ``buf`` holds the log values before ``y``; with fewer than two, nothing changes. While
    :func:`noise_warming`, the scale is the plain mean of the second differences so far (the
    ``nd + 1``-th weighs ``1 / (nd + 1)``); then an EWMA of weights ``a``, ``b = 1 - a``. Started
    as an EWMA from its first value, a run's first, smooth steps would still hold a third of the
    scale twenty values later (``(1 - 0.05) ** 20``), under the noise its later steps show.
    """
    if len(buf) < 2:
        return noise, nd
    b1 = buf[-1]
    ad = abs((y - b1) - (b1 - buf[-2]))
    if a * (nd + 1) < 1.0:  # noise_warming(nd, a), written out: the per-step path of two default rules
        return (noise + (ad - noise) / (nd + 1) if nd else ad), nd + 1
    return a * ad + b * noise, nd + 1


def noise_warming(nd: int, a: float) -> bool:
    """Whether a noise scale of ``nd`` second differences is still a plain mean: the next one would
    weigh more than the EWMA weight ``a`` (the batch paths advance only a warm scale).
    """
    return a * (nd + 1) < 1.0


def noise_levels(ext: np.ndarray, held: int, a: float, b: float, noise0: float,
                 at: tuple[np.ndarray, int] | None = None) -> np.ndarray:
    """The batch twin of the noise scale the divergence rules keep.

    ``ext`` is the ``held`` log values a detector holds followed by the new ones; returns, for
    each new value, the EWMA (weights ``a``, ``b = 1 - a``, from ``noise0``) of the second
    difference ``|y[t] - 2y[t-1] + y[t-2]|`` -- the scalar paths write ``a*ad + b*noise``.
    ``at``: the loss column and the position of the first new value, when the new values are its
    log there; if the two held values before them are the column's too, the second differences
    and their EWMA are shared with the other detectors of the batch run.
    """
    if at is not None and (cid := column_id(at[0])) is not None and at[1] >= 2 and (
            ext[held - 2:held].tobytes() == column_log(at[0], at[1] - 2, at[1]).tobytes()):
        col, i = at
        full = shared(("second difference of log", cid), lambda: _second_differences(col))
        return shared_ewma(col, i, "second difference of log", full[i:i + len(ext) - held], a, b, noise0)
    d = np.diff(ext)
    ad = np.abs(d[held - 1:] - d[held - 2:-1])
    return ewma(ad, a, b, noise0)
