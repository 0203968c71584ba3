"""Overfitting alarms on healthy stretches: does the run itself take the climb back?

usage: python benchmarks/probe_overfit_alarms.py [SUITE ...]   (default: heldout)

A run labelled healthy (or a faulty run before its onset) on which the default Monitor raises
``overfitting`` counts as a false alarm in ``trainsignals bench``. The label is the builder's;
the run's own validation curve says more: after the alarm, did the validation loss ever come
back to the best it had when the alarm fired (before the fault's onset, or the run's end)? A
climb the run never took back is one the user would want to hear of, whatever the label; a
meander it took back is a false alarm. This script scores nothing and tunes nothing: it reads the
alarms and the curves, and prints each case and the counts.

It also asks the question the other way round: which healthy runs end with their validation loss
at least 10 % above its best (the median of the last three validations, the bar of the builder's
healthy check), although the check let them through: the climb was not *steady* (Kendall's tau
below 0.5 over every validation after the best: a climb that levels off), or the best came fewer
than 5 validations before the end; and how many of those drew an overfitting alarm.

SUITE is anything ``trainsignals bench --suite`` takes (``heldout``, ``real``, ``dev``, a folder);
with several, a last line sums them.
"""

from __future__ import annotations

import argparse

import numpy as np

import trainsignals as ts
from trainsignals.curves import load_suite
from trainsignals.curves.labels import kendall_tau
from trainsignals.eval.bench import SUITE_ALIASES

#: a climb the run kept: its validation loss stayed at least this far above the best, relative
MARGIN = 0.01
#: the builder's healthy check: a run overfits when its last three validations sit this far above the
#: best (and the validations after it rise steadily: ``trainsignals.curves.labels.check_healthy``)
END_RISE = 0.10


def climbs_let_through(suite: str) -> tuple[int, int, int]:
    """Healthy runs of ``suite`` whose validation ends ``END_RISE`` above its best: (runs with a validation
    loss, such runs, those of them with an overfitting alarm), each printed."""
    runs = ended_up = alarmed = 0
    for c in load_suite(SUITE_ALIASES.get(suite, suite)):
        sig = c.signals()
        if str(getattr(c.kind, "value", c.kind)) != "healthy" or "val_loss" not in sig:
            continue
        runs += 1
        vs, vv = sig["val_loss"]
        b = int(np.nanargmin(vv))
        after = vv[b + 1:]
        if len(after) < 3 or np.nanmedian(vv[-3:]) < (1.0 + END_RISE) * vv[b]:
            continue
        ended_up += 1
        total = int(getattr(c, "total_steps", None) or len(c.steps))
        hit = any(e.kind is ts.Kind.OVERFITTING and e.severity != "info"
                  for e in ts.Monitor(total_steps=total).scan(**sig))
        alarmed += hit
        print(f"  {c.name:44s} healthy: last three validations {np.nanmedian(vv[-3:]) / vv[b]:.3f}x the best "
              f"(step {int(vs[b])}), {len(after)} validations after it, tau {kendall_tau(after):.2f}; "
              f"overfitting alarm: {'yes' if hit else 'no'}")
    return runs, ended_up, alarmed


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
    sums = np.zeros(6, dtype=int)
    for suite in args.suites:
        print(f"{suite}:")
        n, kept, back = audit(suite)
        print(f"{suite}: {n} overfitting alarms on healthy stretches; {kept} climbs the run kept "
              f"(validation loss >= {1 + MARGIN:g}x its best to the end of the stretch), {back} taken back, "
              f"{n - kept - back} with no validation after the alarm")
        runs, up, hit = climbs_let_through(suite)
        print(f"{suite}: {up} of {runs} healthy runs end >= {1 + END_RISE:g}x their best validation loss "
              f"(let through by the healthy check: not steady, or under 5 validations after the best); {hit} of them "
              "drew an overfitting alarm")
        sums += (n, kept, back, runs, up, hit)
    if len(args.suites) > 1:
        n, kept, back, runs, up, hit = sums.tolist()
        print(f"all: {n} alarms on healthy stretches ({kept} kept, {back} taken back, {n - kept - back} no "
              f"validation after); {up} of {runs} healthy runs end >= {1 + END_RISE:g}x their best, {hit} alarmed")


if __name__ == "__main__":
    main()
