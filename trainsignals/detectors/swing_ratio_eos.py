"""SwingRatioEdgeOfStability: the loss bounces on a wider band, and the grad norm moved with it."""

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
from ._factors import times
from ._ops import column_log, first_unusable, first_usable, log, quiet_after
from ._swings import SPAN, swing

_NAN, _VA, _VB, _BA, _BB = math.nan, sw.VAR_ALPHA, 1.0 - sw.VAR_ALPHA, sw.BASE_ALPHA, 1.0 - sw.BASE_ALPHA  # swing()'s


class SwingRatioEdgeOfStability(Detector):
    """Flags the edge of stability: the loss swings ``shift`` times as wide, no net progress, the grad norm moved.

    Minibatch swings past the edge of stability are loud but white (no pattern for :class:`LjungBoxSawtooth`):
    the loss jumps to a higher, noisier plateau, or its band widens, and stops progressing, while the grad norm
    swings wider or rises (a sharper region). With the last ``3 * window // 2`` log-losses (current window)
    against the first ``3 * window // 2`` of the last ``4 * window`` (reference), it fires on

    * no net progress: the current median not below the reference's, the current window's line moving by at most
      ``EFFICIENCY`` times its residuals' 10-90 % range;
    * a loss swinging ``shift`` times as wide in loss units: the ratio of the robust residual scales times ``exp``
      of the median's rise (a falling minibatch loss keeps its noise in loss units and this ratio near 1);
    * a grad norm (when known in both windows) whose residual scale or median moved ``grad_shift``x;
    * with a measured learning rate, a loss also ``shift`` times as wide as the band it had at that rate
      before the rate last rose, if it trained at it (:class:`~trainsignals.detectors._swings.RateBands`:
      a warm restart, a step decay); a rate new to the run (the edge of stability) has no such band.

    It is examined every ``STRIDE``-th value while *armed*: ``4 * window - 3 * window // 2`` values after the
    loss's local swing (EWMA of ``|y[t] - y[t-1]|``) tops ``shift_ratio`` times its baseline, and the grad
    norm's too when known. An event disarms it. ``onset_step``: the current window's first step; no event in the
    first ``warmup`` values, nor for ``cooldown`` steps after one or before that window passed (``_ops.quiet_after``).
    **Rate**: ``edge_of_stability`` 0 alarms in 304,819 tuning healthy steps, 15 in 879,581 held-out (budget 0.5 per 10,000).

    Args:
        window: the windows' unit, >= 8.
        shift: loss swing ratio that fires, > 1.
        grad_shift: ratio of the grad norm's swing or level that corroborates, > 0.
        shift_ratio: local-to-baseline swing ratio that arms the watch, > 1.
        warmup: values before any event, >= 4 * window.
        cooldown: steps after an event without a new one, >= 0.
        signal: the loss signal read (and named in events).

    Example:
        A loss that converges, then at step 400 jumps 4x and bounces, while the grad norm rises 2x:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(700)
        >>> loss = (2.3 * np.exp(-t / 120) + 0.3) * np.where(t >= 400, 4.0, 1.0) * np.exp(rng.normal(0, 0.1, 700))
        >>> grad = np.where(t >= 400, 2.0, 1.0) * np.exp(rng.normal(0, 0.1, 700))
        >>> [(e.step, e.onset_step) for e in SwingRatioEdgeOfStability().scan(loss=loss, grad_norm=grad)]
        [(448, 401)]
    """

    knob = Knob("shift", 1.2, 10.0)
    _state_keys = ("n", "ml", "vl", "bl", "ng", "mg", "vg", "bg", "ys", "gs", "ss", "left", "quiet_until",
                   "last_step", "rates")

    def __init__(self, window: int = 32, shift: float = 2.5, grad_shift: float = 1.5, shift_ratio: float = 1.5,
                 warmup: int = 128, cooldown: int = 100, signal: str = "loss") -> None:
        check_range("window", window, 8, None, integer=True)
        check_range("shift", shift, 1, None, lo_open=True)
        check_range("grad_shift", grad_shift, 0, None, lo_open=True)
        check_range("shift_ratio", shift_ratio, 1, None, lo_open=True)
        check_range("warmup", warmup, SPAN * window, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_signal("signal", signal)
        self.window, self.shift, self.grad_shift, self.shift_ratio = window, shift, grad_shift, shift_ratio
        self.warmup, self.cooldown, self.signal = warmup, cooldown, signal
        self.inputs, self.logs = (Input(signal), Input("grad_norm", False), Input("lr", False)), (signal, "grad_norm")
        self._w2 = 3 * window // 2  # the windows' length, and the rate blocks'
        self._reset()

    def _reset(self) -> None:
        self._n = self._ng = self._left = 0  # left: values left in the watch (0: not armed)
        self._ml = self._vl = self._bl = self._mg = self._vg = self._bg = 0.0
        self._ys: deque[float] = deque(maxlen=SPAN * self.window)
        self._gs: deque[float] = deque(maxlen=SPAN * self.window)  # nan: no grad norm at that value
        self._ss: deque[int] = deque(maxlen=3 * self.window // 2)
        self._quiet_until, self._last_step, self._rates = -1, -1, sw.RateBands()  # rates: its bands at each rate

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._ys, self._gs = sw.kept(state["ys"], SPAN * self.window), sw.kept(state["gs"], SPAN * self.window)
        self._ss = deque(state["ss"], maxlen=3 * self.window // 2)
        self._rates = sw.RateBands(state["rates"])

    def _get_state(self) -> dict[str, Any]:
        return {**super()._get_state(), "gs": sw.plain(self._gs), "rates": self._rates.state()}

    def _test(self, ys: Sequence[float], gs: Sequence[float]) -> tuple[float, float] | None:
        """``(loss swing ratio, grad norm's move)`` where the rule fires, else ``None``."""
        rl = sw.swing_ratio(ys, self._w2)
        rg = sw.grad_move(gs, self._w2) if rl >= self.shift else 0.0
        return (rl, rg) if rg >= self.grad_shift else None

    def _step(self, x: float, grad: float, lr: float, step: int, log_x: float | None = None,
              log_g: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:  # not a loss: the statistics stay untouched
            return None
        n, bl, bg, g, left, y = self._n, self._bl, self._bg, _NAN, self._left, log(x) if log_x is None else log_x
        # swing(), its warm case written out: the hot path
        self._ml, self._vl, self._bl = (y, v := _VA * abs(y - self._ml) + _VB * self._vl, _BA * v + _BB * bl) \
            if n >= self.warmup else swing(y, self._ml, self._vl, bl, n, self.warmup)
        if grad - grad == 0.0 and grad > 0.0:
            g, ng = log(grad) if log_g is None else log_g, self._ng
            self._mg, self._vg, self._bg = (g, v := _VA * abs(g - self._mg) + _VB * self._vg, _BA * v + _BB * bg) \
                if ng >= self.warmup else swing(g, self._mg, self._vg, bg, ng, self.warmup)
            self._ng = ng + 1
        vl, vg, self._n = self._vl, self._vg, n + 1
        self._ys.append(self._ml)
        self._gs.append(g)
        self._ss.append(step)
        if ((rt := self._rates).blo is None or lr != rt.lprev or not (n + 1) % self._w2) and (rt.lprev or lr - lr == 0.0):
            rt.take(lr, n, self._ys, self._w2)  # a rate known, and a new one, a block's first or last value
        if step <= self._quiet_until:
            return None
        if left:
            self._left = left - 1
        if n < self.warmup:
            return None
        r2 = self.shift_ratio
        if vl > r2 * bl or (bg > 0.0 and vg > r2 * bg):
            if vl > r2 * bl and (bg <= 0.0 or vg > r2 * bg):  # both swing at once: (re)arm
                self._left = SPAN * self.window - 3 * self.window // 2
            if not self._left or n % sw.STRIDE:
                return None
        elif not left or n % sw.STRIDE:  # examined every STRIDE-th value while armed
            return None
        if (got := self._test(self._ys, self._gs)) is None or not self._rates.wider(
                (ys := list(self._ys))[-self._w2:], n + 1 - SPAN * self.window, self.shift):
            return None
        (rl, rg), w2, self._left, self._quiet_until = got, self._w2, 0, quiet_after(step, self.cooldown, self._ss[0])
        d = sum(s * (math.log(sw.scale(sw.residuals(v)[0])) + sw.median(v)) for s, v in ((1, ys[-w2:]), (-1, ys[:w2])))
        msg = (f"{self.signal} swings {times(d)}x as wide ({self.signal} units) over the last {w2} values as over the "
               f"{w2} before the last {w2 + self.window}, with no net progress" + (f"; the grad norm moved {rg:.3g}x "
               "(its swing or its level)" if rg < math.inf else "") + ": step size at the edge of stability")
        return make_event(Kind.OSCILLATION, "warning", step, self._ss[0], type(self).__name__, self.signal, rl,
                          self.shift, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        grads, rt = first_usable if self._ng == 0 else first_unusable, self._rates  # grad norms all present or absent
        if not self._n or steps[i] <= self._quiet_until or not (lim := min(
                first_unusable(arrays[0], i, j, True), grads(arrays[1], i, j, True),  # a usable loss,
                j - i if rt.lprev else first_usable(arrays[2], i, j))):  # a rate known, or none given
            return 0
        y, g, w, r2 = column_log(arrays[0], i, i + lim), column_log(arrays[1], i, i + lim), self.window, self.shift_ratio
        vl, bl, blp = sw.batch_swing(y, self._ml, self._vl, self._bl, self._n, self.warmup, (arrays[0], i))
        ai = np.flatnonzero((vl > r2 * blp) & (np.arange(self._n, self._n + lim) >= self.warmup))  # warm, swings
        if self._ng:
            vg, bg, bgp = sw.batch_swing(g, self._mg, self._vg, self._bg, self._ng, self.warmup, (arrays[1], i))
            ai = ai[(bgp[ai] <= 0.0) | (vg[ai] > r2 * bgp[ai])]  # and so does the grad norm
        n0, w2, span = self._n, self._w2, SPAN * w
        watch, until0, arms = span - w2, n0 + self._left - 1, (n0 + ai).tolist()
        es = sw.watch_checks(n0, until0, arms, watch, n0 + lim - 1)
        k, off = lim, len(self._ys)
        if len(es):  # a looser vectorised twin of the test, then the scalar test on survivors
            yext = np.concatenate((np.asarray(self._ys), y))
            gext = np.concatenate((np.asarray(self._gs, dtype=np.float64), g))
            es = es[sw.batch_swing_ratio(yext, off + es, w2, span) >= self.shift * sw.SLACK]
            if self._ng and len(es):
                gv = np.lib.stride_tricks.sliding_window_view(gext, w2)
                gc, gr = gv[off + es + 1 - w2], gv[off + es + 1 - span]
                with np.errstate(over="ignore", invalid="ignore"):
                    moved = np.maximum(sw.batch_scale(gc) / sw.batch_scale(gr),
                                       np.exp(np.median(gc, axis=1) - np.median(gr, axis=1)))
                es = es[(moved >= self.grad_shift * sw.SLACK) | ~np.isfinite(gc).all(axis=1)  # a window with a gap:
                        | ~np.isfinite(gr).all(axis=1)]  # left to the scalar test (it drops the gaps)
            ends = (off + es + 1).tolist()  # the first survivor the scalar test fires on (the rates' too: scalar)
            k = next((e - off - 1 for e in ends
                      if self._test(yext[e - span:e].tolist(), gext[e - span:e].tolist()) is not None), lim)
        if k:
            if rt.lprev:
                rt.take_many(arrays[2][i:i + k], n0, np.concatenate((np.asarray(self._ys), y[:k])), off, w2)
            self._left = max(0, max([until0] + [a + watch for a in arms if a < n0 + k]) - (n0 + k - 1))
            self._ml, self._vl, self._bl = float(y[k - 1]), float(vl[k - 1]), float(bl[k - 1])
            if self._ng:
                self._mg, self._vg, self._bg = float(g[k - 1]), float(vg[k - 1]), float(bg[k - 1])
                self._ng += k
            self._ys.extend(y[max(0, k - span):k].tolist())
            self._gs.extend(g[max(0, k - span):k].tolist())
            self._ss.extend(steps[i + max(0, k - w2):i + k].tolist())
            self._n, self._last_step = self._n + k, int(steps[i + k - 1])
        return k


__all__ = ["SwingRatioEdgeOfStability"]
