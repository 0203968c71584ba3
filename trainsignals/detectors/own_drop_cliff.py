"""OwnDropGradCliff: a layer's gradients fall orders of magnitude below their own history, alone."""

from __future__ import annotations

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Input, Knob
from ._layer_levels import CALM, LayerLevels, cliff_message, middle


class OwnDropGradCliff(LayerLevels):
    """Flags the vanishing-gradient "cliff": a layer's grad norm fell ``drop`` decades while the median layer held.

    Per layer, on ``u = log10(norm)``, a fast and a slow EWMA (weights ``fast``, ``slow``) are
    kept as NumPy vectors (:class:`~trainsignals.detectors._layer_levels.LayerLevels`: no
    Python loop over layers). A layer is on the cliff when its fast level dropped at least
    ``drop`` decades below its own slow level while the median layer's drop stayed under one
    decade: one layer lost its gradients, not the whole network (a schedule or a converging
    run lowers every layer's gradients together), even where the fall leaves the layer short
    of :class:`~trainsignals.MedianGapGradCliff`'s gap to the median layer. The event names the worst layer (the farthest from its own history or the median layer);
    ``onset_step`` is the last step that layer was within one decade of both. No event in the
    first ``warmup`` values; no new event within ``cooldown`` steps of one. A grad norm of 0
    is not measured (that layer keeps its levels).

    Args:
        drop: decades below the layer's own history that fire, > 0.
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
        hit = dropped >= self.drop
        if not hit.any() or float(middle(dropped)) >= CALM:  # no layer fell, or the median layer did too
            return None
        worst, layer = self._worst(hit, below, dropped)
        return make_event(Kind.VANISHING_GRADIENT, "warning", step, int(self._calm[worst]), type(self).__name__,
                          f"layer_grad_norms[{layer}]", float(dropped[worst]), self.drop,
                          cliff_message(layer, self._fs[0], below, dropped, worst, int(hit.sum())), layer=layer)

    def _hits(self, below: np.ndarray, dropped: np.ndarray) -> np.ndarray:
        return np.asarray(((dropped >= self.drop) & (middle(dropped)[:, None] < CALM)).any(axis=1))


__all__ = ["OwnDropGradCliff"]
