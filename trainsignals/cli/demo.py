"""``trainsignals demo``: labeled failure curves through the default Monitor, with reasons."""

from __future__ import annotations

import json
import time
from typing import Any

from trainsignals._monitor import Monitor

_COLUMNS = ("curve", "label (onset)", "found", "noticed at (delay)", "status", "why, and the first fix")


def demo_rows(seed: int = 0, per_kind: int = 1) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Run the default Monitor over labeled curves: one dict per curve, and the totals.

    Args:
        seed: Seed of the generated curves.
        per_kind: Curves per failure kind (difficulty easy, medium, hard in turn).

    Returns:
        ``(rows, totals)``: per curve its ``curve`` name, ``label``, ``onset``, ``found``
        (the kind found, ``"quiet"`` or ``"missed"``), ``correct``, ``step`` and ``delay`` of
        the event shown, ``status``, ``why`` and ``fix``; totals ``hits``, ``faulty``,
        ``quiet``, ``healthy`` and ``seconds``.
    """
    from trainsignals.curves import KINDS, generate

    t0 = time.perf_counter()
    rows: list[dict[str, Any]] = []
    hits = total = quiet = healthy_n = 0
    for i, kind in enumerate(["healthy", *KINDS]):
        for j in range(per_kind):
            curve = generate(kind, seed=seed * 1000 + i * 10 + j, difficulty=("easy", "medium", "hard")[j % 3])
            mon = Monitor(total_steps=curve.total_steps)
            events = [e for e in mon.scan(**curve.signals()) if e.severity != "info"]
            if kind == "healthy":
                healthy_n += 1
                quiet += not events
                shown = events[0] if events else None
                found, correct = ("quiet", True) if not events else (events[0].kind.value, False)
            else:
                total += 1
                right = [e for e in events if e.kind.value == kind and e.step >= curve.onset_step]
                shown = right[0] if right else (events[0] if events else None)
                hits += bool(right)
                correct = bool(right)
                found = kind if right else ("missed" if not events else events[0].kind.value)
            onset = None if kind == "healthy" else int(curve.onset_step)
            rows.append({
                "curve": curve.name, "label": kind, "onset": onset, "found": found, "correct": correct,
                "step": None if shown is None else int(shown.step),
                "delay": None if shown is None or onset is None else int(shown.step) - onset,
                "status": mon.status, "why": "" if shown is None else shown.message,
                "fix": "" if shown is None else shown.fix,
            })
    totals = {"hits": hits, "faulty": total, "quiet": quiet, "healthy": healthy_n,
              "seconds": round(time.perf_counter() - t0, 3)}
    return rows, totals


def _cells(r: dict[str, Any]) -> list[str]:
    label = r["label"] if r["onset"] is None else f"{r['label']} ({r['onset']})"
    when = "" if r["step"] is None else f"step {r['step']}" + (
        f" (+{r['delay']})" if r["correct"] and r["delay"] is not None else "")
    why = "" if not r["why"] else f"{r['why']}\nfix: {r['fix']}"
    return [r["curve"], label, r["found"], when, r["status"], why]


def _markdown(rows: list[dict[str, Any]], totals: dict[str, Any]) -> str:
    lines = ["| " + " | ".join(_COLUMNS) + " |", "|" + "---|" * len(_COLUMNS)]
    for r in rows:
        lines.append("| " + " | ".join(c.replace("|", "\\|").replace("\n", "<br>") for c in _cells(r)) + " |")
    lines += ["", f"{totals['hits']}/{totals['faulty']} failures caught with the right kind; "
                  f"{totals['quiet']}/{totals['healthy']} healthy runs quiet."]
    return "\n".join(lines)


def run_demo(seed: int = 0, per_kind: int = 1, output: str = "table") -> int:
    """Generate a handful of labeled curves, run the Monitor, print what it found, when and why.

    Args:
        seed: Seed of the generated curves.
        per_kind: Curves per failure kind.
        output: ``"table"`` (rich; wide, uncoloured when stdout is not a terminal), ``"json"``
            or ``"markdown"``.

    Returns:
        The exit status (0).
    """
    from rich.table import Table

    from trainsignals.io._console import make_console

    rows, totals = demo_rows(seed, per_kind)
    if output == "json":
        print(json.dumps({"curves": rows, "totals": totals}, indent=2))
        return 0
    if output == "markdown":
        print(_markdown(rows, totals))
        return 0
    console = make_console()
    table = Table(title="trainsignals demo: labeled curves through the default Monitor", show_lines=True)
    for col in _COLUMNS:
        table.add_column(col, overflow="fold")
    for r in rows:
        cells = _cells(r)
        style = "green" if r["correct"] else ("red" if r["found"] in ("missed",) or r["label"] == "healthy"
                                               else "yellow")
        cells[2] = f"[{style}]{cells[2]}[/]"
        table.add_row(*cells)
    console.print(table)
    console.print(f"{totals['hits']}/{totals['faulty']} failures caught with the right kind; {totals['quiet']}/"
                  f"{totals['healthy']} healthy runs quiet ({totals['seconds']:.1f} s). "
                  "Full scores: [bold]trainsignals bench[/].")
    return 0
