"""LevelShift: a signal that jumped and did not come back (the run is lost, not hiccuping)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range, check_signal
from ._base import Detector, Input, Knob
from ._ewma_jump import HOLD, MIN_RATIO, PEAK_RATIO, THRESHOLD, TRACK_KEYS, EWMAJump
from ._interval import MIN_HOLD


class LevelShift(EWMAJump, Detector):
    """Flags a jump that stayed: ``hold`` values after it, the signal has not come back.

    The rule: a jump is found as :class:`EWMAZSpike` finds one (a z-score/CUSUM of ``log(x)``
    against an EWMA level judged one step behind, at least ``min_ratio`` times the level; the
    tracker of :mod:`trainsignals.detectors._ewma_jump`), or, for a z-outlier, as
    :class:`PeakRatioSpike` does (``peak_ratio`` times the largest of the previous 100 values: a
    small loss with heavy-tailed noise jumps and stays without a large z-score), then the next ``hold`` values are
    watched against the level ``m0`` and scale ``s0`` from before the jump. The jump *came back*
    when a value of the watch's second half is within ``min_ratio`` of ``m0``, or within two
    pre-jump scales of it (a burst that settles on a plateau well above ``m0`` has not come back,
    however far below the burst the plateau is). It is *still coming back* when the median of
    the second half is at least ``sqrt(min_ratio)`` below that of the first: ``hold`` more values
    are watched. Otherwise it *stayed*: a ``critical`` event of ``kind``, with ``onset_step`` at
    the jump and the second half's median over ``m0`` as its value (``min_ratio`` as threshold).

    **Re-arm.** The median of the second half becomes the level, so the detector is armed again
    at once, against the new normal; a jump that came back leaves the old level in place.

    **Rate**: ``loss_shift`` 0 alarms in 304,819 steps; ``grad_shift`` 0 alarms in 304,819 steps of the tuning
    suites' healthy runs at its defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``loss_shift`` 0 alarms, ``grad_shift`` 0 alarms in 879,581 steps of 1,478 held-out healthy
    runs (``calibration.json``).

    Args:
        signal: the watched signal.
        kind: the :class:`~trainsignals.Kind` value of its events.
        threshold: z-score of a single value that counts as a jump's evidence, > 0.
        min_ratio: smallest jump factor that counts, >= 1.
        direction: ``"up"``, ``"down"`` or ``"both"``.
        log: watch ``log(x)`` (for positive signals spanning orders of magnitude).
        hold: values watched after a jump before deciding whether it came back, >= 1.
        peak_ratio: the peak test's ratio, > 1 (log mode, upward); None: z-score evidence only.

    Example:
        A network that dies: the loss bursts to 1e6, then sits on a plateau 6x its old level
        (below the burst, but not back; the fall from the burst reads as "still coming back",
        so the verdict comes after a second watch of ``hold`` values):

        >>> import numpy as np
        >>> rng = np.random.default_rng(0)
        >>> loss = 0.4 * np.exp(rng.normal(0, 0.3, 300))
        >>> loss[150:156] = [150.0, 15.0, 20.0, 1e3, 1e6, 3e4]
        >>> loss[156:] = 2.3 * np.exp(rng.normal(0, 0.05, 144))
        >>> [(e.step, e.kind.value, e.severity, e.onset_step) for e in LevelShift().scan(loss=loss)]
        [(170, 'divergence', 'critical', 150)]

        A spike that comes back is not a level shift:

        >>> loss = 0.4 * np.exp(rng.normal(0, 0.3, 300))
        >>> loss[150:153] = 50.0
        >>> LevelShift().scan(loss=loss)
        []
    """

    knob = Knob("min_ratio", 1.1, 1000.0)
    spans = {"hold": MIN_HOLD}

    _state_keys = TRACK_KEYS

    def __init__(self, signal: str = "loss", kind: str = "divergence", threshold: float = THRESHOLD,
                 min_ratio: float = MIN_RATIO, direction: str = "up", log: bool = True, hold: int = HOLD,
                 peak_ratio: float | None = PEAK_RATIO) -> None:
        check_signal("signal", signal)
        check_choice("kind", kind, tuple(k.value for k in Kind))
        check_range("threshold", threshold, 0, None, lo_open=True)
        check_range("min_ratio", min_ratio, 1, None)
        check_choice("direction", direction, ("up", "down", "both"))
        check_range("hold", hold, 1, None, integer=True)
        if peak_ratio is not None:
            check_range("peak_ratio", peak_ratio, 1, None, lo_open=True)
        self.signal, self.kind, self.threshold, self.min_ratio = signal, kind, threshold, min_ratio
        self.direction, self.log, self.hold, self.peak_ratio = direction, bool(log), hold, peak_ratio
        self.inputs = (Input(signal),)
        self._kind = Kind(kind)
        self._track_init(peak_ratio)
        self._reset()

    def _reset(self) -> None:
        self._track_reset()

    def _set_state(self, state: dict[str, Any]) -> None:
        super()._set_state(state)
        self._track_set_state(state)

    def _on_jump(self, x: float, z: float, mean: float, step: int) -> Event | None:
        return None  # the watch starts; the verdict comes hold values later

    def _on_stayed(self, level: float, ref: float, onset: int, step: int) -> Event | None:
        now = math.exp(level) if self.log else level
        before = math.exp(ref) if self.log else ref
        ratio = now / before if before != 0 else math.inf
        msg = (f"{self.signal} jumped at step {onset} and did not come back: {step - onset} steps later its median "
               f"level {now:.4g} is {ratio:.3g}x the level {before:.4g} before the jump")
        return make_event(self._kind, "critical", step, onset, type(self).__name__, self.signal, ratio,
                          self.min_ratio, msg)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        return self._track_fast(arrays[0], steps, i, j)
