"""OwnDropGradCliff: a layer's gradients fall orders of magnitude below their own history while another layer's hold."""

from __future__ import annotations

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Input, Knob
from ._layer_levels import CALM, LayerLevels, cliff_message


class OwnDropGradCliff(LayerLevels):
    """Flags the vanishing-gradient "cliff": a layer's grad norm fell ``drop`` decades further than the least-fallen layer's.

    Per layer, on ``u = log10(norm)``, a fast and a slow EWMA (weights ``fast``, ``slow``) are
    kept as NumPy vectors (:class:`~trainsignals.detectors._layer_levels.LayerLevels`: no
    Python loop over layers); a layer's *fall* is its slow level minus its fast level. A layer
    is on the cliff when its fall is at least ``drop`` decades plus the fall of the layer that
    fell least, and that layer stayed within one decade of its own history: part of the network
    lost its gradients, not the whole of it. That part may be most of a deep net (a vanishing
    gradient takes every layer below the one that saturated or shrank), so the rule does not ask
    the median layer to hold (:class:`~trainsignals.MedianGapGradCliff` compares a layer with the
    median layer instead). When every layer falls together (a schedule, a run interpolating its
    data to zero loss), each at its own pace, the layers lie a decade or two apart on the way
    down: the least-fallen layer's own fall is added to ``drop`` so that spread does not fire.
    The event names the worst layer (the farthest from its own history or the median layer);
    ``onset_step`` is the last step that layer was within one decade of both. No event in the
    first ``warmup`` values; no new event within ``cooldown`` steps of one. A grad norm of 0
    is not measured (that layer keeps its levels).

    **Rate**: ``layer_cliff_drop`` 0 alarms in 304,819 steps of the tuning suites' healthy runs at its
    defaults (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``layer_cliff_drop`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        drop: decades a layer must fall below its own history, beyond the least-fallen layer's fall, > 0.
        fast: weight of the fast EWMA, in (0, 1].
        slow: weight of the slow EWMA (the layer's own history), in (0, fast).
        warmup: values before any event, >= 1.
        cooldown: steps without events after an event, >= 0.

    Example:
        >>> import numpy as np
        >>> norms = np.tile([1.0, 0.5, 0.3, 0.2], (300, 1))
        >>> norms[200:, 0] = 3e-3
        >>> [(e.step, e.layer) for e in OwnDropGradCliff().scan(layer_grad_norms=norms)]
        [(205, 'layer0')]
    """

    knob = Knob("drop", 1.0, 10.0, log=False)
    inputs = (Input("layer_grad_norms"),)

    def __init__(self, drop: float = 2.0, fast: float = 0.3, slow: float = 0.01, warmup: int = 20,
                 cooldown: int = 200) -> None:
        check_range("drop", drop, 0, None, lo_open=True)
        self.drop = self._least = drop
        self._setup(fast, slow, warmup, cooldown)

    def _judge(self, step: int, below: np.ndarray, dropped: np.ndarray) -> Event | None:
        least = float(dropped.min())
        hit = dropped >= self.drop + max(least, 0.0)
        if not hit.any() or least >= CALM:  # no layer fell that far, or every layer fell
            return None
        worst, layer = self._worst(hit, below, dropped)
        return make_event(Kind.VANISHING_GRADIENT, "warning", step, int(self._calm[worst]), type(self).__name__,
                          f"layer_grad_norms[{layer}]", float(dropped[worst]), self.drop,
                          cliff_message(layer, self._fs[0], below, dropped, worst, int(hit.sum())), layer=layer)

    def _hits(self, below: np.ndarray, dropped: np.ndarray) -> np.ndarray:
        least = dropped.min(axis=1)[:, None]
        return np.asarray(((dropped >= self.drop + np.maximum(least, 0.0)) & (least < CALM)).any(axis=1))


__all__ = ["OwnDropGradCliff"]
