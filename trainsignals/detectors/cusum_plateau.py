"""CUSUMPlateau: the loss stopped improving while it was still making progress."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input
from ._ops import ewma, first_true, shifted

_LN10 = math.log(10.0)
_log, _log10 = math.log, math.log10  # bound once: the scalar path calls them every value
_NAN = math.nan
_INF = math.inf
_TINY = 1e-30  # an update ratio of 0 (no update at all) counts as this


def _factor(d: float) -> str:
    """A log-space improvement as a percentage, or as a factor when large."""
    pct = math.expm1(d) * 100.0
    return f"{pct:.2g}%" if pct < 100.0 else f"{math.exp(d):.3g}x"


class CUSUMPlateau(Detector):
    """Flags a stall: no new best loss for ``patience`` values while the run has stopped moving.

    On ``y = log(loss)`` the detector keeps a smoothed level ``s`` (EWMA, weight ``alpha``),
    its running best ``b`` (the cumulative-minimum form of a one-sided CUSUM of improvements,
    taken over ``max(s[t-hold+1..t])`` so that a new best must hold for ``hold`` values: a
    heavy-tailed dip of the loss does not count as progress) and a noise scale ``noise``
    (EWMA, weight ``noise_alpha``, of ``|y - s|``). With
    ``delta = max(min_delta, delta_mult * noise * sqrt(alpha / (2 - alpha)))`` (the noise of
    ``s``), the loss is on a *plateau* when the best improved by less than ``delta`` over the
    last ``patience`` values. The best is taken every ``patience // 64`` values (at least 1),
    and the levels below are read at the same checkpoints: *then* is ``2 * patience`` values
    ago, *mid* ``patience`` values ago (where the plateau window begins). The detector fires
    on a plateau when the run is **stuck**:

    * its updates collapsed: the update ratio (optional third input; ``nan`` when not
      measured, any cadence) has a level (EWMA of ``log10(update_ratio)``, weight
      ``ratio_alpha`` per measured value; 0 counts as 1e-30) at *mid* and now at least
      ``ratio_decades`` decades below its level *then* — the weights had stopped moving
      when the plateau began and still do not move (a learning rate cut by orders of
      magnitude, dead units). A schedule's decay does not do that: a cosine or linear tail
      falls a fraction of a decade from *then* to *mid*, a step decay one decade, and a warm
      restart lifts the ratio back;
    * or its grad norm (optional second input) fell, net of the loss: the fall of a fast EWMA
      of ``log10(grad_norm)`` (weight ``alpha``) from *then* to now, minus the decades the
      best loss fell over the same span, is at least ``stuck_decades`` — tiny gradients on a
      loss that did not move (a classifier fitting its data shrinks loss and gradient together:
      that is progress, not a stall). If that net fall is ``collapse_decades`` or more, a
      window bringing less than ``slowdown`` of the previous window's progress counts as a
      plateau too (the loss may still creep down);
    * or, when no grad norm is known, progress stopped **abruptly**: the best improved by at
      least ``progress_mult * delta`` over the ``patience`` values before the plateau;
    * or the loss never improved by ``delta`` since the first value, after ``3 * patience``
      values (stuck from the start; a slow start after warm-up is given that long).

    **Converged vs stuck.** A converged run sits on a plateau too, but it still moves: its
    grad norm stays in its band (minibatch noise keeps it up) and so does its update ratio.
    A stuck run's updates collapse. When the weights freeze (learning rate cut by 1e-4) the
    loss goes flat while the grad norm stays where it was, exactly as on convergence: the loss
    and the grad norm cannot tell the two apart, the update ratio can. Without a grad norm, a
    converging run is told by its smooth slow-down: by the time a whole patience window brings
    less than ``delta``, the window before brought little too. Use ``patience ~ 10 %`` of the
    planned steps (the Monitor does this from ``total_steps``).

    ``onset_step`` is the first value of the plateau (the first step whose best is within
    ``delta`` of the current best). After an event the detector stays quiet until the best
    improves by ``delta`` again. Non-positive and non-finite losses are skipped (with their
    grad norm and update ratio). ``update`` and ``scan`` take the loss, then the grad norm and
    the update ratio where known.

    Args:
        patience: values without improvement before a stall, >= 2.
        stuck_decades: net fall of the grad norm over the window that counts as stuck, > 0.
        slowdown: with a collapsed grad norm, a window that brings less than this fraction of
            the previous window's progress is a plateau too, in [0, 1) (0: off).
        collapse_decades: net grad-norm fall that counts as collapsed, >= stuck_decades.
        hold: a new best must hold for this many values (running min of the rolling max of
            the smoothed level), so a heavy-tailed dip does not reset the plateau, >= 1.
        alpha: smoothing weight of the level, in (0, 1).
        noise_alpha: weight of the noise scale, in (0, 1).
        delta_mult: smallest improvement, in noise scales of the smoothed level, >= 0.
        progress_mult: progress (in ``delta``) the previous window must show (loss only), >= 1.
        min_delta: smallest improvement in log space whatever the noise, > 0.
        ratio_decades: fall of the update-ratio level that counts as stuck, > 0 (2: from the
            healthy band 1e-4..1e-3 to the stuck region below 1e-6).
        ratio_alpha: weight of each measured update ratio in its level, in (0, 1].
        signal: the signal name used in events.

    Example:
        A loss that falls, then freezes at step 300:

        >>> import numpy as np
        >>> rng = np.random.default_rng(1)
        >>> t = np.minimum(np.arange(600), 300)
        >>> loss = 3.0 * np.exp(-t / 150) * np.exp(rng.normal(0, 0.02, 600))
        >>> [(e.step, e.onset_step) for e in CUSUMPlateau(patience=60).scan(loss=loss)]
        [(385, 325)]

        The same loss with a grad norm that stays in its band says nothing: it could be a
        converged run. Its update ratio, 4 decades down since step 300, says stuck:

        >>> grad = np.exp(rng.normal(0, 0.1, 600))
        >>> ratio = np.where(np.arange(600) < 300, 1e-3, 1e-7) * np.exp(rng.normal(0, 0.1, 600))
        >>> CUSUMPlateau(patience=60).scan(loss=loss, grad_norm=grad)
        []
        >>> [(e.step, e.onset_step) for e in CUSUMPlateau(patience=60).scan(loss=loss, grad_norm=grad, update_ratio=ratio)]
        [(385, 325)]
    """

    _state_keys = ("n", "s", "recent", "noise", "best", "first", "hist", "shist", "g", "ghist", "r", "rl", "rhist",
                   "armed", "alarm_best", "last_step")

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
        ratio_decades: float = 2.0,
        ratio_alpha: float = 0.5,
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
        check_range("ratio_decades", ratio_decades, 0, None, lo_open=True)
        check_range("ratio_alpha", ratio_alpha, 0, 1, lo_open=True)
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
        self.ratio_decades = ratio_decades
        self.ratio_alpha = ratio_alpha
        check_signal("signal", signal)
        self.signal = signal
        self.inputs = (Input(signal), Input("grad_norm", required=False), Input("update_ratio", required=False))
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._na, self._nb = float(noise_alpha), 1.0 - float(noise_alpha)
        self._ra, self._rb = float(ratio_alpha), 1.0 - float(ratio_alpha)
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
        self._r = math.nan  # the latest update ratio not yet folded into the level (nan: none)
        self._rl: float | None = None
        # the level at each checkpoint of `hist`; empty until the first update ratio
        self._rhist: deque[float | None] = deque(maxlen=m)
        self._armed = True
        self._alarm_best = 0.0
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        m = 2 * self._q + 1
        self._hist = deque(state["hist"], maxlen=m)
        self._shist = deque(state["shist"], maxlen=m)
        self._ghist = deque(state["ghist"], maxlen=m)
        self._rhist = deque(state["rhist"], maxlen=m)
        self._recent = deque(state["recent"], maxlen=self.hold)
        self._r = float(state["r"]) if state["r"] is not None else math.nan

    def _get_state(self) -> dict[str, Any]:
        state = super()._get_state()
        if state["r"] != state["r"]:
            state["r"] = None  # JSON has no NaN
        return state

    # -- the rule -------------------------------------------------------------------------------
    def _delta(self, noise: float) -> float:
        return max(self.min_delta, self._dscale * noise)

    def _decide(self, best: float, mid: float, old: float, delta: float, g: float | None,
                g_then: float | None, r_then: float | None, r_mid: float | None, r: float | None) -> str | None:
        """Which rule calls the plateau a stall (``None``: none does)."""
        gain = mid - best
        if gain < delta and self._first - best < delta and self._n >= 3 * self.patience:
            return "start"
        if (gain < delta and r_then is not None and r_mid is not None and r is not None
                and r_then - r_mid >= self.ratio_decades and r_then - r >= self.ratio_decades
                and r_then - self._ratio_top() >= self.ratio_decades):
            return "ratio"
        if g is not None:
            if g_then is None:
                return None
            fell = g_then - g - (old - best) / _LN10  # net of what the loss fell: coupled is not stuck
            if fell >= self._stuck and gain < delta:
                return "grad"
            if fell >= self.collapse_decades and gain < self.slowdown * (old - mid):
                return "slowdown"
            return None
        if gain < delta and old - mid >= self.progress_mult * delta:
            return "abrupt"
        return None

    def _step(self, x: float, grad: float, ratio: float, step: int) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        y = _log(x)
        a = self._a
        if grad - grad == 0.0 and grad > 0.0:
            g = self._g
            lg = _log10(grad)
            self._g = lg if g is None else a * lg + self._b * g
        if ratio - ratio == 0.0:  # a non-finite ratio counts as not measured
            self._r = ratio
        n = self._n
        if n == 0:
            s = y
            self._s = y
            self._best = y
            self._first = y
            self._recent.append(y)
        else:
            s0 = self._s
            r = abs(y - s0)
            self._noise = r if n == 1 else self._na * r + self._nb * self._noise
            s = a * y + self._b * s0
            self._s = s
            self._recent.append(s)
        n += 1
        self._n = n
        if n % self._stride:
            return None
        best = self._best
        if s < best:  # else max(recent) >= s >= best: no new best, and no need for the max
            top = max(self._recent)
            if top < best:
                self._best = best = top
        hist = self._hist
        hist.append(best)
        self._shist.append(step)
        self._ghist.append(self._g)
        r = self._r
        if r == r:  # fold the latest update ratio since the last checkpoint into its level
            self._r = _NAN
            if 0.0 <= r < _INF:
                lr = _log10(r if r > _TINY else _TINY)
                rl = self._rl
                if rl is None:  # the first one: the history so far had no level
                    self._rl = lr
                    self._rhist.extend([None] * (len(hist) - 1))
                else:
                    self._rl = self._ra * lr + self._rb * rl
        if self._rl is not None:
            self._rhist.append(self._rl)
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
        rh = self._rhist
        why = self._decide(best, mid, hist[0], delta, self._g, self._ghist[0], rh[0] if rh else None,
                           rh[-q - 1] if rh else None, self._rl)
        if why is not None:
            return self._event(step, best, mid, delta, why)
        return None

    def _ratio_top(self) -> float:
        """The highest update-ratio level from *mid* (``patience`` values ago) to now."""
        rh = self._rhist
        top = -math.inf
        for v in islice(rh, len(rh) - self._q - 1, None):
            if v is None:  # no level yet (not the case once mid has one: levels never go back to None)
                return math.inf
            if v > top:
                top = v
        return top

    def _event(self, step: int, best: float, mid: float, delta: float, why: str) -> Event:
        self._armed = False
        self._alarm_best = best
        onset = step
        for b, s in zip(reversed(self._hist), reversed(self._shist)):
            if b - best >= delta:
                break
            onset = s
        gain = mid - best
        if why == "slowdown":
            before = self._hist[-self._q - 1] - self._hist[0]
            what = (f"{self.signal} improved only {_factor(gain)} in the last {self.patience} steps after "
                    f"{_factor(before)} in the {self.patience} before (best {math.exp(best):.4g}, since step {onset})")
        else:
            what = (f"{self.signal} has not improved by more than {_factor(gain)} in {self.patience} steps "
                    f"(best {math.exp(best):.4g}, plateau since step {onset})")
        if why == "start":
            because = "since the start"
        elif why == "ratio":
            r_then, r_mid, r_now = self._rhist[0], self._rhist[-self._q - 1], self._rl
            because = (f"after the update ratio fell {r_then - r_mid:.1f} decades (now {10 ** r_now:.2g}): "
                       "the weights barely move") if r_then is not None and r_mid is not None and r_now is not None else ""
        elif why in ("grad", "slowdown") and self._g is not None and self._ghist[0] is not None:
            because = (f"while the grad norm fell {self._ghist[0] - self._g:.1f} decades "
                       f"and the loss {(self._hist[0] - best) / _LN10:.1f}")
        else:
            because = "after clear progress before"
        return make_event(Kind.STALL, "warning", step, onset, type(self).__name__, self.signal,
                          gain, delta, f"{what} {because}")

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        q = self._q
        m = 2 * q + 1
        if self._n < 2 or len(self._recent) < self.hold:
            return 0
        x = arrays[0][i:j]
        gr = arrays[1][i:j]
        rr = arrays[2][i:j] if len(arrays) > 2 else None
        if rr is not None and not np.isfinite(rr[~np.isnan(rr)]).all():
            rr = np.where(np.isfinite(rr), rr, np.nan)  # a non-finite ratio counts as not measured
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log(x)
            lg = np.log10(gr)
        lg_ok = np.isfinite(lg)
        # a grad norm appearing for the first time, or a missing one among present ones, is scalar work
        if self._g is None:
            bad = ~np.isfinite(y) | lg_ok
        else:
            bad = ~np.isfinite(y) | ~lg_ok
        if self._rl is None and rr is not None:  # so is the first update ratio
            if self._r == self._r:
                return 0
            bad |= ~np.isnan(rr)
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
        rlev = self._ratio_levels(rr, bidx, lim)
        g = None
        k = lim
        if nb:
            hl = len(self._hist)
            ext = np.concatenate((np.asarray(self._hist), bb))
            pos = np.arange(hl, hl + nb)
            full = pos >= 2 * q  # the scalar path decides only once 2q+1 checkpoints are held
            last = len(ext) - 1
            i_old = np.clip(pos - 2 * q, 0, last)  # clipped where not `full` (masked out below)
            i_mid = np.clip(pos - q, 0, last)
            mid = ext[i_mid]
            old = ext[i_old]
            delta = np.maximum(self.min_delta, self._dscale * noise[bidx])
            if self._g is not None:
                g = ewma(lg[:lim], self._a, self._b, self._g)
                prev = np.array([np.nan if v is None else v for v in self._ghist], dtype=np.float64)
                g_then = np.concatenate((prev, g[bidx]))[i_old]  # the level 2q checkpoints back
            if self._armed:
                gain = mid - bb
                fire = (gain < delta) & (self._first - bb < delta) & (self._n + 1 + bidx >= 3 * self.patience)
                if self._rl is not None:  # the history of levels is as long as `hist`
                    rprev = np.array([np.nan if v is None else v for v in self._rhist], dtype=np.float64)
                    rext = np.concatenate((rprev, rlev))
                    with np.errstate(invalid="ignore"):
                        r_then = rext[i_old]
                        low = full & (gain < delta) & (r_then - rext[i_mid] >= self.ratio_decades) & (
                            r_then - rlev >= self.ratio_decades)
                        if low.any():  # then the highest level since mid must be that low too
                            top = sliding_window_view(rext, q + 1).max(axis=1)[np.clip(pos - q, 0, None)]
                            fire |= low & (r_then - top >= self.ratio_decades)
                if g is not None:
                    gb = g[bidx]
                    with np.errstate(invalid="ignore"):
                        fell = g_then - gb - (old - bb) / _LN10
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
            if self._rl is not None:
                self._rhist.extend(rlev[max(0, nu - m):nu].tolist())
                if nu:
                    self._rl = float(rlev[nu - 1])
            if rr is not None:
                seen = np.flatnonzero(~np.isnan(rr[:k]))
                cp = int(bidx[nu - 1]) if nu else -1  # the last checkpoint consumed
                if len(seen) and seen[-1] > cp:
                    self._r = float(rr[seen[-1]])  # a ratio not yet folded
                elif nu:
                    self._r = math.nan
            elif nu:
                self._r = math.nan
            self._last_step = int(steps[i + k - 1])
        return k

    def _ratio_levels(self, rr: np.ndarray | None, bidx: np.ndarray, lim: int) -> np.ndarray:
        """The update-ratio level after each checkpoint ``bidx`` (what the scalar checkpoint gives)."""
        nb = len(bidx)
        if self._rl is None:
            return np.full(nb, np.nan)  # no level yet, and no ratio in this stretch (see `bad`)
        if not nb:
            return np.empty(0)
        prevb = np.concatenate(([-1], bidx[:-1]))
        if rr is None:
            vals = np.full(nb, np.nan)
        else:
            r = rr[:lim]
            latest = np.maximum.accumulate(np.where(np.isnan(r), -1, np.arange(lim)))[bidx]
            vals = np.where(latest > prevb, r[np.maximum(latest, 0)], np.nan)  # fresh since the last checkpoint
        if self._r == self._r and not vals[0] == vals[0]:
            vals[0] = self._r  # the one pending from before this stretch
        with np.errstate(invalid="ignore"):
            fold = (vals >= 0.0) & (vals < np.inf)
        if not fold.any():
            return np.full(nb, self._rl)
        lv = ewma(np.log10(np.maximum(vals[fold], _TINY)), self._ra, self._rb, self._rl)
        cnt = np.cumsum(fold)
        return np.where(cnt > 0, lv[np.maximum(cnt - 1, 0)], self._rl)
