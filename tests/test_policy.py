"""The Monitor's event policy: merge, escalation, the loss guard, its settings and its state."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest

import trainsignals as ts
from trainsignals import EventPolicy, Kind, make_event


def ev(step, kind=Kind.GRAD_EXPLOSION, severity="warning", detector="EWMAZSpike", signal="grad_norm", onset=None):
    return make_event(kind, severity, step, step if onset is None else onset, detector, signal, 9.0, 6.0, "jump")


def run(policy, events, loss=lambda t: 1.0, steps=400):
    """Feed the policy step by step: ``events`` by step, the loss ``loss(t)``; returns what it lets through."""
    out = []
    for t in range(steps):
        out += policy.apply([e for e in events if e.step == t], t, loss(t))
    return out


def test_the_third_event_within_the_window_escalates():
    out = run(EventPolicy(), [ev(10, Kind.LOSS_SPIKE, signal="loss"), ev(60, Kind.LOSS_SPIKE, signal="loss"),
                              ev(150, Kind.LOSS_SPIKE, signal="loss"), ev(390, Kind.LOSS_SPIKE, signal="loss")])
    assert [(e.step, e.severity) for e in out] == [(10, "warning"), (60, "warning"), (150, "critical"),
                                                  (390, "warning")]
    assert "3 such events within 200 steps" in out[2].message
    assert all(e.severity == "warning" for e in run(EventPolicy(escalate_after=0), [ev(t) for t in (1, 20, 40)]))


def test_escalation_counts_per_kind_and_signal():
    evs = [ev(10, Kind.LOSS_SPIKE, signal="loss"), ev(20), ev(30, Kind.LOSS_SPIKE, signal="loss")]
    assert all(e.severity == "warning" for e in run(EventPolicy(), evs, loss=lambda t: 1.0 + t))


def test_the_guard_keeps_a_grad_norm_escalation_a_warning_while_the_loss_falls():
    evs = [ev(100), ev(150), ev(200)]
    rising = run(EventPolicy(), evs, loss=lambda t: 1.0 + t / 100)
    falling = run(EventPolicy(), evs, loss=lambda t: 2.0 - t / 1000)
    assert [e.severity for e in rising] == ["warning", "warning", "critical"]
    assert [e.severity for e in falling] == ["warning", "warning", "warning"]
    assert "loss did not rise" in falling[-1].message
    # the loss is not guarded: its own escalation goes through
    losses = [ev(t, Kind.LOSS_SPIKE, signal="loss") for t in (100, 150, 200)]
    assert run(EventPolicy(), losses, loss=lambda t: 2.0 - t / 1000)[-1].severity == "critical"


def test_the_guard_demotes_a_stayed_grad_jump_while_the_loss_has_not_risen():
    stayed = [ev(112, severity="critical", detector="LevelShift", onset=100)]
    assert run(EventPolicy(), stayed, loss=lambda t: 1.0 if t < 100 else 1.0 + (t - 99) / 10)[0].severity == "critical"
    down = run(EventPolicy(), stayed, loss=lambda t: 2.0 if t < 100 else 0.5)
    assert down[0].severity == "warning" and "not a divergence" in down[0].message
    assert run(EventPolicy(), stayed, loss=lambda t: float("nan"))[0].severity == "critical"  # no loss: no guard
    assert run(EventPolicy(guard_kinds=()), stayed, loss=lambda t: 2.0 if t < 100 else 0.5)[0].severity == "critical"


def test_one_jump_seen_by_two_rules_is_one_event():
    evs = [ev(100, detector="PeakRatioSpike"), ev(101), ev(101, Kind.LOSS_SPIKE, signal="loss"),
           ev(130, detector="PeakRatioSpike"), ev(135, detector="PeakRatioSpike")]
    out = run(EventPolicy(), evs)
    assert [(e.step, e.detector, e.signal) for e in out] == [(100, "PeakRatioSpike", "grad_norm"),
                                                            (101, "EWMAZSpike", "loss"),
                                                            (130, "PeakRatioSpike", "grad_norm"),
                                                            (135, "PeakRatioSpike", "grad_norm")]
    assert len(run(EventPolicy(merge_window=0), evs)) == 5
    assert len(run(EventPolicy(merge_window=0), [ev(100, detector="PeakRatioSpike"), ev(100)])) == 1  # same step
    crit = [ev(100, detector="PeakRatioSpike"), ev(104, severity="critical", detector="LevelShift", onset=90)]
    assert len(run(EventPolicy(), crit)) == 2  # a critical event is never merged away


def test_the_monitor_applies_the_policy_to_a_grad_norm_that_jumps_and_stays():
    rng = np.random.default_rng(5000)
    g = np.exp(rng.normal(0, 0.05, 300))
    g[150:] *= 30.0
    up = np.exp(rng.normal(0, 0.02, 300))
    up[150:] *= np.exp(np.arange(150) / 20)
    down = 2.0 * np.exp(rng.normal(0, 0.02, 300))
    down[150:] *= np.exp(-np.arange(150) / 5)

    def stayed(loss):
        mon = ts.Monitor(suite={k: v for k, v in ts.default_suite().items() if k.startswith("grad_")})
        return [(e.step, e.onset_step, e.severity) for e in mon.scan(grad_norm=g, loss=loss) if e.detector == "LevelShift"]

    assert stayed(up) == [(160, 150, "critical")]
    assert stayed(down) == [(160, 150, "warning")]


def test_policy_settings_are_validated_by_name():
    for kw, name in [({"escalate_after": -1}, "escalate_after"), ({"escalate_window": 0}, "escalate_window"),
                     ({"merge_window": 1.5}, "merge_window"), ({"escalate_kinds": ("nope",)}, "escalate_kinds"),
                     ({"guard_kinds": "grad_explosion"}, "guard_kinds")]:
        with pytest.raises(ValueError, match=name):
            EventPolicy(**kw)
    with pytest.raises(ValueError, match="policy"):
        ts.Monitor(policy={"escalate_after": 2})


def test_policy_state_round_trips_and_a_foreign_state_is_refused():
    evs = [ev(100), ev(150)]
    a = EventPolicy()
    run(a, evs, loss=lambda t: 1.0 + t / 100, steps=160)
    b, c = EventPolicy(), pickle.loads(pickle.dumps(a))
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    assert b.state_dict() == a.state_dict() == c.state_dict()
    for p in (a, b, c):  # the third event, after the resume, escalates in each
        assert p.apply([ev(200)], 200, 3.0)[0].severity == "critical"
    with pytest.raises(ValueError, match="policy state keys"):
        b.load_state_dict({"alarms": {}})


def test_the_monitor_snapshot_carries_the_policy():
    g = np.exp(np.random.default_rng(5001).normal(0, 0.05, 600))
    for s in (100, 180, 260):  # 3 within 200 steps (the window is open at its far end), each up for 2 steps
        g[s:s + 2] *= 40.0
    loss = np.linspace(1.0, 3.0, 600)
    whole = ts.Monitor().scan(grad_norm=g, loss=loss)
    assert [e.severity for e in whole if e.kind is Kind.GRAD_EXPLOSION] == ["warning", "warning", "critical"]
    first = ts.Monitor()
    first.scan(grad_norm=g[:250], loss=loss[:250])
    resumed = ts.Monitor()
    resumed.load_state_dict(json.loads(json.dumps(first.state_dict())))
    assert resumed.scan(grad_norm=g[250:], loss=loss[250:]) == [e for e in whole if e.step >= 250]
    assert ts.Monitor(policy=EventPolicy(escalate_after=4)).config()["policy"]["escalate_after"] == 4
    with pytest.raises(ValueError, match="policy"):
        ts.Monitor(policy=EventPolicy(escalate_after=4)).load_state_dict(first.state_dict())


def test_a_sparse_log_gets_a_policy_whose_windows_cover_its_rows():
    # three bad batches three rows apart in a log written every 500 steps: 1,500 steps, past the 200-step
    # escalation window of one value a step, within the 8 rows (4,000 steps) the Monitor's policy covers there
    assert ts.Monitor().policy.config() == EventPolicy().config()
    mon = ts.Monitor(log_every=500)
    assert mon.policy.config() == EventPolicy.for_interval(500).config()
    spikes = [ev(s, Kind.LOSS_SPIKE, signal="loss") for s in (5_000, 6_500, 8_000)]
    sparse = [kept for e in spikes for kept in mon.policy.apply([e], e.step, 1.0 + e.step / 1e4)]
    assert [e.severity for e in sparse] == ["warning", "warning", "critical"]
    dense = EventPolicy()
    assert [kept.severity for e in spikes for kept in dense.apply([e], e.step, 1.0 + e.step / 1e4)] == ["warning"] * 3
    with pytest.raises(ValueError, match="every"):
        EventPolicy.for_interval(0)
