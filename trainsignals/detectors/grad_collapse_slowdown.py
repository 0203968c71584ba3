"""GradCollapseSlowdown: progress slowed to a fraction of the window before, as the grad norm collapsed."""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from .._events import Event
from .._validate import check_range
from ._base import Knob
from ._plateau import DELTA_MULT, HOLD, PATIENCE, PLATEAU_KEYS, Block, GradPlateauRule, factor

#: default net grad-norm fall that counts as collapsed (CUSUMPlateau's ``collapse_decades`` since c4f1cb0,
#: tuned on the committed synthetic suite's stalls whose loss keeps creeping down)
COLLAPSE_DECADES = 1.5
#: default fraction of the previous window's progress below which a window is a slowdown
#: (CUSUMPlateau's ``slowdown`` since 17fce61)
SLOWDOWN = 0.25


class GradCollapseSlowdown(GradPlateauRule):
    """Flags a stall by relative improvement: a window brought under ``slowdown`` of the one before.

    On the shared tracker (:mod:`trainsignals.detectors._plateau`), the progress of a window is
    how far the best smoothed log-loss fell in it. The rule: the last ``patience`` values brought
    less than ``slowdown`` times the progress of the ``patience`` values before them, while the
    grad norm's fast level (EWMA of ``log10(grad_norm)``) fell at least ``collapse_decades`` over
    those ``2 * patience`` values, net of the loss's fall (the larger of its best's and its
    smoothed level's). The loss may still creep down: a stall
    whose gradients vanished need not be flat. A schedule's slow-down keeps the grad norm in its
    band, a classifier fitting its data shrinks loss and gradient together: neither is flagged.

    ``onset_step`` is the first value within ``delta`` of the current best. After an event the
    rule is quiet until the best improves by ``delta`` again, and for ``cooldown`` steps.
    Non-positive and non-finite losses are skipped with their grad norm.

    **Rate**: ``stall_slowdown`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``stall_slowdown`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        patience: values per window, >= 2.
        collapse_decades: net fall of the grad norm over ``2 * patience`` values that counts, > 0.
        slowdown: a window bringing less than this fraction of the previous one's progress
            is a stall, in (0, 1).
        hold: a new best must hold for this many values, >= 1.
        delta_mult: smallest improvement, in noise scales of the smoothed level, >= 0.
        cooldown: steps after an event without another, >= 0.
        signal: the loss signal read (and named in events).

    Example:
        A loss whose fall slows 20x at step 300 while the grad norm drops 1000x; the loss still
        creeps down, so the best keeps improving and re-arms the rule, until ``cooldown``:

        >>> import numpy as np
        >>> rng = np.random.default_rng(2)
        >>> t = np.arange(600)
        >>> loss = 3.0 * np.exp(-np.minimum(t, 300) / 100 - np.maximum(t - 300, 0) / 2000)
        >>> loss *= np.exp(rng.normal(0, 0.02, 600))
        >>> grad = np.where(t < 300, 1.0, 1e-3) * np.exp(rng.normal(0, 0.1, 600))
        >>> [(e.step, e.onset_step) for e in GradCollapseSlowdown(patience=60).scan(loss=loss, grad_norm=grad)]
        [(365, 329), (378, 368), (416, 405)]
        >>> [e.step for e in GradCollapseSlowdown(patience=60, cooldown=300).scan(loss=loss, grad_norm=grad)]
        [365]
    """

    knob = Knob("collapse_decades", 0.3, 5.0)

    _state_keys = (*PLATEAU_KEYS, "g", "ghist", "lhist")

    def __init__(self, patience: int = PATIENCE, collapse_decades: float = COLLAPSE_DECADES,
                 slowdown: float = SLOWDOWN, hold: int = HOLD, delta_mult: float = DELTA_MULT,
                 cooldown: int = 0, signal: str = "loss") -> None:
        check_range("collapse_decades", collapse_decades, 0, None, lo_open=True)
        check_range("slowdown", slowdown, 0, 1, lo_open=True, hi_open=True)
        self.collapse_decades = collapse_decades
        self.slowdown = slowdown
        super().__init__(patience, hold, delta_mult, cooldown, signal)

    def _rule(self, step: int, best: float, delta: float) -> Event | None:
        if not self._ready(best, delta):
            return None
        mid = self._hist[-self._q - 1]
        fell = self._net_fall(best)
        if fell is None or fell < self.collapse_decades or mid - best >= self.slowdown * (self._hist[0] - mid):
            return None
        return self._fire(step, best, delta, self._because(best))

    def _what(self, gain: float, best: float, onset: int) -> str:
        before = self._hist[-self._q - 1] - self._hist[0]
        return (f"{self.signal} improved only {factor(gain)} over the last {self.patience} values after "
                f"{factor(-before)} in the {self.patience} before (best {math.exp(best):.4g}, since step {onset})")

    def _fire_mask(self, blk: Block, ctx: dict[str, Any]) -> np.ndarray:
        fell = self._net_fall_mask(blk, ctx)
        if fell is None:
            return np.zeros(len(blk.bidx), dtype=bool)
        with np.errstate(invalid="ignore"):
            return (fell >= self.collapse_decades) & (blk.mid - blk.bb < self.slowdown * (blk.old - blk.mid))


__all__ = ["GradCollapseSlowdown"]
