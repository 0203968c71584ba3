"""Replay recorded traces through the detectors and report what went wrong, when, and why.

A trace (:mod:`trainsignals.io.traces`) holds every signal a run logged. :func:`replay` runs a
:class:`~trainsignals.Monitor` over it with the vectorised :meth:`Monitor.scan` — exactly the
events of streaming the trace step by step through :meth:`Monitor.update` — and returns a
:class:`Report`: the events, the status over time, whether the run should have stopped, and
renderings for people (:meth:`Report.summary`, :meth:`Report.to_text`,
:meth:`Report.to_markdown`) and machines (:meth:`Report.to_json`, :attr:`Report.exit_code`).
:func:`replay_many` replays a folder of traces in parallel processes, and
:func:`summary_table` lays the reports side by side.

Example:
    >>> import numpy as np
    >>> from trainsignals.io.report import status_timeline
    >>> from trainsignals import Event, Kind
    >>> ev = Event(Kind.DIVERGENCE, "critical", 50, 45, "TrendDivergence", "loss", 1.0, 0.2, "m", "c", "f")
    >>> status_timeline([ev], steps=np.arange(300), loss=np.ones(300), recovery=100)
    [(0, 'warming_up'), (19, 'healthy'), (50, 'diverging'), (150, 'healthy')]
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainsignals._events import Event, Kind
from trainsignals._monitor import Monitor
from trainsignals._validate import check_range
from trainsignals.detectors import Detector
from trainsignals.policy import NO_HOLD, EventPolicy, hold_marks, hold_sweep, loss_levels
from trainsignals.status import RANK, WARM_VALUES, state_of, warmed_up

if TYPE_CHECKING:
    from concurrent.futures import Executor

    import pyarrow as pa
    from rich.table import Table

__all__ = [
    "EXIT_CRITICAL",
    "EXIT_HEALTHY",
    "EXIT_UNREADABLE",
    "EXIT_WARNING",
    "Report",
    "default_monitor",
    "expand_sources",
    "expand_traces",
    "import_trace",
    "imported_trace_kwargs",
    "is_trace",
    "logging_interval",
    "replay",
    "replay_many",
    "replay_source",
    "status_timeline",
    "summary_markdown",
    "summary_table",
]

#: :attr:`Report.exit_code` values: no warning or critical event; warnings only; a critical
#: event; the trace could not be read.
EXIT_HEALTHY, EXIT_WARNING, EXIT_CRITICAL, EXIT_UNREADABLE = 0, 1, 2, 3

# Monitor.status's rule: which kinds put the run in which failed state, and which state is worse.
_RANKED = ("healthy", *sorted(RANK, key=RANK.__getitem__))  # healthy, stalled, oscillating, collapsed, diverging


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
    ``silent_collapse`` -> ``collapsed``; ``oscillation`` -> ``oscillating``; ``stall`` ->
    ``stalled``) and is live while fewer than
    ``recovery`` steps passed since its latest event; after a non-finite loss the run stays
    ``diverging`` until a finite loss returns, and while the loss's level has not come back to
    within 10 % of its level before the divergence (:mod:`trainsignals.policy`'s divergence hold). The worst live state wins; with none live, the
    run is ``warming_up`` until ``warmup`` finite loss values were seen, or 8 that span
    ``warmup`` steps (a log written every N steps), else ``healthy``.

    The status is read after each step in ``steps`` (the steps the Monitor was fed; after the
    last row of a repeated step) and only changes are kept, so the result equals reading
    ``mon.status`` after every ``mon.update`` of the same run and dropping repeats. It is
    evaluated only where it can change (events, expiries, finite/non-finite loss changes, the
    end of the warm-up), so a million-step trace costs a few milliseconds.

    Without ``steps`` the status is read at those steps themselves, from the first event (or
    the first loss value). Without
    ``loss`` the warm-up and the holds cannot be known: the run counts as warmed up and a
    non-finite or divergence event follows the ``recovery`` rule like the others. (An empty loss
    is known: a run without a loss stays ``warming_up``, as the Monitor says.)

    Args:
        events: The run's events, in any order.
        steps: Ascending steps at which the status is read, or None.
        loss: The loss, aligned with ``steps`` (NaN or inf where non-finite), or a
            ``(loss_steps, loss_values)`` pair holding only the steps where it was measured.
        warmup: Finite loss values before the run leaves ``warming_up`` (``Monitor.warmup``).
        recovery: Steps a failed state lasts after its latest event (``Monitor.recovery_steps``).

    Returns:
        ``[(step, status), ...]``: the first reading, then one entry per change.

    Raises:
        ValueError: ``steps`` or the loss steps decrease, or the loss is misaligned.
    """
    evs = list(events)
    by_state: dict[str, np.ndarray] = {}
    for state in _RANKED[1:]:
        at_steps = sorted(e.step for e in evs if state_of(e) == state)
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
    holds = None
    if loss_steps is not None and loss_vals is not None and "diverging" in by_state:
        holds = _holds(evs, loss_steps, loss_vals)
    # The status can change only at these steps: an event, a state's expiry (event + recovery),
    # a change between finite and non-finite loss, the warm-up's last finite loss, a divergence hold's end.
    crit = [np.asarray([e.step for e in evs], dtype=np.int64)]
    if holds is not None:
        crit.append(holds[0])
    crit += [a + recovery for a in by_state.values()]
    finite = None
    if loss_steps is not None and loss_vals is not None:
        finite = np.isfinite(loss_vals)
        crit.append(loss_steps[np.r_[True, finite[1:] != finite[:-1]]] if finite.size else loss_steps)
        fin_at = loss_steps[finite]
        if fin_at.size >= warmup > 0:
            crit.append(fin_at[warmup - 1:warmup])
        if fin_at.size >= WARM_VALUES and warmup > WARM_VALUES:  # or WARM_VALUES values that span warmup steps
            crit.append(np.asarray([max(int(fin_at[WARM_VALUES - 1]), int(fin_at[0]) + warmup)], dtype=np.int64))
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
        first = int(loss_steps[finite][0]) if finite.any() else -1
        warm = warmed_up(n_finite, first, pts, warmup)
    else:
        warm = np.ones(pts.size, dtype=bool)
        nonfinite_open = np.zeros(pts.size, dtype=bool)
    rank = np.zeros(pts.size, dtype=np.int64)
    for state, est in by_state.items():
        i = np.searchsorted(est, pts, side="right") - 1
        entered = i >= 0
        live = entered & (pts - est[np.maximum(i, 0)] < recovery)
        if state == "diverging":
            live |= entered & nonfinite_open
            if holds is not None and len(holds[0]):
                h = np.searchsorted(holds[0], pts, side="right") - 1
                live |= (h >= 0) & holds[1][np.maximum(h, 0)]
        rank = np.where(live, np.maximum(rank, RANK[state]), rank)
    codes = np.where((rank == 0) & ~warm, -1, rank)
    change = np.r_[True, codes[1:] != codes[:-1]]
    names = ("warming_up",) + _RANKED  # code -1 indexes the first name via +1
    return [(int(s), names[int(c) + 1]) for s, c in zip(pts[change], codes[change])]


def _holds(evs: list[Event], loss_steps: np.ndarray, loss_vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Where the policy's divergence hold opens and closes over a whole run (:func:`trainsignals.policy.hold_sweep`):
    the steps, and whether it is open after each.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        ok = np.isfinite(loss_vals) & (loss_vals > 0.0)
        us, lev = loss_steps[ok], loss_levels(np.log(loss_vals[ok]))
    marks = hold_marks(sorted(evs, key=lambda e: e.step), us, lev)
    changes = hold_sweep(NO_HOLD, marks, us, lev)[1]
    return (np.asarray([c[0] for c in changes], dtype=np.int64), np.asarray([c[1] for c in changes], dtype=bool))


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
        3 the trace could not be read.
        """
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
        """The file name of the source (the whole source for a table); for a log imported from a
        folder (a TensorBoard run, a Lightning ``version_N``) or a file with a generic name
        (``metrics.csv``, ``trainer_state.json``), the folder name too.
        """
        p = Path(self.source)
        if p.name in _GENERIC_NAMES and p.parent.name:
            return f"{p.parent.name}/{p.name}"
        return p.name or self.source

    @property
    def unit(self) -> str:
        """What the trace's ``step`` counts: ``"step"``, or ``"epoch"`` for a log imported from an
        epoch-indexed file without a step column (``metadata["step_unit"]``).
        """
        unit = self.metadata.get("step_unit", "step")
        return unit if isinstance(unit, str) and unit else "step"

    def headline(self, fix: bool = True) -> str:
        """The one-line verdict: what failed, since when, how the run ended, and the first fix.

        The headline failure is the first kind with a critical event (else the first warning
        kind), named at its first such event: ``critical divergence at step 470 (since 450)``.
        Then how the run ended, read from the status timeline: ``still diverging at the end``,
        ``recovered, status healthy at the end`` (a failed status came and went) or ``status
        healthy at the end``, and when a stop was advised.

        Args:
            fix: Append the headline event's first fix.

        Returns:
            One line, without the run's name.
        """
        if self.error is not None:
            return f"could not be read: {self.error}"
        u = self.unit
        fails = self.failures()
        if not fails:
            out = f"healthy: no warning or critical event over {self._span()}"
            if self.final_status not in ("healthy", "warming_up"):
                out += f", status {self.final_status} at the end"
            elif self.final_status == "warming_up":
                out += " (still warming up at the end: too few loss values to judge)"
            return out
        crit = [(k, [e for e in evs if e.severity == "critical"]) for k, evs in fails]
        crit = [(k, evs) for k, evs in crit if evs]
        kind, evs = crit[0] if crit else fails[0]
        first = evs[0]
        n_kind = sum(1 for e in self.events if e.kind == kind and e.severity in ("warning", "critical"))
        layer = f" [{first.layer}]" if first.layer else ""
        out = f"{first.severity} {kind.value}{layer} at {u} {first.step}"
        if first.onset_step < first.step:
            out += f" (since {u} {first.onset_step})"
        if n_kind > 1:
            out += f", {n_kind} events"
        if len(fails) > 1:
            out += f"; also {', '.join(k.value for k, _ in fails if k != kind)}"
        failed = set(RANK)  # every failed state
        if self.final_status in failed:
            out += f" — still {self.final_status} at the end"
        elif any(st in failed for _, st in self.status_timeline):
            out += f" — recovered, status {self.final_status} at the end"
        else:
            out += f" — status {self.final_status} at the end"
        if self.should_stop:
            stop = next((e for e in self.events if e.severity == "critical"), None)
            out += f"; stop advised at {u} {stop.step}" if stop is not None else "; stop advised"
        if fix:
            out += f". Fix: {first.fix}"
        return out

    def verdict_line(self) -> str:
        """``<verdict>: <name>: <headline>``, the line printed first by ``trainsignals replay``."""
        return f"{self.verdict.upper()} {self.name}: {self.headline()}"

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
        return f"{self.steps:,} {self.unit}s ({self.first_step}..{self.last_step})"

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
            lines.append(f"  {sev.upper()} {kind.value}{layer}{times}: began {self.unit} {first.onset_step}, "
                         f"noticed {self.unit} {first.step}: {first.message}")
            lines.append(f"    fix: {first.fix}")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)

    def _timeline_text(self) -> str:
        return ", ".join(f"{s}: {st}" for s, st in self.status_timeline) or "-"

    def to_text(self) -> str:
        """The summary, the status timeline and every event on its own line."""
        if self.error is not None:
            return self.verdict_line()
        lines = [self.verdict_line(), self.summary(), f"status timeline: {self._timeline_text()}"]
        if self.metadata:
            lines.append("metadata: " + json.dumps(_json_safe(self.metadata), default=str, sort_keys=True))
        if self.events:
            lines.append("events:")
            lines.extend(f"  {e}" for e in self.events)
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict of every field (events via :meth:`Event.to_dict`) and the verdict.

        Non-finite numbers, in the events and in the metadata (a diverged Hugging Face run's
        ``"train_loss": NaN``), are the strings ``"nan"``, ``"inf"``, ``"-inf"``: the dict
        dumps to strict JSON.
        """
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
            "metadata": _json_safe(self.metadata),
            "notes": list(self.notes),
            "error": self.error,
            "headline": self.headline(),
            "unit": self.unit,
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
            f"**{self.verdict.upper()}: {_md(self.headline())}**",
            "",
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


_GENERIC_NAMES = frozenset({"metrics.csv", "trainer_state.json", "trainer_log.jsonl", "results.csv", "progress.csv",
                            "training.log", "training_history.csv", "log.csv", "log.jsonl", "metrics.jsonl"})


def _json_safe(obj: Any) -> Any:
    """``obj`` with every non-finite float as ``"nan"``, ``"inf"`` or ``"-inf"`` (as ``Event.to_dict``
    writes them), so that ``json.dumps`` writes strict JSON; other values unchanged.
    """
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else str(obj)
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, list | tuple):
        return [_json_safe(v) for v in obj]
    if isinstance(obj, np.floating):
        return _json_safe(float(obj))
    return obj


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


def _planned_steps(table: pa.Table) -> int | None:
    """The trace metadata's ``total_steps`` when it is a number >= 1 (as an int), else None; ``replay``
    and ``watch`` both read it.
    """
    from trainsignals.io.traces import trace_metadata

    planned = trace_metadata(table)["metadata"].get("total_steps")
    if isinstance(planned, int | float) and not isinstance(planned, bool) and math.isfinite(planned) \
            and planned >= 1:
        return int(planned)
    return None


#: the Monitor arguments a recorded plan may give back (the rest of it says what could not be kept)
_PLAN_ARGS = ("total_steps", "log_every", "val_metric_mode", "warmup", "recovery", "min_patience", "max_events",
              "stop_on")


def _recorded_plan(table: pa.Table) -> dict[str, Any] | None:
    """The settings of the Monitor that recorded the trace (``TraceWriter.plan``), or None."""
    from trainsignals.io.traces import trace_metadata

    plan = trace_metadata(table)["metadata"].get("monitor_plan")
    return plan if isinstance(plan, dict) else None


def _plan_monitor(plan: dict[str, Any], log_every: int | None, total_steps: int | None) -> tuple[Monitor, list[str]]:
    """The Monitor a recorded plan describes (``log_every`` and ``total_steps`` given win), and notes.

    Raises:
        TypeError, ValueError: the plan does not build a Monitor (a damaged or foreign ``monitor_plan``).
    """
    kw = {k: plan[k] for k in _PLAN_ARGS if k in plan}
    if not isinstance(kw.get("log_every"), int):
        raise ValueError(f"log_every {kw.get('log_every')!r}")
    if kw.get("stop_on") is not None:
        kw["stop_on"] = tuple(kw["stop_on"])
    settings = plan.get("settings") or {}
    policy = plan.get("policy")
    notes: list[str] = []
    if log_every is not None and log_every != kw["log_every"]:
        notes.append(f"replayed with Monitor(log_every={log_every}) as asked; the run was recorded with "
                     f"log_every={kw['log_every']}")
        kw["log_every"] = log_every
    if total_steps is not None:
        kw["total_steps"] = total_steps
    if plan.get("suite") == "custom":
        notes.append("the run was recorded by a Monitor with a suite of its own; replayed with the default suite "
                     "(pass your Monitor to replay it with yours)")
    mon = Monitor(**kw, **settings, policy=None if policy is None else EventPolicy(**policy))
    return mon, notes


def _check_plan(log_every: int | None, total_steps: int | None) -> None:
    """``log_every`` and ``total_steps`` for the default Monitor: None, or an integer >= 1."""
    for pname, given in (("log_every", log_every), ("total_steps", total_steps)):
        if given is not None:
            check_range(pname, given, 1, None, integer=True)


def logging_interval(table: pa.Table) -> int:
    """The steps between two logged losses of a trace: the median gap between the steps that
    hold a loss, or 1 with fewer than three losses.

    It is the ``log_every`` :func:`replay` and ``trainsignals watch`` give the default Monitor
    when not told one.

    Args:
        table: A trace (a table from :func:`trainsignals.io.traces.read_trace`), or its first rows.

    Returns:
        The interval in steps, >= 1.

    Example:
        >>> from trainsignals.io.traces import read_trace, write_trace
        >>> import os, tempfile
        >>> p = os.path.join(tempfile.mkdtemp(), "t.arrow")
        >>> _ = write_trace(p, step=[0, 50, 100, 150], loss=[3.0, 2.0, 1.5, 1.2])
        >>> logging_interval(read_trace(p))
        50
    """
    if not table.num_rows:
        return 1
    logged = np.unique(_measured(table, "loss")[0])
    return max(1, int(np.median(np.diff(logged)))) if len(logged) > 2 else 1


def default_monitor(table: pa.Table, *, log_every: int | None = None, total_steps: int | None = None,
                    complete: bool = True) -> tuple[Monitor, list[str]]:
    """The Monitor :func:`replay` runs over a trace when given none, and notes on how it was chosen.

    ``Monitor(total_steps=T, log_every=N)``. A trace a Monitor recorded (``Monitor(recorder=TraceWriter(...))``)
    holds that Monitor's settings (``metadata["monitor_plan"]``: ``total_steps``, ``log_every``,
    ``val_metric_mode``, ``warmup``, ``recovery``, ``min_patience``, ``max_events``, ``stop_on``,
    the detector settings and the event policy), and the replay's Monitor is built from them, N
    and T unless given: the recording Monitor, also for a run stopped early (a suite of one's
    own cannot be rebuilt: the notes say so). Otherwise N
    is ``log_every``, else :func:`logging_interval`; T is ``total_steps``, else the trace
    metadata's ``total_steps`` (a number >= 1), else, for a ``complete`` trace, the steps it spans
    (its rows at one loss a step), else None (a trace still being written: its length is not
    known yet).
    ``trainsignals watch`` builds its Monitor here, from the first rows of a live trace
    (``complete=False``) or from the whole of one its writer already closed.

    Args:
        table: The trace, or its first rows (``complete=False``).
        log_every: The steps between two logged values, instead of the median gap.
        total_steps: The run's length in steps, instead of the metadata's or the span.
        complete: Whether ``table`` is the whole run.

    Returns:
        ``(monitor, notes)``: a fresh Monitor, and what a report should say about its
        ``log_every`` (nothing at one loss a step).

    Raises:
        ValueError: ``log_every`` or ``total_steps`` is not an integer >= 1.
    """
    _check_plan(log_every, total_steps)
    recorded = _recorded_plan(table)
    plan_note = []
    if recorded is not None:
        try:
            return _plan_monitor(recorded, log_every, total_steps)
        except (TypeError, ValueError) as exc:  # a plan that builds no Monitor: replayed as a trace without one
            plan_note = [f"the trace's monitor_plan was not used ({exc})"]
    n = table.num_rows
    steps = table.column("step").to_numpy() if n else np.zeros(0, np.int64)
    gap = logging_interval(table)
    # a log written every `every` steps: the rules' spans cover the same steps in fewer values
    every = gap if log_every is None else log_every
    span = (int(steps[-1] - steps[0]) + every if n and every > 1 else n) if complete else None
    planned = total_steps if total_steps is not None else _planned_steps(table)
    notes: list[str] = []
    if log_every is not None and log_every != gap:
        notes.append(f"replayed with Monitor(log_every={log_every}) as asked; the median gap between the "
                     f"trace's losses is {gap} steps")
    elif every > 1:
        notes.append(f"one loss every {gap} steps (median): replayed with Monitor(log_every={gap}), so the "
                     "rules' windows cover the steps they cover at one value a step, down to the fewest "
                     "values each rule needs; a spike shorter than a logging interval is averaged away "
                     "where the logger writes window means")
    return Monitor(total_steps=planned or span or None, log_every=every), plan_note + notes


def replay(source: str | os.PathLike[str] | pa.Table, monitor: Monitor | None = None, *,
           name: str | None = None, log_every: int | None = None, total_steps: int | None = None) -> Report:
    """Replay a trace through a Monitor and report what it finds.

    Runs ``monitor.scan(**trace_signals(table))``: the vectorised batch path, which gives
    exactly the events of feeding the trace row by row to :meth:`Monitor.update`. The events the
    trace holds from no detector class (findings an adapter gave its Monitor, ``update(events=...)``:
    a skipped non-finite step, a frozen layer, a rollback) are given back to the scan at their steps
    (``scan(events=...)``), so they count in the status and ``should_stop`` as they did live; the
    events of every detector class this process knows (the package's, one's own) come only from
    ``monitor``'s suite.

    Args:
        source: A trace file (read with :func:`trainsignals.io.traces.read_trace`) or a
            ``pyarrow.Table`` in the trace schema.
        monitor: The Monitor to run (its state continues); default a fresh
            ``Monitor(total_steps=<rows in the trace>)``; for a trace whose losses are logged every
            N > 1 steps (the median gap), ``Monitor(total_steps=<steps it spans>, log_every=N)``.
            A ``total_steps`` in the trace's metadata (a number >= 1, as ``trainsignals watch``
            reads it) is the run's length instead of the steps the trace spans.
        name: The report's ``source`` for a table (default ``"<table>"``).
        log_every: For the default Monitor: the steps between two logged values, instead of the
            median gap between the trace's losses (for a log whose gaps vary, or whose steps
            count something else than optimizer steps).
        total_steps: For the default Monitor: the run's length in steps, instead of the steps the
            trace spans (for a log of part of a run).

    Returns:
        The :class:`Report`. A damaged (truncated) file is replayed as far as it is complete,
        with a note; the ``TraceDamagedWarning`` is re-issued.

    Raises:
        trainsignals.io.traces.TraceFormatError: the file is not a trace.
        OSError: the file cannot be opened.
        ValueError: ``log_every`` or ``total_steps`` given with a ``monitor`` (it has its own), or
            not an integer >= 1.
    """
    import pyarrow as pa

    from trainsignals.io.traces import (
        TraceDamagedWarning,
        read_trace,
        trace_events,
        trace_metadata,
        trace_signals,
    )

    if monitor is not None and (log_every is not None or total_steps is not None):
        raise ValueError(f"{'log_every' if log_every is not None else 'total_steps'} is for the default Monitor; "
                         "the monitor given has its own")
    _check_plan(log_every, total_steps)
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
    steps = table.column("step").to_numpy() if n else np.zeros(0, np.int64)
    gap = logging_interval(table)
    if monitor is None:
        monitor, plan_notes = default_monitor(table, log_every=log_every, total_steps=total_steps)
        notes.extend(plan_notes)
    elif gap > 1 and getattr(monitor, "log_every", 1) != gap:
        notes.append(f"one loss every {gap} steps (median), replayed through a Monitor with "
                     f"log_every={getattr(monitor, 'log_every', 1)}: the rules' windows count values, so they "
                     f"span {gap}x as many steps")
    signals = trace_signals(table) if n else {}
    if n and not len(_measured(table, "loss")[0]):
        others = ", ".join(k for k in signals if k != "step") or "none"
        notes.append("no training loss in the trace: the rules that read the loss do not judge, and the status "
                     f"stays warming_up outside a failure; the other signals ({others}) are checked")
    # the findings the run gave its Monitor (an adapter's own checks), back at their steps: not a detector's events
    given = [e for e in trace_events(table) if e.detector not in _rule_names(monitor)] if n else []
    events: list[Event] = monitor.scan(**signals, events=given or None) if n else []
    timeline = status_timeline(events, steps, _measured(table, "loss"), warmup=monitor.warmup,
                               recovery=monitor.recovery_steps) if n else []
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


def _rule_names(monitor: Monitor) -> set[str]:
    """The names of every detector class this process knows (the package's, the user's) and of ``monitor``'s."""
    names = {type(d).__name__ for d in monitor.detectors.values()}
    todo: list[type[Detector]] = [Detector]
    while todo:
        for sub in todo.pop().__subclasses__():
            if sub.__name__ not in names:
                names.add(sub.__name__)
                todo.append(sub)
    return names


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


_ARROW_MAGIC = (b"\xff\xff\xff\xff", b"ARROW1")
_LOG_SUFFIXES = frozenset({".csv", ".jsonl", ".ndjson"})
_SNIFF_SUFFIXES = frozenset({".log", ".txt", ""})
_SPLIT_DIRS = frozenset({"train", "training", "validation", "valid", "val", "eval", "test"})


def is_trace(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a trace rather than another tool's log: named ``*.arrow``, or a file
    that starts like an Arrow stream or file.
    """
    p = Path(path)
    if p.suffix.lower() == ".arrow":
        return True
    try:
        with open(p, "rb") as f:
            head = f.read(6)
    except OSError:
        return False
    return head.startswith(_ARROW_MAGIC)


def _checkpoint_number(p: Path) -> int | None:
    name = p.parent.name
    if name.startswith("checkpoint-") and name[len("checkpoint-"):].isdigit():
        return int(name[len("checkpoint-"):])
    return None


def _logs_in(folder: Path) -> list[Path]:
    """The runs a folder holds, each once (see :func:`expand_sources`)."""
    from trainsignals.io.importers import _detect

    out: list[Path] = []
    tb_dirs: set[Path] = set()
    states: list[Path] = []
    for f in sorted(folder.rglob("*")):
        rel = f.relative_to(folder).parts
        if any(part.startswith(".") for part in rel) or not f.is_file():
            continue
        name = f.name.lower()
        if "tfevents" in name:
            d = f.parent
            while d != folder and d.name.lower() in _SPLIT_DIRS:  # Keras: <run>/train, <run>/validation
                d = d.parent
            tb_dirs.add(d)
        elif name == "trainer_state.json":
            states.append(f)
        elif f.suffix.lower() == ".arrow" or f.suffix.lower() in _LOG_SUFFIXES:
            out.append(f)
        elif f.suffix.lower() in _SNIFF_SUFFIXES or f.suffix.lower() == ".json":
            if f.stat().st_size > 64 * 2**20:
                continue
            try:
                _detect(f)
            except (ValueError, OSError):
                continue  # not a log: a README, a config.json, hparams...
            out.append(f)
    # HF checkpoints: checkpoint-N/trainer_state.json are prefixes of the run's final state
    for st in states:
        n = _checkpoint_number(st)
        if n is None:
            out.append(st)
            continue
        run_dir = st.parent.parent
        if (run_dir / "trainer_state.json").is_file():
            continue
        siblings = [q for q in states if q.parent.parent == run_dir and _checkpoint_number(q) is not None]
        if n == max(_checkpoint_number(q) or 0 for q in siblings):
            out.append(st)
    # a TensorBoard run folder nested in another one is its own run only if the outer holds none itself
    for d in sorted(tb_dirs):
        if not any(o != d and o in d.parents and any(_is_event(q) for q in o.iterdir()) for o in tb_dirs):
            out.append(d)
    return sorted(out, key=lambda q: str(q))


def _is_event(p: Path) -> bool:
    return p.is_file() and "tfevents" in p.name.lower()


def expand_sources(paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> list[Path]:
    """What to replay: traces and other tools' logs, each run once.

    A file stays as given (a trace, or any log :func:`trainsignals.io.importers.import_run` reads).
    A folder that is one run of another tool (a TensorBoard run folder, a Lightning
    ``version_N`` folder, an HF output folder with ``trainer_state.json``) stays as given;
    any other folder is searched recursively for:

    - traces (``*.arrow``), ``*.csv``, ``*.jsonl``, ``*.ndjson``;
    - ``trainer_state.json``; one inside ``checkpoint-N/`` only when the run folder above has
      none, and then only the highest ``N`` (the others are prefixes of it);
    - TensorBoard runs: each folder holding event files, one run (a ``train``/``validation``
      subfolder belongs to the folder above it);
    - ``*.log``, ``*.txt``, ``*.json`` and files without a suffix whose content is CSV with a
      header or JSON records (Keras' ``training.log``); other files are ignored.

    Hidden files and folders are skipped.

    Raises:
        FileNotFoundError: a path does not exist.
    """
    from trainsignals.io.importers import _detect

    if isinstance(paths, str | os.PathLike):
        paths = [paths]
    out: list[Path] = []
    for p in map(Path, paths):
        if not p.exists():
            raise FileNotFoundError(f"no such trace, log or folder: {p}")
        if not p.is_dir():
            out.append(p)
            continue
        entries = [q for q in p.iterdir() if not q.name.startswith(".")]
        single = any(_is_event(q) for q in entries) or (
            not any(q.suffix.lower() == ".arrow" for q in entries)
            and ((p / "trainer_state.json").is_file() or (p / "metrics.csv").is_file()))
        if single:
            try:
                _detect(p)
                out.append(p)
                continue
            except ValueError:
                pass
        out.extend(_logs_in(p))
    return out


def replay_source(source: str | os.PathLike[str], monitor: Monitor | None = None, *, tool: str | None = None,
                  mapping: dict[str, str | None] | None = None, run_index: int = -1,
                  log_every: int | None = None, total_steps: int | None = None) -> Report:
    """Replay a trace or any log the importers read (:func:`trainsignals.io.importers.import_run`).

    A trace is replayed with :func:`replay`, whatever ``tool`` and ``mapping`` say (they are for
    other tools' logs; a note says they were not used). Another tool's log is imported, checked for a
    signal to replay (:meth:`~trainsignals.io.importers.ImportedRun.require_signals`), turned into
    a trace in memory and replayed; the importer's notes (how the log was read: the x-axis,
    steps going back, several runs in the file) become the report's notes.

    Args:
        source: A trace, a log file, or a log folder (TensorBoard, Lightning ``version_N``).
        monitor: As for :func:`replay`.
        tool: The log's format (``import_run``'s ``tool``); None detects it. Not used for a trace.
        mapping: Signal -> column overrides for a log (``{"loss": "train/box_loss"}``). Not used
            for a trace.
        run_index: Which run of a log holding several (default the last).
        log_every: As for :func:`replay`.
        total_steps: As for :func:`replay`.

    Returns:
        The :class:`Report`, with the trace as ``table``.

    Raises:
        trainsignals.io.traces.TraceFormatError: a ``.arrow`` file that is not a trace.
        trainsignals.io.importers.NoSignalError: a log without any signal under the names tried
            (the message lists its columns and a mapping to try).
        ValueError, FileNotFoundError, ImportError: the importer's errors; a ``run_index`` other
            than 0 or -1 for a trace.
    """
    if is_trace(source):
        if run_index not in (-1, 0):
            raise ValueError(f"run_index {run_index}: {os.fspath(source)} is a trace, which holds one run "
                             "(run_index picks a run of a log holding several)")
        rep = replay(source, monitor, log_every=log_every, total_steps=total_steps)
        unused = [what for what, given in ((f"tool {tool!r}", tool), ("mapping", mapping)) if given]
        if unused:
            rep.notes.append(f"read as a trace; {' and '.join(unused)} not used (given for other tools' logs; a "
                             "trace names its signals itself)")
        return rep
    table, notes = import_trace(source, tool=tool, mapping=mapping, run_index=run_index)
    rep = replay(table, monitor, name=os.fspath(source), log_every=log_every, total_steps=total_steps)
    rep.notes = [*notes, *rep.notes]
    return rep


def imported_trace_kwargs(run: Any) -> dict[str, Any]:
    """:func:`trainsignals.io.traces.write_trace` keywords for an imported run (signals, metadata).

    Raises:
        trainsignals.io.importers.NoSignalError: the run has no signal to replay.
    """
    run.require_signals()
    kwargs = run.scan_kwargs()
    kwargs.setdefault("step", run.steps)
    meta = {"converted_from": run.source, "tool": run.tool, **run.metadata}
    return {**kwargs, "metadata": meta}


def import_trace(source: str | os.PathLike[str], *, tool: str | None = None,
                 mapping: dict[str, str | None] | None = None, run_index: int = -1) -> tuple[pa.Table, list[str]]:
    """Import a log and return it as a trace table (as ``trainsignals convert`` writes it) and
    the importer's notes.

    Raises:
        As :func:`replay_source` for a log.
    """
    import tempfile

    from trainsignals.io.importers import import_run
    from trainsignals.io.traces import read_trace, write_trace

    run = import_run(source, tool=tool, mapping=mapping, run_index=run_index)
    kwargs = imported_trace_kwargs(run)
    with tempfile.TemporaryDirectory(prefix="trainsignals-") as d:
        path = os.path.join(d, "run.arrow")
        write_trace(path, **kwargs)
        table = read_trace(path)
    return table, run.notes


def _replay_file(path: str, tool: str | None = None, mapping: dict[str, str | None] | None = None,
                 run_index: int = -1, log_every: int | None = None, total_steps: int | None = None) -> Report:
    """Replay one source for :func:`replay_many`: an unreadable one becomes a report saying why."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # damage is in the report's notes
            rep = replay_source(path, tool=tool, mapping=mapping, run_index=run_index, log_every=log_every,
                                total_steps=total_steps)
    except Exception as exc:  # TraceFormatError, NoSignalError, OSError, pyarrow's errors on a damaged file...
        return Report(source=path, error=f"{type(exc).__name__}: {exc}", final_status="unknown")
    rep.table = None
    return rep


def replay_many(
    paths_or_dir: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
    processes: int | None = None,
    progress: bool | None = None,
    *,
    executor: Executor | None = None,
    tool: str | None = None,
    mapping: dict[str, str | None] | None = None,
    run_index: int = -1,
    log_every: int | None = None,
    total_steps: int | None = None,
) -> list[Report]:
    """Replay many traces and logs, in parallel.

    Args:
        paths_or_dir: Folders, traces, logs, or a list of them (see :func:`expand_sources`:
            a folder stands for the traces and logs under it).
        processes: Worker processes of a local pool (default: the CPU count, at most one per
            source); 1 replays in this process. Ignored with ``executor``.
        progress: Show a rich progress bar on stderr; None (default): only when stderr is a
            terminal.
        executor: Any ``concurrent.futures.Executor`` to replay on instead of a local process
            pool: a ``ProcessPoolExecutor`` or ``ThreadPoolExecutor``, a Dask
            ``distributed.Client(...).get_executor()``, an MPI or Ray pool exposing the same
            interface. Each task is ``_replay_file(path, tool, mapping, run_index, ...)`` (module
            level, picklable) and returns a small :class:`Report`, so workers need
            trainsignals installed and the files at the same paths. The executor is not
            shut down.
        tool: The format of the logs (``import_run``'s ``tool``); None detects each. Traces are
            read as traces.
        mapping: Signal -> column overrides applied to every log (not to traces).
        run_index: Which run of a log holding several (default the last).
        log_every: As for :func:`replay`, for every source.
        total_steps: As for :func:`replay`, for every source.

    Returns:
        One :class:`Report` per source, in input order (folders sorted by name). A source that
        cannot be read, or holds no signal to replay, gives a report with ``error`` set
        instead of an exception; a truncated trace is replayed as far as it is complete, with
        a note. Reports carry no ``table``.

    Raises:
        FileNotFoundError: a path does not exist.
        ValueError: ``processes`` < 1, or ``log_every``/``total_steps`` not an integer >= 1.
    """
    import sys
    from concurrent.futures import as_completed
    from functools import partial

    files = [os.fspath(p) for p in expand_sources(paths_or_dir)]
    if processes is not None and processes < 1:
        raise ValueError(f"processes must be >= 1, got {processes}")
    _check_plan(log_every, total_steps)
    if progress is None:
        progress = sys.stderr.isatty()
    task_fn = partial(_replay_file, tool=tool, mapping=dict(mapping) if mapping else None, run_index=run_index,
                      log_every=log_every, total_steps=total_steps)
    workers = min(processes or os.cpu_count() or 1, max(len(files), 1))
    results: list[Report | None] = [None] * len(files)
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from trainsignals.io._console import make_console

    bar = Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                   console=make_console(stderr=True), disable=not progress or not files, transient=True)

    def collect(pool: Executor) -> None:
        futures = {pool.submit(task_fn, f): i for i, f in enumerate(files)}
        with bar:
            task = bar.add_task("replay", total=len(files))
            for fut in as_completed(futures):
                i = futures[fut]
                try:
                    results[i] = fut.result()
                except Exception as exc:  # the executor failed the task (a lost worker...)
                    results[i] = Report(source=files[i], error=f"{type(exc).__name__}: {exc}", final_status="unknown")
                bar.advance(task)

    if executor is not None:
        collect(executor)
    elif workers <= 1:
        with bar:
            task = bar.add_task("replay", total=len(files))
            for i, f in enumerate(files):
                results[i] = task_fn(f)
                bar.advance(task)
    else:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        # never fork a parent that may run threads (JAX, torch, a rich live display): forkserver
        # starts workers from a clean server process; spawn where forkserver does not exist
        methods = multiprocessing.get_all_start_methods()
        ctx = multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")
        with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
            collect(pool)
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
    from rich.text import Text

    t = Table(title=f"{len(reports)} run(s) replayed", show_lines=False)
    t.add_column("run", overflow="fold")
    t.add_column("verdict")
    t.add_column("status")
    t.add_column("steps", justify="right")
    t.add_column("failures (began -> noticed)", overflow="fold")
    t.add_column("first fix", overflow="fold")
    for r in reports:
        # names, messages and fixes are data, not markup: a cell reading "exp[lr].arrow" or "[fc1]"
        # is Text, shown as it is
        verdict = Text(r.verdict, style=_VERDICT_STYLE[r.verdict])
        if r.error is not None:
            t.add_row(Text(r.name), verdict, "-", "-", Text(r.error), "-")
            continue
        fails = r.failures()
        what = "\n".join(
            f"{k.value}{' x' + str(len(evs)) if len(evs) > 1 else ''}: {evs[0].onset_step} -> {evs[0].step}"
            for k, evs in fails) or "-"
        if r.notes:
            what += "\n" + "\n".join(f"({n})" for n in r.notes)
        stop = " STOP" if r.should_stop else ""
        t.add_row(Text(r.name), verdict, r.final_status + stop, f"{r.steps:,}", Text(what),
                  Text(fails[0][1][0].fix) if fails else "-")
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
