"""Calibration: each rule's sensitivity set from healthy runs for a stated false-alarm budget.

A detector that implements one rule declares its *knob* (:class:`~trainsignals.Knob`): the
constructor parameter that sets how sensitive the rule is, the range of values that make sense
for it, and which way is quieter. Calibration runs each knob's detector alone (a Monitor whose
suite is that one default-suite entry) over the *tuning* healthy runs and picks the most
sensitive value in the range whose alarms stay within the budget::

    alarms(value) <= floor(budget_per_10k * healthy_steps / 10_000)

on *every* tuning family on its own (each synthetic difficulty, each real model family), so
that a value holds across the kinds of run we have rather than on their average; found by
bisection (in log space for a ``log`` knob). Nothing here looks at a faulty run or its label:
detection is what the held-out suite then measures.

* The budget, :data:`BUDGET_PER_10K`, is the issue's ceiling: at most one alarm per 20,000
  healthy steps per rule (0.5 per 10,000).
* The tuning runs are the healthy runs of :data:`TUNING_SUITES`: the synthetic suite, the
  committed real suite and the development suite (``datasets/real_dev``: other model families,
  optimizers and schedules than ``datasets/real``'s). The held-out suite
  (``datasets/real_heldout``) is never used: :func:`tuning_curves` refuses it.
* :func:`leave_one_family_out` repeats the calibration with one family of a real-run tuning
  suite (``real`` or ``dev``) left out of the tuning runs, and scores the Monitor built from
  those values on that family: the figure for a model family no value was chosen on.

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
    "calibrate_entry",
    "healthy_alarms",
    "leave_one_family_out",
    "measure",
    "tuning_curves",
    "write_calibration",
]

#: The false-alarm budget per rule: at most 1 alarm per 20,000 healthy steps (issue 16).
BUDGET_PER_10K = 0.5
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

    @property
    def per_10k(self) -> float:
        """Alarms per 10,000 healthy steps at :attr:`value`."""
        return 1e4 * self.alarms / self.steps if self.steps else 0.0


def tuning_curves(suites: Sequence[str] = TUNING_SUITES) -> list[Any]:
    """The healthy runs of the tuning suites (the held-out suite is refused).

    Raises:
        ValueError: a held-out suite among ``suites``.
    """
    from .bench import SUITE_ALIASES, _load_suite

    out: list[Any] = []
    for s in suites:
        if SUITE_ALIASES.get(s, s) not in TUNING_SUITES and Path(s).name not in TUNING_SUITES:
            raise ValueError(f"suites: {s!r} is not a tuning suite ({TUNING_SUITES}); the held-out runs are "
                             "scored only, never calibrated on")
        out.extend(c for c in _load_suite(s) if c.kind == "healthy")
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


def calibrate_entry(name: str, curves: Sequence[Any], budget_per_10k: float = BUDGET_PER_10K,
                    iterations: int = _ITERATIONS) -> Calibrated:
    """Calibrate the knob of default-suite entry ``name`` on healthy ``curves``.

    Raises:
        ValueError: ``name``'s detector declares no knob.
    """
    det = _alone(name, None, {})
    knob = getattr(det, "knob", None)
    if knob is None:
        raise ValueError(f"name: the detector of {name!r} ({type(det).__name__}) declares no knob")
    up = knob.quieter == "higher"
    sensitive, quiet = (knob.lo, knob.hi) if up else (knob.hi, knob.lo)
    integer = isinstance(getattr(det, knob.param), int) and not isinstance(getattr(det, knob.param), bool)
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
    ok, bad = quiet, sensitive  # ok meets the budget; bad does not
    for _ in range(iterations):
        mid = math.sqrt(ok * bad) if knob.log else 0.5 * (ok + bad)
        if integer:
            mid = float(round(mid))
            if mid in (ok, bad):
                break
        if meets(mid):
            ok = mid
        else:
            bad = mid
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

    healthy = tuning_curves() if curves is None else [c for c in curves if c.kind == "healthy"]
    suite = default_suite(calibrated=False)
    todo = [n for n in (SUITE_NAMES if names is None else names) if getattr(suite[n], "knob", None) is not None]
    rows = [calibrate_entry(n, healthy, budget_per_10k) for n in todo]
    return [_capped(r, healthy) for r in rows] if ceiling else rows


def measure(curves: Sequence[Any] | None = None, names: Sequence[str] | None = None,
            budget_per_10k: float = BUDGET_PER_10K) -> list[Calibrated]:
    """Each knob's alarms on the tuning healthy runs at its class default (nothing is changed).

    What the shipped ``calibration.json`` holds today (``limit="measured"``): the default
    suite keeps its defaults and every event carries the measured rate of its rule.
    """
    from trainsignals.suite import SUITE_NAMES, default_suite

    healthy = tuning_curves() if curves is None else [c for c in curves if c.kind == "healthy"]
    suite = default_suite(calibrated=False)
    rows = []
    for n in (SUITE_NAMES if names is None else names):
        det = suite[n]
        knob = getattr(det, "knob", None)
        if knob is None:
            continue
        inputs = _inputs_of(n, healthy)
        value = getattr(det, knob.param)
        per = healthy_alarms(n, {}, healthy, inputs) if inputs else {}
        a, r, s = (sum(x) for x in zip(*per.values(), strict=True)) if per else (0, 0, 0)
        rows.append(Calibrated(n, type(det).__name__, knob.param, value, a, r, s, budget_per_10k,
                               "measured" if inputs else "no_data"))
    return rows


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


def settings_of(rows: Iterable[Calibrated]) -> dict[str, dict[str, Any]]:
    """The Monitor settings (``{entry: {param: value}}``) that apply calibrated values."""
    return {r.name: {r.param: r.value} for r in rows}


def write_calibration(rows: Sequence[Calibrated], path: str | Path = CALIBRATION_FILE, *,
                      update: bool = False) -> Path:
    """Write calibrated values as the JSON file the default suite reads.

    With ``update``, the file's other entries are kept and only ``rows``' entries replaced.
    """
    path = Path(path)
    entries = json.loads(path.read_text())["entries"] if update and path.exists() else {}
    entries.update({r.name: {**asdict(r), "per_10k": r.per_10k} for r in rows})
    doc = {"budget_per_10k": rows[0].budget_per_10k if rows else BUDGET_PER_10K,
           "tuning_suites": list(TUNING_SUITES),
           "entries": entries}
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    return path


def leave_one_family_out(suite: str = "real", budget_per_10k: float = BUDGET_PER_10K,
                         progress: Callable[[str], None] | None = None) -> Any:
    """Calibrate without one family of ``suite`` at a time and score the Monitor on that family.

    The tuning runs are the healthy runs of every other tuning suite (:data:`TUNING_SUITES`:
    the synthetic suite and the other real-run suite) plus ``suite``'s healthy runs of the other
    families, as the shipped values are chosen less that family; the Monitor built from the
    values found is scored on every run (healthy and faulty) of the family left out. Returns a :class:`trainsignals.eval.bench.BenchResult`
    with two detectors: ``"left-out family"`` (each family scored by the values calibrated
    without it) and ``"in-sample"`` (the default Monitor as shipped, whose defaults were chosen
    on these runs), so ``family_table()`` shows both per family.
    """
    from trainsignals import Monitor

    from .bench import BenchResult, Score, _load_suite, score

    if _is_heldout(suite):
        raise ValueError(f"suite: {suite!r} is the held-out suite; leave-one-family-out runs on a tuning suite")
    curves = _load_suite(suite)
    own = _suite_name(suite)
    others = [c for s in TUNING_SUITES if s != own for c in _load_suite(s) if c.kind == "healthy"]
    results: list[Any] = []
    steps, seconds = 0, 0.0
    for fam in sorted({c.difficulty for c in curves}):
        tune = others + [c for c in curves if c.kind == "healthy" and c.difficulty != fam]
        settings = settings_of(calibrate(tune, budget_per_10k=budget_per_10k))
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
    args = p.parse_args(argv)
    rows = (measure(names=args.entry, budget_per_10k=args.budget) if args.measure
            else calibrate(names=args.entry, budget_per_10k=args.budget, ceiling=args.ceiling))
    for r in rows:
        print(f"{r.name:22s} {r.detector:22s} {r.param}={r.value:<10.4g} {r.alarms:3d} alarms "
              f"({r.per_10k:.2f} per 10k, {r.runs_alarmed} runs, {r.steps} steps)"
              + (f" [{r.limit}]" if r.limit else ""))
    if args.write:
        print(f"wrote {write_calibration(rows, update=bool(args.entry))}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
