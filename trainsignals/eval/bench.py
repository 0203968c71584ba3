"""Score detectors and baselines on labeled suites of training curves.

A *suite* is a list of labeled curves (:mod:`trainsignals.curves`): each has a failure
kind (or ``"healthy"``), the step the failure began (``onset_step``) and, where the run
blows up, the first step with a non-finite value. :func:`score` runs one detector over a
suite and measures, per failure kind, how often and how fast it names the failure; on
healthy curves, how often it cries wolf. :func:`run_bench` scores trainsignals' default
:class:`~trainsignals.Monitor` next to the baselines of :mod:`trainsignals.eval.baselines`,
and :class:`BenchResult` renders the comparison (rich table, Markdown, JSON) and checks
the project's targets.

What a detector is, for the bench:

* a *baseline*: an object with ``run(curve) -> list[Alarm]`` (and ``reset()``);
* a *factory*, built afresh for each curve: a class or callable that returns a Monitor or a
  :class:`~trainsignals.Detector`, called as ``factory(total_steps=curve.total_steps)`` when it
  takes ``total_steps`` (a parameter of that name, or ``**kwargs``), else as ``factory()``: the
  ``Monitor`` class, a ``Detector`` class such as ``TrendDivergence``, ``lambda: MyDetector(3.0)``;
* an *instance*: a Monitor or a Detector, reset before each curve.

Each curve is fed as :func:`trainsignals.testing.run_detector` feeds it: a Monitor (or any object
with ``scan`` and no ``inputs``) every signal (``scan(**curve.signals())``), a Detector only the
signals its ``inputs`` declare. A curve that has none of a Detector's inputs gives it nothing to
see: no alarm on that curve, as in a Monitor, whose detectors stay quiet on a signal not logged.

Monitor events are normalised to :class:`~trainsignals.eval.baselines.Alarm` (step, kind,
onset step); only ``warning`` and ``critical`` events are alarms, ``info`` events are not.
A baseline with a ``kinds`` attribute (the SageMaker Debugger rules) is scored on those
failure kinds only; its false alarms count on every curve.

Suites: ``"synthetic"`` (``datasets/synthetic``, regenerated when absent), ``"real"``
(``datasets/real``: small PyTorch runs, :mod:`trainsignals.curves.real_runs`), ``"dev"`` and
``"heldout"`` (``datasets/real_dev``, ``datasets/real_heldout``; the folder names work too), always
the repository's whatever the current directory holds (:data:`trainsignals.curves.SUITE_FOLDERS`),
or any other folder written by :func:`trainsignals.curves.write_suite` (``./real`` for one of your own
named like a committed suite). Each suite has its targets (:func:`targets_for`).

Definitions (``W`` is the detection window of the curve's kind, :func:`default_window`):

* *right-kind detection*: an alarm of the curve's kind at a step in ``[onset, onset + W]``;
  *any-kind detection*: an alarm of any kind in that window;
* *delay*: step of the first right-kind (any-kind) alarm in the window minus the onset;
  median and 90th percentile (linear interpolation) over the detected curves;
* *pre-onset false alarm*: a faulty curve with any alarm at a step before its onset;
* *healthy false alarm*: a healthy curve with any alarm at all;
* *non-finite curves*: faulty curves whose first non-finite value comes after the onset
  (there is something to warn about before the blow-up). *Early warning*: an alarm of a
  warning kind (``divergence`` or ``grad_explosion``) at a step in
  ``[onset, first non-finite)``; *lead*: first non-finite step minus the first such alarm
  at or after the onset (negative when the first one comes after the blow-up), median over
  the curves with one; ``_any`` variants count alarms of any kind;
* *microseconds per step*: wall time (``time.perf_counter``) spent in the detector over
  all curves, divided by the total number of steps.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from trainsignals._events import Kind
from trainsignals.cli.options import UsageError, positive_int, run_command
from trainsignals.eval.baselines import Alarm, default_baselines, sagemaker_rules
from trainsignals.kinds import default_window

__all__ = [
    "ALARM_SEVERITIES",
    "BenchResult",
    "CurveResult",
    "EARLY_WARNING_KINDS",
    "KindScore",
    "Score",
    "SUITE_ALIASES",
    "SUITE_TARGETS",
    "TARGETS",
    "add_arguments",
    "check_targets",
    "default_window",
    "events_to_alarms",
    "RuleRate",
    "rule_rates",
    "rules_markdown",
    "target_window",
    "judge",
    "main",
    "run_bench",
    "run_from_args",
    "score",
    "load_pooled",
    "targets_for",
]

#: Event severities that count as alarms.
ALARM_SEVERITIES = ("warning", "critical")
#: Alarm kinds that count as an early warning of a blow-up.
EARLY_WARNING_KINDS = ("divergence", "grad_explosion")
#: The project's targets for the default Monitor.
TARGETS: dict[str, float] = {
    "detection_rate": 0.95,  # every failure kind, right-kind, at least
    "healthy_alarm_rate": 0.02,  # healthy curves with any alarm, at most
    "pre_onset_rate": 0.02,  # faulty curves with an alarm before onset, at most
    "early_warning_rate": 0.90,  # non-finite curves flagged before the blow-up, at least
}

#: Per-suite overrides of :data:`TARGETS`. The real-run suite (``datasets/real``, small PyTorch
#: runs with injected faults) has the issue's targets: every kind >= 90 % right-kind, false
#: alarms (healthy runs, and faulty runs before their onset) <= 3 %.
SUITE_TARGETS: dict[str, dict[str, float]] = {
    "real": {"detection_rate": 0.90, "healthy_alarm_rate": 0.03, "pre_onset_rate": 0.03},
    # the held-out real runs (datasets/real_heldout): the real suite's targets, reported only;
    # no threshold may be chosen on this suite
    "heldout": {"detection_rate": 0.90, "healthy_alarm_rate": 0.03, "pre_onset_rate": 0.03},
    "real_heldout": {"detection_rate": 0.90, "healthy_alarm_rate": 0.03, "pre_onset_rate": 0.03},
    # the development real runs (datasets/real_dev): tuning data, with the real suite's targets
    "dev": {"detection_rate": 0.90, "healthy_alarm_rate": 0.03, "pre_onset_rate": 0.03},
    "real_dev": {"detection_rate": 0.90, "healthy_alarm_rate": 0.03, "pre_onset_rate": 0.03},
}

def target_window(total_steps: int) -> int:
    """The product's detection target for every kind: ``max(50, 10 % of total_steps)`` steps.

    Stricter than :func:`~trainsignals.kinds.default_window` for the slow kinds (stall,
    overfitting, silent collapse, dead units), whose default windows say when a rule can be
    certain; ``bench --target-window`` scores every kind with this one instead.

    Example:
        >>> target_window(300), target_window(2000)
        (50, 200)
    """
    return max(50, int(0.10 * total_steps))


#: Suite names that stand for another folder of ``datasets``: ``heldout`` is ``datasets/real_heldout``,
#: ``dev`` is ``datasets/real_dev``.
SUITE_ALIASES: dict[str, str] = {"heldout": "real_heldout", "dev": "real_dev"}

_KIND_ORDER = {k.value: i for i, k in enumerate(Kind)}

WindowSpec = int | Callable[[int], int]


# --------------------------------------------------------------------------- windows


def _window(kind: str, total_steps: int, windows: Mapping[str, WindowSpec] | None) -> int:
    spec = None if windows is None else windows.get(kind)
    if spec is None:
        return default_window(kind, total_steps)
    if callable(spec):
        return int(spec(total_steps))
    return int(spec)


# --------------------------------------------------------------------------- running detectors


def events_to_alarms(events: Iterable[Any]) -> list[Alarm]:
    """Normalise Monitor events to alarms: warning and critical events only, in step order."""
    alarms = [
        Alarm(int(e.step), str(getattr(e.kind, "value", e.kind)), int(e.onset_step), getattr(e, "detector", None))
        for e in events
        if e.severity in ALARM_SEVERITIES
    ]
    alarms.sort(key=lambda a: a.step)
    return alarms


def _detector_name(detector: Any) -> str:
    name = getattr(detector, "name", None)
    if isinstance(name, str) and name:
        return name
    return str(getattr(detector, "__name__", type(detector).__name__))


def _build(factory: Callable[..., Any], total_steps: int) -> Any:
    """``factory(total_steps=total_steps)`` when it takes ``total_steps``, else ``factory()``."""
    import inspect

    try:
        params = inspect.signature(factory).parameters
    except (TypeError, ValueError):  # no signature to read (a builtin): the Monitor factory's call
        return factory(total_steps=total_steps)
    takes = any(p.kind is p.VAR_KEYWORD or (p.name == "total_steps" and p.kind is not p.POSITIONAL_ONLY)
                for p in params.values())
    return factory(total_steps=total_steps) if takes else factory()


def _blind(detector: Any, curve: Any) -> bool:
    """Whether ``curve`` has none of the signals a Detector's ``inputs`` declare."""
    inputs = getattr(detector, "inputs", None)
    if inputs is None:
        return False
    signals = curve.signals()
    return not any(signals.get(i.name) is not None for i in inputs)


def _runner(detector: Any) -> Callable[[Any], list[Alarm]]:
    """A function ``curve -> alarms`` for a baseline, an instance or a factory (see the module docstring)."""
    from trainsignals.testing import run_detector

    def alarms(built: Any, curve: Any) -> list[Alarm]:
        if _blind(built, curve):
            return []
        return events_to_alarms(run_detector(built, curve))

    if isinstance(detector, type) or not (hasattr(detector, "run") or hasattr(detector, "scan")):
        if not callable(detector):
            raise TypeError(
                "detector must be a baseline (run), a Monitor or Detector (scan), or a class or factory that "
                f"builds one, got {type(detector).__name__}"
            )

        def run_factory(curve: Any) -> list[Alarm]:
            built = _build(detector, _total_steps(curve))
            if not callable(getattr(built, "scan", None)):
                raise TypeError(f"detector {_detector_name(detector)} built {type(built).__name__}, which has no "
                                "scan(): a factory must return a Monitor or a Detector")
            return alarms(built, curve)

        return run_factory
    if hasattr(detector, "run"):

        def run_baseline(curve: Any) -> list[Alarm]:
            detector.reset()
            return sorted(detector.run(curve), key=lambda a: a.step)

        return run_baseline

    def run_instance(curve: Any) -> list[Alarm]:  # run_detector resets it first
        return alarms(detector, curve)

    return run_instance


def _n_steps(curve: Any) -> int:
    steps = getattr(curve, "steps", None)
    return int(len(steps)) if steps is not None else _total_steps(curve)


def _total_steps(curve: Any) -> int:
    total = getattr(curve, "total_steps", None)
    if total is None:
        return int(len(curve.steps))
    return int(total)


# --------------------------------------------------------------------------- per-curve verdicts


@dataclass(frozen=True, slots=True)
class CurveResult:
    """What one detector did on one labeled curve.

    Attributes:
        name: Curve name.
        kind: Labeled kind (``"healthy"`` for a healthy curve).
        difficulty: Labeled difficulty.
        onset_step: Labeled onset (-1 for healthy).
        first_nonfinite_step: First step with a non-finite value (-1 if none).
        window: Detection window used (steps after the onset).
        alarms: Every alarm raised, in step order.
        detect_step: First right-kind alarm in the window, or ``None``.
        detect_any_step: First alarm of any kind in the window, or ``None``.
        onset_estimate: The onset the detecting alarm claimed, where it claims one.
        pre_onset: A faulty curve with an alarm before the onset (healthy: ``False``).
        early_warning: A warning-kind alarm in ``[onset, first non-finite)``; ``None``
            when the curve is not a non-finite curve (see the module docstring).
        early_warning_any: Same, alarms of any kind.
        lead: First non-finite step minus the first warning-kind alarm at or after the
            onset; ``None`` when not a non-finite curve or no such alarm.
        lead_any: Same, alarms of any kind.
    """

    name: str
    kind: str
    difficulty: str
    onset_step: int
    first_nonfinite_step: int
    window: int
    alarms: tuple[Alarm, ...]
    detect_step: int | None
    detect_any_step: int | None
    onset_estimate: int | None
    pre_onset: bool
    early_warning: bool | None
    early_warning_any: bool | None
    lead: int | None
    lead_any: int | None

    @property
    def healthy(self) -> bool:
        """Whether the curve is labeled healthy."""
        return self.kind == "healthy"

    @property
    def detected(self) -> bool:
        """Right-kind detection within the window."""
        return self.detect_step is not None

    @property
    def any_alarm(self) -> bool:
        """Whether the detector raised any alarm on the curve."""
        return bool(self.alarms)

    @property
    def named_first(self) -> bool:
        """Whether the first alarm in the window (after the onset) names the curve's kind (another
        kind at the same step does not count against it).
        """
        return self.detect_step is not None and self.detect_step == self.detect_any_step

    @property
    def injected_healthy(self) -> bool:
        """A healthy label given to a run whose fault made no visible difference to its twin.

        The held-out builder relabels such a run healthy and names it ``...-nofault-<kind>``
        (:mod:`trainsignals.curves.families`): the fault's cause (a cut learning rate, a frozen
        optimizer) is in its signals even where its loss does not show it.
        """
        from trainsignals.curves.families import injected

        return self.healthy and injected(self.name)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (alarms as ``[step, kind, onset, detector]``: the rule that raised
        it, ``None`` for a baseline's).
        """
        return {
            "name": self.name,
            "kind": self.kind,
            "difficulty": self.difficulty,
            "onset_step": self.onset_step,
            "first_nonfinite_step": self.first_nonfinite_step,
            "window": self.window,
            "detect_step": self.detect_step,
            "detect_any_step": self.detect_any_step,
            "onset_estimate": self.onset_estimate,
            "pre_onset": self.pre_onset,
            "early_warning": self.early_warning,
            "early_warning_any": self.early_warning_any,
            "lead": self.lead,
            "lead_any": self.lead_any,
            "alarms": [[a.step, a.kind, a.onset_step, a.detector] for a in self.alarms],
        }


def judge(curve: Any, alarms: Sequence[Alarm], window: int) -> CurveResult:
    """Score one detector's alarms on one labeled curve (see the module docstring)."""
    kind = str(getattr(curve.kind, "value", curve.kind))
    onset = int(getattr(curve, "onset_step", -1))
    nonfinite = int(getattr(curve, "first_nonfinite_step", -1))
    alarms = tuple(sorted(alarms, key=lambda a: a.step))
    healthy = kind == "healthy"
    detect = detect_any = onset_est = None
    pre_onset = False
    if not healthy:
        hi = onset + window
        for a in alarms:
            if a.step < onset:
                pre_onset = True
                continue
            if a.step > hi:
                break
            if detect_any is None:
                detect_any = a.step
            if detect is None and a.kind == kind:
                detect = a.step
                onset_est = a.onset_step
    ew = ew_any = None
    lead = lead_any = None
    if not healthy and nonfinite > onset >= 0:
        after = [a for a in alarms if a.step >= onset]
        warn = [a for a in after if a.kind in EARLY_WARNING_KINDS]
        if warn:
            lead = nonfinite - warn[0].step
        if after:
            lead_any = nonfinite - after[0].step
        ew = lead is not None and lead > 0
        ew_any = lead_any is not None and lead_any > 0
    return CurveResult(
        name=str(getattr(curve, "name", "")),
        kind=kind,
        difficulty=str(getattr(curve, "difficulty", "")),
        onset_step=onset,
        first_nonfinite_step=nonfinite,
        window=int(window),
        alarms=alarms,
        detect_step=detect,
        detect_any_step=detect_any,
        onset_estimate=onset_est,
        pre_onset=pre_onset,
        early_warning=ew,
        early_warning_any=ew_any,
        lead=lead,
        lead_any=lead_any,
    )


# --------------------------------------------------------------------------- aggregate scores


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


def _median(xs: Sequence[float]) -> float | None:
    return float(np.median(xs)) if len(xs) else None


def _p90(xs: Sequence[float]) -> float | None:
    return float(np.percentile(xs, 90)) if len(xs) else None


@dataclass(frozen=True, slots=True)
class KindScore:
    """Detection of one failure kind over the curves labeled with it.

    Rates are ``None`` when there is nothing to divide by; delays are ``None`` when
    nothing was detected.
    """

    kind: str
    n: int
    detected: int
    detected_any: int
    rate: float | None
    rate_any: float | None
    median_delay: float | None
    p90_delay: float | None
    median_delay_any: float | None
    pre_onset: int
    pre_onset_rate: float | None
    median_onset_error: float | None
    by_difficulty: dict[str, float | None]

    @classmethod
    def from_results(cls, kind: str, results: Sequence[CurveResult]) -> KindScore:
        """Aggregate the verdicts of the curves of one kind."""
        n = len(results)
        det = [r for r in results if r.detect_step is not None]
        det_any = [r for r in results if r.detect_any_step is not None]
        delays = [r.detect_step - r.onset_step for r in det if r.detect_step is not None]
        delays_any = [r.detect_any_step - r.onset_step for r in det_any if r.detect_any_step is not None]
        errors = [abs(r.onset_estimate - r.onset_step) for r in det if r.onset_estimate is not None]
        pre = sum(r.pre_onset for r in results)
        by_diff: dict[str, list[int]] = {}
        for r in results:
            d = by_diff.setdefault(r.difficulty, [0, 0])
            d[0] += 1
            d[1] += r.detect_step is not None
        return cls(
            kind=kind,
            n=n,
            detected=len(det),
            detected_any=len(det_any),
            rate=_rate(len(det), n),
            rate_any=_rate(len(det_any), n),
            median_delay=_median(delays),
            p90_delay=_p90(delays),
            median_delay_any=_median(delays_any),
            pre_onset=pre,
            pre_onset_rate=_rate(pre, n),
            median_onset_error=_median(errors),
            by_difficulty={d: _rate(k, m) for d, (m, k) in sorted(by_diff.items())},
        )

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict."""
        return {
            "kind": self.kind,
            "n": self.n,
            "detected": self.detected,
            "detected_any": self.detected_any,
            "rate": self.rate,
            "rate_any": self.rate_any,
            "median_delay": self.median_delay,
            "p90_delay": self.p90_delay,
            "median_delay_any": self.median_delay_any,
            "pre_onset": self.pre_onset,
            "pre_onset_rate": self.pre_onset_rate,
            "median_onset_error": self.median_onset_error,
            "by_difficulty": dict(self.by_difficulty),
        }


@dataclass(frozen=True)
class Score:
    """One detector scored on one suite.

    Attributes:
        detector: The detector's name.
        kinds: Per failure kind, in :class:`~trainsignals.Kind` order.
        n_healthy: Healthy curves.
        healthy_alarms: Healthy curves with any alarm.
        healthy_alarm_rate: Their fraction.
        healthy_alarm_kinds: How many healthy curves saw each alarm kind.
        n_faulty: Faulty curves.
        pre_onset: Faulty curves with an alarm before the onset.
        pre_onset_rate: Their fraction.
        n_alarmed: Faulty curves (of the kinds scored) with an alarm in the window.
        named_first: Of those, the curves whose first alarm there names their kind.
        named_first_rate: Their fraction of ``n_alarmed``.
        n_nonfinite: Non-finite curves (blow-up after the onset).
        early_warning: Of those, flagged by a warning-kind alarm before the blow-up.
        early_warning_rate: Their fraction.
        early_warning_any: Flagged by an alarm of any kind before the blow-up.
        early_warning_any_rate: Their fraction.
        median_lead: Median lead (steps) of the first warning-kind alarm.
        median_lead_any: Median lead of the first alarm of any kind.
        steps: Steps scanned, over all curves.
        seconds: Wall time spent in the detector.
        us_per_step: Microseconds per step.
        curves: Every curve's verdict.
        scope: The failure kinds the detector was scored on (a baseline's ``kinds``), or
            ``None`` for every kind.
    """

    detector: str
    kinds: dict[str, KindScore]
    n_healthy: int
    healthy_alarms: int
    healthy_alarm_rate: float | None
    healthy_alarm_kinds: dict[str, int]
    n_faulty: int
    pre_onset: int
    pre_onset_rate: float | None
    n_alarmed: int
    named_first: int
    named_first_rate: float | None
    n_nonfinite: int
    early_warning: int
    early_warning_rate: float | None
    early_warning_any: int
    early_warning_any_rate: float | None
    median_lead: float | None
    median_lead_any: float | None
    steps: int
    seconds: float
    us_per_step: float
    curves: list[CurveResult] = field(repr=False)
    scope: tuple[str, ...] | None = None

    @classmethod
    def from_results(
        cls,
        detector: str,
        results: Sequence[CurveResult],
        steps: int,
        seconds: float,
        scope: Iterable[str] | None = None,
    ) -> Score:
        """Aggregate per-curve verdicts.

        ``scope``: the failure kinds the detector can name (a baseline's ``kinds``); when given,
        only those kinds get a :class:`KindScore` (the others are not its business). Healthy
        and pre-onset false alarms count over every curve either way.
        """
        healthy = [r for r in results if r.healthy]
        faulty = [r for r in results if not r.healthy]
        in_scope = None if scope is None else set(scope)
        by_kind: dict[str, list[CurveResult]] = {}
        for r in faulty:
            if in_scope is None or r.kind in in_scope:
                by_kind.setdefault(r.kind, []).append(r)
        order = sorted(by_kind, key=lambda k: (_KIND_ORDER.get(k, len(_KIND_ORDER)), k))
        kinds = {k: KindScore.from_results(k, by_kind[k]) for k in order}
        h_alarms = [r for r in healthy if r.any_alarm]
        h_kinds: Counter[str] = Counter()
        for r in h_alarms:
            h_kinds.update({a.kind for a in r.alarms})
        pre = sum(r.pre_onset for r in faulty)
        alarmed = [r for rs in by_kind.values() for r in rs if r.detect_any_step is not None]
        first = sum(r.named_first for r in alarmed)
        nf = [r for r in faulty if r.early_warning is not None]
        ew = sum(bool(r.early_warning) for r in nf)
        ew_any = sum(bool(r.early_warning_any) for r in nf)
        return cls(
            detector=detector,
            kinds=kinds,
            n_healthy=len(healthy),
            healthy_alarms=len(h_alarms),
            healthy_alarm_rate=_rate(len(h_alarms), len(healthy)),
            healthy_alarm_kinds=dict(sorted(h_kinds.items())),
            n_faulty=len(faulty),
            pre_onset=pre,
            pre_onset_rate=_rate(pre, len(faulty)),
            n_alarmed=len(alarmed),
            named_first=first,
            named_first_rate=_rate(first, len(alarmed)),
            n_nonfinite=len(nf),
            early_warning=ew,
            early_warning_rate=_rate(ew, len(nf)),
            early_warning_any=ew_any,
            early_warning_any_rate=_rate(ew_any, len(nf)),
            median_lead=_median([r.lead for r in nf if r.lead is not None]),
            median_lead_any=_median([r.lead_any for r in nf if r.lead_any is not None]),
            steps=int(steps),
            seconds=float(seconds),
            us_per_step=1e6 * seconds / steps if steps else 0.0,
            curves=list(results),
            scope=None if in_scope is None else tuple(sorted(in_scope, key=lambda k: (_KIND_ORDER.get(k, 99), k))),
        )

    def misses(self, kind: str) -> list[CurveResult]:
        """The curves of ``kind`` without a right-kind detection (for tuning)."""
        return [r for r in self.curves if r.kind == kind and r.detect_step is None]

    def false_alarms(self) -> list[CurveResult]:
        """Healthy curves with an alarm and faulty curves with one before the onset."""
        return [r for r in self.curves if (r.healthy and r.any_alarm) or r.pre_onset]

    def to_dict(self, per_curve: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict; ``per_curve`` adds every curve's verdict."""
        d: dict[str, Any] = {
            "detector": self.detector,
            "kinds": {k: s.to_dict() for k, s in self.kinds.items()},
            "n_healthy": self.n_healthy,
            "healthy_alarms": self.healthy_alarms,
            "healthy_alarm_rate": self.healthy_alarm_rate,
            "healthy_alarm_kinds": dict(self.healthy_alarm_kinds),
            "n_faulty": self.n_faulty,
            "pre_onset": self.pre_onset,
            "pre_onset_rate": self.pre_onset_rate,
            "n_alarmed": self.n_alarmed,
            "named_first": self.named_first,
            "named_first_rate": self.named_first_rate,
            "n_nonfinite": self.n_nonfinite,
            "early_warning": self.early_warning,
            "early_warning_rate": self.early_warning_rate,
            "early_warning_any": self.early_warning_any,
            "early_warning_any_rate": self.early_warning_any_rate,
            "median_lead": self.median_lead,
            "median_lead_any": self.median_lead_any,
            "steps": self.steps,
            "seconds": self.seconds,
            "us_per_step": self.us_per_step,
            "scope": None if self.scope is None else list(self.scope),
        }
        if per_curve:
            d["curves"] = [r.to_dict() for r in self.curves]
        return d


def score(
    detector: Any,
    curves: Iterable[Any],
    windows: Mapping[str, WindowSpec] | None = None,
    name: str | None = None,
) -> Score:
    """Run one detector over labeled curves and score it.

    Args:
        detector: A baseline (``run``); a Monitor or :class:`~trainsignals.Detector` instance
            (reset before each curve); or a class or factory that builds one per curve, called
            as ``factory(total_steps=curve.total_steps)`` when it takes ``total_steps``, else as
            ``factory()``. A Detector is fed only the signals its ``inputs`` declare (see the
            module docstring).
        curves: Labeled curves (:class:`trainsignals.curves.Curve` or look-alikes with
            ``kind``, ``onset_step``, ``first_nonfinite_step``, ``total_steps``, ``steps``,
            and ``signals()`` for Monitors or the attributes a baseline reads).
        windows: Per-kind detection windows overriding :func:`default_window`: an int
            (steps) or a function of ``total_steps``.
        name: Display name; defaults to the detector's ``name`` (or class name).

    A detector with a ``kinds`` attribute (a tuple of kind names: the SageMaker rules) is
    scored on those failure kinds only (see :meth:`Score.from_results`).

    Returns:
        The :class:`Score`.
    """
    run = _runner(detector)
    results: list[CurveResult] = []
    seconds = 0.0
    steps = 0
    for curve in curves:
        t0 = time.perf_counter()
        alarms = run(curve)
        seconds += time.perf_counter() - t0
        steps += _n_steps(curve)
        kind = str(getattr(curve.kind, "value", curve.kind))
        results.append(judge(curve, alarms, _window(kind, _total_steps(curve), windows)))
    scope = getattr(detector, "kinds", None)
    if scope is not None and not isinstance(scope, (tuple, list, frozenset, set)):
        scope = None
    return Score.from_results(name or _detector_name(detector), results, steps, seconds, scope=scope)


# --------------------------------------------------------------------------- targets


def targets_for(suite: str) -> dict[str, float]:
    """The targets of a suite: :data:`TARGETS` with the suite's :data:`SUITE_TARGETS` overrides.

    A suite given as a path is known by its folder's name (``datasets/real`` -> ``"real"``), or by
    its manifest when the name is not a suite's: a folder built with ``build --heldout`` (or
    ``--dev``) has the held-out (development) targets, a fresh held-out draw among them; a pool of
    suites (``"a + b"``, as ``trainsignals bench --suite a --suite b`` names it) has the targets of
    its first suite.

    Example:
        >>> targets_for("real")["detection_rate"], targets_for("synthetic")["detection_rate"]
        (0.9, 0.95)
    """
    from pathlib import PurePath

    suite = suite.split(" + ")[0]
    t = dict(TARGETS)
    own = SUITE_TARGETS.get(suite, SUITE_TARGETS.get(PurePath(suite).name))
    if own is None:
        try:
            manifest = json.loads((Path(suite) / "manifest.json").read_text())
        except (OSError, ValueError):
            manifest = {}
        own = SUITE_TARGETS["heldout"] if manifest.get("heldout") is True else \
            SUITE_TARGETS["dev"] if manifest.get("dev") is True else {}
    t.update(own)
    return t


def check_targets(
    main: Score, baselines: Sequence[Score] = (), targets: Mapping[str, float] | None = None
) -> list[str]:
    """The targets ``main`` misses, one sentence each (empty: all met).

    1. every failure kind in the suite: right-kind detection >= 95 %;
    2. healthy curves with any alarm <= 2 %;
    3. faulty curves with an alarm before the onset <= 2 %;
    4. non-finite curves flagged by a ``divergence`` or ``grad_explosion`` alarm before
       the first non-finite value >= 90 % (skipped when the suite has none);
    5. right-kind detection strictly above every baseline on every kind (a baseline that
       does not report a kind counts as 0; a baseline scored on some kinds only, a
       ``scope``, is compared on those). Where both reach 100 % nobody can do better:
       the target is then met when our median delay is no longer than the baseline's.

    Args:
        main: The score of the detector under test.
        baselines: Scores of the baselines on the same suite.
        targets: Overrides of :data:`TARGETS`.
    """
    t = dict(TARGETS)
    if targets:
        t.update(targets)
    unmet: list[str] = []
    if not main.kinds:
        unmet.append("the suite has no faulty curves: nothing to detect")
    for kind, ks in main.kinds.items():
        if ks.rate is None or ks.rate < t["detection_rate"]:
            unmet.append(
                f"{kind}: right-kind detection {_pct(ks.rate)} ({ks.detected}/{ks.n}) "
                f"below {_pct(t['detection_rate'])}"
            )
    if main.healthy_alarm_rate is not None and main.healthy_alarm_rate > t["healthy_alarm_rate"]:
        unmet.append(
            f"healthy curves with an alarm {_pct(main.healthy_alarm_rate)} "
            f"({main.healthy_alarms}/{main.n_healthy}) above {_pct(t['healthy_alarm_rate'])}"
            f" (kinds: {', '.join(f'{k}={v}' for k, v in main.healthy_alarm_kinds.items())})"
        )
    if main.pre_onset_rate is not None and main.pre_onset_rate > t["pre_onset_rate"]:
        unmet.append(
            f"faulty curves with an alarm before onset {_pct(main.pre_onset_rate)} "
            f"({main.pre_onset}/{main.n_faulty}) above {_pct(t['pre_onset_rate'])}"
        )
    if main.early_warning_rate is not None and main.early_warning_rate < t["early_warning_rate"]:
        unmet.append(
            f"non-finite curves flagged (divergence/grad_explosion) before the first NaN/Inf "
            f"{_pct(main.early_warning_rate)} ({main.early_warning}/{main.n_nonfinite}) "
            f"below {_pct(t['early_warning_rate'])}"
        )
    for b in baselines:
        for kind, ks in main.kinds.items():
            if b.scope is not None and kind not in b.scope:
                continue
            ours = ks.rate or 0.0
            other = b.kinds.get(kind)
            theirs = (other.rate or 0.0) if other is not None else 0.0
            if ours > theirs:
                continue
            if ours == theirs == 1.0 and other is not None:
                mine_d, their_d = ks.median_delay, other.median_delay
                if mine_d is not None and their_d is not None and mine_d <= their_d:
                    continue
                unmet.append(
                    f"{kind}: both {main.detector} and {b.detector} detect 100 %, "
                    f"and {b.detector} is faster (median delay {_num(their_d)} vs {_num(mine_d)})"
                )
                continue
            unmet.append(
                f"{kind}: right-kind detection {_pct(ks.rate)} not above {b.detector}'s {_pct(theirs)}"
            )
    return unmet


# --------------------------------------------------------------------------- formatting


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def _pct0(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _num(x: float | None) -> str:
    if x is None:
        return "-"
    return f"{x:.0f}" if float(x).is_integer() or abs(x) >= 10 else f"{x:.1f}"


def _us(x: float) -> str:
    return f"{x:.2f}" if x < 10 else f"{x:.0f}"


LEGEND = (
    "kind rows: right-kind detection / any-kind detection / median delay (p90 delay) in steps; "
    "non-finite rows: curves that blow up after the onset"
)


@dataclass(frozen=True)
class BenchResult:
    """Scores of several detectors on one suite.

    Attributes:
        suite: Suite name.
        n_curves: Curves in the suite.
        scores: Per detector name, in the order run (the main detector first).
        main: Name of the detector the targets apply to.
    """

    suite: str
    n_curves: int
    scores: dict[str, Score]
    main: str = "trainsignals"

    @property
    def kinds(self) -> list[str]:
        """Failure kinds present in the suite, in :class:`~trainsignals.Kind` order."""
        seen: dict[str, None] = {}
        for s in self.scores.values():
            for k in s.kinds:
                seen.setdefault(k, None)
        return sorted(seen, key=lambda k: (_KIND_ORDER.get(k, len(_KIND_ORDER)), k))

    def rows(self) -> list[tuple[str, list[str]]]:
        """The comparison as ``(label, cells)`` rows of plain strings, one cell per detector."""
        scores = list(self.scores.values())
        any_score = scores[0] if scores else None
        out: list[tuple[str, list[str]]] = []
        for kind in self.kinds:
            n = max((s.kinds[kind].n for s in scores if kind in s.kinds), default=0)
            cells = []
            for s in scores:
                ks = s.kinds.get(kind)
                if ks is None:
                    cells.append("-")
                else:
                    delay = _num(ks.median_delay)
                    if ks.p90_delay is not None:
                        delay += f" ({_num(ks.p90_delay)})"
                    cells.append(f"{_pct0(ks.rate)} / {_pct0(ks.rate_any)} / {delay}")
            out.append((f"{kind} (n={n})", cells))
        if any_score is None:
            return out
        out.append(
            (
                f"healthy: any alarm (n={any_score.n_healthy})",
                [_pct(s.healthy_alarm_rate) for s in scores],
            )
        )
        injected = [r for r in any_score.curves if r.injected_healthy]
        if injected:  # the healthy figure split: never injected, and injected without visible effect
            for label, pick in (("never injected", False), ("a fault injected, no visible effect", True)):
                n = sum(r.injected_healthy == pick for r in any_score.curves if r.healthy)
                out.append((f"healthy, {label}: any alarm (n={n})", [_pct(_rate(
                    sum(r.any_alarm for r in s.curves if r.healthy and r.injected_healthy == pick), n))
                    for s in scores]))
        out.append(
            (
                f"faulty: alarm before onset (n={any_score.n_faulty})",
                [_pct(s.pre_onset_rate) for s in scores],
            )
        )
        out.append(
            (
                "faulty, alarmed in the window: the first alarm names the kind",
                [f"{_pct(s.named_first_rate)} ({s.named_first}/{s.n_alarmed})" for s in scores],
            )
        )
        out.append(
            (
                f"non-finite: warned before blow-up, div/grad / any (n={any_score.n_nonfinite})",
                [f"{_pct0(s.early_warning_rate)} / {_pct0(s.early_warning_any_rate)}" for s in scores],
            )
        )
        out.append(
            (
                "non-finite: median lead (steps), div/grad / any",
                [f"{_num(s.median_lead)} / {_num(s.median_lead_any)}" for s in scores],
            )
        )
        out.append(("µs per step", [_us(s.us_per_step) for s in scores]))
        return out

    def table(self) -> Any:
        """The comparison as a :class:`rich.table.Table`."""
        from rich.table import Table

        table = Table(
            title=f"trainsignals bench: suite {self.suite!r}, {self.n_curves} curves",
            caption=LEGEND,
        )
        table.add_column("", style="bold")
        for name in self.scores:
            table.add_column(name, justify="right", style="cyan" if name == self.main else None)
        for label, cells in self.rows():
            table.add_row(label, *cells)
        return table

    def family_scores(self, detector: str | None = None) -> dict[str, Score]:
        """One detector's :class:`Score` per family (the curves' ``difficulty``), each family scored
        alone, families in name order (no timing: ``steps`` and ``seconds`` are 0).

        Raises:
            KeyError: ``detector`` (default: the main one) was not run.
        """
        s = self.scores[self.main if detector is None else detector]
        by_family: dict[str, list[CurveResult]] = {}
        for r in s.curves:
            by_family.setdefault(r.difficulty, []).append(r)
        return {fam: Score.from_results(s.detector, by_family[fam], 0, 0.0, scope=s.scope) for fam in sorted(by_family)}

    def family_dict(self, detector: str | None = None) -> dict[str, dict[str, Any]]:
        """:meth:`family_scores` as JSON-serialisable dicts (as :meth:`Score.to_dict`, without timing)."""
        timing = ("steps", "seconds", "us_per_step")
        return {fam: {k: v for k, v in sub.to_dict().items() if k not in timing}
                for fam, sub in self.family_scores(detector).items()}

    def family_rows(self, detector: str | None = None) -> tuple[list[str], list[tuple[str, list[str]]]]:
        """One detector's figures per family (the curves' ``difficulty``), each family scored
        alone (a leave-one-family-out view: the figures of the held-out family only).

        Returns:
            ``(header, rows)``: per family, the curves, right-kind / any-kind detection of
            its faulty curves (``k/n``), the healthy curves with any alarm and the faulty
            curves with an alarm before the onset; then a row per family and kind.
        """
        header = ["curves", "right kind", "any kind", "healthy: any alarm", "faulty: alarm before onset"]
        rows: list[tuple[str, list[str]]] = []
        for fam, sub in self.family_scores(detector).items():
            rs = sub.curves
            faulty = [r for r in rs if not r.healthy and (sub.scope is None or r.kind in sub.scope)]
            det = sum(r.detected for r in faulty)
            det_any = sum(r.detect_any_step is not None for r in faulty)
            rows.append((fam, [str(len(rs)), f"{det}/{len(faulty)} ({_pct0(_rate(det, len(faulty)))})",
                               f"{det_any}/{len(faulty)} ({_pct0(_rate(det_any, len(faulty)))})",
                               f"{sub.healthy_alarms}/{sub.n_healthy} ({_pct(sub.healthy_alarm_rate)})",
                               f"{sub.pre_onset}/{sub.n_faulty} ({_pct(sub.pre_onset_rate)})"]))
            for kind, ks in sub.kinds.items():
                rows.append((f"  {fam}: {kind}", ["", f"{ks.detected}/{ks.n}", f"{ks.detected_any}/{ks.n}", "",
                                                   f"{ks.pre_onset}/{ks.n}"]))
        return header, rows

    def family_table(self, detector: str | None = None) -> Any:
        """:meth:`family_rows` as a :class:`rich.table.Table`."""
        from rich.table import Table

        header, rows = self.family_rows(detector)
        table = Table(title=f"{detector or self.main} per family (each family alone), suite {self.suite!r}")
        table.add_column("family", style="bold")
        for h in header:
            table.add_column(h, justify="right")
        for label, cells in rows:
            table.add_row(label, *cells)
        return table

    def family_markdown(self, detector: str | None = None) -> str:
        """:meth:`family_rows` as a Markdown table."""
        header, rows = self.family_rows(detector)
        lines = ["| family | " + " | ".join(header) + " |", "|---|" + "---:|" * len(header)]
        lines += [f"| {label.strip()} | " + " | ".join(cells) + " |" for label, cells in rows]
        return "\n".join(lines) + "\n"

    def to_markdown(self) -> str:
        """The comparison as a Markdown table (for the README)."""
        names = list(self.scores)
        lines = [
            f"Suite `{self.suite}`, {self.n_curves} curves. {LEGEND[0].upper()}{LEGEND[1:]}.",
            "",
            "| | " + " | ".join(names) + " |",
            "|---|" + "---:|" * len(names),
        ]
        for label, cells in self.rows():
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
        return "\n".join(lines) + "\n"

    def check_targets(self, targets: Mapping[str, float] | None = None) -> list[str]:
        """The targets the main detector misses (see :func:`check_targets`); by default the
        suite's own (:func:`targets_for`).
        """
        if self.main not in self.scores:
            return [f"main detector {self.main!r} was not run"]
        others = [s for name, s in self.scores.items() if name != self.main]
        return check_targets(self.scores[self.main], others, targets_for(self.suite) if targets is None else targets)

    def to_dict(self, per_curve: bool = False) -> dict[str, Any]:
        """A JSON-serialisable dict, with the unmet targets (as :meth:`check_targets` says them: a
        main detector that was not run meets none).
        """
        unmet = self.check_targets()
        return {
            "suite": self.suite,
            "n_curves": self.n_curves,
            "main": self.main,
            "kinds": self.kinds,
            "scores": {name: s.to_dict(per_curve) for name, s in self.scores.items()},
            "targets": {"thresholds": targets_for(self.suite), "met": not unmet, "unmet": unmet},
        }


# --------------------------------------------------------------------------- the bench


def _as_logged(factory: Callable[..., Any], every: int) -> Callable[..., Any]:
    """``factory`` for a run logged every ``every`` steps, as replay builds it: told the interval."""
    def build(total_steps: int | None = None) -> Any:
        return factory(total_steps=total_steps, log_every=every)

    return build


def _default_monitor_factory() -> Callable[..., Any]:
    from trainsignals import Monitor

    return Monitor


def _suites(args: argparse.Namespace) -> list[str]:
    """The ``--suite`` values (one name as a string is one suite; none: the synthetic suite)."""
    given = getattr(args, "suite", None)
    return [given] if isinstance(given, str) else list(given or ["synthetic"])


def load_pooled(suites: Sequence[str]) -> list[Any]:
    """The runs of several suites as one list, each renamed ``"<suite>/<name>"`` (names repeat across draws).

    Raises:
        ValueError: no suite.
    """
    if not suites:
        raise ValueError("suites must name at least one suite")
    import dataclasses

    return [dataclasses.replace(c, name=f"{s}/{c.name}") for s in suites for c in _load_suite(s)]


def _load_suite(suite: str) -> list[Any]:
    """Load ``suite``; the synthetic suite is regenerated (it is seeded) when not on disk."""
    from trainsignals.curves import load_suite, standard_suite

    try:
        return list(load_suite(SUITE_ALIASES.get(suite, suite)))
    except FileNotFoundError:
        if suite != "synthetic":
            raise
        return list(standard_suite())


def run_bench(
    suite: str = "synthetic",
    detectors: Mapping[str, Any] | None = None,
    baselines: bool | Sequence[Any] = True,
    curves: Sequence[Any] | None = None,
    windows: Mapping[str, WindowSpec] | None = None,
    main: str = "trainsignals",
) -> BenchResult:
    """Score trainsignals' detectors and the baselines on one labeled suite.

    Args:
        suite: Suite name or folder for :func:`trainsignals.curves.load_suite` (ignored
            when ``curves`` is given, except as the label). ``"synthetic"`` falls back to
            :func:`trainsignals.curves.standard_suite` (seeded, identical) when the
            committed files are not there (an installed package does not ship them).
        detectors: ``{name: detector}``, each a Monitor factory (such as the ``Monitor`` class), a
            :class:`~trainsignals.Detector` class or a factory returning a Detector (built per
            curve, with ``total_steps=curve.total_steps`` when its constructor takes it), an
            instance, or a baseline (see :func:`score`); defaults to ``{"trainsignals": Monitor}``,
            the default Monitor built per curve with ``Monitor(total_steps=curve.total_steps)``.
            Give ``main`` the name of yours to check the targets against it.
        baselines: ``True`` for :func:`~trainsignals.eval.baselines.default_baselines` followed by
            :func:`~trainsignals.eval.baselines.sagemaker_rules`, ``False`` for none, or the
            baselines to run.
        curves: The curves, instead of loading ``suite``.
        windows: Per-kind detection windows (see :func:`score`).
        main: The detector the targets apply to.

    Returns:
        The :class:`BenchResult`, detectors first, then baselines.
    """
    if curves is None:
        curves = _load_suite(suite)
    if detectors is None:
        detectors = {main: _default_monitor_factory()}
    if baselines is True:
        base: Sequence[Any] = [*default_baselines(), *sagemaker_rules()]
    elif baselines is False:
        base = ()
    else:
        base = baselines
    scores: dict[str, Score] = {}
    for name, det in detectors.items():
        scores[name] = score(det, curves, windows, name=name)
    for b in base:
        s = score(b, curves, windows)
        scores[s.detector] = s
    return BenchResult(suite=suite, n_curves=len(curves), scores=scores, main=main)


@dataclass(frozen=True)
class RuleRate:
    """How often one detector of the default suite alarms on healthy runs.

    Attributes:
        detector: The detector (the ``detector`` field of its events).
        kind: The kind of its alarms.
        alarms: Warning and critical events it raised on the healthy curves.
        runs: Healthy curves on which it raised at least one.
        steps: Healthy steps seen (all detectors see the same curves).
    """

    detector: str
    kind: str
    alarms: int
    runs: int
    steps: int

    @property
    def per_10k(self) -> float:
        """Alarms per 10,000 healthy steps."""
        return 1e4 * self.alarms / self.steps if self.steps else 0.0

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict: the fields and ``per_10k``."""
        return {"detector": self.detector, "kind": self.kind, "alarms": self.alarms, "runs": self.runs,
                "steps": self.steps, "per_10k": self.per_10k}


def rule_rates(suite: str | Path = "synthetic", curves: Sequence[Any] | None = None) -> list[RuleRate]:
    """Alarms of each detector of the default Monitor on a suite's healthy curves, worst first.

    The false-alarm side of calibration: every event of warning or critical severity on a
    healthy run counts against the detector that raised it (until the multi-rule detectors are
    split, a detector stands for its rules together).

    Example:
        >>> from trainsignals.curves import generate
        >>> rates = rule_rates(curves=[generate("healthy", seed=s) for s in range(3)])
        >>> all(r.steps > 0 for r in rates)
        True
    """
    from trainsignals import Monitor

    healthy = [c for c in (_load_suite(str(suite)) if curves is None else curves) if c.kind == "healthy"]
    steps = int(sum(len(c.steps) for c in healthy))
    counts: dict[tuple[str, str], list[int]] = {}
    for c in healthy:
        seen: set[tuple[str, str]] = set()
        for e in Monitor(total_steps=c.total_steps).scan(**c.signals()):
            if e.severity not in ALARM_SEVERITIES:
                continue
            key = (e.detector, e.kind.value)
            counts.setdefault(key, [0, 0])[0] += 1
            seen.add(key)
        for key in seen:
            counts[key][1] += 1
    rows = [RuleRate(d, k, a, r, steps) for (d, k), (a, r) in counts.items()]
    return sorted(rows, key=lambda r: (-r.alarms, r.detector, r.kind))


def rules_markdown(rates: Sequence[RuleRate], n_healthy: int | None = None) -> str:
    """The rule rates as a Markdown table."""
    lines = ["| detector | kind | alarms | healthy runs alarmed | per 10,000 healthy steps |",
             "|---|---|---:|---:|---:|"]
    for r in rates:
        lines.append(f"| {r.detector} | `{r.kind}` | {r.alarms} | {r.runs}"
                     + (f" / {n_healthy}" if n_healthy else "") + f" | {r.per_10k:.2f} |")
    if not rates:
        lines.append("| (none) | | 0 | 0 | 0 |")
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------- CLI


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``bench`` options to ``parser`` (for mounting under the main CLI)."""
    parser.add_argument(
        "--suite", action="append", default=None,
        help="labeled suite to score: synthetic, real, dev (datasets/real_dev), heldout (datasets/real_heldout), "
             "always the repository's, or a folder (./real for one of yours named like those) (default: synthetic); "
             "repeat it to score several suites as one pool (each run named suite/run, the targets those of the "
             "first suite), e.g. the held-out suite with fresh held-out draws"
    )
    parser.add_argument(
        "--by-family", action="store_true",
        help="also print the default Monitor's figures per family (the curves' difficulty field), each family alone "
             "(with --json: under \"families\")",
    )
    fmt = parser.add_mutually_exclusive_group()
    fmt.add_argument("--json", action="store_true", help="print the scores as JSON instead of a table")
    fmt.add_argument("--markdown", action="store_true", help="print the table as Markdown")
    parser.add_argument(
        "--check", action="store_true", help="exit with status 1 when the default Monitor misses a target"
    )
    parser.add_argument("--no-baselines", action="store_true", help="score the Monitor only")
    parser.add_argument("--per-curve", action="store_true", help="with --json, include every curve's verdict")
    parser.add_argument("--rules", action="store_true",
                        help="also print each detector's alarms per 10,000 healthy steps (with --json: under \"rules\")")
    parser.add_argument("--target-window", action="store_true",
                        help="count a detection only within max(50 steps, 10%% of the run) of the onset, for "
                             "every kind (the product's target), instead of each kind's default window")
    parser.add_argument("--log-every", type=positive_int, default=1, metavar="N",
                        help="score the runs as logged every N steps (the loss a block's mean, other signals "
                             "the block's last value, no per-layer signals), replayed as imported logs are: "
                             "Monitor(total_steps=<steps>, log_every=N)")
    from trainsignals.curves import WITHHOLDABLE

    parser.add_argument("--withhold", action="append", default=[], metavar="SIGNAL", choices=WITHHOLDABLE,
                        help="score the runs as if SIGNAL were never measured (repeatable; one of "
                             f"{', '.join(WITHHOLDABLE)}): the targets then say how the Monitor does without it")
    parser.add_argument("--calibration", metavar="FILE",
                        help="also score the Monitor with the knob values of FILE (as `python -m "
                             "trainsignals.eval.calibrate --write --out FILE` writes it), beside the default")
    parser.add_argument("--leave-one-family-out", action="store_true",
                        help="calibrate without each family of --suite in turn and score that family with the "
                             "values found (trainsignals.eval.calibrate); in-sample figures beside them. Needs a "
                             "real-run tuning suite (--suite real or --suite dev, or such a folder); it scores the "
                             "runs as stored, so --withhold, --log-every, --target-window, --check, --calibration "
                             "and --rules are refused with it")


def _given_suites(suites: Sequence[str]) -> list[Any]:
    """The runs of the ``--suite`` values as stored (several: :func:`load_pooled`).

    Raises:
        FileNotFoundError: a suite is not there.
        trainsignals.cli.options.UsageError: a suite folder that does not load (its manifest
            is another tool's, or disagrees with its files).
    """
    try:
        return _load_suite(suites[0]) if len(suites) == 1 else load_pooled(suites)
    except ValueError as exc:
        raise UsageError(f"--suite: {exc}") from exc


def _calibration_settings(path: str) -> dict[str, Any]:
    """The Monitor settings of the ``--calibration`` file.

    Raises:
        trainsignals.cli.options.UsageError: the file cannot be read or is not a calibration file.
    """
    from .calibrate import settings_from_file

    try:
        return dict(settings_from_file(path))
    except OSError as exc:
        raise UsageError(f"--calibration: cannot read {path}: {exc.strerror or exc}") from exc
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UsageError(f"--calibration: {path} is not a calibration file (as `python -m "
                         f"trainsignals.eval.calibrate --write --out FILE` writes it): "
                         f"{type(exc).__name__}: {exc}") from exc


#: the options ``--leave-one-family-out`` cannot honour, as ``(attribute, flag, set?)``
_LOFO_REFUSES: tuple[tuple[str, str, Callable[[Any], bool]], ...] = (
    ("withhold", "--withhold", bool),
    ("log_every", "--log-every", lambda v: v not in (None, 1)),
    ("target_window", "--target-window", bool),
    ("check", "--check", bool),
    ("calibration", "--calibration", lambda v: v is not None),
    ("rules", "--rules", bool),
)


def _leave_one_family_out(args: argparse.Namespace, suites: Sequence[str]) -> int:
    """``bench --leave-one-family-out``: calibrate without each family of the suite and print the scores.

    Raises:
        trainsignals.cli.options.UsageError: options it cannot honour, several suites, or a suite
            it cannot do (the synthetic suite, whose families are difficulties; the held-out suite,
            never calibrated on; a folder that does not load).
    """
    from trainsignals.curves import suite_directory
    from trainsignals.io._console import make_console

    from .calibrate import leave_one_family_out

    given = [flag for attr, flag, is_set in _LOFO_REFUSES if is_set(getattr(args, attr, None))]
    if given:
        raise UsageError(f"--leave-one-family-out does not go with {', '.join(given)}: it scores the default "
                         "Monitor calibrated without each family, on the runs as stored, and checks no target")
    if len(suites) > 1:
        raise UsageError("--leave-one-family-out scores one suite: give --suite once")
    suite = suites[0]
    folder = suite_directory(suite).name
    if folder in ("synthetic", "real_heldout"):
        why = "the synthetic suite's families are difficulties, not model families" if folder == "synthetic" \
            else "the held-out suite is never calibrated on"
        raise UsageError(f"--leave-one-family-out needs a real-run tuning suite: give --suite real or --suite dev "
                         f"({why}; got --suite {suite})")
    try:
        lofo = leave_one_family_out(suite)
    except ValueError as exc:  # a folder that does not load
        raise UsageError(f"--suite: {exc}") from exc
    names = list(lofo.scores)
    if args.json:
        d = lofo.to_dict(per_curve=getattr(args, "per_curve", False))
        d["families"] = {name: lofo.family_dict(name) for name in names}
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
    elif args.markdown:
        sys.stdout.write(lofo.to_markdown() + "".join("\n" + lofo.family_markdown(name) for name in names))
    else:
        console = make_console()
        console.print(lofo.table())
        for name in names:
            console.print(lofo.family_table(name))
    return 0


def _print_rules_table(rates: Sequence[RuleRate]) -> None:
    from rich.table import Table

    from trainsignals.io._console import make_console

    table = Table(title="alarms on healthy runs, by detector")
    for col in ("detector", "kind", "alarms", "healthy runs alarmed", "per 10,000 healthy steps"):
        table.add_column(col, justify="left" if col in ("detector", "kind") else "right")
    for r in rates:
        table.add_row(r.detector, r.kind, str(r.alarms), str(r.runs), f"{r.per_10k:.2f}")
    make_console().print(table)


def _print_result(args: argparse.Namespace, result: BenchResult, stored: Sequence[Any], unmet: Sequence[str]) -> None:
    """Print the scores as ``args`` asks: JSON, Markdown or tables, with the families and rules asked for."""
    from trainsignals.io._console import make_console

    by_family = getattr(args, "by_family", False)
    rates = rule_rates(result.suite, stored) if getattr(args, "rules", False) else None
    if args.json:
        d = result.to_dict(per_curve=getattr(args, "per_curve", False))
        if by_family:
            d["families"] = {result.main: result.family_dict()}
        if rates is not None:
            d["rules"] = [r.to_dict() for r in rates]
        sys.stdout.write(json.dumps(d, indent=2) + "\n")
        return
    if args.markdown:
        sys.stdout.write(result.to_markdown())
        if by_family:
            sys.stdout.write("\n" + result.family_markdown())
        if rates is not None:
            sys.stdout.write("\n" + rules_markdown(rates))
        return
    console = make_console()
    console.print(result.table())
    if by_family:
        console.print(result.family_table())
    if rates is not None:
        _print_rules_table(rates)
    if args.check or unmet:
        if unmet:
            console.print(f"[bold red]{len(unmet)} target(s) unmet:[/]")
            for line in unmet:
                console.print(f"  - {line}", markup=False, highlight=False)
        else:
            console.print("[bold green]all targets met[/]")


def run_from_args(args: argparse.Namespace) -> int:
    """Run the bench as the parsed options say; the exit status.

    Raises:
        FileNotFoundError: a ``--suite`` is not there.
        trainsignals.cli.options.UsageError: options that do not go together, a ``--suite``
            folder or ``--calibration`` file that does not load, a ``--withhold`` that is not a
            signal (:func:`main` prints them as ``error:`` and returns 2).
    """
    suites = _suites(args)
    if getattr(args, "leave_one_family_out", False):
        return _leave_one_family_out(args, suites)
    suite = suites[0] if len(suites) == 1 else " + ".join(suites)
    withheld = tuple(getattr(args, "withhold", ()) or ())
    calibration = _calibration_settings(args.calibration) if getattr(args, "calibration", None) else None
    stored = _given_suites(suites)  # the runs as stored (--rules reads them too)
    curves = stored
    if withheld:
        try:
            curves = [c.withheld(*withheld) for c in curves]
        except ValueError as exc:  # not a signal a run can go without
            raise UsageError(f"--withhold: {exc}") from exc
        sys.stderr.write(f"scored without {', '.join(withheld)}\n")
    windows = None
    if getattr(args, "target_window", False):
        windows = {k.value: target_window for k in Kind}
        sys.stderr.write("detections counted within max(50 steps, 10% of the run) of the onset\n")
    every = getattr(args, "log_every", None)
    every = 1 if every is None else int(every)
    if every < 1:  # the parser refuses it (positive_int); a Namespace built by hand may hold it
        raise UsageError(f"--log-every must be >= 1, got {every}")
    factories: dict[str, Callable[..., Any]] = {"trainsignals": _default_monitor_factory()}
    if calibration is not None:
        from trainsignals import Monitor

        settings: dict[str, Any] = calibration
        factories["calibrated"] = lambda total_steps=None, log_every=1: Monitor(total_steps=total_steps,
                                                                               log_every=log_every, **settings)
        sys.stderr.write(f"calibrated: {Path(args.calibration).name}'s values for {sorted(settings)}\n")
    if every > 1:
        curves = [c.sampled(every) for c in curves]
        factories = {name: _as_logged(f, every) for name, f in factories.items()}
        sys.stderr.write(f"scored as logged every {every} steps\n")
    detectors = factories if len(factories) > 1 or every > 1 else None
    result = run_bench(suite=suite, baselines=not getattr(args, "no_baselines", False), curves=curves,
                       windows=windows, detectors=detectors)
    unmet = result.check_targets()
    _print_result(args, result, stored, unmet)
    if args.check and unmet:
        if args.json or args.markdown:
            for line in unmet:
                sys.stderr.write(f"unmet target: {line}\n")
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point: ``trainsignals bench [--suite synthetic] [--json] [--markdown] [--check]``."""
    parser = argparse.ArgumentParser(
        prog="trainsignals bench", description=__doc__.splitlines()[0] if __doc__ else None
    )
    add_arguments(parser)
    return run_command(parser.prog, run_from_args, parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
