"""SlopeDivergence: the loss trend turns upward and keeps climbing."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector
from ._ops import ewma, first_true, shifted


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
    """Flags a sustained upward trend of ``log(loss)``: divergence, before the first NaN.

    Two rules, both on ``y = log(x)`` so they are scale-free:

    * **early climb** — the last ``early_steps`` step-to-step changes are all rises, their
      total is at least ``max(log(early_ratio), noise_mult * noise)``, and no single rise makes
      more than ``max_share`` of it (a lone spike is not a climb). ``noise`` is the EWMA
      (weight ``noise_alpha``) of the second difference ``|y[t] - 2y[t-1] + y[t-2]|``: the
      run's irregularity, which a steady geometric climb does not inflate. Catches geometric
      growth from the first steps, within ``early_steps + 1`` values.
    * **window trend** — over the last ``window`` values (from ``window // 2`` values on, at the
      start of a run) the least-squares slope has
      t-statistic ``>= threshold`` and the fitted rise ``slope*(window-1)`` is at least
      ``log(min_ratio)``; candidates are only examined when the newest value sits
      ``max(log(min_ratio), noise)`` above the oldest. Catches slow divergence
      through noise; a spike that recovers inflates the residuals and does not count.

    ``onset_step`` is where the climb began: the start of the rising run (early rule) or the
    lowest point of the window (window rule). After an event the detector is quiet for
    ``cooldown`` steps. Non-positive and non-finite values are skipped.

    Args:
        window: values in the trend window, >= 5.
        threshold: t-statistic of the slope that counts, > 0.
        min_ratio: smallest rise over the window, as a factor, > 1.
        early_steps: consecutive rises for the early rule, >= 2.
        early_ratio: smallest total rise of the early rule, as a factor, > 1.
        max_share: largest share of one rise in an early climb, in (0, 1].
        noise_alpha: EWMA weight of the noise scale, in (0, 1).
        noise_mult: how many noise scales a rise must exceed, >= 0.
        cooldown: steps without events after an event, >= 0.
        signal: the signal name used in events.

    Example:
        Gradient descent on (w - 3)**2 from w = 10 at lr 1.1:

        >>> det = SlopeDivergence()
        >>> w, losses = 10.0, []
        >>> for _ in range(10):
        ...     w -= 1.1 * 2 * (w - 3)
        ...     losses.append((w - 3) ** 2)
        >>> [(e.step, e.onset_step) for e in det.scan(losses)]
        [(4, 0)]
    """

    signals = ("x",)
    _state_keys = ("buf", "sbuf", "noise", "nd", "cooldown_until", "last_step")

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
        self.signal = signal
        self._a = float(noise_alpha)
        self._b = 1.0 - self._a
        self._min_rise = math.log(min_ratio)
        self._early_rise = math.log(early_ratio)
        self._reset()

    def _reset(self) -> None:
        self._buf: list[float] = []
        self._sbuf: list[int] = []
        self._noise = 0.0
        self._nd = 0
        self._cooldown_until = -(2**62)
        self._last_step = -1

    # the decision, shared by both paths -----------------------------------------------
    def _early_ok(self, win: Sequence[float]) -> bool:
        m = self.early_steps
        tail = win[-m - 1:]
        total = tail[-1] - tail[0]
        biggest = max(tail[k + 1] - tail[k] for k in range(m))
        return biggest <= self.max_share * total

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
        if len(buf) >= 2:
            ad = abs((y - buf[-1]) - (buf[-1] - buf[-2]))
            self._noise = ad if self._nd == 0 else self._a * ad + self._b * noise_prev
            self._nd += 1
        buf.append(y)
        self._sbuf.append(step)
        if len(buf) > self.window:
            del buf[0]
            del self._sbuf[0]
        if step <= self._cooldown_until:
            return None
        m = self.early_steps
        nb = len(buf)
        gate = self.noise_mult * noise_prev
        if nb > m:
            total = y - buf[-m - 1]
            if (total >= self._early_rise and total >= gate
                    and all(buf[-k] > buf[-k - 1] for k in range(1, m + 1))
                    and self._early_ok(buf)):
                return self._event(step, self._sbuf[-m - 1], total, m, None)
        if nb >= self.window // 2 and y - buf[0] >= self._min_rise and y - buf[0] >= noise_prev:
            ok, slope, t = self._trend_ok(buf)
            if ok:
                lo = min(range(nb), key=buf.__getitem__)
                return self._event(step, self._sbuf[lo], y - buf[lo], nb - 1 - lo, (slope, t))
        return None

    def _event(self, step: int, onset: int, rise: float, span: int, trend: tuple[float, float] | None) -> Event:
        self._cooldown_until = step + self.cooldown
        factor = math.exp(rise)
        if trend is None:
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
        k = lim
        for c in np.flatnonzero(cand_e | cand_w):
            win = ext[c + 1:c + w + 1].tolist()
            if (cand_e[c] and self._early_ok(win)) or (cand_w[c] and self._trend_ok(win)[0]):
                k = int(c)
                break
        if k:
            tail = ext[k:k + w]
            self._buf = tail.tolist()
            prev = np.asarray(self._sbuf, dtype=np.int64)
            self._sbuf = np.concatenate((prev, st[:k]))[k:k + w].tolist()
            self._noise = float(noise[k - 1])
            self._nd += k
            self._last_step = int(st[k - 1])
        return k
