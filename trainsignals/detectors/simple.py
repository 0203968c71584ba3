"""Small scalar detectors: non-finite values, the learning rate, the update-ratio band."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range, check_signal
from ._base import Detector, Input, Knob
from ._ops import ewma, first_true


class NonFinite(Detector):
    """Flags a NaN or infinite value: critical, once per run of non-finite values.

    Example:
        >>> [e.step for e in NonFinite().scan(loss=[1.0, 0.9, float("nan"), float("nan"), 0.8, float("inf")])]
        [2, 5]
    """

    _state_keys = ("bad", "last_step")

    def __init__(self, signal: str = "loss") -> None:
        check_signal("signal", signal)
        self.signal = signal
        self.inputs = (Input(signal),)
        self._reset()

    def _reset(self) -> None:
        self._bad = False
        self._last_step = -1

    def _step(self, x: float, step: int) -> Event | None:
        self._last_step = step
        if x - x == 0.0:
            self._bad = False
            return None
        if self._bad:
            return None
        self._bad = True
        msg = f"{self.signal} is {x}: the run cannot recover from this"
        return make_event(Kind.NONFINITE, "critical", step, step, type(self).__name__, self.signal,
                          x, math.inf, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._bad:
            return 0
        k = first_true(~np.isfinite(arrays[0][i:j]))
        if k:
            self._last_step = int(steps[i + k - 1])
        return k


class LRAnomaly(Detector):
    """Flags a learning rate that does not behave like a schedule.

    Without a plan it fires when the learning rate changes by a factor of at least
    ``jump_factor`` in one step — except an upward jump back to at most the run's peak so far
    (a warm restart) — or drops to exactly 0 from a schedule that was not decaying (a cosine
    ending at 0 is fine). Step decays (x0.1, x0.5) stay below the default factor.
    With ``schedule`` (a callable ``step -> lr``), it fires when the observed learning rate
    differs from the plan by more than ``rtol`` (relative). Quiet for ``cooldown`` steps after
    an event.

    Args:
        jump_factor: one-step change factor that fires, > 1.
        schedule: the intended learning rate per step, or None.
        rtol: relative tolerance against ``schedule``, > 0.
        cooldown: values without events after an event, >= 0.

    Example:
        >>> lr = [0.1] * 50 + [10.0] * 50
        >>> [e.step for e in LRAnomaly().scan(lr=lr)]
        [50]
    """

    inputs = (Input("lr"),)
    knob = Knob("jump_factor", 2.0, 1000.0)
    _state_keys = ("prev", "peak", "decaying", "cooldown_left", "last_step")

    def __init__(
        self,
        jump_factor: float = 20.0,
        schedule: Callable[[int], float] | None = None,
        rtol: float = 0.01,
        cooldown: int = 50,
    ) -> None:
        check_range("jump_factor", jump_factor, 1, None, lo_open=True)
        check_range("rtol", rtol, 0, None, lo_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        if schedule is not None and not callable(schedule):
            raise ValueError(f"schedule must be a callable step -> lr, got {schedule!r}")
        self.jump_factor = jump_factor
        self.schedule = schedule
        self.rtol = rtol
        self.cooldown = cooldown
        self._reset()

    def _reset(self) -> None:
        self._prev = -1.0
        self._peak = 0.0
        self._decaying = False
        self._cooldown_left = 0
        self._last_step = -1

    def _step(self, lr: float, step: int) -> Event | None:
        self._last_step = step
        if lr - lr != 0.0 or lr < 0.0:
            return None
        prev = self._prev
        msg = None
        value = thr = 0.0
        if self.schedule is not None:
            want = float(self.schedule(step))
            err = abs(lr - want) / max(abs(want), 1e-300)
            if err > self.rtol:
                msg = f"lr is {lr:.4g} at step {step} where the schedule says {want:.4g}"
                value, thr = err, self.rtol
        elif prev > 0.0:
            if lr == 0.0:
                if not self._decaying:
                    msg = f"lr dropped from {prev:.4g} to 0 without a decay"
                    value, thr = math.inf, self.jump_factor
            else:
                r = lr / prev
                if r >= self.jump_factor and lr > self._peak:
                    msg = f"lr jumped {r:.3g}x to {lr:.4g}, above the run's peak {self._peak:.4g}"
                    value, thr = r, self.jump_factor
                elif r <= 1.0 / self.jump_factor:
                    msg = f"lr dropped {1 / r:.3g}x to {lr:.4g} in one step"
                    value, thr = 1.0 / r, self.jump_factor
        if prev >= 0.0 and lr != prev:
            self._decaying = lr < prev
        self._prev = lr
        if lr > self._peak:
            self._peak = lr
        if self._cooldown_left:
            self._cooldown_left -= 1
            return None
        if msg is None:
            return None
        self._cooldown_left = self.cooldown
        return make_event(Kind.LR_ANOMALY, "warning", step, step, type(self).__name__, "lr", value, thr, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self.schedule is not None or self._cooldown_left or self._prev <= 0.0:
            return 0
        lr = arrays[0][i:j]
        prev = np.empty_like(lr)
        prev[0] = self._prev
        prev[1:] = lr[:-1]
        with np.errstate(divide="ignore", invalid="ignore"):
            r = lr / prev
        bad = ~np.isfinite(lr) | (lr <= 0.0) | ~(r < self.jump_factor) | (r <= 1.0 / self.jump_factor)
        k = first_true(bad)
        if k:
            seg = lr[:k]
            changed = np.flatnonzero(seg != prev[:k])
            if len(changed):
                c = changed[-1]
                self._decaying = bool(seg[c] < prev[c])
            self._peak = max(self._peak, float(seg.max()))
            self._prev = float(seg[-1])
            self._last_step = int(steps[i + k - 1])
        return k


class UpdateRatioBand(Detector):
    """Flags an update ratio ``|Δw|/|w|`` that leaves its healthy band for a sustained stretch.

    The ratio is already relative to the weights' own size; the usual healthy band is
    1e-4..1e-3, but a small network trained with plain SGD at a high learning rate lives
    well at 1e-2, so the upper edge is the run's own. On ``u = log10(ratio)`` the detector
    keeps a fast level (EWMA, weight ``alpha``) and a slow reference (EWMA, weight
    ``ref_alpha``: the run's settled level) and fires

    * ``update_ratio_high`` when the level is above ``high`` (0.1: violent updates, whatever
      the run), or, once the reference has settled (after ``settle`` values), when the level
      is above ``band_top`` (the top of the usual band) and at least ``jump`` decades above
      the reference: the updates became an order of magnitude larger than the run's own;
    * ``update_ratio_low`` when the level is below ``low`` (1e-6: stuck), or below
      ``soft_low`` (1e-5) after dropping ``drop`` decades below its own reference — unless the
      learning rate explains it: small updates while the learning rate's level (EWMA of
      ``log10(lr)``, weight ``alpha``, lagging like the ratio's level) is below
      ``lr_explains`` of its peak (a warm-up start, a schedule's end, a warm-restart trough)
      are the schedule, not a failure. The learning rate is the optional second input
      (``nan`` when unknown).

    After ``warmup`` values. Once fired, a side fires again only after the level came back
    inside the band. ``onset_step`` is the first value of the current excursion.

    Args:
        low: hard lower edge, > 0.
        soft_low: lower edge that needs a drop from the run's own level, >= low.
        high: hard upper edge (violent updates), > band_top.
        band_top: level above which a jump from the run's own level counts, > soft_low.
        jump: decades above the reference that make ``band_top`` count, > 0.
        drop: decades below the reference that make ``soft_low`` count, > 0.
        lr_explains: fraction of the peak learning rate under which low updates are expected.
        alpha: weight of the level, in (0, 1].
        ref_alpha: weight of the reference, in (0, alpha).
        warmup: values before any event, >= 1.
        settle: values before the jump rule applies (the reference's start-up: a run's
            update ratio often climbs a decade or more in its first hundred steps), >= warmup.
        signal: the signal name used in events.

    Example:
        >>> import numpy as np
        >>> ratio = np.r_[np.full(100, 3e-4), np.full(100, 0.3)]
        >>> [(e.kind.value, e.step) for e in UpdateRatioBand().scan(update_ratio=ratio)]
        [('update_ratio_high', 105)]
        >>> ratio = np.r_[np.full(300, 3e-3), np.full(100, 0.05)]  # 10x above its own level
        >>> [(e.kind.value, e.step) for e in UpdateRatioBand().scan(update_ratio=ratio)]
        [('update_ratio_high', 305)]
    """

    _state_keys = ("n", "level", "ref", "lr_peak", "lr_level", "side", "onset", "last_step")

    def __init__(self, low: float = 1e-6, soft_low: float = 1e-5, high: float = 0.1, band_top: float = 1e-3,
                 jump: float = 1.0, drop: float = 1.5, lr_explains: float = 0.05, alpha: float = 0.3,
                 ref_alpha: float = 0.01, warmup: int = 10, settle: int = 200,
                 signal: str = "update_ratio") -> None:
        check_range("low", low, 0, None, lo_open=True)
        check_range("soft_low", soft_low, low, None)
        check_range("band_top", band_top, soft_low, None, lo_open=True)
        check_range("high", high, band_top, None, lo_open=True)
        check_range("jump", jump, 0, None, lo_open=True)
        check_range("drop", drop, 0, None, lo_open=True)
        check_range("lr_explains", lr_explains, 0, 1)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("ref_alpha", ref_alpha, 0, alpha, lo_open=True, hi_open=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("settle", settle, warmup, None, integer=True)
        self.low = low
        self.soft_low = soft_low
        self.high = high
        self.band_top = band_top
        self.jump = jump
        self.drop = drop
        self.lr_explains = lr_explains
        self.alpha = alpha
        self.ref_alpha = ref_alpha
        self.warmup = warmup
        self.settle = settle
        check_signal("signal", signal)
        self.signal = signal
        self.inputs = (Input(signal), Input("lr", required=False))
        self._a, self._b = float(alpha), 1.0 - float(alpha)
        self._ra, self._rb = float(ref_alpha), 1.0 - float(ref_alpha)
        self._llo, self._lsoft, self._lhi = math.log10(low), math.log10(soft_low), math.log10(high)
        self._ltop = math.log10(band_top)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._level = 0.0
        self._ref = 0.0
        self._lr_peak = 0.0
        self._lr_level: float | None = None
        self._side = 0
        self._onset = -1
        self._last_step = -1

    def _side_of(self, lv: float, ref: float, lr: float) -> int:
        # violent, or (the jump rule) above the usual band and `jump` decades above the settled reference
        if lv > self._lhi or (lv > self._ltop and lv - ref >= self.jump and self._n > self.settle):
            return 1
        if lv < self._llo or (lv < self._lsoft and ref - lv >= self.drop):
            if lr == 0.0 or (self._lr_level is not None and self._lr_peak > 0.0
                             and self._lr_level < math.log10(self.lr_explains * self._lr_peak)):
                return 0
            return -1
        return 0

    def _step(self, x: float, lr: float, step: int) -> Event | None:
        self._last_step = step
        if lr - lr == 0.0 and lr > 0.0:
            if lr > self._lr_peak:
                self._lr_peak = lr
            ll = math.log10(lr)
            self._lr_level = ll if self._lr_level is None else self._a * ll + self._b * self._lr_level
        if x - x != 0.0 or x <= 0.0:
            return None
        y = math.log10(x)
        if self._n == 0:
            self._level = self._ref = y
        else:
            self._level = self._a * y + self._b * self._level
            self._ref = self._ra * y + self._rb * self._ref
        self._n += 1
        lv = self._level
        side = self._side_of(lv, self._ref, lr)
        if side == 0:
            self._onset = -1
        elif self._onset < 0:
            self._onset = step
        if side == self._side or self._n <= self.warmup:
            if side == 0:
                self._side = 0
            return None
        self._side = side
        if side == 0:
            return None
        kind = Kind.UPDATE_RATIO_HIGH if side > 0 else Kind.UPDATE_RATIO_LOW
        if side > 0 and lv <= self._lhi:  # the jump rule
            edge = 10 ** (self._ref + self.jump)
            msg = (f"update ratio has stayed near {10 ** lv:.3g}, over {self.jump:g} decade(s) above the run's own "
                   f"level {10 ** self._ref:.3g}, since step {self._onset}")
        else:
            edge = self.high if side > 0 else (self.low if lv < self._llo else self.soft_low)
            msg = (f"update ratio has stayed near {10 ** lv:.3g}, {'above' if side > 0 else 'below'} "
                   f"the healthy band edge {edge:.3g} since step {self._onset}")
        return make_event(kind, "warning", step, self._onset, type(self).__name__, self.signal, 10 ** lv, edge, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._n <= self.warmup or self._side != 0 or self._onset >= 0:
            return 0
        with np.errstate(divide="ignore", invalid="ignore"):
            y = np.log10(arrays[0][i:j])
        lr = arrays[1][i:j]
        with np.errstate(divide="ignore", invalid="ignore"):
            llr = np.log10(lr)
        lr_ok = np.isfinite(llr)
        # the lr must be uniformly known (and positive) or unknown in the block
        if self._lr_level is None:
            bad = ~np.isfinite(y) | ~np.isnan(lr)
        else:
            bad = ~np.isfinite(y) | ~lr_ok
        lim = first_true(bad)
        if lim == 0:
            return 0
        y = y[:lim]
        lv = ewma(y, self._a, self._b, self._level)
        ref = ewma(y, self._ra, self._rb, self._ref)
        # anything that may leave the band goes to the scalar path (it knows the lr rule)
        n_at = self._n + np.arange(1, lim + 1)
        jumped = (n_at > self.settle) & (lv > self._ltop) & (lv - ref >= self.jump)
        k = first_true((lv > self._lhi) | jumped | (lv < self._llo) | ((lv < self._lsoft) & (ref - lv >= self.drop)))
        if k:
            if self._lr_level is not None:
                self._lr_peak = max(self._lr_peak, float(lr[:k].max()))
                self._lr_level = float(ewma(llr[:k], self._a, self._b, self._lr_level)[-1])
            self._level = float(lv[k - 1])
            self._ref = float(ref[k - 1])
            self._n += k
            self._last_step = int(steps[i + k - 1])
        return k
