"""ZeroFractionDeadUnits: a layer's share of live ReLU units falls to a fraction of its own baseline (dead units)."""

from __future__ import annotations

import numpy as np

from .._events import Kind
from .._validate import check_range
from ._base import Knob
from ._layer_fraction import LayerFraction

#: how many times smaller than its baseline a layer's live share must become: 2.5 leaves the
#: largest fall of any healthy tuning run (1.55x, over the 309 healthy runs of the synthetic, real
#: and development suites that sample activations) a margin of 1.6x, and names a layer going from
#: 5 % to 62 % dead, from 40 % to 76 %, or from nothing to 60 %
RATIO = 2.5


class ZeroFractionDeadUnits(LayerFraction):
    """Flags dead units: a layer's live share ``1 - dead_frac`` fell to ``1 / ratio`` of its own baseline's.

    Input per sample: ``{layer: {"dead_frac": f, ...}}`` (other statistics such as
    ``saturation``, ``mean``, ``var`` are accepted and ignored here), or, for many layers, the
    column form ``{"dead_frac": vector, ...}`` (one value per layer, layers named by position
    unless named by an earlier sample). ``dead_frac`` is the fraction of a layer's units that
    output exactly 0 for every example of the sampled batch. Per layer, as NumPy vectors, a
    baseline (EWMA, weight ``alpha``, of the layer's earlier samples below its limit) gives the
    limit ``1 - (1 - baseline) / ratio``: a layer fires ``dead_units`` when its dead fraction is
    at least its limit for ``patience`` consecutive samples (one by default: one sample is already
    an aggregate over the batch). The limit is the layer's own: a ReLU layer with a fifth of its
    units dead all run long is healthy, and one that jumps from a few percent to 70 % dead has
    lost most of what it had, short of any fixed fraction such as 90 %. A layer fires once per
    excursion (re-armed when it falls back below its limit); no new event within ``cooldown``
    steps of one. ``onset_step`` is the last sample at which the fraction was still within
    ``margin`` of the layer's baseline.

    **Rate**: ``dead_units`` 0 alarms in 301,829 steps of the tuning suites' healthy runs at its defaults
    (``calibration.json``; budget 0.5 per 10,000 steps).
    **Held out**: ``dead_units`` 2 alarms in 879,581 steps of 1,478 held-out healthy runs
    (``calibration.json``).

    Args:
        ratio: how many times smaller than its baseline's the live share must be, > 1.
        patience: consecutive samples at or above the limit, >= 1.
        margin: rise above baseline that ends the calm period, in (0, 1).
        alpha: baseline EWMA weight, in (0, 1].
        cooldown: steps without events after an event, >= 0.

    Example:
        A layer with about 5 % of its units dead whose dead share climbs, then jumps:

        >>> det = ZeroFractionDeadUnits()
        >>> evs = [det.update(activations={"fc1": {"dead_frac": d, "saturation": 0.0}}, step=10 * i)
        ...        for i, d in enumerate([0.05, 0.06, 0.05, 0.2, 0.72, 0.74, 0.75])]
        >>> [(e.kind.value, e.step, e.onset_step, e.layer, round(e.threshold, 3)) for evl in evs for e in evl]
        [('dead_units', 40, 20, 'fc1', 0.633)]
    """

    knob = Knob("ratio", 1.2, 20.0)
    _stat = 0
    _kind = Kind.DEAD_UNITS

    def __init__(self, ratio: float = RATIO, patience: int = 1, margin: float = 0.1,
                 alpha: float = 0.2, cooldown: int = 0) -> None:
        check_range("ratio", ratio, 1, None, lo_open=True)
        self.ratio = ratio
        self._setup(1.0 - 1.0 / ratio, patience, margin, alpha, cooldown)  # the limit of a layer with none dead

    def _limit(self) -> np.ndarray:
        return 1.0 - (1.0 - self._base) / self.ratio  # type: ignore[no-any-return]

    def _message(self, layer: str, value: float, limit: float) -> str:
        return (f"{100 * value:.3g}% of layer {layer}'s ReLU units output exactly 0 for every example of the "
                f"batch: its live units fell to under 1/{self.ratio:g} of its own baseline's (limit "
                f"{100 * limit:.3g}% dead)" + (f", {self.patience} samples in a row" if self.patience > 1 else ""))


__all__ = ["ZeroFractionDeadUnits"]
