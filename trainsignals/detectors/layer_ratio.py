"""LayerUpdateRatio: one layer's updates out of line with the rest (frozen, or far too violent)."""

from __future__ import annotations

from typing import Any, ClassVar

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_range
from ._base import Input, Knob, _jsonable
from ._factors import times
from ._layer_levels import CALM, LayerLevels, center, middle, plain_levels


class LayerUpdateRatio(LayerLevels):
    """Flags a layer whose update ratio ``||dw|| / ||w||`` left the band the other layers keep.

    The update ratio says how fast each layer learns: about 1e-4..1e-3 a step in a healthy run,
    and roughly the same across layers. A layer whose ratio falls orders of magnitude below the
    others has stopped learning (frozen by mistake, its units dead, its gradients gone); one
    whose ratio rises orders of magnitude above the others is being thrown around (its weights
    collapsed toward zero, or its learning rate is far too high for it).

    Per layer, on ``u = log10(ratio)``, a fast and a slow EWMA (weights ``fast``, ``slow``) are
    kept as NumPy vectors, as in :class:`~trainsignals.MedianGapGradCliff`. A layer is

    * **low** (``update_ratio_low``) when its fast level is at least ``gap`` decades below the
      median layer, or it fell ``drop`` decades below its own slow level while the median layer
      fell less than one decade (a schedule that lowers every layer's rate moves the median
      too: that is not one layer's fault);
    * **high** (``update_ratio_high``) when its fast level is at least ``gap`` decades above
      the median layer, or it rose ``drop`` decades above its own slow level while the median
      layer rose less than one decade.

    The comparison with the median layer counts only while the median layer itself held (moved
    less than one decade from its own history in the other direction): when most layers stop
    updating (a network killed by a learning-rate blow-up), the one still moving is not "far
    too violent", and when most layers' updates blow up, the one left is not "frozen".

    Both are judged against the run's own layers, so the detector is scale-free. The event names
    the worst layer; ``onset_step`` is the last step that layer was within one decade of both
    references on that side. A layer is reported once per side until it comes back within one
    decade of both references (a layer frozen for good is one event, not one per window). No
    event in the first ``warmup`` values (zero-initialised biases start with huge ratios that
    settle within a few steps), and a layer's own history (the slow EWMA) starts at the end of
    warm-up; quiet for ``cooldown`` values after an event. A layer whose
    ratio is 0 (no update at all) counts as ``1e-30``.

    **Rate**: not measured: no healthy run of the tuning suites records per-layer update ratios
    (``calibration.json``, entry ``layer_update_ratio``; budget 0.5 per 10,000 steps).

    Args:
        gap: decades from the median layer that fire, > 0.
        drop: decades from the layer's own history that fire (the median layer having moved
            less than one), > 0.
        fast: weight of the fast EWMA, in (0, 1].
        slow: weight of the slow EWMA, in (0, fast).
        warmup: values before any event, >= 1.
        cooldown: values without events after an event, >= 0.

    Example:
        Four layers learning at 1e-3..3e-4 a step; from step 100 the first one is frozen
        (its ratio drops to 1e-8), from step 300 the last one's updates blow up to 0.5:

        >>> import numpy as np
        >>> ratios = np.tile([1e-3, 5e-4, 3e-4, 4e-4], (500, 1))
        >>> ratios[100:, 0] = 1e-8
        >>> ratios[300:, 3] = 0.5
        >>> [(e.kind.value, e.step, e.layer) for e in LayerUpdateRatio().scan(layer_update_ratios=ratios)]
        [('update_ratio_low', 101, 'layer0'), ('update_ratio_high', 303, 'layer3')]
    """

    _state_keys: ClassVar[tuple[str, ...]] = ("n", "names", "f", "s", "calm", "calm_hi", "rep", "rep_hi",
                                              "cooldown_left", "last_step")
    knob = Knob("gap", 1.0, 10.0, log=False)
    inputs = (Input("layer_update_ratios"),)
    _floor = 1e-30  # a layer that did not move at all is a very low ratio, not a missing one

    def __init__(self, gap: float = 3.0, drop: float = 2.0, fast: float = 0.3, slow: float = 0.01,
                 warmup: int = 10, cooldown: int = 0) -> None:
        check_range("gap", gap, 0, None, lo_open=True)
        check_range("drop", drop, 0, None, lo_open=True)
        self.gap, self.drop = gap, drop
        self._setup(fast, slow, warmup, cooldown)

    def _reset(self) -> None:
        super()._reset()
        self._cooldown_left = 0  # values (not steps) still quiet after an event
        self._calm_hi = np.zeros(0, dtype=np.int64)
        self._rep = np.zeros(0, dtype=bool)     # layers reported low, not yet back in band
        self._rep_hi = np.zeros(0, dtype=bool)  # layers reported high, not yet back in band

    def _get_state(self) -> dict[str, Any]:
        st = {k: _jsonable(getattr(self, "_" + k)) for k in self._state_keys if k not in ("f", "s")}
        return {**st, "f": plain_levels(self._fs[0]), "s": plain_levels(self._fs[1])}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._n, self._last_step = int(state["n"]), int(state["last_step"])
        self._cooldown_left = int(state["cooldown_left"])
        self._names = tuple(state["names"]) if state["names"] is not None else None
        self._fs = np.array([state["f"], state["s"]], dtype=np.float64).reshape(2, -1)
        self._calm = np.asarray(state["calm"], dtype=np.int64)
        self._calm_hi = np.asarray(state["calm_hi"], dtype=np.int64)
        self._rep = np.asarray(state["rep"], dtype=bool)
        self._rep_hi = np.asarray(state["rep_hi"], dtype=bool)

    def _first(self, n_layers: int, step: int) -> None:
        self._calm_hi = np.full(n_layers, step, dtype=np.int64)
        self._rep = np.zeros(n_layers, dtype=bool)
        self._rep_hi = np.zeros(n_layers, dtype=bool)

    def _check(self, step: int, lo: float, top: float) -> Event | None:
        if self._n <= self.warmup:  # the own history starts after warm-up (first ratios are atypical)
            self._fs = np.stack([self._fs[0], self._fs[0]])
        f, s = self._fs
        med = center(f)
        below, dropped = med - f, s - f
        in_lo = np.maximum(below, dropped) < CALM
        in_hi = np.maximum(-below, -dropped) < CALM
        np.copyto(self._calm, step, where=in_lo)
        np.copyto(self._calm_hi, step, where=in_hi)
        self._rep &= ~in_lo
        self._rep_hi &= ~in_hi
        if self._cooldown_left:
            self._cooldown_left -= 1
            return None
        if self._n <= self.warmup:
            return None
        med_drop = center(dropped)  # > 0: the median layer fell below its own history
        for low, far, moved, calm, rep, med_moved in (
                (True, below, dropped, self._calm, self._rep, med_drop),
                (False, -below, -dropped, self._calm_hi, self._rep_hi, -med_drop)):
            out = far >= self.gap if -med_moved < CALM else np.zeros(len(far), dtype=bool)
            if med_moved < CALM:
                out |= moved >= self.drop
            out &= ~rep
            if out.any():
                rep |= out
                return self._event(step, low, out, far, moved, calm)
        return None

    def _event(self, step: int, low: bool, out: np.ndarray, far: np.ndarray, moved: np.ndarray,
               calm: np.ndarray) -> Event:
        worst = int(np.argmax(np.where(out, np.maximum(far, moved), -np.inf)))
        assert self._names is not None
        layer = self._names[worst]
        self._cooldown_left = self.cooldown
        n_out = int(out.sum())
        side = "below" if low else "above"
        msg = (f"update ratio of layer {layer} is {times(float(self._fs[0, worst]), base10=True)}: {far[worst]:.1f} decades "
               f"{side} the median layer and {moved[worst]:.1f} {side} its own history"
               + (": it has stopped learning" if low else ": its updates are far too violent")
               + (f" ({n_out} layers)" if n_out > 1 else ""))
        return make_event(Kind.UPDATE_RATIO_LOW if low else Kind.UPDATE_RATIO_HIGH, "warning", step,
                          int(calm[worst]), type(self).__name__, f"layer_update_ratios[{layer}]",
                          float(max(far[worst], moved[worst])), self.gap, msg, layer=layer)

    def _fast_rows(self, mat: np.ndarray, steps: np.ndarray, i: int) -> int:
        """Vectorised advance over rows while no event is possible (all finite, every layer in band)."""
        gaps = None if self._cooldown_left else self._gaps(mat, steps, i)
        if gaps is None:
            return 0
        f, s, below, dropped = gaps
        lim = len(f)
        med_drop = middle(dropped)
        med_rise = -med_drop
        calm = (below < CALM) & (dropped < CALM)
        calm_hi = (-below < CALM) & (-dropped < CALM)
        # a reported layer stays reported until its first calm row
        rep = self._rep[None, :] & ~np.logical_or.accumulate(calm, axis=0)
        rep_hi = self._rep_hi[None, :] & ~np.logical_or.accumulate(calm_hi, axis=0)
        out_lo = (((below >= self.gap) & (med_rise[:, None] < CALM))
                  | ((dropped >= self.drop) & (med_drop[:, None] < CALM)))
        out_hi = (((-below >= self.gap) & (med_drop[:, None] < CALM))
                  | ((-dropped >= self.drop) & (med_rise[:, None] < CALM)))
        hit = ((out_lo & ~rep) | (out_hi & ~rep_hi)).any(axis=1)
        k = int(np.argmax(hit)) if hit.any() else lim
        if k:
            st = steps[i:i + k]
            self._calm = np.maximum(self._calm, np.where(calm[:k], st[:, None], -1).max(axis=0))
            self._calm_hi = np.maximum(self._calm_hi, np.where(calm_hi[:k], st[:, None], -1).max(axis=0))
            self._rep = rep[k - 1].copy()
            self._rep_hi = rep_hi[k - 1].copy()
            self._advance(f, s, st)
        return k


__all__ = ["LayerUpdateRatio"]
