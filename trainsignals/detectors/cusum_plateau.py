"""CUSUMPlateau: the loss stopped improving while it was still making progress."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import PairDetector
from ._ops import ewma, first_true, shifted


class CUSUMPlateau(PairDetector):
    """Flags a stall: no new best loss for ``patience`` values while the run has stopped moving.

    On ``y = log(loss)`` the detector keeps a smoothed level ``s`` (EWMA, weight ``alpha``),
    its running best ``b`` (the cumulative-minimum form of a one-sided CUSUM of improvements,
    taken over ``max(s[t-hold+1..t])`` so that a new best must hold for ``hold`` values: a
    heavy-tailed dip of the loss does not count as progress) and a noise scale ``noise`` (EWMA, weight ``noise_alpha``, of ``|y - s|``).
    With ``delta = max(min_delta, delta_mult * noise * sqrt(alpha / (2 - alpha)))`` (the noise
    of ``s``), the loss is on a *plateau* when the best improved by less than ``delta`` over
    the last ``patience`` values. The detector fires on a plateau when

    * the run is **stuck**: its grad norm (optional second input; ``nan`` when unknown) fell
      at least ``stuck_decades`` decades (fast EWMA of ``log10(grad_norm)``, weight ``alpha``,
      now vs ``2 * patience`` values ago, before the plateau began) — tiny updates. If it
      fell ``collapse_decades`` or more, a window bringing less than ``slowdown`` of the
      previous window's progress counts as a plateau too (the loss may still creep down);
    * or, when no grad norm is known, progress stopped **abruptly**: the best improved by at
      least ``progress_mult * delta`` over the ``patience`` values before the plateau;
    * or the loss never improved by ``delta`` since the first value, after ``3 * patience``
      values (stuck from the start; a slow start after warm-up is given that long).

    **Converged vs stuck.** A converged run sits on a plateau too, but it still moves: its
    grad norm stays in its band (minibatch noise keeps it up). A stuck run's gradients and
    updates collapse (learning rate far too small, dead units, a flat region). Without a grad
    norm, a converging run is told by its smooth slow-down: by the time a whole patience
    window brings less than ``delta``, the window before brought little too. Use
    ``patience ~ 10 %`` of the planned steps (the Monitor does this from ``total_steps``).

    ``onset_step`` is the first value of the plateau (the first step whose best is within
    ``delta`` of the current best). After an event the detector stays quiet until the best
    improves by ``delta`` again. Non-positive and non-finite values are skipped.

    Args:
        patience: values without improvement before a stall, >= 2.
        stuck_decades: fall of the grad norm over the window that counts as stuck, > 0.
        slowdown: with a collapsed grad norm, a window that brings less than this fraction of
            the previous window's progress is a plateau too, in [0, 1) (0: off).
        collapse_decades: grad-norm fall that counts as collapsed, >= stuck_decades.
        hold: a new best must hold for this many values (running min of the rolling max of
            the smoothed level), so a heavy-tailed dip does not reset the plateau, >= 1.
        alpha: smoothing weight of the level, in (0, 1).
        noise_alpha: weight of the noise scale, in (0, 1).
        delta_mult: smallest improvement, in noise scales of the smoothed level, >= 0.
        progress_mult: progress (in ``delta``) the previous window must show (loss only), >= 1.
        min_delta: smallest improvement in log space whatever the noise, > 0.
        signal: the signal name used in events.

    Example:
        A loss that falls, then freezes at step 300:

        >>> import numpy as np
        >>> rng = np.random.default_rng(1)
        >>> t = np.minimum(np.arange(600), 300)
        >>> loss = 3.0 * np.exp(-t / 150) * np.exp(rng.normal(0, 0.02, 600))
        >>> [(e.step, e.onset_step) for e in CUSUMPlateau(patience=60).scan(loss, np.full(600, np.nan))]
        [(385, 325)]
    """

    signals = ("loss", "grad_norm")
    _state_keys = ("n", "s", "recent", "noise", "best", "first", "hist", "shist", "g", "ghist", "armed",
                   "alarm_best", "last_step")

    def __init__(
        self,
        patience: int = 200,
        stuck_decades: float = 0.5,
        slowdown: float = 0.25,
        collapse_decades: float = 1.5,
        hold: int = 10,
        alpha: float = 0.1,
        noise_alpha: float = 0.02,
        delta_mult: float = 2.0,
        progress_mult: float = 10.0,
        min_delta: float = 1e-4,
        signal: str = "loss",
    ) -> None:
        check_range("patience", patience, 2, None, integer=True)
        check_range("stuck_decades", stuck_decades, 0, None, lo_open=True)
        check_range("slowdown", slowdown, 0, 1, hi_open=True)
        check_range("hold", hold, 1, None, integer=True)
        check_range("collapse_decades", collapse_decades, stuck_decades, None)
        check_range("alpha", alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("noise_alpha", noise_alpha, 0, 1, lo_open=True, hi_open=True)
        check_range("delta_mult", delta_mult, 0, None)
        check_range("progress_mult", progress_mult, 1, None)
        check_range("min_delta", min_delta, 0, None, lo_open=True)
        self.patience = patience
        self.stuck_decades = stuck_decades
        self.slowdown = slowdown
        self.hold = hold
        self.collapse_decades = collapse_decades
        self.alpha = alpha
        self.noise_alpha = noise_alpha
        self.delta_mult = delta_mult
        self.progress_mult = progress_mult
        self.min_delta = min_delta
        self.signal = signal
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._na, self._nb = float(noise_alpha), 1.0 - float(noise_alpha)
        self._dscale = delta_mult * math.sqrt(alpha / (2.0 - alpha))
        self._stuck = stuck_decades
        # the plateau bookkeeping runs every `_stride` values (about 64 checkpoints per window)
        self._stride = max(1, patience // 64)
        self._q = patience // self._stride
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._s = 0.0
        self._recent: deque[float] = deque(maxlen=self.hold)
        self._noise = 0.0
        self._best = 0.0
        self._first = 0.0
        m = 2 * self._q + 1
        self._hist: deque[float] = deque(maxlen=m)
        self._shist: deque[int] = deque(maxlen=m)
        self._g: float | None = None
        self._ghist: deque[float | None] = deque(maxlen=m)
        self._armed = True
        self._alarm_best = 0.0
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        m = 2 * self._q + 1
        self._hist = deque(state["hist"], maxlen=m)
        self._shist = deque(state["shist"], maxlen=m)
        self._ghist = deque(state["ghist"], maxlen=m)
        self._recent = deque(state["recent"], maxlen=self.hold)

    def _delta(self, noise: float) -> float:
        return max(self.min_delta, self._dscale * noise)

    def _decide(self, best: float, mid: float, old: float, delta: float, g: float | None,
                g_then: float | None) -> bool:
        gain = mid - best
        if gain < delta and self._first - best < delta and self._n >= 3 * self.patience:
            return True
        if g is not None:
            if g_then is None:
                return False
            fell = g_then - g
            return (fell >= self._stuck and gain < delta) or (
                fell >= self.collapse_decades and gain < self.slowdown * (old - mid))
        return gain < delta and old - mid >= self.progress_mult * delta

    def _step(self, x: float, grad: float, step: int) -> Event | None:  # type: ignore[override]
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        y = math.log(x)
        if grad - grad == 0.0 and grad > 0.0:
            g = self._g
            lg = math.log10(grad)
            self._g = lg if g is None else self._a * lg + self._b * g
        n = self._n
        if n == 0:
            self._s = y
            self._best = y
            self._first = y
            self._recent.append(y)
        else:
            s0 = self._s
            r = abs(y - s0)
            self._noise = r if n == 1 else self._na * r + self._nb * self._noise
            s = self._a * y + self._b * s0
            self._s = s
            self._recent.append(s)
        n += 1
        self._n = n
        if n % self._stride:
            return None
        top = max(self._recent)
        if top < self._best:
            self._best = top
        hist = self._hist
        hist.append(self._best)
        self._shist.append(step)
        self._ghist.append(self._g)
        best = self._best
        delta = self._dscale * self._noise
        if delta < self.min_delta:
            delta = self.min_delta
        if not self._armed:
            if best < self._alarm_best - delta:
                self._armed = True
            return None
        q = self._q
        if len(hist) < 2 * q + 1:
            return None
        mid = hist[-q - 1]
        if mid - best >= delta and (self._g is None or self._ghist[0] is None
                                    or self._ghist[0] - self._g < self.collapse_decades):
            return None  # still improving and no collapse: the common case, decided early
        if self._decide(best, mid, hist[0], delta, self._g, self._ghist[0]):
            return self._event(step, best, mid, delta)
        return None

    def _event(self, step: int, best: float, mid: float, delta: float) -> Event:
        self._armed = False
        self._alarm_best = best
        onset = step
        for b, s in zip(reversed(self._hist), reversed(self._shist)):
            if b - best >= delta:
                break
            onset = s
        gain = math.expm1(mid - best) * 100
        why = "since the start" if self._first - best < delta else (
            f"while the grad norm fell {self._ghist[0] - self._g:.1f} decades"
            if self._g is not None and self._ghist[0] is not None else "after clear progress before")
        msg = (f"{self.signal} has not improved by more than {gain:.2g}% in {self.patience} steps "
               f"(best {math.exp(best):.4g}, plateau since step {onset}) {why}")
        return make_event(Kind.STALL, "warning", step, onset, type(self).__name__, self.signal,
                          mid - best, delta, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        q = self._q
        m = 2 * q + 1
        if self._n < 2 or len(self._recent) < self.hold:
            return 0
        x = arrays[0][i:j]
        gr = arrays[1][i:j]
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log(x)
            lg = np.log10(gr)
        lg_ok = np.isfinite(lg)
        # a grad norm appearing for the first time, or a missing one among present ones, is scalar work
        if self._g is None:
            bad = ~np.isfinite(y) | lg_ok
        else:
            bad = ~np.isfinite(y) | ~lg_ok
        lim = first_true(bad)
        if lim == 0:
            return 0
        y = y[:lim]
        s = ewma(y, self._a, self._b, self._s)
        sp = shifted(s, self._s)
        noise = ewma(np.abs(y - sp), self._na, self._nb, self._noise)
        # checkpoints: the values after which the count of finite values is a multiple of the stride
        r = self._stride
        bidx = np.arange(lim)
        if r > 1:
            bidx = bidx[(self._n + 1 + bidx) % r == 0]
        nb = len(bidx)
        sext = np.concatenate((np.asarray(self._recent), s))
        h = self.hold
        top = sext[bidx + h].copy()  # max of the last `hold` smoothed values at each checkpoint
        for d in range(1, h):
            np.maximum(top, sext[bidx + h - d], out=top)
        bb = np.minimum.accumulate(np.minimum(top, self._best)) if nb else top
        g = None
        k = lim
        if nb:
            hl = len(self._hist)
            ext = np.concatenate((np.asarray(self._hist), bb))
            pos = np.arange(hl, hl + nb)
            full = pos >= 2 * q  # the scalar path decides only once 2q+1 checkpoints are held
            last = len(ext) - 1
            i_old = np.clip(pos - 2 * q, 0, last)  # clipped where not `full` (masked out below)
            mid = ext[np.clip(pos - q, 0, last)]
            old = ext[i_old]
            delta = np.maximum(self.min_delta, self._dscale * noise[bidx])
            if self._g is not None:
                g = ewma(lg[:lim], self._a, self._b, self._g)
                prev = np.array([np.nan if v is None else v for v in self._ghist], dtype=np.float64)
                g_then = np.concatenate((prev, g[bidx]))[i_old]  # the level 2q checkpoints back
            if self._armed:
                gain = mid - bb
                fire = (gain < delta) & (self._first - bb < delta) & (self._n + 1 + bidx >= 3 * self.patience)
                if g is not None:
                    gb = g[bidx]
                    with np.errstate(invalid="ignore"):
                        fell = g_then - gb
                        fire |= ((fell >= self._stuck) & (gain < delta)) | (
                            (fell >= self.collapse_decades) & (gain < self.slowdown * (old - mid)))
                else:
                    fire |= (gain < delta) & (old - mid >= self.progress_mult * delta)
                fire &= full
            else:  # the only thing that can happen while disarmed: the best improves and re-arms
                fire = bb < self._alarm_best - delta
            f = first_true(fire)
            if f < nb:
                k = int(bidx[f])
        elif self._g is not None:
            g = ewma(lg[:lim], self._a, self._b, self._g)
        if k:
            if g is None and self._g is not None:
                g = ewma(lg[:k], self._a, self._b, self._g)
            self._s = float(s[k - 1])
            self._recent.extend(s[max(0, k - self.hold):k].tolist())
            self._noise = float(noise[k - 1])
            nu = int(np.searchsorted(bidx, k))  # checkpoints consumed
            if nu:
                self._best = float(bb[nu - 1])
            self._n += k
            used = bidx[:nu][-m:]
            self._hist.extend(bb[max(0, nu - m):nu].tolist())
            self._shist.extend(steps[i + used].tolist())
            if g is not None:
                self._g = float(g[k - 1])
                self._ghist.extend(g[used].tolist())
            else:
                self._ghist.extend([None] * len(used))
            self._last_step = int(steps[i + k - 1])
        return k
