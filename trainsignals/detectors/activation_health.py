"""ActivationHealth: dead ReLU units and saturated tanh/sigmoid units, per layer."""

from __future__ import annotations

from typing import Any

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ..signals import ACT_STATS as STATS
from ..signals import LayerStats
from ._base import Detector, Input, _jsonable


class ActivationHealth(Detector):
    """Flags layers whose units died (ReLU outputs exactly 0) or saturated (tanh/sigmoid at their limits).

    Input per sample: ``{layer: {"dead_frac": f, "saturation": f, ...}}`` (other statistics
    such as ``mean``/``var`` are accepted and ignored here), or, for many layers, the column
    form ``{"dead_frac": vector, "saturation": vector}`` (one value per layer, layers named by
    position unless named by an earlier sample). Per layer and statistic, as NumPy
    vectors: a layer fires ``dead_units`` when its dead fraction is at least
    ``dead_threshold`` (a layer > 90 % dead contributes almost nothing) for ``dead_patience``
    consecutive samples — one by default: a unit counts as dead only when it is 0 for every
    example of the sampled batch, so one sample is already an aggregate over the batch — and
    ``saturation`` when its saturated fraction (of all outputs, not per unit) is at least
    ``saturation_threshold`` (most units in the flat region) for ``patience`` samples. A
    layer fires once per excursion (re-armed when it falls back below the threshold).
    ``onset_step`` is the last sample at which the fraction was still within ``margin`` of
    the layer's own running baseline (EWMA, weight ``alpha``, of the samples below threshold).

    Args:
        dead_threshold: dead fraction that fires, in (0, 1].
        saturation_threshold: saturated fraction that fires, in (0, 1].
        patience: consecutive samples above the saturation threshold, >= 1.
        dead_patience: consecutive samples above the dead threshold, >= 1.
        margin: rise above baseline that ends the calm period, in (0, 1).
        alpha: baseline EWMA weight, in (0, 1].

    Example:
        >>> det = ActivationHealth()
        >>> evs = [det.update(activations={"fc1": {"dead_frac": d, "saturation": 0.0}}, step=10 * i)
        ...        for i, d in enumerate([0.3, 0.3, 0.5, 0.8, 0.95, 0.97, 0.99])]
        >>> [(e.kind.value, e.step, e.onset_step, e.layer) for evl in evs for e in evl]
        [('dead_units', 40, 10, 'fc1')]
    """

    inputs = (Input("activations"),)
    _state_keys = ("n", "names", "base", "run", "fired", "calm", "last_step")

    def __init__(self, dead_threshold: float = 0.9, saturation_threshold: float = 0.5, patience: int = 3,
                 margin: float = 0.1, alpha: float = 0.2, dead_patience: int = 1) -> None:
        check_range("dead_threshold", dead_threshold, 0, 1, lo_open=True)
        check_range("saturation_threshold", saturation_threshold, 0, 1, lo_open=True)
        check_range("patience", patience, 1, None, integer=True)
        check_range("dead_patience", dead_patience, 1, None, integer=True)
        check_range("margin", margin, 0, 1, lo_open=True, hi_open=True)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        self.dead_threshold = dead_threshold
        self.saturation_threshold = saturation_threshold
        self.patience = patience
        self.dead_patience = dead_patience
        self._need = np.array([[dead_patience], [patience]])
        self.margin = margin
        self.alpha = alpha
        self._thr = np.array([[dead_threshold], [saturation_threshold]])
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._names: tuple[str, ...] | None = None
        self._base = np.zeros((2, 0))
        self._run = np.zeros((2, 0), dtype=np.int64)
        self._fired = np.zeros((2, 0), dtype=bool)
        self._calm = np.zeros((2, 0), dtype=np.int64)
        self._last_step = -1

    def _set_state(self, state: dict[str, Any]) -> None:
        self._n = int(state["n"])
        self._names = tuple(state["names"]) if state["names"] is not None else None
        L = 0 if self._names is None else len(self._names)
        self._base = np.asarray(state["base"], dtype=np.float64).reshape(2, L)
        self._run = np.asarray(state["run"], dtype=np.int64).reshape(2, L)
        self._fired = np.asarray(state["fired"], dtype=bool).reshape(2, L)
        self._calm = np.asarray(state["calm"], dtype=np.int64).reshape(2, L)
        self._last_step = int(state["last_step"])

    def _get_state(self) -> dict[str, Any]:
        return {k: _jsonable(getattr(self, "_" + k)) for k in self._state_keys}

    @property
    def layer_names(self) -> tuple[str, ...] | None:
        """The layers seen so far (``None`` before the first sample)."""
        return self._names

    def _step(self, sample: LayerStats, step: int) -> list[Event]:
        if self._names is None:
            self._names = sample.names
        return self._sample(sample.matrix, step)

    def _sample(self, mat: np.ndarray, step: int) -> list[Event]:
        self._last_step = step
        if self._n == 0 or self._base.shape[1] != mat.shape[1]:
            L = mat.shape[1]
            self._base = np.where(np.isfinite(mat), mat, 0.0)
            self._run = np.zeros((2, L), dtype=np.int64)
            self._fired = np.zeros((2, L), dtype=bool)
            self._calm = np.full((2, L), step, dtype=np.int64)
        self._n += 1
        if not (mat >= self._thr).any() and np.isfinite(mat).all():  # the common, quiet case
            self._base = self.alpha * mat + (1 - self.alpha) * self._base
            np.copyto(self._calm, step, where=mat <= self._base + self.margin)
            if self._fired.any() or self._run.any():
                self._run.fill(0)
                self._fired.fill(False)
            return []
        ok = np.isfinite(mat)
        above = ok & (mat >= self._thr)
        below = ok & ~above
        self._base = np.where(below, self.alpha * np.where(ok, mat, 0.0) + (1 - self.alpha) * self._base, self._base)
        self._calm = np.where(ok & (mat <= self._base + self.margin), step, self._calm)
        self._run = np.where(above, self._run + 1, np.where(below, 0, self._run))
        self._fired &= ~below
        fire = (self._run >= self._need) & ~self._fired
        if not fire.any():
            return []
        self._fired |= fire
        assert self._names is not None
        events = []
        for r, c in zip(*np.nonzero(fire)):
            layer = self._names[c]
            v = float(mat[r, c])
            if r == 0:
                kind, thr = Kind.DEAD_UNITS, self.dead_threshold
                msg = (f"{100 * v:.3g}% of layer {layer}'s ReLU units output exactly 0 for every example of "
                       "the batch" + (f" ({self.dead_patience} samples in a row)" if self.dead_patience > 1 else ""))
            else:
                kind, thr = Kind.SATURATION, self.saturation_threshold
                msg = f"{100 * v:.3g}% of layer {layer}'s units are saturated ({self.patience} samples in a row)"
            events.append(make_event(kind, "warning", step, int(self._calm[r, c]), type(self).__name__,
                                     f"activations[{layer}].{STATS[r]}", v, thr, msg, layer=layer))
        return events
