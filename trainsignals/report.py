"""Replay recorded traces through the detectors and report what went wrong, when, and why.

A trace (:mod:`trainsignals.traces`) holds every signal a run logged. :func:`replay` runs a
:class:`~trainsignals.Monitor` over it with the vectorised :meth:`Monitor.scan` — exactly the
events of streaming the trace step by step through :meth:`Monitor.update` — and returns a
:class:`Report`: the events, the status over time, whether the run should have stopped, and
renderings for people (:meth:`Report.summary`, :meth:`Report.to_text`,
:meth:`Report.to_markdown`) and machines (:meth:`Report.to_json`, :attr:`Report.exit_code`).
:func:`replay_many` replays a folder of traces in parallel processes, and
:func:`summary_table` lays the reports side by side.

Example:
    >>> import numpy as np
    >>> from trainsignals.report import status_timeline
    >>> from trainsignals import Event, Kind
    >>> ev = Event(Kind.DIVERGENCE, "critical", 50, 45, "SlopeDivergence", "loss", 1.0, 0.2, "m", "c", "f")
    >>> status_timeline([ev], steps=np.arange(300), loss=np.ones(300), recovery=100)
    [(0, 'warming_up'), (19, 'healthy'), (50, 'diverging'), (150, 'healthy')]
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ._events import Event, Kind
from ._monitor import _RANK, _STATE_OF, Monitor

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.table import Table

__all__ = [
    "EXIT_CRITICAL",
    "EXIT_HEALTHY",
    "EXIT_UNREADABLE",
    "EXIT_WARNING",
    "Report",
    "expand_traces",
    "replay",
    "replay_many",
    "status_timeline",
    "summary_markdown",
    "summary_table",
]

#: :attr:`Report.exit_code` values: no warning or critical event; warnings only; a critical
#: event; the trace could not be read.
EXIT_HEALTHY, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNREADABLE = 0, 1, 2, 3

# Monitor.status's rule: which kinds put the run in which failed state, and which state is worse.
_RANKED = ("healthy", *sorted(_RANK, key=_RANK.__getitem__))  # healthy, stalled, oscillating, diverging


def _state(ev: Event) -> str | None:
    """The failed state an event puts the run in (a grad explosion only when critical, as in
    ``Monitor._record``)."""
    if ev.kind == Kind.GRAD_EXPLOSION and ev.severity != "critical":
        return None
    return _STATE_OF.get(ev.kind)


def status_timeline(
    events: Iterable[Event],
    steps: Any = None,
    loss: Any = None,
    *,
    warmup: int = 20,
    recovery: int = 200,
) -> list[tuple[int, str]]:
    """The run's status over time, derived from its events by the rule of ``Monitor.status``.

    The rule (see :attr:`trainsignals.Monitor.status`): a failed state is entered by its
    events (``nonfinite``, ``divergence`` and critical ``grad_explosion`` -> ``diverging``;
    ``oscillation`` -> ``oscillating``; ``stall`` -> ``stalled``) and is live while fewer than
    ``recovery`` steps passed since its latest event; after a non-finite loss the run stays
    ``diverging`` until a finite loss returns. The worst live state wins; with none live, the
    run is ``warming_up`` until ``warmup`` finite loss values were seen, else ``healthy``.

    The status is read after each step in ``steps`` (the steps the Monitor was fed; after the
    last row of a repeated step) and only changes are kept, so the result equals reading
    ``mon.status`` after every ``mon.update`` of the same run and dropping repeats. It is
    evaluated only where it can change (events, expiries, finite/non-finite loss changes, the
    end of the warm-up), so a million-step trace costs a few milliseconds.

    Without ``steps`` the status is read at those steps themselves, from the first event (or
    the first loss value). Without
    ``loss`` the warm-up and the non-finite hold cannot be known: the run counts as warmed
    up and a non-finite event follows the ``recovery`` rule like the others. (An empty loss
    is known: a run without a loss stays ``warming_up``, as the Monitor says.)

    Args:
        events: The run's events, in any order.
        steps: Ascending steps at which the status is read, or None.
        loss: The loss, aligned with ``steps`` (NaN or inf where non-finite), or a
            ``(loss_steps, loss_values)`` pair holding only the steps where it was measured.
        warmup: Finite loss values before the run leaves ``warming_up`` (``Monitor.warmup``).
        recovery: Steps a failed state lasts after its latest event (``Monitor.recovery``).

    Returns:
        ``[(step, status), ...]``: the first reading, then one entry per change.

    Raises:
        ValueError: ``steps`` or the loss steps decrease, or the loss is misaligned.
    """
    evs = list(events)
    by_state: dict[str, np.ndarray] = {}
    for state in _RANKED[1:]:
        at_steps = sorted(e.step for e in evs if _state(e) == state)
        if at_steps:
            by_state[state] = np.asarray(at_steps, dtype=np.int64)
    loss_steps: np.ndarray | None = None
    loss_vals: np.ndarray | None = None
    if loss is not None:
        if isinstance(loss, tuple) and len(loss) == 2:
            loss_steps = np.asarray(loss[0], dtype=np.int64)
            loss_vals = np.asarray(loss[1], dtype=np.float64)
        else:
            if steps is None:
                raise ValueError("a loss aligned with steps needs steps")
            loss_steps = np.asarray(steps, dtype=np.int64)
            loss_vals = np.asarray(loss, dtype=np.float64)
        if loss_steps.shape != loss_vals.shape:
            raise ValueError(f"loss has {loss_vals.size} values for {loss_steps.size} steps")
        if np.any(loss_steps[1:] < loss_steps[:-1]):
            raise ValueError("loss steps must not decrease")
    # The status can change only at these steps: an event, a state's expiry (event + recovery),
    # a change between finite and non-finite loss, the warm-up's last finite loss.
    crit = [np.asarray([e.step for e in evs], dtype=np.int64)]
    crit += [a + recovery for a in by_state.values()]
    finite = None
    if loss_steps is not None and loss_vals is not None:
        finite = np.isfinite(loss_vals)
        crit.append(loss_steps[np.r_[True, finite[1:] != finite[:-1]]] if finite.size else loss_steps)
        fin_at = loss_steps[finite]
        if fin_at.size >= warmup > 0:
            crit.append(fin_at[warmup - 1:warmup])
    cands = np.concatenate(crit)
    if steps is not None:
        st = np.asarray(steps, dtype=np.int64).ravel()
        if np.any(st[1:] < st[:-1]):
            raise ValueError("steps must not decrease")
        if st.size == 0:
            return []
        at = np.searchsorted(st, cands, side="left")  # the first reading at or after each change
        pts = np.unique(np.r_[st[:1], st[at[at < st.size]]])
    else:
        pts = np.unique(cands)
        starts = [e.step for e in evs] + ([int(loss_steps[0])] if loss_steps is not None and loss_steps.size else [])
        if starts:
            pts = pts[pts >= min(starts)]
    if pts.size == 0:
        return []
    if loss_steps is not None and finite is not None:
        k = np.searchsorted(loss_steps, pts, side="right")  # loss values seen by each reading
        n_finite = np.concatenate([[0], np.cumsum(finite)])[k]
        nonfinite_open = (k > 0) & ~np.r_[True, finite][k]
    else:
        n_finite = np.full(pts.size, warmup)
        nonfinite_open = np.zeros(pts.size, dtype=bool)
    rank = np.zeros(pts.size, dtype=np.int64)
    for state, est in by_state.items():
        i = np.searchsorted(est, pts, side="right") - 1
        entered = i >= 0
        live = entered & (pts - est[np.maximum(i, 0)] < recovery)
        if state == "diverging":
            live |= entered & nonfinite_open
        rank = np.where(live, np.maximum(rank, _RANK[state]), rank)
    codes = np.where((rank == 0) & (n_finite < warmup), -1, rank)
    change = np.r_[True, codes[1:] != codes[:-1]]
    names = ("warming_up",) + _RANKED  # code -1 indexes the first name via +1
    return [(int(s), names[int(c) + 1]) for s, c in zip(pts[change], codes[change])]


@dataclass
class Report:
    """What a replay found in one run.

    Attributes:
        source: The trace's path, or a name for a table.
        events: The events, in order.
        status_timeline: ``[(step, status), ...]``: the status after the first step, then
            every change (see :func:`status_timeline`).
        final_status: ``Monitor.status`` after the last step.
        should_stop: Whether a critical event advised stopping (``Monitor.should_stop``).
        steps: Rows (steps) in the trace.
        first_step: The first step, or None for an empty trace.
        last_step: The last step, or None for an empty trace.
        metadata: The run's metadata as written into the trace (``trace_metadata(t)["metadata"]``).
        notes: What a person should know about the input (e.g. a damaged, truncated file).
        error: Why the trace could not be read (then nothing was replayed), or None.
        table: The trace as read (kept for plotting; not compared, not serialised, and
            dropped by :func:`replay_many` to keep results small).
    """

    source: str
    events: list[Event] = field(default_factory=list)
    status_timeline: list[tuple[int, str]] = field(default_factory=list)
    final_status: str = "warming_up"
    should_stop: bool = False
    steps: int = 0
    first_step: int | None = None
    last_step: int | None = None
    metadata: dict[str, Any] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    error: str | None = None
    table: pa.Table | None = field(default=None, repr=False, compare=False)

    # -- verdicts -------------------------------------------------------------------------
    @property
    def exit_code(self) -> int:
        """0 healthy (no warning or critical event), 1 warnings only, 2 a critical event,
        3 the trace could not be read."""
        if self.error is not None:
            return EXIT_UNREADABLE
        sev = {e.severity for e in self.events}
        if "critical" in sev:
            return EXIT_CRITICAL
        return EXIT_WARNING if "warning" in sev else EXIT_HEALTHY

    @property
    def verdict(self) -> str:
        """``"healthy"``, ``"warnings"``, ``"critical"`` or ``"unreadable"`` (the exit code in words)."""
        return ("healthy", "warnings", "critical", "unreadable")[self.exit_code]

    @property
    def name(self) -> str:
        """The file name of the source (the whole source for a table)."""
        return Path(self.source).name or self.source

    def failures(self) -> list[tuple[Kind, list[Event]]]:
        """The warning and critical events grouped by kind, in order of first detection."""
        groups: dict[Kind, list[Event]] = {}
        for ev in self.events:
            if ev.severity in ("warning", "critical"):
                groups.setdefault(ev.kind, []).append(ev)
        return list(groups.items())

    # -- renderings -----------------------------------------------------------------------
    def _span(self) -> str:
        if self.first_step is None:
            return "no steps"
        return f"{self.steps:,} steps ({self.first_step}..{self.last_step})"

    def summary(self) -> str:
        """A few lines a person reads: which failures, when they began and were noticed, the first fix.

        Returns:
            One header line, then two lines per failure kind (what; first fix).
        """
        if self.error is not None:
            return f"{self.source}: could not be read: {self.error}"
        fails = self.failures()
        head = f"{self.source}: {self._span()}, status {self.final_status}"
        if self.should_stop:
            head += ", STOP advised"
        if not fails:
            infos = len(self.events)
            lines = [head + (f"; healthy ({infos} info event(s))" if infos else "; healthy, no events")]
        else:
            lines = [head + f"; {len(fails)} failure kind(s), {sum(len(v) for _, v in fails)} event(s)"]
        for kind, evs in fails:
            first = evs[0]
            sev = "critical" if any(e.severity == "critical" for e in evs) else "warning"
            layer = f" [{first.layer}]" if first.layer else ""
            times = f" (x{len(evs)})" if len(evs) > 1 else ""
            lines.append(f"  {sev.upper()} {kind.value}{layer}{times}: began step {first.onset_step}, "
                         f"noticed step {first.step}: {first.message}")
            lines.append(f"    fix: {first.fix}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _timeline_text(self) -> str:
        return ", ".join(f"{s}: {st}" for s, st in self.status_timeline) or "-"

    def to_text(self) -> str:
        """The summary, the status timeline and every event on its own line."""
        if self.error is not None:
            return self.summary()
        lines = [self.summary(), f"status timeline: {self._timeline_text()}"]
        if self.metadata:
            lines.append("metadata: " + json.dumps(self.metadata, default=str, sort_keys=True))
        if self.events:
            lines.append("events:")
            lines.extend(f"  {e}" for e in self.events)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (events via :meth:`Event.to_dict`) and the verdict."""
        return {
            "source": self.source,
            "exit_code": self.exit_code,
            "verdict": self.verdict,
            "final_status": self.final_status,
            "should_stop": self.should_stop,
            "steps": self.steps,
            "first_step": self.first_step,
            "last_step": self.last_step,
            "status_timeline": [[s, st] for s, st in self.status_timeline],
            "events": [e.to_dict() for e in self.events],
            "metadata": self.metadata,
            "notes": list(self.notes),
            "error": self.error,
        }

    def to_json(self, indent: int | None = 2) -> str:
        """:meth:`to_dict` as a JSON string (non-finite numbers as strings, as in ``Event.to_dict``)."""
        return json.dumps(self.to_dict(), indent=indent, default=str)

    def to_markdown(self) -> str:
        """A Markdown section: verdict, run facts, failures table, status timeline, all events."""
        out = [f"## `{self.source}`", ""]
        if self.error is not None:
            return "\n".join(out + [f"**unreadable**: {_md(self.error)}", ""])
        out += [
            f"**{self.verdict}** — status `{self.final_status}` after {self._span()}"
            + ("; **stop advised**" if self.should_stop else ""),
            "",
        ]
        out += [f"> note: {_md(n)}" for n in self.notes]
        if self.notes:
            out.append("")
        fails = self.failures()
        if fails:
            out += ["| failure | severity | began | noticed | events | signal | what | first fix |",
                    "|---|---|---:|---:|---:|---|---|---|"]
            for kind, evs in fails:
                first = evs[0]
                sev = "critical" if any(e.severity == "critical" for e in evs) else "warning"
                sig = first.signal + (f" [{first.layer}]" if first.layer else "")
                out.append(f"| {kind.value} | {sev} | {first.onset_step} | {first.step} | {len(evs)} | "
                           f"{_md(sig)} | {_md(first.message)} | {_md(first.fix)} |")
            out.append("")
        else:
            out += ["No failures.", ""]
        out += [f"Status timeline: {_md(self._timeline_text())}", ""]
        if self.events:
            out += ["<details><summary>all events</summary>", ""]
            out += [f"- {_md(str(e))}" for e in self.events]
            out += ["", "</details>", ""]
        return "\n".join(out)


def _md(text: str) -> str:
    """Escape the characters that would break a Markdown table cell."""
    return text.replace("|", "\\|").replace("\n", " ")


# -- replay ---------------------------------------------------------------------------------
def _measured(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """(steps, values) of the rows where a scalar signal was measured: nulls dropped, NaN kept."""
    steps = np.asarray(table.column("step").to_numpy(), dtype=np.int64)
    if name not in table.column_names:
        return steps[:0], np.zeros(0)
    col = table.column(name)
    vals = np.asarray(col.to_numpy(zero_copy_only=False), dtype=np.float64)
    if col.null_count:
        valid = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), dtype=bool)
        return steps[valid], vals[valid]
    return steps, vals


def replay(source: str | os.PathLike[str] | pa.Table, monitor: Monitor | None = None, *,
           name: str | None = None) -> Report:
    """Replay a trace through a Monitor and report what it finds.

    Runs ``monitor.scan(**trace_signals(table))``: the vectorised batch path, which gives
    exactly the events of feeding the trace row by row to :meth:`Monitor.update`.

    Args:
        source: A trace file (read with :func:`trainsignals.traces.read_trace`) or a
            ``pyarrow.Table`` in the trace schema.
        monitor: The Monitor to run (its state continues); default a fresh
            ``Monitor(total_steps=<rows in the trace>)``.
        name: The report's ``source`` for a table (default ``"<table>"``).

    Returns:
        The :class:`Report`. A damaged (truncated) file is replayed as far as it is complete,
        with a note; the ``TraceDamagedWarning`` is re-issued.

    Raises:
        trainsignals.traces.TraceFormatError: the file is not a trace.
        OSError: the file cannot be opened.
    """
    import pyarrow as pa

    from .traces import TraceDamagedWarning, read_trace, trace_metadata, trace_signals

    notes: list[str] = []
    if isinstance(source, pa.Table):
        table, label = source, name or "<table>"
    else:
        label = name or os.fspath(source)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", TraceDamagedWarning)
            table = read_trace(source)
        for w in caught:
            if issubclass(w.category, TraceDamagedWarning):
                notes.append(f"damaged trace: {w.message}")
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    n = table.num_rows
    if monitor is None:
        monitor = Monitor(total_steps=n if n else None)
    events: list[Event] = monitor.scan(**trace_signals(table)) if n else []
    steps = table.column("step").to_numpy() if n else np.zeros(0, np.int64)
    timeline = status_timeline(events, steps, _measured(table, "loss"), warmup=monitor.warmup,
                               recovery=monitor.recovery) if n else []
    return Report(
        source=label,
        events=events,
        status_timeline=timeline,
        final_status=monitor.status,
        should_stop=monitor.should_stop,
        steps=n,
        first_step=int(steps[0]) if n else None,
        last_step=int(steps[-1]) if n else None,
        metadata=dict(trace_metadata(table)["metadata"]),
        notes=notes,
        table=table,
    )


def expand_traces(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """Paths to replay: each folder becomes its ``*.arrow`` files (sorted), files stay as given.

    Raises:
        FileNotFoundError: a path does not exist.
    """
    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
        if p.is_dir():
            out.extend(sorted(q for q in p.glob("*.arrow") if q.is_file()))
        elif p.exists():
            out.append(p)
        else:
            raise FileNotFoundError(f"no such trace or folder: {p}")
    return out


def _replay_file(path: str) -> Report:
    """Replay one file for :func:`replay_many`: an unreadable file becomes a report saying why."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # damage is in the report's notes
            rep = replay(path)
    except Exception as exc:  # TraceFormatError, OSError, pyarrow's errors on a damaged file...
        return Report(source=path, error=f"{type(exc).__name__}: {exc}", final_status="unknown")
    rep.table = None
    return rep


def replay_many(
    paths_or_dir: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    processes: int | None = None,
    progress: bool = True,
) -> list[Report]:
    """Replay many traces in parallel processes.

    Args:
        paths_or_dir: A folder (its ``*.arrow`` files), a trace file, or a list of either.
        processes: Worker processes (default: the CPU count, at most one per file); 1 replays
            in this process.
        progress: Show a rich progress bar on stderr.

    Returns:
        One :class:`Report` per file, in input order (folders sorted by name). A file that is
        not a trace, or too damaged to read, gives a report with ``error`` set instead of an
        exception; a truncated trace is replayed as far as it is complete, with a note.
        Reports carry no ``table``.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: ``processes`` < 1.
    """
    files = [os.fspath(p) for p in expand_traces(paths_or_dir)]
    if processes is not None and processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    workers = min(processes or os.cpu_count() or 1, max(len(files), 1))
    results: list[Report | None] = [None] * len(files)
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bar = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=Console(stderr=True), disable=not progress or not files, transient=True)
    if workers <= 1:
        with bar:
            task = bar.add_task("replay", total=len(files))
            for i, f in enumerate(files):
                results[i] = _replay_file(f)
                bar.advance(task)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed

        # never fork a parent that may run threads (JAX, torch, a rich live display): forkserver
        # starts workers from a clean server process; spawn where forkserver does not exist
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            futures = {pool.submit(_replay_file, f): i for i, f in enumerate(files)}
            with bar:
                task = bar.add_task("replay", total=len(files))
                for fut in as_completed(futures):
                    results[futures[fut]] = fut.result()
                    bar.advance(task)
    return [r for r in results if r is not None]


_VERDICT_STYLE = {"healthy": "green", "warnings": "yellow", "critical": "bold red", "unreadable": "magenta"}


def summary_table(reports: Sequence[Report]) -> Table:
    """The reports side by side: which runs failed, how, and when.

    Args:
        reports: Reports from :func:`replay` or :func:`replay_many`.

    Returns:
        A ``rich.table.Table``: one row per run with its verdict, final status, steps, each
        failure kind with the step it began and the step it was noticed, and the first fix.
    """
    from rich.table import Table

    t = Table(title=f"{len(reports)} run(s) replayed", show_lines=False)
    t.add_column("run", overflow="fold")
    t.add_column("verdict")
    t.add_column("status")
    t.add_column("steps", justify="right")
    t.add_column("failures (began -> noticed)", overflow="fold")
    t.add_column("first fix", overflow="fold")
    for r in reports:
        style = _VERDICT_STYLE[r.verdict]
        if r.error is not None:
            t.add_row(r.name, f"[{style}]{r.verdict}[/]", "-", "-", r.error, "-")
            continue
        fails = r.failures()
        what = "\n".join(
            f"{k.value}{' x' + str(len(evs)) if len(evs) > 1 else ''}: {evs[0].onset_step} -> {evs[0].step}"
            for k, evs in fails) or "-"
        if r.notes:
            what += "\n" + "\n".join(f"({n})" for n in r.notes)
        stop = " STOP" if r.should_stop else ""
        t.add_row(r.name, f"[{style}]{r.verdict}[/]", r.final_status + stop, f"{r.steps:,}", what,
                  fails[0][1][0].fix if fails else "-")
    return t


def summary_markdown(reports: Sequence[Report]) -> str:
    """The reports side by side as a Markdown table (the twin of :func:`summary_table`).

    Args:
        reports: Reports from :func:`replay` or :func:`replay_many`.

    Returns:
        A Markdown table: run, verdict, final status, steps, failures (began -> noticed).
    """
    lines = ["| run | verdict | status | steps | failures (began -> noticed) |", "|---|---|---|---:|---|"]
    for r in reports:
        fails = "; ".join(f"{k.value} {evs[0].onset_step} -> {evs[0].step}" for k, evs in r.failures())
        if r.error is not None:
            fails = _md(r.error)
        lines.append(f"| `{r.name}` | {r.verdict} | {r.final_status}{' (stop)' if r.should_stop else ''} | "
                     f"{r.steps:,} | {fails or '-'} |")
    return "\n".join(lines)
