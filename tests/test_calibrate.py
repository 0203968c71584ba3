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
    assert row.param == "jump_factor" and row.detector == "LRAnomaly"
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


def test_leave_one_family_out_refuses_the_heldout_suite():
    with pytest.raises(ValueError, match="held-out"):
        cal.leave_one_family_out("heldout")
