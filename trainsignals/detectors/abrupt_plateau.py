"""AbruptPlateau: no new best loss for ``patience`` values right after clear progress (loss only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event
from .._validate import check_range
from ._base import Input, Knob
from ._ops import column_log, log
from ._plateau import DELTA_MULT, HOLD, PATIENCE, PLATEAU_KEYS, Block, PlateauRule

#: default progress (in ``delta``) the window before the plateau must show (CUSUMPlateau's
#: ``progress_mult`` since c9205b5, where the grad-norm evidence took over the other runs)
PROGRESS_MULT = 10.0


class AbruptPlateau(PlateauRule):
    """Flags a stall on the loss alone: progress stopped abruptly, no new best for ``patience`` values.

    On the shared tracker (:mod:`trainsignals.detectors._plateau`) the loss is on a plateau when
    the best smoothed log-loss improved by less than ``delta`` (its noise) over the last
    ``patience`` values. The rule: the ``patience`` values before the plateau brought at least
    ``progress_mult * delta``. A converging run slows down smoothly — by the time a whole window
    brings less than ``delta``, the window before brought little too — so the patience rule fires
    only on a run that was still making clear progress when it stopped.

    The loss cannot tell a frozen run from a converged one that stopped sharply; the grad norm
    can. So the rule is for runs without one: it is quiet for good once a grad norm has been seen
    (:class:`~trainsignals.GradCollapsePlateau` and :class:`~trainsignals.GradCollapseSlowdown`
    judge those runs). ``onset_step`` is the first value of the plateau. After an event the rule
    is quiet until the best improves by ``delta`` again, and for ``cooldown`` steps.

    **Rate**: ``stall_abrupt`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``stall_abrupt`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        patience: values without improvement before a stall, >= 2.
        progress_mult: progress (in ``delta``) the window before must show, >= 1.
        hold: a new best must hold for this many values, >= 1.
        delta_mult: smallest improvement, in noise scales of the smoothed level, >= 0.
        cooldown: steps after an event without another, >= 0.
        signal: the loss signal read (and named in events).

    Example:
        A loss that falls, then freezes at step 300:

        >>> import numpy as np
        >>> rng = np.random.default_rng(1)
        >>> t = np.minimum(np.arange(600), 300)
        >>> loss = 3.0 * np.exp(-t / 150) * np.exp(rng.normal(0, 0.02, 600))
        >>> [(e.step, e.onset_step) for e in AbruptPlateau(patience=60).scan(loss=loss)]
        [(385, 325)]
        >>> AbruptPlateau(patience=60).scan(loss=loss, grad_norm=np.ones(600))  # the grad norm's call
        []
    """

    knob = Knob("progress_mult", 2.0, 1000.0)

    _state_keys = (*PLATEAU_KEYS, "grad_seen")

    def __init__(self, patience: int = PATIENCE, progress_mult: float = PROGRESS_MULT, hold: int = HOLD,
                 delta_mult: float = DELTA_MULT, cooldown: int = 0, signal: str = "loss") -> None:
        check_range("progress_mult", progress_mult, 1, None)
        self.progress_mult = progress_mult
        super().__init__(patience, hold, delta_mult, cooldown, signal)

    def _extra_inputs(self) -> tuple[Input, ...]:
        return (Input("grad_norm", required=False),)

    def _reset(self) -> None:
        super()._reset()
        self._grad_seen = False

    def _step(self, x: float, grad: float, step: int, log_x: float | None = None) -> Event | None:
        self._last_step = step
        if self._grad_seen or x - x != 0.0 or x <= 0.0:
            return None
        if grad - grad == 0.0 and grad > 0.0:
            self._grad_seen = True  # from now on a grad-norm rule's call
            return None
        if not self._level(log(x) if log_x is None else log_x):
            return None
        best, delta = self._checkpoint(step)
        if not self._ready(best, delta):
            return None
        mid = self._hist[-self._q - 1]
        if mid - best >= delta or self._hist[0] - mid < self.progress_mult * delta:
            return None
        return self._fire(step, best, delta, "after clear progress before")

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._grad_seen:  # nothing left to do
            self._last_step = int(steps[j - 1])
            return j - i
        return super()._fast(arrays, steps, i, j)

    def _fast_extra(self, arrays: Sequence[np.ndarray], i: int, j: int, ctx: dict[str, Any]) -> np.ndarray | None:
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.asarray(np.isfinite(column_log(arrays[1], i, j, base10=True)))  # a grad norm appearing: scalar

    def _fire_mask(self, blk: Block, ctx: dict[str, Any]) -> np.ndarray:
        return (blk.mid - blk.bb < blk.delta) & (blk.old - blk.mid >= self.progress_mult * blk.delta)


__all__ = ["AbruptPlateau"]
