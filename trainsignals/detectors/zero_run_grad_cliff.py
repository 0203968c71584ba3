"""ZeroRunGradCliff: a layer that had gradients gets exactly none, step after step (vanishing gradients)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._events import Event, Kind, make_event
from .._layers import LayerValues
from .._validate import check_range
from ._base import Detector, Input, _jsonable
from ._ops import first_true

__all__ = ["ZeroRunGradCliff"]

#: exact zeros in a row that fire: a layer left out of the graph for one or two batches comes back; a
#: layer behind saturated or dead units gets zero at every step (the suites' faulty runs that show it:
#: hundreds of steps in a row). No healthy run of the tuning suites has a single zero layer norm.
PATIENCE = 5
#: positive values a layer must show, with no zero among them, before its zeros count: a layer that
#: starts at zero (frozen, or not used yet) has no gradients to lose
WARMUP = 20


class ZeroRunGradCliff(Detector):
    """Flags vanishing gradients by a run of exact zeros: a layer's grad norm, positive so far, is 0 ``patience`` values in a row.

    The other cliff rules (:class:`~trainsignals.MedianGapGradCliff`,
    :class:`~trainsignals.OwnDropGradCliff`) measure decades in ``log10`` and cannot see a grad
    norm of exactly 0; nor can they judge a network whose layers below the median all lost
    their gradients at once. Yet an exact zero is the plainest sign there is: no gradient
    reaches the layer at all, because every unit between it and the loss is saturated (a tanh
    or sigmoid at its limit passes a derivative that rounds to 0) or dead (a ReLU that outputs
    0 for every input).

    Per layer, as NumPy vectors: how many positive values it has shown (up to ``warmup``), how
    many zeros in a row it shows now, and whether a run of zeros ever ended (a layer that
    comes back from zeros is used only on some batches: an unrouted expert, a branch; its
    zeros never fire). A layer fires once, when it reaches ``patience`` zeros in a row after
    ``warmup`` positive values with no zero among them; the event names the layer and how many
    layers are at zero with it, its ``onset_step`` is the step of the first zero of the run.
    No new event within ``cooldown`` steps of one. Non-finite values are not measured (they
    neither extend nor end a run). The rule is not calibrated: no healthy run of the tuning suites
    has a single layer grad norm of exactly 0, so they cannot set ``patience`` (0 alarms over
    every healthy step at any value); :data:`PATIENCE` says where the default comes from.

    Args:
        patience: exact zeros in a row that fire, >= 1.
        warmup: positive values (with no zero among them) a layer needs before its zeros count, >= 1.
        cooldown: steps without events after an event, >= 0.

    Example:
        >>> import numpy as np
        >>> norms = np.tile([1.0, 0.5, 0.3, 0.2], (100, 1))
        >>> norms[60:, :2] = 0.0       # the first two layers get no gradient from step 60 on
        >>> [(e.step, e.onset_step, e.layer) for e in ZeroRunGradCliff().scan(layer_grad_norms=norms)]
        [(64, 60, 'layer0')]
    """

    inputs = (Input("layer_grad_norms"),)
    _state_keys: ClassVar[tuple[str, ...]] = ("names", "pos", "run", "start", "spoiled", "fired", "quiet_until",
                                              "last_step")

    def __init__(self, patience: int = PATIENCE, warmup: int = WARMUP, cooldown: int = 200) -> None:
        check_range("patience", patience, 1, None, integer=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.patience, self.warmup, self.cooldown = patience, warmup, cooldown
        self._reset()

    def _reset(self) -> None:
        self._names: tuple[str, ...] | None = None
        self._pos = np.zeros(0, dtype=np.int64)      # positive values seen (counted up to warmup)
        self._run = np.zeros(0, dtype=np.int64)      # zeros in a row now
        self._start = np.zeros(0, dtype=np.int64)    # the step of the first zero of that run
        self._spoiled = np.zeros(0, dtype=bool)      # a zero came before warmup, or a run of zeros ended
        self._fired = np.zeros(0, dtype=bool)
        self._quiet_until = -1
        self._last_step = -1
        self._warm = False  # every layer past warmup (a cache of the state, not part of it)
        self._open = False  # some layer in a run of zeros (a cache)

    def _get_state(self) -> dict[str, Any]:
        return {k: _jsonable(getattr(self, "_" + k)) for k in self._state_keys}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._names = tuple(state["names"]) if state["names"] is not None else None
        for k in ("pos", "run", "start"):
            setattr(self, "_" + k, np.asarray(state[k], dtype=np.int64))
        self._spoiled = np.asarray(state["spoiled"], dtype=bool)
        self._fired = np.asarray(state["fired"], dtype=bool)
        self._quiet_until, self._last_step = int(state["quiet_until"]), int(state["last_step"])
        self._warm = bool(len(self._pos)) and bool((self._pos >= self.warmup).all())
        self._open = bool(self._run.any())

    @property
    def layer_names(self) -> tuple[str, ...] | None:
        """The layers seen so far (``None`` before the first value)."""
        return self._names

    def _step(self, values: LayerValues, step: int) -> Event | None:
        if self._names is None or len(values.names) != len(self._pos):
            self._names = values.names
            self._reset_layers(len(values.names))
        self._last_step = step
        if self._warm and not self._open and values.low() > 0.0:  # no layer at zero, none was (most steps)
            return None  # the smallest value is computed once per value (the Monitor's range check took it)
        x = values.array
        zero = x == 0.0
        if not self._warm:
            self._spoiled |= zero & (self._pos < self.warmup)
            self._pos += (x > 0.0) & (self._pos < self.warmup)
            self._warm = bool((self._pos >= self.warmup).all())
        if not self._open and not zero.any():  # no layer at zero, none was (most steps)
            return None
        measured = np.isfinite(x)
        self._spoiled |= measured & ~zero & (self._run > 0)  # a run of zeros ended: the layer is used now and then
        self._start = np.where(zero & (self._run == 0), step, self._start)
        self._run = np.where(zero, self._run + 1, np.where(measured, 0, self._run))
        self._open = bool(self._run.any())
        if step <= self._quiet_until:
            return None
        hit = (self._run >= self.patience) & (self._pos >= self.warmup) & ~self._spoiled & ~self._fired
        if not hit.any():
            return None
        self._fired |= hit
        if self.cooldown:
            self._quiet_until = step + self.cooldown
        first = int(np.flatnonzero(hit)[np.argmin(self._start[hit])])
        layer = self._names[first]
        n_zero = int((self._run >= self.patience).sum())
        msg = (f"layer {layer} has had no gradient at all ({int(self._run[first])} grad norms of exactly 0 in a row "
               f"since step {int(self._start[first])}, after {int(self._pos[first])}+ nonzero ones); "
               f"{n_zero} of {len(x)} layers are at 0: every unit between them and the loss is saturated or dead")
        return make_event(Kind.VANISHING_GRADIENT, "warning", step, int(self._start[first]), type(self).__name__,
                          f"layer_grad_norms[{layer}]", float(self._run[first]), float(self.patience), msg,
                          layer=layer)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        """Rows with no zero, once every layer is past warm-up and none is at zero, change nothing."""
        m = arrays[0]
        if not self._warm or self._open or m.shape[1] != len(self._pos):
            return 0
        k = first_true((m[i:j] == 0.0).any(axis=1))
        if k:
            self._last_step = int(steps[i + k - 1])
        return k

    def _reset_layers(self, n: int) -> None:
        """A first value, or a new set of layers: every layer starts unseen."""
        self._pos = np.zeros(n, dtype=np.int64)
        self._run = np.zeros(n, dtype=np.int64)
        self._start = np.zeros(n, dtype=np.int64)
        self._spoiled = np.zeros(n, dtype=bool)
        self._fired = np.zeros(n, dtype=bool)
        self._warm = self._open = False
