"""``trainsignals demo``: labeled failure curves through the default Monitor, with reasons."""

from __future__ import annotations

import time

from ._monitor import Monitor


def run_demo(seed: int = 0, per_kind: int = 1) -> int:
    """Generate a handful of labeled curves, run the Monitor, print what it found, when and why."""
    from rich.console import Console
    from rich.table import Table

    from .curves import KINDS, generate

    console = Console()
    t0 = time.perf_counter()
    table = Table(title="trainsignals demo: labeled curves through the default Monitor", show_lines=True)
    for col in ("curve", "label (onset)", "found", "noticed at (delay)", "status", "why, and the first fix"):
        table.add_column(col, overflow="fold")
    hits = total = quiet = healthy_n = 0
    kinds = ["healthy", *KINDS]
    for i, kind in enumerate(kinds):
        for j in range(per_kind):
            curve = generate(kind, seed=seed * 1000 + i * 10 + j, difficulty=("easy", "medium", "hard")[j % 3])
            mon = Monitor(total_steps=curve.total_steps)
            events = [e for e in mon.scan(**curve.signals()) if e.severity != "info"]
            label = "healthy" if kind == "healthy" else f"{kind} ({curve.onset_step})"
            if kind == "healthy":
                healthy_n += 1
                quiet += not events
                found = "[green]quiet[/]" if not events else f"[red]{events[0].kind.value}[/]"
                shown = events[0] if events else None
                when = "" if not events else f"step {events[0].step}"
            else:
                total += 1
                right = [e for e in events if e.kind.value == kind and e.step >= curve.onset_step]
                shown = right[0] if right else (events[0] if events else None)
                if right:
                    hits += 1
                    found = f"[green]{kind}[/]"
                    when = f"step {right[0].step} (+{right[0].step - curve.onset_step})"
                else:
                    found = "[red]missed[/]" if not events else f"[yellow]{events[0].kind.value}[/]"
                    when = "" if shown is None else f"step {shown.step}"
            why = "" if shown is None else f"{shown.message}\nfix: {shown.fix}"
            table.add_row(curve.name, label, found, when, mon.status, why)
    console.print(table)
    dt = time.perf_counter() - t0
    console.print(f"{hits}/{total} failures caught with the right kind; {quiet}/{healthy_n} healthy runs quiet "
                  f"({dt:.1f} s). Full scores: [bold]trainsignals bench[/].")
    return 0
