"""FlatFractionSaturation: most of a layer's tanh/sigmoid outputs sit in the flat region (saturation)."""

from __future__ import annotations

from .._events import Kind
from ._base import Knob
from ._layer_fraction import LayerFraction

#: most units in the flat region: half of a layer's outputs saturated
SATURATION_THRESHOLD = 0.5


class FlatFractionSaturation(LayerFraction):
    """Flags saturation: a layer whose fraction of outputs at a tanh/sigmoid limit stayed at least ``threshold``.

    Input per sample: ``{layer: {"saturation": f, ...}}`` (other statistics such as
    ``dead_frac``, ``mean``, ``var`` are accepted and ignored here), or, for many layers, the
    column form ``{"saturation": vector, ...}`` (one value per layer, layers named by position
    unless named by an earlier sample). Per layer, as NumPy vectors: a layer fires
    ``saturation`` when its saturated fraction (of all outputs, not per unit) is at least
    ``threshold`` for ``patience`` consecutive samples (a saturated layer passes almost no
    gradient back). A layer fires once per excursion (re-armed when it falls back below the
    threshold); no new event within ``cooldown`` steps of one. ``onset_step`` is the last
    sample at which the fraction was still within ``margin`` of the layer's own running
    baseline (EWMA, weight ``alpha``, of the samples below threshold).

    **Rate**: ``saturation`` 0 alarms in 301,829 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``saturation`` 0 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        threshold: saturated fraction that fires, in (0, 1].
        patience: consecutive samples at or above the threshold, >= 1.
        margin: rise above baseline that ends the calm period, in (0, 1).
        alpha: baseline EWMA weight, in (0, 1].
        cooldown: steps without events after an event, >= 0.

    Example:
        >>> det = FlatFractionSaturation()
        >>> evs = [det.update(activations={"tanh1": {"saturation": s}}, step=10 * i)
        ...        for i, s in enumerate([0.1, 0.1, 0.2, 0.6, 0.7, 0.8, 0.8])]
        >>> [(e.kind.value, e.step, e.onset_step, e.layer) for evl in evs for e in evl]
        [('saturation', 50, 20, 'tanh1')]
    """

    knob = Knob("threshold", 0.2, 1.0, log=False)
    _stat = 1
    _kind = Kind.SATURATION

    def __init__(self, threshold: float = SATURATION_THRESHOLD, patience: int = 3, margin: float = 0.1,
                 alpha: float = 0.2, cooldown: int = 0) -> None:
        self._setup(threshold, patience, margin, alpha, cooldown)

    def _message(self, layer: str, value: float, limit: float) -> str:
        return f"{100 * value:.3g}% of layer {layer}'s units are saturated ({self.patience} samples in a row)"


__all__ = ["FlatFractionSaturation"]
