"""ZeroFractionDeadUnits: most of a layer's ReLU units output exactly 0 for every example (dead units)."""

from __future__ import annotations

from .._events import Kind
from ._base import Knob
from ._layer_fraction import LayerFraction

#: a layer > 90 % dead contributes almost nothing to the network's output
DEAD_THRESHOLD = 0.9


class ZeroFractionDeadUnits(LayerFraction):
    """Flags dead units: a layer whose fraction of units that output exactly 0 for the whole batch reached ``threshold``.

    Input per sample: ``{layer: {"dead_frac": f, ...}}`` (other statistics such as
    ``saturation``, ``mean``, ``var`` are accepted and ignored here), or, for many layers, the
    column form ``{"dead_frac": vector, ...}`` (one value per layer, layers named by position
    unless named by an earlier sample). Per layer, as NumPy vectors: a layer fires
    ``dead_units`` when its dead fraction is at least ``threshold`` for ``patience``
    consecutive samples — one by default: a unit counts as dead only when it is 0 for every
    example of the sampled batch, so one sample is already an aggregate over the batch. A
    layer fires once per excursion (re-armed when it falls back below the threshold); no new
    event within ``cooldown`` steps of one. ``onset_step`` is the last sample at which the
    fraction was still within ``margin`` of the layer's own running baseline (EWMA, weight
    ``alpha``, of the samples below threshold).

    Args:
        threshold: dead fraction that fires, in (0, 1].
        patience: consecutive samples at or above the threshold, >= 1.
        margin: rise above baseline that ends the calm period, in (0, 1).
        alpha: baseline EWMA weight, in (0, 1].
        cooldown: steps without events after an event, >= 0.

    Example:
        >>> det = ZeroFractionDeadUnits()
        >>> evs = [det.update(activations={"fc1": {"dead_frac": d, "saturation": 0.0}}, step=10 * i)
        ...        for i, d in enumerate([0.3, 0.3, 0.5, 0.8, 0.95, 0.97, 0.99])]
        >>> [(e.kind.value, e.step, e.onset_step, e.layer) for evl in evs for e in evl]
        [('dead_units', 40, 10, 'fc1')]
    """

    knob = Knob("threshold", 0.5, 1.0, log=False)
    _stat = 0
    _kind = Kind.DEAD_UNITS

    def __init__(self, threshold: float = DEAD_THRESHOLD, patience: int = 1, margin: float = 0.1,
                 alpha: float = 0.2, cooldown: int = 0) -> None:
        self._setup(threshold, patience, margin, alpha, cooldown)

    def _message(self, layer: str, value: float) -> str:
        return (f"{100 * value:.3g}% of layer {layer}'s ReLU units output exactly 0 for every example of the batch"
                + (f" ({self.patience} samples in a row)" if self.patience > 1 else ""))


__all__ = ["ZeroFractionDeadUnits"]
