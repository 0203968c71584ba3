"""The EWMA jump tracker shared by :class:`EWMAZSpike` and :class:`LevelShift` (the math, written once).

A mixin, not a detector: it keeps an EWMA level ``m`` and an EWMA variance ``v`` of the
innovations of ``y = log(x)`` (or ``x`` when ``log=False``), judged one step behind::

    d = y - m
    m <- ALPHA*y + (1-ALPHA)*m
    v <- (1-VAR_ALPHA) * (v + VAR_ALPHA*d*d)

A value is folded into ``m`` and ``v`` one step after it arrives (the "pending" value), and only
if the value after it is not anomalous, so a bad batch spanning two or three steps cannot inflate
the scale its second value is measured against. With ``z = d / sqrt(v + floor**2)`` a CUSUM
``S <- min(h, max(0, S + z - k))``, ``k = SLACK*threshold``, ``h = bar - k`` (one sum per watched
direction) marks a value *anomalous* when ``S + z - k >= h``: one value at ``z >= bar``, or
consecutive values whose z-scores exceed ``k`` by ``h`` in total. The bar is relative to the run's
own tail: ``threshold``, or ``RECORD`` times the run's record (the largest z-score of a value
learned as noise) once that is larger (:data:`RECORD`). The record raises the decision interval
``h`` (the evidence an alarm needs, the CUSUM's false-alarm setting), for a burst of consecutive
values as for a lone one; the reference ``k`` (how far above the level a value must lie to count
as evidence, the CUSUM's design shift) stays, so a lasting shift still sums to an alarm. An
value that is a z-outlier (``z > k``) is also anomalous when the host passes a ``peak_ratio`` and the value
is at least that many times the largest of the previous ``PEAK_WINDOW`` values (the peak test of
:class:`PeakRatioSpike`; log mode, upward only). An anomalous value that is also a jump of at least ``min_ratio`` times the level opens a *watch*
(the host's ``_on_jump`` hook is called). Anomalous values never update ``m``/``v``; more than
``hold`` consecutive anomalous values without a jump-sized one re-base the level there.

**Did it come back?** The watch judges the next ``hold`` values against the level ``m0`` and
scale ``s0`` from before the jump. It *came back* when a value of its second half is within
``min_ratio`` of ``m0`` or within ``SETTLE_Z*s0`` of it; it is *still coming back* when the
median of the second half is at least ``sqrt(min_ratio)`` below that of the first half (another
``hold`` values are watched); otherwise the jump *stayed*: the second half's median becomes the
level and the host's ``_on_stayed`` hook is called, with the step of the jump.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from .._events import Event
from ._base import Input
from ._interval import covered
from ._ops import (
    column_id,
    column_log,
    ewma,
    ewvar,
    first_true,
    first_unusable,
    key_float,
    same_float,
    shared,
    shared_ewma,
    shared_run,
    shifted,
)
from ._ops import log as _log

#: EWMA weight of the level: a ~20-step average, so one batch moves it by a tenth of its deviation and
#: noise in the level adds only 5 % to the residuals' variance (the reasoning of the former EWMASpike)
ALPHA = 0.1
#: EWMA weight of the variance: a ~40-step memory, twice the level's, so the scale moves slower than the level
VAR_ALPHA = 0.05
#: values learned (as plain running averages) before any alarm: one level memory, 2/ALPHA (or fewer
#: once they cover as many steps, in a log written every N steps: :func:`._interval.covered`)
WARMUP = 20
#: the CUSUM reference ``k`` as a fraction of ``threshold``: the CUSUM design for a shift of ``2k``, so two
#: values at 0.75x the threshold (5.25 of 7) count like one at the threshold
SLACK = 0.5
#: the scale's floor, in log units: a flat history (a constant loss) does not make every 0.1 % wiggle an alarm
LOG_FLOOR = 1e-3
#: the scale's floor in linear mode, as a fraction of the level (the same 0.1 %)
LIN_FLOOR = 1e-3
#: the largest magnitude the linear mode takes: the square of the difference of two such values (4e300) is
#: still a float, so the variance stays finite; a value beyond it is skipped, as a non-finite one is (a
#: variance that overflowed to inf would make every later z-score 0: the rule blind for the rest of the run)
LIN_MAX = 1e150
#: a value within this many pre-jump scales of the old level counts as back (a 2-sigma band)
SETTLE_Z = 2.0
#: the watch goes on while the second half's median is this fraction of the jump (in log units: sqrt(min_ratio))
#: below the first half's: the value is still coming back
STILL_FALLING = 0.5

#: the z-score of one value that counts as a jump, and the smallest jump factor (the former EWMASpike's defaults,
#: kept: with them no healthy run of the real and synthetic suites raises a loss spike, bench --rules)
THRESHOLD = 7.0
MIN_RATIO = 1.5
#: values watched after a jump before the verdict (the former default): a bad batch spans two or three steps,
#: so the watch's second half (5 values) is clear of it
HOLD = 10
#: how many times the recent peak a value must reach: in the real and synthetic suites no healthy loss or
#: gradient norm exceeds 4.4x the largest of its previous 50 values (3.7x of 100); 5 stays above both
PEAK_RATIO = 5.0
#: how many previous values the peak is taken over (the 100 of the 3.7x measurement above)
PEAK_WINDOW = 100
#: the z-score a lone value (one the CUSUM sums from zero) must reach is the larger of ``threshold`` and RECORD
#: times the run's *record*: the largest z-score (in the watched direction) of a value the tracker learned as
#: noise (the value after it was not anomalous), outside a jump's watch. The CUSUM's decision interval is that
#: bar less its reference, so a burst of consecutive values must sum to the same bar (a heavy-tailed run's two
#: or three high batches in a row are its own noise too); the reference stays SLACK times ``threshold``.
#: The largest of 1,000 Gaussian values is about 3.2 (above 4.3 once in 100 runs), so with light-tailed noise
#: the bar stays at ``threshold``; only a run whose own noise went past ``threshold / RECORD`` (4.67 for 7: a
#: 1-in-650,000 Gaussian value), a heavy-tailed one, is held to half again its worst wobble. Not chosen on a
#: suite: the factor by which a value must outdo everything the run has already shown and taken back
RECORD = 1.5

_B, _VB = 1.0 - ALPHA, 1.0 - VAR_ALPHA  # the recurrences' forms, as ops.ewma/ewvar evaluate them
_VBA = _VB * VAR_ALPHA
_LOG_FLOOR2 = LOG_FLOOR * LOG_FLOOR + 1e-300
_sqrt = math.sqrt

#: the tracker's state keys (the host lists them in its ``_state_keys``)
TRACK_KEYS = ("n", "mean", "var", "pending", "has_pending", "run", "acc_up", "acc_dn", "ep", "ep_left",
              "ep_start", "ep_ref", "ep_scale", "ep_sign", "recent", "record", "record_cand", "first_step", "last_step")



class EWMAJump:
    """The tracker, as a mixin of a :class:`~trainsignals.Detector` (see the module docstring).

    The host sets ``threshold``, ``min_ratio``, ``log``, ``direction`` and ``hold`` before
    calling :meth:`_track_init`, lists :data:`TRACK_KEYS` in its ``_state_keys``, calls
    :meth:`_track_reset` from ``_reset``, and implements ``_on_jump`` and ``_on_stayed`` (and may
    implement ``_on_watched``, called with each value of the watch). The mixin's ``_step`` is
    :meth:`_track_step`; a host that reads more inputs defines its own and calls it.
    """

    # the state in slots: a host's other attributes then stay few enough for CPython's fast
    # per-instance attribute layout (up to 29 attributes in an instance dict)
    __slots__ = tuple("_" + k for k in TRACK_KEYS if k != "last_step")

    inputs: tuple[Input, ...]
    logs: tuple[str, ...]
    threshold: float
    min_ratio: float
    log: bool
    direction: str
    hold: int
    _n: int
    _mean: float
    _var: float
    _pending: float
    _has_pending: bool
    _run: int
    _acc_up: float
    _acc_dn: float
    _ep: list[float]
    _ep_left: int
    _ep_start: int
    _ep_ref: float
    _ep_scale: float
    _ep_sign: float
    _recent: deque[float]
    _first_step: int
    _last_step: int

    def _on_jump(self, x: float, z: float, mean: float, step: int) -> Event | None:
        raise NotImplementedError

    def _on_stayed(self, level: float, ref: float, onset: int, step: int) -> Event | None:
        raise NotImplementedError

    def _on_watched(self, y: float, step: int) -> Event | None:
        """A value of the watch after a jump (``y`` in the tracker's units: ``log(x)`` in log mode)."""
        return None

    def _track_init(self, peak_ratio: float | None = None) -> None:
        # the peak test's ring buffer; maxlen 0 (appends discard) when the test is off
        self._peak = float(peak_ratio) if peak_ratio is not None else math.inf
        self._peak_n = PEAK_WINDOW if (self.log and peak_ratio is not None) else 0
        self._k = SLACK * float(self.threshold)
        self._lo_k = -self._k if self.direction != "up" else -math.inf
        self._hi_k = self._k if self.direction != "down" else math.inf
        self._up = self.direction != "down"
        self._dn = self.direction != "up"
        self._min_jump = math.log(self.min_ratio) if self.log else float(self.min_ratio) - 1.0
        self.logs = (self.inputs[0].name,) if self.log else ()

    def _track_reset(self) -> None:
        self._n, self._mean, self._var, self._pending, self._has_pending = 0, 0.0, 0.0, 0.0, False
        self._run, self._acc_up, self._acc_dn = 0, 0.0, 0.0
        self._ep, self._ep_left, self._ep_start, self._ep_ref, self._ep_scale, self._ep_sign = [], 0, -1, 0.0, 0.0, 1.0
        self._recent = deque(maxlen=self._peak_n)
        self._first_step = self._last_step = -1
        self._record_cand = 0.0  # the pending value's deviation when it would raise the record (0: it would not)
        self._bar(0.0)

    def _track_set_state(self, state: dict[str, Any]) -> None:
        self._recent = deque(state["recent"], maxlen=self._peak_n)
        self._bar(float(state["record"]))

    def _bar(self, record: float) -> None:
        """Set the run's record deviation, the bar and the CUSUM's decision interval on it (see :data:`RECORD`)."""
        self._record = record
        bar = max(float(self.threshold), RECORD * record)
        self._h = bar - self._k  # the sum a value must reach: z >= bar for a lone one (from a zero sum)
        self._next_record = bar / RECORD  # a value learned beyond this deviation raises the bar

    def _learn(self) -> None:
        """Fold the pending value into the level and the variance (plain running averages in warm-up).

        Warm-up ends as :meth:`_track_step` ends it: after ``WARMUP`` values, or once fewer (but
        ``MIN_WARM``) cover ``WARMUP`` steps; from then on every path folds with the EWMA weights.
        """
        y, n = self._pending, self._n
        if n >= WARMUP or covered(n, self._first_step, self._last_step, WARMUP):
            d = y - self._mean
            self._mean = ALPHA * y + _B * self._mean
            self._var = _VB * self._var + _VBA * (d * d)
        elif n == 0:
            self._mean, self._var = y, 0.0
        else:
            an = max(ALPHA, 1.0 / (n + 1))
            d = y - self._mean
            self._mean = self._mean + an * d
            self._var = (1.0 - an) * (self._var + an * d * d)
        self._n = n + 1
        self._has_pending = False

    def _track_step(self, x: float, step: int, log_x: float | None = None) -> Event | None:
        """One value: the quiet case inline, anything else through :meth:`_judge` (the host's ``_step``)."""
        self._last_step = step
        lg = self.log
        if x - x != 0.0 or (x <= 0.0 if lg else not -LIN_MAX <= x <= LIN_MAX):  # no log, or past LIN_MAX
            return None
        y = (_log(x) if log_x is None else log_x) if lg else x
        if self._n < WARMUP and not covered(self._n, self._first_step, step, WARMUP):
            if self._has_pending:
                self._learn()
            elif not self._n:
                self._first_step = step
            self._pending, self._has_pending = y, True
            self._recent.append(x)
            return None
        mean = self._mean
        d = y - mean
        if lg:
            scale = _sqrt(self._var + _LOG_FLOOR2)
        else:
            f = LIN_FLOOR * abs(mean)
            scale = _sqrt(self._var + (f * f + 1e-300))
        z = d / scale
        if self._lo_k <= z <= self._hi_k and self._has_pending and not (
                self._acc_up or self._acc_dn or self._ep_left or self._run):
            # the common case: fold the previous value in (as _learn does), this one waits a step
            p = self._pending
            dp = p - mean
            self._mean = ALPHA * p + _B * mean
            self._var = _VB * self._var + _VBA * (dp * dp)
            self._n += 1
            self._pending = y
            self._recent.append(x)
            return None
        return self._judge(x, y, d, z, scale, step)

    #: the host's per-step entry (a host that reads more inputs defines its own and calls _track_step)
    _step: Callable[..., Event | list[Event] | None] = _track_step

    def _judge(self, x: float, y: float, d: float, z: float, scale: float, step: int) -> Event | None:
        mean, k, h = self._mean, self._k, self._h
        cand, self._record_cand = self._record_cand, 0.0
        anomalous, sign = False, 1.0
        was_up, was_dn = self._acc_up > 0.0, self._acc_dn > 0.0
        if self._up:
            raw = self._acc_up + z - k
            anomalous = raw >= h
            self._acc_up = 0.0 if raw < 0.0 else min(h, raw)
            if not anomalous and z > k and self._recent and x >= self._peak * max(self._recent):
                anomalous = True
        if self._dn:
            raw = self._acc_dn - z - k
            if raw >= h and not anomalous:
                anomalous, sign = True, -1.0
            self._acc_dn = 0.0 if raw < 0.0 else min(h, raw)
        self._recent.append(x)
        ev = None
        watching = self._ep_left > 0
        if watching:
            self._ep.append(y)
            self._ep_left -= 1
            ev = self._on_watched(y, step)
        if not anomalous:
            self._run = 0
            if self._has_pending:
                self._learn()
                if cand:  # the value before came back at once: it was noise, the run's new record
                    self._bar(cand)
            self._pending, self._has_pending = y, True
            if not watching:
                dev = z if not self._dn else -z if not self._up else abs(z)
                if dev > self._next_record:
                    self._record_cand = dev
        else:
            self._run += 1
            if self._has_pending:  # the value before, if already part of this jump's evidence, stays out
                if not (was_up if sign > 0 else was_dn):
                    self._learn()
                else:
                    self._has_pending = False
            da = sign * d
            big = (da if self.log else da / (abs(mean) + 1e-300)) >= self._min_jump
            if big and not watching:
                ev = self._on_jump(x, z, mean, step)
                self._ep, self._ep_left, self._ep_start = [], self.hold, step
                self._ep_ref, self._ep_scale, self._ep_sign = mean, scale, sign
            elif self._run > self.hold and not watching:
                self._rebase(y)  # a lasting shift too small to count as a jump: the new normal
        if watching and self._ep_left == 0:
            stayed = self._settle()
            if stayed is not None:
                return stayed
        return ev

    def _settle(self) -> Event | None:
        """``hold`` values after a jump: came back, still coming back (watch on), or stayed up."""
        vals, ref, sign = self._ep, self._ep_ref, self._ep_sign
        half = len(vals) // 2
        tail = vals[half:]
        unit = 1.0 if self.log else abs(ref) + 1e-300
        self._ep = []
        rise = min(sign * (v - ref) for v in tail)  # the value that came back the most
        if rise / unit < self._min_jump or rise < SETTLE_Z * self._ep_scale:
            return None  # came back
        level = statistics.median(tail)
        if half and sign * (statistics.median(vals[:half]) - level) / unit >= STILL_FALLING * self._min_jump:
            self._ep_left = self.hold  # still coming back: watch another hold values
            return None
        self._rebase(level)
        return self._on_stayed(level, ref, self._ep_start, self._last_step)

    def _rebase(self, level: float) -> None:
        self._mean, self._has_pending, self._run = level, False, 0
        self._acc_up = self._acc_dn = 0.0

    def _track_fast(self, col: np.ndarray, steps: np.ndarray, i: int, j: int) -> int:
        """Vectorised advance over the quiet prefix of values ``[i, j)`` of the input column ``col``."""
        if (not covered(self._n, self._first_step, int(steps[i]), WARMUP) or not self._has_pending or self._run
                or self._ep_left or self._acc_up or self._acc_dn):
            return 0
        lim = first_unusable(col, i, j, positive=self.log)
        if not self.log and lim:  # a value past LIN_MAX is skipped by the scalar path
            lim = first_true(np.abs(col[i:i + lim]) > LIN_MAX)
        if lim == 0:
            return 0
        x = col[i:i + lim]
        y = column_log(col, i, i + lim) if self.log else x
        p0, m0, v0, cid = self._pending, self._mean, self._var, column_id(col)
        key = None if cid is None else ("ewma_jump", cid, i, self.log, key_float(p0), key_float(m0), key_float(v0))
        # the values learned are those before each one: the column itself when the pending value is the one before i
        prev = col[i - 1:i - 1 + lim] if i and not self.log else column_log(col, i - 1, i - 1 + lim) if i else None
        u = prev if prev is not None and same_float(float(prev[0]), p0) else None
        def run() -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # the level: shared with the rules keeping the same average
            lev = shared_ewma(col, i - 1, "log", u, ALPHA, _B, m0) if u is not None and self.log and key is not None else None
            return trajectory(y, p0, m0, v0, self.log, u, lev)

        m, v, z = shared_run(key, lim, run)
        k, acc_up, acc_dn = shared(None if key is None else (*key, lim, self._k, self._h, self._up, self._dn),
                                   lambda: self._cusum(z, lim))
        if self._peak_n and k:
            c = first_peak(self._recent, x[:k], np.flatnonzero(z[:k] > self._k) if self._up else (), self._peak)
            if c < k:
                k = c
                acc_up = self._evidence(z, c)[1] if self._up else 0.0
                acc_dn = self._evidence(-z, c)[1] if self._dn else 0.0
        c = -1
        if k:
            dev = z[:k] if not self._dn else -z[:k] if not self._up else np.abs(z[:k])
            hits = np.flatnonzero(dev > self._next_record)
            if len(hits):  # a record: it counts once the value after it came back (that one judged on the old bar)
                c = int(hits[0])
                if c + 1 < k:
                    k = c + 2
                    acc_up = self._evidence(z, k)[1] if self._up else 0.0
                    acc_dn = self._evidence(-z, k)[1] if self._dn else 0.0
            if self._peak_n:
                self._recent.extend(x[max(0, k - self._peak_n):k].tolist())
            self._mean, self._var, self._n = float(m[k - 1]), float(v[k - 1]), self._n + k
            self._pending = float(y[k - 1])
            self._acc_up, self._acc_dn = acc_up, acc_dn
            self._last_step = int(steps[i + k - 1])
            if c >= 0:
                if c + 1 < k:  # value c came back at once: the run's new record
                    self._bar(float(dev[c]))
                last = float(dev[k - 1])  # the pending value: a candidate while it is beyond the bar's record
                self._record_cand = last if last > self._next_record else 0.0
        return k

    def _cusum(self, z: np.ndarray, lim: int) -> tuple[int, float, float]:
        """The watched CUSUMs over ``z[:lim]`` from 0: (index of the first anomalous value or ``lim``, the
        upward and the downward sum there).
        """
        k, acc_up, acc_dn = lim, 0.0, 0.0
        if self._up:
            k, acc_up = self._evidence(z, k)
        if self._dn:
            k2, acc_dn = self._evidence(-z, k)
            if k2 < k:
                k, acc_up = k2, self._evidence(z, k2)[1] if self._up else 0.0
        return k, acc_up, acc_dn

    def _evidence(self, z: np.ndarray, lim: int) -> tuple[int, float]:
        """Run the CUSUM over ``z[:lim]`` from 0: (index of the first anomalous value or ``lim``, the sum there).

        The sum leaves 0 only at a value above ``k``; most such values stay below ``h`` and the next
        value takes the sum back to 0. Those runs are judged at once (with the loop's own arithmetic,
        ``(0 + z) - k`` then ``(that + z') - k``); the loop walks the others.
        """
        kk, h = self._k, self._h
        cs = np.flatnonzero(z[:lim] > kk)
        if len(cs):
            r1 = z[cs] - kk
            nxt = np.minimum(cs + 1, lim - 1)
            gone = (r1 < h) & (cs + 1 < lim) & (r1 + z[nxt] - kk <= 0.0)  # back to 0 at the next value
            cs = cs[~gone]
        acc, end = 0.0, 0
        for c in cs.tolist():
            if c < end:
                continue
            t, acc = c, 0.0
            while t < lim:
                raw = acc + float(z[t]) - kk
                if raw >= h:
                    return t, acc
                acc = 0.0 if raw < 0.0 else min(h, raw)
                if acc == 0.0:
                    break
                t += 1
            end = t + 1
        return lim, acc if end >= lim else 0.0


def trajectory(y: np.ndarray, p0: float, m0: float, v0: float, log: bool, u: np.ndarray | None = None,
               m: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The quiet path over the finite values ``y`` from pending value ``p0``, level ``m0`` and variance
    ``v0``: the level and the variance after each value, and each value's z-score (``u``, when given:
    ``p0`` followed by ``y[:-1]``, the values learned; ``m``, when given: the level, ``ewma(u, ALPHA, _B, m0)``).
    """
    if u is None:
        u = np.concatenate(([p0], y[:-1]))  # the value learned at each step is the one before it
    if m is None:
        m = ewma(u, ALPHA, _B, m0)
    mp = shifted(m, m0)
    du = u - mp
    with np.errstate(over="ignore"):  # a linear signal near the float range: its square is inf, as in the scalar path
        np.multiply(du, du, out=du)
    v = ewvar(du, VAR_ALPHA, _VB, v0)
    vp = shifted(v, v0)
    if log:
        vp += _LOG_FLOOR2
    else:  # vp + (f * f + 1e-300)
        f = LIN_FLOOR * np.abs(mp)
        with np.errstate(over="ignore"):
            np.multiply(f, f, out=f)
        f += 1e-300
        vp += f
    np.sqrt(vp, out=vp)
    z = np.subtract(y, mp, out=mp)
    with np.errstate(over="ignore"):  # a jump of 1e300 on a scale of 1e-10: z is inf, as in the scalar path
        return m, v, np.divide(z, vp, out=z)


def first_peak(recent: deque[float], x: np.ndarray, cand: Sequence[int] | np.ndarray, ratio: float) -> int:
    """Index of the first candidate ``c`` with ``x[c] >= ratio * max`` of the ``recent.maxlen`` values
    before it (the kept ``recent`` values, then ``x``'s), or ``len(x)``.
    """
    w = recent.maxlen or 0
    if not len(cand) or not recent or not w:
        return len(x)
    cs = np.asarray(cand, dtype=np.int64)
    cs = cs[x[cs] >= ratio * np.where(cs > 0, x[np.maximum(cs - 1, 0)], recent[-1])]  # the value before is in the window
    rec: list[float] | None = None
    pad = w - len(recent)  # the window of c: the last w - c of the kept values (as many as there are), x[:c]
    for c in cs.tolist():
        top = float(x[max(0, c - w):c].max()) if c else -math.inf
        if c - pad < len(recent):
            if rec is None:
                rec = list(recent)
            top = max(top, max(rec[max(0, c - pad):]))
        if x[c] >= ratio * top:
            return int(c)
    return len(x)
