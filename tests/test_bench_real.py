"""The default Monitor against the baselines on the committed real-run suite (``datasets/real``).

The real suite's targets (``trainsignals.eval.bench.SUITE_TARGETS["real"]``: every kind >= 90 %
right-kind, <= 3 % false alarms on healthy runs and before onset, ahead of every baseline on
every kind) are all met. This test pins that state: a change that loses a target fails here.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from trainsignals.curves import load_suite
from trainsignals.eval import bench

REAL = Path(__file__).resolve().parents[1] / "datasets" / "real"


@pytest.fixture(scope="module")
def result():
    if not (REAL / "manifest.json").exists():
        pytest.skip("datasets/real is not in this checkout")
    return bench.run_bench("real", curves=load_suite(str(REAL)), baselines=True)


def test_every_real_target_is_met(result):
    assert result.check_targets() == []
    score = result.scores[result.main]
    assert min(k.rate for k in score.kinds.values()) >= 0.9
    assert score.healthy_alarm_rate <= 0.03 and score.pre_onset_rate <= 0.03


def test_ahead_of_lightning_early_stopping_on_overfitting(result):
    ours = result.scores[result.main].kinds["overfitting"].rate
    theirs = result.scores["lightning-es(val_loss)"].kinds["overfitting"].rate
    assert ours > theirs
    assert result.scores["lightning-es(val_loss)"].healthy_alarm_rate > 10 * result.scores[result.main].healthy_alarm_rate
