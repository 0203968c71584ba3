"""The classroom example: gradient descent on f(w) = (w - 3)**2, watched by a Monitor.

``trainsignals playground --lr 0.95 --steps 10`` prints a live status line per step;
``--sweep`` runs a learning-rate sweep (each rate 3x the last) and reports where the edge of
stability lies. For this f the gradient is 2(w - 3), so each step multiplies ``w - 3`` by
``1 - 2*lr``: the run is stable for ``lr < 1`` and diverges above it.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from trainsignals._events import Event
from trainsignals._monitor import Monitor

W0 = 10.0
TARGET = 3.0


@dataclass(frozen=True)
class Tick:
    """One step of the toy run: what the Monitor saw and said."""

    step: int
    w: float
    loss: float
    grad_norm: float
    status: str
    events: tuple[Event, ...]


def descend(lr: float, steps: int = 10, w0: float = W0, monitor: Monitor | None = None) -> Iterator[Tick]:
    """Run gradient descent on (w - 3)**2 and feed loss, grad norm and lr to a Monitor.

    Example:
        >>> [round(t.loss, 1) for t in descend(0.1, steps=6)]
        [31.4, 20.1, 12.8, 8.2, 5.3, 3.4]
        >>> [round(t.loss, 1) for t in descend(1.1, steps=6)]
        [70.6, 101.6, 146.3, 210.7, 303.4, 436.9]
        >>> [(t.step, t.status) for t in descend(1.1, steps=6)][-2:]
        [(4, 'diverging'), (5, 'diverging')]
    """
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    if not lr > 0:
        raise ValueError(f"lr must be > 0, got {lr}")
    mon = monitor if monitor is not None else Monitor(total_steps=steps, warmup=min(steps, 5))
    w = w0
    for step in range(steps):
        grad = 2.0 * (w - TARGET)
        w = w - lr * grad
        loss = (w - TARGET) ** 2
        events = mon.update(step=step, loss=loss, grad_norm=abs(grad), lr=lr)
        yield Tick(step, w, loss, abs(grad), mon.status, tuple(events))


@dataclass(frozen=True)
class SweepRow:
    """One learning rate of a sweep: where the run ended and what the Monitor said."""

    lr: float
    final_loss: float
    verdict: str
    first_event: Event | None


def sweep(lrs: list[float] | None = None, steps: int = 20) -> tuple[list[SweepRow], str]:
    """Learning-rate sweep (default: 0.01 x 3**k); returns the rows and a sentence on the edge.

    Example:
        >>> rows, edge = sweep(steps=20)
        >>> [(r.lr, r.verdict) for r in rows]
        [(0.01, 'healthy'), (0.03, 'healthy'), (0.09, 'healthy'), (0.27, 'healthy'), (0.81, 'healthy'), (2.43, 'diverging')]
        >>> edge
        'edge of stability between lr 0.81 (last healthy) and lr 2.43 (first failing); theory for (w - 3)**2: lr = 1'
    """
    lrs = lrs if lrs is not None else [round(0.01 * 3**k, 6) for k in range(6)]
    rows = []
    for lr in lrs:
        mon = Monitor(total_steps=steps)
        ticks = list(descend(lr, steps, monitor=mon))
        bad = [e for e in mon.events if e.severity != "info"]
        verdict = "healthy" if not bad else mon.status if mon.status != "healthy" else bad[0].kind.value
        rows.append(SweepRow(lr, ticks[-1].loss, verdict, bad[0] if bad else None))
    healthy = [r.lr for r in rows if r.verdict == "healthy"]
    failing = [r.lr for r in rows if r.verdict != "healthy"]
    if healthy and failing and max(healthy) < min(failing):
        edge = (f"edge of stability between lr {max(healthy):g} (last healthy) and lr {min(failing):g} "
                f"(first failing); theory for (w - 3)**2: lr = 1")
    elif not failing:
        edge = "every rate stayed healthy: sweep higher"
    elif not healthy:
        edge = "every rate failed: sweep lower"
    else:
        edge = "no clean edge: healthy and failing rates interleave"
    return rows, edge


def run_playground(lr: float, steps: int, do_sweep: bool) -> int:
    """The command-line entry: a live status line per step, or the sweep table."""
    from rich.table import Table

    from trainsignals.io._console import make_console

    console = make_console()
    if do_sweep:
        rows, edge = sweep(steps=steps)
        table = Table(title=f"learning-rate sweep on (w - 3)**2, {steps} steps each")
        for col in ("lr", "final loss", "verdict", "first event"):
            table.add_column(col)
        for r in rows:
            colour = "green" if r.verdict == "healthy" else "red"
            first = "" if r.first_event is None else f"step {r.first_event.step}: {r.first_event.kind.value}"
            table.add_row(f"{r.lr:g}", f"{r.final_loss:.4g}", f"[{colour}]{r.verdict}[/]", first)
        console.print(table)
        console.print(edge)
        return 0
    colours = {"warming_up": "cyan", "healthy": "green", "stalled": "yellow", "oscillating": "magenta",
               "collapsed": "red", "diverging": "red"}
    for t in descend(lr, steps):
        c = colours.get(t.status, "white")
        console.print(f"step {t.step:>3}  w {t.w:>10.4g}  loss {t.loss:>10.4g}  |grad| {t.grad_norm:>9.4g}  "
                      f"[{c}]{t.status}[/]")
        for e in t.events:
            console.print(f"   [bold]{e}[/]")
    return 0
