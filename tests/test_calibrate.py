"""Calibration: a knob is set from healthy runs alone, for a budget, on every family."""

from __future__ import annotations

import inspect
import json
import math
import re
from pathlib import Path

import pytest

import trainsignals as ts
from trainsignals.curves import generate
from trainsignals.eval import calibrate as cal


@pytest.fixture(scope="module")
def healthy():
    # fresh seeds (the committed synthetic suite uses 0..); two difficulties = two families
    return [generate("healthy", seed=s, difficulty=d) for s in range(7000, 7004) for d in ("easy", "hard")]


def _meets(name, param, value, curves, budget):
    per = cal.healthy_alarms(name, {param: value}, curves)
    return all(a <= math.floor(budget * s / 1e4) for a, _, s in per.values())


def test_value_meets_budget_on_every_family_and_a_more_sensitive_one_does_not(healthy):
    budget = 5.0  # the boundary then lies inside the knob's range on these 8 runs (its sensitive end fires)
    assert not _meets("early_climb", "noise_mult", 1.0, healthy, budget)
    row = cal.calibrate_entry("early_climb", healthy, budget_per_10k=budget)
    assert row.param == "noise_mult" and row.detector == "EarlyClimbDivergence"
    assert _meets("early_climb", "noise_mult", row.value, healthy, budget)
    assert row.limit is None  # the budget decided: 5 % more sensitive breaks it on some family
    assert not _meets("early_climb", "noise_mult", row.value / 1.05, healthy, budget)
    assert row.steps == sum(len(c.steps) for c in healthy)
    assert row.per_10k <= budget


def test_healthy_alarms_counts_per_family(healthy):
    per = cal.healthy_alarms("lr_anomaly", {"jump_factor": 1.01}, healthy)
    assert set(per) == {"easy", "hard"}
    assert sum(s for _, _, s in per.values()) == sum(len(c.steps) for c in healthy)
    # a one-step change of 1 % fires on any schedule that moves, far above a strict budget
    assert sum(a for a, _, _ in per.values()) > 0


def test_heldout_suite_is_refused():
    with pytest.raises(ValueError, match="held-out"):
        cal.tuning_curves(["heldout"])


def test_entry_without_knob_is_refused(healthy):
    with pytest.raises(ValueError, match="declares no knob"):
        cal.calibrate_entry("nonfinite_loss", healthy)


def test_written_file_round_trips(tmp_path, healthy):
    row = cal.calibrate_entry("lr_anomaly", healthy[:2], budget_per_10k=20.0)
    path = cal.write_calibration([row], tmp_path / "c.json")
    import json

    doc = json.loads(path.read_text())
    assert doc["entries"]["lr_anomaly"]["value"] == row.value
    assert doc["entries"]["lr_anomaly"]["per_10k"] == pytest.approx(row.per_10k)
    other = cal.calibrate_entry("lr_collapse", healthy[:2], budget_per_10k=20.0)
    cal.write_calibration([other], path, update=True)      # one entry re-measured: the rest kept
    assert set(json.loads(path.read_text())["entries"]) == {"lr_anomaly", "lr_collapse"}
    cal.write_calibration([other], path)
    assert set(json.loads(path.read_text())["entries"]) == {"lr_collapse"}


def test_leave_one_family_out_refuses_the_heldout_suite():
    with pytest.raises(ValueError, match="held-out"):
        cal.leave_one_family_out("heldout")


def test_events_carry_their_rules_measured_healthy_rate():
    import json

    import numpy as np

    import trainsignals as ts

    shipped = json.loads(cal.CALIBRATION_FILE.read_text())["entries"]
    rng = np.random.default_rng(7100)
    loss = 2.0 * np.exp(-np.arange(300) / 200) * np.exp(rng.normal(0, 0.02, 300))
    loss[150] *= 30.0  # one bad batch
    evs = [e for e in ts.Monitor(total_steps=300).scan(loss=loss) if e.kind is ts.Kind.LOSS_SPIKE]
    assert evs, "the spike must be caught"
    rate = shipped["loss_spike" if evs[0].detector == "EWMAZSpike" else "loss_peak"]["per_10k"]
    assert evs[0].healthy_rate == pytest.approx(rate)
    assert "healthy steps" in str(evs[0]) or "never fired" in str(evs[0])
    # a setting changed from the default: the measured rate no longer applies
    changed = ts.Monitor(total_steps=300, loss_spike={"threshold": 6.5}, loss_peak={"peak_ratio": 4.0})
    assert all(e.healthy_rate is None for e in changed.scan(loss=loss) if e.kind is ts.Kind.LOSS_SPIKE)
    assert all(d.healthy_rate is None for d in ts.default_suite(300, calibrated=False).values())
    # a log written every N steps: the rates were measured on one value a step, and do not apply
    assert all(d.healthy_rate is None and d.heldout_rate is None for d in ts.default_suite(300, log_every=10).values())


def test_events_report_their_rules_held_out_rate_first():
    """The shipped file holds each rule's alarms on held-out healthy runs (measured, never tuned on); the
    events carry that rate beside the tuning one and say it first."""
    import numpy as np

    doc = json.loads(cal.CALIBRATION_FILE.read_text())
    held = doc["entries"]["loss_spike"]["heldout"]
    assert doc["heldout_suites"][0] == "real_heldout" and held["steps"] > doc["entries"]["loss_spike"]["steps"]
    assert not set(doc["heldout_suites"]) & set(cal.TUNING_SUITES)
    rng = np.random.default_rng(7101)
    loss = 2.0 * np.exp(-np.arange(300) / 200) * np.exp(rng.normal(0, 0.02, 300))
    loss[150] *= 30.0
    ev = next(e for e in ts.Monitor(total_steps=300).scan(loss=loss) if e.detector == "EWMAZSpike")
    assert ev.heldout_rate == pytest.approx(1e4 * held["alarms"] / held["steps"])
    text = str(ev)
    assert f"1 in {held['steps'] / held['alarms']:,.0f} held-out healthy steps" in text
    assert text.index("held-out") < text.index("tuning")
    assert ts.Event.from_dict(json.loads(json.dumps(ev.to_dict()))) == ev
    changed = ts.Monitor(total_steps=300, loss_spike={"threshold": 6.5})
    assert all(e.heldout_rate is None for e in changed.scan(loss=loss) if e.detector == "EWMAZSpike")


def test_held_out_rates_are_measured_on_held_out_suites_only(tmp_path):
    """Held-out rates never come from a tuning suite; written, they change nothing but the rates."""
    with pytest.raises(ValueError, match="held-out suites only"):
        cal.heldout_rates(["real"])
    with pytest.raises(ValueError, match="held-out suites only"):
        cal.heldout_rates(["heldout", "datasets/real_dev"])
    rates = cal.heldout_rates(["heldout"], names=["loss_spike", "stall_abrupt"])
    assert set(rates) == {"loss_spike", "stall_abrupt"}
    row = rates["loss_spike"]
    assert row["runs"] > 0 and row["steps"] > 0 and 0 <= row["runs_alarmed"] <= min(row["runs"], row["alarms"])
    path = tmp_path / "calibration.json"
    path.write_text(cal.CALIBRATION_FILE.read_text())
    before = json.loads(path.read_text())
    cal.write_heldout_rates(rates, ["heldout"], path)
    after = json.loads(path.read_text())
    assert after["heldout_suites"][0] == "real_heldout" and set(after["heldout_suites"]) == set(before["heldout_suites"])
    assert after["entries"]["loss_spike"]["heldout"] == {**row, "suites": ["real_heldout"]}
    strip = {n: {k: v for k, v in e.items() if k != "heldout"} for n, e in after["entries"].items()}
    assert strip == {n: {k: v for k, v in e.items() if k != "heldout"} for n, e in before["entries"].items()}
    # a value measured again replaces its entry, without a held-out rate; the others keep theirs
    again = cal.measure(names=["stall_abrupt"])
    cal.write_calibration(again, path, update=True)
    final = json.loads(path.read_text())
    assert final["heldout_suites"] == after["heldout_suites"]
    assert final["entries"]["loss_spike"]["heldout"] == after["entries"]["loss_spike"]["heldout"]
    assert "heldout" not in final["entries"]["stall_abrupt"]


def test_shipped_calibration_covers_every_knob():
    import json

    import trainsignals as ts

    shipped = json.loads(cal.CALIBRATION_FILE.read_text())["entries"]
    knobbed = {n for n, d in ts.default_suite(calibrated=False).items() if d.knob is not None}
    assert set(shipped) == knobbed
    for name, row in shipped.items():
        assert row["limit"] in ("measured", "no_data", None, "sensitive_end", "quiet_end", "default", "tail"), name
        assert row["steps"] > 0 or row["limit"] == "no_data", name


def test_ceiling_keeps_a_default_that_meets_the_budget(healthy):
    free = cal.calibrate(healthy, names=["lr_anomaly"], budget_per_10k=5.0)[0]
    capped = cal.calibrate(healthy, names=["lr_anomaly"], budget_per_10k=5.0, ceiling=True)[0]
    assert free.value < 20.0  # the budget alone allows a more sensitive factor than the default
    assert capped.value == 20.0 and capped.limit == "default"
    assert capped.alarms <= free.alarms


def test_tail_value_recovers_an_exponential_tail():
    import numpy as np

    rng = np.random.default_rng(3)
    n, sigma = 4000, 0.5
    prone = list(rng.exponential(sigma, n))  # every run prone; P(value > x) = exp(-x / sigma)
    thr, rate = cal.tail_value(prone, n, 1e-3, step=1e-6, k=200)
    assert rate == 1e-3
    assert thr == pytest.approx(sigma * math.log(1e3), rel=0.1)  # the true 0.999 quantile


def test_tail_value_needs_enough_prone_runs_and_steps_past_ties():
    assert cal.tail_value([1.0, 2.0, 3.0, 4.0], 300, 1e-3, step=0.01) is None
    thr, rate = cal.tail_value([2.0] * 12, 300, 1e-3, step=0.01)  # a tie: just past it, and nothing beyond
    assert thr == pytest.approx(2.01) and rate == 0.0


def test_critical_values_are_where_each_run_starts_to_alarm(healthy):
    crit = cal.critical_values("lr_anomaly", healthy)
    assert len(crit) == len(healthy)
    for c, v in zip(healthy, crit, strict=True):
        if v is None:  # quiet even at the most sensitive factor
            assert sum(cal.healthy_alarms("lr_anomaly", {"jump_factor": 2.0}, [c])[str(c.difficulty)][:1]) == 0
            continue
        fires = cal.healthy_alarms("lr_anomaly", {"jump_factor": v}, [c])[str(c.difficulty)][0]
        quieter = cal.healthy_alarms("lr_anomaly", {"jump_factor": v * 1.01}, [c])[str(c.difficulty)][0]
        assert fires > 0 and quieter == 0


def test_tail_calibration_splits_the_run_budget_among_the_rules(healthy):
    rows = cal.tail_calibrate(healthy, names=["lr_anomaly", "loss_spike"], run_budget=0.3)
    assert [r.name for r in rows] == ["lr_anomaly", "loss_spike"]
    for r in rows:
        assert r.limit in ("tail", "default", "quiet_end")
        crit = [v for v in cal.critical_values(r.name, healthy) if v is not None]
        if r.limit == "tail":
            assert 0.0 <= r.run_rate <= 0.3 / 2  # a share of the budget: every rule with data has one
            assert r.value > sorted(crit, reverse=True)[min(len(crit), cal.TAIL_RUNS) - 1]  # past the tail's base
        # the runs that alarm at the value are the runs whose critical value reaches it
        assert r.runs_alarmed == sum(v >= r.value for v in crit)


def test_leave_one_family_out_names_an_unknown_method():
    with pytest.raises(ValueError, match="method"):
        cal.leave_one_family_out("real", method="guess")


def test_runs_relabelled_healthy_after_an_injected_fault_are_not_calibrated_on(healthy):
    import dataclasses

    relabelled = dataclasses.replace(healthy[0], name="healthy-vit-3-nofault-oscillation")
    kept = cal.healthy_runs([relabelled, *healthy[1:]])
    assert [c.name for c in kept] == [c.name for c in healthy[1:]]
    assert relabelled not in kept


def test_a_fitted_tail_sets_the_knob_past_the_prone_runs():
    runs = [generate("healthy", seed=s, difficulty=d) for s in range(7000, 7008) for d in ("easy", "medium", "hard")]
    crit = [v for v in cal.critical_values("lr_anomaly", runs) if v is not None]
    assert len(crit) >= cal.MIN_TAIL_RUNS  # enough schedules change by 2x or more to fit a tail
    (row,) = cal.tail_calibrate(runs, names=["lr_anomaly"], run_budget=0.3)
    assert row.limit == "tail"
    assert row.value > max(crit)  # extrapolated beyond every prone run, so none of them alarms
    assert row.runs_alarmed == 0 and 0.0 < row.run_rate <= 0.3


def test_every_default_rule_states_its_measured_rate_in_its_docstring():
    """Each detector class of the default suite states, in its docstring, the budget and the alarms that
    ``calibration.json`` measured for each of its entries (or says it is not calibrated): the docs match
    the file the events' ``healthy_rate`` comes from."""
    doc_file = json.loads(Path(ts.__file__).with_name("calibration.json").read_text())
    entries, budget = doc_file["entries"], doc_file["budget_per_10k"]
    by_class: dict[type, list[str]] = {}
    for name, det in ts.default_suite(1000).items():
        by_class.setdefault(type(det), []).append(name)
    for cls, names in by_class.items():
        doc = " ".join((inspect.getdoc(cls) or "").split())
        assert "**Rate**" in doc or "**Rate:**" in doc or "not calibrated" in doc, cls.__name__
        if any(n not in entries for n in names):
            assert "not calibrated" in doc, cls.__name__
            continue
        assert f"budget {budget:g} per 10,000" in doc, cls.__name__
        for n in names:
            e = entries[n]
            if e["limit"] == "no_data":
                assert f"``{n}``" in doc and "no healthy run" in doc, (cls.__name__, n)
            else:
                pattern = rf"``{n}`` {e['alarms']} alarms? in {e['steps']:,} (tuning healthy )?steps"
                assert re.search(pattern, doc), (cls.__name__, n, e["alarms"], e["steps"])
            held = e.get("heldout")
            if held and held["steps"]:  # and the held-out rate the events report first
                a = held["alarms"]
                pattern = rf"``{n}``( {a} alarms?,|[^`]*? {a} (alarms? )?in {held['steps']:,} (steps of [\d,]+ )?held-out)"
                assert re.search(pattern, doc) and f"{held['steps']:,}" in doc, (cls.__name__, n, held)
