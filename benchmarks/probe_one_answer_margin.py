"""Where does OneAnswerLossDrop's bar sit? Healthy tuning runs only.

usage: python benchmarks/probe_one_answer_margin.py [SUITE ...]   (default: real dev)

For each healthy run that measures its answers (``pred_top_share``), the largest fall, in
decades, of the smoothed log-loss (the rule's level: EWMA, weight ``alpha``) over ``span``
values, at the steps whose answers (the measured shares pooled as the rule pools them) are
``ONE_ANSWER`` or more: how close the run came to the
rule's ``orders`` bar (1.5 decades). Printed for the rule's span and for 25 and 100 values beside
it. Nothing here reads a faulty run or a label other than "healthy".
"""

from __future__ import annotations

import argparse
import math

import numpy as np

import trainsignals as ts
from trainsignals.curves import load_suite
from trainsignals.detectors._answers import ONE_ANSWER, answer_levels
from trainsignals.eval.bench import SUITE_ALIASES


def falls(curve, alpha: float, spans: list[int]) -> dict[int, float] | None:  # type: ignore[no-untyped-def]
    """The largest level fall (decades) over each span at one-answer steps; ``None`` without answers."""
    sig = curve.signals()
    p = sig.get("pred_top_share")
    if p is None:
        return None
    ps, pv = p if isinstance(p, tuple) else (np.asarray(curve.steps), np.asarray(p))
    if not len(pv):
        return None
    steps, loss = np.asarray(curve.steps), np.asarray(sig["loss"], dtype=np.float64)
    ok = np.isfinite(loss) & (loss > 0)
    st, y = steps[ok], np.log(loss[ok])
    lev = np.empty_like(y)
    m = y[0]
    for t, v in enumerate(y.tolist()):
        m = v if t == 0 else alpha * v + (1 - alpha) * m
        lev[t] = m
    at = np.searchsorted(ps, st, side="right") - 1
    pooled = answer_levels(np.asarray(pv, dtype=np.float64), -1.0, np.asarray(ps), -1)  # after each share
    share = np.where(at >= 0, pooled[np.maximum(at, 0)], np.nan)
    one = share >= ONE_ANSWER
    out = {}
    for span in spans:
        drop = (lev[np.maximum(np.arange(len(lev)) - span, 0)] - lev) / math.log(10.0)
        out[span] = float(drop[one].max()) if one.any() else 0.0
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("suites", nargs="*", default=["real", "dev"])
    args = ap.parse_args(argv)
    rule = ts.OneAnswerLossDrop()
    spans = sorted({25, rule.span, 100})
    worst: dict[int, list[tuple[float, str]]] = {s: [] for s in spans}
    for suite in args.suites:
        for c in load_suite(SUITE_ALIASES.get(suite, suite)):
            if str(getattr(c.kind, "value", c.kind)) != "healthy":
                continue
            got = falls(c, rule.alpha, spans)
            if got is not None:
                for s, v in got.items():
                    worst[s].append((v, f"{suite}/{c.name}"))
    for s in spans:
        w = sorted(worst[s], reverse=True)
        print(f"span {s:3d}: {len(w)} healthy runs with answers; largest fall at one answer "
              f"{w[0][0]:.2f} decades ({w[0][1]}); the rule's bar: {rule.orders:g}" if w else f"span {s}: no runs")


if __name__ == "__main__":
    main()
