"""LayerGradCliff: some layers' gradients vanish while the others stay healthy."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar

import numpy as np
from scipy.signal import lfilter

from .._events import Event, Kind, make_event
from .._layers import LayerValues
from .._validate import check_range, to_step
from ._base import Detector, _jsonable


def as_named_vector(name: str, value: Any, names: tuple[str, ...] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Turn ``{name: x}``, a :class:`~trainsignals.LayerValues`, a sequence or an array into a
    float vector and its layer names."""
    if type(value) is LayerValues:  # an adapter's vector with its names: no conversion
        vec, keys = value.array, value.names
    elif isinstance(value, Mapping):
        keys = tuple(value)
        if keys != names:  # the same names as before (the common case) are already strings
            keys = tuple(str(k) for k in keys)
        try:
            vec = np.fromiter((float(v) for v in value.values()), dtype=np.float64, count=len(keys))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} values must be real numbers") from exc
    else:
        if isinstance(value, (str, bytes)):
            raise TypeError(f"{name} must be a mapping or a sequence of numbers, got str")
        try:
            vec = np.asarray(value, dtype=np.float64).reshape(-1)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a mapping or a sequence of numbers") from exc
        keys = names if names is not None and len(names) == len(vec) else tuple(f"layer{i}" for i in range(len(vec)))
    if names is not None and keys != names:
        raise ValueError(f"{name} layers changed: expected {list(names)}, got {list(keys)}")
    return vec, keys


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
        >>> [(e.step, e.layer) for e in LayerGradCliff().scan(norms)]
        [(101, 'layer0')]
    """

    signals = ("layer_grad_norms",)
    _what = "layer_grad_norms"  # the input's name in errors
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

    def update(self, *values: Any, step: int | None = None) -> Event | None:  # type: ignore[override]
        """Feed one vector of per-layer values (mapping, sequence or array)."""
        if len(values) != 1:
            raise TypeError(f"{type(self).__name__}.update takes one vector of {self._what}")
        vec, names = as_named_vector(self._what, values[0], self._names)
        s = self._last_step + 1 if step is None else to_step(step)
        if self._names is None:
            self._names = names
        return self._row(vec, s)

    def _log(self, x: np.ndarray) -> np.ndarray:
        """``log10`` of the values (after the floor); zeros and negatives give non-finite values."""
        if self._floor:
            x = np.maximum(x, self._floor)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.log10(x)

    def _levels(self, mat: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray] | None:
        """The fast and slow levels over the rows from ``i`` up to the first row with a
        non-finite value (at most 4096 rows), or None when that row is the first."""
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

    def _step(self, x: float, step: int) -> Event | None:  # pragma: no cover - vector detector
        raise TypeError(f"{type(self).__name__} works on vectors: use update(vector) or scan(matrix)")

    def scan(self, *arrays: Any, steps: Any = None) -> list[Event]:  # type: ignore[override]
        """Batch twin: a 2-D array ``(steps, layers)`` or a mapping ``{name: 1-D array}``."""
        if len(arrays) != 1:
            raise TypeError(f"{type(self).__name__}.scan takes one matrix of {self._what}")
        mat, names = as_matrix(self._what, arrays[0], self._names)
        if self._names is None:
            self._names = names
        n = mat.shape[0]
        from ._base import _steps_for

        st = _steps_for(steps, n, self._last_step)
        events: list[Event] = []
        i = 0
        while i < n:
            k = self._fast_rows(mat, st, i)
            i += k
            if i < n:
                ev = self._row(mat[i], int(st[i]))
                if ev is not None:
                    events.append(ev)
                i += 1
        return events

    def _gaps(self, mat: np.ndarray, i: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
        """The fast paths' common start: ``(fast, slow, below, dropped)`` per row from ``i`` —
        decades below the median layer and below the layer's own history — or None when no
        vectorised advance is possible (warming up, cooling down, new layers, a non-finite row)."""
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


def as_matrix(name: str, value: Any, names: tuple[str, ...] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    """Turn ``{name: 1-D array}`` or a 2-D array into a ``(steps, layers)`` matrix and names."""
    if isinstance(value, Mapping):
        keys = tuple(str(k) for k in value)
        try:
            mat = np.column_stack([np.asarray(v, dtype=np.float64) for v in value.values()])
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must map layer names to arrays of real numbers") from exc
    else:
        try:
            mat = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a 2-D array of real numbers") from exc
        if mat.ndim != 2:
            raise ValueError(f"{name} must be 2-D (steps, layers), got shape {mat.shape}")
        keys = names if names is not None and len(names) == mat.shape[1] else tuple(
            f"layer{i}" for i in range(mat.shape[1]))
    if names is not None and keys != names:
        raise ValueError(f"{name} layers changed: expected {list(names)}, got {list(keys)}")
    return mat, keys


__all__ = ["LayerGradCliff", "as_named_vector", "as_matrix", "math"]
