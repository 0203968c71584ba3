"""The classroom example: gradient descent on f(w) = (w - 3)**2, watched by a Monitor.

``trainsignals playground --lr 0.95 --steps 10`` prints a live status line per step;
``--sweep`` runs a learning-rate sweep (each rate 3x the last) and reports where the edge of
stability lies. For this f the gradient is 2(w - 3), so each step multiplies ``w - 3`` by
``1 - 2*lr``: the run is stable for ``lr < 1`` and diverges above it.

A stable run falls geometrically to the minimum, and stops there: once the loss is below float
resolution at the scale it started from (``f(w0) + loss == f(w0)``: under one part in 1e16 of
49) it has :data:`converged` and the playground says so instead of feeding the Monitor a loss
that cannot fall any more (a stall) or falls by ever more decades. The playground's Monitor
leaves out the rule that reads loss and grad norm falling orders of magnitude together as a
model collapsed to one answer (``joint_collapse``: :data:`LEFT_OUT`): a quadratic has no
answers to collapse to, and its loss falls exactly so while it learns.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from trainsignals._events import Event
from trainsignals._monitor import Monitor
from trainsignals.cli.options import UsageError, positive_float, positive_int

__all__ = ["DEFAULT_LR", "LEFT_OUT", "NOT_JUDGED", "W0", "SweepRow", "Tick", "add_playground_arguments",
           "converged", "descend", "playground_monitor", "run_playground", "sweep"]

W0 = 10.0
TARGET = 3.0
#: The learning rate of ``trainsignals playground`` without ``--lr``.
DEFAULT_LR = 0.1
#: The default suite's rules the playground's Monitor leaves out: a model collapsing to one
#: answer (loss and grad norm falling orders of magnitude together) is how gradient descent on a
#: quadratic learns, and a quadratic has no answers.
LEFT_OUT = ("joint_collapse",)
#: A sweep's verdict for a run the Monitor has not judged: no event, still warming up.
NOT_JUDGED = "not judged (warming up)"


def converged(loss: float, w0: float = W0) -> bool:
    """Whether the toy's loss is below float resolution at the scale it started from.

    Example:
        >>> converged(1e-3), converged(1e-15), converged(0.0)
        (False, True, True)
    """
    start = (w0 - TARGET) ** 2
    return start + loss == start


def playground_monitor(steps: int, warmup: int = 20) -> Monitor:
    """The Monitor the playground runs: the default one, less :data:`LEFT_OUT`.

    Args:
        steps: The planned steps (``total_steps``).
        warmup: Loss values before the status leaves ``warming_up``.

    Returns:
        ``Monitor(total_steps=steps, warmup=warmup, joint_collapse=False)``.
    """
    left_out: dict[str, Any] = dict.fromkeys(LEFT_OUT, False)
    return Monitor(total_steps=steps, warmup=warmup, **left_out)


@dataclass(frozen=True)
class Tick:
    """One step of the toy run: what the Monitor saw and said.

    ``converged``: the loss reached float resolution (see :func:`converged`); it is the run's
    last step.
    """

    step: int
    w: float
    loss: float
    grad_norm: float
    status: str
    events: tuple[Event, ...]
    converged: bool = False


def descend(lr: float, steps: int = 10, w0: float = W0, monitor: Monitor | None = None) -> Iterator[Tick]:
    """Run gradient descent on (w - 3)**2 and feed loss, grad norm and lr to a Monitor.

    The run ends after ``steps`` steps, or earlier: at the step where it :func:`converged`,
    or where the loss overflowed to infinity (lr > 1: nothing is left to descend). The default
    Monitor is :func:`playground_monitor` with a warm-up of ``min(steps, 5)``.

    Example:
        >>> [round(t.loss, 1) for t in descend(0.1, steps=6)]
        [31.4, 20.1, 12.8, 8.2, 5.3, 3.4]
        >>> [round(t.loss, 1) for t in descend(1.1, steps=6)]
        [70.6, 101.6, 146.3, 210.7, 303.4, 436.9]
        >>> [(t.step, t.status) for t in descend(1.1, steps=6)][-2:]
        [(4, 'diverging'), (5, 'diverging')]
        >>> last = list(descend(0.1, steps=500))[-1]
        >>> last.step, last.converged, last.status, last.events
        (83, True, 'healthy', ())
        >>> last = list(descend(2.43, steps=5000))[-1]
        >>> last.step, last.loss, last.status
        (261, inf, 'diverging')
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    mon = monitor if monitor is not None else playground_monitor(steps, warmup=min(steps, 5))
    w = w0
    for step in range(steps):
        grad = 2.0 * (w - TARGET)
        w = w - lr * grad
        loss = (w - TARGET) * (w - TARGET)  # inf past the float range (``**`` would raise)
        events = mon.update(step=step, loss=loss, grad_norm=abs(grad), lr=lr)
        done = converged(loss, w0)
        yield Tick(step, w, loss, abs(grad), mon.status, tuple(events), done)
        if done or not math.isfinite(loss):
            return


@dataclass(frozen=True)
class SweepRow:
    """One learning rate of a sweep: where the run ended and what the Monitor said.

    ``verdict``: ``"healthy"``; the failed status or the first event's kind; or
    :data:`NOT_JUDGED` (no event while the Monitor was still warming up). ``converged_at``:
    the step at which the run converged (and stopped), or None.
    """

    lr: float
    final_loss: float
    verdict: str
    first_event: Event | None
    converged_at: int | None = None


def sweep(lrs: list[float] | None = None, steps: int = 20) -> tuple[list[SweepRow], str]:
    """Learning-rate sweep (default: 0.01 x 3**k); returns the rows and a sentence on the edge.

    Each rate runs :func:`descend` for ``steps`` steps with :func:`playground_monitor`. A run
    with no event whose Monitor is still warming up (fewer than its 20 loss values) is
    :data:`NOT_JUDGED`, never counted healthy.

    Example:
        >>> rows, edge = sweep(steps=20)
        >>> [(r.lr, r.verdict) for r in rows]
        [(0.01, 'healthy'), (0.03, 'healthy'), (0.09, 'healthy'), (0.27, 'healthy'), (0.81, 'healthy'), (2.43, 'diverging')]
        >>> edge
        'edge of stability between lr 0.81 (last healthy) and lr 2.43 (first failing); theory for (w - 3)**2: lr = 1'
        >>> rows, edge = sweep(steps=3)
        >>> {r.verdict for r in rows}
        {'not judged (warming up)'}
        >>> edge
        'no rate judged: the Monitor warms up over its first 20 loss values; sweep with --steps 20 or more'
    """
    lrs = lrs if lrs is not None else [round(0.01 * 3**k, 6) for k in range(6)]
    rows = []
    warmup = 20
    for lr in lrs:
        mon = playground_monitor(steps, warmup=warmup)
        ticks = list(descend(lr, steps, monitor=mon))
        bad = [e for e in mon.events if e.severity != "info"]
        if bad:
            verdict = mon.status if mon.status not in ("healthy", "warming_up") else bad[0].kind.value
        else:
            verdict = NOT_JUDGED if mon.status == "warming_up" else "healthy"
        rows.append(SweepRow(lr, ticks[-1].loss, verdict, bad[0] if bad else None,
                             ticks[-1].step if ticks[-1].converged else None))
    return rows, _edge(rows, steps, warmup)


def _edge(rows: list[SweepRow], steps: int, warmup: int) -> str:
    """The sweep's conclusion, drawn from the judged rows only."""
    def rates(lrs: list[float]) -> str:
        return ", ".join(f"{lr:g}" for lr in lrs)

    healthy = [r.lr for r in rows if r.verdict == "healthy"]
    failing = [r.lr for r in rows if r.verdict not in ("healthy", NOT_JUDGED)]
    unjudged = [r.lr for r in rows if r.verdict == NOT_JUDGED]
    if unjudged:  # no conclusion on the edge: say what was judged, and why the rest was not
        parts = [f"lr {rates(failing)} failed"] if failing else []
        parts += [f"lr {rates(healthy)} stayed healthy"] if healthy else []
        what = f"lr {rates(unjudged)} not judged" if parts else "no rate judged"
        why = (f"the Monitor warms up over its first {warmup} loss values; sweep with --steps {warmup} or more"
               if steps < warmup else "the Monitor was still warming up")
        return "; ".join([*parts, f"{what}: {why}"])
    if healthy and failing and max(healthy) < min(failing):
        return (f"edge of stability between lr {max(healthy):g} (last healthy) and lr {min(failing):g} "
                f"(first failing); theory for (w - 3)**2: lr = 1")
    if not failing:
        return "every rate stayed healthy: sweep higher"
    if not healthy:
        return "every rate failed: sweep lower"
    return "no clean edge: healthy and failing rates interleave"


_DESCRIPTION = (
    "Gradient descent on f(w) = (w - 3)**2 from w = 10, watched by a Monitor, with a status line per "
    "step: stable for lr < 1, diverging above. A stable run stops when it has converged (the loss "
    "below float resolution at the scale it started from, 1e-16 of 49) and says so. The Monitor is "
    "the default one less the collapse-to-one-answer rule (joint_collapse): a quadratic has no "
    "answers, and its loss falls orders of magnitude while it learns. --sweep runs lr 0.01, 0.03, "
    "... 2.43 and reports the edge of stability; a run still warming up (under 20 loss values, no "
    "event) is 'not judged', never healthy.")


def add_playground_arguments(parser: argparse.ArgumentParser) -> None:
    """Give the ``playground`` command's parser its description and options.

    ``--lr`` and ``--sweep`` exclude each other (a sweep runs its own rates): argparse refuses
    the pair with its usage error, status 2.

    Args:
        parser: The ``playground`` sub-parser; ``args.lr`` is None without ``--lr``.
    """
    parser.description = _DESCRIPTION
    which = parser.add_mutually_exclusive_group()
    which.add_argument("--lr", type=positive_float, default=None,
                       help=f"learning rate of the run (default {DEFAULT_LR}); not with --sweep")
    which.add_argument("--sweep", action="store_true",
                       help="learning-rate sweep (0.01, each rate 3x the last, to 2.43) instead of one run")
    parser.add_argument("--steps", type=positive_int, default=10,
                        help="steps (default 10); a stable run stops earlier once it converged")


def run_playground(lr: float | None = None, steps: int = 10, do_sweep: bool = False) -> int:
    """The command-line entry: a live status line per step, or the sweep table.

    Args:
        lr: The run's learning rate (None: :data:`DEFAULT_LR`).
        steps: Steps per run.
        do_sweep: Run the sweep instead of one run.

    Returns:
        The exit status, 0.

    Raises:
        UsageError: ``lr`` given with ``do_sweep`` (a sweep runs its own rates; the command's
            parser refuses the pair first).
    """
    from rich.markup import escape
    from rich.table import Table
    from rich.text import Text

    from trainsignals.io._console import make_console

    if do_sweep and lr is not None:
        raise UsageError(f"--lr {lr:g} with --sweep: a sweep runs its own rates (0.01 to 2.43); give one or the other")
    console = make_console()
    if do_sweep:
        rows, edge = sweep(steps=steps)
        table = Table(title=f"learning-rate sweep on (w - 3)**2, {steps} steps each")
        for col in ("lr", "final loss", "verdict", "first event"):
            table.add_column(col)
        for r in rows:
            colour = {"healthy": "green", NOT_JUDGED: "cyan"}.get(r.verdict, "red")
            first = "" if r.first_event is None else f"step {r.first_event.step}: {r.first_event.kind.value}"
            loss = f"{r.final_loss:.4g}" + ("" if r.converged_at is None else f" (converged, step {r.converged_at})")
            table.add_row(f"{r.lr:g}", loss, Text(r.verdict, style=colour), first)
        console.print(table)
        console.print(Text(edge))
        return 0
    colours = {"warming_up": "cyan", "healthy": "green", "stalled": "yellow", "oscillating": "magenta",
               "collapsed": "red", "diverging": "red"}
    rate = DEFAULT_LR if lr is None else lr
    for t in descend(rate, steps):
        c = colours.get(t.status, "white")
        console.print(f"step {t.step:>3}  w {t.w:>10.4g}  loss {t.loss:>10.4g}  |grad| {t.grad_norm:>9.4g}  "
                      f"[{c}]{t.status}[/]")
        for e in t.events:
            console.print(f"   [bold]{escape(str(e))}[/]")
        if t.converged:
            console.print(f"converged at step {t.step}: the loss {t.loss:.3g} is below float resolution at the "
                          f"scale it started from ({(W0 - TARGET) ** 2:g}); stopping")
    return 0
