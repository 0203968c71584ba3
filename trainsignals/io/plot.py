"""One picture of a run: its signals, what the detectors found, and the status over time.

:func:`plot_run` draws, on shared steps, the loss and the gradient norm (twin log axes,
validation loss as dots), the learning rate and the update ratio, a per-layer gradient-norm
heatmap when the trace has one, every event as a marker with its onset-to-detection span
shaded, and the status as a coloured band. It needs matplotlib (``pip install
'trainsignals[plot]'``), imported only when a plot is drawn; it draws on a
``FigureCanvasAgg`` and never touches pyplot's global state or the user's backend.
"""

from __future__ import annotations

import dataclasses
import os
from typing import TYPE_CHECKING, Any

import numpy as np

from trainsignals.io.report import Report, _measured, replay, replay_source
from trainsignals.signals import SCALAR_SIGNALS

if TYPE_CHECKING:
    import pyarrow as pa
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["STATUS_COLORS", "plot_run"]

#: Colour of each status in the status band.
STATUS_COLORS = {
    "warming_up": "#b0b0b0",
    "healthy": "#4caf50",
    "stalled": "#f2c12e",
    "oscillating": "#9c5fd6",
    "collapsed": "#8d4e2a",
    "diverging": "#e53935",
}
_SEVERITY_COLORS = {"critical": "#d62728", "warning": "#ff9f1c", "info": "#7f7f7f"}
_MAX_POINTS = 20_000  # beyond this, a line is drawn as its per-bucket min/max envelope
_MAX_COLUMNS = 800  # heatmap columns at most (steps are averaged in buckets)


def _layer_matrix(table: pa.Table) -> tuple[np.ndarray, np.ndarray, list[str]] | None:
    """Per-layer grad norms: (steps, matrix (n, layers), layer names) of the rows that have them."""
    from trainsignals.io.traces import trace_signals

    layers = trace_signals(table).get("layer_grad_norms")
    if layers is None:
        return None
    steps, by_name = layers
    names = list(by_name)
    return np.asarray(steps), np.column_stack([by_name[nm] for nm in names]), names


def _buckets(n: int, most: int) -> np.ndarray:
    """Start indices of at most ``most`` contiguous buckets covering ``n`` items."""
    return np.unique(np.linspace(0, n, min(n, most), endpoint=False).astype(np.int64))


def _envelope(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The line to draw: as is when short, else its min/max per bucket (spikes stay visible)."""
    if len(x) <= _MAX_POINTS:
        return x, y
    starts = _buckets(len(x), _MAX_POINTS // 2)
    with np.errstate(invalid="ignore"):
        lo = np.fmin.reduceat(y, starts)
        hi = np.fmax.reduceat(y, starts)
    return np.repeat(x[starts], 2), np.column_stack([lo, hi]).ravel()


def _positive(y: np.ndarray) -> bool:
    fin = y[np.isfinite(y)]
    return bool(fin.size) and bool(np.all(fin > 0))


def _signal(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """(steps, values, non-finite mask) of the rows where ``name`` was measured; None if never."""
    steps, vals = _measured(table, name)
    return (steps, vals, ~np.isfinite(vals)) if vals.size else None


def _plot_signal(ax: Axes, table: pa.Table, name: str, label: str, color: str, **kw: Any) -> Any:
    sig = _signal(table, name)
    if sig is None:
        return None
    steps, vals, bad = sig
    shown = np.where(bad, np.nan, vals)
    xs, ys = _envelope(steps, shown)
    (line,) = ax.plot(xs, ys, color=color, lw=1.0 if "marker" not in kw else 0.8, label=label, **kw)
    if np.any(bad):
        ax.plot(steps[bad], np.full(int(bad.sum()), 0.96), "x", color="#d62728", ms=7, mew=2,
                transform=ax.get_xaxis_transform(), label=f"{label}: NaN/inf", clip_on=False)
    if _positive(vals):
        from matplotlib.ticker import NullFormatter

        ax.set_yscale("log")
        fin = vals[~bad]
        if fin.max() > 10 * fin.min():  # minor labels only help within one decade
            ax.yaxis.set_minor_formatter(NullFormatter())
    return line


def _mark_events(axes: list[Axes], report: Report, label_ax: Axes, x_range: float) -> None:
    """Shade onset -> detection spans, draw a line at each detection, name each kind once on top.

    Names of kinds first noticed close together are stacked in rows so they stay readable.
    """
    for sev in ("info", "warning", "critical"):  # overlapping spans merged: the shade stays even
        spans = sorted((e.onset_step, e.step) for e in report.events if e.severity == sev and e.onset_step < e.step)
        merged: list[list[int]] = []
        for a, b in spans:
            if merged and a <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], b)
            else:
                merged.append([a, b])
        for ax in axes:
            for a, b in merged:
                ax.axvspan(a, b, color=_SEVERITY_COLORS[sev], alpha=0.15, lw=0)
    first_of_kind: list[Any] = []
    for ev in report.events:
        color = _SEVERITY_COLORS.get(ev.severity, "#7f7f7f")
        for ax in axes:
            ax.axvline(ev.step, color=color, lw=0.9, alpha=0.7, ls="--")
        label_ax.plot([ev.step], [1.0], marker="v", color=color, ms=7, clip_on=False,
                      transform=label_ax.get_xaxis_transform())
        if all(e.kind != ev.kind for e in first_of_kind):
            first_of_kind.append(ev)
    last_x: list[float] = []  # per row, the step of its latest label
    for ev in first_of_kind:
        row = next((i for i, x in enumerate(last_x) if ev.step - x > 0.12 * x_range), len(last_x))
        if row == len(last_x):
            last_x.append(ev.step)
        last_x[row] = ev.step
        count = sum(e.kind == ev.kind for e in report.events)
        label_ax.annotate(ev.kind.value + (f" x{count}" if count > 1 else ""), xy=(ev.step, 1.0),
                          xycoords=label_ax.get_xaxis_transform(), xytext=(3, 6 + 11 * row),
                          textcoords="offset points", fontsize=8, ha="left", va="bottom",
                          color=_SEVERITY_COLORS.get(ev.severity, "#7f7f7f"), annotation_clip=False)


def _heatmap(ax: Axes, fig: Figure, steps: np.ndarray, mat: np.ndarray, names: list[str]) -> None:
    """log10 of the per-layer norms, layers top to bottom, steps averaged in buckets."""
    with np.errstate(divide="ignore", invalid="ignore"):
        logm = np.where(mat > 0, np.log10(np.where(mat > 0, mat, 1.0)), np.nan)
    starts = _buckets(len(steps), _MAX_COLUMNS)
    fin = np.isfinite(logm)
    sums = np.add.reduceat(np.where(fin, logm, 0.0), starts, axis=0)
    counts = np.add.reduceat(fin.astype(np.int64), starts, axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        img = np.where(counts > 0, sums / np.maximum(counts, 1), np.nan).T
    x0 = float(steps[0])
    x1 = float(steps[-1]) + (float(steps[-1] - steps[0]) / max(len(steps) - 1, 1) or 1.0)
    im = ax.imshow(img, aspect="auto", interpolation="nearest", cmap="viridis",
                   extent=(x0, x1, len(names) - 0.5, -0.5))
    if len(names) <= 24:
        ax.set_yticks(range(len(names)), names, fontsize=7)
    ax.set_ylabel("layer")
    ax.set_title("per-layer gradient norm (log10)", fontsize=9, loc="left")
    cb = fig.colorbar(im, ax=ax, pad=0.01, fraction=0.03)
    cb.set_label("log10 grad norm", fontsize=8)


def _status_band(ax: Axes, report: Report, end: float) -> None:
    tl = report.status_timeline
    for i, (s, status) in enumerate(tl):
        nxt = tl[i + 1][0] if i + 1 < len(tl) else end
        ax.axvspan(s, nxt, color=STATUS_COLORS.get(status, "#cccccc"), lw=0)
    ax.set_yticks([])
    ax.set_ylabel("status", rotation=0, ha="right", va="center")
    from matplotlib.patches import Patch

    present = [st for st in STATUS_COLORS if any(st == x for _, x in tl)]
    if present and ax.figure is not None:
        ax.figure.legend(handles=[Patch(color=STATUS_COLORS[st], label=f"status: {st}") for st in present],
                         ncol=len(present), loc="outside lower center", fontsize=8, frameon=False)


def _as_report(obj: str | os.PathLike[str] | pa.Table | Report) -> Report:
    if isinstance(obj, Report):
        if obj.table is not None:
            return obj
        if obj.error is not None:
            raise ValueError(f"cannot plot {obj.source}: {obj.error}")
        import warnings

        from trainsignals.io.report import import_trace, is_trace
        from trainsignals.io.traces import read_trace

        if is_trace(obj.source):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                table = read_trace(obj.source)
        else:
            table = import_trace(obj.source)[0]
        return dataclasses.replace(obj, table=table)
    if isinstance(obj, str | os.PathLike):
        return replay_source(obj)
    return replay(obj)


def plot_run(source: str | os.PathLike[str] | pa.Table | Report,
             output: str | os.PathLike[str] | None = None, *, dpi: int = 110) -> Figure:
    """Draw a run: signals, events and status on shared steps.

    Panels, top to bottom (a panel appears when the trace has its signal): loss (left, log
    scale when positive; validation loss as dots) and gradient norm (right twin axis);
    learning rate; update ratio (with the healthy band 1e-4..1e-3 shaded); per-layer gradient
    norms as a heatmap; the status band. Every event is a triangle at the top named by its
    kind, a dashed line at the step it was noticed and a shaded span from its onset —
    red for critical, orange for warnings — across the panels. Long runs are drawn as
    per-bucket min/max envelopes so spikes stay visible.

    Args:
        source: A trace path or table, or a log path any importer reads (replayed with the
            default Monitor first; see :func:`~trainsignals.io.report.replay_source`), or a
            :class:`~trainsignals.io.report.Report` (its events and timeline are used; its trace
            is re-read from ``source`` when the report carries no table).
        output: Save a PNG there when given; a name without a suffix gets ``.png``
            (``run`` -> ``run.png``), another suffix picks another format matplotlib writes
            (``.pdf``, ``.svg``).
        dpi: Resolution of the saved PNG.

    Returns:
        The ``matplotlib.figure.Figure`` (on an Agg canvas).

    Raises:
        ValueError: the report is of an unreadable trace, the trace has no steps, or
            ``output`` is a folder.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    png = _png_path(output) if output is not None else None
    report = _as_report(source)
    table = report.table
    assert table is not None
    if table.num_rows == 0:
        raise ValueError(f"cannot plot {report.source}: the trace has no steps")
    steps = table.column("step").to_numpy()
    has = {n: _signal(table, n) is not None for n in SCALAR_SIGNALS}
    layers = _layer_matrix(table)
    rows: list[tuple[str, float]] = [("main", 3.0)]
    if has["lr"]:
        rows.append(("lr", 1.0))
    if has["update_ratio"]:
        rows.append(("update_ratio", 1.0))
    if layers is not None:
        rows.append(("layers", 1.8))
    rows.append(("status", 0.25))
    ratios = [r for _, r in rows]
    fig = Figure(figsize=(12, 1.0 + 1.45 * sum(ratios)), layout="constrained")
    FigureCanvasAgg(fig)
    grid = fig.add_gridspec(len(rows), 1, height_ratios=ratios)
    axes: dict[str, Axes] = {}
    first: Axes | None = None
    for i, (name, _) in enumerate(rows):
        ax = fig.add_subplot(grid[i], sharex=first)
        first = first or ax
        axes[name] = ax

    main = axes["main"]
    _plot_signal(main, table, "loss", "loss", "#1f77b4")
    _plot_signal(main, table, "val_loss", "validation loss", "#17becf", marker="o", ms=3, ls="-")
    main.set_ylabel("loss", color="#1f77b4")
    handles = main.get_legend_handles_labels()[0]
    if has["grad_norm"]:
        twin = main.twinx()
        _plot_signal(twin, table, "grad_norm", "grad norm", "#ff7f0e", alpha=0.6)
        twin.set_ylabel("grad norm", color="#ff7f0e")
        handles += twin.get_legend_handles_labels()[0]
        main.set_zorder(twin.get_zorder() + 1)  # the loss (and the legend) drawn over the grad norm
        main.patch.set_visible(False)
    from matplotlib.patches import Patch

    if report.events:
        sevs = [s for s in ("critical", "warning", "info") if any(e.severity == s for e in report.events)]
        handles += [Patch(color=_SEVERITY_COLORS[s], alpha=0.35, label=f"{s} event: onset -> noticed")
                    for s in sevs]
    main.legend(handles=handles, loc="best", fontsize=8, framealpha=0.9)
    main.grid(True, which="major", alpha=0.3)
    n_ev = len(report.events)
    title = f"{report.name}: {report.headline(fix=False)}; {n_ev} event(s) over {report.steps:,} {report.unit}s"
    fig.suptitle(title, fontsize=11, x=0.01, ha="left")

    if "lr" in axes:
        _plot_signal(axes["lr"], table, "lr", "learning rate", "#2ca02c")
        axes["lr"].set_ylabel("learning rate")
        axes["lr"].grid(True, alpha=0.3)
    if "update_ratio" in axes:
        ax = axes["update_ratio"]
        ax.axhspan(1e-4, 1e-3, color="#4caf50", alpha=0.12, lw=0, label="healthy band")
        _plot_signal(ax, table, "update_ratio", "update ratio |dw|/|w|", "#8c564b")
        ax.set_ylabel("update ratio")
        ax.legend(loc="upper right", fontsize=8)
        ax.grid(True, alpha=0.3)
    if layers is not None:
        _heatmap(axes["layers"], fig, *layers)
    lines_axes = [a for n, a in axes.items() if n not in ("status", "layers")]
    end = float(steps[-1]) + 1.0
    _mark_events(lines_axes + ([axes["layers"]] if layers is not None else []), report, main,
                 end - float(steps[0]))
    _status_band(axes["status"], report, end)
    axes["status"].set_xlabel(report.unit)
    for name, ax in axes.items():
        if name != "status":
            ax.tick_params(labelbottom=False)
    main.set_xlim(float(steps[0]), end)
    from matplotlib.ticker import FuncFormatter

    axes["status"].xaxis.set_major_formatter(FuncFormatter(lambda x, _: f"{x:,.0f}"))
    if png is not None:
        fig.savefig(png, dpi=dpi)
    return fig


def _png_path(output: str | os.PathLike[str]) -> str:
    """Where :func:`plot_run` writes for ``output``: ``.png`` added to a name without a suffix.

    Raises:
        ValueError: ``output`` is an existing folder.
    """
    path = os.fspath(output)
    if os.path.isdir(path):
        raise ValueError(f"output {path!r} is a folder; give the image's file name, e.g. "
                         f"{os.path.join(path, 'run.png')!r}")
    if not os.path.splitext(os.path.basename(path))[1]:
        path += ".png"
    return path
