"""NeverImprovedPlateau: the loss never improved since its first value (stuck from the start)."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._events import Event
from ._base import Knob
from ._ops import log
from ._plateau import DELTA_MULT, HOLD, PATIENCE, PLATEAU_KEYS, Block, PlateauRule

#: patience windows a run is given before "never improved" counts (e4e4434: "3x patience for
#: stuck-from-start", so that a slow start after warm-up is not a stall)
START_WINDOWS = 3


class NeverImprovedPlateau(PlateauRule):
    """Flags a stall from the start: after ``3 * patience`` values the best never beat the first value.

    On the shared tracker (:mod:`trainsignals.detectors._plateau`) the loss is on a plateau when
    the best smoothed log-loss improved by less than ``delta`` (its noise) over the last
    ``patience`` values. The rule: the best is also within ``delta`` of the run's first loss,
    and at least ``3 * patience`` values were seen (a slow start after warm-up is given that
    long). A run that never learned — a learning rate of 0, a frozen model, labels that do not
    match the inputs — is flagged whatever its other signals say.

    ``onset_step`` is the first value of the plateau. After an event the rule is quiet until the
    best improves by ``delta`` again, and for ``cooldown`` steps. Non-positive and non-finite
    losses are skipped.

    Args:
        patience: values per window, >= 2.
        hold: a new best must hold for this many values, >= 1.
        delta_mult: smallest improvement, in noise scales of the smoothed level, >= 0.
        cooldown: steps after an event without another, >= 0.
        signal: the loss signal read (and named in events).

    Example:
        A loss that only jitters around its first value:

        >>> import numpy as np
        >>> loss = 2.3 * np.exp(np.random.default_rng(0).normal(0, 0.02, 400))
        >>> [(e.step, e.onset_step) for e in NeverImprovedPlateau(patience=60).scan(loss=loss)]
        [(179, 59)]
    """

    knob = Knob("delta_mult", 0.1, 20.0, quieter="lower")

    _state_keys = PLATEAU_KEYS

    def __init__(self, patience: int = PATIENCE, hold: int = HOLD, delta_mult: float = DELTA_MULT,
                 cooldown: int = 0, signal: str = "loss") -> None:
        super().__init__(patience, hold, delta_mult, cooldown, signal)

    def _step(self, x: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0 or not self._level(log(x) if log_x is None else log_x):
            return None
        best, delta = self._checkpoint(step)
        if not self._ready(best, delta):
            return None
        if (self._hist[-self._q - 1] - best >= delta or self._first - best >= delta
                or self._n < START_WINDOWS * self.patience):
            return None
        return self._fire(step, best, delta, "since the start")

    def _fire_mask(self, blk: Block, ctx: dict[str, Any]) -> np.ndarray:
        return ((blk.mid - blk.bb < blk.delta) & (self._first - blk.bb < blk.delta)
                & (self._n + 1 + blk.bidx >= START_WINDOWS * self.patience))


__all__ = ["NeverImprovedPlateau"]
