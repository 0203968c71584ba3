"""The divergence hold: a run whose loss stays up after a divergence is not ``healthy`` again.

The status leaves ``diverging`` once ``recovery`` steps passed since the last such event *and* the
loss's level is back within 10 % of its level before the onset (``trainsignals.policy``, rule 4).
The streaming Monitor, its batch path and the report's status timeline give the same answer.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.io.report import status_timeline
from trainsignals.policy import NO_HOLD, RECOVERED, EventPolicy, hold_sweep


def decaying(n: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(n)
    return (2.0 * np.exp(-t / 300) + 0.2) * np.exp(rng.normal(0, 0.03, n))


def diverging_then(n: int, seed: int, back_at: int | None) -> np.ndarray:
    """A decaying loss that climbs 2 % a step from step 800 up to 200x, then (``back_at``) drops back."""
    loss = decaying(n, seed)
    t = np.arange(n)
    loss[800:] *= np.minimum(1.02 ** (t[800:] - 800), 200.0)
    if back_at is not None:
        loss[back_at:] = decaying(n, seed + 1)[back_at:]
    return loss


def stream(loss: np.ndarray, mon: ts.Monitor) -> list[str]:
    out = []
    for x in loss:
        mon.update(loss=float(x), grad_norm=1.0)
        out.append(mon.status)
    return out


def changes(statuses: list[str]) -> list[tuple[int, str]]:
    return [(i, s) for i, s in enumerate(statuses) if i == 0 or statuses[i - 1] != s]


@pytest.mark.parametrize("seed", [11, 12])
def test_a_loss_that_stays_up_keeps_the_run_diverging(seed: int) -> None:
    n = 2400
    mon = ts.Monitor(total_steps=n)
    st = stream(diverging_then(n, seed, None), mon)
    div = [e for e in mon.events if e.kind == ts.Kind.DIVERGENCE]
    assert div and 800 <= div[0].step < 900
    last = max(e.step for e in mon.events if ts.status.state_of(e) == "diverging")
    assert n - 1 - last > mon.recovery_steps  # past the recovery: the hold alone keeps it
    assert set(st[div[0].step:]) == {"diverging"} and mon.status == "diverging"
    assert mon.policy.holding


@pytest.mark.parametrize("seed", [13, 14])
def test_a_loss_that_comes_back_ends_the_hold(seed: int) -> None:
    n = 2400
    mon = ts.Monitor(total_steps=n)
    st = stream(diverging_then(n, seed, 1300), mon)
    last = max(e.step for e in mon.events if ts.status.state_of(e) == "diverging")
    assert st[-1] == "healthy" and not mon.policy.holding
    back = changes(st)[-1][0]  # healthy again: after the recovery, and only once the loss came back
    assert back >= max(last + mon.recovery_steps, 1300)


def test_a_healthy_run_never_holds() -> None:
    mon = ts.Monitor(total_steps=3000)
    st = stream(decaying(3000, 5), mon)
    assert "diverging" not in st and not mon.policy.holding


def test_without_a_loss_level_the_recovery_rule_alone() -> None:
    # a divergence event given from outside, with no loss before its onset: no level to come back to
    mon = ts.Monitor()
    ev = ts.make_event(ts.Kind.DIVERGENCE, "critical", 5, 0, "Mine", "loss", 2.0, 1.0, "up")
    for s in range(400):
        mon.update(step=s, events=[ev] if s == 5 else None)
    assert not mon.policy.holding and mon.status == "warming_up"


@pytest.mark.parametrize(("seed", "back_at", "chunks"), [(21, None, 3), (22, 1500, 7), (23, 1100, 1)])
def test_scan_and_the_report_timeline_agree_with_streaming(seed: int, back_at: int | None, chunks: int) -> None:
    n = 2600
    loss = diverging_then(n, seed, back_at)
    loss[1000:1004] = np.nan  # a non-finite stretch inside the climb
    mon = ts.Monitor(total_steps=n)
    st = stream(loss, mon)
    batch = ts.Monitor(total_steps=n)
    cuts = np.sort(np.random.default_rng(seed).choice(np.arange(1, n), chunks - 1, replace=False)) if chunks > 1 else []
    for part in np.split(np.arange(n), cuts):
        batch.scan(step=part, loss=loss[part], grad_norm=np.ones(len(part)))
        assert batch.status == st[int(part[-1])]
    assert batch.state_dict() == mon.state_dict()
    timeline = status_timeline(mon.events, np.arange(n), loss, warmup=mon.warmup, recovery=mon.recovery_steps)
    assert timeline == changes(st)


def test_the_hold_survives_a_snapshot_and_old_snapshots_load() -> None:
    n = 2400
    loss = diverging_then(n, 31, None)
    mon = ts.Monitor(total_steps=n)
    stream(loss[:1500], mon)
    assert mon.policy.holding
    state = mon.state_dict()
    again = ts.Monitor(total_steps=n)
    again.load_state_dict(state)
    assert again.policy.holding and again.status == "diverging"
    assert pickle.loads(pickle.dumps(mon)).policy.holding
    del state["monitor"]["policy"]["hold"]  # a snapshot written before the hold: none open
    older = ts.Monitor(total_steps=n)
    older.load_state_dict(state)
    assert not older.policy.holding
    with pytest.raises(ValueError, match="policy state keys differ"):
        EventPolicy().load_state_dict({**EventPolicy().state_dict(), "extra": 1})


def test_a_critical_loss_spike_is_a_diverging_status_a_warning_is_not() -> None:
    for severity, want in (("warning", "healthy"), ("critical", "diverging")):
        spike = ts.make_event(ts.Kind.LOSS_SPIKE, severity, 30, 30, "Mine", "loss", 9.0, 6.0, "spike")
        mon = ts.Monitor(suite={})
        for s in range(40):
            mon.update(step=s, loss=1.0, events=[spike] if s == 30 else None)
        assert mon.status == want


def open_after(changes: list[tuple[int, bool]], horizon: int) -> list[bool]:
    """Whether a hold is open after each step below ``horizon``, from where it opened and closed."""
    state, out, k = False, [], 0
    for s in range(horizon):
        while k < len(changes) and changes[k][0] <= s:
            state = changes[k][1]
            k += 1
        out.append(state)
    return out


def oracle(marks: list[tuple[int, float]], losses: list[tuple[int, float]], horizon: int) -> list[bool]:
    """The rule as stated: each hold opens at its event's step and closes at the first loss of a later
    step whose level is at or below its threshold; a hold is open while any is.
    """
    ends = []
    for s, thr in marks:
        close = next((t for t, v in losses if t > s and v <= thr), None)
        ends.append((s, horizon if close is None else close))
    return [any(a <= t < b for a, b in ends) for t in range(horizon)]


@pytest.mark.parametrize("seed", range(60))
def test_the_sweep_and_the_streaming_path_follow_the_stated_rule(seed: int) -> None:
    rng = np.random.default_rng(seed)
    steps = np.sort(rng.integers(0, 60, rng.integers(0, 40)))  # repeated steps too
    levels = rng.normal(0, 1, len(steps))
    marks = [(int(s), float(rng.normal(0, 1))) for s in np.sort(rng.integers(0, 60, rng.integers(0, 6)))]
    losses = list(zip(steps.tolist(), levels.tolist(), strict=True))
    want = oracle(marks, losses, 61)
    hold, got = hold_sweep(NO_HOLD, marks, steps, levels)
    assert open_after(got, 61) == want
    assert (hold != NO_HOLD) == want[-1]
    assert math.isclose(RECOVERED, math.log(1.1))


@pytest.mark.parametrize("seed", range(30))
def test_the_streaming_policy_follows_the_stated_rule(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    logs = rng.normal(0, 0.5, 80)
    has_loss = rng.random(80) < 0.7
    ev_steps = set(rng.integers(1, 80, rng.integers(1, 5)).tolist())
    pol, seen, marks, losses, lev = EventPolicy(), [], [], [], None
    for s in range(80):
        evs = [ts.make_event(ts.Kind.DIVERGENCE, "critical", s, s, "Mine", "loss", 2.0, 1.0, "up")] \
            if s in ev_steps else []
        if evs and lev is not None:
            marks.append((s, lev + RECOVERED))  # the level before the onset (this step), back within 10 %
        if has_loss[s]:
            lev = float(logs[s]) if lev is None else 0.1 * float(logs[s]) + 0.9 * lev
            losses.append((s, lev))
        pol.apply(evs, s, math.exp(logs[s]) if has_loss[s] else math.nan)
        seen.append(pol.holding)
    want = oracle(marks, losses, 80)
    assert seen == want
