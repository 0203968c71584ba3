"""The silent-collapse rules that read a classifier's answers, each alone, on labeled suites.

usage: python benchmarks/probe_collapse_rules_real.py [SUITE ...] [--synthetic 9000:9150]

For ``TopShareCollapse`` (``pred_top_share``) and ``ValMetricChance`` (``val_metric``), each run
alone on every run of each suite that records its signal: healthy runs with an event, faulty runs
with an event before their onset, and the silent-collapse runs named at or after the onset with the
median delay. SUITE is a committed suite's name (``real``, ``real_dev``, ``real_heldout``) or a
folder, such as a fresh draw of ``python -m trainsignals.curves.real_runs build --heldout --seed
5003 --out DIR``. ``--synthetic A:B`` adds fresh synthetic collapses and healthy runs of seeds A..B-1
(every difficulty), counted within the product's target window, max(50 steps, 10 % of the run).
These are the rule-alone figures of ``docs/measuring.md``; its "before" columns are the same
counts with a rule's file of the commit before the change put in its place.
"""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Callable, Iterable
from typing import Any

import trainsignals as ts
from trainsignals.curves import DIFFICULTIES, generate, load_suite
from trainsignals.eval.bench import target_window

RULES: dict[str, tuple[Callable[[], Any], str]] = {
    "TopShareCollapse": (ts.TopShareCollapse, "pred_top_share"),
    "ValMetricChance": (ts.ValMetricChance, "val_metric"),
}


def events(rule: str, curve: Any) -> list[int]:
    """The steps of the rule's events on ``curve`` (the rule alone, fed its signal and the loss)."""
    make, signal = RULES[rule]
    sig = curve.signals()
    return [e.step for e in make().scan(**{signal: sig[signal]}, loss=curve.loss, steps=curve.steps)]


def tally(rule: str, curves: Iterable[Any], window: Callable[[Any], int | None]) -> str:
    """One line: healthy alarmed, before onset, collapses named (median delay)."""
    signal = RULES[rule][1]
    healthy = alarmed = faulty = early = 0
    delays: list[int | None] = []
    for c in curves:
        if signal not in c.signals():
            continue
        steps = events(rule, c)
        if c.healthy:
            healthy += 1
            alarmed += bool(steps)
            continue
        faulty += 1
        early += any(s < c.onset_step for s in steps)
        if c.kind == "silent_collapse":
            after = [s - c.onset_step for s in steps if s >= c.onset_step]
            w = window(c)
            delays.append(after[0] if after and (w is None or after[0] <= w) else None)
    named = [d for d in delays if d is not None]
    med = f" (median delay {statistics.median(named):g})" if named else ""
    return (f"{rule:18s} healthy alarmed {alarmed}/{healthy}, before onset {early}/{faulty}, "
            f"collapses named {len(named)}/{len(delays)}{med}")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suites", nargs="*", default=["real_dev", "real", "real_heldout"])
    ap.add_argument("--synthetic", metavar="A:B", help="fresh synthetic seeds A..B-1, in the target window")
    args = ap.parse_args(argv)
    for suite in args.suites:
        curves = load_suite(suite)
        print(f"== {suite}")
        for rule in RULES:
            print("  " + tally(rule, curves, lambda c: None))
    if args.synthetic:
        a, b = (int(x) for x in args.synthetic.split(":"))
        curves = [generate(kind, s, d) for s in range(a, b) for d in DIFFICULTIES
                  for kind in ("silent_collapse", "healthy")]
        print(f"== synthetic seeds {a}..{b - 1}, within max(50 steps, 10 % of the run)")
        for rule in RULES:
            print("  " + tally(rule, curves, lambda c: target_window(c.total_steps)))


if __name__ == "__main__":
    main()
