"""The signal vocabulary, declared once, and the one place inputs are coerced.

Every signal the :class:`~trainsignals.Monitor` accepts, every detector input and every trace
column is one of :data:`SIGNALS`. A signal has a *form* — ``"scalar"`` (one number a step),
``"layers"`` (one number per layer, :class:`~trainsignals.LayerValues`) or ``"activations"``
(per-layer statistics) — whether it must be non-negative (or a fraction in [0, 1]), and whether
it is *sparse* (measured at its own cadence, such as ``val_loss`` and ``val_metric``).

``val_metric`` is any validation metric (accuracy, F1, ...; its direction is the Monitor's
``val_metric_mode``); ``pred_top_share`` is the share of the most-predicted class among a
sampled batch's predictions (:func:`trainsignals.adapters.torch.pred_top_share` measures it), and
``pred_spread`` a regression's: the standard deviation of a sampled batch's predictions across the
batch, averaged over the outputs (:func:`trainsignals.adapters.torch.pred_spread`). The Monitor, the detectors' ``update``/``scan``,
the traces and the importers all go through the functions here, so a value is checked the
same way wherever it enters.

Example:
    >>> SIGNALS["grad_norm"]
    Signal(name='grad_norm', form='scalar', nonneg=True, sparse=False, fraction=False)
    >>> scalar("loss", 10 ** 400)   # too large for a float: an infinite value, reported as one
    inf
    >>> scalar("lr", -1.0)
    Traceback (most recent call last):
    ...
    ValueError: lr must be >= 0, got -1.0
    >>> scalar("pred_top_share", 1.5)
    Traceback (most recent call last):
    ...
    ValueError: pred_top_share must be a fraction in [0, 1], got 1.5
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from ._layers import LayerValues

__all__ = ["SIGNALS", "SCALAR_SIGNALS", "DENSE_SIGNALS", "Signal", "Column", "LayerStats", "scalar", "layers", "activations", "column", "dense_values", "as_steps", "ACT_STATS",
           "positional_names"]


@dataclass(frozen=True)
class Signal:
    """One signal of the vocabulary.

    Args:
        name: the keyword users pass (``Monitor.update(loss=...)``).
        form: ``"scalar"``, ``"layers"`` or ``"activations"``.
        nonneg: negative values are impossible (a ``ValueError`` naming the signal).
        sparse: measured at its own cadence (``scan`` takes it as a ``(steps, values)`` pair).
        fraction: a finite value must lie in [0, 1] (a ``ValueError`` naming the signal).
    """

    name: str
    form: str = "scalar"
    nonneg: bool = False
    sparse: bool = False
    fraction: bool = False


#: Every signal, in the order the Monitor reports and records them.
SIGNALS: dict[str, Signal] = {s.name: s for s in (
    Signal("loss"),
    Signal("grad_norm", nonneg=True),
    Signal("lr", nonneg=True),
    Signal("update_ratio", nonneg=True),
    Signal("val_loss", sparse=True),
    Signal("val_metric", sparse=True),
    Signal("pred_top_share", nonneg=True, fraction=True),
    Signal("pred_spread", nonneg=True),
    Signal("layer_grad_norms", form="layers", nonneg=True),
    Signal("layer_update_ratios", form="layers", nonneg=True),
    Signal("activations", form="activations"),
)}

#: The signals with one number a step, in order; and those of them measured at every step
#: (``val_loss`` has its own cadence).
SCALAR_SIGNALS: tuple[str, ...] = tuple(n for n, s in SIGNALS.items() if s.form == "scalar")
DENSE_SIGNALS: tuple[str, ...] = tuple(n for n in SCALAR_SIGNALS if not SIGNALS[n].sparse)

#: The activation statistics the detectors read (rows of a :class:`LayerStats` matrix); others
#: (``mean``, ``var``, ``min``, ``max``) are accepted and ignored.
ACT_STATS = ("dead_frac", "saturation")
_ALL_ACT_STATS = ("dead_frac", "saturation", "mean", "var", "min", "max")
_STAT_SET = frozenset(_ALL_ACT_STATS)


def scalar(name: str, x: Any) -> float:
    """One value of a scalar signal as a Python float.

    Accepts Python numbers (an integer too large for a float is an infinite value), NumPy
    scalars, 0-d arrays and anything with ``__float__`` (a torch or JAX scalar).

    Raises:
        TypeError: not a real number (strings, bools, ``None``, arrays of several values).
        ValueError: a negative value of a non-negative signal.
    """
    if type(x) is not float:
        if isinstance(x, (str, bytes, bool, np.bool_)) or x is None:
            raise TypeError(f"{name} must be a real number, got {type(x).__name__} {x!r}")
        try:
            x = float(x)
        except OverflowError:
            x = math.inf if x > 0 else -math.inf  # a huge Python integer: beyond float range
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a real number, got {type(x).__name__}") from exc
    sig = SIGNALS[name]
    if x < 0.0 and sig.nonneg and not sig.fraction:
        raise ValueError(f"{name} must be >= 0, got {x}")
    if sig.fraction and (x < 0.0 or x > 1.0):  # NaN passes: a measured non-finite value
        raise ValueError(f"{name} must be a fraction in [0, 1], got {x}")
    return x


@lru_cache(maxsize=16)
def positional_names(n: int) -> tuple[str, ...]:
    """The names of ``n`` layers known only by position: ``("layer0", ..., f"layer{n - 1}")`` (built once per count)."""
    return tuple(f"layer{i}" for i in range(n))


def _number(name: str, v: Any) -> float:
    """One number of a per-layer value (a huge integer is infinite), or a ``TypeError`` naming it."""
    if isinstance(v, (str, bytes, bool, np.bool_)) or v is None:
        raise TypeError(f"{name} must be a real number, got {type(v).__name__} {v!r}")
    try:
        return float(v)
    except OverflowError:
        return math.inf if v > 0 else -math.inf
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a real number, got {type(v).__name__}") from exc


def _vector(name: str, values: Any, n: int | None = None) -> np.ndarray:
    try:
        with np.errstate(over="ignore"):
            vec = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{name} values must be real numbers") from exc
    if vec.ndim != 1:  # a number, or a matrix: not one value per layer (flattened, it would name other layers)
        raise ValueError(f"{name} must be one value per layer (1-D), got shape {vec.shape}")
    if n is not None and len(vec) != n:
        raise ValueError(f"{name} must have one value per layer: {n} layers, got {len(vec)} values")
    return vec


def layer_order(name: str, names: tuple[str, ...], known: tuple[str, ...] | None) -> list[int] | None:
    """Where each of ``known``'s layers is among ``names`` (``None``: already in that order).

    Layers are matched by name, whatever order a mapping gives them in; a run's set of layers
    is fixed.

    Raises:
        ValueError: ``names`` are other layers than ``known`` (both named).
    """
    if known is None or names is known or names == known:
        return None
    if len(names) != len(known) or set(names) != set(known):
        raise ValueError(f"{name} layers changed: expected {list(known)}, got {list(names)} (a run's layers are "
                         "fixed: give NaN for a layer without a value at a step, or reset() the Monitor)")
    at = {k: i for i, k in enumerate(names)}
    return [at[k] for k in known]


def layers(name: str, value: Any, known: tuple[str, ...] | None = None) -> LayerValues:
    """One value of a per-layer signal as :class:`~trainsignals.LayerValues`.

    ``value`` is a ``LayerValues``, a ``{layer: number}`` mapping, or a sequence / array
    (layers named by ``known`` when it has as many names, else ``layer0, layer1, ...``).

    Raises:
        TypeError: values that are not real numbers.
        ValueError: negative values, or layer names other than ``known``.
    """
    if type(value) is LayerValues:
        lv, keys = value, value.names
    elif type(value) is np.ndarray and value.dtype == np.float64 and value.ndim == 1:  # a vector as is
        keys = known if known is not None and len(known) == len(value) else positional_names(len(value))
        lv = LayerValues(keys, value)
    elif isinstance(value, Mapping):
        keys = tuple(value)
        if keys is not known and keys != known:
            keys = tuple(str(k) for k in keys)
        try:
            vec = np.fromiter((float(v) for v in value.values()), dtype=np.float64, count=len(keys))
        except (TypeError, ValueError, OverflowError):
            vec = np.array([_number(f"{name}[{k!r}]", v) for k, v in zip(keys, value.values())], dtype=np.float64)
        lv = LayerValues(keys, vec)
    else:
        if isinstance(value, (str, bytes)) or value is None:
            raise TypeError(f"{name} must be a mapping or a sequence of numbers, got {type(value).__name__}")
        vec = _vector(name, value)
        keys = known if known is not None and len(known) == len(vec) else positional_names(len(vec))
        lv = LayerValues(keys, vec)
    if keys is not known and known is not None and keys != known:  # the per-step path: the same layers, most steps
        lv = LayerValues(known, lv.array[layer_order(name, keys, known)])
    if SIGNALS[name].nonneg and lv.low() < 0:  # the smallest value, computed once per value
        raise ValueError(f"{name} must be >= 0")
    return lv


class LayerStats:
    """One activation sample: a ``(2, layers)`` matrix of dead and saturated fractions, and names.

    Row 0 is ``dead_frac``, row 1 ``saturation`` (:data:`ACT_STATS`); NaN where a layer did not
    report a statistic.
    """

    __slots__ = ("names", "matrix", "_ranges")

    def __init__(self, names: tuple[str, ...], matrix: np.ndarray) -> None:
        self.names = names
        self.matrix = matrix
        self._ranges: tuple[list[float], list[float]] | None = None

    def ranges(self) -> tuple[list[float], list[float]]:
        """Each statistic's smallest and largest value over the layers (``nan`` where a layer
        has ``nan``), computed once per sample: the checks and every rule reading it share them.

        Example:
            >>> LayerStats(("a", "b"), np.array([[0.0, 0.5], [0.25, 0.1]])).ranges()
            ([0.0, 0.1], [0.5, 0.25])
        """
        got = self._ranges
        if got is None:
            mat = self.matrix
            if mat.shape[1]:  # argmin and argmax find a nan first, and are faster than min and max
                lo, hi = mat.argmin(axis=1).tolist(), mat.argmax(axis=1).tolist()
                got = ([mat.item(r, c) for r, c in enumerate(lo)], [mat.item(r, c) for r, c in enumerate(hi)])
            else:
                got = ([math.inf] * len(mat), [-math.inf] * len(mat))
            self._ranges = got
        return got

    def __repr__(self) -> str:
        return f"LayerStats(names={self.names!r}, matrix={self.matrix.tolist()!r})"


def _fraction(where: str, v: Any) -> float:
    try:
        f = float(v)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{where} must be a real number") from exc
    if f == f and not 0.0 <= f <= 1.0:
        raise ValueError(f"{where} must be a fraction in [0, 1], got {f}")
    return f


def _stat_columns(value: Mapping[str, Any], known: tuple[str, ...] | None) -> LayerStats:
    """The column form of an activation sample, ``{stat: vector}``, checked (see :func:`activations`)."""
    cols = {str(k): v if type(v) is np.ndarray and v.dtype == np.float64 and v.ndim == 1
            else _vector(f"activations[{k!r}]", v) for k, v in value.items()}
    dead, sat = cols.get("dead_frac"), cols.get("saturation")
    if dead is not None and sat is not None and len(cols) == 2 and len(dead) == len(sat):  # the usual sample
        n = len(dead)
        mat = np.array((dead, sat))
    else:
        lens = {len(c) for c in cols.values()}
        if len(lens) != 1:
            raise ValueError(f"activations vectors must have one value per layer, got lengths {sorted(lens)}")
        n = lens.pop()
        mat = np.empty((2, n))
        for r, key in enumerate(ACT_STATS):
            mat[r] = cols.get(key, np.nan)
    sample = LayerStats(known if known is not None and len(known) == n else positional_names(n), mat)
    (lo0, lo1), (hi0, hi1) = sample.ranges()
    if n and not (lo0 >= 0.0 and lo1 >= 0.0 and hi0 <= 1.0 and hi1 <= 1.0):  # a nan, or a value out of range
        bad = np.isfinite(mat) & ((mat < 0.0) | (mat > 1.0))
        if bad.any():
            r = int(np.nonzero(bad.any(axis=1))[0][0])
            raise ValueError(f"activations[{ACT_STATS[r]!r}] must hold fractions in [0, 1]")
    return sample


def activations(value: Any, known: tuple[str, ...] | None = None) -> LayerStats:
    """One activation sample: ``{layer: {"dead_frac": f, "saturation": f, ...}}`` or the column
    form ``{"dead_frac": vector, "saturation": vector}`` (layers named by ``known`` when it
    has as many names, else by position).

    Raises:
        TypeError: not a mapping of that shape, or values that are not real numbers.
        ValueError: fractions outside [0, 1], or layers other than ``known``.
    """
    sample = None
    if type(value) is LayerStats:
        names, mat = value.names, value.matrix
    elif not isinstance(value, Mapping):
        raise TypeError("activations must be a mapping {layer: {'dead_frac': f, 'saturation': f}}")
    elif value and _STAT_SET.issuperset(value) and not any(
            type(v) is not np.ndarray and isinstance(v, Mapping) for v in value.values()):
        sample = _stat_columns(value, known)
        names = sample.names
    else:
        names = tuple(str(k) for k in value)
        mat = np.full((2, len(names)), np.nan)
        for j, stats in enumerate(value.values()):
            if not isinstance(stats, Mapping):
                raise TypeError("activations must map each layer to a mapping of statistics")
            for r, key in enumerate(ACT_STATS):
                if key in stats and stats[key] is not None:
                    mat[r, j] = _fraction(f"activations[{names[j]!r}][{key!r}]", stats[key])
    if names is not known and known is not None and names != known:
        mat = (sample.matrix if sample is not None else mat)[:, layer_order("activations", names, known)]
        return LayerStats(known, mat)
    return sample if sample is not None else value if type(value) is LayerStats else LayerStats(names, mat)


@dataclass
class Column:
    """A whole signal for the batch path, coerced once.

    ``values`` has one row per entry: a 1-D array for scalars, ``(n, layers)`` for per-layer
    signals, ``(n, 2, layers)`` for activations. ``steps`` is ``None`` when the column is
    aligned with the scan's steps, else the step of each entry (a sparse signal). ``mask``
    marks, in an aligned column with gaps, the entries that were measured (``None``: all).
    """

    name: str
    values: np.ndarray
    steps: np.ndarray | None = None
    names: tuple[str, ...] | None = None
    mask: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.values)


def _as_1d(name: str, a: Any) -> np.ndarray:
    try:
        arr = np.asarray(a, dtype=np.float64)
    except (TypeError, ValueError, OverflowError) as exc:
        raise TypeError(f"{name} must be an array of real numbers") from exc
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    return arr


def as_steps(name: str, steps: Any, n: int | None = None) -> np.ndarray:
    """Steps as an int64 vector (integers, or floats that are whole numbers)."""
    st = np.asarray(steps)
    if st.ndim != 1 or (n is not None and len(st) != n):
        raise ValueError(f"{name} must be 1-D with {n} values, got shape {st.shape}")
    if st.dtype.kind not in "iu":
        if st.dtype.kind == "f" and np.all(np.isfinite(st)) and np.all(st == np.round(st)):
            return st.astype(np.int64)
        if len(st) == 0:
            return st.astype(np.int64)
        raise TypeError(f"{name} must be integers")
    return st.astype(np.int64, copy=False)


def dense_values(name: str, v: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """A 1-D column as float64 with NaN in its gaps, and the measured mask (None: no gaps).

    Gaps (not measured) are masked entries of a NumPy masked array, nulls of a pyarrow or
    polars array and ``None`` entries of a list; NaN is a measured non-finite value. Lists,
    NumPy arrays, pandas and polars columns and pyarrow arrays are accepted.

    Raises:
        TypeError: values that are not real numbers (named).
        ValueError: not 1-D.
    """
    mod = type(v).__module__.split(".")[0]
    try:
        if isinstance(v, np.ma.MaskedArray):
            mask = ~np.ma.getmaskarray(v).reshape(-1)
            arr = _as_1d(name, np.ma.getdata(v)).copy()
            arr[~mask] = np.nan
            return arr, (None if mask.all() else mask)
        if mod == "polars" and hasattr(v, "to_arrow"):
            v, mod = v.to_arrow(), "pyarrow"
        elif mod == "pandas":  # pandas' own missing markers (pd.NA, None) are gaps; NaN stays a value
            import pyarrow as pa

            v, mod = pa.array(v, from_pandas=False), "pyarrow"
        if mod == "pyarrow" and hasattr(v, "null_count"):
            import pyarrow as pa

            arr = v.combine_chunks() if isinstance(v, pa.ChunkedArray) else v
            floats = arr.cast(pa.float64())
            if arr.null_count:
                mask = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
                filled = floats.fill_null(float("nan"))
                return _as_1d(name, filled.to_numpy(zero_copy_only=False)), mask
            return _as_1d(name, floats.to_numpy(zero_copy_only=False)), None
        if isinstance(v, (list, tuple)) and any(x is None for x in v):
            mask = np.array([x is not None for x in v], dtype=bool)
            return _as_1d(name, [math.nan if x is None else x for x in v]), mask
        return _as_1d(name, np.asarray(v)), None
    except (TypeError, ValueError) as exc:
        if isinstance(exc, ValueError) and "1-D" in str(exc):
            raise
        raise TypeError(f"{name} must be a 1-D array of real numbers (None, masked or null entries for "
                        f"gaps): {exc}") from exc


def _layer_matrix(name: str, value: Any, known: tuple[str, ...] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    if isinstance(value, Mapping):
        keys = tuple(str(k) for k in value)
        try:
            mat = np.column_stack([np.asarray(v, dtype=np.float64) for v in value.values()]) if value else \
                np.zeros((0, 0))
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must map layer names to arrays of real numbers") from exc
    else:
        try:
            mat = np.asarray(value, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} must be a 2-D array of real numbers") from exc
        if mat.ndim != 2:
            raise ValueError(f"{name} must be 2-D (steps, layers), got shape {mat.shape}")
        keys = known if known is not None and len(known) == mat.shape[1] else positional_names(mat.shape[1])
    order = layer_order(name, keys, known)
    if order is not None:
        mat, keys = mat[:, order], known  # type: ignore[assignment]
    if SIGNALS[name].nonneg and mat.size and (mat < 0).any():  # (NaN compares false: a gap, not a negative)
        raise ValueError(f"{name} must be >= 0")
    return mat, keys


def _act_cube(value: Any, known: tuple[str, ...] | None) -> tuple[np.ndarray, tuple[str, ...]]:
    if not isinstance(value, Mapping):
        raise TypeError("activations must be {layer: {stat: array}} or (steps, {layer: {stat: array}})")
    names = tuple(str(k) for k in value)
    rows: list[list[np.ndarray | None]] = []
    n: int | None = None
    for layer, stats in zip(names, value.values()):
        if not isinstance(stats, Mapping):
            raise TypeError("activations must map each layer to a mapping of statistic arrays")
        got: list[np.ndarray | None] = []
        for key in ACT_STATS:
            a = None if stats.get(key) is None else _vector(f"activations[{layer!r}][{key!r}]", stats[key])
            if a is not None:
                if n is not None and len(a) != n:
                    raise ValueError("activations arrays must all have one entry per sample")
                n = len(a)
            got.append(a)
        rows.append(got)
    cube = np.full((n or 0, 2, len(names)), np.nan)
    for c, got in enumerate(rows):
        for r, a in enumerate(got):
            if a is not None:
                cube[:, r, c] = a
    bad = np.isfinite(cube) & ((cube < 0.0) | (cube > 1.0))
    if bad.any():
        raise ValueError("activations statistics must be fractions in [0, 1]")
    order = layer_order("activations", names, known)
    if order is not None:
        cube, names = cube[:, :, order], known  # type: ignore[assignment]
    return cube, names


def column(name: str, value: Any, known: tuple[str, ...] | None = None) -> Column:
    """A whole signal for ``scan``, coerced once.

    Scalars: a 1-D array-like aligned with the scan's steps (a masked entry of a NumPy masked
    array or a null of a pyarrow array is a gap: not measured), or a ``(steps, values)`` pair.
    Per-layer signals: a ``(steps, layers)`` array or ``{layer: array}``, aligned or as a
    ``(steps, ...)`` pair. Activations: ``{layer: {stat: array}}``, aligned or as a pair.
    A :class:`Column` is taken as it is.

    Raises:
        TypeError: an unknown signal, or values of the wrong type.
        ValueError: values out of range, lengths that differ.
    """
    if isinstance(value, Column):
        return value
    sig = SIGNALS.get(name)
    if sig is None:
        raise TypeError(f"unknown signal {name!r}; signals are {list(SIGNALS)}")
    st: np.ndarray | None = None
    if isinstance(value, tuple) and len(value) == 2:
        st = as_steps(f"{name} steps", value[0])
        value = value[1]
    names = None
    if sig.form == "scalar":
        arr, mask = dense_values(name, value)
        if sig.fraction and np.any((arr < 0) | (arr > 1)):
            raise ValueError(f"{name} must hold fractions in [0, 1]")
        if sig.nonneg and np.any(arr < 0):
            raise ValueError(f"{name} must be >= 0")
        if mask is not None:  # gaps: the measured entries at their own steps
            if st is None:
                return Column(name, arr, mask=mask)
            arr, st = arr[mask], st[mask]
    elif sig.form == "layers":
        arr, names = _layer_matrix(name, value, known)
    else:
        arr, names = _act_cube(value, known)
    if st is not None and len(st) != len(arr):
        raise ValueError(f"{name} has {len(arr)} values for {len(st)} steps")
    return Column(name, arr, st, names)

