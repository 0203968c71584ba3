"""ConfirmedZSpike: a grad-norm jump that the loss or the next value confirms (a lone spike is not an explosion)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._events import Event
from ._base import Input
from ._ewma_jump import HOLD, MIN_RATIO, STILL_FALLING, THRESHOLD, TRACK_KEYS
from .ewma_z_spike import EWMAZSpike

#: how much the loss must rise at the jump's step, over its previous value, to confirm it at once: the
#: smallest jump the loss-spike rule counts (``_ewma_jump.MIN_RATIO``)
LOSS_RESPONSE = MIN_RATIO


class ConfirmedZSpike(EWMAZSpike):
    """Flags a jump of :class:`EWMAZSpike`'s rule that the loss or the next value confirms.

    The rule: a value of ``signal`` (the grad norm) that is anomalous and a jump of at least
    ``min_ratio`` times its level (as for :class:`EWMAZSpike`) is an event when the loss of the same
    step rose at least ``LOSS_RESPONSE`` = 1.5 times its previous value (at once), or else when the
    next value is still at least half the jump above the old level (in log units: ``sqrt(min_ratio)``
    times it; the tracker's ``STILL_FALLING`` fraction, the one that keeps a watch open on a value
    still coming back). Isolated grad-norm spikes of 10-20x with no loss response are common in
    healthy large-model training (``FAILURE_MODES.md``); an explosion moves the loss or is still up
    one value later. A confirmed-by-the-next-value event comes at that value (its ``step``), with
    the jump's step as ``onset_step``; either way its value is the jump's ``z``. The loss is an
    optional input (without it only the next value confirms). Everything else (warm-up, the watch,
    re-arm, ``cooldown`` in steps from the jump) is :class:`EWMAZSpike`'s, with the same parameters;
    ``signal`` may be any scalar but the loss.

    **Rate**: ``grad_explosion`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``grad_explosion`` 6 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Example:
        A grad norm that jumps 20x for one value at step 100, then 20x for good at step 200:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> g = np.exp(rng.normal(0, 0.1, 300))
        >>> g[100] *= 20.0
        >>> g[200:] *= 20.0
        >>> det = ConfirmedZSpike(threshold=6.0, min_ratio=10.0)
        >>> [(e.onset_step, e.step) for e in det.scan(grad_norm=g)]
        [(200, 201)]
    """

    _state_keys: ClassVar[tuple[str, ...]] = (*TRACK_KEYS, "last_event", "cand", "prev_loss")

    def __init__(self, signal: str = "grad_norm", kind: str = "grad_explosion", threshold: float = THRESHOLD,
                 min_ratio: float = MIN_RATIO, direction: str = "up", log: bool = True, cooldown: int = 0,
                 hold: int = HOLD) -> None:
        if signal == "loss":
            raise ValueError("signal: ConfirmedZSpike confirms a jump of another signal by the loss; "
                             "EWMAZSpike watches the loss itself")
        super().__init__(signal, kind, threshold, min_ratio, direction, log, cooldown, hold)
        self.inputs = (Input(signal), Input("loss", required=False))

    def _reset(self) -> None:
        super()._reset()
        self._cand: list[float] | None = None  # the jump waiting for the next value: [x, z, level, step]
        self._prev_loss = -1.0  # the last finite positive loss before this step (-1: none yet)
        self._loss_now = math.nan

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._cand = None if state["cand"] is None else [float(v) for v in state["cand"]]

    def _step(self, x: float, loss: float, step: int, log_x: float | None = None) -> Event | None:
        self._loss_now = loss
        ev = self._track_step(x, step, log_x)
        if loss - loss == 0.0 and loss > 0.0 and x - x == 0.0 and (x > 0.0 or not self.log):
            self._prev_loss = loss  # only at steps whose value the tracker took: a refused step changes nothing
        return ev

    def _on_jump(self, x: float, z: float, mean: float, step: int) -> Event | None:
        if self._cooling(step):
            return None
        level = math.exp(mean) if self.log else mean
        prev = self._prev_loss
        if prev > 0.0 and self._loss_now >= LOSS_RESPONSE * prev:
            return self._jump_event(x, z, level, step, step, f", and the loss rose {self._loss_now / prev:.3g}x with it")
        self._cand = [x, z, level, float(step)]
        return None

    def _on_watched(self, y: float, step: int) -> Event | None:
        cand, self._cand = self._cand, None
        if cand is None:
            return None
        rise = (y - self._ep_ref) * self._ep_sign
        if not self.log:
            rise /= abs(self._ep_ref) + 1e-300
        if rise < STILL_FALLING * self._min_jump:
            return None  # back at the next value, the loss unmoved: a lone spike
        x, z, level, onset = cand
        now = math.exp(y) if self.log else y
        return self._jump_event(x, z, level, int(onset), step,
                                f", and the next value is still {now / level if level != 0 else math.inf:.3g}x")

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        k = self._track_fast(arrays[0], steps, i, j)
        if k:
            seg = arrays[1][i:i + k]
            ok = np.flatnonzero(np.isfinite(seg) & (seg > 0.0))
            if len(ok):
                self._prev_loss = float(seg[ok[-1]])
        return k


__all__ = ["ConfirmedZSpike"]
