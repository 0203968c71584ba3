"""Losses that go below zero (policy losses, the NLL of a continuous density): spikes and lost progress are
named, healthy runs stay quiet.

The curves are drawn here with fresh seeds; no threshold was chosen on them (the signed rules,
:class:`trainsignals.SignedZSpike` and :class:`trainsignals.SignedLostProgress`, keep the settings of
:class:`trainsignals.EWMAZSpike` and :class:`trainsignals.LostProgress`).
"""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts

N = 1500
SEEDS = range(9100, 9112)
ALARMS = ("warning", "critical")


def signed_run(seed: int, shape: str) -> np.ndarray:
    """A healthy signed loss: ``policy`` falls from -0.2 to about -2 (a negated return), ``nll`` falls from
    +1.5 through 0 to about -1.5 (a density's NLL); with Gaussian noise, its scale changing along the run,
    and a slow AR(1) wander of the level (batches of one stretch of data). A heavy-tailed draw would
    hold values a dozen scales out: spikes by any rule's account (the log rule flags them on a positive loss).
    """
    rng = np.random.default_rng(seed)
    t = np.arange(N)
    sd = 0.03 * (1.0 + 0.5 * np.sin(t / rng.uniform(80, 300)))
    wander = np.zeros(N)
    for i in range(1, N):
        wander[i] = 0.98 * wander[i - 1] + 0.2 * rng.normal()
    noise = rng.normal(size=N) + 0.3 * wander
    if shape == "policy":
        level = -0.2 - 1.8 * (1 - np.exp(-t / rng.uniform(200, 600)))
    else:
        level = 1.5 - 3.0 * (1 - np.exp(-t / rng.uniform(300, 700)))
    return level + sd * noise


def spiked(seed: int, shape: str) -> tuple[np.ndarray, int]:
    """The same run with one bad batch: the loss jumps by 2..10 of its own magnitudes (at least 0.5) for 1..3 steps."""
    rng = np.random.default_rng(seed + 50_000)
    loss = signed_run(seed, shape)
    at = int(rng.integers(N // 3, N - 200))
    size = max(0.5, rng.uniform(2.0, 10.0) * abs(float(np.median(loss[at - 50:at]))))
    loss[at:at + int(rng.integers(1, 4))] += size
    return loss, at


def alarms(loss: np.ndarray, **settings: object) -> list[ts.Event]:
    return [e for e in ts.Monitor(total_steps=N, **settings).scan(loss=loss) if e.severity in ALARMS]


@pytest.mark.parametrize("shape", ["policy", "nll"])
def test_healthy_signed_losses_raise_nothing(shape: str) -> None:
    loud = {seed: [(e.kind.value, e.step, e.detector) for e in alarms(signed_run(seed, shape))] for seed in SEEDS}
    assert {s: ev for s, ev in loud.items() if ev} == {}


@pytest.mark.parametrize("shape", ["policy", "nll"])
def test_a_spike_of_a_signed_loss_is_named_at_its_step(shape: str) -> None:
    for seed in SEEDS:
        loss, at = spiked(seed, shape)
        got = [(e.kind.value, e.step) for e in alarms(loss)]
        assert got and got[0] == ("loss_spike", at), (seed, got)


def collapsed(seed: int, kind: str) -> tuple[np.ndarray, int]:
    """A ``policy`` run whose return collapses at a drawn step: it steps back by 60..100 % of the progress made
    (``step``) or climbs there over 20..60 steps (``climb``), and stays."""
    rng = np.random.default_rng(seed + 70_000)
    loss = signed_run(seed, "policy")
    at = int(rng.integers(N // 3, N - 300))
    progress = float(np.median(loss[:20]) - np.median(loss[at - 50:at]))
    back = rng.uniform(0.6, 1.0) * progress
    ramp = 1 if kind == "step" else int(rng.integers(20, 61))
    loss[at:] += back * np.minimum((np.arange(N - at) + 1) / ramp, 1.0)
    return loss, at


@pytest.mark.parametrize("kind", ["step", "climb"])
def test_a_signed_loss_that_loses_its_progress_is_a_divergence_within_the_window(kind: str) -> None:
    window = max(50, N // 10)
    for seed in SEEDS:
        loss, at = collapsed(seed, kind)
        got = [(e.kind.value, e.step) for e in alarms(loss)]
        div = [st for k, st in got if k == "divergence"]
        assert div and at <= div[0] <= at + window, (seed, at, got)
        # before it at most the jump itself, seen by the spike rule (as for a positive loss)
        assert all(k == "loss_spike" and at <= st for k, st in got if st < div[0]), (seed, at, got)


def zero_by_design(seed: int) -> np.ndarray:
    """A policy loss that sits at zero by design (GRPO-style), logged to four decimals: most values are
    exactly 0.0 or -0.0, the rest a few rounding steps either side, heavy-tailed."""
    rng = np.random.default_rng(seed)
    return np.round(rng.standard_t(3, N) * 5e-5, 4)


@pytest.mark.parametrize("seed", [9301, 9302, 9303, 9304])
def test_a_loss_at_zero_by_design_has_no_progress_to_lose(seed: int) -> None:
    loss = zero_by_design(seed)
    assert (loss == 0.0).mean() > 0.5 and (loss < 0.0).any()
    det = ts.SignedLostProgress()
    assert det.scan(loss=loss) == []
    first = int(np.flatnonzero(loss < 0.0)[0])  # from it on, blocks of 20 second differences make the noise scale
    assert det.state_dict()["state"]["ncount"] == (N - first - 2) // 20
    # streamed, the same: the run's noise scale is kept value by value
    streamed = ts.SignedLostProgress()
    assert [e for x in loss.tolist() for e in streamed.update(loss=x)] == []
    assert streamed.state_dict() == det.state_dict()
    # a real loss of progress on that scale is still one: the loss climbs 20 of its noise scales and stays
    climbed = loss - np.where(np.arange(N) < 700, np.linspace(0.0, 0.01, N), 0.0)
    ev = ts.SignedLostProgress().scan(loss=climbed)
    assert ev and 700 <= ev[0].step <= 760 and ev[0].kind.value == "divergence"
    # and still one after a bad batch at 1e10 early on: a spike does not raise the noise scale for good
    climbed[150:152] = 1e10
    assert [e.step for e in ts.SignedLostProgress().scan(loss=climbed) if e.step >= 700][:1] == [ev[0].step]


def test_the_log_rule_alone_misses_a_negative_loss_spike() -> None:
    """What the signed rules add: without them the default suite says nothing about the spike or the collapse."""
    loss, at = spiked(SEEDS[0], "policy")
    assert alarms(loss, loss_spike_signed=False) == []
    assert [e.detector for e in alarms(loss)] == ["SignedZSpike"]
    loss, at = collapsed(SEEDS[0], "climb")
    assert alarms(loss, lost_progress_signed=False) == []
    assert alarms(loss)[0].detector == "SignedLostProgress"


def test_positive_losses_never_wake_the_signed_rule() -> None:
    """On a positive loss (zeros included) the rule is idle: the suite's events are those without it."""
    rng = np.random.default_rng(9200)
    loss = np.exp(-np.arange(N) / 400) * np.exp(rng.normal(0, 0.05, N)) + 0.05
    loss[700] *= 6.0
    loss[900:960] = 0.0
    for det in (ts.SignedZSpike(), ts.SignedLostProgress()):
        assert det.scan(loss=loss) == [] and det.state_dict()["state"]["signed"] is False
    with_rule = [e.to_dict() for e in ts.Monitor(total_steps=N).scan(loss=loss)]
    without = ts.Monitor(total_steps=N, loss_spike_signed=False, lost_progress_signed=False)
    assert with_rule == [e.to_dict() for e in without.scan(loss=loss)]
    assert ("loss_spike", 700) in [(e["kind"], e["step"]) for e in with_rule]


@pytest.mark.parametrize("cls", [ts.SignedZSpike, ts.SignedLostProgress])
def test_the_rule_wakes_at_the_first_finite_negative_value(cls: type) -> None:
    det = cls()
    for s, v in enumerate([1.0, 0.0, float("-inf"), float("nan"), 0.5]):
        assert det.update(step=s, loss=v) == []
    assert det.state_dict()["state"]["signed"] is False
    det.update(step=5, loss=-0.5)
    assert det.state_dict()["state"]["signed"] is True
