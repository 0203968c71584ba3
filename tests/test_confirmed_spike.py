"""ConfirmedZSpike: a grad-norm jump is an explosion when the loss rises with it or the next value is still up."""

from __future__ import annotations

import json

import numpy as np
import pytest

import trainsignals as ts

GRAD = dict(signal="grad_norm", kind="grad_explosion", threshold=6.0, min_ratio=10.0)


def grad_stream(seed: int, n: int = 600) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return 2.0 * np.exp(-np.arange(n) / 400) * np.exp(rng.normal(0, 0.15, n))


@pytest.mark.parametrize("seed", range(8))
def test_lone_spikes_are_quiet_and_an_explosion_that_stays_is_caught(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    g = grad_stream(seed)
    lone = sorted(rng.choice(np.arange(60, 380, 40), 4, replace=False) + rng.integers(0, 20, 4))
    for s in lone:   # 10-20x for one value, as in healthy large-model runs
        g[s] *= rng.uniform(10, 20)
    assert len(ts.EWMAZSpike(**GRAD).scan(grad_norm=g)) >= 3   # the unconfirmed rule fires on them
    assert ts.ConfirmedZSpike(**GRAD).scan(grad_norm=g) == []
    onset = int(rng.integers(420, 500))
    g[onset:] *= rng.uniform(12, 40) * np.exp(-np.arange(len(g) - onset) / 30)   # decays, but not at once
    evs = ts.ConfirmedZSpike(**GRAD).scan(grad_norm=g)
    assert len(evs) == 1 and onset <= evs[0].onset_step <= onset + 2 and evs[0].step == evs[0].onset_step + 1
    assert "the next value is still" in evs[0].message


def test_a_downward_drop_and_the_linear_mode() -> None:
    x = 5.0 + np.random.default_rng(0).normal(0, 0.05, 300)
    x[100] = 2.0                      # one value down: back at the next
    x[200:] = 2.0                     # down for good
    det = ts.ConfirmedZSpike(log=False, direction="down", threshold=5.0, min_ratio=1.2)
    assert [(e.onset_step, e.step) for e in det.scan(grad_norm=x)] == [(200, 201)]


def test_a_lone_spike_the_loss_rises_with_is_an_explosion_at_once() -> None:
    g = grad_stream(2, 400)
    loss = 2.0 * np.exp(-np.arange(400) / 300) * np.exp(np.random.default_rng(2).normal(0, 0.01, 400))
    g[[150, 300]] *= 15.0              # both back at the next value
    loss[300] *= 2.0                   # the second moves the loss (a bad batch)
    evs = ts.ConfirmedZSpike(**GRAD).scan(grad_norm=g, loss=loss)
    assert [(e.onset_step, e.step) for e in evs] == [(300, 300)] and "the loss rose 2.0" in evs[0].message
    loss[300] = np.nan                 # no loss at that step: only the next value could confirm it
    assert ts.ConfirmedZSpike(**GRAD).scan(grad_norm=g, loss=loss) == []
    with pytest.raises(ValueError, match="signal"):
        ts.ConfirmedZSpike(signal="loss")


def test_the_next_usable_value_confirms_and_the_state_keeps_the_candidate() -> None:
    g = grad_stream(3, 300)
    g[200:] *= 30.0
    g[201] = np.nan                    # the value after the jump is missing: the one after confirms
    want = [(e.onset_step, e.step) for e in ts.ConfirmedZSpike(**GRAD).scan(grad_norm=g)]
    assert want == [(200, 202)]
    det = ts.ConfirmedZSpike(**GRAD)
    assert det.scan(grad_norm=g[:201]) == []       # the jump seen, not yet confirmed
    resumed = ts.ConfirmedZSpike(**GRAD)
    resumed.load_state_dict(json.loads(json.dumps(det.state_dict())))
    got = resumed.scan(grad_norm=g[201:], steps=np.arange(201, 300))
    assert [(e.onset_step, e.step) for e in got] == want


def test_the_default_suite_names_an_explosion_but_not_a_lone_spike() -> None:
    g = grad_stream(5, 800)
    loss = 2.0 * np.exp(-np.arange(800) / 300) * np.exp(np.random.default_rng(5).normal(0, 0.01, 800))
    g[300] *= 15.0                     # lone, no loss response: quiet
    mon = ts.Monitor(total_steps=800)
    assert [e for e in mon.scan(loss=loss[:400], grad_norm=g[:400]) if e.severity != "info"] == []
    g[500] *= 1000.0                   # orders of magnitude in one value: the peak rule names it at once
    g[650:] *= 30.0                    # a jump that stays: the confirmed rule, one value later
    evs = [(e.detector, e.onset_step, e.step) for e in ts.Monitor(total_steps=800).scan(loss=loss, grad_norm=g)
           if e.kind.value == "grad_explosion"]
    assert ("PeakRatioSpike", 500, 500) in evs and ("ConfirmedZSpike", 650, 651) in evs
    assert not [e for e in evs if e[1] == 300]
