r"""Read other tools' training logs and replay them through the detectors.

Each importer returns an :class:`ImportedRun`: the sorted unique ``steps``, our ``signals``
(``loss``, ``grad_norm``, ``lr``, ``update_ratio``, ``val_loss``) and every other numeric column
(``extra``) as float64 masked arrays aligned with ``steps``, plus what the source says about the
run (``metadata``). :meth:`ImportedRun.scan_kwargs` gives the keyword arguments of
:meth:`trainsignals.Monitor.scan`::

    run = import_run("out/checkpoint-500/trainer_state.json")
    events = trainsignals.Monitor().scan(**run.scan_kwargs())

**Missing is not NaN.** An empty CSV cell, an absent JSON key, a JSON ``null`` or a step at which
a TensorBoard tag has no value means *not measured*: the entry is masked. A literal ``nan`` /
``inf`` (``NaN`` / ``Infinity`` in JSON) is a measured non-finite value: it is not masked and
the Monitor reports it. In CSV cells and JSON strings, ``""``, ``none``, ``null``, ``na``,
``n/a`` (any case) also mean not measured. The data under a mask is NaN; only the mask says
"not measured".

**Merging.** Rows (log entries, CSV rows, TensorBoard events) that share a step are merged into
one step; where a column is measured more than once at a step, the last value in file order
wins and the number of conflicting values is reported in ``metadata["conflicts"]``.

**Steps.** The step column is ``step`` (CSV/JSONL: ``step_column``, falling back to
``global_step``, ``trainer/global_step``, ``train/global_step``, ``_step``, ``iteration``,
``iter``, ``current_steps``, ``total/steps``; exact names first, then in any case, as ``Step`` or
``Global_Step``). When none of them exists, an ``epoch`` column
that holds an integer in every row, never the same in two consecutive rows (Keras ``CSVLogger``,
Ultralytics ``results.csv``), is the x-axis (``metadata["step_unit"] == "epoch"``); otherwise the
row order is the step (0, 1, 2, ...) and ``metadata["step_column"]`` is None. Steps must be
integers; a row without a step where the column exists is an error.

**Steps that go back.** Where the step goes back to (or below) the first step of the run so far,
after that run logged two steps or more, a new run starts: the file holds several runs, the
last is read (``run_index`` picks another) and ``metadata["runs_in_file"]`` lists them. Where it
goes back less far (a resume from a checkpoint, two writers, rows out of order), rows sharing a
step are merged and the later row wins. Each such rule leaves a line in
:attr:`ImportedRun.notes`; so does a log with none of our signals (see
:meth:`ImportedRun.require_signals`). The full rules, with examples from real logs, are in the
guide ``docs/guides/importing-logs.md``.

**Default name mappings** (first match wins, in this order; names are matched case-insensitively,
``*`` is a wildcard; wildcards never match ``*-momentum`` or ``*-weight_decay``, which Lightning's
``LearningRateMonitor`` logs beside the learning rate). Every mapping is overridable with
``mapping={"loss": "my_loss_col", "lr": None}`` (None: do not import that signal); an unknown
signal name is a ``ValueError``. ``val_metric``, ``pred_top_share`` and ``pred_spread`` have no default names: a
metric's direction is not in its name (set ``Monitor(val_metric_mode=...)``), so map one
explicitly, e.g. ``mapping={"val_metric": "eval_accuracy"}``; unmapped, such columns stay in
``extra``.

=================== =============================== ================================================
tool                signal                          source names
=================== =============================== ================================================
``hf-trainer``      ``loss``                        ``loss``
                    ``grad_norm``                   ``grad_norm``
                    ``lr``                          ``learning_rate``, ``lr``
                    ``val_loss``                    ``eval_loss``
``lightning-csv``   ``loss``                        ``train_loss_step``, ``train_loss``,
                                                    ``loss_step``, ``loss``, ``train/loss``,
                                                    ``training_loss``
                    ``grad_norm``                   ``grad_norm_step``, ``grad_norm``,
                                                    ``grad_2.0_norm_total``, ``grad_norm_total``,
                                                    ``train/grad_norm``
                    ``lr``                          ``lr-*`` (``LearningRateMonitor``), ``lr``,
                                                    ``learning_rate``, ``lr_step``
                    ``update_ratio``                ``update_ratio_step``, ``update_ratio``
                    ``val_loss``                    ``val_loss``, ``val_loss_epoch``,
                                                    ``valid_loss``, ``validation_loss``,
                                                    ``val/loss``
``csv``, ``jsonl``  ``loss``                        ``loss``, ``train_loss``, ``train/loss``,
                                                    ``training_loss``, ``loss_step``,
                                                    ``train_loss_step``, ``Loss/train``
                    ``grad_norm``                   ``grad_norm``, ``train/grad_norm``,
                                                    ``gradient_norm``, ``grad_norm_total``,
                                                    ``grad_2.0_norm_total``, ``global_grad_norm``
                    ``lr``                          ``lr``, ``learning_rate``, ``train/lr``,
                                                    ``train/learning_rate``, ``lr-*``
                    ``update_ratio``                ``update_ratio``, ``train/update_ratio``
                    ``val_loss``                    ``val_loss``, ``eval_loss``, ``valid_loss``,
                                                    ``validation_loss``, ``val/loss``,
                                                    ``eval/loss``, ``validation/loss``,
                                                    ``Loss/val``
``tensorboard``     ``loss``                        ``train/loss``, ``loss``, ``train_loss``,
                                                    ``train_loss_step``, ``Loss/train``,
                                                    ``training/loss``, ``train/epoch_loss``
                    ``grad_norm``                   ``train/grad_norm``, ``grad_norm``,
                                                    ``grad_2.0_norm_total``, ``grad_norm/total``
                    ``lr``                          ``train/learning_rate``, ``train/lr``, ``lr``,
                                                    ``learning_rate``, ``lr-*``,
                                                    ``train/epoch_learning_rate``
                    ``update_ratio``                ``train/update_ratio``, ``update_ratio``
                    ``val_loss``                    ``val/loss``, ``eval/loss``, ``val_loss``,
                                                    ``eval_loss``, ``Loss/val``,
                                                    ``Loss/validation``, ``validation/loss``,
                                                    ``valid/loss``, ``validation/epoch_loss``
=================== =============================== ================================================

The same table is :data:`DEFAULT_MAPPINGS`. Columns not mapped to a signal and not the step are
kept in ``extra`` when numeric; a column with a non-numeric value is skipped and listed in
``metadata["skipped_columns"]`` — unless it is mapped to a signal, which is a ``ValueError``.

Example:
    >>> import json, os, tempfile
    >>> from trainsignals.io.importers import import_run
    >>> d = tempfile.mkdtemp()
    >>> p = os.path.join(d, "log.jsonl")
    >>> with open(p, "w") as f:
    ...     for row in [{"step": 0, "loss": 2.0, "lr": 0.1}, {"step": 1, "loss": float("nan")},
    ...                 {"step": 2, "val_loss": 1.5, "tokens": 4096}]:
    ...         _ = f.write(json.dumps(row) + "\n")
    >>> run = import_run(p)
    >>> run.tool, run.steps.tolist(), sorted(run.signals), sorted(run.extra)
    ('jsonl', [0, 1, 2], ['loss', 'lr', 'val_loss'], ['tokens'])
    >>> run.signals["loss"]          # step 1: measured NaN; step 2: not measured
    masked_array(data=[2.0, nan, --], mask=[False, False,  True], fill_value=nan)
    >>> sorted(run.scan_kwargs())
    ['loss', 'lr', 'step', 'val_loss']
"""

from __future__ import annotations

import csv
import fnmatch
import functools
import json
import math
import os
import re
import shlex
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainsignals.signals import DENSE_SIGNALS as _DENSE
from trainsignals.signals import SCALAR_SIGNALS

__all__ = [
    "DEFAULT_MAPPINGS",
    "DENSE_SIGNALS",
    "SIGNALS",
    "EPOCH_ALIASES",
    "STEP_ALIASES",
    "TOOLS",
    "ImportedRun",
    "LogDamagedWarning",
    "NoSignalError",
    "import_csv",
    "import_hf_trainer_state",
    "import_jsonl",
    "import_lightning_csv",
    "import_run",
    "import_tensorboard",
    "suggest_mapping",
]

SIGNALS: tuple[str, ...] = SCALAR_SIGNALS
"""Our signal names an importer can fill."""
DENSE_SIGNALS: tuple[str, ...] = _DENSE
"""Signals :meth:`ImportedRun.scan_kwargs` passes aligned with ``step`` (``val_loss`` is a pair)."""
TOOLS: tuple[str, ...] = ("hf-trainer", "lightning-csv", "csv", "jsonl", "tensorboard")
"""Values of :attr:`ImportedRun.tool` and of ``import_run(tool=...)``."""
STEP_ALIASES: tuple[str, ...] = (
    "step", "global_step", "trainer/global_step", "train/global_step", "_step", "iteration", "iter",
    "current_steps", "total/steps",
)
"""Step column names tried, in order, when ``step_column`` is left at ``"step"`` (``current_steps``:
LLaMA-Factory's ``trainer_log.jsonl``; ``total/steps``: OpenAI-baselines-style ``progress.csv``)."""
EPOCH_ALIASES: tuple[str, ...] = ("epoch", "epochs")
"""Epoch column names (case-insensitive) taken as the x-axis when no step column exists and the
column holds an integer in every row, never the same in two consecutive rows (Keras ``CSVLogger``,
Ultralytics ``results.csv``)."""

_GENERIC: dict[str, tuple[str, ...]] = {
    "loss": ("loss", "train_loss", "train/loss", "training_loss", "loss_step", "train_loss_step", "Loss/train"),
    "grad_norm": ("grad_norm", "train/grad_norm", "gradient_norm", "grad_norm_total", "grad_2.0_norm_total",
                  "global_grad_norm"),
    "lr": ("lr", "learning_rate", "train/lr", "train/learning_rate", "lr-*"),
    "update_ratio": ("update_ratio", "train/update_ratio"),
    "val_loss": ("val_loss", "eval_loss", "valid_loss", "validation_loss", "val/loss", "eval/loss",
                 "validation/loss", "Loss/val"),
}

DEFAULT_MAPPINGS: dict[str, dict[str, tuple[str, ...]]] = {
    "hf-trainer": {
        "loss": ("loss",),
        "grad_norm": ("grad_norm",),
        "lr": ("learning_rate", "lr"),
        "val_loss": ("eval_loss",),
    },
    "lightning-csv": {
        "loss": ("train_loss_step", "train_loss", "loss_step", "loss", "train/loss", "training_loss"),
        "grad_norm": ("grad_norm_step", "grad_norm", "grad_2.0_norm_total", "grad_norm_total", "train/grad_norm"),
        "lr": ("lr-*", "lr", "learning_rate", "lr_step"),
        "update_ratio": ("update_ratio_step", "update_ratio"),
        "val_loss": ("val_loss", "val_loss_epoch", "valid_loss", "validation_loss", "val/loss"),
    },
    "csv": _GENERIC,
    "jsonl": _GENERIC,
    "tensorboard": {
        "loss": ("train/loss", "loss", "train_loss", "train_loss_step", "Loss/train", "training/loss",
                 "train/epoch_loss"),
        "grad_norm": ("train/grad_norm", "grad_norm", "grad_2.0_norm_total", "grad_norm/total"),
        "lr": ("train/learning_rate", "train/lr", "lr", "learning_rate", "lr-*", "train/epoch_learning_rate"),
        "update_ratio": ("train/update_ratio", "update_ratio"),
        "val_loss": ("val/loss", "eval/loss", "val_loss", "eval_loss", "Loss/val", "Loss/validation",
                     "validation/loss", "valid/loss", "validation/epoch_loss"),
    },
}
"""Per tool: our signal -> source names tried in order (see the module docstring's table)."""

_WILDCARD_EXCLUDE = ("*-momentum", "*-weight_decay")
_MISSING_TOKENS = frozenset({"", "none", "null", "na", "n/a"})
_MSVC_NONFINITE = frozenset({"1.#qnan", "-1.#qnan", "1.#ind", "-1.#ind", "1.#inf", "-1.#inf", "nan(ind)",
                             "-nan(ind)"})  # how the MSVC runtime prints non-finite doubles
_TB_INSTALL_HINT = "pip install trainsignals[tensorboard]"


class _NotNumber(Exception):
    def __init__(self, value: Any, row: int = -1) -> None:
        super().__init__(value, row)
        self.value = value
        self.row = row


class LogDamagedWarning(UserWarning):
    """A log file was cut short or damaged: it was read up to the damage (the run's notes and
    ``metadata["damaged_files"]`` say where). The twin of
    :class:`trainsignals.io.traces.TraceDamagedWarning` for other tools' logs.
    """


class NoSignalError(ValueError):
    """An imported log holds none of our signals under the names tried (see
    :meth:`ImportedRun.require_signals`); the message says which columns it has and how to map one.
    """


_NOT_LOSS_PREFIXES = ("val", "eval", "test", "valid")


def suggest_mapping(columns: Sequence[str]) -> dict[str, str]:
    """A guess at ``mapping`` for columns none of whose names we know: the training loss (the
    first column naming a loss, preferring ``train``, not ``val``/``eval``/``test``) and the
    validation loss (the first ``val``/``eval`` column naming a loss, in the same family).

    Args:
        columns: Numeric column (or tag) names, in file order.

    Returns:
        ``{"loss": ..., "val_loss": ...}`` with the entries found; ``{"loss": <first column>}``
        when no name mentions a loss (the user still has to look); empty for no columns.
    """
    def bare(c: str) -> str:
        return c.lower().replace(" ", "_")

    lossy = [c for c in columns if "loss" in bare(c) or "mse" in bare(c)]
    train = [c for c in lossy if not bare(c).startswith(_NOT_LOSS_PREFIXES)]
    train.sort(key=lambda c: ("train" not in bare(c), "total" not in bare(c) and "mean" not in bare(c)))
    out: dict[str, str] = {}
    if train:
        out["loss"] = train[0]
    val = [c for c in lossy if bare(c).startswith(("val", "eval", "valid"))]
    if val:
        stem = out.get("loss", "").lower().split("/")[-1].replace("train_", "")
        val.sort(key=lambda c: stem not in c.lower())
        out["val_loss"] = val[0]
    if not out:
        cands = [c for c in columns if bare(c) not in EPOCH_ALIASES]
        if cands:
            out["loss"] = cands[0]
    return out


@dataclass(eq=False)
class ImportedRun:
    """A run read from another tool's log.

    Attributes:
        source: The file (or directory) read.
        tool: ``"hf-trainer"``, ``"lightning-csv"``, ``"csv"``, ``"jsonl"`` or ``"tensorboard"``.
        steps: int64, sorted unique steps.
        signals: Our names (``loss``, ``grad_norm``, ``lr``, ``update_ratio``, ``val_loss``) ->
            float64 masked arrays aligned with ``steps``; masked = not measured at that step, a
            NaN/Inf that is not masked was measured. Only signals found in the source appear.
        extra: Every other numeric column, the same way (``epoch``, ``eval_accuracy``, ...).
        metadata: What the source says about the run, and how it was read: ``mapping``
            (signal -> source name used), ``step_column`` (None: row order), ``conflicts``
            (column -> values overwritten by a later one at the same step), ``skipped_columns``
            (non-numeric column -> first offending value), plus tool-specific keys (HF: the
            ``trainer_state.json`` fields and ``train_summary``; TensorBoard: ``files``,
            ``runs``, ``tags``).
    """

    source: str
    tool: str
    steps: np.ndarray
    signals: dict[str, np.ma.MaskedArray]
    extra: dict[str, np.ma.MaskedArray] = field(default_factory=dict)
    metadata: dict = field(default_factory=dict)

    def scan_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for :meth:`trainsignals.Monitor.scan`.

        ``step`` and the dense signals (``loss``, ``grad_norm``, ``lr``, ``update_ratio``) as
        masked arrays aligned with it (masked = not measured), each only if it has at least one
        measured value (``step`` only if some dense signal is passed); ``val_loss`` and
        ``val_metric`` as ``(steps, values)`` pairs of their measured entries, if any.
        """
        kw: dict[str, Any] = {}
        for name in DENSE_SIGNALS:
            sig = self.signals.get(name)
            if sig is not None and sig.count() > 0:
                kw[name] = sig.copy()
        if kw:
            kw = {"step": self.steps.copy(), **kw}
        for name in ("val_loss", "val_metric"):  # validation's own cadence
            val = self.signals.get(name)
            if val is not None and val.count() > 0:
                measured = ~np.ma.getmaskarray(val)
                kw[name] = (self.steps[measured].copy(), np.ma.getdata(val)[measured].copy())
        return kw

    @property
    def notes(self) -> list[str]:
        """What a person should know about how the log was read (``metadata["notes"]``): the
        x-axis used when there is no step column, steps that go back, several runs in one file,
        no signal found. Empty when nothing unusual happened.
        """
        return list(self.metadata.get("notes", []))

    def measured_signals(self) -> list[str]:
        """Our signals with at least one measured value, in :data:`SIGNALS` order."""
        return [k for k, v in self.signals.items() if v.count() > 0]

    def no_signal_message(self) -> str:
        """Why the run has nothing to replay: the numeric columns found and how to map one."""
        found = [k for k, v in self.extra.items() if v.count() > 0]
        step = self.metadata.get("step_column")
        what = "tag" if self.tool == "tensorboard" else "column"
        if not found:
            return (f"{self.source}: no numeric {what} besides the step"
                    f"{f' ({step!r})' if step else ''}: nothing to replay")
        shown = ", ".join(map(repr, found[:60])) + (f", ... ({len(found)} in all)" if len(found) > 60 else "")
        hint = suggest_mapping(found)
        cli = " ".join(shlex.quote(f"{k}={v}") for k, v in hint.items())
        return (f"{self.source}: none of our signals ({', '.join(SIGNALS)}) found under the names {self.tool} "
                f"logs usually use; numeric {what}s found: {shown}. Say which {what} is which, e.g. "
                f"--map {cli} (Python: mapping={hint!r})")

    def require_signals(self) -> None:
        """Check that the run has something to replay.

        Raises:
            NoSignalError: none of our signals has a measured value; the message lists the
                numeric columns found and suggests a mapping.
        """
        if not self.measured_signals():
            raise NoSignalError(self.no_signal_message())

    def to_arrow(self) -> Any:
        """The run as a ``pyarrow.Table``: ``step``, the signals, then the extras.

        A not-measured entry is a null; a measured NaN stays NaN. ``Monitor.scan`` reads pyarrow
        nulls as "not measured", so the columns can be scanned directly. An extra whose name is
        already taken (a source column literally named ``loss`` while ``loss`` was mapped from
        another one) is named ``extra/<name>``.
        """
        import pyarrow as pa

        cols: dict[str, Any] = {"step": pa.array(self.steps, type=pa.int64())}
        for name, arr in [*self.signals.items(), *((f"extra/{k}" if k in cols or k in self.signals else k, v)
                                                   for k, v in self.extra.items())]:
            cols[name] = pa.array(np.ma.getdata(arr), type=pa.float64(), mask=np.ma.getmaskarray(arr))
        return pa.table(cols)

    def __repr__(self) -> str:
        def counts(d: dict[str, np.ma.MaskedArray]) -> str:
            return "{" + ", ".join(f"{k}: {v.count()}" for k, v in d.items()) + "}"

        span = f"{int(self.steps[0])}..{int(self.steps[-1])}" if len(self.steps) else "-"
        return (f"ImportedRun(tool={self.tool!r}, source={self.source!r}, steps={len(self.steps)} [{span}], "
                f"signals={counts(self.signals)}, extra={counts(self.extra)})")


# --------------------------------------------------------------------------------------------
# shared machinery: raw columns -> parsed columns -> mapping -> aligned masked arrays


def _cell_to_float(v: Any) -> float | None:
    """A cell as float, None when not measured; raises _NotNumber."""
    if v is None:
        return None
    if isinstance(v, bool):
        raise _NotNumber(v)
    if isinstance(v, (int, float)):
        return float(v)
    if isinstance(v, str):
        s = v.strip()
        if s.lower() in _MISSING_TOKENS:
            return None
        try:
            return float(s)
        except ValueError:
            low = s.lower()
            if low in _MSVC_NONFINITE:
                return -math.inf if low.startswith("-") and "inf" in low else (
                    math.inf if "inf" in low else math.nan)
            raise _NotNumber(v) from None
    raise _NotNumber(v)


def _parse_column(cells: Iterable[tuple[int, Any]]) -> tuple[np.ndarray, np.ndarray]:
    """(row index, raw cell) pairs -> (rows measured, float values)."""
    rows: list[int] = []
    vals: list[float] = []
    for i, c in cells:
        try:
            x = _cell_to_float(c)
        except _NotNumber as exc:
            raise _NotNumber(exc.value, i) from None
        if x is not None:
            rows.append(i)
            vals.append(x)
    return np.asarray(rows, dtype=np.int64), np.asarray(vals, dtype=np.float64)


def _as_step(v: Any) -> int | None:
    if isinstance(v, int) and not isinstance(v, bool):
        return v  # exact, even beyond 2**53
    if isinstance(v, str) and v.strip().lstrip("+-").isdigit():
        return int(v)
    x = _cell_to_float(v)
    if x is None:
        return None
    if not math.isfinite(x) or x != int(x):
        raise _NotNumber(v)
    return int(x)


def _check_mapping(source: str, mapping: Mapping[str, str | None] | None) -> dict[str, str | None]:
    if mapping is None:
        return {}
    if not isinstance(mapping, Mapping):
        raise ValueError(f"mapping must be a dict of signal -> source column, got {type(mapping).__name__}")
    unknown = [k for k in mapping if k not in SIGNALS]
    if unknown:
        raise ValueError(f"unknown mapping target(s) {', '.join(map(repr, unknown))} for {source}; "
                         f"expected some of {', '.join(SIGNALS)}")
    bad = {k: v for k, v in mapping.items() if v is not None and not isinstance(v, str)}
    if bad:
        raise ValueError(f"mapping values must be column names (str) or None, got {bad!r}")
    used: dict[str, str] = {}
    for k, v in mapping.items():
        if v is not None:
            if v in used:
                raise ValueError(f"mapping sends column {v!r} to both {used[v]!r} and {k!r}")
            used[v] = k
    return dict(mapping)


def _matches(pattern: str, name: str) -> bool:
    p, n = pattern.lower(), name.lower()
    if "*" not in p:
        return p == n
    return fnmatch.fnmatchcase(n, p) and not any(fnmatch.fnmatchcase(n, x) for x in _WILDCARD_EXCLUDE)


def _resolve(source: str, what: str, columns: Sequence[str], defaults: Mapping[str, Sequence[str]],
             mapping: dict[str, str | None]) -> dict[str, str]:
    """Our signal -> source column, explicit mapping first, then the defaults in priority order."""
    out: dict[str, str] = {}
    missing = [v for v in mapping.values() if v is not None and v not in columns]
    if missing:
        shown = ", ".join(map(repr, list(columns)[:30])) + (", ..." if len(columns) > 30 else "")
        raise ValueError(f"{source}: mapped {what}(s) {', '.join(map(repr, missing))} not found; "
                         f"available: {shown or 'none'}")
    taken = {v for v in mapping.values() if v is not None}
    for sig in SIGNALS:
        if sig in mapping:
            col = mapping[sig]
            if col is not None:
                out[sig] = col
            continue
        for pattern in defaults.get(sig, ()):
            hit = next((c for c in columns if c not in taken and _matches(pattern, c)), None)
            if hit is not None:
                out[sig] = hit
                taken.add(hit)
                break
    return out


def _find_step_column(source: str, columns: Sequence[str], step_column: str | None) -> str | None:
    """The step column: ``step_column`` itself, else (for the default ``"step"``) the first of
    :data:`STEP_ALIASES` present; exact names first, then case-insensitively (``Step``,
    ``Global_Step``), as the signal columns are matched.
    """
    if step_column is None:
        return None
    if not isinstance(step_column, str):
        raise ValueError(f"step_column must be a column name or None, got {step_column!r}")
    wanted = STEP_ALIASES if step_column == "step" else (step_column,)
    hit = next((a for a in wanted if a in columns), None)
    if hit is None:
        hit = next((c for a in wanted for c in columns if c.lower() == a.lower()), None)
    if hit is None and step_column != "step":
        raise ValueError(f"{source}: step column {step_column!r} not found; available: "
                         f"{', '.join(map(repr, list(columns)[:30])) or 'none'} (step_column=None: use row order)")
    return hit


def _epoch_column(source: str, columns: dict[str, list[tuple[int, Any]]], n_rows: int) -> tuple[str | None, str]:
    """The epoch column to use as the x-axis, or None and why not (for the note)."""
    name = next((c for a in EPOCH_ALIASES for c in columns if c.lower() == a), None)
    if name is None:
        return None, ""
    cells = dict(columns[name])
    vals: list[int] = []
    for i in range(n_rows):
        try:
            v = _as_step(cells.get(i))
        except _NotNumber:
            return None, f"column {name!r} is not an integer in every row"
        if v is None:
            return None, f"column {name!r} is empty in some rows"
        if vals and v == vals[-1]:
            return None, f"column {name!r} repeats in consecutive rows (several rows per epoch)"
        vals.append(v)
    return name, ""


def _split_runs(row_steps: np.ndarray) -> tuple[list[int], list[int]]:
    """Rows where a new run starts (the step goes back to or below the first step of the run so
    far, which logged two steps or more) and rows where the step goes back less far (a resume from
    a checkpoint, a second writer, rows out of order).
    """
    starts = [0]
    resumes: list[int] = []
    for i in (np.flatnonzero(row_steps[1:] < row_steps[:-1]) + 1).tolist():
        run = row_steps[starts[-1]:i]
        if row_steps[i] <= run[0] and bool(np.any(run != run[0])):
            starts.append(i)
        else:
            resumes.append(i)
    return starts, resumes


def _build(source: str, tool: str, what: str, row_label: str, n_rows: int, columns: dict[str, list[tuple[int, Any]]],
           step_col: str | None, defaults: Mapping[str, Sequence[str]], mapping: dict[str, str | None],
           metadata: dict, *, epoch_fallback: bool = False, run_index: int = -1) -> ImportedRun:
    """Raw row-oriented cells -> an ImportedRun (steps from ``step_col``, the epoch or the row order)."""
    notes: list[str] = metadata.setdefault("notes", [])
    if step_col is None and epoch_fallback:
        step_col, why_not = _epoch_column(source, columns, n_rows)
        if step_col is not None:
            metadata["step_unit"] = "epoch"
            notes.append(f"no step column: the x-axis is the epoch column {step_col!r}")
        elif n_rows:
            notes.append("no step column: the row order is the step (0, 1, 2, ...)"
                         + (f"; the epoch is not used because {why_not}" if why_not else ""))
    if step_col is None:
        row_steps = np.arange(n_rows, dtype=np.int64)
    else:
        cells = dict(columns[step_col])
        row_steps = np.empty(n_rows, dtype=np.int64)
        for i in range(n_rows):
            try:
                s = _as_step(cells.get(i))
            except _NotNumber:
                raise ValueError(f"{source}: {row_label} {i + 1} has a step {cells.get(i)!r} in {step_col!r} "
                                 "that is not an integer") from None
            if s is None:
                hint = (f"; in Python, import_{tool}(..., step_column=None) numbers the {row_label}s 0, 1, 2, ... "
                        "instead" if tool in ("csv", "jsonl") else "")
                raise ValueError(f"{source}: {row_label} {i + 1} has no step in {step_col!r}: every {row_label} "
                                 f"needs one (fill it in or drop the {row_label}{hint})")
            if not -(2 ** 63) <= s < 2 ** 63:
                raise ValueError(f"{source}: {row_label} {i + 1} has a step {cells.get(i)!r} in {step_col!r} "
                                 "beyond the 64-bit range steps are kept in")
            row_steps[i] = s
    keep: np.ndarray | None = None
    if n_rows:
        starts, resumes = _split_runs(row_steps)
        bounds = [*starts, n_rows]
        runs = [{"rows": [a + 1, b], "steps": [int(row_steps[a:b].min()), int(row_steps[a:b].max())]}
                for a, b in zip(bounds[:-1], bounds[1:])]
        if not isinstance(run_index, int) or not -len(runs) <= run_index < len(runs):
            raise ValueError(f"{source}: run_index {run_index!r} out of range: the file holds {len(runs)} run(s)")
        k = run_index % len(runs)
        a, b = bounds[k], bounds[k + 1]
        if len(runs) > 1:
            keep = np.zeros(n_rows, dtype=bool)
            keep[a:b] = True
            metadata["runs_in_file"] = runs
            metadata["run_index"] = k
            restarts = ", ".join(f"{row_label} {i + 1} (step {row_steps[i - 1]} -> {row_steps[i]})" for i in starts[1:4])
            notes.append(f"the file holds {len(runs)} runs: the step restarts at {restarts}"
                         f"{', ...' if len(starts) > 4 else ''}; imported run {k} ({row_label}s {a + 1}-{b}, "
                         f"steps {runs[k]['steps'][0]}..{runs[k]['steps'][1]}); choose another with "
                         f"run_index=0..{len(runs) - 1} (CLI: --run-index)")
        back = [i for i in resumes if a <= i < b]
        if back:
            i = back[0]
            metadata["steps_went_back"] = len(back)
            notes.append(f"the step goes back {len(back)} time(s) (first at {row_label} {i + 1}: "
                         f"{row_steps[i - 1]} -> {row_steps[i]}), as when a run resumes from a checkpoint or "
                         "two processes write the same log: rows sharing a step are merged and the later row "
                         "wins")
    names = [c for c in columns if c != step_col]
    if step_col is not None and step_col in mapping.values():
        raise ValueError(f"{source}: {what} {step_col!r} is the step; it cannot be mapped to a signal")
    chosen = _resolve(source, what, names, defaults, mapping)
    by_col = {c: s for s, c in chosen.items()}
    parsed: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    skipped: dict[str, str] = {}
    for c in names:
        try:
            rows, vals = _parse_column(columns[c])
        except _NotNumber as exc:
            row, value = exc.row, exc.value
            if c in by_col:
                how = "by mapping" if c in mapping.values() else "by default"
                raise ValueError(f"{source}: {what} {c!r} (mapped to {by_col[c]} {how}) is not numeric: "
                                 f"{row_label} {row + 1} has {value!r}; map {by_col[c]!r} to another "
                                 f"{what} or to None") from None
            skipped[c] = repr(value)
            continue
        if keep is not None:
            sel = keep[rows]
            rows, vals = rows[sel], vals[sel]
        parsed[c] = (row_steps[rows], vals)
    metadata.update(mapping=dict(chosen), step_column=step_col)
    if skipped:
        metadata["skipped_columns"] = skipped
    run = _align(source, tool, row_steps if keep is None else row_steps[keep], parsed, chosen, metadata)
    if n_rows and not run.measured_signals():
        notes.append(run.no_signal_message())
    if not notes:
        del metadata["notes"]
    return run


def _align(source: str, tool: str, all_steps: np.ndarray, parsed: dict[str, tuple[np.ndarray, np.ndarray]],
           chosen: dict[str, str], metadata: dict) -> ImportedRun:
    """Per-column (steps, values) in file order -> masked arrays on the sorted unique steps."""
    steps = np.unique(all_steps).astype(np.int64)
    conflicts: dict[str, int] = {}
    arrays: dict[str, np.ma.MaskedArray] = {}
    for name, (st, vals) in parsed.items():
        data = np.full(len(steps), np.nan)
        measured = np.zeros(len(steps), dtype=bool)
        if len(st):
            idx = np.searchsorted(steps, st)
            rev_unique, rev_first = np.unique(idx[::-1], return_index=True)
            last = len(idx) - 1 - rev_first  # the last value in file order wins
            data[rev_unique] = vals[last]
            measured[rev_unique] = True
            kept = data[idx]
            same = (vals == kept) | (np.isnan(vals) & np.isnan(kept))
            if not same.all():
                conflicts[name] = int((~same).sum())
        arrays[name] = np.ma.MaskedArray(data, mask=~measured, fill_value=np.nan)
    if conflicts:
        metadata["conflicts"] = conflicts
    signals = {sig: arrays.pop(col) for sig, col in chosen.items() if col in arrays}
    signals = {s: signals[s] for s in SIGNALS if s in signals}
    return ImportedRun(source=source, tool=tool, steps=steps, signals=signals, extra=arrays, metadata=metadata)


def _read_text(path: Path, expected: str) -> str:
    try:
        return path.read_text(encoding="utf-8-sig")
    except UnicodeDecodeError:
        raise ValueError(f"{path} is not a text file; expected {expected}") from None
    except IsADirectoryError:
        raise ValueError(f"{path} is a directory; expected {expected}") from None


def _path(path: str | os.PathLike[str]) -> Path:
    p = Path(path)
    if not p.exists():
        raise FileNotFoundError(f"no such file or directory: {p}")
    return p


# --------------------------------------------------------------------------------------------
# JSON records (HF Trainer log_history, JSONL)


_BARE_NONFINITE = re.compile(r"(?<=[:,\[])(\s*)([-+]?)(nan|inf|infinity)(?=\s*[,}\]])", re.IGNORECASE)


def _json_loads(text: str) -> Any:
    """``json.loads``, and on failure once more with bare ``nan`` / ``inf`` / ``-inf`` values
    (any case; written by hand-rolled loggers, not valid JSON) read as NaN / Infinity.
    """
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        fixed = _BARE_NONFINITE.sub(
            lambda m: m.group(1) + ("NaN" if m.group(3).lower() == "nan" else
                                    ("-" if m.group(2) == "-" else "") + "Infinity"), text)
        if fixed == text:
            raise
        return json.loads(fixed)


def _flatten(obj: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in obj.items():
        key = f"{prefix}{k}"
        if isinstance(v, Mapping):
            out.update(_flatten(v, key + "/"))
        else:
            out[key] = v
    return out


def _records_columns(records: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[int, Any]]]:
    columns: dict[str, list[tuple[int, Any]]] = {}
    for i, rec in enumerate(records):
        for k, v in _flatten(rec).items():
            columns.setdefault(k, []).append((i, v))
    return columns


def import_hf_trainer_state(path: str | os.PathLike[str],
                            mapping: Mapping[str, str | None] | None = None, run_index: int = -1) -> ImportedRun:
    """Read a Hugging Face ``Trainer`` ``trainer_state.json`` (saved in every checkpoint).

    ``log_history`` holds training entries (``loss``, ``grad_norm``, ``learning_rate``,
    ``epoch``, ``step``) and separate evaluation entries (``eval_loss``, ``eval_*``, ``epoch``,
    ``step``); they are merged by ``step``. The run summary ``Trainer.train`` logs at the end
    (the entry with ``train_runtime``: ``train_loss`` is an average over the run, not a step's
    loss) goes to ``metadata["train_summary"]``, not into the columns.

    ========================= ==================== ==============================================
    ``log_history`` key       becomes              notes
    ========================= ==================== ==============================================
    ``loss``                  ``signals["loss"]``  mean training loss since the last log
    ``grad_norm``             ``grad_norm``        before clipping
    ``learning_rate``         ``lr``
    ``eval_loss``             ``val_loss``
    other numeric keys        ``extra[key]``       ``epoch``, ``eval_accuracy``, ``eval_runtime``,
                                                   ``num_input_tokens_seen``, ...
    ``step``                  ``steps``            required in every entry
    ========================= ==================== ==============================================

    JSON ``NaN`` / ``Infinity`` are measured non-finite values; an absent key or ``null`` is
    not measured. Note that the Trainer's default ``logging_nan_inf_filter=True`` replaces a
    non-finite loss by the running mean before logging it, so only a run with the filter off
    shows NaN losses (a non-finite ``grad_norm`` is always logged as such).

    Args:
        path: The ``trainer_state.json`` file, or a checkpoint directory containing it.
        mapping: Overrides, e.g. ``{"val_loss": "eval_nll"}``; None leaves a signal out.
        run_index: Which run to read when ``log_history`` holds several (its steps go back to
            the start, as after a restart that kept the old entries): 0 the first, -1 (the
            default) the last.

    Returns:
        The run; ``metadata`` holds the file's other fields (``global_step``, ``max_steps``,
        ``epoch``, ``best_metric``, ``best_model_checkpoint``, ``logging_steps``, ...).

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not a ``trainer_state.json`` (not a JSON object with a ``log_history`` list
            of entries that each have a ``step``), or a bad ``mapping``.
    """
    p = _path(path)
    if p.is_dir():
        p = p / "trainer_state.json"
        if not p.exists():
            raise FileNotFoundError(f"no trainer_state.json in {p.parent}")
    source = str(p)
    expected = "a Hugging Face trainer_state.json (a JSON object with a 'log_history' list)"
    text = _read_text(p, expected)
    try:
        state = _json_loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"{source} is not valid JSON ({exc}); expected {expected}") from None
    if not isinstance(state, dict) or not isinstance(state.get("log_history"), list):
        raise ValueError(f"{source} is not a trainer_state.json: expected {expected}")
    mp = _check_mapping(source, mapping)
    entries: list[Mapping[str, Any]] = []
    summary: dict[str, Any] = {}
    no_step: list[int] = []
    for i, e in enumerate(state["log_history"]):
        if not isinstance(e, dict):
            raise ValueError(f"{source}: log_history entry {i + 1} is not an object: {e!r}")
        if "step" not in e:
            raise ValueError(f"{source}: log_history entry {i + 1} has no 'step': {e!r}")
        if e["step"] is None:
            no_step.append(i + 1)
            continue
        if "train_runtime" in e:
            summary.update(e)
        else:
            entries.append(e)
    metadata: dict[str, Any] = {k: v for k, v in state.items() if k != "log_history"}
    if summary:
        metadata["train_summary"] = summary
    if no_step:
        metadata["notes"] = [f"{len(no_step)} log_history entr{'y' if len(no_step) == 1 else 'ies'} with "
                             f"\"step\": null skipped (entry {', '.join(map(str, no_step[:5]))}"
                             f"{', ...' if len(no_step) > 5 else ''}): a value cannot be placed without its step"]
    columns = _records_columns(entries)
    if not entries:
        columns["step"] = []
    return _build(source, "hf-trainer", "key", "log_history entry", len(entries), columns, "step",
                  DEFAULT_MAPPINGS["hf-trainer"], mp, metadata, run_index=run_index)


def _refuse_single_object(text: str, source: str, expected: str) -> None:
    """Explain a pretty-printed JSON object given where JSON Lines were expected."""
    try:
        whole = json.loads(text)
    except json.JSONDecodeError:
        return
    if isinstance(whole, dict):
        hint = ("; it is a Hugging Face trainer_state.json: use import_hf_trainer_state"
                if isinstance(whole.get("log_history"), list) else "")
        raise ValueError(f"{source} holds one JSON object spread over several lines, not {expected}{hint}")


def _load_json_records(p: Path, source: str) -> list[Mapping[str, Any]]:
    expected = "JSON Lines (one JSON object per line)"
    text = _read_text(p, expected)
    stripped = text.lstrip()
    if stripped.startswith("["):  # a JSON array of objects is accepted too
        try:
            data = _json_loads(text)
        except json.JSONDecodeError as exc:
            raise ValueError(f"{source} is not valid JSON ({exc}); expected {expected} "
                             "or a JSON array of objects") from None
        bad = next((i for i, r in enumerate(data) if not isinstance(r, dict)), None)
        if bad is not None:
            raise ValueError(f"{source}: array item {bad + 1} is not a JSON object; expected {expected}")
        return data
    records: list[Mapping[str, Any]] = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            rec = _json_loads(line)
        except json.JSONDecodeError as exc:
            if not records:
                _refuse_single_object(text, source, expected)
            raise ValueError(f"{source}: line {n} is not valid JSON ({exc.msg}); expected {expected}") from None
        if not isinstance(rec, dict):
            raise ValueError(f"{source}: line {n} is not a JSON object ({type(rec).__name__}); expected {expected}")
        records.append(rec)
    if not records:
        raise ValueError(f"{source} holds no JSON objects; expected {expected}")
    return records


def import_jsonl(path: str | os.PathLike[str], mapping: Mapping[str, str | None] | None = None,
                 step_column: str | None = "step", run_index: int = -1) -> ImportedRun:
    """Read JSON Lines: one JSON object per line (blank lines skipped), e.g. a custom logger's
    ``metrics.jsonl``. A file holding one JSON array of objects is read the same way.

    Nested objects are flattened with ``/`` (``{"train": {"loss": 1}}`` -> ``train/loss``).
    Numbers, and strings that parse as numbers, are values; ``NaN`` / ``Infinity`` (Python's
    ``json`` writes them) and ``"nan"`` are measured non-finite values; an absent key, ``null``
    or ``""`` is not measured. Keys with other values (text, lists, booleans) are skipped.

    ======================= ======================================================================
    signal                  keys tried (first present wins, case-insensitive)
    ======================= ======================================================================
    ``loss``                ``loss``, ``train_loss``, ``train/loss``, ``training_loss``,
                            ``loss_step``, ``train_loss_step``, ``Loss/train``
    ``grad_norm``           ``grad_norm``, ``train/grad_norm``, ``gradient_norm``,
                            ``grad_norm_total``, ``grad_2.0_norm_total``, ``global_grad_norm``
    ``lr``                  ``lr``, ``learning_rate``, ``train/lr``, ``train/learning_rate``,
                            ``lr-*``
    ``update_ratio``        ``update_ratio``, ``train/update_ratio``
    ``val_loss``            ``val_loss``, ``eval_loss``, ``valid_loss``, ``validation_loss``,
                            ``val/loss``, ``eval/loss``, ``validation/loss``, ``Loss/val``
    step                    ``step_column`` (default ``step``, then ``global_step``,
                            ``trainer/global_step``, ``train/global_step``, ``_step``,
                            ``iteration``, ``iter``, ...; any case); none: the line order
    ======================= ======================================================================

    Args:
        path: The file.
        mapping: Overrides, e.g. ``{"loss": "my_loss", "lr": None}``.
        step_column: The step key; None uses the line order. A name other than ``"step"`` must
            exist.
        run_index: Which run to read when the file holds several (its steps go back to the
            start): 0 the first, -1 (the default) the last.

    Returns:
        The run.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not JSON Lines, a record without a step, a non-integer step, a mapped key
            that is absent or not numeric, or an unknown mapping target.
    """
    p = _path(path)
    source = str(p)
    records = _load_json_records(p, source)
    mp = _check_mapping(source, mapping)
    columns = _records_columns(records)
    step_col = _find_step_column(source, list(columns), step_column)
    return _build(source, "jsonl", "key", "record", len(records), columns, step_col,
                  DEFAULT_MAPPINGS["jsonl"], mp, {"rows": len(records)}, epoch_fallback=step_column == "step",
                  run_index=run_index)


# --------------------------------------------------------------------------------------------
# CSV (generic, Lightning CSVLogger)


def _read_csv(p: Path, source: str, expected: str) -> tuple[list[str], list[list[str]], dict[str, str]]:
    text = _read_text(p, expected)
    if text.lstrip()[:1] in ("{", "["):
        raise ValueError(f"{source} looks like JSON, not CSV; expected {expected}")
    try:
        rows = [r for r in csv.reader(text.splitlines()) if r]
    except csv.Error as exc:
        raise ValueError(f"{source} is not a readable CSV ({exc}); expected {expected}") from None
    if not rows:
        raise ValueError(f"{source} is empty; expected {expected}")
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    if not body:
        raise ValueError(f"{source} has a header but no data rows; expected {expected}")
    header, body, ignored = _drop_unnamed_columns(header, body)
    empty = [j + 1 + (1 if "column 1" in ignored else 0) for j, h in enumerate(header) if not h]
    if empty:
        raise ValueError(f"{source}: header row has no name for column {', '.join(map(str, empty))}; name it "
                         "(an unnamed first column holding the row numbers 0, 1, 2, ... is taken as pandas' "
                         "index and ignored, and so is an unnamed last column that is empty in every row); "
                         f"expected {expected}")
    dup = sorted({h for h in header if header.count(h) > 1})
    if dup:
        raise ValueError(f"{source}: duplicate column name(s) {', '.join(map(repr, dup))} in the header")
    long = next((i for i, r in enumerate(body) if len(r) > len(header)), None)
    if long is not None:
        raise ValueError(f"{source}: row {long + 1} has {len(body[long])} cells but the header has "
                         f"{len(header)} columns; expected {expected}")
    return header, body, ignored


def _drop_unnamed_columns(header: list[str], body: list[list[str]]) -> tuple[list[str], list[list[str]],
                                                                           dict[str, str]]:
    """Drop what a writer adds without meaning: cells past the header that are all empty (a trailing
    comma on the data rows), an unnamed last column empty in every row (a trailing comma on every
    line), an unnamed first column holding 0, 1, 2, ... (pandas' ``to_csv`` index). Returns the
    header, the rows and ``{column: why it was ignored}``.
    """
    ignored: dict[str, str] = {}
    n = len(header)
    if any(len(r) > n and not any(c.strip() for c in r[n:]) for r in body):
        body = [r[:n] if len(r) > n and not any(c.strip() for c in r[n:]) else r for r in body]
    if n > 1 and not header[-1] and all(len(r) < n or not r[n - 1].strip() for r in body):
        ignored[f"column {n}"] = "no name and empty in every row (a trailing comma)"
        header, body, n = header[:-1], [r[:n - 1] for r in body], n - 1
    if n > 1 and not header[0] and all(r and r[0].strip() == str(i) for i, r in enumerate(body)):
        ignored["column 1"] = "no name and the row numbers 0, 1, 2, ... (pandas' index)"
        header, body = header[1:], [r[1:] for r in body]
    return header, body, ignored


def _csv_columns(header: list[str], body: list[list[str]]) -> dict[str, list[tuple[int, Any]]]:
    return {h: [(i, r[j] if j < len(r) else "") for i, r in enumerate(body)] for j, h in enumerate(header)}


def _import_csv_like(path: str | os.PathLike[str], tool: str, mapping: Mapping[str, str | None] | None,
                     step_column: str | None, expected: str, run_index: int = -1) -> ImportedRun:
    p = _path(path)
    source = str(p)
    header, body, ignored = _read_csv(p, source, expected)
    mp = _check_mapping(source, mapping)
    columns = _csv_columns(header, body)
    step_col = _find_step_column(source, header, step_column)
    metadata: dict[str, Any] = {"rows": len(body), "columns": header}
    if ignored:
        metadata["ignored_columns"] = ignored
    run = _build(source, tool, "column", "data row", len(body), columns, step_col, DEFAULT_MAPPINGS[tool], mp,
                 metadata, epoch_fallback=step_column == "step", run_index=run_index)
    if not run.signals and not run.extra:
        raise ValueError(f"{source} has no numeric columns besides the step; expected {expected}")
    return run


def import_csv(path: str | os.PathLike[str], mapping: Mapping[str, str | None] | None = None,
               step_column: str | None = "step", run_index: int = -1) -> ImportedRun:
    """Read a CSV file with a header row, one row per logged step (or per logging call).

    An empty cell (or ``none``, ``null``, ``na``, ``n/a``) is not measured; ``nan``, ``inf``,
    ``-inf`` are measured non-finite values. Beware: pandas' ``DataFrame.to_csv`` writes NaN as
    an empty cell, so a NaN it wrote reads back as "not measured". Rows sharing a step are merged.
    Columns with text are skipped (listed in ``metadata["skipped_columns"]``). An unnamed first
    column holding 0, 1, 2, ... (the index ``to_csv`` writes) and an unnamed last column empty
    in every row (a trailing comma) are ignored and listed in ``metadata["ignored_columns"]``;
    any other column without a name is an error.

    ======================= ======================================================================
    signal                  columns tried (first present wins, case-insensitive)
    ======================= ======================================================================
    ``loss``                ``loss``, ``train_loss``, ``train/loss``, ``training_loss``,
                            ``loss_step``, ``train_loss_step``, ``Loss/train``
    ``grad_norm``           ``grad_norm``, ``train/grad_norm``, ``gradient_norm``,
                            ``grad_norm_total``, ``grad_2.0_norm_total``, ``global_grad_norm``
    ``lr``                  ``lr``, ``learning_rate``, ``train/lr``, ``train/learning_rate``,
                            ``lr-*``
    ``update_ratio``        ``update_ratio``, ``train/update_ratio``
    ``val_loss``            ``val_loss``, ``eval_loss``, ``valid_loss``, ``validation_loss``,
                            ``val/loss``, ``eval/loss``, ``validation/loss``, ``Loss/val``
    step                    ``step_column`` (default ``step``, then ``global_step``,
                            ``trainer/global_step``, ``train/global_step``, ``_step``,
                            ``iteration``, ``iter``, ...; any case); none: the row order
    ======================= ======================================================================

    Args:
        path: The file (comma-separated, UTF-8).
        mapping: Overrides, e.g. ``{"loss": "my_loss_col", "val_loss": "valid_nll"}``; None leaves
            a signal out.
        step_column: The step column; None uses the row order. A name other than ``"step"``
            must exist.
        run_index: Which run to read when the file holds several (its steps go back to the
            start): 0 the first, -1 (the default) the last.

    Returns:
        The run; ``metadata["columns"]`` is the header.

    Raises:
        FileNotFoundError: No such file.
        ValueError: Not a CSV with a header and data rows, no numeric column, a row without a
            step, a non-integer step, a mapped column that is absent or not numeric, or an
            unknown mapping target.
    """
    return _import_csv_like(path, "csv", mapping, step_column, "a CSV file with a header row and numeric columns",
                            run_index)


def import_lightning_csv(path: str | os.PathLike[str],
                         mapping: Mapping[str, str | None] | None = None, run_index: int = -1) -> ImportedRun:
    """Read a PyTorch Lightning ``CSVLogger`` ``metrics.csv`` (``<save_dir>/<name>/version_N/``).

    Lightning writes one row per logging call with the columns sorted by name: training rows
    (``train_loss_step``, ``grad_2.0_norm_total``, ...), ``LearningRateMonitor`` rows
    (``lr-<Optimizer>``, no ``epoch``), validation rows (``val_loss``), epoch-end rows
    (``*_epoch``), all with a ``step`` and empty cells for what the call did not log; rows
    sharing a step are merged. Epoch aggregates (``train_loss_epoch``) are kept as extras.

    ======================= ======================================================================
    signal                  columns tried (first present wins, case-insensitive)
    ======================= ======================================================================
    ``loss``                ``train_loss_step``, ``train_loss``, ``loss_step``, ``loss``,
                            ``train/loss``, ``training_loss``
    ``grad_norm``           ``grad_norm_step``, ``grad_norm``, ``grad_2.0_norm_total``
                            (``lightning.pytorch.utilities.grad_norm``), ``grad_norm_total``,
                            ``train/grad_norm``
    ``lr``                  ``lr-*`` (``LearningRateMonitor``: ``lr-SGD``, ``lr-Adam/pg1``, ...;
                            not ``*-momentum`` / ``*-weight_decay``; the first in column
                            order), ``lr``, ``learning_rate``, ``lr_step``
    ``update_ratio``        ``update_ratio_step``, ``update_ratio``
    ``val_loss``            ``val_loss``, ``val_loss_epoch``, ``valid_loss``, ``validation_loss``,
                            ``val/loss``
    step                    ``step`` (none: the row order)
    ======================= ======================================================================

    Args:
        path: The ``metrics.csv`` file, or a ``version_N`` directory containing it.
        mapping: Overrides, e.g. ``{"loss": "my_train_loss", "lr": "lr-AdamW/pg2"}``.
        run_index: Which run to read when the file holds several (its steps go back to the
            start): 0 the first, -1 (the default) the last.

    Returns:
        The run.

    Raises:
        FileNotFoundError: No such file.
        ValueError: As :func:`import_csv`.
    """
    p = _path(path)
    if p.is_dir():
        p = p / "metrics.csv"
        if not p.exists():
            raise FileNotFoundError(f"no metrics.csv in {p.parent}")
    return _import_csv_like(p, "lightning-csv", mapping, "step",
                            "a Lightning CSVLogger metrics.csv (a header row with 'step' and metric columns)",
                            run_index)


# --------------------------------------------------------------------------------------------
# TensorBoard


def _is_event_file(p: Path) -> bool:
    return p.is_file() and "tfevents" in p.name


_SPLIT_DIRS = frozenset({"train", "training", "validation", "valid", "val", "eval", "test"})
"""Subfolders that split one run's event files (Keras: ``<run>/train``, ``<run>/validation``)."""


def _tensorboard_runs(root: Path, files: Sequence[Path]) -> list[Path]:
    """The runs event files below ``root`` belong to: each folder holding event files, a
    :data:`_SPLIT_DIRS` subfolder counting as the folder above it, and a folder nested in a
    run's folder that holds event files itself (``SummaryWriter.add_scalars`` writes
    ``<run>/<tag>_<name>/``) counting as that run.
    """
    holders = {f.parent for f in files}
    dirs: set[Path] = set()
    for d in holders:
        while d != root and d.name.lower() in _SPLIT_DIRS:
            d = d.parent
        dirs.add(d)
    return sorted(d for d in dirs if not any(o != d and o in d.parents and o in holders for o in dirs))


#: CRC-32C (Castagnoli), reflected: the checksum of TFRecord framing
_CRC32C_POLY = 0x82F63B78
#: bytes of an event file read and checked at a time (a longer record is read whole)
_CRC_BLOCK = 1 << 24


@functools.lru_cache(maxsize=8)
def _crc32c_tables(chunk: int) -> tuple[np.ndarray, np.ndarray]:
    """CRC-32C's byte table, and four tables (by register byte) of the register's move over ``chunk`` zero
    bytes (a linear map of the register: the XOR of its bytes' images).
    """
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where((t & 1).astype(bool), (t >> 1) ^ np.uint32(_CRC32C_POLY), t >> 1)
    z = np.arange(256, dtype=np.uint32)[None, :] << (8 * np.arange(4, dtype=np.uint32))[:, None]
    for _ in range(chunk):
        z = t[z & 0xFF] ^ (z >> 8)
    return t, z


def _crc32c(buf: np.ndarray, start: np.ndarray, n: np.ndarray) -> np.ndarray:
    """The CRC-32C of each ``buf[start[i]:start[i] + n[i]]`` (the ranges apart), all at once, in NumPy.

    The initial register (all ones) is folded into each range's first 4 bytes (their complement:
    the same CRC for a range of at least 4 bytes; shorter ones are done byte by byte). Each range
    is split into chunks ending at its end (64 bytes, more from a range of 4 KiB on: about the
    square root of the longest), the first one padded in front with zeros (which leave a zero
    register as it is); the chunks' checksums from a zero register are computed byte by byte for
    all chunks together, then chained range by range through the register's move over a chunk of
    zeros. The loops run over the bytes of a chunk and over the chunks of the longest range.
    """
    chunk = 1 << max(6, (int(n.max(initial=0)).bit_length() + 1) // 2)
    t, z = _crc32c_tables(chunk)
    out = np.zeros(len(n), dtype=np.uint32)
    for i in np.flatnonzero(n < 4).tolist():
        c = 0xFFFFFFFF
        for b in buf[start[i]:start[i] + n[i]].tolist():
            c = int(t[(c ^ b) & 0xFF]) ^ (c >> 8)
        out[i] = c ^ 0xFFFFFFFF
    big = np.flatnonzero(n >= 4)
    if not len(big):
        return out
    st, nb = start[big], n[big]
    buf = buf.copy()
    buf[(st[:, None] + np.arange(4)).reshape(-1)] ^= np.uint8(0xFF)
    m = -(-nb // chunk)  # chunks per range
    first = np.cumsum(m) - m  # each range's first chunk
    rec = np.repeat(np.arange(len(nb)), m)
    lo = (st + nb - m * chunk)[rec] + (np.arange(len(rec)) - first[rec]) * chunk  # chunk starts
    pad = np.maximum(st[rec] - lo, 0)  # zeros in front of the chunk
    by_pad = np.argsort(pad, kind="stable")  # the chunks with bytes at k: a prefix
    lo_s, live = lo[by_pad], np.searchsorted(pad[by_pad], np.arange(chunk), side="right")
    r = np.zeros(len(rec), dtype=np.uint32)
    for k in range(int(pad.min()), chunk):
        q = r[:live[k]]
        r[:live[k]] = t[(q ^ buf[lo_s[:live[k]] + k]) & 0xFF] ^ (q >> 8)
    r[by_pad] = r.copy()
    order = np.argsort(-m, kind="stable")  # most chunks first: the ranges still chaining are a prefix
    m_sorted, acc = m[order], np.zeros(len(nb), dtype=np.uint32)
    first_s, chaining = first[order], np.searchsorted(-m_sorted, -np.arange(int(m_sorted[0])), side="left")
    for j in range(int(m_sorted[0])):
        a = acc[:chaining[j]]
        acc[:chaining[j]] = (z[0][a & 0xFF] ^ z[1][(a >> 8) & 0xFF] ^ z[2][(a >> 16) & 0xFF] ^ z[3][a >> 24]
                             ^ r[first_s[:chaining[j]] + j])
    out[big[order]] = acc ^ np.uint32(0xFFFFFFFF)
    return out


def _masked(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masked checksums of CRC-32C values: rotated right by 15 bits, plus a constant (mod 2**32)."""
    c = crc.astype(np.uint64)
    return ((((c >> 15) | (c << 17)) & 0xFFFFFFFF) + 0xA282EAD8) & 0xFFFFFFFF


def _first_bad_record(block: bytes, starts: list[int], lens: list[int]) -> tuple[int, str] | None:
    """The first of the records at ``starts`` of ``block`` whose length or data fails its CRC check, and which."""
    buf = np.frombuffer(block, dtype=np.uint8)
    st, n = np.asarray(starts, dtype=np.int64), np.asarray(lens, dtype=np.int64)
    crc = _masked(_crc32c(buf, np.concatenate((st, st + 12)), np.concatenate((np.full(len(st), 8), n))))
    at = np.concatenate((st + 8, st + 12 + n))[:, None] + np.arange(4)
    stored = buf[at].astype(np.uint64) @ (np.uint64(1) << np.arange(0, 32, 8, dtype=np.uint64))
    bad_len, bad_data = (crc != stored).reshape(2, -1)
    if not (bad_len.any() or bad_data.any()):
        return None
    i = int(np.argmax(bad_len | bad_data))
    return i, "length" if bad_len[i] else "data"


def _length_intact(head: bytes) -> bool:
    """Whether a record's first 12 bytes (its data's length, the length's masked CRC-32C) agree."""
    crc = _masked(_crc32c(np.frombuffer(head, dtype=np.uint8), np.zeros(1, dtype=np.int64), np.full(1, 8)))
    return int(crc[0]) == int.from_bytes(head[8:12], "little")


def _damage_note(i: int, at: int, size: int, part: str) -> str:
    """What :func:`_event_file_damage` says of record ``i`` (0-based) at byte ``at``, damaged in its ``part``."""
    return (f"record {i + 1:,} at byte {at:,} of {size:,} is damaged (its {part} fails its CRC check, after {i:,} "
            "good record(s)); the reader stops there, and the values it and the rest of the file held are missing")


def _event_file_damage(f: Path) -> str | None:
    """Why an event file's records do not all read, or None: a file cut short (while the writer
    ran or while it was copied), or a record damaged in place. TensorBoard's reader stops
    silently at the first record that is incomplete or fails a CRC check, and what follows is
    lost. A record is its data's length (8 bytes), the length's masked CRC-32C (4), the data and
    the data's masked CRC-32C (4); both checksums are verified, in NumPy (:func:`_crc32c`).
    """
    import struct

    length_at = struct.Struct("<Q").unpack_from
    off = records = 0
    try:
        size = f.stat().st_size
        with f.open("rb") as fh:
            while off < size:
                fh.seek(off)
                block = fh.read(_CRC_BLOCK)
                starts: list[int] = []
                lens: list[int] = []
                pos = 0
                while pos + 12 <= len(block) and pos + 16 + (n := length_at(block, pos)[0]) <= len(block):
                    starts.append(pos)
                    lens.append(n)
                    pos += 16 + n
                if not starts:  # the next record is longer than a block, cut short, or its length is damaged
                    if len(block) < 12:
                        break  # cut short in its head
                    n = length_at(block, 0)[0]
                    if not _length_intact(block[:12]):
                        return _damage_note(records, off, size, "length")
                    block += fh.read(max(0, 16 + n - len(block)))
                    if len(block) < 16 + n:
                        break  # cut short
                    starts, lens, pos = [0], [n], 16 + n
                bad = _first_bad_record(block, starts, lens)
                if bad is not None:
                    return _damage_note(records + bad[0], off + starts[bad[0]], size, bad[1])
                records, off = records + len(starts), off + pos
    except OSError as exc:
        return f"cannot be read to its end ({exc})"
    if off == size:
        return None
    return (f"its records end at byte {off:,} of {size:,} (after {records:,} complete record(s)); the rest is "
            "cut short or unreadable, and the values it held are missing")


def import_tensorboard(path_or_dir: str | os.PathLike[str],
                       mapping: Mapping[str, str | None] | None = None, run_index: int = -1) -> ImportedRun:
    """Read the scalars of TensorBoard event files (``events.out.tfevents.*``).

    Needs the ``tensorboard`` package (``pip install trainsignals[tensorboard]``), imported only
    here; its ``EventAccumulator`` reads the files. Scalars written as ``simple_value`` (PyTorch
    ``SummaryWriter``, Lightning ``TensorBoardLogger``, HF ``TensorBoardCallback``) and as
    scalar tensors (TF2 ``tf.summary.scalar``, Keras) are both read. A directory is searched
    recursively; when its event files sit in several subdirectories (Keras writes ``train/``
    and ``validation/``), each tag is prefixed with its subdirectory (``train/epoch_loss``).
    A directory holding several runs (sibling folders with event files, as ``runs/<date>/``
    of several Hugging Face or ``SummaryWriter`` runs) is refused, naming them: point at one.
    Subfolders that belong to one run are ``train``, ``training``, ``validation``, ``valid``,
    ``val``, ``eval``, ``test`` and any folder below one that holds event files itself
    (``SummaryWriter.add_scalars``). A tag logged twice at a step keeps the last value (files
    read in name order, i.e. creation time). An event file whose records stop before its end
    (cut short while written or copied) or with a record damaged in place (its length or its
    data fails its CRC-32C check: TensorBoard's reader stops there) is read up to the damage,
    with a note (``metadata["damaged_files"]``) and a :class:`LogDamagedWarning`.

    ======================= ======================================================================
    signal                  tags tried (first present wins, case-insensitive)
    ======================= ======================================================================
    ``loss``                ``train/loss`` (HF), ``loss``, ``train_loss``, ``train_loss_step``
                            (Lightning), ``Loss/train``, ``training/loss``, ``train/epoch_loss``
                            (Keras)
    ``grad_norm``           ``train/grad_norm`` (HF), ``grad_norm``, ``grad_2.0_norm_total``
                            (Lightning), ``grad_norm/total``
    ``lr``                  ``train/learning_rate`` (HF), ``train/lr``, ``lr``,
                            ``learning_rate``, ``lr-*`` (Lightning ``LearningRateMonitor``),
                            ``train/epoch_learning_rate`` (Keras)
    ``update_ratio``        ``train/update_ratio``, ``update_ratio``
    ``val_loss``            ``val/loss``, ``eval/loss`` (HF), ``val_loss`` (Lightning),
                            ``eval_loss``, ``Loss/val``, ``Loss/validation``,
                            ``validation/loss``, ``valid/loss``, ``validation/epoch_loss`` (Keras)
    step                    the event's ``step``
    ======================= ======================================================================

    Args:
        path_or_dir: An event file, or a directory holding them (searched recursively).
        mapping: Overrides by tag, e.g. ``{"loss": "Loss/train_step", "val_loss": "Loss/dev"}``.
        run_index: 0 or -1 (the default): the one run read. TensorBoard's reader keeps one
            run per folder (a restart's later events replace the earlier ones), so there is
            no other run to pick; any other value is a ``ValueError``.

    Returns:
        The run; ``metadata`` has ``files``, ``runs`` (the subdirectory prefixes, ``""`` for
        the top), ``tags`` (scalar tags read) and ``other_tags`` (histograms, images, ... not
        read, by kind).

    Raises:
        ImportError: ``tensorboard`` is not installed.
        FileNotFoundError: No such file or directory.
        ValueError: No event files, a file that is not a TensorBoard event file, a directory
            holding several runs, a ``run_index`` other than 0 or -1, or a bad ``mapping``.
    """
    try:
        from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
        from tensorboard.util import tensor_util
    except ImportError as exc:
        raise ImportError(f"reading TensorBoard event files needs the tensorboard package: {_TB_INSTALL_HINT}") from exc
    p = _path(path_or_dir)
    source = str(p)
    expected = "TensorBoard event files (events.out.tfevents.*)"
    if run_index not in (0, -1) or isinstance(run_index, bool):
        raise ValueError(f"{source}: run_index {run_index!r}: a TensorBoard log is read as one run (the reader "
                         "keeps a restart's later events); point at the folder of the run you want instead")
    if p.is_dir():
        files = sorted((f for f in p.rglob("*") if _is_event_file(f)), key=lambda f: (str(f.parent), f.name))
        if not files:
            raise ValueError(f"{source} holds no {expected}")
        root = p
        runs = _tensorboard_runs(root, files)
        if len(runs) > 1:
            shown = ", ".join(str(r) for r in runs[:10]) + (f", ... ({len(runs)} in all)" if len(runs) > 10 else "")
            raise ValueError(f"{source} holds {len(runs)} TensorBoard runs, which are not merged: {shown}; point "
                             "at one of them (trainsignals replay FOLDER replays each)")
    else:
        if "tfevents" not in p.name:
            raise ValueError(f"{source} is not named like {expected}")
        files = [p]
        root = p.parent
    parents = sorted({f.parent for f in files})
    prefixed = len(parents) > 1
    mp = _check_mapping(source, mapping)
    raw: dict[str, tuple[list[int], list[float]]] = {}
    other: dict[str, list[str]] = {}
    damaged: dict[str, str] = {}
    for f in files:
        acc = EventAccumulator(str(f), size_guidance={"scalars": 0, "tensors": 0})
        try:
            acc.Reload()
        except Exception as exc:  # the reader raises its own error types on corrupt records
            raise ValueError(f"{f} could not be read as a TensorBoard event file ({exc})") from None
        if acc.file_version is None:
            raise ValueError(f"{f} is not a TensorBoard event file (no file_version record); expected {expected}")
        why = _event_file_damage(f)
        if why is not None:
            damaged[str(f)] = why
        prefix = f.parent.relative_to(root).as_posix() + "/" if prefixed and f.parent != root else ""
        tags = acc.Tags()
        for tag in tags.get("scalars", []):
            st, vs = raw.setdefault(prefix + tag, ([], []))
            for ev in acc.Scalars(tag):
                st.append(int(ev.step))
                vs.append(float(ev.value))
        for tag in tags.get("tensors", []):
            if acc.SummaryMetadata(tag).plugin_data.plugin_name != "scalars":
                other.setdefault("tensors", []).append(prefix + tag)
                continue
            st, vs = raw.setdefault(prefix + tag, ([], []))
            for tev in acc.Tensors(tag):
                arr = tensor_util.make_ndarray(tev.tensor_proto)
                if arr.size != 1:
                    continue
                st.append(int(tev.step))
                vs.append(float(arr.reshape(-1)[0]))
        for kind in ("images", "audio", "histograms", "distributions"):
            if tags.get(kind):
                other.setdefault(kind, []).extend(prefix + t for t in tags[kind])
    names = list(raw)
    chosen = _resolve(source, "tag", names, DEFAULT_MAPPINGS["tensorboard"], mp)
    parsed = {t: (np.asarray(s, dtype=np.int64), np.asarray(v, dtype=np.float64)) for t, (s, v) in raw.items()}
    all_steps = np.concatenate([s for s, _ in parsed.values()]) if parsed else np.zeros(0, dtype=np.int64)
    metadata: dict[str, Any] = {
        "mapping": dict(chosen),
        "step_column": "step",
        "files": [str(f) for f in files],
        "runs": sorted({(f.parent.relative_to(root).as_posix() if prefixed and f.parent != root else "") for f in files}),
        "tags": names,
    }
    if other:
        metadata["other_tags"] = other
    notes: list[str] = []
    if damaged:
        metadata["damaged_files"] = damaged
        for name, why in damaged.items():
            notes.append(f"damaged event file {name}: {why}")
            warnings.warn(LogDamagedWarning(f"damaged event file {name}: {why}"), stacklevel=2)
    run = _align(source, "tensorboard", all_steps, parsed, chosen, metadata)
    if parsed and not run.measured_signals():
        notes.append(run.no_signal_message())
    if notes:
        metadata["notes"] = notes
    return run


# --------------------------------------------------------------------------------------------
# auto-detection

_LIGHTNING_HINTS = ("lr-*", "grad_2.0_norm*")


def _looks_lightning(header: Sequence[str], name: str) -> bool:
    """A ``step`` column and LearningRateMonitor / grad_norm columns, an ``X_step`` / ``X_epoch``
    pair (``self.log(..., on_step=True, on_epoch=True)``), or ``epoch`` in a ``metrics.csv``.
    """
    cols = {h.strip() for h in header}
    if "step" not in cols:
        return False
    if any(fnmatch.fnmatchcase(c, pat) for c in cols for pat in _LIGHTNING_HINTS):
        return True
    if any(c.endswith("_step") and c[: -len("_step")] + "_epoch" in cols for c in cols):
        return True
    return name == "metrics.csv" and "epoch" in cols


def _csv_header(p: Path) -> list[str]:
    try:
        with p.open(encoding="utf-8-sig", newline="") as f:
            return next(csv.reader(f), [])
    except (UnicodeDecodeError, csv.Error):
        return []


def _sniff(p: Path) -> str | None:
    """A file not named like any format: CSV with a header (Keras ``CSVLogger`` writes
    ``training.log``), or JSON Lines, told from its first lines; None when it is neither.
    """
    try:
        with p.open("rb") as f:
            head = f.read(65536)
    except OSError:
        return None
    if b"\x00" in head:
        return None
    try:
        text = head.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    lines = [ln for ln in text.splitlines() if ln.strip()][:6]
    if len(head) == 65536 and len(lines) > 1:
        lines = lines[:-1]  # the last line may be cut
    if len(lines) < 2:
        return None
    if lines[0].lstrip().startswith("{"):
        try:
            return "jsonl" if isinstance(_json_loads(lines[0]), dict) else None
        except json.JSONDecodeError:
            return None
    try:
        rows = list(csv.reader(lines))
    except csv.Error:
        return None
    header = [h.strip() for h in rows[0]]
    body = rows[1:]
    named, _, _ = _drop_unnamed_columns(header, body)  # pandas' index, a trailing comma
    if len(header) < 2 or any(not h for h in named) or any(_is_number(h) for h in header if h):
        return None
    if any(len(r) != len(header) for r in body):
        return None
    if not all(any(_is_number(c) for c in r) for r in body):
        return None
    return "lightning-csv" if _looks_lightning(header, p.name.lower()) else "csv"


def _is_number(cell: str) -> bool:
    try:
        float(cell.strip())
    except ValueError:
        return False
    return True


_FOLDER_LOGS = (("trainer_state.json", "hf-trainer"), ("metrics.csv", "lightning-csv"), ("trainer_log.jsonl", "jsonl"))
"""The log files a folder may hold at its top level, in order of preference, and their tools."""


def _folder_log(p: Path) -> tuple[Path, str] | None:
    """The log file at the top level of folder ``p`` that stands for it, and its tool."""
    return next(((p / name, tool) for name, tool in _FOLDER_LOGS if (p / name).is_file()), None)


def _detect(p: Path) -> str:
    if p.is_dir():
        # a file at the top (an HF output folder keeps its TensorBoard runs in runs/<date>/ below it)
        # says more about the folder than event files deeper down
        top = _folder_log(p)
        if top is not None:
            return top[1]
        if any(_is_event_file(f) for f in p.rglob("*")):
            return "tensorboard"
        raise ValueError(f"cannot tell what {p} holds: expected a directory with a trainer_state.json, a "
                         "metrics.csv or a trainer_log.jsonl at its top, or events.out.tfevents.* files")
    name = p.name.lower()
    if "tfevents" in name:
        return "tensorboard"
    if name == "trainer_state.json":
        return "hf-trainer"
    suffix = p.suffix.lower()
    if suffix == ".csv":
        return "lightning-csv" if _looks_lightning(_csv_header(p), name) else "csv"
    if suffix in (".jsonl", ".ndjson"):
        return "jsonl"
    if suffix != ".json":
        sniffed = _sniff(p)
        if sniffed is not None:
            return sniffed
    if suffix == ".json":
        text = _read_text(p, "a trainer_state.json or a JSON array of log records")
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            return "jsonl"  # several objects, one per line
        if isinstance(data, dict) and isinstance(data.get("log_history"), list):
            return "hf-trainer"
        if isinstance(data, list):
            return "jsonl"
        raise ValueError(f"{p} is a JSON file but neither a trainer_state.json (an object with 'log_history') "
                         "nor a list of log records")
    raise ValueError(f"cannot tell the format of {p} from its name or its first lines: expected "
                     "trainer_state.json, metrics.csv, *.csv, *.jsonl, events.out.tfevents.*, or a text file "
                     "(training.log, *.txt) holding CSV with a header row or one JSON object per line; pass "
                     f"tool= one of {', '.join(TOOLS)}")


def import_run(path: str | os.PathLike[str], tool: str | None = None,
               mapping: Mapping[str, str | None] | None = None, run_index: int = -1) -> ImportedRun:
    """Import a log, recognising the tool by file name and content unless ``tool`` is given.

    ======================================================== =================================
    what ``path`` is                                         read by
    ======================================================== =================================
    ``trainer_state.json``, a ``.json`` object with          :func:`import_hf_trainer_state`
    ``log_history``, or a directory holding
    ``trainer_state.json``
    a ``.csv`` with a ``step`` column and Lightning-style    :func:`import_lightning_csv`
    columns (``lr-*``, ``*_step``, ``*_epoch``,
    ``grad_2.0_norm*``; or ``epoch`` in a file named
    ``metrics.csv``), or a directory holding ``metrics.csv``
    any other ``.csv``                                       :func:`import_csv`
    ``.jsonl``, ``.ndjson``, a ``.json`` array of objects,   :func:`import_jsonl`
    or a directory holding ``trainer_log.jsonl``
    ``events.out.tfevents.*``, or any other directory        :func:`import_tensorboard`
    holding some (recursively)
    ======================================================== =================================

    A directory is read by the file at its top level (``trainer_state.json``, then
    ``metrics.csv``, then ``trainer_log.jsonl``) when it has one, even with event files below
    it (an HF output folder keeps its TensorBoard runs in ``runs/<date>/``).

    Args:
        path: File or directory.
        tool: One of ``"hf-trainer"``, ``"lightning-csv"``, ``"csv"``, ``"jsonl"``,
            ``"tensorboard"``; None detects it.
        mapping: Signal -> source name overrides, passed to the importer.
        run_index: Which run to read when the file holds several (its steps go back to the
            start): 0 the first, -1 (the default) the last. A TensorBoard log is one run: only
            0 and -1 are taken.

    Returns:
        The run.

    Raises:
        FileNotFoundError: No such file or directory.
        ValueError: Unknown ``tool``, a format that cannot be recognised, or the importer's
            errors.
        ImportError: A TensorBoard log without the ``tensorboard`` package.
    """
    if tool is not None and tool not in TOOLS:
        raise ValueError(f"unknown tool {tool!r}; expected one of {', '.join(TOOLS)}")
    p = _path(path)
    kind = tool or _detect(p)
    if kind == "jsonl" and p.is_dir() and (p / "trainer_log.jsonl").is_file():
        p = p / "trainer_log.jsonl"  # LLaMA-Factory's output folder
    if kind == "hf-trainer":
        return import_hf_trainer_state(p, mapping=mapping, run_index=run_index)
    if kind == "lightning-csv":
        return import_lightning_csv(p, mapping=mapping, run_index=run_index)
    if kind == "csv":
        return import_csv(p, mapping=mapping, run_index=run_index)
    if kind == "jsonl":
        return import_jsonl(p, mapping=mapping, run_index=run_index)
    return import_tensorboard(p, mapping=mapping, run_index=run_index)
