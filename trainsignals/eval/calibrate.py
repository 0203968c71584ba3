"""Calibration: each rule's sensitivity set from healthy runs for a stated false-alarm budget.

A detector that implements one rule declares its *knob* (:class:`~trainsignals.Knob`): the
constructor parameter that sets how sensitive the rule is, the range of values that make sense
for it, and which way is quieter. Calibration runs each knob's detector alone (a Monitor whose
suite is that one default-suite entry) over the *tuning* healthy runs. Nothing here looks at a
faulty run or its label: detection is what the held-out suite then measures.

**The tail method** (:func:`tail_calibrate`, the default). The budget is the issue's run-level
target: at most :data:`RUN_BUDGET` (3 %) of healthy runs with any alarm, split evenly among the
``R`` rules that have tuning data, so each rule may alarm on ``3 % / R`` of healthy runs (about
1 in 1,000). For every healthy run, bisection finds the quietest knob value at which the rule
still alarms on it (:func:`critical_values`): how near that run came to a false alarm. A rate
of 1 in 1,000 lies beyond the few hundred tuning runs, so the value is extrapolated: an
exponential tail is fitted to the :data:`TAIL_RUNS` most alarm-prone runs (peaks over a
threshold, :func:`tail_value`) and the knob is set where the tail puts the rule's rate. With
fewer than :data:`MIN_TAIL_RUNS` prone runs no tail can be fitted and the class default stays.

**The bisection method** (:func:`calibrate`, ``--bisect``): the most sensitive value whose
alarms stay within ``budget_per_10k`` per 10,000 healthy steps (:data:`BUDGET_PER_10K`: one per
20,000) on *every* tuning family on its own. Summed over some 30 rules this budget is far above
the run-level target; it is kept to compare.

* The tuning runs are the healthy runs of :data:`TUNING_SUITES`: the synthetic suite, the
  committed real suite and the development suite (``datasets/real_dev``: other model families,
  optimizers and schedules than ``datasets/real``'s). The held-out suite
  (``datasets/real_heldout``) is never used: :func:`tuning_curves` refuses it.
* :func:`leave_one_family_out` repeats the calibration with one family of a real-run tuning
  suite (``real`` or ``dev``) left out of the tuning runs, and scores the Monitor built from
  those values on that family: the figure for a model family no value was chosen on.

**Held-out rates** (:func:`heldout_rates`, ``--heldout-rates SUITE``): each rule's alarms at
its shipped value on the healthy runs of the held-out suite and of fresh held-out draws, model
families and seeds that no value was chosen on. Measured only, never used to set a value; the
file keeps them beside the tuning figures and each event carries both (held-out first: the rate
to expect on a run of your own).

The values found are written to ``trainsignals/calibration.json`` (``python -m
trainsignals.eval.calibrate --write``); the default suite reads them from there, and each event
carries its rule's measured rate (:attr:`trainsignals.Event.healthy_rate`).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "BUDGET_PER_10K",
    "CALIBRATION_FILE",
    "Calibrated",
    "calibrate",
    "MIN_TAIL_RUNS",
    "RUN_BUDGET",
    "calibrate_entry",
    "critical_values",
    "healthy_alarms",
    "healthy_runs",
    "heldout_rates",
    "leave_one_family_out",
    "measure",
    "settings_from_file",
    "tail_calibrate",
    "tail_calibrate_entry",
    "tail_value",
    "tuning_curves",
    "write_calibration",
    "write_heldout_rates",
]

#: The false-alarm budget per rule: at most 1 alarm per 20,000 healthy steps (issue 16).
BUDGET_PER_10K = 0.5
#: The suite's false-alarm budget in runs: at most 3 % of healthy runs with any alarm (issue 16's
#: target). :func:`tail_calibrate` splits it evenly among the rules: each gets ``RUN_BUDGET / R``.
RUN_BUDGET = 0.03
#: Healthy runs in the tail fit: the most alarm-prone ones (an exponential tail over the 10th).
TAIL_RUNS = 10
#: Fewest alarm-prone healthy runs a tail is fitted to; with fewer the class default stays. The
#: maximum-likelihood scale of an exponential from ``m`` excesses has a relative standard error
#: of ``1 / sqrt(m)``: 5 runs (4 excesses) is the fewest that fix it to within 50 %.
MIN_TAIL_RUNS = 5
#: Bisection steps per knob: the range is halved this often (2**-10 of a decade-wide log range).
_ITERATIONS = 10
#: Where the default suite reads the calibrated values.
CALIBRATION_FILE = Path(__file__).resolve().parents[1] / "calibration.json"
#: Severities that count as an alarm (``info`` events never do).
_ALARMS = ("warning", "critical")
#: Suites a value may be chosen on; ``real_heldout`` is reported only.
TUNING_SUITES = ("synthetic", "real", "real_dev")


@dataclass(frozen=True)
class Calibrated:
    """One knob's calibrated value and what it costs on the tuning healthy runs.

    Attributes:
        name: The default-suite entry (``"loss_spike"``, ...).
        detector: Its class name.
        param: The knob (a constructor parameter).
        value: The value chosen.
        alarms: Warning/critical events at that value on the tuning healthy runs.
        runs_alarmed: Healthy runs with at least one.
        steps: Healthy steps seen.
        budget_per_10k: The budget it was calibrated for.
        limit: ``None`` when the budget decided the value; ``"sensitive_end"`` when even the
            range's most sensitive value meets the budget; ``"quiet_end"`` when even the
            quietest value does not (the rule then exceeds its budget: see ``per_10k``);
            ``"no_data"`` when no tuning run carries the rule's signals (the value is the
            class default, not calibrated); ``"default"`` when, calibrating as a ceiling, the
            class default already met the budget and was kept; ``"measured"`` when the class
            default was only measured (:func:`measure`).
    """

    name: str
    detector: str
    param: str
    value: float
    alarms: int
    runs_alarmed: int
    steps: int
    budget_per_10k: float
    limit: str | None
    run_rate: float | None = None

    @property
    def per_10k(self) -> float:
        """Alarms per 10,000 healthy steps at :attr:`value`."""
        return 1e4 * self.alarms / self.steps if self.steps else 0.0


def healthy_runs(curves: Iterable[Any]) -> list[Any]:
    """The runs of ``curves`` that calibration may learn healthy behaviour from.

    A healthy-labelled run whose injected fault made no visible difference to its twin (a
    ``-nofault-`` run, :func:`trainsignals.curves.families.injected`) is left out: the twin
    shows that the fault changed nothing, not that the run behaved as a healthy one does (an
    injected learning-rate rise that its twin matched by blowing up too).
    """
    from trainsignals.curves.families import injected

    return [c for c in curves if c.kind == "healthy" and not injected(c.name)]


def tuning_curves(suites: Sequence[str] = TUNING_SUITES) -> list[Any]:
    """The healthy runs of the tuning suites (the held-out suite is refused), as :func:`healthy_runs`.

    Raises:
        ValueError: a held-out suite among ``suites``.
    """
    from .bench import SUITE_ALIASES, _load_suite

    out: list[Any] = []
    for s in suites:
        if SUITE_ALIASES.get(s, s) not in TUNING_SUITES and Path(s).name not in TUNING_SUITES:
            raise ValueError(f"suites: {s!r} is not a tuning suite ({TUNING_SUITES}); the held-out runs are "
                             "scored only, never calibrated on")
        out.extend(healthy_runs(_load_suite(s)))
    return out


def _alone(name: str, total_steps: int | None, settings: Mapping[str, Any]) -> Any:
    """Default-suite entry ``name`` with ``settings``, built for a run of ``total_steps``."""
    from trainsignals.suite import SUITE_NAMES, default_suite

    only: dict[str, Any] = {n: False for n in SUITE_NAMES if n != name}
    only[name] = dict(settings)
    return default_suite(total_steps, calibrated=False, **only)[name]


def _has(value: Any) -> bool:
    """Whether a ``Curve.signals()`` entry holds any measurement."""
    if isinstance(value, tuple):
        return len(value[0]) > 0
    if isinstance(value, dict):
        return len(value) > 0
    arr = np.asarray(value, dtype=np.float64)
    return bool(arr.size) and not bool(np.isnan(arr).all())


def _inputs_of(name: str, curves: Iterable[Any]) -> list[tuple[Any, dict[str, Any]]]:
    """The curves that carry every required input of entry ``name``, each with just those signals."""
    det = _alone(name, None, {})
    names = [i.name for i in det.inputs]
    required = [i.name for i in det.inputs if i.required]
    out = []
    for c in curves:
        sig = c.signals()
        if all(r in sig and _has(sig[r]) for r in required):
            got = {n: sig[n] for n in names if n in sig and _has(sig[n])}
            aligned = any(not isinstance(v, tuple) for v in got.values())  # else every input has its own steps
            out.append((c, {"step": sig["step"], **got} if aligned else got))
    return out


def healthy_alarms(name: str, settings: Mapping[str, Any], curves: Iterable[Any],
                   _inputs: list[tuple[Any, dict[str, Any]]] | None = None) -> dict[str, tuple[int, int, int]]:
    """Per family: (alarms, runs alarmed, steps) of entry ``name`` with ``settings`` alone on ``curves``.

    A curve's family is its ``difficulty`` (a synthetic difficulty or a real model family). Only
    the curves that carry the entry's required inputs count (a rule cannot alarm, nor be
    calibrated, on runs without its signal).
    """
    from trainsignals import Monitor

    out: dict[str, list[int]] = {}
    for c, sig in (_inputs_of(name, curves) if _inputs is None else _inputs):
        suite = {name: _alone(name, c.total_steps, settings)}
        n = sum(e.severity in _ALARMS for e in Monitor(total_steps=c.total_steps, suite=suite).scan(**sig))
        row = out.setdefault(str(c.difficulty), [0, 0, 0])
        row[0] += n
        row[1] += n > 0
        row[2] += len(c.steps)
    return {f: (a, r, s) for f, (a, r, s) in out.items()}


def _round_toward(value: float, quieter_up: bool, integer: bool) -> float:
    """``value`` to 3 significant digits (integers: whole), rounded toward the quieter side."""
    if integer:
        return float(math.ceil(value) if quieter_up else math.floor(value))
    if value == 0:
        return 0.0
    e = math.floor(math.log10(abs(value))) - 2
    q = value / 10**e
    return (math.ceil(q) if quieter_up else math.floor(q)) * 10**e


def _knob_of(name: str) -> tuple[Any, Any, bool, bool]:
    """Entry ``name``'s detector at its class defaults, its knob, whether higher is quieter, whether it is whole.

    Raises:
        ValueError: the detector declares no knob.
    """
    det = _alone(name, None, {})
    knob = getattr(det, "knob", None)
    if knob is None:
        raise ValueError(f"name: the detector of {name!r} ({type(det).__name__}) declares no knob")
    value = getattr(det, knob.param)
    return det, knob, knob.quieter == "higher", isinstance(value, int) and not isinstance(value, bool)


def _bisect(ok: float, bad: float, is_ok: Callable[[float], bool], log: bool, integer: bool,
            iterations: int) -> tuple[float, float]:
    """Narrow ``(ok, bad)``, where ``is_ok(ok)`` holds and ``is_ok(bad)`` does not, ``iterations`` times.

    Midpoints are geometric for a ``log`` knob, arithmetic otherwise, and whole numbers for an
    integer one (which stops when no whole number is left between the two).
    """
    for _ in range(iterations):
        mid = math.sqrt(ok * bad) if log else 0.5 * (ok + bad)
        if integer:
            mid = float(round(mid))
            if mid in (ok, bad):
                break
        if is_ok(mid):
            ok = mid
        else:
            bad = mid
    return ok, bad


def calibrate_entry(name: str, curves: Sequence[Any], budget_per_10k: float = BUDGET_PER_10K,
                    iterations: int = _ITERATIONS) -> Calibrated:
    """Calibrate the knob of default-suite entry ``name`` on healthy ``curves``.

    Raises:
        ValueError: ``name``'s detector declares no knob.
    """
    det, knob, up, integer = _knob_of(name)
    sensitive, quiet = (knob.lo, knob.hi) if up else (knob.hi, knob.lo)
    cache: dict[float, dict[str, tuple[int, int, int]]] = {}
    inputs = _inputs_of(name, curves)

    def cost(v: float) -> dict[str, tuple[int, int, int]]:
        v = float(int(v)) if integer else v
        if v not in cache:
            cache[v] = healthy_alarms(name, {knob.param: int(v) if integer else v}, curves, inputs)
        return cache[v]

    def meets(v: float) -> bool:
        return all(a <= math.floor(budget_per_10k * s / 1e4) for a, _, s in cost(v).values())

    def done(v: float, limit: str | None) -> Calibrated:
        per = cost(v)
        a, r, s = (sum(x) for x in zip(*per.values(), strict=True)) if per else (0, 0, 0)
        return Calibrated(name, type(det).__name__, knob.param, int(v) if integer else v, a, r, s,
                          budget_per_10k, limit)

    if not inputs:  # no tuning run carries the rule's signal: nothing to calibrate on, keep the default
        return done(float(getattr(det, knob.param)), "no_data")
    if meets(sensitive):
        return done(sensitive, "sensitive_end")
    if not meets(quiet):
        return done(quiet, "quiet_end")
    ok, _ = _bisect(quiet, sensitive, meets, knob.log, integer, iterations)  # ok meets the budget
    value = _round_toward(ok, up, integer)
    if not meets(value):  # rounding crossed a step of the count: keep the bisection's value
        value = ok
    return done(value, None)


def calibrate(curves: Sequence[Any] | None = None, names: Sequence[str] | None = None,
              budget_per_10k: float = BUDGET_PER_10K, ceiling: bool = False) -> list[Calibrated]:
    """Calibrate every knob of the default suite (or ``names``) on the tuning healthy runs.

    With ``ceiling``, the budget only caps a rule: a knob whose class default already meets the
    budget keeps it (``limit="default"``), one that does not is made quieter until it does.
    """
    from trainsignals.suite import SUITE_NAMES, default_suite

    healthy = tuning_curves() if curves is None else healthy_runs(curves)
    suite = default_suite(calibrated=False)
    todo = [n for n in (SUITE_NAMES if names is None else names) if getattr(suite[n], "knob", None) is not None]
    rows = [calibrate_entry(n, healthy, budget_per_10k) for n in todo]
    return [_capped(r, healthy) for r in rows] if ceiling else rows


def _knob_entries(names: Sequence[str] | None) -> list[tuple[str, Any, Any]]:
    """``(entry, detector, knob)`` of each default-suite entry in ``names`` (all by default) that has a knob."""
    from trainsignals.suite import SUITE_NAMES, default_suite

    suite = default_suite(calibrated=False)
    return [(n, suite[n], suite[n].knob) for n in (SUITE_NAMES if names is None else names)
            if getattr(suite[n], "knob", None) is not None]


def _total_alarms(name: str, settings: Mapping[str, Any], healthy: Sequence[Any]) -> tuple[int, int, int, int]:
    """Alarms, runs alarmed, steps and runs of entry ``name`` with ``settings`` over the ``healthy`` runs
    that carry its signals (all 0 when none does).
    """
    inputs = _inputs_of(name, healthy)
    per = healthy_alarms(name, settings, healthy, inputs) if inputs else {}
    a, r, s = (sum(x) for x in zip(*per.values(), strict=True)) if per else (0, 0, 0)
    return a, r, s, len(inputs)


def measure(curves: Sequence[Any] | None = None, names: Sequence[str] | None = None,
            budget_per_10k: float = BUDGET_PER_10K) -> list[Calibrated]:
    """Each knob's alarms on the tuning healthy runs at its class default (nothing is changed).

    What the shipped ``calibration.json`` holds today (``limit="measured"``): the default
    suite keeps its defaults and every event carries the measured rate of its rule.
    """
    healthy = tuning_curves() if curves is None else healthy_runs(curves)
    rows = []
    for n, det, knob in _knob_entries(names):
        a, r, s, runs = _total_alarms(n, {}, healthy)
        rows.append(Calibrated(n, type(det).__name__, knob.param, getattr(det, knob.param), a, r, s, budget_per_10k,
                               "measured" if runs else "no_data"))
    return rows


def heldout_rates(suites: Sequence[str], names: Sequence[str] | None = None) -> dict[str, dict[str, int]]:
    """Each knob's alarms at its shipped value on the healthy runs of held-out ``suites``: measured, never tuned on.

    ``suites`` are the held-out suite (``"heldout"``) and folders of fresh held-out draws
    (``python benchmarks/heldout_pool.py --seeds 5059-5107 --dir DIR --build-only``). The values
    are what the default suite ships (``calibration.json``'s), so each rate is the one a user's
    run should expect from model families and seeds no value was chosen on.

    Returns:
        ``{entry: {"alarms", "runs_alarmed", "runs", "steps"}}`` for every knob entry (``steps``
        0 where no held-out run carries the rule's signals).

    Raises:
        ValueError: a tuning suite among ``suites`` (its runs chose the values: no held-out rate).
    """
    from .bench import load_pooled

    tuning = [s for s in suites if _suite_name(s) in TUNING_SUITES]
    if tuning or not suites:
        raise ValueError(f"suites: {tuning or 'none'}: held-out rates are measured on held-out suites only "
                         f"(the tuning suites {TUNING_SUITES} chose the values)")
    healthy = healthy_runs(load_pooled(list(suites)))
    shipped = settings_from_file(CALIBRATION_FILE)
    out = {}
    for n, _, _ in _knob_entries(names):
        a, r, s, runs = _total_alarms(n, shipped.get(n, {}), healthy)
        out[n] = {"alarms": a, "runs_alarmed": r, "runs": runs, "steps": s}
    return out


def write_heldout_rates(rates: Mapping[str, Mapping[str, int]], suites: Sequence[str],
                        path: str | Path = CALIBRATION_FILE) -> Path:
    """Add held-out rates (:func:`heldout_rates`) to the calibration file's entries; nothing else changes.

    Each entry gains ``"heldout"`` (its alarms, runs alarmed, runs and steps, and the folder
    names measured: ``"suites"``) and the file ``"heldout_suites"``, every folder any entry was
    measured on. The default suite gives each detector its rate (``heldout_rate``), and the
    Monitor each event.
    """
    path = Path(path)
    doc = json.loads(path.read_text())
    names = [_suite_name(s) for s in suites]
    for n, row in rates.items():
        if n in doc["entries"]:
            doc["entries"][n]["heldout"] = {**row, "suites": names}
    everywhere = list(doc.get("heldout_suites", []))
    doc["heldout_suites"] = everywhere + [s for s in names if s not in everywhere]
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def _capped(row: Calibrated, curves: Sequence[Any]) -> Calibrated:
    """``row``'s value, or the class default when that is the quieter of the two (``ceiling``)."""
    det = _alone(row.name, None, {})
    knob = det.knob
    default = getattr(det, knob.param)
    quieter = row.value if (row.value > default) == (knob.quieter == "higher") else default
    if quieter == row.value or row.limit == "no_data":
        return row
    per = healthy_alarms(row.name, {knob.param: default}, curves)
    a, r, s = (sum(x) for x in zip(*per.values(), strict=True)) if per else (0, 0, 0)
    return Calibrated(row.name, row.detector, row.param, default, a, r, s, row.budget_per_10k, "default")


def critical_values(name: str, curves: Sequence[Any], iterations: int = _ITERATIONS + 2) -> list[float | None]:
    """Per healthy run of ``curves`` that carries ``name``'s inputs: how sensitive ``name``'s knob must be to alarm.

    Each run's value is the quietest knob value at which entry ``name`` alone still alarms on
    it, found by bisection over the knob's range (in log space for a ``log`` knob); ``None``
    for a run that stays quiet even at the range's most sensitive end; the quiet end itself for
    one that alarms there too. The larger a run's value (the smaller, for a knob whose
    ``quieter`` is ``"lower"``), the nearer that healthy run came to a false alarm.
    """
    _, knob, up, integer = _knob_of(name)
    sensitive, quiet = (knob.lo, knob.hi) if up else (knob.hi, knob.lo)
    out: list[float | None] = []
    for c, sig in _inputs_of(name, curves):
        def fires(v: float, c: Any = c, sig: dict[str, Any] = sig) -> bool:
            return bool(healthy_alarms(name, {knob.param: int(v) if integer else v}, [c], [(c, sig)])
                        .get(str(c.difficulty), (0, 0, 0))[0])

        if not fires(sensitive):
            out.append(None)
            continue
        if fires(quiet):
            out.append(quiet)
            continue
        def quiet_at(v: float, f: Callable[[float], bool] = fires) -> bool:
            return not f(v)

        out.append(_bisect(quiet, sensitive, quiet_at, knob.log, integer, iterations)[1])  # the quietest that alarms
    return out


def tail_value(prone: Sequence[float], n: int, rate: float, step: float, k: int = TAIL_RUNS) -> tuple[float, float] | None:
    """The threshold that an exponential tail of ``prone`` puts at exceedance ``rate``, or ``None``.

    ``prone`` are the alarm-prone runs' values (on a scale where larger is more prone), ``n``
    the number of runs they are among (the others never came near) and ``step`` the resolution
    the values were found at. Over the ``k``-th largest value ``u`` (``k`` at most
    ``len(prone)``) the excesses are taken as exponential with the mean excess ``sigma`` of the
    ``k - 1`` values above it (peaks over a threshold; the maximum-likelihood scale), so
    ``P(value > u + x) = (k / n) * exp(-x / sigma)``. Returns ``(threshold, fitted rate at it)``:
    the threshold where that rate is ``rate``, and at least ``step`` past ``u`` (ties, or ``k / n``
    already within ``rate``). ``None`` with fewer than :data:`MIN_TAIL_RUNS` prone runs: too
    few to fit a tail.
    """
    if len(prone) < MIN_TAIL_RUNS:
        return None
    top = sorted(prone, reverse=True)[:max(MIN_TAIL_RUNS, k)]
    u = top[-1]
    sigma = sum(x - u for x in top[:-1]) / (len(top) - 1)
    share = len(top) / n
    if share <= rate or sigma <= 0.0:  # just past u: the share of runs above it is what it says
        return u + step, sum(x > u + step for x in prone) / n
    return u + max(step, sigma * math.log(share / rate)), rate


def tail_calibrate_entry(name: str, curves: Sequence[Any], rate: float) -> Calibrated:
    """Entry ``name``'s knob where a fitted tail of its healthy runs puts a per-run alarm rate of ``rate``.

    The runs' :func:`critical_values`, on the knob's search scale (log for a ``log`` knob, sign
    flipped for a knob whose ``quieter`` is ``"lower"``), go through :func:`tail_value`; the
    value is clipped to the knob's range and rounded toward the quieter side (``"tail"``). When
    fewer than :data:`MIN_TAIL_RUNS` runs alarm even at the sensitive end, no tail can be
    fitted and nothing says where the rate is ``rate``: the class default stays (``"default"``;
    its measured alarms are in the row, and ``run_rate`` is the share of runs that alarm at the
    sensitive end). A fit beyond the quiet end keeps that end
    (``"quiet_end"``: the rule's knob cannot hold the rate on these runs).

    Raises:
        ValueError: ``name``'s detector declares no knob.
    """
    det, knob, up, integer = _knob_of(name)
    sign = 1.0 if up else -1.0

    def to_z(v: float) -> float:
        return sign * (math.log(v) if knob.log else v)

    def from_z(z: float) -> float:
        return math.exp(sign * z) if knob.log else sign * z

    crit = critical_values(name, curves)
    inputs = _inputs_of(name, curves)

    def done(v: float, limit: str, run_rate: float | None) -> Calibrated:
        per = healthy_alarms(name, {knob.param: int(v) if integer else v}, curves, inputs)
        a, r, s = (sum(x) for x in zip(*per.values(), strict=True)) if per else (0, 0, 0)
        return Calibrated(name, type(det).__name__, knob.param, int(v) if integer else v, a, r, s,
                          BUDGET_PER_10K, limit, run_rate)

    default = float(getattr(det, knob.param))
    if not crit:
        return done(default, "no_data", None)
    prone = [to_z(v) for v in crit if v is not None]
    quiet = knob.hi if up else knob.lo
    step = abs(to_z(knob.hi) - to_z(knob.lo)) / 2 ** (_ITERATIONS + 2)  # critical_values' resolution
    fit = tail_value(prone, len(crit), rate, step)
    if fit is None:  # too few prone runs for a tail: nothing to move the default by
        return done(default, "default", len(prone) / len(crit))
    z, fitted = fit
    if z >= to_z(quiet):
        return done(quiet, "quiet_end", fitted)
    value = _round_toward(min(max(from_z(z), knob.lo), knob.hi), up, integer)
    return done(value, "tail", fitted)


def tail_calibrate(curves: Sequence[Any] | None = None, names: Sequence[str] | None = None,
                   run_budget: float = RUN_BUDGET) -> list[Calibrated]:
    """Every knob of the default suite (or ``names``) set by :func:`tail_calibrate_entry`.

    The suite's budget ``run_budget`` (a share of healthy runs with any alarm) is split evenly
    among the ``R`` knobbed rules that have tuning data: each rule's per-run rate is
    ``run_budget / R``, so the rules' alarms together stay within it on healthy runs like the
    tuning ones. The tuning runs default to :func:`tuning_curves`.
    """
    from trainsignals.suite import SUITE_NAMES, default_suite

    healthy = tuning_curves() if curves is None else healthy_runs(curves)
    suite = default_suite(calibrated=False)
    knobbed = [n for n in SUITE_NAMES if getattr(suite[n], "knob", None) is not None]
    rules = max(1, sum(1 for n in knobbed if _inputs_of(n, healthy)))
    todo = [n for n in (knobbed if names is None else names) if n in knobbed]
    return [tail_calibrate_entry(n, healthy, run_budget / rules) for n in todo]


def settings_of(rows: Iterable[Calibrated]) -> dict[str, dict[str, Any]]:
    """The Monitor settings (``{entry: {param: value}}``) that apply calibrated values."""
    return {r.name: {r.param: r.value} for r in rows}


def settings_from_file(path: str | Path) -> dict[str, dict[str, Any]]:
    """The Monitor settings a calibration file applies (its calibrated rows; measured defaults add nothing).

    Example:
        >>> settings_from_file(CALIBRATION_FILE)  # the shipped file holds measured defaults only
        {}
    """
    entries = json.loads(Path(path).read_text())["entries"]
    return {n: {r["param"]: r["value"]} for n, r in entries.items() if r.get("limit") not in ("measured", "no_data")}


def write_calibration(rows: Sequence[Calibrated], path: str | Path = CALIBRATION_FILE, *,
                      update: bool = False) -> Path:
    """Write calibrated values as the JSON file the default suite reads.

    With ``update``, the file's other entries (their held-out rates too) are kept and only
    ``rows``' entries replaced; a replaced entry has no held-out rate until ``--heldout-rates``
    measures it again.
    """
    path = Path(path)
    old = json.loads(path.read_text()) if update and path.exists() else {"entries": {}}
    entries = old["entries"]
    entries.update({r.name: {**asdict(r), "per_10k": r.per_10k} for r in rows})  # a new value: no held-out rate yet
    doc = {"budget_per_10k": rows[0].budget_per_10k if rows else BUDGET_PER_10K,
           "tuning_suites": list(TUNING_SUITES),
           "entries": entries}
    if "heldout_suites" in old:  # the other entries keep theirs
        doc["heldout_suites"] = old["heldout_suites"]
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def leave_one_family_out(suite: str = "real", budget_per_10k: float = BUDGET_PER_10K,
                         progress: Callable[[str], None] | None = None, method: str = "tail") -> Any:
    """Calibrate without one family of ``suite`` at a time and score the Monitor on that family.

    The tuning runs are the healthy runs of every other tuning suite (:data:`TUNING_SUITES`:
    the synthetic suite and the other real-run suite) plus ``suite``'s healthy runs of the other
    families, as the shipped values are chosen less that family; the Monitor built from the
    values found is scored on every run (healthy and faulty) of the family left out. Returns a :class:`trainsignals.eval.bench.BenchResult`
    with two detectors: ``"left-out family"`` (each family scored by the values calibrated
    without it) and ``"in-sample"`` (the default Monitor as shipped, whose defaults were chosen
    on these runs), so ``family_table()`` shows both per family. ``method`` is how the values
    are found: ``"tail"`` (:func:`tail_calibrate`) or ``"budget"``
    (:func:`calibrate`'s bisection to the per-step budget).

    Raises:
        ValueError: the held-out suite, or an unknown ``method``.
    """
    from trainsignals import Monitor

    from .bench import BenchResult, Score, _load_suite, score

    if _is_heldout(suite):
        raise ValueError(f"suite: {suite!r} is the held-out suite; leave-one-family-out runs on a tuning suite")
    if method not in ("tail", "budget"):
        raise ValueError(f"method must be 'tail' or 'budget', got {method!r}")
    curves = _load_suite(suite)
    own = _suite_name(suite)
    others = [c for s in TUNING_SUITES if s != own for c in healthy_runs(_load_suite(s))]
    results: list[Any] = []
    steps, seconds = 0, 0.0
    for fam in sorted({c.difficulty for c in curves}):
        tune = others + [c for c in healthy_runs(curves) if c.difficulty != fam]
        rows = tail_calibrate(tune) if method == "tail" else calibrate(tune, budget_per_10k=budget_per_10k)
        settings = settings_of(rows)
        if progress is not None:
            progress(f"without {fam}: {settings}")

        def factory(total_steps: int, _s: Mapping[str, Any] = settings) -> Any:
            return Monitor(total_steps=total_steps, **_s)

        s = score(factory, [c for c in curves if c.difficulty == fam])
        results.extend(s.curves)
        steps += s.steps
        seconds += s.seconds
    out = Score.from_results("left-out family", results, steps, seconds)
    inside = score(Monitor, curves, name="in-sample")
    return BenchResult(suite=suite, n_curves=len(curves), scores={"left-out family": out, "in-sample": inside},
                       main="left-out family")


def _suite_name(suite: str) -> str:
    """The folder name of ``suite`` (an alias or a path): ``"dev"`` and ``datasets/real_dev`` are ``"real_dev"``."""
    from .bench import SUITE_ALIASES

    return SUITE_ALIASES.get(suite, Path(suite).name)


def _is_heldout(suite: str) -> bool:
    """Whether ``suite`` names the held-out real suite."""
    from .bench import SUITE_ALIASES

    return SUITE_ALIASES.get(suite, suite) == "real_heldout" or Path(suite).name == "real_heldout"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m trainsignals.eval.calibrate``: print (and with ``--write`` store) the values."""
    p = argparse.ArgumentParser(prog="python -m trainsignals.eval.calibrate", description=__doc__.splitlines()[0])
    p.add_argument("--budget", type=float, default=BUDGET_PER_10K, help="alarms per 10,000 healthy steps per rule")
    p.add_argument("--write", action="store_true",
                   help=f"write {CALIBRATION_FILE.name} for the default suite (with --entry: replace only those)")
    p.add_argument("--entry", action="append", help="calibrate only these default-suite entries")
    p.add_argument("--measure", action="store_true",
                   help="only measure each rule's healthy alarms at its default (what the package ships)")
    p.add_argument("--ceiling", action="store_true",
                   help="the budget only caps: keep a class default that already meets it")
    p.add_argument("--bisect", action="store_true",
                   help="the older method: bisect each knob to --budget alarms per 10,000 steps on every family")
    p.add_argument("--run-budget", type=float, default=RUN_BUDGET,
                   help="the tail method's budget: share of healthy runs with any alarm, split among the rules")
    p.add_argument("--suite", action="append", choices=TUNING_SUITES,
                   help="tune on these suites only (repeatable; default: all of them)")
    p.add_argument("--out", type=Path, default=CALIBRATION_FILE,
                   help="with --write: the file to write (default: the one the default suite reads); "
                        "`trainsignals bench --calibration FILE` scores it")
    p.add_argument("--heldout-rates", action="append", metavar="SUITE",
                   help="measure only: each rule's alarms at its shipped value on these held-out suites' healthy "
                        "runs (repeatable: 'heldout' and draw folders; with --write, added to the file)")
    args = p.parse_args(argv)
    if args.heldout_rates:
        held = heldout_rates(args.heldout_rates, names=args.entry)
        for n, row in held.items():
            per = 1e4 * row["alarms"] / row["steps"] if row["steps"] else 0.0
            print(f"{n:22s} {row['alarms']:3d} alarms ({per:.3f} per 10k held-out healthy steps, "
                  f"{row['runs_alarmed']} of {row['runs']} runs, {row['steps']} steps)")
        if args.write:
            print(f"wrote {write_heldout_rates(held, args.heldout_rates, args.out)}")
        return 0
    curves = tuning_curves(args.suite) if args.suite else None
    if args.measure:
        rows = measure(curves, names=args.entry, budget_per_10k=args.budget)
    elif args.bisect or args.ceiling:
        rows = calibrate(curves, names=args.entry, budget_per_10k=args.budget, ceiling=args.ceiling)
    else:
        rows = tail_calibrate(curves, names=args.entry, run_budget=args.run_budget)
    for r in rows:
        print(f"{r.name:22s} {r.detector:22s} {r.param}={r.value:<10.4g} {r.alarms:3d} alarms "
              f"({r.per_10k:.2f} per 10k, {r.runs_alarmed} runs, {r.steps} steps)"
              + (f", fitted run rate {r.run_rate:.2g}" if r.run_rate is not None else "")
              + (f" [{r.limit}]" if r.limit else ""))
    if args.write:
        print(f"wrote {write_calibration(rows, args.out, update=bool(args.entry))}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
