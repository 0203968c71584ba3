"""UpdateRatioBelowBand: the update ratio ``|dw|/|w|`` stays below the run's lower band edge (stuck weights)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector, Input, Knob
from ._ops import ewma, first_true, log10
from .update_ratio_above_band import ALPHA, REARM, REF_ALPHA, WARMUP

#: default hard lower edge, stuck whatever the run (UpdateRatioBand's ``low`` since c9205b5)
LOW = 1e-6
#: default lower edge that needs a drop from the run's own level (UpdateRatioBand's ``soft_low`` since c9205b5)
SOFT_LOW = 1e-5
#: default decades below the reference that make ``soft_low`` count (UpdateRatioBand's ``drop`` since c9205b5)
DROP = 1.5
#: default fraction of the peak learning rate under which small updates are the schedule's
#: (UpdateRatioBand's ``lr_explains`` since 17fce61: warm-up starts, schedule ends, warm-restart troughs)
LR_EXPLAINS = 0.05


class UpdateRatioBelowBand(Detector):
    """Flags an update ratio ``||dw|| / ||w||`` whose level stays below the run's lower band edge.

    On ``u = log10(update_ratio)`` the detector keeps a fast level (EWMA, weight ``alpha``) and a
    slow reference (EWMA, weight ``ref_alpha``: the run's settled level). The lower edge is
    ``low`` (1e-6: stuck, whatever the run), raised to ``soft_low`` for a level at least ``drop``
    decades below the reference (the weights slowed a thousandfold from the run's own pace).
    Fires ``update_ratio_low`` when the level crosses the edge, after ``warmup`` values — unless
    the learning rate explains it: small updates while the learning rate is 0, or its level (EWMA
    of ``log10(lr)``, weight ``alpha``, lagging like the ratio's) is below ``lr_explains`` of its
    peak (a warm-up start, a schedule's end, a warm-restart trough), are the schedule, not a
    failure. The learning rate is the optional second input (``nan`` when unknown).

    ``onset_step`` is the first value of the excursion. After an event the detector fires again
    only once the level came back over the edge by
    :data:`~trainsignals.detectors.update_ratio_above_band.REARM` (a factor of 2), and not within
    ``cooldown`` steps of the last event. Non-positive and non-finite ratios are skipped.

    **Rate**: ``update_ratio_low`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``update_ratio_low`` 1 alarm in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        low: hard lower edge, > 0.
        soft_low: lower edge that needs a drop from the run's own level, >= low.
        drop: decades below the reference that make ``soft_low`` count, > 0.
        lr_explains: fraction of the peak learning rate under which low updates are expected, in [0, 1].
        alpha: weight of the level (and of the learning rate's level), in (0, 1].
        ref_alpha: weight of the reference, in (0, alpha).
        warmup: values before any event, >= 1.
        cooldown: steps after an event without another, >= 0.

    Example:
        >>> import numpy as np
        >>> ratio = np.r_[np.full(100, 3e-4), np.full(100, 1e-8)]
        >>> [(e.kind.value, e.step) for e in UpdateRatioBelowBand().scan(update_ratio=ratio)]
        [('update_ratio_low', 101)]
        >>> UpdateRatioBelowBand().scan(update_ratio=ratio, lr=np.r_[np.full(100, 0.1), np.zeros(100)])
        []
    """

    knob = Knob("drop", 0.3, 6.0)

    inputs = (Input("update_ratio"), Input("lr", required=False))
    _state_keys = ("n", "level", "ref", "lr_peak", "lr_level", "out", "onset", "quiet_until", "last_step")

    def __init__(self, low: float = LOW, soft_low: float = SOFT_LOW, drop: float = DROP,
                 lr_explains: float = LR_EXPLAINS, alpha: float = ALPHA, ref_alpha: float = REF_ALPHA,
                 warmup: int = WARMUP, cooldown: int = 0) -> None:
        check_range("low", low, 0, None, lo_open=True)
        check_range("soft_low", soft_low, low, None)
        check_range("drop", drop, 0, None, lo_open=True)
        check_range("lr_explains", lr_explains, 0, 1)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("ref_alpha", ref_alpha, 0, alpha, lo_open=True, hi_open=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.low, self.soft_low, self.drop, self.lr_explains = low, soft_low, drop, lr_explains
        self.alpha, self.ref_alpha, self.warmup, self.cooldown = alpha, ref_alpha, warmup, cooldown
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._ra, self._rb = float(ref_alpha), 1.0 - float(ref_alpha)
        self._llo, self._lsoft = math.log10(low), math.log10(soft_low)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._level = self._ref = 0.0
        self._lr_peak = 0.0
        self._lr_level: float | None = None
        self._out = False  # reported, not yet back over the edge
        self._onset = -1
        self._quiet_until: int | None = None
        self._last_step = -1

    def _step(self, x: float, lr: float, step: int) -> Event | None:
        self._last_step = step
        if lr - lr == 0.0 and lr > 0.0:
            if lr > self._lr_peak:
                self._lr_peak = lr
            ll = log10(lr)
            self._lr_level = ll if self._lr_level is None else self._a * ll + self._b * self._lr_level
        if x - x != 0.0 or x <= 0.0:
            return None
        y = log10(x)
        if self._n == 0:
            self._level = self._ref = y
        else:
            self._level = self._a * y + self._b * self._level
            self._ref = self._ra * y + self._rb * self._ref
        self._n += 1
        lv, ref = self._level, self._ref
        explained = lr == 0.0 or (self._lr_level is not None and self._lr_peak > 0.0
                                  and self._lr_level < log10(self.lr_explains * self._lr_peak))
        if explained or not self._below(lv, ref, 0.0):
            if self._out and not explained and self._below(lv, ref, REARM):
                return None  # back over the edge by less than REARM: the same excursion
            self._out, self._onset = False, -1
            return None
        if self._onset < 0:
            self._onset = step
        if self._out or self._n <= self.warmup or (self._quiet_until is not None and step <= self._quiet_until):
            return None
        self._out = True
        if self.cooldown:
            self._quiet_until = step + self.cooldown
        edge = self.low if lv < self._llo else self.soft_low
        msg = (f"update ratio's smoothed level is {10 ** lv:.3g} (latest {x:.3g}), below the healthy band edge "
               f"{edge:.3g} since step {self._onset}")
        return make_event(Kind.UPDATE_RATIO_LOW, "warning", step, self._onset, type(self).__name__, "update_ratio",
                          10 ** lv, edge, msg)

    def _below(self, lv: float, ref: float, margin: float) -> bool:
        """Whether the level ``lv`` lies under the edge raised by ``margin`` decades (0: the edge itself)."""
        return lv < self._llo + margin or (lv < self._lsoft + margin and ref - lv >= self.drop - margin)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._n <= self.warmup or self._out or self._onset >= 0:
            return 0
        lr = arrays[1][i:j]
        with np.errstate(divide="ignore", invalid="ignore"):
            y, llr = np.log10(arrays[0][i:j]), np.log10(lr)
        # the lr must be uniformly known (and positive) or unknown in the block
        lim = first_true(~np.isfinite(y) | (~np.isnan(lr) if self._lr_level is None else ~np.isfinite(llr)))
        if lim == 0:
            return 0
        y = y[:lim]
        lv = ewma(y, self._a, self._b, self._level)
        ref = ewma(y, self._ra, self._rb, self._ref)
        k = first_true((lv < self._llo) | ((lv < self._lsoft) & (ref - lv >= self.drop)))  # the scalar path's
        if k:
            if self._lr_level is not None:
                self._lr_peak = max(self._lr_peak, float(lr[:k].max()))
                self._lr_level = float(ewma(llr[:k], self._a, self._b, self._lr_level)[-1])
            self._level, self._ref = float(lv[k - 1]), float(ref[k - 1])
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["UpdateRatioBelowBand"]
