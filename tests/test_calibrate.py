"""Calibration: a knob is set from healthy runs alone, for a budget, on every family."""

from __future__ import annotations

import math

import pytest

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
    budget = 5.0  # the boundary then lies inside the knob's range on these 8 runs (2.0 fires 4 times)
    row = cal.calibrate_entry("lr_anomaly", healthy, budget_per_10k=budget)
    assert row.param == "jump_factor" and row.detector == "LRJumpAnomaly"
    assert _meets("lr_anomaly", "jump_factor", row.value, healthy, budget)
    assert row.limit is None  # the budget decided: 5 % more sensitive breaks it on some family
    assert not _meets("lr_anomaly", "jump_factor", row.value / 1.05, healthy, budget)
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


def test_shipped_calibration_covers_every_knob():
    import json

    import trainsignals as ts

    shipped = json.loads(cal.CALIBRATION_FILE.read_text())["entries"]
    knobbed = {n for n, d in ts.default_suite(calibrated=False).items() if d.knob is not None}
    assert set(shipped) == knobbed
    for name, row in shipped.items():
        assert row["limit"] in ("measured", "no_data", None, "sensitive_end", "quiet_end", "default"), name
        assert row["steps"] > 0 or row["limit"] == "no_data", name


def test_ceiling_keeps_a_default_that_meets_the_budget(healthy):
    free = cal.calibrate(healthy, names=["lr_anomaly"], budget_per_10k=5.0)[0]
    capped = cal.calibrate(healthy, names=["lr_anomaly"], budget_per_10k=5.0, ceiling=True)[0]
    assert free.value < 20.0  # the budget alone allows a more sensitive factor than the default
    assert capped.value == 20.0 and capped.limit == "default"
    assert capped.alarms <= free.alarms
