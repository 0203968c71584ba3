"""The per-layer levels the layer rules share: a fast and a slow EWMA of ``log10`` per layer, as NumPy vectors.

:class:`LayerLevels` keeps, per layer, a fast EWMA (weight ``fast``) and a slow one (weight ``slow``)
of ``u = log10(value)``, stacked as one ``(2, layers)`` matrix so a step is three NumPy operations
whatever the number of layers (no Python loop over layers). A layer is *calm* while its fast level
is within one decade (:data:`CALM`) of both references the rules judge it by: the median layer's
fast level and its own slow level; the last calm step of each layer is every event's
``onset_step``. The rules built on it (:class:`~trainsignals.MedianGapGradCliff`,
:class:`~trainsignals.OwnDropGradCliff`, :class:`~trainsignals.LayerUpdateRatio`) say when a
layer fires; after an event a rule is quiet for ``cooldown`` steps.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

import numpy as np

from .._events import Event
from .._layers import LayerValues
from .._validate import check_range
from ..signals import layers
from ._base import Detector, _jsonable
from ._factors import times
from ._ops import lfilter

__all__ = ["LayerLevels", "CALM", "as_named_vector", "center", "cliff_message", "middle", "first_bad_row",
           "plain_levels"]

#: decades from both references within which a layer counts as calm (its onset is the last calm step):
#: one order of magnitude, far beyond the step-to-step scatter of a healthy layer's grad norm
CALM = 1.0
#: rows of a scan's fast path taken at once (bounds the memory of the per-row levels)
_ROWS = 4096


def as_named_vector(name: str, value: Any, names: tuple[str, ...] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """A per-layer value as a float vector and its layer names (see :func:`trainsignals.signals.layers`)."""
    lv = layers(name, value, names)
    return lv.array, lv.names


def middle(a: np.ndarray) -> np.ndarray:
    """Median along the last axis by partial sort (the same arithmetic for a row or a matrix)."""
    n = a.shape[-1]
    k = n // 2
    if n % 2:
        return np.partition(a, k, axis=-1)[..., k]
    part = np.partition(a, (k - 1, k), axis=-1)
    return (part[..., k - 1] + part[..., k]) * 0.5


def center(a: np.ndarray) -> float:
    """The median layer of one row of levels, over the layers measured so far (nan: not yet measured)."""
    return float(middle(a)) if not np.isnan(a).any() else float(np.nanmedian(a))


def plain_levels(a: np.ndarray) -> list[float | None]:
    """A row of levels for a state dict: a layer not yet measured as ``None`` (JSON has no nan)."""
    return [None if v != v else v for v in a.tolist()]


def first_bad_row(u: np.ndarray) -> int:
    """The index of the first row holding a non-finite value (the number of rows when none does)."""
    bad = ~np.isfinite(u).all(axis=1)
    return int(np.argmax(bad)) if bad.any() else len(u)


class LayerLevels(Detector):
    """Base of the per-layer rules: the levels, their state, the calm steps and the scan's fast path.

    A subclass declares ``inputs`` (one per-layer signal) and ``_floor``, calls
    :meth:`_setup` from its constructor and implements :meth:`_judge` (the streaming verdict
    of one step) and :meth:`_hits` (the same verdict on the rows of a scan, for its fast path).
    """

    #: values are taken at least this large before their log10 (0: a zero is not measured)
    _floor: ClassVar[float] = 0.0
    _state_keys: ClassVar[tuple[str, ...]] = ("n", "names", "f", "s", "calm", "quiet_until", "last_step")
    #: the smallest distance from a reference, in decades, at which the rule can fire (its threshold)
    _least: float = 0.0
    fast: float
    slow: float
    warmup: int
    cooldown: int

    def _setup(self, fast: float, slow: float, warmup: int, cooldown: int) -> None:
        check_range("fast", fast, 0, 1, lo_open=True)
        check_range("slow", slow, 0, fast, lo_open=True, hi_open=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("cooldown", cooldown, 0, None, integer=True)
        self.fast, self.slow, self.warmup, self.cooldown = fast, slow, warmup, cooldown
        self._w = np.array([[float(fast)], [float(slow)]])            # the weights of the new value
        self._keep = np.array([[1.0 - float(fast)], [1.0 - float(slow)]])  # ... and of the old level
        self._recipe = (self._floor, float(fast), float(slow))  # levels with these weights: shared by rules
        self._keep_full = self._keep  # ``_keep`` repeated for each layer (set on the first levels)
        self._reset()

    def _reset(self) -> None:
        self._n = 0
        self._names: tuple[str, ...] | None = None
        self._fs = np.zeros((2, 0))  # row 0: the fast levels, row 1: the slow ones
        self._calm = np.zeros(0, dtype=np.int64)
        self._quiet_until = -1
        self._last_step = -1

    def _get_state(self) -> dict[str, Any]:
        st = {k: _jsonable(getattr(self, "_" + k)) for k in self._state_keys if k not in ("f", "s")}
        return {**st, "f": plain_levels(self._fs[0]), "s": plain_levels(self._fs[1])}

    def _set_state(self, state: dict[str, Any]) -> None:
        for k in self._state_keys:
            if k not in ("f", "s", "names", "calm"):
                setattr(self, "_" + k, int(state[k]))
        self._names = tuple(state["names"]) if state["names"] is not None else None
        self._fs = np.array([state["f"], state["s"]], dtype=np.float64).reshape(2, -1)
        self._calm = np.asarray(state["calm"], dtype=np.int64)

    @property
    def layer_names(self) -> tuple[str, ...] | None:
        """The layers seen so far (``None`` before the first value)."""
        return self._names

    # -- streaming ------------------------------------------------------------------------
    def _step(self, values: LayerValues, step: int) -> Event | None:
        if self._names is None:
            self._names = values.names
        self._last_step = step
        u = values.log10(self._floor)
        fs = self._fs
        if self._n and fs.shape[1] == len(u):  # the levels after this value, if it is finite (most steps)
            # another rule on the same levels may have taken this step from the same levels already
            got = values.shared.get(self._recipe)
            if got is not None and got[0] is fs:
                self._fs, lo, top = got[1]
                self._n += 1
                return self._check(step, lo, top)
            keep = self._keep_full
            if keep.shape != fs.shape:  # the old levels' weights, one per level (a broadcast is slower)
                keep = self._keep_full = np.broadcast_to(self._keep, fs.shape).copy()
            new = np.multiply(keep, fs)
            new += self._w * u
            f = new[0]  # argmin and argmax find a nan first: a non-finite value makes lo or top non-finite
            lo, top = f.item(f.argmin()), new.item(new.argmax())
            if lo - lo == 0.0 and top - top == 0.0:
                new.flags.writeable = False  # shared: levels are replaced, never changed in place
                values.shared[self._recipe] = (fs, (new, lo, top))
                self._fs = new
                self._n += 1
                return self._check(step, lo, top)
        return self._partial(values, u, step)

    def _partial(self, values: LayerValues, u: np.ndarray, step: int) -> Event | None:
        """A value with non-finite layers (they keep their levels), or the first value of a set of
        layers; a layer not measured yet has no level (nan) until its first finite value starts it.
        """
        ok = np.isfinite(u)
        if not ok.any():
            return None
        if self._n == 0 or self._fs.shape[1] != len(u):
            got = values.shared.get((self._floor, "first"))
            if got is None:
                f = np.where(ok, u, np.nan)
                got = values.shared[(self._floor, "first")] = np.stack([f, f])
                got.flags.writeable = False
            self._fs = got
            self._calm = np.full(len(u), step, dtype=np.int64)
            self._n = 1
            self._first(len(u), step)
            return None
        key = (*self._recipe, "partial")
        got = values.shared.get(key)
        if got is None or got[0] is not self._fs:
            fs, uu = self._fs, np.where(ok, u, 0.0)
            new = np.where(ok, np.where(np.isnan(fs), uu, self._w * uu + self._keep * fs), fs)
            new.flags.writeable = False
            got = values.shared[key] = (self._fs, (new, float(np.nanmin(new[0])), float(np.nanmax(new))))
        self._fs, lo, top = got[1]
        self._n += 1
        return self._check(step, lo, top)

    def _first(self, n_layers: int, step: int) -> None:
        """Hook: a first value, or a new set of layers (the levels start at the value)."""

    def _refs(self) -> tuple[np.ndarray, np.ndarray]:
        """Per layer, the decades its fast level lies below the median layer's and below its own slow level."""
        f, s = self._fs
        return center(f) - f, s - f

    def _check(self, step: int, lo: float, top: float) -> Event | None:
        """Update the calm steps, then judge (after warm-up, outside the cooldown).

        ``lo`` is the lowest fast level, ``top`` the highest level of either kind: no layer lies
        more than ``top - lo`` decades below the median layer or below its own history.
        """
        if top - lo < CALM:  # every layer within a decade of both references (most steps)
            self._calm.fill(step)
            below = dropped = None
            bound = top - lo
        else:
            below, dropped = self._refs()
            far = np.maximum(below, dropped)
            np.copyto(self._calm, step, where=far < CALM)
            bound = float(np.nanmax(far))
        if step <= self._quiet_until or self._n <= self.warmup or bound < self._least:
            return None
        if below is None or dropped is None:
            below, dropped = self._refs()
        ev = self._judge(step, below, dropped)
        if ev is not None and self.cooldown:
            self._quiet_until = step + self.cooldown
        return ev

    def _judge(self, step: int, below: np.ndarray, dropped: np.ndarray) -> Event | None:
        """The rule on this step's levels: per layer, ``below`` = decades below the median layer,
        ``dropped`` = decades below the layer's own slow level.
        """
        raise NotImplementedError

    def _worst(self, hit: np.ndarray, below: np.ndarray, dropped: np.ndarray) -> tuple[int, str]:
        """The layer of ``hit`` farthest from either reference, and its name."""
        worst = int(np.argmax(np.where(hit, np.maximum(below, dropped), -np.inf)))
        assert self._names is not None
        return worst, self._names[worst]

    # -- batch ----------------------------------------------------------------------------
    def _fast(self, arrays: Sequence[np.ndarray], steps: np.ndarray, i: int, j: int) -> int:
        return self._fast_rows(arrays[0][:j], steps, i)

    def _levels(self, mat: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The fast and slow levels over the rows from ``i`` up to the first row with a
        non-finite value (at most 4096 rows), or None when that row is the first.
        """
        x = mat[i:i + _ROWS]
        if self._floor:
            x = np.maximum(x, self._floor)
        with np.errstate(divide="ignore", invalid="ignore"):
            u = np.log10(x)
        lim = first_bad_row(u)
        if lim == 0:
            return None
        u = u[:lim]
        (wf,), (ws,) = self._w
        (kf,), (ks,) = self._keep
        f, _ = lfilter([wf], [1.0, -kf], u, axis=0, zi=(kf * self._fs[0])[None, :])
        s, _ = lfilter([ws], [1.0, -ks], u, axis=0, zi=(ks * self._fs[1])[None, :])
        return f, s

    def _gaps(self, mat: np.ndarray, steps: np.ndarray,
              i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The fast paths' common start: ``(fast, slow, below, dropped)`` per row from ``i`` —
        decades below the median layer and below the layer's own history — or None when no
        vectorised advance is possible (warming up, cooling down, new layers, a non-finite row).
        """
        if (self._n <= self.warmup or steps[i] <= self._quiet_until or self._fs.shape[1] != mat.shape[1]
                or np.isnan(self._fs).any()):  # a layer not measured yet: the scalar path starts it
            return None
        levels = self._levels(mat, i)
        if levels is None:
            return None
        f, s = levels
        return f, s, middle(f)[:, None] - f, s - f

    def _advance(self, f: np.ndarray, s: np.ndarray, st: np.ndarray) -> None:
        """Take the levels after the last of the rows at steps ``st`` (the fast path's advance)."""
        k = len(st)
        self._fs = np.stack([f[k - 1], s[k - 1]])
        self._fs.flags.writeable = False
        self._n += k
        self._last_step = int(st[-1])

    def _hits(self, below: np.ndarray, dropped: np.ndarray) -> np.ndarray:
        """Per row of a scan, whether the rule fires there (``below``, ``dropped``: ``(rows, layers)``)."""
        raise NotImplementedError

    def _fast_rows(self, mat: np.ndarray, steps: np.ndarray, i: int) -> int:
        """Vectorised advance over rows while no event is possible (all finite, the rule silent)."""
        gaps = self._gaps(mat, steps, i)
        if gaps is None:
            return 0
        f, s, below, dropped = gaps
        hit = self._hits(below, dropped)
        k = int(np.argmax(hit)) if hit.any() else len(f)
        if k:
            calm = (below[:k] < CALM) & (dropped[:k] < CALM)
            st = steps[i:i + k]
            self._calm = np.maximum(self._calm, np.where(calm, st[:, None], -1).max(axis=0))
            self._advance(f, s, st)
        return k



def cliff_message(layer: str, f: np.ndarray, below: np.ndarray, dropped: np.ndarray, worst: int, n_hit: int) -> str:
    """The vanishing-gradient rules' message: the worst layer's grad norm and how far it is from both references."""
    return (f"grad norm of layer {layer} is {times(float(f[worst]), base10=True)}: {below[worst]:.1f} decades below "
            f"the median layer and {dropped[worst]:.1f} below its own history"
            + (f" ({n_hit} layers on the cliff)" if n_hit > 1 else ""))
