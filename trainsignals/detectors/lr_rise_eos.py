"""LRRiseEdgeOfStability: the learning rate jumped and stayed up, and the loss answered with wider swings."""

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
from ._ops import column_log, first_unusable, log

_NAN = math.nan
#: the 99th percentile of the swing ratio over the 18,096 no-progress windows of the healthy runs
#: of the committed real and synthetic suites (1.934; ``benchmarks/probe_oscillation_shift.py``)
SHIFT = 1.93


class LRRiseEdgeOfStability(Detector):
    """Flags a step size past the edge of stability: after a learning-rate jump, the loss swings wider.

    Inputs: the loss (log space) and the learning rate (``nan``: unknown). A *jump to new
    ground*, a rate at least ``lr_rise`` times the last known one and ``lr_rise`` times above
    every rate the run had used (a step size it never trained with: the cause seen directly; not
    a warmup's gradual climb), arms a watch of ``4 * window - 3 * window // 2`` values, examined
    every ``STRIDE``-th value. With the windows of :class:`SwingRatioEdgeOfStability`
    (``onset_step``: the current one's first step), it fires when the rate stayed up (the current
    window's smallest is ``lr_rise`` times the reference's median: a bump that came back down is
    no regime), with no net progress, and the loss swings ``shift`` times as wide in loss units.
    A jump back to a rate the run has used (a schedule's warm restart, a rate restored after a
    drop) brings back the wider band the run had at that rate: no evidence of a step size past
    the edge (a run unstable at a rate it had used is :class:`SwingRatioEdgeOfStability`'s). An
    event disarms the watch; no event in the first ``warmup`` values, nor for ``cooldown`` steps
    after one.

    **Rate**: ``lr_edge_of_stability`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``lr_edge_of_stability`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        window: the windows' unit, >= 8.
        shift: loss swing ratio that fires, > 1.
        lr_rise: learning-rate ratio of a jump, and of the current window over the reference, > 1.
        warmup: values before any event, >= 4 * window.
        cooldown: steps after an event without a new one, >= 0.
        signal: the loss signal read (and named in events).

    Example:
        At step 400 the learning rate triples; the loss jumps 4x and bounces with its log noise:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> t = np.arange(700)
        >>> loss = (2.3 * np.exp(-t / 120) + 0.3) * np.where(t >= 400, 4.0, 1.0) * np.exp(rng.normal(0, 0.1, 700))
        >>> lr = np.where(t >= 400, 0.03, 0.01)
        >>> [(e.step, e.onset_step) for e in LRRiseEdgeOfStability().scan(loss=loss, lr=lr)]
        [(448, 401)]
    """

    knob = Knob("shift", 1.5, 10.0)
    _state_keys = ("n", "ys", "ls", "ss", "left", "lr_top", "quiet_until", "last_step")

    def __init__(self, window: int = 32, shift: float = SHIFT, lr_rise: float = 1.5,
                 warmup: int = 128, cooldown: int = 100, signal: str = "loss") -> None:
        check_range("window", window, 8, None, integer=True)
        check_range("shift", shift, 1, None, lo_open=True)
        check_range("lr_rise", lr_rise, 1, None, lo_open=True)
        check_range("warmup", warmup, sw.SPAN * window, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_signal("signal", signal)
        self.window, self.shift, self.lr_rise = window, shift, lr_rise
        self.warmup, self.cooldown, self.signal = warmup, cooldown, signal
        self.inputs = (Input(signal), Input("lr", required=False))
        self.logs = (signal,)
        self._reset()

    def _reset(self) -> None:
        self._n = self._left = 0  # left: values left in the watch (0: not armed)
        self._ys: deque[float] = deque(maxlen=sw.SPAN * self.window)
        self._ls: deque[float] = deque(maxlen=sw.SPAN * self.window)  # nan: unknown at that value
        self._ss: deque[int] = deque(maxlen=3 * self.window // 2)
        self._lr_top = 0.0  # the highest rate so far (0: none known)
        self._quiet_until = self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._ys, self._ls = sw.kept(state["ys"], sw.SPAN * self.window), sw.kept(state["ls"], sw.SPAN * self.window)
        self._ss = deque(state["ss"], maxlen=3 * self.window // 2)

    def _get_state(self) -> dict[str, Any]:
        return {**super()._get_state(), "ls": sw.plain(self._ls)}

    def _test(self, ys: Sequence[float], ls: Sequence[float]) -> tuple[float, float] | None:
        """``(loss swing ratio, learning-rate ratio)`` where the rule fires, else ``None``."""
        w2 = 3 * self.window // 2
        rl = sw.swing_ratio(ys, w2)
        rlr = sw.lr_rise(ls, w2) if rl >= self.shift else 0.0
        return (rl, rlr) if rlr >= self.lr_rise else None

    def _jumped(self, lr: float) -> bool:
        """Keep ``lr`` (nan when unknown) aligned with the losses; whether it jumped to new ground."""
        if not (lr - lr == 0.0 and lr > 0.0):
            self._ls.append(_NAN)
            return False
        top, self._lr_top = self._lr_top, max(self._lr_top, lr)
        prev = next((v for v in reversed(self._ls) if v == v), _NAN)  # the last known one
        self._ls.append(lr)
        return lr >= self.lr_rise * prev and lr >= self.lr_rise * top

    def _step(self, x: float, lr: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:  # not a loss: the statistics stay untouched
            return None
        n, left, ls, self._n = self._n, self._left, self._ls, self._n + 1
        self._ys.append(log(x) if log_x is None else log_x)
        self._ss.append(step)
        jumped = False
        if ls and 0.0 < lr <= ls[-1]:  # the usual step: a known rate that did not rise
            ls.append(lr)
        else:
            jumped = self._jumped(lr)
        if step <= self._quiet_until:
            return None
        if left:
            self._left = left - 1
        if n < self.warmup:
            return None
        if jumped:  # (re)arm the watch: a jump to new ground
            self._left = left = sw.SPAN * self.window - 3 * self.window // 2
        if not left or n % sw.STRIDE:  # examined every STRIDE-th value while armed
            return None
        if (got := self._test(self._ys, ls)) is None:
            return None
        (rl, rlr), w2 = got, 3 * self.window // 2
        self._quiet_until, self._left = step + self.cooldown, 0
        msg = (f"{self.signal} swings {rl:.3g}x as wide ({self.signal} units) over the last {w2} values as over the "
               f"{w2} before the last {w2 + self.window}, with no net progress; the learning rate rose {rlr:.3g}x, "
               "above any rate the run had used: step size at the edge of stability")
        return make_event(Kind.OSCILLATION, "warning", step, self._ss[0], type(self).__name__, self.signal, rl,
                          self.shift, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if steps[i] <= self._quiet_until:
            return 0
        if not (lim := first_unusable(arrays[0], i, j, positive=True)):
            return 0
        y, w, last0 = column_log(arrays[0], i, i + lim), self.window, next((v for v in reversed(self._ls) if v == v), _NAN)
        w2, span, rise = 3 * w // 2, sw.SPAN * w, self.lr_rise
        lr, known, jumps, new = sw.lr_jumps(arrays[1], i, lim, last0, self._lr_top, rise)
        jumps = jumps[new]  # only a jump to new ground arms the watch
        n0, watch = self._n, span - w2
        until0, arms = n0 + self._left - 1, [a for a in (n0 + jumps).tolist() if a >= self.warmup]  # warm: arms
        es = sw.watch_checks(n0, until0, arms, watch, n0 + lim - 1)
        k, off = lim, len(self._ys)
        if len(es):  # a looser vectorised twin of the test, then the scalar test on survivors
            yext = np.concatenate((np.asarray(self._ys), y))
            lext = np.concatenate((np.asarray(self._ls, dtype=np.float64), lr))
            es = es[sw.batch_swing_ratio(yext, off + es, w2, span) >= self.shift * sw.SLACK]
            lv = np.lib.stride_tricks.sliding_window_view(lext, w2)
            lc, lrf = lv[off + es + 1 - w2], lv[off + es + 1 - span]
            holes = np.isnan(lrf).any(axis=1)  # a reference with a gap: left to the scalar test
            with np.errstate(invalid="ignore"):  # the smallest known rate (nan: none) against the reference
                up = np.fmin.reduce(lc, axis=1) >= rise * np.median(np.where(holes[:, None], 1, lrf), axis=1) * sw.SLACK
            for c in es[holes | up].tolist():
                lo = off + c + 1 - span
                if self._test(yext[lo:off + c + 1].tolist(), lext[lo:off + c + 1].tolist()) is not None:
                    k = c
                    break
        if k:
            self._left = max(0, max([until0] + [a + watch for a in arms if a < n0 + k]) - (n0 + k - 1))
            if known[:k].any():  # the learning-rate record as of the last value consumed
                self._lr_top = max(self._lr_top, float(np.nanmax(lr[:k])))
            self._ys.extend(y[max(0, k - span):k].tolist())
            self._ls.extend(lr[max(0, k - span):k].tolist())
            self._ss.extend(steps[i + max(0, k - w2):i + k].tolist())
            self._n, self._last_step = self._n + k, int(steps[i + k - 1])
        return k


__all__ = ["LRRiseEdgeOfStability"]
