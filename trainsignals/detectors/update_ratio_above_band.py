"""UpdateRatioAboveBand: the update ratio ``|dw|/|w|`` stays above the run's upper band edge (violent updates)."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Detector, Input, Knob
from ._factors import pow10_or_inf, times
from ._ops import ewma, first_true, log10

#: default hard upper edge, violent updates whatever the run (UpdateRatioBand's ``high`` since 4f73fd2, real suite)
HIGH = 0.1
#: default top of the usual healthy band 1e-4..1e-3 (UpdateRatioBand's ``band_top`` since 4f73fd2)
BAND_TOP = 1e-3
#: default decades above the run's own level that count above ``band_top`` (UpdateRatioBand's ``jump``, 4f73fd2)
JUMP = 1.0
#: default weight of the level (UpdateRatioBand's ``alpha`` since the first engine, 9dbceb6)
ALPHA = 0.3
#: default weight of the slow reference, the run's settled level (UpdateRatioBand's ``ref_alpha`` since c9205b5)
REF_ALPHA = 0.01
#: default values before any event (UpdateRatioBand's ``warmup`` since 9dbceb6)
WARMUP = 10
#: default values before the reference counts: a run's update ratio often climbs a decade or more in its
#: first hundred steps (UpdateRatioBand's ``settle`` since 4f73fd2)
SETTLE = 200
#: decades back inside the band that re-arm a band rule after its event (a factor of 2): a level (EWMA,
#: scatter 0.4x that of log10(ratio), 0.1-0.2 decades a step) settled at an edge fired at every crossing
REARM = 0.30103


class UpdateRatioAboveBand(Detector):
    """Flags an update ratio ``||dw|| / ||w||`` whose level stays above the run's upper band edge.

    On ``u = log10(update_ratio)`` the detector keeps a fast level (EWMA, weight ``alpha``) and a slow
    reference (EWMA, weight ``ref_alpha``: the run's settled level). The upper edge is ``high`` (violent
    updates, whatever the run), once the level has been under it: the first steps from a small initialisation
    (a linear model's weights near 0, Adam's first updates of about ``lr`` per weight) often change the
    weights by more than a tenth, which is how the run starts, not a change in it. Once the reference has
    settled (after ``settle`` values) it comes down to ``band_top`` (the top of the usual band 1e-4..1e-3) for
    a level at least ``jump`` decades above the reference: updates an order of magnitude larger than the run's
    own. A small network trained with plain SGD at a high learning rate lives well at 1e-2, so the edge is the
    run's own. Fires ``update_ratio_high`` when the level crosses the edge, after ``warmup`` values. The
    learning rate, the optional second input (``nan`` when unknown), takes its share of a jump: its own level
    and reference (the same EWMAs of ``log10(lr)``, fed at the steps with a ratio) are kept, and the decades
    its level rose above its reference are taken off the ratio's rise, so a warm restart that lifts the rate
    40-fold and the updates with it is the schedule, not violent updates; the hard edge ``high`` holds
    whatever the rate.

    ``onset_step`` is the first value of the excursion. After an event it fires again only once the level came
    back under the edge by :data:`REARM` (a factor of 2), and not within ``cooldown`` steps of the last event.
    Non-positive and non-finite ratios are skipped. **Rate**: ``update_ratio_high`` 0 alarms in 304,819 tuning
    healthy steps, 2 in 879,581 held-out ones (1,478 runs; ``calibration.json``; budget 0.5 per 10,000).

    Args:
        high: hard upper edge, > band_top.
        band_top: level above which a jump from the run's own level counts, > 0.
        jump: decades above the reference that make ``band_top`` count, > 0.
        alpha: weight of the level, in (0, 1].
        ref_alpha: weight of the reference, in (0, alpha).
        warmup: values before any event, >= 1.
        settle: values before the reference counts, >= warmup.
        cooldown: steps after an event without another, >= 0.

    Example:
        >>> import numpy as np
        >>> ratio = np.r_[np.full(100, 3e-4), np.full(100, 0.3)]
        >>> [(e.kind.value, e.step) for e in UpdateRatioAboveBand().scan(update_ratio=ratio)]
        [('update_ratio_high', 105)]
        >>> ratio = np.r_[np.full(300, 3e-3), np.full(100, 0.05)]  # 10x above its own level
        >>> [(e.kind.value, e.step) for e in UpdateRatioAboveBand().scan(update_ratio=ratio)]
        [('update_ratio_high', 305)]
        >>> lr = np.r_[np.full(300, 1e-4), np.full(100, 2e-3)]  # ... when the rate rose as much: a restart
        >>> UpdateRatioAboveBand().scan(update_ratio=ratio, lr=lr)
        []
        >>> ratio = np.r_[np.geomspace(0.5, 1e-3, 60), np.full(200, 1e-3)]  # violent only as the run starts
        >>> UpdateRatioAboveBand().scan(update_ratio=ratio)
        []
    """

    knob = Knob("jump", 0.2, 5.0)
    spans = {"settle": "warmup"}
    rates = ("ref_alpha",)

    inputs = (Input("update_ratio"), Input("lr", required=False))
    _state_keys = ("n", "level", "ref", "lr_level", "lr_ref", "held", "out", "onset", "quiet_until", "last_step")

    def __init__(self, high: float = HIGH, band_top: float = BAND_TOP, jump: float = JUMP, alpha: float = ALPHA,
                 ref_alpha: float = REF_ALPHA, warmup: int = WARMUP, settle: int = SETTLE, cooldown: int = 0) -> None:
        check_range("band_top", band_top, 0, None, lo_open=True)
        check_range("high", high, band_top, None, lo_open=True)
        check_range("jump", jump, 0, None, lo_open=True)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("ref_alpha", ref_alpha, 0, alpha, lo_open=True, hi_open=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("settle", settle, warmup, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.high, self.band_top, self.jump = high, band_top, jump
        self.alpha, self.ref_alpha = alpha, ref_alpha
        self.warmup, self.settle, self.cooldown = warmup, settle, cooldown
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._ra, self._rb = float(ref_alpha), 1.0 - float(ref_alpha)
        self._lhi, self._ltop = math.log10(high), math.log10(band_top)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._level = self._ref = 0.0
        self._lr_level: float | None = None  # the learning rate's level and reference (None: no rate seen)
        self._lr_ref = 0.0
        self._held = False  # the level has been under the hard edge: a level the run held
        self._out = False  # reported, not yet back under the edge
        self._onset = -1
        self._quiet_until: int | None = None
        self._last_step = -1

    def _step(self, x: float, lr: float, step: int) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        if lr - lr == 0.0 and lr > 0.0:  # the rate's levels move at the steps the ratio is judged
            ll = log10(lr)
            if self._lr_level is None:
                self._lr_level = self._lr_ref = ll
            else:
                self._lr_level = self._a * ll + self._b * self._lr_level
                self._lr_ref = self._ra * ll + self._rb * self._lr_ref
        y = log10(x)
        if self._n == 0:
            self._level = self._ref = y
        else:
            self._level = self._a * y + self._b * self._level
            self._ref = self._ra * y + self._rb * self._ref
        self._n += 1
        lv, ref = self._level, self._ref
        if self._lr_level is not None and self._lr_level > self._lr_ref:  # the rate's own rise: the schedule's
            ref += self._lr_level - self._lr_ref
        if lv <= self._lhi:
            self._held = True
        if not self._above(lv, ref, 0.0):
            if self._out and self._above(lv, ref, REARM):
                return None  # back under the edge by less than REARM: the same excursion
            self._out, self._onset = False, -1
            return None
        if self._onset < 0:
            self._onset = step
        if self._out or self._n <= self.warmup or (self._quiet_until is not None and step <= self._quiet_until):
            return None
        self._out, self._quiet_until = True, step + self.cooldown if self.cooldown else self._quiet_until
        if lv <= self._lhi:  # the edge came down to band_top: a jump from the run's own level
            edge = pow10_or_inf(ref + self.jump)
            msg = (f"update ratio's smoothed level is {times(lv, True)} (latest {x:.3g}), over {self.jump:g} "
                   f"decade(s) above the run's own level {times(ref, True)}, since step {self._onset}")
        else:
            edge = self.high
            msg = (f"update ratio's smoothed level is {times(lv, True)} (latest {x:.3g}), above the healthy band edge "
                   f"{edge:.3g} since step {self._onset}")
        return make_event(Kind.UPDATE_RATIO_HIGH, "warning", step, self._onset, type(self).__name__, "update_ratio",
                          pow10_or_inf(lv), edge, msg)

    def _above(self, lv: float, ref: float, margin: float) -> bool:
        """Whether the level ``lv`` lies over the edge lowered by ``margin`` decades (0: the edge itself)."""
        return (lv > self._lhi - margin and self._held) or (
            lv > self._ltop - margin and lv - ref >= self.jump - margin and self._n > self.settle)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._n <= self.warmup or self._out or self._onset >= 0 or not self._held:
            return 0
        lr = arrays[1][i:j]
        with np.errstate(divide="ignore", invalid="ignore"):
            y, llr = np.log10(arrays[0][i:j]), np.log10(lr)
        # the rate must be uniformly known (and positive) or unknown in the block
        lim = first_true(~np.isfinite(y) | (~np.isnan(lr) if self._lr_level is None else ~np.isfinite(llr)))
        if lim == 0:
            return 0
        y = y[:lim]
        lv = ewma(y, self._a, self._b, self._level)
        ref = ewma(y, self._ra, self._rb, self._ref)
        rise = lv - ref
        if self._lr_level is not None:
            lrl = ewma(llr[:lim], self._a, self._b, self._lr_level)
            lrr = ewma(llr[:lim], self._ra, self._rb, self._lr_ref)
            rise -= np.maximum(lrl - lrr, 0.0)
        n_at = self._n + np.arange(1, lim + 1)
        jumped = (n_at > self.settle) & (lv > self._ltop) & (rise >= self.jump)
        k = first_true((lv > self._lhi) | jumped)  # a value over the edge is the scalar path's
        if k:
            self._level, self._ref = float(lv[k - 1]), float(ref[k - 1])
            if self._lr_level is not None:
                self._lr_level, self._lr_ref = float(lrl[k - 1]), float(lrr[k - 1])
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["UpdateRatioAboveBand"]
