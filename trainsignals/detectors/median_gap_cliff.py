"""MedianGapGradCliff: a layer's gradients vanish, orders of magnitude below the median layer's."""

from __future__ import annotations

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Input, Knob
from ._layer_levels import LayerLevels, cliff_message


class MedianGapGradCliff(LayerLevels):
    """Flags the vanishing-gradient "cliff": a layer's grad norm ``gap`` decades below the median layer's.

    Per layer, on ``u = log10(norm)``, a fast and a slow EWMA (weights ``fast``, ``slow``) are
    kept as NumPy vectors (:class:`~trainsignals.detectors._layer_levels.LayerLevels`: no
    Python loop over layers). A layer is on the cliff when its fast level is at least ``gap``
    decades below the median layer's fast level: judged against the run's own layers, so the
    rule is scale-free, and a schedule that lowers every layer's gradients moves the median
    with them. The event names the worst layer (the farthest from the median layer or its own
    history); ``onset_step`` is the last step that layer was within one decade of both. No
    event in the first ``warmup`` values; no new event within ``cooldown`` steps of one. A
    grad norm of 0 is not measured (that layer keeps its levels).

    **Rate**: ``layer_cliff_gap`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``layer_cliff_gap`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        gap: decades below the median layer that fire, > 0.
        fast: weight of the fast EWMA, in (0, 1].
        slow: weight of the slow EWMA (the onset's own-history reference), in (0, fast).
        warmup: values before any event, >= 1.
        cooldown: steps without events after an event, >= 0.

    Example:
        >>> import numpy as np
        >>> norms = np.tile([1.0, 0.5, 0.3, 0.2], (200, 1))
        >>> norms[100:, 0] = 1e-6
        >>> [(e.step, e.layer) for e in MedianGapGradCliff().scan(layer_grad_norms=norms)]
        [(102, 'layer0')]
    """

    knob = Knob("gap", 1.0, 10.0, log=False)
    inputs = (Input("layer_grad_norms"),)

    def __init__(self, gap: float = 3.0, fast: float = 0.3, slow: float = 0.01, warmup: int = 20,
                 cooldown: int = 200) -> None:
        check_range("gap", gap, 0, None, lo_open=True)
        self.gap = self._least = gap
        self._setup(fast, slow, warmup, cooldown)

    def _judge(self, step: int, below: np.ndarray, dropped: np.ndarray) -> Event | None:
        hit = below >= self.gap
        if not hit.any():
            return None
        worst, layer = self._worst(hit, below, dropped)
        return make_event(Kind.VANISHING_GRADIENT, "warning", step, int(self._calm[worst]), type(self).__name__,
                          f"layer_grad_norms[{layer}]", float(below[worst]), self.gap,
                          cliff_message(layer, self._fs[0], below, dropped, worst, int(hit.sum())), layer=layer)

    def _hits(self, below: np.ndarray, dropped: np.ndarray) -> np.ndarray:
        return np.asarray((below >= self.gap).any(axis=1))


__all__ = ["MedianGapGradCliff"]
