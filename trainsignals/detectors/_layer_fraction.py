"""The per-layer fraction rules' shared machinery: a fraction of a layer's units past a threshold, for a run of samples.

:class:`LayerFraction` reads one row of an activation sample (:class:`~trainsignals.signals.LayerStats`:
``dead_frac`` or ``saturation``, one value per layer) and keeps, per layer and as NumPy vectors, how
many samples in a row the fraction has been at least its limit (``threshold``, or one per layer
that a rule derives from the layer's own baseline), whether that excursion was reported, and a
running baseline (an EWMA, weight ``alpha``, of the samples below the limit) whose
last step within ``margin`` of the fraction is the event's ``onset_step``. A layer fires once per
excursion (re-armed when it falls back below the limit); no new event within ``cooldown`` steps
of one. The rules (:class:`~trainsignals.ZeroFractionDeadUnits`,
:class:`~trainsignals.FlatFractionSaturation`) say which row, which kind, and the message.
"""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ..signals import ACT_STATS, LayerStats
from ._base import Detector, Input, _jsonable

__all__ = ["LayerFraction"]


class LayerFraction(Detector):
    """Base of the per-layer fraction rules (see the module docstring).

    A subclass sets ``_stat`` (the row of :data:`~trainsignals.signals.ACT_STATS`) and ``_kind``,
    calls :meth:`_setup` from its constructor and implements :meth:`_message`; it may give each
    layer its own limit (:meth:`_limit`), no lower than ``threshold``.
    """

    inputs = (Input("activations"),)
    _stat: ClassVar[int]
    _kind: ClassVar[Kind]
    _state_keys: ClassVar[tuple[str, ...]] = ("n", "names", "base", "run", "fired", "calm", "quiet_until",
                                              "last_step")
    threshold: float
    patience: int
    margin: float
    alpha: float
    cooldown: int

    def _setup(self, threshold: float, patience: int, margin: float, alpha: float, cooldown: int) -> None:
        check_range("threshold", threshold, 0, 1, lo_open=True)
        check_range("patience", patience, 1, None, integer=True)
        check_range("margin", margin, 0, 1, lo_open=True, hi_open=True)
        check_range("alpha", alpha, 0, 1, lo_open=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.threshold, self.patience, self.margin, self.alpha, self.cooldown = (
            threshold, patience, margin, alpha, cooldown)
        self._near_d = margin / (1.0 - alpha) if alpha < 1 else np.inf  # see _step's quiet path
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._names: tuple[str, ...] | None = None
        self._base = np.zeros(0)
        self._run = np.zeros(0, dtype=np.int64)   # samples in a row at or above the threshold
        self._fired = np.zeros(0, dtype=bool)     # this excursion was reported
        self._calm = np.zeros(0, dtype=np.int64)  # the last sample within margin of the baseline
        self._quiet_until = -1
        self._last_step = -1
        self._clear = True  # no run and nothing fired (a cache of the state, not part of it)
        self._d, self._near = np.zeros(0), np.zeros(0, dtype=bool)  # scratch vectors of the quiet path

    def _get_state(self) -> dict[str, Any]:
        return {k: _jsonable(getattr(self, "_" + k)) for k in self._state_keys}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._n, self._last_step = int(state["n"]), int(state["last_step"])
        self._quiet_until = int(state["quiet_until"])
        self._names = tuple(state["names"]) if state["names"] is not None else None
        self._base = np.array(state["base"], dtype=np.float64)
        self._run = np.asarray(state["run"], dtype=np.int64)
        self._fired = np.asarray(state["fired"], dtype=bool)
        self._calm = np.asarray(state["calm"], dtype=np.int64)
        self._clear = not (self._run.any() or self._fired.any())

    @property
    def layer_names(self) -> tuple[str, ...] | None:
        """The layers seen so far (``None`` before the first sample)."""
        return self._names

    def _step(self, sample: LayerStats, step: int) -> list[Event] | None:
        if self._names is None:
            self._names = sample.names
        self._last_step = step
        x = sample.matrix[self._stat]
        if self._n == 0 or len(self._base) != len(x):
            self._base = np.where(np.isfinite(x), x, 0.0)
            self._run = np.zeros(len(x), dtype=np.int64)
            self._fired = np.zeros(len(x), dtype=bool)
            self._calm = np.full(len(x), step, dtype=np.int64)
            self._clear = True
        self._n += 1
        if not len(x):
            return None
        lows, highs = sample.ranges()  # computed once per sample, shared with the checks and the other rules
        lo = lows[self._stat]
        if highs[self._stat] < self.threshold and lo - lo == 0.0:  # every layer measured and below (most samples)
            # in place, five passes: with d = x - base, the new base is base + alpha*d and
            # x - new base = (1 - alpha)*d, so x is within margin of the new base where d <= margin / (1 - alpha)
            base, d, near = self._base, self._d, self._near  # this rule's own vectors
            if len(d) != len(x):
                d, near = self._d, self._near = np.empty(len(x)), np.empty(len(x), dtype=bool)
            np.subtract(x, base, out=d)
            np.less_equal(d, self._near_d, out=near)
            np.copyto(self._calm, step, where=near)
            np.multiply(d, self.alpha, out=d)
            np.add(base, d, out=base)
            if not self._clear:
                self._run.fill(0)
                self._fired.fill(False)
                self._clear = True
            return None
        return self._excursion(x, step)

    def _limit(self) -> float | np.ndarray:
        """The fraction at or above which a layer is past the limit: ``threshold`` for every layer, or
        one per layer (from the layers' baselines) never below ``threshold``, the bound the quiet path checks.
        """
        return self.threshold

    def _excursion(self, x: np.ndarray, step: int) -> list[Event] | None:
        ok = np.isfinite(x)
        lim = self._limit()
        above = ok & (x >= lim)
        below = ok & ~above
        self._base = np.where(below, self.alpha * np.where(ok, x, 0.0) + (1 - self.alpha) * self._base, self._base)
        self._calm = np.where(ok & (x <= self._base + self.margin), step, self._calm)
        self._run = np.where(above, self._run + 1, np.where(below, 0, self._run))
        self._fired &= ~below
        self._clear = False
        if self.cooldown and step <= self._quiet_until:
            return None
        fire = (self._run >= self.patience) & ~self._fired
        if not fire.any():
            return None
        self._fired |= fire
        if self.cooldown:
            self._quiet_until = step + self.cooldown
        assert self._names is not None
        events = []
        for c in np.flatnonzero(fire).tolist():
            layer = self._names[c]
            v, at = float(x[c]), float(lim if isinstance(lim, float) else lim[c])
            events.append(make_event(self._kind, "warning", step, int(self._calm[c]), type(self).__name__,
                                     f"activations[{layer}].{ACT_STATS[self._stat]}", v, at,
                                     self._message(layer, v, at), layer=layer))
        return events

    def _message(self, layer: str, value: float, limit: float) -> str:
        """The event's message for ``layer`` at fraction ``value`` (its limit ``limit``)."""
        raise NotImplementedError
