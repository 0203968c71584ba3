"""LayerGradCliff: some layers' gradients vanish while the others stay healthy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._events import Event, Kind, make_event
from .._layers import LayerValues
from .._validate import check_range
from ..signals import layers
from ._base import Detector, Input, Knob, _jsonable
from ._ops import lfilter


def as_named_vector(name: str, value: Any, names: tuple[str, ...] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """A per-layer value as a float vector and its layer names (see :func:`trainsignals.signals.layers`)."""
    lv = layers(name, value, names)
    return lv.array, lv.names


class LayerGradCliff(Detector):
    """Flags the vanishing-gradient "cliff": some layers' grad norms orders of magnitude below the rest.

    Per layer, on ``u = log10(norm)``, a fast and a slow EWMA (weights ``fast``, ``slow``) are
    kept as NumPy vectors (no Python loop over layers). A layer is on the cliff when its fast
    level is at least ``gap`` decades below the median layer, or it dropped ``drop`` decades
    below its own slow level while the median layer dropped less than one decade. The event
    names the worst layer; ``onset_step`` is the last step that layer was within one decade of
    both references. After ``warmup`` values; quiet for ``cooldown`` values after an event.

    Args:
        gap: decades below the median layer that fire, > 0.
        drop: decades below the layer's own history that fire, > 0.
        fast: weight of the fast EWMA, in (0, 1].
        slow: weight of the slow EWMA, in (0, fast).
        warmup: values before any event, >= 1.
        cooldown: values without events after an event, >= 0.

    Example:
        >>> import numpy as np
        >>> norms = np.tile([1.0, 0.5, 0.3, 0.2], (200, 1))
        >>> norms[100:, 0] = 1e-6
        >>> [(e.step, e.layer) for e in LayerGradCliff().scan(layer_grad_norms=norms)]
        [(101, 'layer0')]
    """

    knob = Knob("gap", 1.0, 10.0, log=False)

    inputs = (Input("layer_grad_norms"),)
    _floor = 0.0  # values are taken at least this large before their log10 (0: a zero is skipped)
    _state_keys: ClassVar[tuple[str, ...]] = ("n", "names", "f", "s", "calm", "cooldown_left", "last_step")

    def __init__(self, gap: float = 3.0, drop: float = 2.0, fast: float = 0.3, slow: float = 0.01,
                 warmup: int = 20, cooldown: int = 200) -> None:
        check_range("gap", gap, 0, None, lo_open=True)
        check_range("drop", drop, 0, None, lo_open=True)
        check_range("fast", fast, 0, 1, lo_open=True)
        check_range("slow", slow, 0, fast, lo_open=True, hi_open=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.gap = gap
        self.drop = drop
        self.fast = fast
        self.slow = slow
        self.warmup = warmup
        self.cooldown = cooldown
        self._fa, self._fb = float(fast), 1.0 - float(fast)
        self._sa, self._sb = float(slow), 1.0 - float(slow)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._names: tuple[str, ...] | None = None
        self._f = np.zeros(0)
        self._s = np.zeros(0)
        self._calm = np.zeros(0, dtype=np.int64)
        self._cooldown_left = 0
        self._last_step = -1

    def _get_state(self) -> dict[str, Any]:
        return {k: _jsonable(getattr(self, "_" + k)) for k in self._state_keys}

    def _set_state(self, state: dict[str, Any]) -> None:
        self._n = int(state["n"])
        self._names = tuple(state["names"]) if state["names"] is not None else None
        self._f = np.asarray(state["f"], dtype=np.float64)
        self._s = np.asarray(state["s"], dtype=np.float64)
        self._calm = np.asarray(state["calm"], dtype=np.int64)
        self._cooldown_left = int(state["cooldown_left"])
        self._last_step = int(state["last_step"])

    @property
    def layer_names(self) -> tuple[str, ...] | None:
        """The layers seen so far (``None`` before the first value)."""
        return self._names

    def _step(self, values: LayerValues, step: int) -> Event | None:
        if self._names is None:
            self._names = values.names
        return self._row(values.array, step)

    def _log(self, x: np.ndarray) -> np.ndarray:
        """``log10`` of the values (after the floor); zeros and negatives give non-finite values."""
        if self._floor:
            x = np.maximum(x, self._floor)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log10(x)

    def _levels(self, mat: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The fast and slow levels over the rows from ``i`` up to the first row with a
        non-finite value (at most 4096 rows), or None when that row is the first.
        """
        u = self._log(mat[i:i + 4096])
        lim = first_bad_row(u)
        if lim == 0:
            return None
        u = u[:lim]
        f, _ = lfilter([self._fa], [1.0, -self._fb], u, axis=0, zi=(self._fb * self._f)[None, :])
        s, _ = lfilter([self._sa], [1.0, -self._sb], u, axis=0, zi=(self._sb * self._s)[None, :])
        return f, s

    def _advance(self, f: np.ndarray, s: np.ndarray, st: np.ndarray) -> None:
        """Take the levels after the last of the rows at steps ``st`` (the fast path's advance)."""
        k = len(st)
        self._f = f[k - 1].copy()
        self._s = s[k - 1].copy()
        self._n += k
        self._last_step = int(st[-1])

    def _row(self, vec: np.ndarray, step: int) -> Event | None:
        self._last_step = step
        u = self._log(vec)
        if self._n and len(self._f) == len(u) and math.isfinite(u.sum()):  # every layer usable: most steps
            self._f = self._fa * u + self._fb * self._f
            self._s = self._sa * u + self._sb * self._s
            self._n += 1
            return self._check(step)
        ok = np.isfinite(u)
        if not ok.any():
            return None
        if self._n == 0 or len(self._f) != len(u):
            self._f = np.where(ok, u, 0.0)
            self._s = self._f.copy()
            self._calm = np.full(len(u), step, dtype=np.int64)
            self._n = 1
            return None
        if ok.all():
            self._f = self._fa * u + self._fb * self._f
            self._s = self._sa * u + self._sb * self._s
        else:
            self._f = np.where(ok, self._fa * u + self._fb * self._f, self._f)
            self._s = np.where(ok, self._sa * u + self._sb * self._s, self._s)
        self._n += 1
        return self._check(step)

    def _check(self, step: int) -> Event | None:
        f, s = self._f, self._s
        below = float(middle(f)) - f
        dropped = s - f
        far = np.maximum(below, dropped)
        top = far.max()
        if top < 1.0:  # every layer calm (most steps)
            self._calm.fill(step)
        else:
            np.copyto(self._calm, step, where=far < 1.0)
        if self._cooldown_left:
            self._cooldown_left -= 1
            return None
        if self._n <= self.warmup or top < min(self.gap, self.drop):
            return None
        cliff = below >= self.gap
        fell = dropped >= self.drop
        if fell.any() and float(middle(dropped)) < 1.0:
            cliff |= fell
        if not cliff.any():
            return None
        score = np.where(cliff, np.maximum(below, dropped), -np.inf)
        worst = int(np.argmax(score))
        assert self._names is not None
        layer = self._names[worst]
        self._cooldown_left = self.cooldown
        n_cliff = int(cliff.sum())
        msg = (f"grad norm of layer {layer} is {10 ** float(f[worst]):.3g}: {below[worst]:.1f} decades below "
               f"the median layer and {dropped[worst]:.1f} below its own history"
               + (f" ({n_cliff} layers on the cliff)" if n_cliff > 1 else ""))
        return make_event(Kind.VANISHING_GRADIENT, "warning", step, int(self._calm[worst]),
                          type(self).__name__, f"layer_grad_norms[{layer}]",
                          float(max(below[worst], dropped[worst])), self.gap, msg, layer=layer)

    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        return self._fast_rows(arrays[0][:j], steps, i)

    def _gaps(self, mat: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The fast paths' common start: ``(fast, slow, below, dropped)`` per row from ``i`` —
        decades below the median layer and below the layer's own history — or None when no
        vectorised advance is possible (warming up, cooling down, new layers, a non-finite row).
        """
        if self._n <= self.warmup or self._cooldown_left or len(self._f) != mat.shape[1]:
            return None
        levels = self._levels(mat, i)
        if levels is None:
            return None
        f, s = levels
        return f, s, middle(f)[:, None] - f, s - f

    def _fast_rows(self, mat: np.ndarray, steps: np.ndarray, i: int) -> int:
        """Vectorised advance over rows while no event is possible (all finite, no cliff)."""
        gaps = self._gaps(mat, i)
        if gaps is None:
            return 0
        f, s, below, dropped = gaps
        lim = len(f)
        med_drop = middle(dropped)
        cliff = ((below >= self.gap) | ((dropped >= self.drop) & (med_drop[:, None] < 1.0))).any(axis=1)
        k = int(np.argmax(cliff)) if cliff.any() else lim
        if k:
            calm = (below[:k] < 1.0) & (dropped[:k] < 1.0)
            st = steps[i:i + k]
            last = np.where(calm, st[:, None], -1).max(axis=0)
            self._calm = np.maximum(self._calm, last)
            self._advance(f, s, st)
        return k


def middle(a: np.ndarray) -> np.ndarray:
    """Median along the last axis by partial sort (the same arithmetic for a row or a matrix)."""
    n = a.shape[-1]
    k = n // 2
    if n % 2:
        return np.partition(a, k, axis=-1)[..., k]
    part = np.partition(a, (k - 1, k), axis=-1)
    return (part[..., k - 1] + part[..., k]) * 0.5


def first_bad_row(u: np.ndarray) -> int:
    bad = ~np.isfinite(u).all(axis=1)
    return int(np.argmax(bad)) if bad.any() else len(u)


__all__ = ["LayerGradCliff", "as_named_vector"]
