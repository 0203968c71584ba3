"""RankOutliers: one data-parallel rank's local values sit far outside the others' (``bad_rank``).

Pure NumPy, so per-rank values are judged (and tested) without torch; ``DistributedWatcher`` feeds it.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

from .._events import Event, Kind, make_event
from .._validate import check_choice, check_range

__all__ = ["RankOutliers"]

_TINY = 1e-300  # the smallest scale a relative distance divides by (a zero level or spread)
#: the floor of a relative spread (of the ranks around the median, or of a pair's difference): values that
#: agree to 6 significant digits are not told apart by float32 arithmetic on the ranks
_MIN_SPREAD = 1e-6


class RankOutliers:
    """Names a rank whose local value sits far outside the other ranks' spread (``bad_rank``).

    Fed every step with one value per rank for each signal (the local loss, the local grad
    norm before the all-reduce). Scale-free: values are compared relative to their level, and
    distances are counted in units of the ranks' own usual spread, learned from the run.

    With **3 ranks or more**, at each step: ``med`` = median over ranks, ``e_r = (x_r - med) / |med|``
    and ``spread`` = median of ``|e_r|`` (a relative MAD, robust to a minority of outliers). Rank
    ``r`` is *flagged* when ``|e_r| > threshold × max(spread, typical)``, ``typical`` being the
    median spread of the last ``window`` quiet steps (so a few ranks that happen to agree closely
    do not make ordinary noise an outlier). Only a minority (fewer than half of the ranks) can be
    flagged at a step. A step where ``med`` itself jumps away from its recent values (by more than
    ``threshold`` times their median absolute deviation: every rank moved — a spike or a
    divergence of the whole job, for the Monitor to judge) is not judged.

    With **2 ranks** no rank is an outlier from one step (the median sits halfway), so the rule
    watches their relative difference ``d = (x_0 - x_1) / (|x_0| + |x_1|)``: when ``d`` departs
    from the median of its last ``window`` quiet values by more than ``threshold`` times their
    median absolute deviation, the rank that left *its own* recent range (by more than
    ``threshold`` of its own median absolute deviations) while the other stayed within its own is
    flagged, its range being its last ``warmup`` quiet values (recent, so that a trend does not
    widen it); when both or neither left theirs, nobody is (a change of the whole job, or no rank
    to blame). A rank that is bad from the first step cannot be told from a merely different one
    with 2 ranks: only a change after ``warmup`` is seen.

    Flagged for ``patience`` steps in a row → an event naming the rank; its onset is the first
    flagged step. A rank whose value is non-finite while another rank's is finite is named at
    once. Flagged and unjudged steps do not enter the spread history (``learn_on_alarm=False``);
    a rank is named again no sooner than ``window`` steps after its last event.

    Args:
        threshold: distance, in spreads, beyond which a rank is flagged (default 10: a
            Gaussian spread's MAD is 0.67 σ, so 10 MADs ≈ 6.7 σ).
        patience: consecutive flagged steps before the event.
        warmup: quiet steps of history needed before any judgement.
        window: quiet steps of history kept.
        severity: ``"warning"`` or ``"critical"``.

    Raises:
        ValueError: a bad setting (the message names it).

    Example:
        Four ranks, rank 3's data shard corrupted from step 40:

        >>> rng = np.random.default_rng(0)
        >>> det = RankOutliers()
        >>> for step in range(80):
        ...     loss = 2.0 - step / 100 + 0.05 * rng.standard_normal(4)
        ...     if step >= 40:
        ...         loss[3] += 3.0
        ...     for e in det.update(step, {"loss": loss}):
        ...         print(e.step, e.onset_step, e.signal)
        42 40 loss[rank 3]
    """

    def __init__(self, threshold: float = 10.0, *, patience: int = 3, warmup: int = 20, window: int = 100,
                 severity: Literal["warning", "critical"] = "warning") -> None:
        check_range("threshold", threshold, 0.0, None, lo_open=True)
        check_range("patience", patience, 1, None, integer=True)
        check_range("warmup", warmup, 1, None, integer=True)
        check_range("window", window, 1, None, integer=True)
        if warmup > window:
            raise ValueError(f"warmup must be <= window ({window}), got {warmup}")
        check_choice("severity", severity, ("warning", "critical"))
        self.threshold, self.patience, self.warmup, self.window = float(threshold), int(patience), int(warmup), int(window)
        self.severity = severity
        self.reset()

    def reset(self) -> None:
        """Forget every history."""
        self._spread: dict[str, deque[float]] = {}                 # signal -> quiet spreads (or pair differences)
        self._level: dict[str, deque[float]] = {}                  # signal -> quiet medians over ranks (3+ ranks)
        self._own: dict[str, list[deque[float]]] = {}              # signal -> per rank own history (2 ranks)
        self._run: dict[tuple[str, int], tuple[int, int]] = {}     # (signal, rank) -> (flagged run length, first step)
        self._reported: dict[int, int] = {}                        # rank -> step of its last event

    def update(self, step: int, signals: Mapping[str, Any], present: Mapping[str, Any] | None = None,
               ranks: Sequence[int] | None = None) -> list[Event]:
        """Judge one step; returns the events (at most one per rank).

        Args:
            step: the step.
            signals: signal name -> one value per rank (NaN: not measured on that rank).
            present: signal name -> bool per rank, to tell a measured NaN (non-finite: named) from
                an absent value; default: every non-NaN value is present, NaN is absent.
            ranks: the names of the ranks (default 0, 1, ...).
        """
        out: list[Event] = []
        for sig, raw in signals.items():
            x = np.asarray(raw, dtype=np.float64).reshape(-1)
            names = list(ranks) if ranks is not None else list(range(len(x)))
            pres = np.asarray(present[sig], dtype=bool) if present is not None and sig in present else ~np.isnan(x)
            fin, nonfin = pres & np.isfinite(x), pres & ~np.isfinite(x)
            if nonfin.any() and fin.any():
                for r in np.flatnonzero(nonfin).tolist():
                    if self._may_report(r, step):
                        self._reported[r] = step
                        out.append(make_event(
                            Kind.BAD_RANK, self.severity, step, step, "rank_outliers", f"{sig}[rank {names[r]}]", float(x[r]),
                            self.threshold, f"rank {names[r]}'s local {sig} is {x[r]} while the other ranks' are finite"))
            idx = np.flatnonzero(fin)
            flagged: dict[int, tuple[float, str]] = (
                self._judge_many(sig, x[idx], idx, names) if len(idx) >= 3 else
                self._judge_pair(sig, x, names) if len(idx) == 2 and len(x) == 2 else {})
            for r in range(len(x)):
                key: tuple[str, int] = (sig, r)
                if r in flagged:
                    n, first = self._run.get(key, (0, step))
                    n, first = self._run[key] = (n + 1, first if n else step)
                    if n >= self.patience and self._may_report(r, step) and not any(e.signal.endswith(
                            f"[rank {names[r]}]") for e in out):
                        self._reported[r] = step
                        z, msg = flagged[r]
                        out.append(make_event(Kind.BAD_RANK, self.severity, step, first, "rank_outliers",
                                              f"{sig}[rank {names[r]}]", z, self.threshold, msg))
                elif fin[r]:
                    self._run.pop(key, None)
        return out

    def _may_report(self, r: int, step: int) -> bool:
        return step - self._reported.get(r, step - self.window) >= self.window

    def _judge_many(self, sig: str, v: np.ndarray, idx: np.ndarray, names: list[int]) -> dict[int, tuple[float, str]]:
        med = float(np.median(v))
        rel = (v - med) / max(abs(med), _TINY)
        spread = float(np.median(np.abs(rel)))
        hist = self._spread.setdefault(sig, deque(maxlen=self.window))
        levels = self._level.setdefault(sig, deque(maxlen=self.window))
        warm = len(hist) >= self.warmup
        common = warm and _departure(med, levels) > self.threshold     # the whole job moved: not judged
        levels.append(med)
        if not warm:
            hist.append(spread)
        if not warm or common:
            return {}
        scale = max(spread, float(np.median(hist)), _MIN_SPREAD)
        z = np.abs(rel) / scale
        bad = np.flatnonzero(z > self.threshold)
        if len(bad) == 0 or len(bad) >= len(v) / 2:
            hist.append(spread)
            return {}
        return {int(idx[i]): (float(z[i]), (
            f"rank {names[idx[i]]}'s local {sig} {v[i]:.4g} sits {z[i]:.3g} spreads from the median of "
            f"{len(v)} ranks ({med:.4g}) for {self.patience} steps in a row (spread: the usual median "
            f"absolute deviation across ranks relative to the median, {scale:.3g})")) for i in bad.tolist()}

    def _judge_pair(self, sig: str, x: np.ndarray, names: list[int]) -> dict[int, tuple[float, str]]:
        d = float(x[0] - x[1]) / max(abs(float(x[0])) + abs(float(x[1])), _TINY)
        hist = self._spread.setdefault(sig, deque(maxlen=self.window))
        own = self._own.setdefault(sig, [deque(maxlen=self.window), deque(maxlen=self.window)])
        if len(hist) >= self.warmup:
            z = _departure(d, hist, floor=_MIN_SPREAD)
            if z > self.threshold:
                moved = [_departure(float(x[r]), list(own[r])[-self.warmup:]) for r in (0, 1)]
                r = int(np.argmax(moved))
                if moved[r] <= self.threshold or moved[1 - r] > self.threshold:
                    return {}       # both moved (the whole job) or neither left its range: nobody to blame
                return {r: (z, (
                    f"the local {sig} of ranks {names[0]} and {names[1]} moved apart ({z:.3g} times "
                    f"their relative difference's usual spread) for {self.patience} steps in a row: rank "
                    f"{names[r]} left its own recent range ({moved[r]:.3g} of its spreads), rank "
                    f"{names[1 - r]} stayed within its own ({moved[1 - r]:.3g}) (2 ranks: judged by "
                    f"each rank's own history)"))}
        hist.append(d)
        for r in (0, 1):
            own[r].append(float(x[r]))
        return {}


def _departure(x: float, hist: Sequence[float], floor: float | None = None) -> float:
    """``|x - median(hist)|`` in median absolute deviations of ``hist`` (floored at 1e-6 of its median)."""
    h = np.asarray(hist, dtype=np.float64)
    c = float(np.median(h))
    mad = float(np.median(np.abs(h - c)))
    return abs(x - c) / max(mad, _MIN_SPREAD * abs(c) if floor is None else floor, _TINY)
