"""The trace commands of ``trainsignals``: replay, plot, watch and convert recorded runs.

``add_trace_commands(subparsers)`` adds them to an ``argparse`` sub-parser set; each command
sets ``func(args) -> int`` (the exit status). Mounted by :mod:`trainsignals.cli`::

    trainsignals replay runs/ --json          # every trace and log under runs/, in parallel
    trainsignals replay trainer_state.json    # another tool's log, imported on the fly
    trainsignals replay results.csv --map loss=train/box_loss
    trainsignals plot run.arrow -o run.png
    trainsignals watch run.arrow --timeout 600
    trainsignals convert trainer_state.json -o run.arrow --tool hf-trainer
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from trainsignals.cli.options import (
    UsageError,
    error_message,
    nonnegative_float,
    positive_float,
    positive_int,
)
from trainsignals.io._console import make_console
from trainsignals.io.report import (
    EXIT_UNREADABLE,
    Report,
    expand_sources,
    replay_many,
    status_timeline,
    summary_markdown,
    summary_table,
)

if TYPE_CHECKING:
    import pyarrow as pa
    from rich.console import Console, RenderableType

    from trainsignals import Monitor

__all__ = ["EXIT_INTERRUPTED", "TraceTail", "add_trace_commands"]

#: Exit status of ``watch`` stopped with Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED = 130

#: Logged losses ``watch`` reads before it infers the logging interval (``--log-every`` not given),
#: or rows without that many losses (a trace that logs none, or few).
INTERVAL_LOSSES, INTERVAL_ROWS = 10, 1_000

_EXIT_HELP = """exit status: 0 every run healthy (no warning or critical event); 1 warnings only;
2 a critical event in some run (non-finite values, divergence, repeated spikes...), or a bad
option (a usage line on stderr, nothing on stdout); 3 a trace or log could not be read; 141 the
reader of the output went away (| head). With several runs, the largest applies."""

_WATCH_EXIT_HELP = """exit status: 0 healthy (no warning or critical event); 1 warnings only; 2 a critical
event, or a bad option; 3 the file is not a trace, never appeared, or no step arrived;
130 interrupted (Ctrl-C)."""


def _wrap(text: str) -> str:
    return textwrap.fill(text, width=90, break_on_hyphens=False)


def add_trace_commands(subparsers: Any) -> None:
    """Add ``replay``, ``plot``, ``watch`` and ``convert`` to an argparse sub-parser set.

    Args:
        subparsers: What ``ArgumentParser.add_subparsers()`` returned. Each added command
            sets ``func``: call ``args.func(args)`` for its exit status.
    """
    from trainsignals.io.importers import TOOLS

    fmt = argparse.RawDescriptionHelpFormatter

    r = subparsers.add_parser(
        "replay", help="run the detectors over recorded traces or other tools' logs and report what went wrong",
        description=_wrap("Replay recorded traces (Arrow IPC, see trainsignals.io.traces) or any log convert "
                    "reads (trainer_state.json, a Lightning version_N folder or metrics.csv, a TensorBoard "
                    "folder, CSV, JSONL, Keras' training.log) through the default Monitor and report per "
                    "run: a one-line verdict (what failed, since when, the fix), then the failures, when "
                    "they began and were noticed, the status over time. A folder stands for every trace "
                    "and log under it, replayed in parallel processes."),
        epilog=_EXIT_HELP, formatter_class=fmt)
    r.add_argument("paths", nargs="+", metavar="PATH", help="traces, logs, or folders holding them")
    out = r.add_mutually_exclusive_group()
    out.add_argument("--json", action="store_true",
                     help='print {"exit_code": N, "runs": [report, ...]} as JSON')
    out.add_argument("--markdown", action="store_true", help="print a Markdown report")
    r.add_argument("--processes", type=positive_int, default=None,
                   help="worker processes for many traces (default: one per CPU; 1: in this process)")
    r.add_argument("--progress", action="store_true",
                   help="show a progress bar on stderr (default: only when stderr is a terminal)")
    _import_options(r, TOOLS)
    _monitor_options(r)
    r.set_defaults(func=_replay_cmd)

    p = subparsers.add_parser(
        "plot", help="draw a trace: signals, events and status on shared steps (needs matplotlib)",
        description=_wrap("Replay a trace and draw loss and grad norm, learning rate, update ratio, "
                    "per-layer grad norms, every event (onset -> detection) and the status band."),
        epilog="exit status: 0 written; 1 failed (message on stderr); 2 a bad option.", formatter_class=fmt)
    p.add_argument("path", metavar="PATH", help="trace file, or a log convert reads")
    p.add_argument("-o", "--output", required=True, help="PNG to write")
    p.add_argument("--dpi", type=positive_int, default=110, help="resolution (default 110)")
    _import_options(p, TOOLS)
    _monitor_options(p)
    p.set_defaults(func=_plot_cmd)

    w = subparsers.add_parser(
        "watch", help="follow a trace while a job writes it: live status and events",
        description=_wrap("Follow a trace being written by a running job (TraceWriter): complete batches "
                    "are read as they arrive (a partial last batch is normal while the writer "
                    "runs) and fed to a Monitor; a live status line shows the latest step, status "
                    "and events. Ends when the writer closes the trace, on Ctrl-C, or after "
                    "--timeout seconds without growth. The file may appear after watch starts. The "
                    "Monitor is the one replay builds: told the logging interval (--log-every, else the "
                    f"median gap between the losses, read once {INTERVAL_LOSSES} are there: the first rows "
                    "wait for them) "
                    "and the run's length (--total-steps, else the metadata's total_steps); a trace the "
                    "writer closed before watch read it gets replay's events and exit status."),
        epilog=_WATCH_EXIT_HELP,
        formatter_class=fmt)
    w.add_argument("path", metavar="PATH", help="trace file (may not exist yet)")
    w.add_argument("--interval", type=positive_float, default=0.5, help="seconds between polls (default 0.5)")
    w.add_argument("--timeout", type=nonnegative_float, default=None,
                   help="stop after this many seconds without growth, or without the file appearing "
                        "(default: wait for the writer to close the trace)")
    w.add_argument("--log-every", type=positive_int, default=None, metavar="N",
                   help="steps between two logged values (default: the median gap between the losses, as "
                        f"replay infers it, read once {INTERVAL_LOSSES} are there or the trace ends; the "
                        "first rows wait for them)")
    w.add_argument("--total-steps", type=positive_int, default=None, metavar="N",
                   help="planned steps (stall patience 10%% of them); default: the trace metadata's "
                        "total_steps, else, for a trace the writer closed before watch read it, the steps "
                        "it spans (as replay)")
    w.set_defaults(func=_watch_cmd)

    c = subparsers.add_parser(
        "convert", help="turn another tool's logs into a trace (HF Trainer, Lightning, CSV, JSONL, TensorBoard)",
        description=_wrap("Import a run logged by another tool (trainsignals.io.importers) and write it as a "
                    "trace that replay, plot and watch read."),
        epilog="exit status: 0 written; 1 failed (message on stderr); 2 a bad option.", formatter_class=fmt)
    c.add_argument("src", metavar="SRC", help="trainer_state.json, metrics.csv, a CSV/JSONL file or a TensorBoard folder")
    c.add_argument("-o", "--output", required=True, help="trace to write (.arrow)")
    _import_options(c, TOOLS)
    c.set_defaults(func=_convert_cmd)


def _map_item(text: str) -> str:
    """Argparse type of a ``--map`` item: ``OURS=THEIRS`` (or ``OURS=``), OURS one of our signals."""
    from trainsignals.io.importers import SIGNALS

    ours, sep, _ = text.partition("=")
    if not sep or not ours.strip():
        raise argparse.ArgumentTypeError(f"expected OURS=THEIRS (e.g. loss=train/loss; lr= skips lr), got {text!r}")
    if ours.strip() not in SIGNALS:
        raise argparse.ArgumentTypeError(f"{ours.strip()!r} in {text!r} is not one of our signals "
                                         f"({', '.join(SIGNALS)})")
    return text


def _import_options(parser: argparse.ArgumentParser, tools: Sequence[str]) -> None:
    """``--tool``, ``--map`` and ``--run-index``: how to read another tool's log."""
    parser.add_argument("--tool", choices=tools, default=None,
                        help="format of the logs (default: guessed from each name and content; traces are "
                             "read as traces)")
    parser.add_argument("--map", nargs="+", action="extend", default=[], metavar="OURS=THEIRS", type=_map_item,
                        help="our signal = their column, e.g. --map loss=train/loss grad_norm=gn; "
                             "OURS= skips a signal (default: each tool's usual names; not used for traces)")
    parser.add_argument("--run-index", type=int, default=-1, metavar="N",
                        help="which run of a log holding several (the step restarts); default the last (-1)")


def _monitor_options(parser: argparse.ArgumentParser) -> None:
    """``--log-every`` and ``--total-steps``: what the default Monitor is told about the run."""
    parser.add_argument("--log-every", type=positive_int, default=None, metavar="N",
                        help="steps between two logged values (default: the median gap between the losses)")
    parser.add_argument("--total-steps", type=positive_int, default=None, metavar="N",
                        help="the run's length in steps (default: the trace metadata's total_steps, else "
                             "the steps the log spans)")


# -- replay -------------------------------------------------------------------------------
def _console(stderr: bool = False) -> Console:
    return make_console(stderr=stderr)


def _failure_table(report: Report) -> Any:
    """One row per failure kind: severity, count, when it began and was noticed, what, first fix."""
    from rich.table import Table
    from rich.text import Text

    t = Table(show_edge=False, pad_edge=False, expand=False)
    for col, just in (("failure", "left"), ("severity", "left"), ("events", "right"), ("began", "right"),
                      ("noticed", "right"), ("what", "left"), ("first fix", "left")):
        t.add_column(col, justify=just, overflow="fold")  # type: ignore[arg-type]
    for kind, evs in report.failures():
        first = evs[0]
        sev = "critical" if any(e.severity == "critical" for e in evs) else "warning"
        style = "bold red" if sev == "critical" else "yellow"
        layer = f" [{first.layer}]" if first.layer else ""
        # data, not markup: "vanishing_gradient [fc1]" as it is
        t.add_row(Text(kind.value + layer), Text(sev, style=style), str(len(evs)), str(first.onset_step),
                  str(first.step), Text(first.message), Text(first.fix))
    return t


def _print_rich(console: Console, reports: Sequence[Report]) -> None:
    from rich.text import Text

    for rep in reports:
        style = {"healthy": "green", "warnings": "yellow", "critical": "bold red"}.get(rep.verdict, "magenta")
        console.print(Text(rep.verdict_line(), style=style))
        if rep.error is not None:
            console.print()
            continue
        console.print(Text(rep.summary().splitlines()[0]))
        if rep.failures():
            console.print(_failure_table(rep))
        for n in rep.notes:
            console.print(Text.assemble("  ", ("note:", "magenta"), f" {n}"))
        if rep.status_timeline:
            console.print("  status: " + ", ".join(f"{s}: {st}" for s, st in rep.status_timeline[:12])
                          + (" ..." if len(rep.status_timeline) > 12 else ""))
        console.print()
    if len(reports) > 1:
        console.print(summary_table(reports))


def _replay_cmd(args: argparse.Namespace) -> int:
    from rich.markup import escape

    err = _console(stderr=True)
    mapping = _parse_map(args.map)  # a UsageError: status 2, as argparse's
    try:
        files = expand_sources(args.paths)
    except (FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return EXIT_UNREADABLE
    if not files:
        err.print(f"[red]error:[/] no traces or logs in {escape(', '.join(args.paths))}")
        return EXIT_UNREADABLE
    processes = args.processes if args.processes is not None else (1 if len(files) == 1 else None)
    progress = True if args.progress else (len(files) > 1 and sys.stderr.isatty())
    reports = replay_many(files, processes=processes, progress=progress, tool=args.tool, mapping=mapping or None,
                          run_index=args.run_index, log_every=args.log_every, total_steps=args.total_steps)
    code = max(r.exit_code for r in reports)
    if args.json:
        print(json.dumps({"exit_code": code, "runs": [r.to_dict() for r in reports]}, indent=2, default=str))
    elif args.markdown:
        parts = [f"# trainsignals replay: {len(reports)} run(s)", ""]
        if len(reports) > 1:
            parts += [summary_markdown(reports), ""]
        parts += [r.to_markdown() for r in reports]
        print("\n".join(parts))
    else:
        console = _console()
        if console.is_terminal:
            _print_rich(console, reports)
        else:
            print("\n\n".join(r.to_text() for r in reports))
            if len(reports) > 1:
                print()
                console.print(summary_table(reports))
    return code


# -- plot ---------------------------------------------------------------------------------
def _plot_cmd(args: argparse.Namespace) -> int:
    from rich.markup import escape

    err = _console(stderr=True)
    mapping = _parse_map(args.map)
    try:
        from trainsignals.io.plot import _png_path, plot_run
        from trainsignals.io.report import replay_source

        output = _png_path(args.output)
        report = replay_source(args.path, tool=args.tool, mapping=mapping or None, run_index=args.run_index,
                               log_every=args.log_every, total_steps=args.total_steps)
        plot_run(report, output=output, dpi=args.dpi)
    except ImportError as exc:
        extra = escape("'trainsignals[plot]'")
        err.print(f"[red]error:[/] plotting needs matplotlib: pip install {extra} ({escape(str(exc))})")
        return 1
    except (OSError, ValueError) as exc:
        err.print(f"[red]error:[/] {escape(str(exc))}")
        return 1
    print(f"wrote {output}")
    return 0


# -- watch --------------------------------------------------------------------------------
class TraceTail:
    """Reads a trace file incrementally while a writer appends to it.

    Each :meth:`poll` decodes the complete Arrow IPC messages written since the last poll
    (only the new bytes are read); a partial last message is left for the next poll. The
    end-of-stream marker (written when the writer closes) sets :attr:`closed`. A file that
    shrinks or is replaced (a new run overwrote it; a ``TraceWriter`` that learned its layer
    names after the first flush rewrites it) raises :class:`TraceTail.Restarted` and the
    next poll starts over.

    Args:
        path: The trace file; it may not exist yet.
    """

    class Restarted(Exception):
        """The file shrank: it was rewritten from the start."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        self.offset = 0
        self.schema: pa.Schema | None = None
        self.closed = False
        self.inode: int | None = None

    def poll(self) -> list[pa.RecordBatch]:
        """The record batches completed since the last poll (maybe none).

        Raises:
            trainsignals.io.traces.TraceFormatError: the file is not an Arrow stream of a trace.
            TraceTail.Restarted: the file shrank since the last poll.
        """
        import pyarrow as pa

        from trainsignals.io.traces import TraceFormatError

        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        size = st.st_size
        if size < self.offset or (self.inode is not None and st.st_ino != self.inode):
            self.offset, self.schema, self.closed, self.inode = 0, None, False, None
            raise TraceTail.Restarted(str(self.path))
        self.inode = st.st_ino
        if size == self.offset or self.closed:
            return []
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read(size - self.offset)
        if self.offset == 0 and len(data) >= 4 and data[:4] != b"\xff\xff\xff\xff":
            raise TraceFormatError(f"{self.path} is not an Arrow IPC stream (not a trace)")
        buf = pa.BufferReader(pa.py_buffer(data))
        reader = pa.ipc.MessageReader.open_stream(buf)
        batches: list[pa.RecordBatch] = []
        done = 0
        while True:
            try:
                msg = reader.read_next_message()
            except StopIteration:
                if buf.tell() > done:  # consumed the end-of-stream marker
                    self.closed = True
                    done = buf.tell()
                break
            except (pa.ArrowInvalid, OSError):  # a message still being written
                break
            if msg.type == "schema":
                schema = pa.ipc.read_schema(msg)
                if (schema.metadata or {}).get(b"trainsignals.format") != b"trace":
                    raise TraceFormatError(f"{self.path} is an Arrow stream but not a trace")
                self.schema = schema
            elif msg.type == "record batch":
                if self.schema is None:
                    raise TraceFormatError(f"{self.path}: record batch before the schema")
                batches.append(pa.ipc.read_record_batch(msg, self.schema))
            else:
                raise TraceFormatError(f"{self.path}: unsupported Arrow message {msg.type!r}")
            done = buf.tell()
        self.offset += done
        return batches


class _Watch:
    """The Monitor fed by a :class:`TraceTail`, and what the display needs.

    The Monitor is built as :func:`trainsignals.io.report.replay` builds it
    (:func:`~trainsignals.io.report.default_monitor`): without ``log_every`` the rows wait until
    :data:`INTERVAL_LOSSES` losses (or :data:`INTERVAL_ROWS` rows, or the end of the trace) are
    there to infer it, then are judged at once. A trace whose writer closed before it was read
    is judged whole: the Monitor, events and exit status of ``replay``.
    """

    def __init__(self, path: str, total_steps: int | None, log_every: int | None = None) -> None:
        self.path = path
        self.total_steps = total_steps
        self.log_every = log_every
        self.reset()

    def reset(self) -> None:
        self.monitor: Monitor | None = None
        self.events: list[Any] = []
        self.notes: list[str] = []
        self.pending: list[pa.Table] = []
        self.pending_losses = 0
        self.rows = 0
        self.first_step: int | None = None
        self.last_step: int | None = None
        self.metadata: dict[str, Any] = {}
        self.loss_parts: list[tuple[np.ndarray, np.ndarray]] = []
        self.step_parts: list[np.ndarray] = []

    def feed(self, table: pa.Table, complete: bool = False) -> list[Any]:
        """Judge ``table`` (the rows read since the last call); ``complete``: the trace ends with it.

        Returns:
            The new events (none while the rows wait for the logging interval).
        """
        from trainsignals.io.report import _measured
        from trainsignals.io.traces import trace_metadata, trace_signals

        if self.monitor is None and not self.rows:
            self.metadata = dict(trace_metadata(table)["metadata"])
        if table.num_rows:
            steps = table.column("step").to_numpy()
            loss = _measured(table, "loss")
            self.step_parts.append(steps)
            self.loss_parts.append(loss)
            self.rows += table.num_rows
            self.first_step = int(steps[0]) if self.first_step is None else self.first_step
            self.last_step = int(steps[-1])
        if self.monitor is not None:
            new = self.monitor.scan(**trace_signals(table)) if table.num_rows else []
            self.events.extend(new)
            return new
        if table.num_rows:
            self.pending.append(table)
            self.pending_losses += len(loss[0])
        if complete or self.log_every is not None or self.pending_losses >= INTERVAL_LOSSES \
                or sum(t.num_rows for t in self.pending) >= INTERVAL_ROWS:
            return self.finish(complete)
        return []  # too few losses yet to tell the logging interval

    def finish(self, complete: bool) -> list[Any]:
        """Build the Monitor from the rows read so far and judge them (none: nothing to do).

        Args:
            complete: Whether the trace ends here (the writer closed it): the Monitor is then
                the one ``replay`` builds for it.

        Returns:
            The events of the rows that waited.
        """
        import pyarrow as pa

        from trainsignals.io.report import default_monitor
        from trainsignals.io.traces import trace_signals

        if self.monitor is not None or not self.pending:
            return []
        table = pa.concat_tables(self.pending)
        self.pending, self.pending_losses = [], 0
        self.monitor, notes = default_monitor(table, log_every=self.log_every, total_steps=self.total_steps,
                                              complete=complete)
        self.notes = [n.replace("replayed with", "watched with", 1) for n in notes]
        new = self.monitor.scan(**trace_signals(table))
        self.events.extend(new)
        return new

    @property
    def status(self) -> str:
        if self.monitor is not None:
            return self.monitor.status
        return "warming_up" if self.rows else "waiting"

    def report(self, note: str) -> Report:
        mon = self.monitor
        steps = np.concatenate(self.step_parts) if self.step_parts else np.zeros(0, np.int64)
        loss = (np.concatenate([a for a, _ in self.loss_parts] or [steps[:0]]),
                np.concatenate([b for _, b in self.loss_parts] or [np.zeros(0)]))
        timeline = (status_timeline(self.events, steps, loss, warmup=mon.warmup, recovery=mon.recovery_steps)
                    if mon is not None and len(steps) else [])
        return Report(source=self.path, events=list(self.events), status_timeline=timeline,
                      final_status=mon.status if mon is not None else "warming_up",
                      should_stop=bool(mon and mon.should_stop), steps=self.rows, first_step=self.first_step,
                      last_step=self.last_step, metadata=self.metadata, notes=[note, *self.notes])

    def line(self, state: str) -> str:
        step = "-" if self.last_step is None else f"{self.last_step:,}"
        stop = " | STOP advised" if self.monitor is not None and self.monitor.should_stop else ""
        if self.monitor is None and self.rows:
            state = (f"{state}; reading the logging interval ({self.pending_losses}/{INTERVAL_LOSSES} losses; "
                     "--log-every skips this)")
        return (f"{self.path} | step {step} | {self.rows:,} rows | status {self.status} | "
                f"{len(self.events)} event(s){stop} | {state}")


def _live_view(w: _Watch, state: str, most: int = 8) -> RenderableType:
    from rich.console import Group
    from rich.text import Text

    style = {"diverging": "bold red", "collapsed": "red", "oscillating": "magenta", "stalled": "yellow",
             "healthy": "green"}.get(w.status, "")
    parts: list[RenderableType] = [Text(w.line(state), style=style)]
    for e in w.events[-most:]:
        parts.append(Text(f"  {e}", style="red" if e.severity == "critical" else "yellow", overflow="ellipsis",
                          no_wrap=True))
    return Group(*parts)


def _print_news(w: _Watch, new: Sequence[Any], shown_status: str, state: str) -> str:
    """Print the new events, and the status line when the status changed; returns the status shown."""
    for e in new:
        print(str(e), flush=True)
    if w.status != shown_status:
        print(w.line(state), flush=True)
    return w.status


def _watch_cmd(args: argparse.Namespace) -> int:
    import pyarrow as pa

    from trainsignals.io.traces import TraceFormatError

    tail = TraceTail(args.path)
    if tail.path.is_dir():
        print(f"error: {args.path} is a folder; watch follows one trace file (e.g. {tail.path / 'run.arrow'})",
              file=sys.stderr)
        return EXIT_UNREADABLE
    console = _console()
    live_mode = console.is_terminal
    w = _Watch(os.fspath(args.path), args.total_steps, args.log_every)
    last_growth = time.monotonic()
    state = "waiting for the file" if not tail.path.exists() else "reading"
    live: Any = None
    shown_status = ""
    if live_mode:
        from rich.live import Live

        live = Live(_live_view(w, state), console=console, refresh_per_second=4, transient=False)
        live.start()
    else:
        print(f"watching {args.path} (Ctrl-C to stop)", flush=True)
    why = ""
    try:
        while True:
            try:
                batches = tail.poll()
            except TraceTail.Restarted:
                w.reset()
                batches = []
                msg = f"{args.path} was rewritten: starting over"
                if live_mode:
                    live.console.print(msg, markup=False)
                else:
                    print(msg, flush=True)
            now = time.monotonic()
            if batches:
                last_growth = now
                assert tail.schema is not None
                new = w.feed(pa.Table.from_batches(batches, schema=tail.schema), complete=tail.closed)
                if not live_mode:
                    shown_status = _print_news(w, new, shown_status, "writer closed" if tail.closed
                                               else "writer running")
            if tail.closed:
                why = "the writer closed the trace"
                break
            if args.timeout is not None and now - last_growth > args.timeout:
                why = f"no growth for {args.timeout:g} s; stopped watching (the writer may still run)"
                break
            if live_mode:
                state = "waiting for the file" if not tail.path.exists() else "writer running"
                live.update(_live_view(w, state))
            time.sleep(args.interval)
    except KeyboardInterrupt:
        if live_mode:
            live.stop()
        print(f"\ninterrupted: {w.line('stopped')}", file=sys.stderr, flush=True)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # stdout's reader went away: run_command stops quietly
        raise
    except (TraceFormatError, OSError) as exc:  # not a trace, or a file that cannot be read
        if live_mode:
            live.stop()
        print(f"error: {error_message(exc)}", file=sys.stderr)
        return EXIT_UNREADABLE
    new = w.finish(complete=tail.closed)  # rows still waiting for the logging interval
    if live_mode:
        live.update(_live_view(w, why))
        live.stop()
    else:
        _print_news(w, new, shown_status, "stopped")
    if w.rows == 0:  # nothing to judge: say why, not "healthy"
        if not tail.path.exists():
            what = f"no such file (it did not appear within {args.timeout:g} s)"
        elif tail.closed:
            what = "the writer closed the trace without writing a step"
        else:
            what = f"no step arrived (no growth for {args.timeout:g} s; the writer may still run)"
        print(f"error: {args.path}: {what}", file=sys.stderr, flush=True)
        return EXIT_UNREADABLE
    rep = w.report(why)
    print(rep.summary(), flush=True)
    return rep.exit_code


# -- convert ------------------------------------------------------------------------------
def _parse_map(items: Sequence[str]) -> dict[str, str | None]:
    """``["loss=train/loss", "lr="]`` -> ``{"loss": "train/loss", "lr": None}`` (empty: do not import).

    Raises:
        UsageError: an item is not ``OURS=THEIRS``, or names a signal twice.
    """
    out: dict[str, str | None] = {}
    for item in items:
        ours, sep, theirs = item.partition("=")
        ours = ours.strip()
        if not sep or not ours:
            raise UsageError(f"--map takes OURS=THEIRS (e.g. loss=train/loss; lr= skips lr), got {item!r}")
        if ours in out:
            raise UsageError(f"--map names {ours!r} twice ({ours}={out[ours] or ''} and {item}); give it once")
        out[ours] = theirs.strip() or None
    return out


def _convert_cmd(args: argparse.Namespace) -> int:
    from trainsignals.io.importers import LogDamagedWarning, import_run
    from trainsignals.io.report import imported_trace_kwargs
    from trainsignals.io.traces import write_trace

    mapping = _parse_map(args.map)
    try:
        if _same_file(args.src, args.output):
            raise ValueError(f"-o {args.output} is the log being converted; write the trace to another file "
                             "(e.g. run.arrow)")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", LogDamagedWarning)  # printed below as a note
            run = import_run(args.src, tool=args.tool, mapping=mapping or None, run_index=args.run_index)
        kwargs = imported_trace_kwargs(run)
        kwargs["metadata"]["converted_from"] = os.fspath(args.src)
        n = write_trace(args.output, **kwargs)
    except (OSError, ValueError, ImportError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    sigs = [k for k in kwargs if k not in ("step", "metadata")]
    unit = run.metadata.get("step_unit", "step")
    print(f"wrote {args.output}: {n:,} {unit}s from {run.tool} ({args.src}); signals {', '.join(sigs)}")
    for note in run.notes:
        print(f"  note: {note}")
    return 0


def _same_file(src: str | os.PathLike[str], output: str | os.PathLike[str]) -> bool:
    """Whether writing ``output`` would replace ``src`` (the same path, or a link to it)."""
    out, source = Path(output), Path(src)
    try:
        if out.exists() and source.exists() and os.path.samefile(out, source):
            return True
    except OSError:
        pass
    return out.resolve() == source.resolve()
