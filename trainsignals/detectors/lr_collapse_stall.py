"""LRCollapseStall: the learning rate fell by orders of magnitude within a window and holds there."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector, Input, Knob
from ._factors import times
from ._interval import MIN_HOLD, MIN_VALUES
from ._ops import log10
from .frozen_update_plateau import RATIO_DECADES, TINY

#: default fall that counts: the update ratio ``||dw|| / ||w||`` scales with the learning rate for
#: the same gradients, so this is FrozenUpdatePlateau's ``ratio_decades`` (the healthy band
#: 1e-4..1e-3 down to the stuck region below 1e-6) read on the learning rate
DECADES = RATIO_DECADES
#: default values within which the fall must happen: a cut made at once or ramped in; a schedule's
#: decay takes longer (a step decay is one decade; a cosine falls its last two decades in the
#: last 6 % of its cycle and then keeps falling or restarts, so it does not hold)
WINDOW = 50
#: default values the new level must hold (the plateau tracker's ``HOLD``: a level that lasts ten
#: values is a level, not a dip)
HOLD = 10
#: the values of the hold may differ by at most this factor (a constant learning rate, or one
#: that a slow schedule moves, holds; a cosine's tail falls 4x a step near its end)
FLAT = 2.0


class LRCollapseStall(Detector):
    """Flags a stall the moment its cause shows: the learning rate collapsed and stays collapsed.

    On ``v = log10(lr)`` (0 counts as 1e-30) the detector keeps the latest ``window + hold``
    values. The rule: the last ``hold`` values lie within a factor :data:`FLAT` of each other
    (the learning rate holds a level) and that level is at least ``decades`` below the highest
    of the ``window`` values before them. The weights then move ``10 ** decades`` times less per
    step than a moment ago, so the loss cannot make progress: the run is stalled, whatever its
    loss shows yet. A converging run keeps its learning rate or decays it slowly (a step decay
    is one decade, a cosine's tail does not hold a level), and a warm-up rises.

    ``onset_step`` is the first step below the peak by more than :data:`FLAT`. After an event
    the rule is quiet until the learning rate comes back up by half the fall, and for
    ``cooldown`` steps in any case. Non-finite and negative learning rates are skipped.

    **Rate**: ``lr_collapse`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``lr_collapse`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        decades: fall below the window's peak that counts, > 0.
        window: values before the hold in which the peak is taken, >= 1.
        hold: values the collapsed level must hold, >= 1.
        cooldown: steps after an event without another, >= 0.

    Example:
        A learning rate cut 1000x at step 200; a step decay of 10x at step 200 is not a stall:

        >>> import numpy as np
        >>> lr = np.r_[np.full(200, 1e-3), np.full(100, 1e-6)]
        >>> [(e.kind.value, e.step, e.onset_step) for e in LRCollapseStall().scan(lr=lr)]
        [('stall', 209, 200)]
        >>> LRCollapseStall().scan(lr=np.r_[np.full(200, 1e-3), np.full(100, 1e-4)])
        []
    """

    inputs = (Input("lr"),)
    knob = Knob("decades", 0.5, 6.0)
    spans = {"window": MIN_VALUES, "hold": MIN_HOLD}
    _state_keys = ("hist", "fired", "quiet_until", "last_step")

    def __init__(self, decades: float = DECADES, window: int = WINDOW, hold: int = HOLD, cooldown: int = 0) -> None:
        check_range("decades", decades, 0, None, lo_open=True)
        check_range("window", window, 1, None, integer=True)
        check_range("hold", hold, 1, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.decades, self.window, self.hold, self.cooldown = decades, window, hold, cooldown
        self._flat = math.log10(FLAT)
        self._reset()

    def _reset(self) -> None:
        self._hist: deque[tuple[int, float]] = deque(maxlen=self.window + self.hold)  # (step, log10 lr)
        self._vals: deque[float] = deque(maxlen=self.window + self.hold)  # the same log10 lr values alone
        self._fired: float | None = None  # the level that alarmed, until the lr comes back up
        self._quiet_until = -1
        self._last_step = -1
        self._calm: tuple[int, float] | None = None  # the latest entry found less than `decades` below the peak

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._hist = deque(((int(s), float(v)) for s, v in state["hist"]), maxlen=self.window + self.hold)
        self._vals = deque((v for _, v in self._hist), maxlen=self.window + self.hold)
        self._calm = None

    def _step(self, lr: float, step: int) -> Event | None:
        self._last_step = step
        if lr - lr != 0.0 or lr < 0.0:
            return None
        v = log10(lr if lr > TINY else TINY)
        h = self._hist
        # the same value as the entry before, which was less than `decades` below the highest value then:
        # it still is (the window lost values and gained one no higher), so the peak needs no search
        c = self._calm
        calm = c is not None and h[-1] is c and v == c[1]
        h.append(e := (step, v))
        self._vals.append(v)
        if self._fired is not None:
            if v - self._fired < 0.5 * self.decades:
                return None
            self._fired = None  # the learning rate came back: re-armed
        n, k = len(h), self.hold
        if n <= k or step <= self._quiet_until:
            return None
        if calm or max(self._vals) - v < self.decades:
            self._calm = e
            return None  # (the peak before the hold is at most the highest value seen, the hold's at least v)
        recent = [x for _, x in islice(h, n - k, n)]
        hi = max(recent)
        if hi - min(recent) > self._flat:
            return None
        before = [x for _, x in islice(h, 0, n - k)]
        peak = max(before)
        if peak - hi < self.decades:
            return None
        top = max(i for i, x in enumerate(before) if x == peak)
        onset = next((s for s, x in islice(h, top + 1, n) if x < peak - self._flat), step)
        self._fired = hi
        self._quiet_until = step + self.cooldown if self.cooldown else -1
        msg = (f"lr fell {peak - hi:.1f} decades to {10 ** hi:.3g} since step {onset} and stays there: "
               f"the weights move {times(peak - hi, base10=True)}x less per step, so the loss cannot improve")
        return make_event(Kind.STALL, "warning", step, onset, type(self).__name__, "lr", peak - hi, self.decades, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        """The values before the first one that could fire, in one vectorised pass.

        A value ``t`` can fire only if the highest of the ``window`` values before its hold is
        at least ``decades`` above it (the hold's highest value is at least ``t``).
        """
        if self._fired is not None:
            return 0
        lr = arrays[0][i:j]
        with np.errstate(invalid="ignore"):
            ok = np.isfinite(lr) & (lr >= 0.0)
        good = np.flatnonzero(ok)
        v = np.log10(np.maximum(lr[good], TINY))
        old = [x for _, x in self._hist]
        w = self.window + self.hold
        seq = np.concatenate((np.full(w - 1, -np.inf), old, v))  # the past values padded
        peaks = sliding_window_view(seq, self.window).max(axis=1)[len(old):len(old) + len(v)]
        t = len(old) + np.arange(len(v))  # each value's index among the values seen
        cand = (t >= self.hold) & (peaks - v >= self.decades)
        m = int(np.argmax(cand)) if cand.any() else len(v)  # good values that are safe
        k = int(good[m]) if m < len(v) else j - i
        if k == 0:
            return 0
        for s, x in zip(steps[i + good[max(0, m - w):m]].tolist(), v[max(0, m - w):m].tolist()):
            self._hist.append((int(s), float(x)))
            self._vals.append(float(x))
        self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["LRCollapseStall"]
