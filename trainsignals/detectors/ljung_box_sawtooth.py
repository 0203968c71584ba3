"""LjungBoxSawtooth: the loss swings far beyond its usual noise, in a pattern, with no net progress."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from . import _swings as sw
from ._base import Detector, Input, Knob
from ._factors import exp_or_inf
from ._learning import LEVEL_KEYS, LearningOnset
from ._ops import column_log, first_unusable, first_usable, log, quiet_after

_NAN = math.nan
_VA, _VB, _BA, _BB = sw.VAR_ALPHA, 1.0 - sw.VAR_ALPHA, sw.BASE_ALPHA, 1.0 - sw.BASE_ALPHA  # swing()'s weights
#: largest fall of the median log-loss since the reference window, in 10-90 % ranges of the
#: window's residuals, that is no progress: the former ``Oscillation`` default (its ``drop``)
DROP = 1.0


class LjungBoxSawtooth(LearningOnset, Detector):
    """Flags a sawtooth: wide, patterned swings of the loss (and grad norm) with no net progress.

    Inputs: the loss and, optionally, the grad norm, in log space. When the local swing of either
    (EWMA of ``|y[t] - y[t-1]|``) exceeds ``ratio`` times its slow baseline, the last ``window``
    values are examined around their least-squares line: a sawtooth when

    * at least ``frac`` of the log-loss residuals exceed ``spread`` times the usual residual noise (1.4826 x
    median absolute residual of the window ``3 * window`` values earlier), taken ``exp(d)`` times larger where
    the median log-loss fell by ``d`` since (a falling minibatch loss keeps its noise in loss units); a known
    grad norm's residuals must swing too, measured the same way: ``frac`` of one and ``frac / 2`` of the
    other; * no net progress: the line moves by at most ``EFFICIENCY`` times the residuals' 10-90 % range, and
    the median lies at most ``DROP`` such ranges below the reference window's; * a pattern: the Ljung-Box
    statistic of the residuals over lags 1..``window // 3`` (plus the grad norm's) exceeds the chi-square
    quantile at ``1 - pattern_p`` (degrees of freedom: the lags, twice with a grad norm). White noise, however
    loud, rarely passes (about 1 % at 32 values); a sawtooth correlates at its period. ``onset_step``: the
    window's first step; no event in the first ``warmup`` values, nor for ``cooldown`` steps after one (and
    until its window passed: ``_ops.quiet_after``), nor while the reference window predates the learning.
    **Rate**: ``sawtooth`` 0 alarms in 304,819 tuning healthy steps at its defaults (``calibration.json``;
    budget 0.5 per 10,000).
    **Held out**: ``sawtooth`` 4 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        window: values in the examined window, >= 8.
        ratio: local-to-baseline swing ratio that opens the window to examination, > 1.
        frac: fraction of residuals beyond ``spread`` usual deviations, in (0, 1].
        spread: usual deviations that make a residual count, > 0.
        pattern_p: false-alarm probability of the pattern test on white noise, in (0, 1).
        warmup: values before any event, >= 4 * window.
        cooldown: steps after an event without a new one, >= 0.
        signal: the loss signal read (and named in events).

    Example:
        A loss that converges, then alternates by +-40 % from step 150:

        >>> import numpy as np
        >>> rng = np.random.default_rng(2)
        >>> t = np.arange(300)
        >>> loss = np.exp(-np.minimum(t, 150) / 100) * np.exp(rng.normal(0, 0.02, 300))
        >>> loss[150:] *= np.where(t[150:] % 2 == 0, 1.4, 1 / 1.4)
        >>> [(e.step, e.onset_step) for e in LjungBoxSawtooth().scan(loss=loss)]
        [(180, 149)]
    """

    knob = Knob("pattern_p", 1e-9, 0.05, quieter="lower")
    _state_keys = ("n", "ml", "vl", "bl", "ng", "mg", "vg", "bg", "ys", "gs", "ss", "quiet_until", "last_step",
                   *LEVEL_KEYS)

    def __init__(self, window: int = 32, ratio: float = 2.0, frac: float = 0.4, spread: float = 2.0,
                 pattern_p: float = 1e-3, warmup: int = 128, cooldown: int = 100, signal: str = "loss") -> None:
        check_range("window", window, 8, None, integer=True)
        check_range("ratio", ratio, 1, None, lo_open=True)
        check_range("frac", frac, 0, 1, lo_open=True)
        check_range("spread", spread, 0, None, lo_open=True)
        check_range("pattern_p", pattern_p, 0, 1, lo_open=True, hi_open=True)
        check_range("warmup", warmup, sw.SPAN * window, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_signal("signal", signal)
        self.window, self.ratio, self.frac, self.spread = window, ratio, frac, spread
        self.pattern_p, self.warmup, self.cooldown, self.signal = pattern_p, warmup, cooldown, signal
        self.inputs, self.logs = (Input(signal), Input("grad_norm", required=False)), (signal, "grad_norm")
        self._reset()

    def _reset(self) -> None:
        self._n, self._ng, self._quiet_until, self._last_step = 0, 0, -1, -1  # counts; no event yet
        self._ml = self._vl = self._bl = self._mg = self._vg = self._bg = 0.0
        self._ys: deque[float] = deque(maxlen=sw.SPAN * self.window)
        self._gs: deque[float] = deque(maxlen=sw.SPAN * self.window)  # nan: no grad norm at that value
        self._ss: deque[int] = deque(maxlen=self.window)
        self._learn_reset(own_level=True)

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._ys, self._gs = sw.kept(state["ys"], sw.SPAN * self.window), sw.kept(state["gs"], sw.SPAN * self.window)
        self._ss = deque(state["ss"], maxlen=self.window)

    def _get_state(self) -> dict[str, Any]:
        return {**super()._get_state(), "gs": sw.plain(self._gs)}

    def _confirm(self, ys: Sequence[float], gs: Sequence[float]) -> tuple[bool, float, float]:
        """Whether the last ``window`` of ``ys`` (and ``gs``) is a sawtooth; the fractions out."""
        w, half = self.window, 0.5 * self.frac
        cur, ref = ys[-w:], ys[:w]
        res, rise = sw.residuals(cur)
        far = self.spread * sw.scale(sw.residuals(ref)[0])
        fl = sum(abs(r) > far for r in res) / len(res) if res else 0.0
        fall = sw.median(ref) - sw.median(cur) if fl >= half else 0.0  # > 0: the loss fell since the reference
        if fall > 0.0:  # its usual noise, carried to the current level (so fl only falls)
            far *= exp_or_inf(fall)
            fl = sum(abs(r) > far for r in res) / len(res)
        if fl < half:  # necessary below: most candidates stop here
            return False, fl, 0.0
        gref, gres, fg = sw.residuals(gs[:w])[0], [], 0.0
        if gref:  # with a grad norm, both must swing (it spikes and collapses too)
            gres, gfar = sw.residuals(gs[-w:])[0], self.spread * sw.scale(gref)
            fg = sum(abs(r) > gfar for r in gres) / len(gres) if gres else 0.0
            ok = (fl >= self.frac and fg >= half) or fg >= self.frac
        else:
            ok = fl >= self.frac
        sp = sw.spread(res)
        if not ok or abs(rise) > sw.EFFICIENCY * sp or fall > DROP * sp:
            return False, fl, fg
        q = sw.ljung_box(res, w // 3) + (sw.ljung_box(gres, w // 3) if gref else 0.0)
        return q >= sw.chi2_crit(self.pattern_p, (2 if gref else 1) * (w // 3)), fl, fg

    def _step(self, x: float, grad: float, step: int, log_x: float | None = None,
              log_g: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:  # not a loss: the statistics stay untouched
            return None
        n, bl, bg, g, y = self._n, self._bl, self._bg, _NAN, log(x) if log_x is None else log_x
        # sw.swing(), its warm case written out: the hot path
        self._ml, self._vl, self._bl = (y, v := _VA * abs(y - self._ml) + _VB * self._vl, _BA * v + _BB * bl) \
            if n >= self.warmup else sw.swing(y, self._ml, self._vl, bl, n, self.warmup)
        if grad - grad == 0.0 and grad > 0.0:
            g, ng = log(grad) if log_g is None else log_g, self._ng
            self._mg, self._vg, self._bg = (g, v := _VA * abs(g - self._mg) + _VB * self._vg, _BA * v + _BB * bg) \
                if ng >= self.warmup else sw.swing(g, self._mg, self._vg, bg, ng, self.warmup)
            self._ng = ng + 1
        vl, vg, self._n = self._vl, self._vg, n + 1
        if self._learning < 0:
            self._learn(y, n)
        self._ys.append(self._ml)
        self._gs.append(g)
        self._ss.append(step)
        if (n < self.warmup or step <= self._quiet_until or not (vl > self.ratio * bl or (bg > 0.0 and vg > self.ratio * bg))
                or not self._learned(self._n - len(self._ys))):  # the reference window, from the onset of learning on
            return None
        ok, fl, fg = self._confirm(list(self._ys), list(self._gs))
        if not ok:
            return None
        self._quiet_until = quiet_after(step, self.cooldown, self._ss[0])  # cooldown steps, the window passed
        msg = (f"{self.signal} swings widely with no net progress: {100 * fl:.0f}% of the last {self.window} values"
               f" lie beyond {self.spread:g} usual deviations{f', and {100 * fg:.0f}% of the grad norms' * (fg > 0)}: sawtooth")
        return make_event(Kind.OSCILLATION, "warning", step, self._ss[0], type(self).__name__, self.signal, fl,
                          self.frac, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if not self._n or steps[i] <= self._quiet_until:
            return 0
        grads = first_usable if self._ng == 0 else first_unusable  # a usable loss; grad norms all present or absent
        if not (lim := min(first_unusable(arrays[0], i, j, True), grads(arrays[1], i, j, True))):
            return 0
        y, g, w, r = column_log(arrays[0], i, i + lim), column_log(arrays[1], i, i + lim), self.window, self.ratio
        vl, bl, blp = sw.batch_swing(y, self._ml, self._vl, self._bl, self._n, self.warmup, (arrays[0], i))
        cand = vl > r * blp
        if self._ng:
            vg, bg, bgp = sw.batch_swing(g, self._mg, self._vg, self._bg, self._ng, self.warmup, (arrays[1], i))
            cand |= (bgp > 0.0) & (vg > r * bgp)
        at = self._onset_ahead(arrays[0], i, lim, self._n)  # no candidate before warm-up ends, nor while the
        cand[:lim if at < 0 else max(0, self.warmup - self._n, at + sw.SPAN * w - self._n - 1)] = False  # reference predates learning
        k, cs, off = lim, np.flatnonzero(cand), len(self._ys)
        if len(cs):  # a looser vectorised twin of the first tests, then the scalar one on survivors
            yext = np.concatenate((np.asarray(self._ys), y))
            gext = np.concatenate((np.asarray(self._gs, dtype=np.float64), g))
            ends = sw.sawtooth_survivors(yext, gext, off + cs + 1, w, self.spread, self.frac, self.pattern_p,
                                         bool(self._ng)).tolist()  # the first survivor the scalar test confirms
            k = next((e - off - 1 for e in ends if self._confirm(yext[e - sw.SPAN * w:e].tolist(),
                                                                   gext[e - sw.SPAN * w:e].tolist())[0]), lim)
        if k:
            self._learn_keep(k, self._n)
            self._ml, self._vl, self._bl = float(y[k - 1]), float(vl[k - 1]), float(bl[k - 1])
            if self._ng:
                self._mg, self._vg, self._bg = float(g[k - 1]), float(vg[k - 1]), float(bg[k - 1])
                self._ng += k
            self._ys.extend(y[max(0, k - sw.SPAN * w):k].tolist())
            self._gs.extend(g[max(0, k - sw.SPAN * w):k].tolist())
            self._ss.extend(steps[i + max(0, k - w):i + k].tolist())
            self._n, self._last_step = self._n + k, int(steps[i + k - 1])
        return k


__all__ = ["LjungBoxSawtooth"]
