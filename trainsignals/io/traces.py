"""Traces: every signal a run logged, and the events it raised, in one Arrow file.

A trace is an Apache Arrow IPC *stream* (``pyarrow.ipc.new_stream``), one record batch per
flush, so a run killed at any moment leaves every flushed record readable. One row per step:

========================  ==================================  ===================================
column                    type                                meaning
========================  ==================================  ===================================
``step``                  int64, not null                     the step
``wall_time``             float64                             ``time.time()`` when recorded
``loss`` ... ``pred_spread``     float64                      null: not measured at this step;
                                                              NaN/±inf: measured, non-finite
``layer_grad_norms``      list<float64>                       in the order of ``layer_names``
``layer_update_ratios``   list<float64>                       per-layer ``‖Δw‖/‖w‖``, in the order
                                                              of ``layer_names`` (see below)
``act_dead_frac``         list<float64>                       in the order of ``act_layer_names``
``act_saturation``        list<float64>                       in the order of ``act_layer_names``
``events``                list<struct<kind, severity, ...>>   the events raised at the step
========================  ==================================  ===================================

The scalar columns are ``loss``, ``grad_norm``, ``lr``, ``update_ratio``, ``val_loss``,
``val_metric``, ``pred_top_share`` and ``pred_spread`` (the signals of :data:`trainsignals.SIGNALS`). The
schema metadata holds ``trainsignals.format`` (``trace``), ``trainsignals.format_version``,
``trainsignals.version``, ``trainsignals.metadata`` (JSON of the run's metadata) and the layer
names (``trainsignals.layer_names``, ``trainsignals.act_layer_names``, JSON lists).

``layer_grad_norms`` and ``layer_update_ratios`` share ``layer_names`` (the adapters measure both
over the same layers); a writer given either over other layers raises ``ValueError``. Traces
written before ``layer_update_ratios`` existed have no such column: they read (``read_trace``
adds it, all null) and replay as runs that never measured it. The column is an addition that
older readers ignore, so the format version stays 1. The same holds for ``val_metric``,
``pred_top_share`` and ``pred_spread``.

Write with :class:`TraceWriter` (``Monitor(recorder=TraceWriter(path))`` records every update
and scan) or :func:`write_trace` (whole arrays); read with :func:`read_trace`, and replay with
``Monitor().scan(**trace_signals(table))``.

This module imports pyarrow; ``import trainsignals`` does not import it.
"""

from __future__ import annotations

import atexit
import json
import math
import os
import secrets
import stat
import time
import warnings
import weakref
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trainsignals import __version__
from trainsignals._events import SEVERITIES, Event, Kind
from trainsignals._validate import check_range, to_float, to_step
from trainsignals.detectors._layer_levels import as_named_vector
from trainsignals.signals import DENSE_SIGNALS as _DENSE
from trainsignals.signals import SCALAR_SIGNALS, dense_values, scalar

__all__ = [
    "TRACE_SCHEMA_VERSION",
    "TraceDamagedWarning",
    "TraceFormatError",
    "TraceWriter",
    "read_trace",
    "trace_events",
    "trace_metadata",
    "trace_schema",
    "trace_signals",
    "write_trace",
]

TRACE_SCHEMA_VERSION = 3
"""Version of the trace layout written by this module (``trainsignals.format_version``; 2 added the
events' ``healthy_rate``, 3 their ``heldout_rate``; traces of versions 1 and 2 are read too)."""

SCALAR_COLUMNS = SCALAR_SIGNALS
DENSE_SIGNALS = _DENSE
LIST_COLUMNS = ("layer_grad_norms", "layer_update_ratios", "act_dead_frac", "act_saturation")
LAYER_COLUMNS = ("layer_grad_norms", "layer_update_ratios")  # per-layer signals over ``layer_names``
_OPTIONAL_COLUMNS = ("layer_update_ratios", "val_metric", "pred_top_share", "pred_spread")  # columns older traces lack
_SPARSE_COLUMNS = ("val_loss", "val_metric")  # scalar columns with their own cadence
ACT_STATS = ("dead_frac", "saturation")
_ALL_ACT_STATS = ("dead_frac", "saturation", "mean", "var", "min", "max")

_META_FORMAT = b"trainsignals.format"
_META_FORMAT_VERSION = b"trainsignals.format_version"
_META_VERSION = b"trainsignals.version"
_META_USER = b"trainsignals.metadata"
_META_LAYERS = b"trainsignals.layer_names"
_META_ACT_LAYERS = b"trainsignals.act_layer_names"

EVENT_TYPE = pa.struct([
    pa.field("kind", pa.string(), nullable=False),
    pa.field("severity", pa.string(), nullable=False),
    pa.field("step", pa.int64(), nullable=False),
    pa.field("onset_step", pa.int64(), nullable=False),
    pa.field("detector", pa.string(), nullable=False),
    pa.field("signal", pa.string(), nullable=False),
    pa.field("value", pa.float64(), nullable=False),
    pa.field("threshold", pa.float64(), nullable=False),
    pa.field("message", pa.string(), nullable=False),
    pa.field("cause", pa.string(), nullable=False),
    pa.field("fix", pa.string(), nullable=False),
    pa.field("layer", pa.string(), nullable=True),
    pa.field("healthy_rate", pa.float64(), nullable=True),
    pa.field("heldout_rate", pa.float64(), nullable=True),
])
#: The event structs of format versions 1 (before ``healthy_rate``) and 2 (before ``heldout_rate``), still read.
_EVENT_TYPE_V2 = [(f.name, f.type) for f in EVENT_TYPE if f.name != "heldout_rate"]
_EVENT_TYPE_V1 = [(n, ty) for n, ty in _EVENT_TYPE_V2 if n != "healthy_rate"]
_EVENT_FIELDS = tuple(f.name for f in EVENT_TYPE)
_EVENT_FIELD_TYPES = tuple(f.type for f in EVENT_TYPE)
_F64_LIST = pa.list_(pa.float64())
_EVENTS_LIST = pa.list_(EVENT_TYPE)


class TraceFormatError(ValueError):
    """The file is not a trainsignals trace (not Arrow, or Arrow without the trace metadata)."""


class TraceDamagedWarning(UserWarning):
    """A trace was truncated or corrupted: it was read up to the damage.

    Attributes:
        path: The file.
        rows: The records (rows) recovered.
        batches: The complete record batches recovered.
        offset: The byte offset where the damage begins (the end of the last good batch).
    """

    def __init__(self, message: str, path: str = "", rows: int = 0, batches: int = 0, offset: int = 0) -> None:
        super().__init__(message)
        self.path = path
        self.rows = rows
        self.batches = batches
        self.offset = offset

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.path, self.rows, self.batches, self.offset))


# ---------------------------------------------------------------------------------- schema
def _json_default(o: Any) -> Any:
    if isinstance(o, np.generic):
        return o.item()
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    return str(o)


def _metadata_json(metadata: Mapping[str, Any] | None) -> str:
    if metadata is None:
        return "{}"
    if not isinstance(metadata, Mapping):
        raise ValueError(f"metadata must be a mapping (e.g. {{'model': 'resnet18'}}), got {type(metadata).__name__}")
    try:
        return json.dumps({str(k): v for k, v in metadata.items()}, default=_json_default)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"metadata must be JSON-serialisable: {exc}") from exc


def _names(param: str, names: Any) -> tuple[str, ...] | None:
    if names is None:
        return None
    if isinstance(names, (str, bytes)) or not isinstance(names, Iterable):
        raise ValueError(f"{param} must be a sequence of layer names, got {type(names).__name__}")
    out = tuple(str(n) for n in names)
    if len(set(out)) != len(out):
        dup = sorted({n for n in out if out.count(n) > 1})
        raise ValueError(f"{param} must not repeat a name, got {dup} more than once")
    return out


def trace_schema(
    layer_names: Sequence[str] | None = None,
    act_layer_names: Sequence[str] | None = None,
    metadata: Mapping[str, Any] | None = None,
) -> pa.Schema:
    """The Arrow schema of a trace (see the module docstring for the columns).

    Args:
        layer_names: Names of the ``layer_grad_norms`` and ``layer_update_ratios`` entries, in order.
        act_layer_names: Names of the ``act_dead_frac`` / ``act_saturation`` entries, in order.
        metadata: The run's metadata (framework, model, config...), JSON-serialisable.

    Returns:
        The schema, with the ``trainsignals.*`` metadata keys.

    Example:
        >>> s = trace_schema(["fc1", "fc2"], [], {"model": "mlp"})
        >>> s.names[:4]
        ['step', 'wall_time', 'loss', 'grad_norm']
        >>> s.metadata[b"trainsignals.layer_names"]
        b'["fc1", "fc2"]'
    """
    lnames = _names("layer_names", layer_names) or ()
    anames = _names("act_layer_names", act_layer_names) or ()
    fields = [pa.field("step", pa.int64(), nullable=False), pa.field("wall_time", pa.float64())]
    fields += [pa.field(name, pa.float64()) for name in SCALAR_COLUMNS]
    fields += [pa.field(name, _F64_LIST) for name in LIST_COLUMNS]
    fields.append(pa.field("events", _EVENTS_LIST, nullable=False))
    meta = {
        _META_FORMAT: b"trace",
        _META_FORMAT_VERSION: str(TRACE_SCHEMA_VERSION).encode(),
        _META_VERSION: __version__.encode(),
        _META_USER: _metadata_json(metadata).encode(),
        _META_LAYERS: json.dumps(list(lnames)).encode(),
        _META_ACT_LAYERS: json.dumps(list(anames)).encode(),
    }
    return pa.schema(fields, metadata=meta)


_EXPECTED_FIELDS = tuple(trace_schema())


# ------------------------------------------------------------------------- column builders
def _scalar_column(m: int, pos: np.ndarray, data: np.ndarray) -> pa.Array:
    """float64 column of ``m`` rows: ``data`` at rows ``pos``, null elsewhere."""
    k = len(pos)
    if k == 0:
        return pa.nulls(m, pa.float64())
    if k == m:
        return pa.array(np.asarray(data, dtype=np.float64), type=pa.float64())
    vals = np.zeros(m)
    vals[pos] = data
    mask = np.ones(m, dtype=bool)
    mask[pos] = False
    return pa.array(vals, type=pa.float64(), mask=mask)


def _list_column(m: int, pos: np.ndarray, data: np.ndarray) -> pa.Array:
    """list<float64> column of ``m`` rows: row ``pos[i]`` holds ``data[i]`` (2-D), null elsewhere."""
    k = len(pos)
    if k == 0:
        return pa.nulls(m, _F64_LIST)
    width = data.shape[1]
    counts = np.zeros(m, dtype=np.int64)
    counts[pos] = width
    offsets = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    values = pa.array(np.ascontiguousarray(data, dtype=np.float64).reshape(-1), type=pa.float64())
    mask = None
    if k != m:
        mask_np = np.ones(m, dtype=bool)
        mask_np[pos] = False
        mask = pa.array(mask_np)
    return pa.ListArray.from_arrays(pa.array(offsets), values, type=_F64_LIST, mask=mask)


_EMPTY_EVENTS = pa.StructArray.from_arrays(
    [pa.array([], type=t) for t in _EVENT_FIELD_TYPES], fields=list(EVENT_TYPE))


def _events_column(m: int, rows: Sequence[int] | np.ndarray, events: Sequence[Event]) -> pa.Array:
    """list<struct> column of ``m`` rows; ``events[i]`` belongs to row ``rows[i]`` (non-decreasing)."""
    counts = np.bincount(np.asarray(rows, dtype=np.int64), minlength=m) if len(events) else np.zeros(m, np.int64)
    offsets = np.zeros(m + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    if not events:
        child = _EMPTY_EVENTS
    else:
        cols = [
            pa.array([e.kind.value if isinstance(e.kind, Kind) else str(e.kind) for e in events], pa.string()),
            pa.array([e.severity for e in events], pa.string()),
            pa.array([int(e.step) for e in events], pa.int64()),
            pa.array([int(e.onset_step) for e in events], pa.int64()),
            pa.array([e.detector for e in events], pa.string()),
            pa.array([e.signal for e in events], pa.string()),
            pa.array([float(e.value) for e in events], pa.float64()),
            pa.array([float(e.threshold) for e in events], pa.float64()),
            pa.array([e.message for e in events], pa.string()),
            pa.array([e.cause for e in events], pa.string()),
            pa.array([e.fix for e in events], pa.string()),
            pa.array([e.layer for e in events], pa.string()),
            pa.array([e.healthy_rate for e in events], pa.float64()),
            pa.array([e.heldout_rate for e in events], pa.float64()),
        ]
        child = pa.StructArray.from_arrays(cols, fields=list(EVENT_TYPE))
    return pa.ListArray.from_arrays(pa.array(offsets), child, type=_EVENTS_LIST)


def _as_event(e: Any) -> Event:
    if isinstance(e, Event):
        return e
    if isinstance(e, Mapping):
        try:
            return Event.from_dict(dict(e))
        except (TypeError, ValueError, KeyError) as exc:
            raise TypeError(f"events must be Event objects or Event.to_dict() dicts: {exc}") from exc
    raise TypeError(f"events must be Event objects or Event.to_dict() dicts, got {type(e).__name__}")


# -------------------------------------------------------------------------- input parsing
def _is_arrow(x: Any) -> bool:
    return isinstance(x, (pa.Array, pa.ChunkedArray))


def _column_input(name: str, value: Any) -> tuple[np.ndarray, np.ndarray | None]:
    """A 1-D column as float64 values and a measured mask (None: every entry measured), by
    :func:`trainsignals.signals.dense_values` (the one coercion of the Monitor and the traces).
    """
    return dense_values(name, value)


def _steps_input(name: str, value: Any) -> np.ndarray:
    try:
        if _is_arrow(value):
            if value.null_count:
                raise ValueError(f"{name} must not contain nulls")
            value = value.to_numpy(zero_copy_only=False) if isinstance(value, pa.Array) else value.to_numpy()
        st = np.asarray(value)
    except (TypeError, pa.ArrowException) as exc:
        raise TypeError(f"{name} must be a 1-D array of integers") from exc
    if st.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {st.shape}")
    if len(st) and st.dtype.kind not in "iu":
        if st.dtype.kind == "f" and np.all(np.isfinite(st)) and np.all(st == np.round(st)):
            pass
        else:
            raise TypeError(f"{name} must be integers, got dtype {st.dtype}")
    return st.astype(np.int64)


def _is_pair(value: Any) -> bool:
    return (isinstance(value, tuple) and len(value) == 2
            and all(hasattr(v, "__len__") and not isinstance(v, (str, bytes)) for v in value))


def _matrix_input(name: str, value: Any, n: int | None) -> tuple[np.ndarray, np.ndarray, tuple[str, ...] | None]:
    """Per-layer values as an ``(rows, layers)`` matrix, the rows measured, and the names.

    Forms: ``{name: 1-D array}`` (gaps as in :func:`_column_input`; a row is measured where
    any layer is, the missing layers of a partly measured row are NaN), a 2-D array or masked
    array (a row fully masked is a gap), a sequence of rows (``None`` rows are gaps) and a
    pyarrow list array (null rows are gaps).
    """
    if isinstance(value, Mapping):
        names = tuple(str(k) for k in value)
        cols = [_column_input(f"{name}[{k!r}]", v) for k, v in zip(names, value.values())]
        lens = {len(c[0]) for c in cols}
        if len(lens) > 1:
            raise ValueError(f"{name} arrays must have equal lengths, got {sorted(lens)}")
        rows = lens.pop() if lens else (n or 0)
        mat = np.empty((rows, len(names)))
        any_valid = np.zeros(rows, dtype=bool)
        for j, (vals, valid) in enumerate(cols):
            if valid is None:
                mat[:, j] = vals
                any_valid[:] = True
            else:
                mat[:, j] = np.where(valid, vals, np.nan)
                any_valid |= valid
        return mat, any_valid, names
    if _is_arrow(value):
        arr = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else value
        if not pa.types.is_list(arr.type) and not pa.types.is_large_list(arr.type) \
                and not pa.types.is_fixed_size_list(arr.type):
            raise TypeError(f"{name} as a pyarrow array must be a list array, got {arr.type}")
        valid = np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        good = arr.filter(pa.array(valid))
        flat = np.asarray(good.flatten().cast(pa.float64()).fill_null(np.nan).to_numpy(zero_copy_only=False),
                          dtype=np.float64)
        lengths = np.asarray(good.value_lengths().to_numpy(zero_copy_only=False)) if len(good) else np.zeros(0)
        width = int(lengths[0]) if len(lengths) else 0
        if len(lengths) and np.any(lengths != width):
            raise ValueError(f"{name} rows must all have the same number of layers")
        mat = np.full((len(arr), width), np.nan)
        mat[valid] = flat.reshape(-1, width) if width else np.zeros((int(valid.sum()), 0))
        return mat, valid, None
    if isinstance(value, (list, tuple)) and any(r is None for r in value):
        rows_ok = [r for r in value if r is not None]
        valid = np.array([r is not None for r in value], dtype=bool)
        try:
            sub = np.asarray(rows_ok, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError(f"{name} rows must be sequences of real numbers") from exc
        if sub.ndim != 2:
            raise ValueError(f"{name} rows must all have the same number of layers")
        mat = np.full((len(value), sub.shape[1]), np.nan)
        mat[valid] = sub
        return mat, valid, None
    try:
        if isinstance(value, np.ma.MaskedArray):
            mat = np.asarray(np.ma.getdata(value), dtype=np.float64)
            mask = np.ma.getmaskarray(value)
            if mat.ndim == 2:
                rows_valid = np.asarray(~mask.all(axis=1) if mat.shape[1] else np.ones(len(mat), bool), dtype=bool)
                return np.where(mask, np.nan, mat), rows_valid, None
        else:
            mat = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError) as exc:
        raise TypeError(f"{name} must be a mapping {{layer: array}}, a 2-D array or a list array") from exc
    if mat.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, layers), got shape {mat.shape}")
    return mat, np.ones(len(mat), dtype=bool), None


def _acts_input(value: Any, n: int | None) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], tuple[str, ...] | None]:
    """Activation statistics as ``{stat: (matrix (rows, layers), rows measured)}`` and layer names.

    Forms: ``{layer: {"dead_frac": array, "saturation": array}}`` (a statistic no layer gives
    is absent) or ``{"dead_frac": 2-D array, "saturation": 2-D array}`` (layers unnamed).
    """
    if not isinstance(value, Mapping):
        raise TypeError("activations must be {layer: {'dead_frac': array, 'saturation': array}}")
    out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    if value and all(k in _ALL_ACT_STATS for k in value) and not any(isinstance(v, Mapping) for v in value.values()):
        for stat in ACT_STATS:
            if stat in value and value[stat] is not None:
                mat, valid, _ = _matrix_input(f"activations[{stat!r}]", value[stat], n)
                out[stat] = (mat, valid)
        return out, None
    names = tuple(str(k) for k in value)
    for layer, stats in zip(names, value.values()):
        if not isinstance(stats, Mapping):
            raise TypeError(f"activations[{layer!r}] must be a mapping of statistics, got {type(stats).__name__}")
    for stat in ACT_STATS:
        given = {layer: stats.get(stat) for layer, stats in zip(names, value.values())}
        if all(v is None for v in given.values()):
            continue
        lengths = {len(v) for v in given.values() if v is not None and hasattr(v, "__len__")}
        rows = lengths.pop() if len(lengths) == 1 else n
        if rows is None:
            raise ValueError(f"activations {stat} arrays must have equal lengths")
        cols = {layer: (v if v is not None else [None] * rows) for layer, v in given.items()}
        mat, valid, _ = _matrix_input(f"activations[{stat!r}]", cols, rows)
        out[stat] = (mat, valid)
    return out, names


def _occurrence(a: np.ndarray) -> np.ndarray:
    """For each entry, how many equal entries precede it (0 for the first of its step)."""
    if len(a) < 2 or np.all(a[1:] > a[:-1]):
        return np.zeros(len(a), dtype=np.int64)
    order = np.argsort(a, kind="stable")
    sa = a[order]
    occ = np.arange(len(a)) - np.searchsorted(sa, sa, "left")
    out = np.empty(len(a), dtype=np.int64)
    out[order] = occ
    return out


class _Block:
    """Rows assembled from whole arrays: the union of the steps of every source, in step order.

    A dense source is aligned with the primary ``steps``; a sparse one has its own steps and
    lands on the row of the same step (the k-th entry at a step on the k-th row at that
    step). Events land on the first row of their step; every step gets a row.
    """

    def __init__(self, steps: np.ndarray, aligned: dict[str, tuple[np.ndarray, np.ndarray | None]],
                 sparse: dict[str, tuple[np.ndarray, np.ndarray]], events: Sequence[Event],
                 wall: tuple[np.ndarray, np.ndarray | None] | float | None) -> None:
        n = len(steps)
        ev_steps = np.array([e.step for e in events], dtype=np.int64)
        sp_items = list(sparse.items())
        fast = not sp_items and (n == 0 or np.all(steps[1:] >= steps[:-1]))
        if fast and len(ev_steps):
            i = np.searchsorted(steps, ev_steps)
            fast = bool(np.all(i < n) and np.all(steps[np.minimum(i, n - 1)] == ev_steps))
        sp_pos: list[np.ndarray] = []
        if fast:
            union = steps
            primary_pos = np.arange(n)
        else:
            parts_s = [steps] + [s for _, (s, _) in sp_items] + [np.unique(ev_steps)]
            parts_o = [_occurrence(p) for p in parts_s[:-1]] + [np.zeros(len(parts_s[-1]), np.int64)]
            all_s = np.concatenate(parts_s)
            all_o = np.concatenate(parts_o)
            order = np.lexsort((all_o, all_s))
            ss, oo = all_s[order], all_o[order]
            new = np.ones(len(ss), dtype=bool)
            new[1:] = (ss[1:] != ss[:-1]) | (oo[1:] != oo[:-1])
            rowid = np.empty(len(ss), dtype=np.int64)
            rowid[order] = np.cumsum(new) - 1
            union = ss[new]
            primary_pos = rowid[:n]
            start = n
            for p in parts_s[1:-1]:
                sp_pos.append(rowid[start:start + len(p)])
                start += len(p)
        self.steps = union
        self.n = len(union)
        # sources: column -> (positions, data in position order)
        self.sources: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for col, (data, valid) in aligned.items():
            if valid is None:
                self._add(col, primary_pos, data)
            else:
                self._add(col, primary_pos[valid], data[valid])
        for (col, (_, data)), pos in zip(sp_items, sp_pos):
            self._add(col, pos, data)
        if wall is None or isinstance(wall, float):
            self.wall = wall
        else:
            wvals, wvalid = wall
            self._add("wall_time", primary_pos if wvalid is None else primary_pos[wvalid],
                      wvals if wvalid is None else wvals[wvalid])
            self.wall = None
        if len(ev_steps):
            rows = np.searchsorted(union, ev_steps, "left")
            order_e = np.argsort(rows, kind="stable")
            self.ev_rows = rows[order_e]
            self.events = [events[i] for i in order_e]
        else:
            self.ev_rows = np.zeros(0, dtype=np.int64)
            self.events = []

    def _add(self, col: str, pos: np.ndarray, data: np.ndarray) -> None:
        if len(pos) > 1 and not np.all(pos[1:] > pos[:-1]):
            order = np.argsort(pos, kind="stable")
            pos, data = pos[order], data[order]
        self.sources[col] = (pos, data)

    def batches(self, schema: pa.Schema, size: int) -> Iterable[pa.RecordBatch]:
        for a in range(0, self.n, size):
            b = min(self.n, a + size)
            m = b - a
            cols: list[pa.Array] = [pa.array(self.steps[a:b], type=pa.int64())]
            for col in ("wall_time", *SCALAR_COLUMNS, *LIST_COLUMNS):
                if col == "wall_time" and col not in self.sources:
                    cols.append(pa.nulls(m, pa.float64()) if self.wall is None
                                else pa.array(np.full(m, self.wall), type=pa.float64()))
                    continue
                src = self.sources.get(col)
                if src is None:
                    cols.append(pa.nulls(m, _F64_LIST if col in LIST_COLUMNS else pa.float64()))
                    continue
                pos, data = src
                i0, i1 = np.searchsorted(pos, [a, b])
                build = _list_column if col in LIST_COLUMNS else _scalar_column
                cols.append(build(m, pos[i0:i1] - a, data[i0:i1]))
            e0, e1 = np.searchsorted(self.ev_rows, [a, b])
            cols.append(_events_column(m, self.ev_rows[e0:e1] - a, self.events[e0:e1]))
            yield pa.record_batch(cols, schema=schema)


# ------------------------------------------------------------------------------- the writer
def _check_path(path: Any) -> str:
    """The path as a str, or ``ValueError`` naming ``path``."""
    if not isinstance(path, (str, os.PathLike)):
        raise ValueError(f"path must be a file path (str or os.PathLike), got {type(path).__name__}")
    p = os.fspath(path)
    if isinstance(p, bytes):
        p = os.fsdecode(p)
    if not p:
        raise ValueError("path must not be empty")
    if os.path.isdir(p):
        raise ValueError(f"path {p!r} is a folder; give a file name such as {os.path.join(p, 'run.arrow')!r}")
    folder = os.path.dirname(os.path.abspath(p))
    if not os.path.isdir(folder):
        raise ValueError(f"path {p!r}: the folder {folder!r} does not exist")
    return p


def _temp_beside(final: str) -> str:
    """A new empty file in ``final``'s folder, to be written and then renamed over ``final`` with
    :func:`_replace`: created with the permissions ``open()`` gives a new file (0o666 less the
    umask; ``tempfile.mkstemp`` would give 0o600).
    """
    folder = os.path.dirname(os.path.abspath(final))
    base = os.path.basename(final)
    for _ in range(100):
        tmp = os.path.join(folder, f"{base}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for open()
        except FileExistsError:
            continue
        os.close(fd)
        return tmp
    raise FileExistsError(f"no free temporary name beside {final!r}")


def _replace(tmp: str, final: str) -> None:
    """Rename ``tmp`` over ``final``; a file replaced keeps its permissions."""
    try:
        mode = stat.S_IMODE(os.stat(final).st_mode)
    except FileNotFoundError:
        pass
    else:
        os.chmod(tmp, mode)
    os.replace(tmp, final)


_OPEN_WRITERS: weakref.WeakSet[TraceWriter] = weakref.WeakSet()


def _close_open_writers() -> None:  # pragma: no cover - runs at interpreter exit
    for w in list(_OPEN_WRITERS):
        try:
            w.close()
        except Exception:
            pass


atexit.register(_close_open_writers)
_now = time.time
_UNSET = object()


class TraceWriter:
    """Writes a trace, a record batch per ``flush_every`` rows; a :class:`trainsignals.Recorder`.

    ``Monitor(recorder=TraceWriter(path))`` records every ``update`` (one row) and every
    ``scan`` (one row per step) with the events they raised; :meth:`write` records a row by
    hand. At most ``flush_every`` rows wait in memory, whatever the run's length; each flush
    appends one record batch and hands it to the operating system, so a process killed at
    any moment (even by SIGKILL) leaves every flushed row readable. Use it as a context
    manager, or call :meth:`close` (writers still open at interpreter exit are closed).

    The layer names are taken from ``layer_names`` / ``act_layer_names``, else from the first
    row that has per-layer values; a later row with another layer set raises ``ValueError``.
    ``layer_grad_norms`` and ``layer_update_ratios`` are recorded over the same layers
    (``layer_names``): ratios over other layers raise ``ValueError``.

    Args:
        path: The file to write (created or overwritten; its folder must exist).
        metadata: The run's metadata (framework, model, config...), JSON-serialisable.
        flush_every: Rows buffered before a record batch is written, >= 1.
        layer_names: Names of the ``layer_grad_norms`` and ``layer_update_ratios`` entries, in order.
        act_layer_names: Names of the layers whose activation statistics are recorded.
        fsync: Also ``os.fsync`` at each flush (survives a power cut, slower); a flush
            without it survives the process being killed.

    Raises:
        ValueError: a bad ``path`` (a folder, a missing folder, not writable),
            ``flush_every``, ``metadata`` or layer names; the message names the parameter.

    Example:
        >>> import math, os, tempfile
        >>> from trainsignals.io.traces import TraceWriter, read_trace
        >>> path = os.path.join(tempfile.mkdtemp(), "run.arrow")
        >>> with TraceWriter(path, metadata={"model": "mlp"}) as w:
        ...     w.write(0, loss=2.5, lr=0.1, layer_grad_norms={"fc1": 1.0, "fc2": 0.5})
        ...     w.write(1, loss=2.0)
        ...     w.write(2, loss=math.inf, grad_norm=3.0)
        >>> t = read_trace(path)
        >>> t.column("loss").to_pylist(), t.column("grad_norm").to_pylist()
        ([2.5, 2.0, inf], [None, None, 3.0])
        >>> t.column("layer_grad_norms").to_pylist()
        [[1.0, 0.5], None, None]

        Per-layer update ratios go in the order of the trace's layers:

        >>> with TraceWriter(path, layer_names=["fc1", "fc2"]) as w:
        ...     w.write(0, layer_grad_norms=[1.0, 0.5], layer_update_ratios={"fc1": 1e-3, "fc2": 2e-3})
        ...     w.write(1, layer_update_ratios=[1e-3, 1e-9])
        >>> read_trace(path).column("layer_update_ratios").to_pylist()
        [[0.001, 0.002], [0.001, 1e-09]]
        >>> w = TraceWriter(path, layer_names=["fc1", "fc2"])
        >>> w.write(0, layer_update_ratios={"fc2": 1e-3, "head": 1e-3})
        Traceback (most recent call last):
        ...
        ValueError: layer_update_ratios layers differ from the trace's layer_names: the trace has ['fc1', 'fc2'], got ['fc2', 'head'] (the per-layer update ratios are recorded over the layers of layer_grad_norms)
        >>> w.close()
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        metadata: Mapping[str, Any] | None = None,
        flush_every: int = 100,
        layer_names: Sequence[str] | None = None,
        act_layer_names: Sequence[str] | None = None,
        *,
        fsync: bool = False,
    ) -> None:
        self._closed = True  # until the file is open: __del__ / close stay harmless
        p = _check_path(path)
        check_range("flush_every", flush_every, lo=1, integer=True)
        self._meta_json = _metadata_json(metadata)
        self.metadata: dict[str, Any] = json.loads(self._meta_json)
        self._layer_names = _names("layer_names", layer_names)
        self._act_names = _names("act_layer_names", act_layer_names)
        self.path = p
        self.flush_every = int(flush_every)
        self.fsync = bool(fsync)
        try:
            self._raw = pa.OSFile(p, "wb")
        except OSError as exc:
            raise ValueError(f"path {p!r} cannot be opened for writing: {exc}") from exc
        self._out = pa.BufferedOutputStream(self._raw, 1 << 20)
        self._writer: Any = None
        self._schema: pa.Schema | None = None
        self._written_names: tuple[tuple[str, ...], tuple[str, ...]] = ((), ())
        self._rows_written = 0
        self._batches_written = 0
        self._schema_on_disk = False
        self._auto: dict[int, tuple[str, ...]] = {}
        self._ok_layers: Any = _UNSET  # the last names object accepted (an identity check per row)
        self._ok_acts: Any = _UNSET
        self._ok_ratios: Any = _UNSET
        self._b_lbuf: np.ndarray | None = None  # (flush_every, layers), reused between flushes
        self._b_rbuf: np.ndarray | None = None  # (flush_every, layers): the update ratios
        self._b_abuf: np.ndarray | None = None  # (flush_every, 2, layers)
        self._clear()
        self._closed = False
        _OPEN_WRITERS.add(self)

    def plan(self, settings: Mapping[str, Any]) -> None:
        """Note the settings of the Monitor that records here (``Monitor(recorder=w)`` calls it) in the
        trace's metadata as ``monitor_plan``, so that :func:`~trainsignals.io.report.replay` builds
        the same Monitor (the run's stall patience comes from ``total_steps``, the rules' spans from
        ``log_every``, the validation metric's direction from ``val_metric_mode``, ...) even when
        the run stopped early or logged its loss at other steps.

        A writer that already put its first rows on disk cannot change its metadata: it warns and
        records no plan (build the Monitor before writing, or replay with ``total_steps=``).
        """
        if self._closed:  # nothing more can be written: its first write says so
            return
        if self._schema_on_disk:
            warnings.warn(f"{self.path}: rows were written before the Monitor was attached, so its plan "
                          f"(total_steps={settings.get('total_steps')}, log_every={settings.get('log_every')}, ...) "
                          "is not in the trace; replay it with a Monitor built as the live one", stacklevel=3)
            return
        self.metadata["monitor_plan"] = json.loads(_metadata_json(settings))

    # -- state -------------------------------------------------------------------------
    def _clear(self) -> None:
        self._b_step: list[int] = []
        self._b_wall: list[float] = []
        # the scalar signals, a list per column (floats are not tracked by the garbage collector)
        self._b_loss: list[float | None] = []
        self._b_grad: list[float | None] = []
        self._b_lr: list[float | None] = []
        self._b_ratio: list[float | None] = []
        self._b_val: list[float | None] = []
        self._b_metric: list[float | None] = []
        self._b_share: list[float | None] = []
        self._b_spread: list[float | None] = []
        self._b_lpos: list[int] = []  # rows with layer grad norms; their values in _b_lbuf[:k]
        self._b_rpos: list[int] = []  # rows with layer update ratios; their values in _b_rbuf[:k]
        self._b_apos: list[int] = []  # rows with activation statistics; values in _b_abuf[:k]
        self._b_events: list[tuple[int, Sequence[Event]]] = []  # (row, events) of rows with events

    def _layer_buf(self, width: int) -> np.ndarray:
        buf = self._b_lbuf
        if buf is None or buf.shape[1] != width:
            if self._b_lpos:
                raise ValueError(f"layer_grad_norms has {width} values, the trace has {buf.shape[1]} layers"
                                 if buf is not None else "layer_grad_norms width changed")
            buf = self._b_lbuf = np.empty((self.flush_every, width))
        return buf

    def _ratio_buf(self, width: int) -> np.ndarray:
        buf = self._b_rbuf
        if buf is None or buf.shape[1] != width:
            if self._b_rpos:
                raise ValueError(f"layer_update_ratios has {width} values, the trace has {buf.shape[1]} layers"
                                 if buf is not None else "layer_update_ratios width changed")
            buf = self._b_rbuf = np.empty((self.flush_every, width))
        return buf

    def _act_buf(self, width: int) -> np.ndarray:
        buf = self._b_abuf
        if buf is None or buf.shape[2] != width:
            if self._b_apos:
                raise ValueError(f"activations has {width} layers, the trace has {buf.shape[2]}"
                                 if buf is not None else "activations width changed")
            buf = self._b_abuf = np.empty((self.flush_every, 2, width))
        return buf

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    @property
    def buffered(self) -> int:
        """Rows waiting in memory for the next flush (never more than ``flush_every``)."""
        return len(self._b_step)

    @property
    def rows_written(self) -> int:
        """Rows handed to the file so far (flushed)."""
        return self._rows_written

    @property
    def batches_written(self) -> int:
        """Record batches handed to the file so far."""
        return self._batches_written

    @property
    def layer_names(self) -> tuple[str, ...] | None:
        """The ``layer_grad_norms`` / ``layer_update_ratios`` names (None until given or seen)."""
        return self._layer_names

    @property
    def act_layer_names(self) -> tuple[str, ...] | None:
        """The activation-statistics layer names (None until given or seen)."""
        return self._act_names

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (f"TraceWriter({self.path!r}, {state}, rows_written={self._rows_written}, "
                f"buffered={self.buffered}, flush_every={self.flush_every})")

    def __enter__(self) -> TraceWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:
            pass

    def _check_open(self) -> None:
        if self._closed:
            raise ValueError(f"TraceWriter({self.path!r}) is closed: cannot write to it")

    def _auto_names(self, width: int) -> tuple[str, ...]:
        names = self._auto.get(width)
        if names is None:
            names = self._auto[width] = tuple(f"layer{i}" for i in range(width))
        return names

    def _resolve(self, kind: str, names: tuple[str, ...] | None, width: int) -> tuple[str, ...]:
        """The names of a per-layer row of ``width`` values; learns them or checks them."""
        nm = self._check_width(kind, names, width)
        self._learn(kind, nm)
        return nm

    def _learn(self, kind: str, names: tuple[str, ...] | None) -> None:
        """Adopt checked layer names (``kind``: a per-layer column, or ``activations``) if none yet."""
        if names is None:
            return
        if kind == "activations":
            if self._act_names is None:
                self._act_names = names
        elif self._layer_names is None:
            self._layer_names = names

    def _check_layers(self, grad: tuple[Any, int] | None, ratios: tuple[Any, int] | None) -> tuple[str, ...] | None:
        """The layer names of ``(names or None, width)`` grad norms and update ratios recorded together:
        checked against the trace's and against each other, not yet learned (None: neither given).
        """
        g = None if grad is None else self._check_width("layer_grad_norms", grad[0], grad[1])
        if ratios is None:
            return g
        current = self._layer_names if self._layer_names is not None else g
        return self._check_width("layer_update_ratios", ratios[0], ratios[1], current)

    # -- recording -----------------------------------------------------------------------
    def record(
        self,
        *,
        step: int,
        signals: Mapping[str, float],
        layer_grad_norms: tuple[np.ndarray, tuple[str, ...]] | None,
        activations: tuple[np.ndarray, tuple[str, ...]] | None,
        events: Sequence[Event],
        layer_update_ratios: tuple[np.ndarray, tuple[str, ...]] | None = None,
    ) -> None:
        """One update of a Monitor (the :class:`trainsignals.Recorder` protocol): one row.

        Args:
            step: The step.
            signals: The scalar signals measured, as floats (absent: not measured).
            layer_grad_norms: ``(vector, layer names)`` or None.
            activations: ``(matrix (2, layers): dead_frac, saturation rows; layer names)`` or None.
            events: The events raised at this step.
            layer_update_ratios: ``(vector, layer names)`` or None; the layers of ``layer_grad_norms``.

        Raises:
            ValueError: the writer is closed, or the layers differ from the trace's.
        """
        if self._closed:
            self._check_open()
        for v in signals.values():
            if type(v) is not float:
                signals = {k2: to_float(k2, v2) for k2, v2 in signals.items()}
                break
        row = len(self._b_step)
        learn: tuple[str, ...] | None = None
        if (layer_grad_norms is not None and layer_grad_norms[1] is not self._layer_names
                and layer_grad_norms[1] is not self._ok_layers) or (
                layer_update_ratios is not None and layer_update_ratios[1] is not self._layer_names
                and layer_update_ratios[1] is not self._ok_ratios):
            learn = self._check_layers(
                None if layer_grad_norms is None else (layer_grad_norms[1], len(layer_grad_norms[0])),
                None if layer_update_ratios is None else (layer_update_ratios[1], len(layer_update_ratios[0])))
        if activations is not None:
            mat, anames = activations
            mat = np.asarray(mat, dtype=np.float64)
            if mat.ndim != 2 or mat.shape[0] != 2:
                raise ValueError(f"activations must be a (2, layers) matrix, got shape {mat.shape}")
            if anames is not self._act_names and anames is not self._ok_acts:
                self._resolve("activations", tuple(anames) if anames is not None else None, mat.shape[1])
                self._ok_acts = anames
            self._act_buf(mat.shape[1])[len(self._b_apos)] = mat
        if learn is not None:  # every check passed
            self._learn("layer_grad_norms", learn)
            if layer_grad_norms is not None and layer_grad_norms[1] is not None:
                self._ok_layers = layer_grad_norms[1]
            if layer_update_ratios is not None and layer_update_ratios[1] is not None:
                self._ok_ratios = layer_update_ratios[1]
        if layer_grad_norms is not None:
            vec = layer_grad_norms[0]
            buf = self._b_lbuf
            if buf is None or buf.shape[1] != len(vec):
                buf = self._layer_buf(len(vec))
            buf[len(self._b_lpos)] = vec
            self._b_lpos.append(row)
        if layer_update_ratios is not None:
            vec = layer_update_ratios[0]
            buf = self._b_rbuf
            if buf is None or buf.shape[1] != len(vec):
                buf = self._ratio_buf(len(vec))
            buf[len(self._b_rpos)] = vec
            self._b_rpos.append(row)
        if activations is not None:
            self._b_apos.append(row)
        self._b_step.append(int(step))
        self._b_wall.append(_now())
        get = signals.get
        self._b_loss.append(get("loss"))
        self._b_grad.append(get("grad_norm"))
        self._b_lr.append(get("lr"))
        self._b_ratio.append(get("update_ratio"))
        self._b_val.append(get("val_loss"))
        self._b_metric.append(get("val_metric"))
        self._b_share.append(get("pred_top_share"))
        self._b_spread.append(get("pred_spread"))
        if events:
            self._b_events.append((row, tuple(events)))
        if row + 1 >= self.flush_every:
            self.flush()

    def write(
        self,
        step: int,
        *,
        loss: Any = None,
        grad_norm: Any = None,
        lr: Any = None,
        update_ratio: Any = None,
        val_loss: Any = None,
        layer_grad_norms: Any = None,
        activations: Any = None,
        events: Iterable[Event | Mapping[str, Any]] = (),
        wall_time: float | None = None,
        layer_update_ratios: Any = None,
        val_metric: Any = None,
        pred_top_share: Any = None,
        pred_spread: Any = None,
    ) -> None:
        """Record one row by hand (the signals measured at ``step``; None: not measured).

        Args:
            step: The step (an integer).
            loss: Training loss; NaN/±inf are recorded as measured non-finite values.
            grad_norm: Global gradient norm.
            lr: Learning rate.
            update_ratio: ``‖Δw‖/‖w‖``.
            val_loss: Validation loss.
            layer_grad_norms: ``{name: value}``, or a sequence/array in the trace's layer order.
            activations: ``{layer: {"dead_frac": f, "saturation": f}}``, or
                ``{"dead_frac": vector, "saturation": vector}`` in the trace's layer order.
            events: Events (or their ``to_dict()`` dicts) raised at this step.
            wall_time: Seconds since the epoch (default: now).
            layer_update_ratios: Per-layer ``‖Δw‖/‖w‖``: ``{name: value}``, or a sequence/array in
                the trace's layer order; the layers of ``layer_grad_norms``.
            val_metric: A validation metric (accuracy, ...).
            pred_top_share: Share of the most-predicted class in a sampled batch, in [0, 1].
            pred_spread: Spread of a sampled batch's predictions (a regression's), >= 0.

        Raises:
            TypeError: a signal is not a number (the message names it).
            ValueError: the writer is closed, or the layers differ from the trace's.
        """
        if self._closed:
            self._check_open()
        s = step if type(step) is int else to_step(step)
        if loss is not None and type(loss) is not float:
            loss = to_float("loss", loss)
        if grad_norm is not None and type(grad_norm) is not float:
            grad_norm = to_float("grad_norm", grad_norm)
        if lr is not None and type(lr) is not float:
            lr = to_float("lr", lr)
        if update_ratio is not None and type(update_ratio) is not float:
            update_ratio = to_float("update_ratio", update_ratio)
        if val_loss is not None and type(val_loss) is not float:
            val_loss = to_float("val_loss", val_loss)
        if val_metric is not None:
            val_metric = scalar("val_metric", val_metric)
        if pred_top_share is not None:
            pred_top_share = scalar("pred_top_share", pred_top_share)
        if pred_spread is not None:
            pred_spread = scalar("pred_spread", pred_spread)
        lg = lr_ = None
        gspec: tuple[tuple[str, ...] | None, int] | None = None  # (names or None, width) to check
        rspec: tuple[tuple[str, ...] | None, int] | None = None
        current = self._layer_names
        if layer_grad_norms is not None:
            if (type(layer_grad_norms) is np.ndarray and layer_grad_norms.ndim == 1
                    and current is not None and len(current) == len(layer_grad_norms)):
                lg = layer_grad_norms  # the fast path: a vector in the trace's layer order
            elif isinstance(layer_grad_norms, Mapping):
                lg, names = as_named_vector("layer_grad_norms", layer_grad_norms, None)
                gspec = (names, len(lg))
            else:
                lg, _ = as_named_vector("layer_grad_norms", layer_grad_norms, current)
                gspec = (None, len(lg))
        if layer_update_ratios is not None:
            if (type(layer_update_ratios) is np.ndarray and layer_update_ratios.ndim == 1
                    and current is not None and len(current) == len(layer_update_ratios)):
                lr_ = layer_update_ratios
            else:
                lr_, rnames = as_named_vector("layer_update_ratios", layer_update_ratios, None)
                rspec = (rnames if isinstance(layer_update_ratios, Mapping) else None, len(lr_))
        learn = self._check_layers(gspec, rspec) if gspec is not None or rspec is not None else None
        ac = None
        if activations is not None:
            stats, anames = _acts_input(
                {k: ({s2: [v2] for s2, v2 in v.items()} if isinstance(v, Mapping) else [v])
                 for k, v in activations.items()} if isinstance(activations, Mapping) else activations, 1)
            width = max((m.shape[1] for m, _ in stats.values()), default=len(anames or ()))
            ac = np.full((2, width), np.nan)
            for r, stat in enumerate(ACT_STATS):
                if stat in stats:
                    ac[r] = stats[stat][0][0]
            self._resolve("activations", anames, width)
        evs = tuple(_as_event(e) for e in events) if events else ()
        wt = _now() if wall_time is None else to_float("wall_time", wall_time)
        self._learn("layer_grad_norms", learn)  # every check passed
        row = len(self._b_step)
        if lg is not None:
            self._layer_buf(len(lg))[len(self._b_lpos)] = lg
            self._b_lpos.append(row)
        if lr_ is not None:
            self._ratio_buf(len(lr_))[len(self._b_rpos)] = lr_
            self._b_rpos.append(row)
        if ac is not None:
            self._act_buf(ac.shape[1])[len(self._b_apos)] = ac
            self._b_apos.append(row)
        self._b_step.append(s)
        self._b_wall.append(wt)
        self._b_loss.append(loss)
        self._b_grad.append(grad_norm)
        self._b_lr.append(lr)
        self._b_ratio.append(update_ratio)
        self._b_val.append(val_loss)
        self._b_metric.append(val_metric)
        self._b_share.append(pred_top_share)
        self._b_spread.append(pred_spread)
        if evs:
            self._b_events.append((row, evs))
        if row + 1 >= self.flush_every:
            self.flush()

    def record_batch(
        self,
        *,
        steps: np.ndarray,
        signals: Mapping[str, Any],
        val_loss: tuple[np.ndarray, np.ndarray] | None,
        layer_grad_norms: tuple[np.ndarray, np.ndarray, tuple[str, ...] | None] | None,
        activations: tuple[np.ndarray, Mapping[str, Any]] | None,
        events: Sequence[Event],
        layer_update_ratios: tuple[np.ndarray, np.ndarray, tuple[str, ...] | None] | None = None,
        val_metric: tuple[np.ndarray, np.ndarray] | None = None,
    ) -> None:
        """One ``scan`` of a Monitor (the :class:`trainsignals.Recorder` protocol).

        Writes one row per step (the union of ``steps`` and the steps of the sparse
        signals), in record batches of at most ``flush_every`` rows, after the rows buffered
        before it.

        Args:
            steps: The steps of the dense signals.
            signals: Dense signals aligned with ``steps`` (a masked entry, a pyarrow null or
                a None is a gap: not measured).
            val_loss: ``(steps, values)`` or None.
            layer_grad_norms: ``(steps, matrix (n, layers), names or None)`` or None.
            activations: ``(steps, {layer: {stat: array}})`` or None.
            events: The events the scan raised (each lands on the row of its step).
            layer_update_ratios: ``(steps, matrix (n, layers), names or None)`` or None; the layers
                of ``layer_grad_norms``.
            val_metric: ``(steps, values)`` or None.

        Raises:
            ValueError: the writer is closed, lengths disagree, or the layers differ from the trace's.
        """
        self._check_open()
        st = _steps_input("steps", steps)
        aligned: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        sparse: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, v in signals.items():
            if name not in SCALAR_COLUMNS:
                raise ValueError(f"unknown signal {name!r}; expected one of {SCALAR_COLUMNS}")
            vals, valid = _column_input(name, v)
            if len(vals) != len(st):
                raise ValueError(f"{name} has {len(vals)} values for {len(st)} steps")
            aligned[name] = (vals, valid)
        for name, pair in (("val_loss", val_loss), ("val_metric", val_metric)):
            if pair is not None:
                vst = _steps_input(f"{name} steps", pair[0])
                vv, vvalid = _column_input(name, pair[1])
                if len(vv) != len(vst):
                    raise ValueError(f"{name} has {len(vv)} values for {len(vst)} steps")
                sparse[name] = (vst, vv) if vvalid is None else (vst[vvalid], vv[vvalid])
        anames = None
        specs: dict[str, tuple[Any, int]] = {}
        for col, given in (("layer_grad_norms", layer_grad_norms), ("layer_update_ratios", layer_update_ratios)):
            if given is not None:
                src_steps, mat_raw, names_raw = given
                mat, valid, _ = _matrix_input(col, mat_raw, None)
                specs[col] = (names_raw, mat.shape[1])
                self._place(col, src_steps, steps, st, mat, valid, aligned, sparse)
        lnames = self._check_layers(specs.get("layer_grad_norms"), specs.get("layer_update_ratios"))
        if activations is not None:
            ast_raw, amap = activations
            stats, an = _acts_input(amap, None)
            if stats:
                width = next(iter(stats.values()))[0].shape[1]
                anames = self._check_width("activations", an, width)
                for stat, (mat, valid) in stats.items():
                    self._place(f"act_{stat}", ast_raw, steps, st, mat, valid, aligned, sparse)
        block = _Block(st, aligned, sparse, list(events), _now())
        # every check passed: learn the names, then write
        self._learn("layer_grad_norms", lnames)
        if anames is not None:
            self._resolve("activations", anames, len(anames))
        self.flush()
        self._write_block(block)

    def _check_width(self, kind: str, names: Any, width: int, current: Any = _UNSET) -> tuple[str, ...]:
        """The names a per-layer row or matrix of ``width`` values will be recorded under (checked, not yet
        learned) against ``current`` (default: the trace's names for ``kind``).
        """
        if current is _UNSET:
            current = self._act_names if kind == "activations" else self._layer_names
        cur: tuple[str, ...] | None = current
        nm = tuple(str(x) for x in names) if names is not None else None
        if nm is not None and len(nm) != width:
            raise ValueError(f"{kind} has {width} layers but {len(nm)} names")
        if nm is None or (cur is not None and nm == self._auto_names(width)):
            # unnamed values (or the Monitor's default names): the trace's names when the width fits
            nm = cur if cur is not None and len(cur) == width else self._auto_names(width)
        if cur is None:
            return nm
        if nm is not cur and nm != cur:
            if kind == "layer_update_ratios":
                raise ValueError(f"layer_update_ratios layers differ from the trace's layer_names: the trace has "
                                 f"{list(cur)}, got {list(nm)} (the per-layer update ratios are recorded "
                                 "over the layers of layer_grad_norms)")
            raise ValueError(f"{kind} layers changed: the trace has {list(cur)}, got {list(nm)} "
                             "(a trace holds one layer set; pass layer_names= or start a new trace)")
        return cur

    @staticmethod
    def _place(col: str, src_steps: Any, steps_obj: Any, steps: np.ndarray, mat: np.ndarray, valid: np.ndarray,
               aligned: dict[str, tuple[np.ndarray, np.ndarray | None]],
               sparse: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
        if src_steps is steps_obj or src_steps is steps:
            if len(mat) != len(steps):
                raise ValueError(f"{col} has {len(mat)} rows for {len(steps)} steps")
            aligned[col] = (mat, None if valid.all() else valid)
            return
        sst = _steps_input(f"{col} steps", src_steps)
        if len(sst) != len(mat):
            raise ValueError(f"{col} has {len(mat)} rows for {len(sst)} steps")
        if len(sst) == len(steps) and np.array_equal(sst, steps):
            aligned[col] = (mat, None if valid.all() else valid)
        else:
            sparse[col] = (sst[valid], mat[valid])

    # -- writing -------------------------------------------------------------------------
    def _ensure_writer(self) -> pa.Schema:
        names = (self._layer_names or (), self._act_names or ())
        if self._writer is None:
            self._schema = trace_schema(names[0], names[1], self.metadata)
            self._writer = pa.ipc.new_stream(self._out, self._schema)
            self._written_names = names
        elif names != self._written_names:
            self._rewrite(names)
        assert self._schema is not None
        return self._schema

    def _rewrite(self, names: tuple[tuple[str, ...], tuple[str, ...]]) -> None:
        """Layer names learned after the first flush: rewrite the (layer-less) rows so far under
        a schema that carries them. Happens at most once per layer kind; streams batch by batch.
        """
        assert self._schema is not None
        new_schema = self._schema.with_metadata({
            **self._schema.metadata,
            _META_LAYERS: json.dumps(list(names[0])).encode(),
            _META_ACT_LAYERS: json.dumps(list(names[1])).encode(),
        })
        self._writer.close()
        self._out.close()
        tmp = _temp_beside(self.path)
        try:
            raw = pa.OSFile(tmp, "wb")
            out = pa.BufferedOutputStream(raw, 1 << 20)
            writer = pa.ipc.new_stream(out, new_schema)
            with pa.OSFile(self.path) as src:
                for batch in pa.ipc.open_stream(src):
                    writer.write_batch(pa.record_batch(batch.columns, schema=new_schema))
            out.flush()
            _replace(tmp, self.path)
        except Exception as exc:
            self._closed = True
            _OPEN_WRITERS.discard(self)
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise ValueError(f"could not rewrite {self.path!r} with the layer names learned after the first "
                             f"flush ({exc}); pass layer_names= / act_layer_names= to TraceWriter") from exc
        self._raw, self._out, self._writer, self._schema = raw, out, writer, new_schema
        self._written_names = names

    def _emit(self, batch: pa.RecordBatch) -> None:
        self._writer.write_batch(batch)
        self._rows_written += batch.num_rows
        self._batches_written += 1
        self._schema_on_disk = True

    def _sync(self) -> None:
        self._out.flush()
        if self.fsync:
            os.fsync(self._raw.fileno())

    def _write_block(self, block: _Block) -> None:
        schema = self._ensure_writer()
        for batch in block.batches(schema, self.flush_every):
            self._emit(batch)
            self._sync()
        self._sync()

    def _buffer_batch(self, schema: pa.Schema) -> pa.RecordBatch:
        m = len(self._b_step)
        cols: list[pa.Array] = [pa.array(self._b_step, type=pa.int64()), pa.array(self._b_wall, type=pa.float64())]
        for col in (self._b_loss, self._b_grad, self._b_lr, self._b_ratio, self._b_val, self._b_metric,
                    self._b_share, self._b_spread):  # SCALAR_COLUMNS order
            cols.append(pa.array(col, type=pa.float64()))
        for pos, lbuf in ((self._b_lpos, self._b_lbuf), (self._b_rpos, self._b_rbuf)):  # LAYER_COLUMNS order
            k = len(pos)
            if k:
                assert lbuf is not None
                cols.append(_list_column(m, np.array(pos, dtype=np.int64), lbuf[:k]))
            else:
                cols.append(pa.nulls(m, _F64_LIST))
        k = len(self._b_apos)
        if k:
            assert self._b_abuf is not None
            apos = np.array(self._b_apos, dtype=np.int64)
            for r in range(2):
                vals = self._b_abuf[:k, r]
                given = ~np.isnan(vals).all(axis=1)  # a statistic given for no layer: null
                cols.append(_list_column(m, apos[given], vals[given]))
        else:
            cols += [pa.nulls(m, _F64_LIST), pa.nulls(m, _F64_LIST)]
        ev_rows: list[int] = []
        evs: list[Event] = []
        for i, row in self._b_events:
            ev_rows.extend([i] * len(row))
            evs.extend(row)
        cols.append(_events_column(m, ev_rows, evs))
        return pa.record_batch(cols, schema=schema)

    def flush(self) -> None:
        """Write the buffered rows as one record batch and hand it to the operating system.

        Writes the schema if not yet written. A no-op once closed.
        """
        if self._closed:
            return
        schema = self._ensure_writer()
        if self._b_step:
            batch = self._buffer_batch(schema)
            self._clear()
            self._emit(batch)
        elif not self._batches_written and not self._schema_on_disk:
            # pyarrow writes the schema with the first batch: an empty one puts it on disk now
            self._writer.write_batch(pa.RecordBatch.from_pylist([], schema=schema))
        self._schema_on_disk = True
        self._sync()

    def close(self) -> None:
        """Flush, write the end-of-stream marker and close the file. Idempotent."""
        if self._closed:
            return
        try:
            self.flush()
        finally:
            self._closed = True
            _OPEN_WRITERS.discard(self)
            try:
                if self._writer is not None:
                    self._writer.close()
            finally:
                self._out.close()


# ------------------------------------------------------------------------------- write_trace
def write_trace(
    path: str | os.PathLike[str],
    *,
    step: Any = None,
    loss: Any = None,
    grad_norm: Any = None,
    lr: Any = None,
    update_ratio: Any = None,
    val_loss: Any = None,
    layer_grad_norms: Any = None,
    activations: Any = None,
    events: Iterable[Event | Mapping[str, Any]] = (),
    wall_time: Any = None,
    metadata: Mapping[str, Any] | None = None,
    layer_names: Sequence[str] | None = None,
    act_layer_names: Sequence[str] | None = None,
    flush_every: int = 10_000,
    layer_update_ratios: Any = None,
    val_metric: Any = None,
    pred_top_share: Any = None,
    pred_spread: Any = None,
) -> int:
    """Write a whole run at once (importers, ``trainsignals convert``); the keywords of ``Monitor.scan``.

    Dense signals are 1-D arrays aligned with ``step``: lists, NumPy arrays (masked arrays
    too), pandas/polars columns or pyarrow arrays. A gap — ``None`` in a list, a masked entry,
    a pyarrow null — means "not measured at this step"; NaN/±inf are measured non-finite
    values and stay so. A signal with its own cadence is a ``(steps, values)`` pair, as
    :func:`trace_signals` returns them, so ``write_trace(p, **trace_signals(table))`` copies a
    trace. The file appears whole or not at all (written beside it, then renamed), so a
    failed import leaves an existing file untouched.

    Args:
        path: The file to write (created or overwritten).
        step: The steps (integers), one per row; None (no aligned rows) only when every signal
            given is a ``(steps, values)`` pair, as :func:`trace_signals` returns a trace
            without a dense signal.
        loss: Training loss, aligned with ``step``.
        grad_norm: Global gradient norm, aligned with ``step``.
        lr: Learning rate, aligned with ``step``.
        update_ratio: ``‖Δw‖/‖w‖``, aligned with ``step``.
        val_loss: Aligned with ``step`` (gaps where not measured) or ``(steps, values)``.
        layer_grad_norms: ``{name: array}`` / 2-D array / list of rows (``None`` rows are
            gaps) aligned with ``step``, or ``(steps, {name: array} or 2-D array)``.
        activations: ``{layer: {"dead_frac": array, "saturation": array}}`` aligned with
            ``step``, or ``(steps, that mapping)``.
        events: Events (or ``to_dict()`` dicts); each lands on the first row of its step.
        wall_time: Seconds since the epoch, aligned with ``step`` (default: null).
        metadata: The run's metadata (framework, model, config...), JSON-serialisable.
        layer_names: Names of unnamed ``layer_grad_norms`` / ``layer_update_ratios`` columns.
        act_layer_names: Names of unnamed activation columns.
        flush_every: Rows per record batch.
        layer_update_ratios: Per-layer ``‖Δw‖/‖w‖``, in the forms of ``layer_grad_norms`` and
            over the same layers.
        val_metric: A validation metric, aligned with ``step`` or ``(steps, values)``.
        pred_top_share: Share of the most-predicted class, aligned with ``step`` or
            ``(steps, values)``.
        pred_spread: Spread of a regression's predictions, aligned with ``step`` or
            ``(steps, values)``.

    Returns:
        The number of rows written (the steps of ``step`` plus those only a sparse signal or
        an event has).

    Raises:
        TypeError: a signal is not numeric (the message names it).
        ValueError: lengths disagree, the per-layer signals' layers differ, a bad path or
            parameter.

    Example:
        >>> import math, os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "imported.arrow")
        >>> write_trace(p, step=[0, 1, 2], loss=[1.0, None, math.nan], val_loss=([2], [1.5]))
        3
        >>> t = read_trace(p)
        >>> t.column("loss").to_pylist(), t.column("val_loss").to_pylist()
        ([1.0, None, nan], [None, None, 1.5])
    """
    final = _check_path(path)
    try:
        tmp = _temp_beside(final)
    except OSError as exc:
        folder = os.path.dirname(os.path.abspath(final))
        raise ValueError(f"path {final!r}: cannot write in {folder!r}: {exc}") from exc
    try:
        n = _write_whole(tmp, step=step, loss=loss, grad_norm=grad_norm, lr=lr, update_ratio=update_ratio,
                         val_loss=val_loss, layer_grad_norms=layer_grad_norms, activations=activations,
                         events=events, wall_time=wall_time, metadata=metadata, layer_names=layer_names,
                         act_layer_names=act_layer_names, flush_every=flush_every,
                         layer_update_ratios=layer_update_ratios, val_metric=val_metric,
                         pred_top_share=pred_top_share, pred_spread=pred_spread)
        _replace(tmp, final)  # all or nothing: a failed import leaves no half-written trace
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return n


def _write_whole(path: str, *, step: Any, loss: Any, grad_norm: Any, lr: Any, update_ratio: Any, val_loss: Any,
                 layer_grad_norms: Any, activations: Any, events: Iterable[Event | Mapping[str, Any]],
                 wall_time: Any, metadata: Mapping[str, Any] | None, layer_names: Sequence[str] | None,
                 act_layer_names: Sequence[str] | None, flush_every: int, layer_update_ratios: Any,
                 val_metric: Any = None, pred_top_share: Any = None, pred_spread: Any = None) -> int:
    with TraceWriter(path, metadata=metadata, flush_every=flush_every, layer_names=layer_names,
                     act_layer_names=act_layer_names) as w:
        st = _steps_input("step", step) if step is not None else np.zeros(0, dtype=np.int64)
        n = len(st)
        aligned: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
        sparse: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name, v in (("loss", loss), ("grad_norm", grad_norm), ("lr", lr), ("update_ratio", update_ratio),
                        ("val_loss", val_loss), ("val_metric", val_metric), ("pred_top_share", pred_top_share),
                        ("pred_spread", pred_spread)):
            if v is None:
                continue
            if name in ("val_loss", "val_metric", "pred_top_share", "pred_spread") and _is_pair(v):
                vst = _steps_input(f"{name} steps", v[0])
                vv, vvalid = _column_input(name, v[1])
                if len(vv) != len(vst):
                    raise ValueError(f"{name} has {len(vv)} values for {len(vst)} steps")
                sparse[name] = (vst, vv) if vvalid is None else (vst[vvalid], vv[vvalid])
                continue
            vals, valid = _column_input(name, v)
            if step is None and len(vals):
                raise ValueError(f"{name} is aligned with step, which is missing: give step= (or {name} as a "
                                 "(steps, values) pair where it has its own cadence)")
            if len(vals) != n:
                raise ValueError(f"{name} has {len(vals)} values for {n} steps")
            aligned[name] = (vals, valid)
        wall: tuple[np.ndarray, np.ndarray | None] | None = None
        if wall_time is not None:
            wall = _column_input("wall_time", wall_time)
            if len(wall[0]) != n:
                raise ValueError(f"wall_time has {len(wall[0])} values for {n} steps")
        anames = None
        specs: dict[str, tuple[Any, int]] = {}
        for col, given in (("layer_grad_norms", layer_grad_norms), ("layer_update_ratios", layer_update_ratios)):
            if given is None:
                continue
            if _is_pair(given):
                src_steps, value = given
            else:
                src_steps, value = st, given
            mat, valid, nm = _matrix_input(col, value, n)
            specs[col] = (nm, mat.shape[1])
            TraceWriter._place(col, src_steps, st, st, mat, valid, aligned, sparse)  # noqa: SLF001 - this module's own writer
        lnames = w._check_layers(specs.get("layer_grad_norms"), specs.get("layer_update_ratios"))  # noqa: SLF001 - this module's own writer
        if activations is not None:
            if _is_pair(activations) and not isinstance(activations, Mapping):
                src_steps, amap = activations
            else:
                src_steps, amap = st, activations
            stats, an = _acts_input(amap, None if src_steps is not st else n)
            if stats:
                width = next(iter(stats.values()))[0].shape[1]
                anames = w._check_width("activations", an, width)  # noqa: SLF001 - this module's own writer
                for stat, (mat, valid) in stats.items():
                    TraceWriter._place(f"act_{stat}", src_steps, st, st, mat, valid, aligned, sparse)  # noqa: SLF001 - this module's own writer
        evs = [_as_event(e) for e in events]
        block = _Block(st, aligned, sparse, evs, wall)
        w._learn("layer_grad_norms", lnames)  # noqa: SLF001 - this module's own writer
        if anames is not None:
            w._resolve("activations", anames, len(anames))  # noqa: SLF001 - this module's own writer
        w._write_block(block)  # noqa: SLF001 - this module's own writer
        return block.n


# --------------------------------------------------------------------------------- reading
def _fmt_path(path: Any) -> str:
    try:
        return os.fspath(path) if not isinstance(path, bytes) else os.fsdecode(path)
    except TypeError:
        return repr(path)


def _not_arrow_hint(head: bytes) -> str:
    if head.startswith(b"ARROW1"):
        return "it is an Arrow IPC *file* (random-access format); a trace is an Arrow IPC stream"
    if head.startswith(b"PAR1"):
        return "it is a Parquet file"
    if not head:
        return "the file is empty (a TraceWriter that stopped before its first flush leaves it so)"
    return "not an Arrow IPC stream"


def _check_schema(schema: pa.Schema, where: str) -> None:
    meta = schema.metadata or {}
    if meta.get(_META_FORMAT) != b"trace":
        raise TraceFormatError(
            f"{where} is an Arrow stream but not a trainsignals trace "
            f"(its schema metadata has no trainsignals.format=trace; columns: {schema.names[:8]})")
    try:
        version = int(meta.get(_META_FORMAT_VERSION, b"1"))
    except ValueError as exc:
        raise TraceFormatError(f"{where}: bad trainsignals.format_version {meta.get(_META_FORMAT_VERSION)!r}") from exc
    if version > TRACE_SCHEMA_VERSION:
        raise TraceFormatError(f"{where} is a trace of format version {version}, newer than this trainsignals "
                               f"({__version__}) reads (version {TRACE_SCHEMA_VERSION}): upgrade trainsignals")
    try:
        _ = schema.names  # every column name must decode (a damaged byte in one would fail later reads)
        for f in _EXPECTED_FIELDS:
            i = schema.get_field_index(f.name)
            if i < 0:
                if f.name in _OPTIONAL_COLUMNS:  # written before the column existed
                    continue
                raise TraceFormatError(f"{where}: trace without a {f.name!r} column")
            t = schema.field(i).type
            if f.name == "events":  # compare names and types, not nullability
                ok = pa.types.is_list(t) and pa.types.is_struct(t.value_type) and [
                    (c.name, c.type) for c in t.value_type] in (
                    [(c.name, c.type) for c in EVENT_TYPE], _EVENT_TYPE_V2, _EVENT_TYPE_V1)
            else:
                ok = t.equals(f.type)
            if not ok:
                raise TraceFormatError(f"{where}: column {f.name!r} is {t}, expected {f.type}")
    except UnicodeDecodeError as exc:
        raise TraceFormatError(f"{where}: the trace's schema is corrupted ({exc})") from None


_KINDS = pa.array([k.value for k in Kind], pa.string())
_SEVERITIES = pa.array(list(SEVERITIES), pa.string())


def _check_batch(batch: pa.RecordBatch) -> None:
    """Structural checks of a record batch read from a file (raises on damage)."""
    batch.validate(full=True)
    if batch.column(0).null_count:
        raise ValueError("null steps")
    events = batch.column(batch.schema.get_field_index("events"))
    if len(events.values):
        ev = events.flatten()
        for name, allowed in (("kind", _KINDS), ("severity", _SEVERITIES)):
            col = ev.field(name)
            if col.null_count or not pc.all(pc.is_in(col, value_set=allowed)).as_py():
                raise ValueError(f"unknown event {name}")


def read_trace(path: str | os.PathLike[str]) -> pa.Table:
    """Read a trace: every complete record batch, as one table.

    A truncated or corrupted file (a run killed mid-flush, a partial copy) is read up to the
    damage, with a :class:`TraceDamagedWarning` saying how many records were recovered. A file
    ending cleanly after a batch (a run killed between flushes, or still writing) reads
    without warning.

    Args:
        path: The trace file.

    Returns:
        A ``pyarrow.Table`` in the trace schema (no rows for an empty trace). A column that
        traces written before it existed lack (``layer_update_ratios``) is added, all null.

    Raises:
        TraceFormatError: the file is not a trace (not an Arrow stream, or an Arrow stream
            without ``trainsignals.format=trace``).
        FileNotFoundError: no such file.

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "t.arrow")
        >>> with TraceWriter(p) as w:
        ...     for s in range(3):
        ...         w.write(s, loss=1.0 / (s + 1))
        >>> read_trace(p).column("step").to_pylist()
        [0, 1, 2]
    """
    where = _fmt_path(path)
    if os.path.isdir(where):
        raise IsADirectoryError(f"{where} is a folder, not a trace file")
    with pa.OSFile(where) as fh:
        data = fh.read_buffer()  # one snapshot of the file (a writer may still be appending)
    size = data.size
    head = data[:8].to_pybytes()
    with pa.BufferReader(data) as src:
        try:
            reader = pa.ipc.open_stream(src)
            schema = reader.schema
        except Exception as exc:
            raise TraceFormatError(f"{where} is not a trainsignals trace: {_not_arrow_hint(head)} "
                                   f"({type(exc).__name__}: {exc})") from None
        _check_schema(schema, where)
        batches: list[pa.RecordBatch] = []
        rows = 0
        good_end = src.tell()
        damage: str | None = None
        while True:
            try:
                batch = reader.read_next_batch()
            except StopIteration:
                break
            except Exception as exc:
                damage = f"{type(exc).__name__}: {exc}"
                break
            try:
                _check_batch(batch)
            except Exception as exc:
                damage = f"invalid record batch ({exc})"
                break
            batches.append(batch)
            rows += batch.num_rows
            good_end = src.tell()
    if damage is not None:
        msg = (f"{where}: trace damaged after byte {good_end} of {size} ({damage}); "
               f"recovered {rows} records in {len(batches)} complete record batches")
        warnings.warn(TraceDamagedWarning(msg, where, rows, len(batches), good_end), stacklevel=2)
    return _with_optional_columns(pa.Table.from_batches(batches, schema=schema))


def _with_optional_columns(table: pa.Table) -> pa.Table:
    """The table with the columns of an older trace's missing optional columns added, all null, in
    their place in the current schema (the schema metadata is kept).
    """
    for name in _OPTIONAL_COLUMNS:
        if table.schema.get_field_index(name) < 0:
            order = [f.name for f in _EXPECTED_FIELDS]
            at = order.index(name)
            before = [table.schema.get_field_index(c) for c in order[:at]]
            pos = max(before) + 1 if before else 0
            field = _EXPECTED_FIELDS[at]
            table = table.add_column(pos, field, pa.nulls(table.num_rows, field.type))
    return table


def _schema_of(table_or_path: pa.Table | pa.Schema | str | os.PathLike[str]) -> pa.Schema:
    if isinstance(table_or_path, pa.Schema):
        return table_or_path
    if isinstance(table_or_path, (pa.Table, pa.RecordBatch)):
        return table_or_path.schema
    where = _fmt_path(table_or_path)
    with open(where, "rb") as fh:
        head = fh.read(8)
    with pa.OSFile(where) as src:
        try:
            schema = pa.ipc.open_stream(src).schema
        except Exception as exc:
            raise TraceFormatError(f"{where} is not a trainsignals trace: {_not_arrow_hint(head)} "
                                   f"({type(exc).__name__}: {exc})") from None
    _check_schema(schema, where)
    return schema


def _json_meta(meta: Mapping[bytes, bytes], key: bytes, default: dict[str, Any] | list[str]) -> Any:
    """The JSON value of metadata field ``key``; ``default`` when it is absent, not JSON, or not of
    ``default``'s type (a dict; or a list of names, each a string): another writer's damaged field.
    """
    raw = meta.get(key)
    if raw is None:
        return default
    try:
        value = json.loads(raw)
    except ValueError:
        return default
    if not isinstance(value, type(default)) or (isinstance(value, list) and not all(isinstance(v, str) for v in value)):
        return default
    return value


def trace_metadata(table_or_path: pa.Table | pa.Schema | str | os.PathLike[str]) -> dict[str, Any]:
    """The trace's metadata: the run's (``metadata``), the layer names and the versions.

    Reads only the schema when given a path.

    Args:
        table_or_path: A table from :func:`read_trace`, its schema, or a trace file.

    Returns:
        ``{"format": "trace", "format_version": int, "trainsignals_version": str,
        "metadata": dict, "layer_names": list, "act_layer_names": list}``.

    Example:
        >>> t = trace_schema(["fc1"], None, {"model": "mlp"})
        >>> trace_metadata(t)["metadata"], trace_metadata(t)["layer_names"]
        ({'model': 'mlp'}, ['fc1'])
    """
    meta = _schema_of(table_or_path).metadata or {}
    fmt = meta.get(_META_FORMAT, b"").decode(errors="replace")
    try:
        version = int(meta.get(_META_FORMAT_VERSION, b"0"))
    except ValueError:
        version = 0
    return {
        "format": fmt,
        "format_version": version,
        "trainsignals_version": meta.get(_META_VERSION, b"").decode(errors="replace"),
        "metadata": _json_meta(meta, _META_USER, {}),
        "layer_names": list(_json_meta(meta, _META_LAYERS, [])),
        "act_layer_names": list(_json_meta(meta, _META_ACT_LAYERS, [])),
    }


def _valid_mask(col: pa.Array) -> np.ndarray:
    if col.null_count == 0:
        return np.ones(len(col), dtype=bool)
    return np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)


def _list_matrix(col: pa.Array, valid: np.ndarray, what: str) -> np.ndarray:
    good = col.filter(pa.array(valid)) if not valid.all() else col
    if len(good) == 0:
        return np.zeros((0, 0))
    lengths = np.asarray(good.value_lengths().to_numpy(zero_copy_only=False))
    width = int(lengths[0])
    if np.any(lengths != width):
        raise TraceFormatError(f"{what} rows have different numbers of layers: {sorted(set(lengths.tolist()))}")
    flat = good.flatten()
    if flat.null_count:
        flat = flat.fill_null(math.nan)
    return np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float64).reshape(len(good), width)


def _layer_names_for(names: list[str], width: int) -> list[str]:
    return names if len(names) == width else [f"layer{i}" for i in range(width)]


def trace_signals(table: pa.Table | str | os.PathLike[str]) -> dict[str, Any]:
    """The keyword arguments of ``Monitor.scan`` that replay a trace.

    ``step`` is an int64 array, given only with a dense signal aligned with it; the dense signals
    (``loss``, ``grad_norm``, ``lr``, ``update_ratio``, ``pred_top_share``, ``pred_spread``) are
    pyarrow arrays keeping their nulls (null: not measured at that step; NaN: measured
    non-finite); ``val_loss`` and ``val_metric`` are
    ``(steps, values)`` of their measured rows;
    ``layer_grad_norms`` and ``layer_update_ratios`` are ``(steps, {name: array})`` and ``activations`` is
    ``(steps, {layer: {"dead_frac": array, "saturation": array}})`` of their measured rows
    (a statistic missing on a row where the other was measured is NaN). A signal never
    measured (or a column the trace predates) is left out.

    Args:
        table: A table from :func:`read_trace` (or a trace file, read with it).

    Returns:
        The keyword arguments: ``Monitor().scan(**trace_signals(table))``.

    Example:
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "t.arrow")
        >>> _ = write_trace(p, step=[0, 1, 2], loss=[3.0, 2.0, None], val_loss=([1], [2.5]))
        >>> sig = trace_signals(read_trace(p))
        >>> sorted(sig), sig["loss"].to_pylist(), sig["val_loss"]
        (['loss', 'step', 'val_loss'], [3.0, 2.0, None], (array([1]), array([2.5])))
    """
    if not isinstance(table, pa.Table):
        table = read_trace(table)
    info = trace_metadata(table)
    steps = np.asarray(table.column("step").to_numpy(), dtype=np.int64)
    out: dict[str, Any] = {}
    for name in DENSE_SIGNALS:
        col = table.column(name).combine_chunks()
        if len(col) and col.null_count < len(col):
            out[name] = col
    if out:  # ``step`` goes with the signals aligned with it; a sparse signal carries its own steps
        out = {"step": steps, **out}
    for name in _SPARSE_COLUMNS:
        col = table.column(name).combine_chunks()
        if col.null_count < len(col):
            valid = _valid_mask(col)
            vals = np.asarray(col.filter(pa.array(valid)).to_numpy(zero_copy_only=False), dtype=np.float64)
            out[name] = (steps[valid], vals)
    for name in LAYER_COLUMNS:
        if name not in table.column_names:  # a trace written before the column existed
            continue
        col = table.column(name).combine_chunks()
        if col.null_count < len(col):
            valid = _valid_mask(col)
            mat = _list_matrix(col, valid, name)
            names = _layer_names_for(info["layer_names"], mat.shape[1])
            out[name] = (steps[valid], {nm: mat[:, j].copy() for j, nm in enumerate(names)})
    dead = table.column("act_dead_frac").combine_chunks()
    sat = table.column("act_saturation").combine_chunks()
    if dead.null_count < len(dead) or sat.null_count < len(sat):
        vd, vs = _valid_mask(dead), _valid_mask(sat)
        rows = vd | vs
        mats: dict[str, np.ndarray | None] = {}
        width = None
        for stat, col, v in (("dead_frac", dead, vd), ("saturation", sat, vs)):
            if not v.any():
                mats[stat] = None
                continue
            m = _list_matrix(col, v, f"act_{stat}")
            if width is not None and m.shape[1] != width:
                raise TraceFormatError(f"act_dead_frac and act_saturation have different numbers of layers "
                                       f"({width} and {m.shape[1]})")
            width = m.shape[1]
            full = np.full((len(steps), width), np.nan)
            full[v] = m
            mats[stat] = full[rows]
        assert width is not None
        names = _layer_names_for(info["act_layer_names"], width)
        acts = {nm: {stat: m[:, j].copy() for stat, m in mats.items() if m is not None}
                for j, nm in enumerate(names)}
        out["activations"] = (steps[rows], acts)
    return out


def trace_events(table: pa.Table | str | os.PathLike[str]) -> list[Event]:
    """The events recorded in a trace, in row order.

    Args:
        table: A table from :func:`read_trace` (or a trace file, read with it).

    Returns:
        The :class:`~trainsignals.Event` objects.

    Example:
        >>> import os, tempfile
        >>> from trainsignals import Event, Kind
        >>> p = os.path.join(tempfile.mkdtemp(), "t.arrow")
        >>> ev = Event(Kind.STALL, "warning", 5, 2, "GradCollapsePlateau", "loss", 1.0, 0.5, "m", "c", "f")
        >>> _ = write_trace(p, step=[4, 5], loss=[1.0, 1.0], events=[ev])
        >>> trace_events(read_trace(p)) == [ev]
        True
    """
    if not isinstance(table, pa.Table):
        table = read_trace(table)
    flat = table.column("events").combine_chunks().flatten()
    return [Event.from_dict(d) for d in flat.to_pylist()]
