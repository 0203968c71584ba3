"""NeverImprovedPlateau: the loss never improved since its first value (stuck from the start)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event
from ._base import Input, Knob
from ._ops import NEVER, first_true, log
from ._plateau import DELTA_MULT, HOLD, PATIENCE, PLATEAU_KEYS, Block, PlateauRule
from ._val_gap import MIN_DELTA

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
    match the inputs — is flagged whatever its other signals say. When the validation loss is
    measured (``val_loss``, optional), a run whose validation loss set a new best (by the
    overfitting rules' ``MIN_DELTA``, 0.1 %) within the last ``patience`` values is learning,
    however slowly, under a training loss too noisy to show it (a regression's minibatch MSE):
    the rule waits.

    ``onset_step`` is the first value of the plateau. After an event the rule is quiet until the
    best improves by ``delta`` again, and for ``cooldown`` steps. Non-positive and non-finite
    losses are skipped.

    **Rate**: ``stall_never_improved`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``stall_never_improved`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

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

    _state_keys = (*PLATEAU_KEYS, "val_best", "val_best_n")

    def __init__(self, patience: int = PATIENCE, hold: int = HOLD, delta_mult: float = DELTA_MULT,
                 cooldown: int = 0, signal: str = "loss") -> None:
        super().__init__(patience, hold, delta_mult, cooldown, signal)

    def _extra_inputs(self) -> tuple[Input, ...]:
        return (Input("val_loss", required=False),)

    def _reset(self) -> None:
        super()._reset()
        self._val_best = 0.0  # the best validation loss, and the count of losses when it was set
        self._val_best_n = NEVER

    def _step(self, x: float, val: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if x - x != 0.0 or x <= 0.0:
            return None
        checkpoint = self._level(log(x) if log_x is None else log_x)
        if val - val == 0.0 and val > 0.0 and (self._val_best_n == NEVER or val < self._val_best * (1 - MIN_DELTA)):
            self._val_best, self._val_best_n = val, self._n
        if not checkpoint:
            return None
        best, delta = self._checkpoint(step)
        if not self._ready(best, delta):
            return None
        if (self._hist[-self._q - 1] - best >= delta or self._first - best >= delta
                or self._n < START_WINDOWS * self.patience or self._n - self._val_best_n < self.patience):
            return None
        return self._fire(step, best, delta, "since the start")

    def _fast_extra(self, arrays: Sequence[np.ndarray], i: int, j: int, ctx: dict[str, Any]) -> int:
        val = arrays[1][i:j]
        return first_true(val == val)  # a validation is the scalar path's

    def _fire_mask(self, blk: Block, ctx: dict[str, Any]) -> np.ndarray:
        n_at = self._n + 1 + blk.bidx
        return ((blk.mid - blk.bb < blk.delta) & (self._first - blk.bb < blk.delta)
                & (n_at >= START_WINDOWS * self.patience) & (n_at - self._val_best_n >= self.patience))


__all__ = ["NeverImprovedPlateau"]
