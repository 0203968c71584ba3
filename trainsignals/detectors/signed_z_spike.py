"""SignedZSpike: a jump of a loss that goes below zero, judged in the loss's own units."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

import numpy as np

from .._events import Event, make_event
from ._base import Knob
from ._ewma_jump import HOLD, MIN_RATIO, THRESHOLD, TRACK_KEYS
from ._ops import before_first_negative
from .ewma_z_spike import EWMAZSpike


class SignedZSpike(EWMAZSpike):
    """Flags a spike of a loss that takes negative values, by a z-score in the loss's own units.

    :class:`EWMAZSpike` judges ``log(loss)``: the right scale for a loss that is positive (a
    jump is a ratio), and undefined for one that is not, so it skips negative values. Objectives
    such as a policy-gradient loss, the negative log-likelihood of a continuous density or a
    negated reward go below zero, where a ratio says nothing. This rule is idle until the first
    negative value; from that value on it watches every finite value with the same tracker and
    the same rule as :class:`EWMAZSpike` in linear mode (``log=False``): a z-score of ``x``
    against an EWMA level and variance judged one step behind, one value at
    ``z >= threshold`` or consecutive values whose CUSUM evidence adds up to it, and a jump of
    at least ``min_ratio - 1`` times the level's magnitude. Warm-up (20 values), the watch after
    a jump and ``cooldown`` are :class:`EWMAZSpike`'s, counted from the first negative value. A
    loss that is never negative never reaches the tracker (a zero does not wake it either: a
    loss that is exactly 0 at times, a hinge or a clipped loss, is non-negative by nature).

    The event is a ``loss_spike`` warning at the jump's step (its ``onset_step``); its value is
    ``z`` against ``threshold``. **Rate:** not calibrated (no knob): the tuning suites hold no
    healthy run with a negative loss. On healthy signed losses drawn fresh by
    ``tests/test_signed_loss.py`` it raises nothing.

    Args:
        signal: the watched signal.
        kind: the :class:`~trainsignals.Kind` value of its events.
        threshold: z-score of a single value that counts as anomalous, > 0.
        min_ratio: smallest jump that counts, >= 1: ``|x - level| >= (min_ratio - 1) * |level|``.
        direction: ``"up"``, ``"down"`` or ``"both"``.
        cooldown: steps after an event during which no event is raised, >= 0.
        hold: values watched after a jump before deciding whether it came back, >= 1.

    Example:
        A policy loss that falls from -1 with small noise and jumps to +2 at step 150:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> loss = -1.0 - np.arange(300) / 300 + rng.normal(0, 0.02, 300)
        >>> loss[150] = 2.0
        >>> [(e.step, e.kind.value) for e in SignedZSpike().scan(loss=loss)]
        [(150, 'loss_spike')]
        >>> SignedZSpike().scan(loss=-loss), EWMAZSpike().scan(loss=loss)   # positive: idle; the log rule skips it
        ([], [])
    """

    #: not calibrated: no healthy run of the tuning suites has a negative loss, so nothing measures
    #: this rule's false-alarm rate there; the threshold is :class:`EWMAZSpike`'s, the same statistic
    knob: ClassVar[Knob | None] = None
    _state_keys: ClassVar[tuple[str, ...]] = (*TRACK_KEYS, "last_event", "signed")

    def __init__(self, signal: str = "loss", kind: str = "loss_spike", threshold: float = THRESHOLD,
                 min_ratio: float = MIN_RATIO, direction: str = "up", cooldown: int = 0, hold: int = HOLD) -> None:
        super().__init__(signal, kind, threshold, min_ratio, direction, False, cooldown, hold)

    def _reset(self) -> None:
        super()._reset()
        self._signed = False  # a negative value was seen: the tracker watches from it on

    def _step(self, x: float, step: int) -> Event | None:
        if not self._signed:
            if not (x < 0.0 and x - x == 0.0):  # positive, zero or not finite: the log rule's domain, or nothing
                self._last_step = step
                return None
            self._signed = True
        return self._track_step(x, step)

    def _on_jump(self, x: float, z: float, mean: float, step: int) -> Event | None:
        if self._cooling(step):
            return None
        self._last_event = step
        word = "jumped" if z > 0 else "dropped"
        msg = (f"{self.signal} {word} to {x:.4g} from its recent level {mean:.4g} ({x - mean:+.3g}, z={z:.1f}), "
               "judged in its own units: it goes below zero, where a ratio means nothing")
        return make_event(self._kind, "warning", step, step, type(self).__name__, self.signal, z, self.threshold,
                          msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        if self._signed:
            return self._track_fast(arrays[0], steps, i, j)
        k = before_first_negative(arrays[0], i, j)
        if k:
            self._last_step = int(steps[i + k - 1])
        return k


__all__ = ["SignedZSpike"]
