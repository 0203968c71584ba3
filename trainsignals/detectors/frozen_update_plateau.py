"""FrozenUpdatePlateau: the loss is on a plateau and the update ratio fell by orders of magnitude."""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Sequence
from itertools import islice
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from .._events import Event
from .._validate import check_range
from ._base import Input, Knob
from ._ops import ewma, log, log10
from ._plateau import DELTA_MULT, HOLD, PATIENCE, PLATEAU_KEYS, Block, PlateauRule

#: default fall of the update-ratio level that counts as frozen (CUSUMPlateau's ``ratio_decades`` since
#: 4f73fd2: from the healthy band 1e-4..1e-3 to the stuck region below 1e-6)
RATIO_DECADES = 2.0
#: default weight of each measured update ratio in its level (CUSUMPlateau's ``ratio_alpha`` since 4f73fd2)
RATIO_ALPHA = 0.5
#: an update ratio of 0 (no update at all) counts as this (CUSUMPlateau's floor since 9dbceb6)
TINY = 1e-30


class FrozenUpdatePlateau(PlateauRule):
    """Flags a stall: no new best loss for ``patience`` values while the weights stopped moving.

    On the shared tracker (:mod:`trainsignals.detectors._plateau`) the loss is on a plateau when
    the best smoothed log-loss improved by less than ``delta`` (its noise) over the last
    ``patience`` values. The update ratio (``||dw|| / ||w||``, optional second input, any
    cadence; ``nan`` when not measured) has a level: an EWMA of ``log10(update_ratio)``, weight
    ``ratio_alpha`` per measured value, taken at the tracker's checkpoints (0 counts as 1e-30).
    The rule: that level ``patience`` values ago (where the plateau began), now, and at every
    checkpoint in between, is at least ``ratio_decades`` below its level ``2 * patience`` values
    ago — a learning rate cut by orders of magnitude, dead units. A converged run looks the same
    on the loss and the grad norm but keeps its update ratio; a schedule's decay does not do this
    either (a cosine or linear tail falls a fraction of a decade over a window, a step decay one
    decade, and a warm restart lifts the ratio back).

    ``onset_step`` is the first value of the plateau. After an event the rule is quiet until the best improves
    by ``delta`` again, and for ``cooldown`` steps. Non-positive and non-finite losses are skipped with their
    update ratio; a non-finite ratio counts as not measured. **Rate**: ``stall_frozen_updates`` 0 alarms in
    304,819 tuning healthy steps, 1 in 879,581 held-out ones (1,478 runs; ``calibration.json``; budget 0.5 per
    10,000).

    Args:
        patience: values without improvement before a stall, >= 2.
        ratio_decades: fall of the update-ratio level that counts, > 0.
        ratio_alpha: weight of each measured update ratio in its level, in (0, 1].
        hold: a new best must hold for this many values, >= 1.
        delta_mult: smallest improvement, in noise scales of the smoothed level, >= 0.
        cooldown: steps after an event without another, >= 0.
        signal: the loss signal read (and named in events).

    Example:
        A loss that falls, then freezes at step 300 as its update ratio drops 4 decades:

        >>> import numpy as np
        >>> rng = np.random.default_rng(1)
        >>> t = np.minimum(np.arange(600), 300)
        >>> loss = 3.0 * np.exp(-t / 150) * np.exp(rng.normal(0, 0.02, 600))
        >>> ratio = np.where(np.arange(600) < 300, 1e-3, 1e-7) * np.exp(rng.normal(0, 0.1, 600))
        >>> [(e.step, e.onset_step) for e in FrozenUpdatePlateau(patience=60).scan(loss=loss, update_ratio=ratio)]
        [(385, 325)]
        >>> FrozenUpdatePlateau(patience=60).scan(loss=loss, update_ratio=np.full(600, 1e-3))  # converged
        []
    """

    knob = Knob("ratio_decades", 0.5, 6.0)

    _state_keys = (*PLATEAU_KEYS, "r", "rl", "rhist")

    def __init__(self, patience: int = PATIENCE, ratio_decades: float = RATIO_DECADES,
                 ratio_alpha: float = RATIO_ALPHA, hold: int = HOLD, delta_mult: float = DELTA_MULT,
                 cooldown: int = 0, signal: str = "loss") -> None:
        check_range("ratio_decades", ratio_decades, 0, None, lo_open=True)
        check_range("ratio_alpha", ratio_alpha, 0, 1, lo_open=True)
        self.ratio_decades, self.ratio_alpha = ratio_decades, ratio_alpha
        self._ra, self._rb = float(ratio_alpha), 1.0 - float(ratio_alpha)
        super().__init__(patience, hold, delta_mult, cooldown, signal)

    def _extra_inputs(self) -> tuple[Input, ...]:
        return (Input("update_ratio", required=False),)

    def _reset(self) -> None:
        super()._reset()
        self._r: float | None = None  # the latest update ratio not yet folded into the level
        self._rl: float | None = None
        self._rhist: deque[float | None] = deque(maxlen=2 * self._q + 1)  # the level at each checkpoint

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._rhist = deque(state["rhist"], maxlen=2 * self._q + 1)

    def _step(self, x: float, ratio: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        if ratio - ratio == 0.0:
            self._r = ratio
        if not self._level(log(x) if log_x is None else log_x):
            return None
        best, delta = self._checkpoint(step)
        r = self._r
        if r is not None:  # fold the latest update ratio since the last checkpoint into its level
            self._r = None
            if r >= 0.0:
                lr = log10(r if r > TINY else TINY)
                if self._rl is None:  # the first one: the history so far had no level
                    self._rl = lr
                    self._rhist.extend([None] * (len(self._hist) - 1))
                else:
                    self._rl = self._ra * lr + self._rb * self._rl
        rl, rh, q = self._rl, self._rhist, self._q
        if rl is not None:
            rh.append(rl)
        if not self._ready(best, delta) or self._hist[-q - 1] - best >= delta or rl is None:
            return None
        then, mid, d = rh[0], rh[-q - 1], self.ratio_decades
        if then is None or mid is None or then - mid < d or then - rl < d or then - self._top() < d:
            return None
        return self._fire(step, best, delta, f"after the update ratio fell {then - mid:.1f} decades "
                          f"(now {10 ** rl:.2g}): the weights barely move")

    def _top(self) -> float:
        """The highest update-ratio level from ``patience`` values ago to now (inf: one is missing)."""
        return max(math.inf if v is None else v for v in islice(self._rhist, len(self._rhist) - self._q - 1, None))

    # -- the batch path ---------------------------------------------------------------------
    def _ratios(self, arrays: Sequence[np.ndarray], i: int, j: int) -> np.ndarray:
        rr = arrays[1][i:j]
        if not np.isfinite(rr[~np.isnan(rr)]).all():
            rr = np.where(np.isfinite(rr), rr, np.nan)  # a non-finite ratio counts as not measured
        return rr

    def _fast_extra(self, arrays: Sequence[np.ndarray], i: int, j: int, ctx: dict[str, Any]) -> np.ndarray | None:
        if self._rl is None and self._r is not None:
            return None
        ctx["rr"] = rr = self._ratios(arrays, i, j)
        return np.zeros(j - i, dtype=bool) if self._rl is not None else ~np.isnan(rr)  # the first ratio: scalar

    def _levels(self, blk: Block, rr: np.ndarray) -> np.ndarray:
        """The update-ratio level after each checkpoint of the block (what the scalar path gives)."""
        bidx, nb = blk.bidx, len(blk.bidx)
        if self._rl is None:
            return np.full(nb, np.nan)  # no level yet, and no ratio in this stretch
        if not nb:
            return np.empty(0)
        r = rr[:blk.lim]
        prevb = np.concatenate(([-1], bidx[:-1]))
        latest = np.maximum.accumulate(np.where(np.isnan(r), -1, np.arange(blk.lim)))[bidx]
        vals = np.where(latest > prevb, r[np.maximum(latest, 0)], np.nan)  # fresh since the last checkpoint
        if self._r is not None and not vals[0] == vals[0]:
            vals[0] = self._r  # the one pending from before this stretch
        with np.errstate(invalid="ignore"):
            fold = vals >= 0.0
        if not fold.any():
            return np.full(nb, self._rl)
        lv = ewma(np.log10(np.maximum(vals[fold], TINY)), self._ra, self._rb, self._rl)
        cnt = np.cumsum(fold)
        return np.where(cnt > 0, lv[np.maximum(cnt - 1, 0)], self._rl)

    def _fire_mask(self, blk: Block, ctx: dict[str, Any]) -> np.ndarray:
        fire = np.zeros(len(blk.bidx), dtype=bool)
        if self._rl is None:
            return fire
        q, d = self._q, self.ratio_decades
        ctx["rlev"] = rlev = self._levels(blk, ctx["rr"])
        rext = np.concatenate((np.array([np.nan if v is None else v for v in self._rhist]), rlev))
        last = len(rext) - 1
        with np.errstate(invalid="ignore"):
            then = rext[np.clip(blk.pos - 2 * q, 0, last)]
            low = (blk.full & (blk.mid - blk.bb < blk.delta) & (then - rext[np.clip(blk.pos - q, 0, last)] >= d)
                   & (then - rlev >= d))
            if low.any():  # then the highest level since mid must be that low too
                top = sliding_window_view(rext, q + 1).max(axis=1)[np.clip(blk.pos - q, 0, None)]
                fire = low & (then - top >= d)
        return fire

    def _fast_keep(self, blk: Block, k: int, nu: int, used: np.ndarray, ctx: dict[str, Any]) -> None:
        rr = ctx["rr"]
        if self._rl is not None:
            rlev = ctx["rlev"] if "rlev" in ctx else self._levels(blk, rr)
            m = 2 * self._q + 1
            self._rhist.extend(rlev[max(0, nu - m):nu].tolist())
            if nu:
                self._rl = float(rlev[nu - 1])
        seen = np.flatnonzero(~np.isnan(rr[:k]))
        cp = int(blk.bidx[nu - 1]) if nu else -1  # the last checkpoint consumed
        if len(seen) and seen[-1] > cp:
            self._r = float(rr[seen[-1]])  # a ratio not yet folded
        elif nu:
            self._r = None


__all__ = ["FrozenUpdatePlateau"]
