"""EWMAZSpike: a value whose z-score against its own EWMA level says it jumped."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range, check_signal
from ._base import Detector, Input, Knob
from ._ewma_jump import HOLD, MIN_RATIO, THRESHOLD, TRACK_KEYS, EWMAJump
from ._factors import times
from ._interval import MIN_HOLD


class EWMAZSpike(EWMAJump, Detector):
    """Flags a value that jumps far above (or below) its exponentially weighted recent level.

    The rule: a z-score of ``log(x)`` (or ``x`` when ``log=False``) against an EWMA level and
    variance judged one step behind, with the evidence of consecutive values summed by a CUSUM
    (the tracker of :mod:`trainsignals.detectors._ewma_jump`, shared with :class:`LevelShift`).
    A value fires when it is *anomalous* (one value at ``z >= threshold``, or consecutive ones
    whose z-scores exceed ``0.5*threshold`` by ``0.5*threshold`` in total) and a jump of at least
    ``min_ratio`` times the level. The bar follows the run's own tail: once the run has shown and
    taken back a value at ``z > threshold / 1.5``, it is 1.5 times the largest such z, for a lone
    value and for the CUSUM sum of consecutive ones alike (``RECORD``: heavy-tailed noise, bursts
    of two or three high batches included, is judged against its own worst wobble; Gaussian noise
    almost never raises the bar). Nothing fires during the first 20 values. The event reports ``z``
    against ``threshold``; its ``onset_step`` is its own step.

    **Re-arm.** After a jump the detector watches the next ``hold`` values and raises no new
    event until the watch decides: the value came back (re-armed at the old level), or it stayed
    (the new level is the median of the watch's second half: re-armed there, silently;
    :class:`LevelShift` reports that case). ``cooldown`` adds a number of *steps* after an event
    without a new one (0 by default: the watch already holds events back).

    **Rate**: ``loss_spike`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``loss_spike`` 18 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        signal: the watched signal.
        kind: the :class:`~trainsignals.Kind` value of its events.
        threshold: z-score of a single value that counts as anomalous, > 0.
        min_ratio: smallest jump factor that counts, >= 1 (in linear mode: ``x >= min_ratio*m``).
        direction: ``"up"``, ``"down"`` or ``"both"``.
        log: watch ``log(x)`` (for positive signals spanning orders of magnitude).
        cooldown: steps after an event during which no event is raised, >= 0.
        hold: values watched after a jump before deciding whether it came back; also the
            longest run of anomalous values before the level is re-based, >= 1.

    Example:
        A loss that falls with small noise, then jumps 4x for two steps at step 60:

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> loss = 2.0 * np.exp(-np.arange(100) / 80) * np.exp(rng.normal(0, 0.02, 100))
        >>> loss[60:62] *= 4.0
        >>> [(e.step, e.kind.value, e.severity) for e in EWMAZSpike().scan(loss=loss)]
        [(60, 'loss_spike', 'warning')]

        The same loss stepping up 4x for good at step 60: one event, then quiet at the new level:

        >>> loss[62:] *= 4.0
        >>> [e.step for e in EWMAZSpike().scan(loss=loss)]
        [60]
    """

    knob: ClassVar[Knob | None] = Knob("threshold", 3.0, 30.0)
    spans = {"hold": MIN_HOLD}

    _state_keys: ClassVar[tuple[str, ...]] = (*TRACK_KEYS, "last_event")

    def __init__(self, signal: str = "loss", kind: str = "loss_spike", threshold: float = THRESHOLD,
                 min_ratio: float = MIN_RATIO, direction: str = "up", log: bool = True, cooldown: int = 0,
                 hold: int = HOLD) -> None:
        check_signal("signal", signal)
        check_choice("kind", kind, tuple(k.value for k in Kind))
        check_range("threshold", threshold, 0, None, lo_open=True)
        check_range("min_ratio", min_ratio, 1, None)
        check_choice("direction", direction, ("up", "down", "both"))
        check_range("cooldown", cooldown, 0, None, integer=True)
        check_range("hold", hold, 1, None, integer=True)
        self.signal, self.kind, self.threshold, self.min_ratio = signal, kind, threshold, min_ratio
        self.direction, self.log, self.cooldown, self.hold = direction, bool(log), cooldown, hold
        self.inputs = (Input(signal),)
        self._kind = Kind(kind)
        self._track_init()
        self._reset()

    def _reset(self) -> None:
        self._track_reset()
        self._last_event = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._track_set_state(state)

    def _on_jump(self, x: float, z: float, mean: float, step: int) -> Event | None:
        if self._cooling(step):
            return None
        return self._jump_event(x, z, math.exp(mean) if self.log else mean, step, step)

    def _cooling(self, step: int) -> bool:
        """Whether a jump at ``step`` falls within ``cooldown`` steps of the last event."""
        return self._last_event >= 0 and step - self._last_event <= self.cooldown

    def _jump_event(self, x: float, z: float, level: float, onset: int, step: int, why: str = "") -> Event:
        """The event of a jump to ``x`` from ``level`` at step ``onset``, reported at ``step``."""
        self._last_event = onset
        # the ratio in log space where both are positive: 1e+300 over 1e-300 is 1e+600x, not infx
        ratio = times(math.log(x) - math.log(level)) if x > 0.0 and level > 0.0 else \
            f"{x / level if level != 0 else math.inf:.3g}"
        word = "jumped" if (self.direction != "down" and z > 0) else "dropped"
        msg = f"{self.signal} {word} to {x:.4g}, {ratio}x its recent level {level:.4g} (z={z:.1f}){why}"
        return make_event(self._kind, "warning", step, onset, type(self).__name__, self.signal, z,
                          self.threshold, msg)

    def _on_stayed(self, level: float, ref: float, onset: int, step: int) -> Event | None:
        return None  # re-based silently: LevelShift reports a jump that stayed

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        return self._track_fast(arrays[0], steps, i, j)

