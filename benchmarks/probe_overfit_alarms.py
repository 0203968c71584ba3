"""Overfitting alarms on healthy stretches: does the run itself take the climb back?

usage: python benchmarks/probe_overfit_alarms.py [SUITE ...]   (default: heldout)

A run labelled healthy (or a faulty run before its onset) on which the default Monitor raises
``overfitting`` counts as a false alarm in ``trainsignals bench``. The label is the builder's;
the run's own validation curve says more: after the alarm, did the validation loss ever come
back to the best it had when the alarm fired (before the fault's onset, or the run's end)? A
climb the run never took back is one the user would want to hear of, whatever the label; a
meander it took back is a false alarm. This script scores nothing and tunes nothing: it reads the
alarms and the curves, and prints each case and the counts.

SUITE is anything ``trainsignals bench --suite`` takes (``heldout``, ``real``, ``dev``, a folder).
"""

from __future__ import annotations

import argparse

import numpy as np

import trainsignals as ts
from trainsignals.curves import load_suite
from trainsignals.eval.bench import SUITE_ALIASES

#: a climb the run kept: its validation loss stayed at least this far above the best, relative
MARGIN = 0.01


def audit(suite: str) -> tuple[int, int, int]:
    """Print each overfitting alarm on a healthy stretch of ``suite``; return (alarms, kept, taken back)."""
    n = kept = back = 0
    for c in load_suite(SUITE_ALIASES.get(suite, suite)):
        kind = str(getattr(c.kind, "value", c.kind))
        sig = c.signals()
        if kind == "overfitting" or "val_loss" not in sig:
            continue
        total = int(getattr(c, "total_steps", None) or len(c.steps))
        end = int(c.onset_step) if kind != "healthy" else total
        evs = [e for e in ts.Monitor(total_steps=total).scan(**sig)
               if e.kind is ts.Kind.OVERFITTING and e.severity != "info" and e.step < end]
        if not evs:
            continue
        e = evs[0]
        vs, vv = sig["val_loss"]
        seen = vs <= e.step
        best = float(np.min(vv[seen]))
        later = vv[(vs > e.step) & (vs < end)]
        low = float(np.min(later)) / best if len(later) else float("nan")
        verdict = "no validation after it" if not len(later) else \
            "kept (never back to its best)" if low >= 1.0 + MARGIN else "taken back"
        n += 1
        kept += verdict.startswith("kept")
        back += verdict == "taken back"
        print(f"  {c.name:44s} {kind:18s} {e.detector:30s} step {e.step:5d}: val at the alarm "
              f"{float(vv[seen][-1]) / best:.3f}x its best, lowest after {low:.3f}x ({len(later)} validations): {verdict}")
    return n, kept, back


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suites", nargs="*", default=["heldout"])
    args = ap.parse_args(argv)
    for suite in args.suites:
        print(f"{suite}:")
        n, kept, back = audit(suite)
        print(f"{suite}: {n} overfitting alarms on healthy stretches; {kept} climbs the run kept "
              f"(validation loss >= {1 + MARGIN:g}x its best to the end of the stretch), {back} taken back, "
              f"{n - kept - back} with no validation after the alarm")


if __name__ == "__main__":
    main()
