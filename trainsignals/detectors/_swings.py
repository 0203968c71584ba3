"""The numerics the oscillation rules share, written once (scalar forms and their row-wise twins).

Used by :class:`~trainsignals.LjungBoxSawtooth`, :class:`~trainsignals.SwingRatioEdgeOfStability`
and :class:`~trainsignals.LRRiseEdgeOfStability`. All work on log values: residuals around a
window's least-squares line, their robust scale, the Ljung-Box statistic, the swing tracker
(EWMA of ``|y[t] - y[t-1]|`` and its slow baseline) and the swing-ratio test of two windows.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable, Sequence
from functools import lru_cache
from itertools import islice
from operator import mul
from typing import Any

import numpy as np

from ._factors import exp_or_inf
from ._ops import column_id, ewma, first_usable, key_float, shared_run, shifted
from ._trend import batch_line

#: weight of the local swing EWMA (about 10 values of memory): the former ``Oscillation`` default
VAR_ALPHA = 0.1
#: weight of the run's baseline swing (about 200 values): the former ``Oscillation`` default
BASE_ALPHA = 0.005
#: median absolute deviation to a Gaussian standard deviation (1 / the normal's 75 % quantile)
MAD_SD = 1.4826
#: smallest residual scale in log space (0.1 %): a flat stretch still gives a finite ratio
SCALE_FLOOR = 1e-3
#: largest move of a window's line, in 10-90 % ranges of its residuals, that is "no net
#: progress" (a climb is a divergence, a fall is learning): the former ``Oscillation`` default
EFFICIENCY = 0.5
#: the longest history a rule reads, in windows (its reference window starts 3 windows back)
SPAN = 4
#: a watched rule is examined every 4th value: every 8th missed real runs that every 4th catches
#: (``docs/design/detection-history.md``, "Oscillation, seed 1")
STRIDE = 4
#: relative slack of the vectorised pre-filters, so that rounding never drops a value the
#: scalar test fires on (the scalar test decides)
SLACK = 1 - 1e-6


def kept(values: Iterable[float | None], maxlen: int) -> deque[float]:
    """A window restored from a state dict (``None``: a missing value, nan)."""
    return deque((math.nan if v is None else v for v in values), maxlen=maxlen)


def plain(values: Iterable[float]) -> list[float | None]:
    """A window for a state dict: nan as ``None`` (JSON has no nan)."""
    return [None if v != v else v for v in values]


def residuals(win: Sequence[float]) -> tuple[list[float], float]:
    """Residuals of the finite values around their least-squares line, and the line's rise over the window."""
    total = sum(win)
    if total - total == 0.0 and len(win) >= 4:  # every value finite (the usual case): the positions are 0..m-1
        m = len(win)
        ks, skk = _centred(m)
        vb = total / m
        dev = [v - vb for v in win]
        slope = sum(map(mul, ks, dev)) / skk
        return [d - slope * k for k, d in zip(ks, dev)], slope * (m - 1)
    pts = [(k, v) for k, v in enumerate(win) if v == v]
    m = len(pts)
    if m < 4:
        return [], 0.0
    kb = sum(k for k, _ in pts) / m
    vb = sum(v for _, v in pts) / m
    skk = sum((k - kb) ** 2 for k, _ in pts)
    slope = sum((k - kb) * (v - vb) for k, v in pts) / skk
    return [v - vb - slope * (k - kb) for k, v in pts], slope * (len(win) - 1)


@lru_cache(maxsize=16)
def _centred(m: int) -> tuple[tuple[float, ...], float]:
    """The positions ``0..m-1`` less their mean, and the sum of their squares: the same numbers
    :func:`residuals` computes for a window of ``m`` finite values, computed once per length.
    """
    kb = sum(range(m)) / m
    return tuple(k - kb for k in range(m)), sum((k - kb) ** 2 for k in range(m))


def scale(res: list[float]) -> float:
    """Robust noise scale of residuals: ``MAD_SD`` x median ``|r|``, floored (``inf`` when none)."""
    if not res:
        return math.inf
    a = sorted(map(abs, res))  # residuals are finite: the median of all of them
    m = len(a)
    return max(MAD_SD * (a[m // 2] if m % 2 else 0.5 * (a[m // 2 - 1] + a[m // 2])), SCALE_FLOOR)


def median(v: Sequence[float]) -> float:
    """Median of the finite values (nan when none)."""
    a = sorted(x for x in v if x == x)
    m = len(a)
    if not m:
        return math.nan
    return a[m // 2] if m % 2 else 0.5 * (a[m // 2 - 1] + a[m // 2])


def spread(res: list[float]) -> float:
    """10-90 % range of the residuals (0 for fewer than 10)."""
    srt = sorted(res)
    return srt[(9 * len(srt)) // 10 - 1] - srt[len(srt) // 10] if len(srt) >= 10 else 0.0


def ljung_box(res: list[float], lags: int) -> float:
    """Ljung-Box ``Q = m (m + 2) sum_k r_k^2 / (m - k)`` over lags 1..``lags`` (``r_k``: autocorrelation)."""
    m = len(res)
    if m <= lags + 2:
        return 0.0
    mu = sum(res) / m
    r = [v - mu for v in res]
    den = sum(v * v for v in r)
    if den <= 0.0:
        return 0.0
    q = 0.0
    for k in range(1, lags + 1):
        ac = sum(map(mul, r[k:], r)) / den  # r[k]*r[0] + r[k+1]*r[1] + ...: the products in time order
        q += ac * ac / (m - k)
    return m * (m + 2) * q


@lru_cache(maxsize=64)
def chi2_crit(p: float, dof: int) -> float:
    """The chi-square quantile at ``1 - p`` with ``dof`` degrees of freedom (SciPy on first use)."""
    from scipy.stats import chi2

    return float(chi2.isf(p, dof))


def batch_residuals(wins: np.ndarray) -> np.ndarray:
    """Row-wise :func:`residuals` (rows of finite values)."""
    return batch_line(wins)[1]


def batch_scale(wins: np.ndarray) -> np.ndarray:
    """Row-wise :func:`scale` of each row's residuals."""
    return np.maximum(MAD_SD * np.median(np.abs(batch_residuals(wins)), axis=1), SCALE_FLOOR)


def batch_ljung_box(res: np.ndarray, lags: int) -> np.ndarray:
    """Row-wise :func:`ljung_box`."""
    m = res.shape[1]
    r = res - res.mean(axis=1, keepdims=True)
    den = (r * r).sum(axis=1)
    ok = den > 0
    q = np.zeros(len(r))
    for k in range(1, lags + 1):
        ac = (r[:, k:] * r[:, :-k]).sum(axis=1) / np.where(ok, den, 1.0)
        q += ac * ac / (m - k)
    return np.where(ok, m * (m + 2) * q, 0.0)


def sawtooth_survivors(yext: np.ndarray, gext: np.ndarray, ends: np.ndarray, w: int, spread: float, frac: float,
                       pattern_p: float, grads: bool) -> np.ndarray:
    """The ``ends`` (exclusive indices into ``yext`` and ``gext``) whose last ``w`` values may be a
    :class:`~trainsignals.LjungBoxSawtooth` sawtooth: its residual-fraction test (against the window
    ``SPAN - 1`` windows back) and its pattern test, row-wise and looser by :data:`SLACK`, so that the
    scalar test, which decides, sees every window it would confirm (a grad-norm window with a gap is
    left to it).
    """
    lags = w // 3
    views = np.lib.stride_tricks.sliding_window_view(yext, w)
    cur = batch_residuals(views[ends - w])
    far = spread * batch_scale(views[ends - SPAN * w])
    keep = (np.abs(cur) > far[:, None]).mean(axis=1) >= 0.5 * frac * SLACK
    if keep.any():
        q = batch_ljung_box(cur[keep], lags)
        passed = q >= chi2_crit(pattern_p, lags) * SLACK
        if grads:
            gw = np.lib.stride_tricks.sliding_window_view(gext, w)[ends[keep] - w]
            qg = batch_ljung_box(batch_residuals(gw), lags)
            qg[~np.isfinite(gw).all(axis=1)] = np.inf
            passed |= q + qg >= chi2_crit(pattern_p, 2 * lags) * SLACK
        keep[keep] = passed
    return ends[keep]


def swing(y: float, m: float, v: float, b: float, n: int, warmup: int) -> tuple[float, float, float]:
    """One step of the swing tracker: ``(last value, local swing v, baseline b)`` after ``y``.

    ``v`` is the EWMA (``VAR_ALPHA``) of ``|y - last|``, ``b`` that of ``v`` (``BASE_ALPHA``, and a
    plain mean while ``n`` (values before ``y``) is under ``warmup``).
    """
    if n == 0:
        return y, 0.0, 0.0
    v = VAR_ALPHA * abs(y - m) + (1.0 - VAR_ALPHA) * v
    a = BASE_ALPHA if n >= warmup else max(BASE_ALPHA, 1.0 / n)
    return y, v, a * v + (1.0 - a) * b


def batch_swing(y: np.ndarray, m: float, v: float, b: float, n0: int, warmup: int,
                at: tuple[np.ndarray, int] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`swing` over a block after ``n0 > 0`` values: ``(v, b, b before each value)``.

    ``at``: the input column and the position ``y`` starts at, when ``y`` is its log there: the
    tracker is then shared with the other detectors of the batch run that run it from the same state.
    """
    if at is not None and (cid := column_id(at[0])) is not None:
        cap = min(warmup, round(1 / BASE_ALPHA))  # from cap values on, the baseline no longer depends on n0
        key = ("swing", cid, at[1], key_float(m), key_float(v), key_float(b), n0 if n0 < cap else -1, cap)
        return shared_run(key, len(y), lambda: batch_swing(y, m, v, b, n0, warmup))  # type: ignore[return-value]
    vs = ewma(np.abs(y - shifted(y, m)), VAR_ALPHA, 1.0 - VAR_ALPHA, v)
    k = min(len(y), max(0, min(warmup, round(1 / BASE_ALPHA)) - n0))  # values whose baseline is a plain mean
    bs = np.empty_like(vs)
    bk = b
    for t, vt in enumerate(vs[:k].tolist()):  # the scalar path's arithmetic: a = 1/n, at most 200 values a run
        a = max(BASE_ALPHA, 1.0 / (n0 + t))
        bs[t] = bk = a * vt + (1.0 - a) * bk
    if k < len(y):
        bs[k:] = ewma(vs[k:], BASE_ALPHA, 1.0 - BASE_ALPHA, float(bs[k - 1]) if k else b)
    return vs, bs, shifted(bs, b)


def swing_ratio(ys: Sequence[float], w2: int) -> float:
    """How many times as wide the loss swings over its last ``w2`` values as over its first ``w2``.

    The ratio of the robust residual scales, carried to loss units (times ``exp`` of the rise of
    the median log-loss); 0 when the loss made progress (its median fell) or the last window's
    line moves by more than ``EFFICIENCY`` times its residuals' 10-90 % range. Finite ``ys``.
    """
    m = len(ys)
    cur, ref = sorted(islice(ys, m - w2, m)), sorted(islice(ys, 0, w2))
    h = w2 // 2
    lvl = (cur[h] - ref[h]) if w2 % 2 else 0.5 * (cur[h - 1] + cur[h] - ref[h - 1] - ref[h])
    if not lvl >= 0.0:
        return 0.0
    res, rise = residuals(list(islice(ys, m - w2, m)))
    if abs(rise) > EFFICIENCY * spread(res):
        return 0.0
    return scale(res) / scale(residuals(list(islice(ys, 0, w2)))[0]) * exp_or_inf(lvl)


#: a block whose every rate is at least this share of the current one trained at about the current step
#: size (within 10 %: a cosine schedule moves less than that over a block near its peak)
SAME_RATE = 0.9
#: a learning rate this many times the last known one is a rise (a restart, a warm-up step, a jump)
RATE_RISE = 1.01
#: completed blocks a rule keeps with their rate (64 blocks of 48 values: a schedule's stage)
BLOCKS = 64


class RateBands:
    """The band (median, robust residual scale) of each completed block of a rule's values, with
    the block's lowest learning rate: how wide the run swung at each step size it trained at.

    ``blocks`` holds ``[last value, lowest rate, median, scale]`` of the latest :data:`BLOCKS`
    blocks whose every value had a rate; ``rise`` is the value where the rate last rose
    (:data:`RATE_RISE`), ``lprev`` the last known rate (0: none yet). :meth:`state` is JSON.
    """

    __slots__ = ("blocks", "blo", "rise", "lprev")

    def __init__(self, state: Sequence[Any] | None = None) -> None:
        blocks, blo, rise, lprev = state if state is not None else ([], None, -1, 0.0)
        self.blocks: list[list[float]] = [list(b) for b in blocks]
        self.blo: float | None = blo  # the current block's lowest rate (-1: a value without one)
        self.rise: int = rise
        self.lprev: float = lprev

    def state(self) -> list[Any]:
        return [[list(b) for b in self.blocks], self.blo, self.rise, self.lprev]

    def take(self, lr: float, n: int, ys: Sequence[float], w2: int) -> None:
        """Value ``n``'s rate (``nan``: none); ``ys`` ends with value ``n``; a block is ``w2`` values."""
        if known := lr - lr == 0.0 and lr > 0.0:
            if self.lprev and lr > RATE_RISE * self.lprev:
                self.rise = n
            self.lprev = lr
        blo = self.blo
        self.blo = (lr if known else -1.0) if blo is None else min(blo, lr) if known and blo > 0.0 else -1.0
        if not (n + 1) % w2:
            if self.blo > 0.0:
                win = list(islice(ys, len(ys) - w2, len(ys)))
                self.blocks.append([n, self.blo, median(win), scale(residuals(win)[0])])
                del self.blocks[:-BLOCKS]
            self.blo = None

    def take_many(self, lr: np.ndarray, n0: int, ys: np.ndarray, off: int, w2: int) -> None:
        """:meth:`take` for values ``n0 .. n0 + len(lr) - 1``, once a rate is known (``lprev`` set:
        then ``take`` runs at every value); ``ys[off + t]`` is value ``n0 + t``'s, after ``w2`` before it.
        """
        assert self.lprev
        with np.errstate(invalid="ignore", over="ignore"):  # 1.01 x the largest float: inf, as in take()
            known = np.isfinite(lr) & (lr > 0.0)
            at = np.flatnonzero(known)
            kl = lr[at]
            up = np.flatnonzero(kl > RATE_RISE * np.concatenate(([self.lprev], kl[:-1])))
        if len(at):
            if len(up):
                self.rise = n0 + int(at[up[-1]])
            self.lprev = float(kl[-1])
        m, first = len(lr), -(n0 + 1) % w2  # the first block's end in the stretch
        starts = np.r_[0, np.arange(first + 1, m, w2)] if first < m - 1 else np.zeros(1, np.int64)
        lows = np.minimum.reduceat(np.where(known, lr, -1.0), starts)  # -1 where a value lacked a rate
        lows[0] = -1.0 if self.blo is not None and self.blo <= 0.0 or lows[0] <= 0.0 else \
            min(math.inf if self.blo is None else self.blo, float(lows[0]))  # the block it began in
        lows = np.where(lows > 0.0, lows, -1.0)
        ends = np.r_[starts[1:] - 1, m - 1]
        done = (n0 + ends + 1) % w2 == 0
        for e, lo in list(zip(ends[done & (lows > 0.0)].tolist(), lows[done & (lows > 0.0)].tolist()))[-BLOCKS:]:
            win = ys[off + e + 1 - w2:off + e + 1].tolist()
            self.blocks.append([n0 + e, lo, median(win), scale(residuals(win)[0])])
        del self.blocks[:-BLOCKS]
        self.blo = None if done[-1] else float(lows[-1])

    def wider(self, cur: Sequence[float], before: int, shift: float) -> bool:
        """Whether the window ``cur`` swings ``shift`` times as wide (:func:`swing_ratio`'s units) as
        the latest block that ended before value ``before`` and before the rate last rose, at
        ``SAME_RATE`` of the current rate or more; True when there is none (a rate new to the run) or
        no rate.
        """
        if not self.lprev:
            return True
        before = before if self.rise < 0 else min(before, self.rise)
        for b in reversed(self.blocks):
            if b[0] < before and b[1] >= SAME_RATE * self.lprev:
                lvl = median(cur) - b[2]
                return lvl >= 0.0 and scale(residuals(list(cur))[0]) / b[3] * exp_or_inf(lvl) >= shift
        return True


def grad_move(gs: Sequence[float], w2: int) -> float:
    """How far the grad norm moved from its first ``w2`` values to its last ``w2`` (log space): the
    larger of its residual scales' ratio and ``exp`` of its median's rise; ``inf`` when either lacks values.
    """
    m = len(gs)
    cur, ref = list(islice(gs, m - w2, m)), list(islice(gs, 0, w2))
    rc, rr = residuals(cur)[0], residuals(ref)[0]
    if not (rc and rr):
        return math.inf
    return max(scale(rc) / scale(rr), exp_or_inf(median(cur) - median(ref)))


def lr_rise(ls: Sequence[float], w2: int) -> float:
    """The smallest learning rate of the last ``w2`` over the median of the first ``w2`` (0 when either lacks one)."""
    m = len(ls)
    cur, ref = [v for v in islice(ls, m - w2, m) if v == v], median(list(islice(ls, 0, w2)))
    return min(cur) / ref if cur and ref > 0.0 else 0.0


def lr_jumps(col: np.ndarray, i: int, n: int, last0: float, top0: float,
             rise: float) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The learning rates of values ``[i, i + n)`` of ``col`` as the rules read them (nan: unknown, as are
    inf and rates <= 0), which are known, the jumps (a known rate at least ``rise`` times the last known one
    before it, ``last0`` before the stretch) and whether each jump is ``rise`` times the highest rate
    before it (``top0`` before the stretch).
    """
    if first_usable(col, i, i + n, positive=True) == n:  # no rate known: no jump
        return np.full(n, np.nan), np.zeros(n, dtype=bool), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=bool)
    with np.errstate(invalid="ignore", over="ignore"):  # a rate near the float range: its rise bar is inf
        lr = col[i:i + n]
        lr = np.where(np.isfinite(lr) & (lr > 0.0), lr, np.nan)
        known = ~np.isnan(lr)
        idx = np.maximum.accumulate(np.where(known, np.arange(n), -1))
        ff = np.where(idx >= 0, lr[np.maximum(idx, 0)], last0)  # the last known rate up to each value
        jumps = np.flatnonzero(known & (lr >= rise * shifted(ff, last0)))
        top = np.fmax.accumulate(np.concatenate(([top0], lr)))  # top[i]: the highest before value i
        return lr, known, jumps, lr[jumps] >= rise * top[jumps]


def batch_swing_ratio(yext: np.ndarray, ends: np.ndarray, w2: int, span: int) -> np.ndarray:
    """A looser row-wise twin of :func:`swing_ratio` (no line test) for windows ending at ``ends``."""
    views = np.lib.stride_tricks.sliding_window_view(yext, w2)
    m = len(ends)
    both = views[np.concatenate((ends + 1 - w2, ends + 1 - span))]  # current rows, then reference
    med = np.median(both, axis=1)
    lvl = med[:m] - med[m:]
    sc = batch_scale(both)
    with np.errstate(over="ignore"):  # a median fall of 1e-12 or less is rounding: no fall
        return np.where(lvl >= -1e-12, sc[:m] / sc[m:] * np.exp(np.maximum(lvl, 0.0)), 0.0)


def watch_checks(n0: int, until0: int, arms: list[int], watch: int, end: int) -> np.ndarray:
    """The values a watch examines in ``[n0, end]``: every ``STRIDE``-th value index, relative to ``n0``.

    The watch covers ``n0 .. until0`` when carried in, and ``a .. a + watch`` after each arming
    value ``a`` of ``arms`` (increasing); overlapping stretches merge.
    """
    stretches: list[tuple[int, int]] = [(n0, until0)] if until0 >= n0 else []
    for a in arms:
        if stretches and a <= stretches[-1][1] + 1:
            stretches[-1] = (stretches[-1][0], max(stretches[-1][1], a + watch))
        else:
            stretches.append((a, a + watch))
    es = [e - n0 for lo, hi in stretches for e in range(-(-lo // STRIDE) * STRIDE, min(hi, end) + 1, STRIDE)]
    return np.array(es, dtype=np.int64)


__all__ = ["BASE_ALPHA", "BLOCKS", "EFFICIENCY", "MAD_SD", "RATE_RISE", "SAME_RATE", "SCALE_FLOOR", "SLACK", "SPAN", "STRIDE",
           "VAR_ALPHA", "RateBands", "batch_ljung_box",
           "batch_residuals", "batch_scale", "batch_swing", "batch_swing_ratio", "chi2_crit", "grad_move",
           "kept", "ljung_box", "lr_jumps", "lr_rise", "median", "plain", "residuals", "sawtooth_survivors", "scale", "spread", "swing", "swing_ratio", "watch_checks"]
