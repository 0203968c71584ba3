"""SlopeDivergence: the loss trend turns upward and keeps climbing."""

from __future__ import annotations

import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input
from ._ops import ewma, first_true, shifted

#: E|y[t] - 2y[t-1] + y[t-2]| of white noise, in units of its standard deviation: sqrt(6)*sqrt(2/pi)
_NOISE_PER_SD = math.sqrt(12.0 / math.pi)
_INF = math.inf


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
    se = math.sqrt(ss / (w - 2) / skk + 1e-18)
    return slope, slope / se


class SlopeDivergence(Detector):
    """Flags a loss that climbs, or that lost its progress: divergence, before the first NaN.

    Three rules, all on ``y = log(x)`` so they are scale-free:

    * **early climb** — the last ``early_steps`` step-to-step changes are all rises and their
      total is at least ``max(log(early_ratio), noise_mult * noise)``, and either no single
      rise makes more than ``max_share`` of it, or the other rises alone already make such a
      climb (a lone spike at the end of small noise rises is not a climb; a climb that
      accelerates, each rise larger than the last as a run blows up, is). ``noise`` is the
      EWMA (weight ``noise_alpha``) of the second difference ``|y[t] - 2y[t-1] + y[t-2]|``: the
      run's irregularity, which a steady geometric climb does not inflate. Catches geometric
      growth from the first steps, within ``early_steps + 1`` values.
    * **window trend** — over the last ``window`` values (from ``window // 2`` values on, at the
      start of a run) the least-squares slope has
      t-statistic ``>= threshold`` and the fitted rise ``slope*(window-1)`` is at least
      ``log(min_ratio)``; candidates are only examined when the newest value sits
      ``max(log(min_ratio), noise)`` above the oldest. Catches slow divergence
      through noise; a spike that recovers inflates the residuals and does not count.
    * **lost progress** — the loss jumped or drifted up and stays there instead of climbing on
      (a learning-rate blow-up that kills the network leaves a noisy plateau at or above the
      initial loss). With ``level`` the EWMA of ``y`` (weight ``2/(window+1)``) and ``best``
      its lowest value so far, the rule fires when the median of the last ``window`` values
      is at least ``max(lost, lost_z * sd)`` above ``best``, where ``lost`` is the smaller of
      ``log(lost_ratio)`` and the share ``lost_frac`` of the progress the run had made (``start
      - low``, with ``start`` the level once the first ``window`` values are in and ``low``
      the lowest level since), but at
      least ``log(lost_min)``: a run that fell from 2.3 to 1.9 and is back at 2.3 lost all its
      progress though its loss rose by only 1.2x. A run whose progress is less than
      ``log(lost_min)`` is judged by ``lost_ratio`` alone. And
      ``sd`` is the window's own noise scale: the mean absolute second difference of its
      values over ``sqrt(12/pi)`` (its value for white noise, in standard deviations; a mean,
      not a median, because the level is a mean too: dips of a small loss in log space pull
      both down). Candidates are only examined when ``level`` itself is ``lost`` above
      ``best``. The median keeps a short burst from counting, and the window keeps it from
      inflating the noise scale once it has left; the noise term keeps a very noisy run (where
      the lowest point of the level is far below its typical value) quiet.

    ``onset_step`` is where the climb began: the start of the rising run (early rule), the
    lowest point of the window (window rule), or the step at which ``level`` last rose more than
    ``lost/2`` above ``best`` (lost progress). After an event the detector is quiet
    for ``cooldown`` steps, and the lost-progress rule stays quiet until ``level`` has come back
    within ``lost/2`` of ``best`` (one report per climb). Non-positive and
    non-finite values are skipped.

    Args:
        window: values in the trend window (and in the median of the lost-progress rule), >= 5.
        threshold: t-statistic of the slope that counts, > 0.
        min_ratio: smallest rise over the window, as a factor, > 1.
        early_steps: consecutive rises for the early rule, >= 2.
        early_ratio: smallest total rise of the early rule, as a factor, > 1.
        max_share: largest share of one rise in an early climb, in (0, 1].
        noise_alpha: EWMA weight of the noise scale, in (0, 1).
        noise_mult: how many noise scales a rise must exceed, >= 0.
        cooldown: steps without events after an event, >= 0.
        signal: the signal name used in events.
        lost_ratio: smallest factor by which the median loss must sit above its best level
            for the lost-progress rule, > 1.
        lost_z: how many noise standard deviations that rise must also exceed, >= 0.
        lost_frac: share of the run's progress whose loss also counts as lost progress, in
            (0, 1]; 1 leaves only ``lost_ratio``.
        lost_min: smallest progress, and smallest rise, as factors, for the ``lost_frac``
            judgement, in (1, lost_ratio].

    Example:
        Gradient descent on (w - 3)**2 from w = 10 at lr 1.1:

        >>> det = SlopeDivergence()
        >>> w, losses = 10.0, []
        >>> for _ in range(10):
        ...     w -= 1.1 * 2 * (w - 3)
        ...     losses.append((w - 3) ** 2)
        >>> [(e.step, e.onset_step) for e in det.scan(loss=losses)]
        [(4, 0)]

        A network killed at step 300 by a learning-rate blow-up: the loss bursts to 1e4, then
        sits on a noisy plateau at 2.3, six times its level before, and climbs no further:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> loss = 2.3 * np.exp(-np.arange(600) / 60) + 0.4
        >>> loss[300:] = 2.3
        >>> loss[300:303] = [50.0, 1e4, 300.0]
        >>> loss *= np.exp(rng.normal(0, 0.1, 600))
        >>> [(e.step, e.onset_step, e.message.split(":")[0]) for e in SlopeDivergence().scan(loss=loss)]
        [(318, 300, 'loss lost its progress')]
    """

    _state_keys = ("buf", "sbuf", "noise", "nd", "level", "best", "climb", "reported", "cooldown_until", "last_step",
                   "start", "low")

    def __init__(
        self,
        window: int = 20,
        threshold: float = 6.0,
        min_ratio: float = 1.3,
        early_steps: int = 4,
        early_ratio: float = 1.25,
        max_share: float = 0.6,
        noise_alpha: float = 0.05,
        noise_mult: float = 6.0,
        cooldown: int = 100,
        signal: str = "loss",
        lost_ratio: float = 2.0,
        lost_z: float = 3.0,
        lost_frac: float = 0.5,
        lost_min: float = 1.1,
    ) -> None:
        check_range("window", window, 5, None, integer=True)
        check_range("threshold", threshold, 0, None, lo_open=True)
        check_range("min_ratio", min_ratio, 1, None, lo_open=True)
        check_range("early_steps", early_steps, 2, None, integer=True)
        check_range("early_ratio", early_ratio, 1, None, lo_open=True)
        check_range("max_share", max_share, 0, 1, lo_open=True)
        check_range("noise_alpha", noise_alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("noise_mult", noise_mult, 0, None)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_range("lost_ratio", lost_ratio, 1, None, lo_open=True)
        check_range("lost_z", lost_z, 0, None)
        check_range("lost_frac", lost_frac, 0, 1, lo_open=True)
        check_range("lost_min", lost_min, 1, lost_ratio, lo_open=True)
        if early_steps >= window:
            raise ValueError(f"early_steps must be < window ({window}), got {early_steps}")
        self.window = window
        self.threshold = threshold
        self.min_ratio = min_ratio
        self.early_steps = early_steps
        self.early_ratio = early_ratio
        self.max_share = max_share
        self.noise_alpha = noise_alpha
        self.noise_mult = noise_mult
        self.cooldown = cooldown
        check_signal("signal", signal)
        self.signal = signal
        self.inputs = (Input(signal),)
        self.lost_ratio = lost_ratio
        self.lost_z = lost_z
        self.lost_frac = lost_frac
        self.lost_min = lost_min
        self._lfrac = float(lost_frac)
        self._lmin = math.log(lost_min)
        self._half_lmin = 0.5 * self._lmin
        self._wm1 = window - 1
        self._lost = math.log(lost_ratio)
        self._lz = lost_z / _NOISE_PER_SD
        self._half = window // 2
        self._la = 2.0 / (window + 1.0)
        self._lb = 1.0 - self._la
        self._a = float(noise_alpha)
        self._b = 1.0 - self._a
        self._min_rise = math.log(min_ratio)
        self._early_rise = math.log(early_ratio)
        self._reset()

    def _reset(self) -> None:
        self._buf: deque[float] = deque(maxlen=self.window)
        self._sbuf: deque[int] = deque(maxlen=self.window)
        self._noise = 0.0
        self._nd = 0
        self._level = 0.0
        self._best = 0.0
        self._start = math.inf  # the level once the first window is in (inf: not yet)
        self._low = math.inf  # the lowest level since then
        self._climb = -1
        self._reported = False
        self._cooldown_until = -(2**62)
        self._last_step = -1

    # the decision, shared by both paths -----------------------------------------------
    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._buf = deque(self._buf, maxlen=self.window)
        self._sbuf = deque(self._sbuf, maxlen=self.window)

    def _early_ok(self, win: Sequence[float], gate: float) -> bool:
        m = self.early_steps
        tail = list(win)[-m - 1:]
        total = tail[-1] - tail[0]
        biggest = max(tail[k + 1] - tail[k] for k in range(m))
        rest = total - biggest
        return biggest <= self.max_share * total or (rest >= self._early_rise and rest >= gate)

    def _trend_ok(self, win: Sequence[float]) -> tuple[bool, float, float]:
        slope, t = window_trend(win)
        return (t >= self.threshold and slope * (len(win) - 1) >= self._min_rise), slope, t

    def _step(self, x: float, step: int) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        y = math.log(x)
        buf = self._buf
        noise_prev = self._noise
        nb = len(buf)
        if nb:
            level = self._la * y + self._lb * self._level
        else:
            level = self._best = y
        self._level = level
        best = self._best
        if level < self._low:
            self._low = level
        # lost >= log(lost_min): below half of that above best the level is not climbing
        lost = self._lost_need() if level > best + self._half_lmin else self._lost
        climbing = level > best + 0.5 * lost
        if climbing:
            if self._climb < 0:
                self._climb = step
        else:
            if level < best:
                best = self._best = level
            if self._climb >= 0:
                self._climb = -1
                self._reported = False
        if nb >= 2:
            b1 = buf[-1]
            ad = abs((y - b1) - (b1 - buf[-2]))
            self._noise = self._a * ad + self._b * noise_prev if self._nd else ad
            self._nd += 1
        if nb == self._wm1:  # the first window is in: the run's starting level
            self._start = self._low = level
        buf.append(y)  # bounded deques: the oldest value drops out
        self._sbuf.append(step)
        if step <= self._cooldown_until:
            return None
        m = self.early_steps
        nb = len(buf)
        if nb > m:
            total = y - buf[-m - 1]
            if total >= self._early_rise and total >= self.noise_mult * noise_prev:
                gate = self.noise_mult * noise_prev
                if all(buf[-k] > buf[-k - 1] for k in range(1, m + 1)) and self._early_ok(buf, gate):
                    return self._event(step, self._sbuf[-m - 1], total, m, None)
        rise = y - buf[0]
        if rise >= self._min_rise and rise >= noise_prev and nb >= self._half:
            ok, slope, t = self._trend_ok(buf)
            if ok:
                lo = min(range(nb), key=buf.__getitem__)
                return self._event(step, self._sbuf[lo], y - buf[lo], nb - 1 - lo, (slope, t))
        if climbing and level - best >= lost and nb == self.window and not self._reported:
            if self._lost_ok(buf, best, lost):
                onset = self._climb if self._climb >= 0 else step
                return self._event(step, onset, statistics.median(buf) - best, step - onset, "lost")
        return None

    def _lost_need(self) -> float:
        """The rise above ``best`` that counts as lost progress (before the noise term)."""
        prog = self._start - self._low  # not finite before the first window: lost_ratio
        if not prog >= self._lmin:  # no progress worth the name: judged by lost_ratio
            return self._lost
        need = self._lfrac * prog
        return self._lmin if need < self._lmin else (need if need < self._lost else self._lost)

    def _lost_ok(self, win: Sequence[float], best: float, lost: float) -> bool:
        rise = statistics.median(win) - best
        if rise < lost:
            return False
        v = list(win)
        sd = statistics.fmean([abs(v[k] - 2.0 * v[k - 1] + v[k - 2]) for k in range(2, len(v))])
        return rise >= self._lz * sd

    def _event(self, step: int, onset: int, rise: float, span: int,
               trend: tuple[float, float] | str | None) -> Event:
        self._cooldown_until = step + self.cooldown
        self._reported = True  # the lost-progress rule reports a climb once
        if self._climb < 0:
            self._climb = step
        factor = math.exp(rise)
        if isinstance(trend, str):  # "lost"
            msg = (f"{self.signal} lost its progress: the median of its last {self.window} values is {factor:.3g}x "
                   f"its best level, climbing since step {onset}")
            value, thr = rise, self._lost_need()
        elif trend is None:
            msg = (f"{self.signal} rose {span} times in a row, {factor:.3g}x since step {onset}: "
                   f"geometric growth")
            value, thr = rise, max(self._early_rise, 0.0)
        else:
            slope, t = trend
            msg = (f"{self.signal} trend turned upward at step {onset}: {factor:.3g}x over {span} steps "
                   f"({100 * math.expm1(slope):.2g}% per step, t={t:.1f})")
            value, thr = t, self.threshold
        return make_event(Kind.DIVERGENCE, "critical", step, onset, type(self).__name__, self.signal,
                          value, thr, msg)

    # vectorised advance ------------------------------------------------------------------
    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        w = self.window
        if len(self._buf) < w or self._nd == 0:
            return 0
        x = arrays[0][i:j]
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log(x)
        lim = first_true(~np.isfinite(y))
        if lim == 0:
            return 0
        y = y[:lim]
        ext = np.concatenate((np.asarray(self._buf), y))
        p = np.arange(w, w + lim)
        dext = np.diff(ext)  # dext[q] = ext[q+1] - ext[q]
        ad = np.abs(dext[w - 1:] - dext[w - 2:-1])
        noise = ewma(ad, self._a, self._b, self._noise)
        noise_prev = shifted(noise, self._noise)
        gate = self.noise_mult * noise_prev
        st = steps[i:i + lim]
        live = st > self._cooldown_until
        m = self.early_steps
        rising = np.ones(lim, dtype=bool)
        for k in range(1, m + 1):
            rising &= dext[p - k] > 0
        total = ext[p] - ext[p - m]
        cand_e = live & rising & (total >= self._early_rise) & (total >= gate)
        span = ext[p] - ext[p - w + 1]
        cand_w = live & (span >= self._min_rise) & (span >= noise_prev)
        level = ewma(y, self._la, self._lb, self._level)
        best = np.minimum.accumulate(np.minimum(level, self._best))
        low = np.minimum.accumulate(np.minimum(level, self._low))
        prog = self._start - low
        lost = np.where(prog < self._lmin, self._lost, np.clip(self._lfrac * prog, self._lmin, self._lost))
        calm_mask = level <= best + 0.5 * lost
        cand_l = live & ~calm_mask & (level - best >= lost)
        if self._reported:
            cand_l &= np.cumsum(calm_mask) > 0
        k = lim
        for c in np.flatnonzero(cand_e | cand_w | cand_l):
            win = ext[c + 1:c + w + 1].tolist()
            if ((cand_e[c] and self._early_ok(win, float(gate[c]))) or (cand_w[c] and self._trend_ok(win)[0])
                    or (cand_l[c] and self._lost_ok(win, float(best[c]), float(lost[c])))):
                k = int(c)
                break
        if k:
            self._buf = deque(ext[k:k + w].tolist(), maxlen=w)
            prev = np.asarray(self._sbuf, dtype=np.int64)
            self._sbuf = deque(np.concatenate((prev, st[:k]))[k:k + w].tolist(), maxlen=w)
            self._noise = float(noise[k - 1])
            self._nd += k
            self._last_step = int(st[k - 1])
            self._level = float(level[k - 1])
            self._best = float(best[k - 1])
            self._low = float(low[k - 1])
            calm = np.flatnonzero(calm_mask[:k])
            if len(calm):
                self._reported = False
            if len(calm) and calm[-1] == k - 1:
                self._climb = -1
            elif len(calm):
                self._climb = int(st[calm[-1] + 1])
            elif self._climb < 0:
                self._climb = int(st[0])
        return k
