"""GradCollapsePlateau: the loss is on a plateau and the grad norm fell, net of the loss."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._events import Event
from .._validate import check_range
from ._base import Knob
from ._plateau import DELTA_MULT, HOLD, PATIENCE, PLATEAU_KEYS, Block, GradPlateauRule

#: default net fall of the grad norm that counts as stuck (CUSUMPlateau's ``stuck_decades`` since e4e4434,
#: "stall stuck-evidence 0.5 decades", chosen on unseen synthetic suites)
STUCK_DECADES = 0.5


class GradCollapsePlateau(GradPlateauRule):
    """Flags a stall: no new best loss for ``patience`` values while the grad norm collapsed.

    The plateau is the shared tracker's (:mod:`trainsignals.detectors._plateau`): the best of the
    smoothed log-loss improved by less than ``delta`` (its noise) over the last ``patience``
    values. The rule: over the last ``2 * patience`` values the grad norm's fast level (EWMA of
    ``log10(grad_norm)``) fell by at least ``stuck_decades``, net of the decades the loss fell over
    the same span (the larger of its best's fall and its smoothed level's) — tiny gradients on a
    loss that did not move. A classifier fitting its data shrinks loss and gradient together: that
    is progress, not a stall, even when its best sits on a lucky low; and a converged run's grad
    norm stays in its band (minibatch noise keeps it up), so it is not flagged either.

    ``onset_step`` is the first value of the plateau. After an event the rule is quiet until the
    best improves by ``delta`` again, and for ``cooldown`` steps. Use ``patience ~ 10 %`` of the
    planned steps (the default suite does this from ``total_steps``). Non-positive and
    non-finite losses are skipped with their grad norm; a missing grad norm is ``nan``.

    **Rate**: ``stall_grad_collapse`` 1 alarm in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``stall_grad_collapse`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        patience: values without improvement before a stall, >= 2.
        stuck_decades: net fall of the grad norm over ``2 * patience`` values that counts, > 0.
        hold: a new best must hold for this many values, >= 1.
        delta_mult: smallest improvement, in noise scales of the smoothed level, >= 0.
        cooldown: steps after an event without another, >= 0.
        signal: the loss signal read (and named in events).

    Example:
        A loss that falls, then freezes at step 300 while the grad norm drops 100x:

        >>> import numpy as np
        >>> rng = np.random.default_rng(1)
        >>> t = np.minimum(np.arange(600), 300)
        >>> loss = 3.0 * np.exp(-t / 150) * np.exp(rng.normal(0, 0.02, 600))
        >>> grad = np.where(np.arange(600) < 300, 1.0, 0.01) * np.exp(rng.normal(0, 0.1, 600))
        >>> [(e.step, e.onset_step) for e in GradCollapsePlateau(patience=60).scan(loss=loss, grad_norm=grad)]
        [(385, 325)]

        A grad norm that stays in its band says nothing (it could be a converged run):

        >>> GradCollapsePlateau(patience=60).scan(loss=loss, grad_norm=np.exp(rng.normal(0, 0.1, 600)))
        []
    """

    knob = Knob("stuck_decades", 0.1, 5.0)

    _state_keys = (*PLATEAU_KEYS, "g", "ghist", "lhist")

    def __init__(self, patience: int = PATIENCE, stuck_decades: float = STUCK_DECADES, hold: int = HOLD,
                 delta_mult: float = DELTA_MULT, cooldown: int = 0, signal: str = "loss") -> None:
        check_range("stuck_decades", stuck_decades, 0, None, lo_open=True)
        self.stuck_decades = stuck_decades
        super().__init__(patience, hold, delta_mult, cooldown, signal)

    def _rule(self, step: int, best: float, delta: float) -> Event | None:
        if not self._ready(best, delta) or self._hist[-self._q - 1] - best >= delta:
            return None
        fell = self._net_fall(best)
        if fell is None or fell < self.stuck_decades:
            return None
        return self._fire(step, best, delta, self._because(best))

    def _fire_mask(self, blk: Block, ctx: dict[str, Any]) -> np.ndarray:
        fell = self._net_fall_mask(blk, ctx)
        if fell is None:
            return np.zeros(len(blk.bidx), dtype=bool)
        with np.errstate(invalid="ignore"):
            return (fell >= self.stuck_decades) & (blk.mid - blk.bb < blk.delta)


__all__ = ["GradCollapsePlateau"]
