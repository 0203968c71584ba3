"""The one-rule spike detectors on fresh synthetic curves (seeds >= 5000: no threshold was chosen on them).

Each rule, configured as the default suite configures it, must catch the failures it is for within
the bench's window, raise nothing before the onset, and stay quiet on healthy curves. Rates are
asserted over 30 curves per case, never per curve.
"""

from __future__ import annotations

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.curves import generate
from trainsignals.eval.bench import default_window

SEEDS = range(5000, 5030)
SIGNAL = {"loss_spike": "loss", "loss_peak": "loss", "loss_shift": "loss",
          "grad_explosion": "grad_norm", "grad_peak": "grad_norm", "grad_shift": "grad_norm"}


def rates(name: str, kind: str, difficulty: str) -> tuple[float, float]:
    """(share of curves caught within the window after the onset, share with an event before it)."""
    caught = early = 0
    for seed in SEEDS:
        c = generate(kind, seed, difficulty)
        evs = ts.default_suite()[name].scan(**{SIGNAL[name]: getattr(c, SIGNAL[name])})
        hi = c.onset_step + default_window(kind, c.total_steps)
        caught += any(c.onset_step <= e.step < hi for e in evs)
        early += any(e.step < c.onset_step for e in evs)
    return caught / len(SEEDS), early / len(SEEDS)


@pytest.mark.parametrize(("name", "kind", "difficulty", "least"), [
    ("loss_spike", "loss_spike", "easy", 0.9),
    ("loss_spike", "loss_spike", "hard", 0.9),
    ("grad_explosion", "grad_explosion", "medium", 0.9),
    ("grad_explosion", "grad_explosion", "hard", 0.9),
    ("grad_peak", "grad_explosion", "easy", 0.9),   # the one-value rule asks for 100x: the easy ones
    ("grad_shift", "grad_explosion", "medium", 0.8),
    ("loss_shift", "divergence", "easy", 0.5),
])
def test_each_rule_catches_its_failures_within_the_window(name, kind, difficulty, least):
    caught, early = rates(name, kind, difficulty)
    assert caught >= least, caught
    assert early <= 0.05, early


@pytest.mark.parametrize("name", sorted(SIGNAL))
@pytest.mark.parametrize("difficulty", ["medium", "hard"])
def test_each_rule_is_quiet_on_healthy_curves(name, difficulty):
    loud = [seed for seed in SEEDS
            if ts.default_suite()[name].scan(**{SIGNAL[name]: getattr(generate("healthy", seed, difficulty),
                                                                         SIGNAL[name])})]
    assert len(loud) / len(SEEDS) <= 0.05, loud


def test_a_spike_that_comes_back_is_not_a_level_shift():
    quiet = [not ts.default_suite()["loss_shift"].scan(loss=generate("loss_spike", seed, "easy").loss)
             for seed in SEEDS]
    assert np.mean(quiet) >= 0.95


def small_noisy_loss(seed: int, n: int = 400) -> tuple[np.ndarray, int]:
    """A small loss whose minibatch noise spans decades in log space, and one bad batch."""
    rng = np.random.default_rng(seed)
    x = 0.05 * np.exp(rng.normal(0, 1.0, n))
    at = int(rng.integers(150, 350))
    x[at] = 8.0 * x[at - 100:at].max()
    return x, at


def test_the_peak_rule_catches_the_bad_batch_the_z_score_under_rates():
    peak = z = 0
    for seed in SEEDS:
        x, at = small_noisy_loss(seed)
        peak += [e.step for e in ts.PeakRatioSpike().scan(loss=x)] == [at]
        z += any(e.step == at for e in ts.EWMAZSpike().scan(loss=x))
    assert peak / len(SEEDS) >= 0.9, peak
    assert z < peak, (z, peak)


def test_the_peak_rules_level_test_holds_back_a_small_jump():
    # a grad norm 6x its recent peak but only 6x its level: not a 10x explosion
    rng = np.random.default_rng(5000)
    g = np.exp(rng.normal(0, 0.05, 300))
    g[200] = 6.0 * g[100:200].max()
    assert [e.step for e in ts.PeakRatioSpike().scan(loss=g)] == [200]
    assert ts.PeakRatioSpike(min_ratio=10.0).scan(loss=g) == []


def test_after_alarm_behaviour_is_cooldown_steps_and_the_rules_own_re_arm():
    rng = np.random.default_rng(5001)
    x = np.exp(rng.normal(0, 0.02, 300))
    x[100] = x[104] = 50.0
    assert [e.step for e in ts.PeakRatioSpike(cooldown=0).scan(loss=x)] == [100]  # 104: 50 is the recent peak
    x[104] = 5000.0
    assert [e.step for e in ts.PeakRatioSpike(cooldown=0).scan(loss=x)] == [100, 104]
    assert [e.step for e in ts.PeakRatioSpike(cooldown=10).scan(loss=x)] == [100]
    # the z-rule's watch holds a second jump within hold values back, a cooldown in steps beyond it
    x = np.exp(rng.normal(0, 0.02, 300))
    x[100] = x[108] = x[115] = 50.0
    assert [e.step for e in ts.EWMAZSpike().scan(loss=x)] == [100, 115]
    assert [e.step for e in ts.EWMAZSpike(cooldown=20).scan(loss=x)] == [100]



def test_the_z_bar_rises_with_the_runs_own_record_of_noise():
    """Wobbles the run took back (z about 6, three times) raise the bar to half again their z-score.

    A value at z about 8.5 is a spike in a run that never wobbled, and one more wobble in a run
    that did; a value at z about 13 is a spike in both. The CUSUM sum of consecutive values must
    reach the same raised bar: two or three in a row at the wobbles' height are a jump in the run
    that never wobbled and one more wobble in the other; two at z about 6 are a jump in both
    (fresh noise, seed 5040).
    """
    rng = np.random.default_rng(5040)
    noise = 0.1 * rng.standard_normal(1000)
    wobbled = noise.copy()
    wobbled[[300, 500, 700]] = 0.55

    def steps(y: np.ndarray, value: float, n: int = 1) -> list[int]:
        y = y.copy()
        y[900:900 + n] = value
        return [e.step for e in ts.EWMAZSpike().scan(loss=2.0 * np.exp(y))]

    assert steps(noise, 0.8) == [900]
    assert steps(wobbled, 0.8) == []
    assert steps(wobbled, 1.2) == [900]
    for n in (2, 3):
        assert steps(noise, 0.55, n=n) == [901]
        assert steps(wobbled, 0.55, n=n) == []
    assert steps(wobbled, 0.6, n=2) == [901]


def test_heavy_tailed_noise_raises_the_bar_and_light_tailed_noise_does_not():
    """Fresh streams (seeds >= 5000): Gaussian log-noise leaves the bar at ``threshold`` (but in about one
    run in 100); Student-t (3 degrees of freedom) noise raises it, and a 20x bad batch still clears it.
    """
    from trainsignals.detectors._ewma_jump import RECORD

    raised_light = raised_heavy = 0
    for seed in range(5000, 5020):
        rng = np.random.default_rng(seed)
        level = np.log(2.0 * np.exp(-np.arange(2000) / 800) + 0.2)
        light, heavy = ts.EWMAZSpike(), ts.EWMAZSpike()
        assert light.scan(loss=np.exp(level + 0.05 * rng.standard_normal(2000))) == []
        raised_light += light.state_dict()["state"]["record"] * RECORD > light.threshold
        loss = np.exp(level + 0.05 * rng.standard_t(3, 2000))
        heavy.scan(loss=loss[:1500])
        raised_heavy += heavy.state_dict()["state"]["record"] * RECORD > heavy.threshold
        loss[1500] *= 20.0
        assert 1500 in [e.step for e in ts.EWMAZSpike().scan(loss=loss)]
    assert raised_light <= 1  # a z-score past threshold / RECORD: about 1 Gaussian run of 2,000 values in 100
    assert raised_heavy >= 15  # (a t(3) run may alarm on its wobbles before taking one back)


def test_the_first_value_of_a_two_value_spike_sets_no_record():
    """A value at z about 5.8 followed by a jump is the jump's start, not noise the run took back: a later
    lone spike at z about 8.2 still fires (had the first value set the record, the bar would be 8.6)."""
    rng = np.random.default_rng(5031)
    y = 0.1 * rng.standard_normal(900)
    y[300], y[301] = 0.64, 1.5  # z about 5.8 (not anomalous alone), then the jump
    y[700] = 0.62
    det = ts.EWMAZSpike()
    assert [e.step for e in det.scan(loss=2.0 * np.exp(y))] == [301, 700]
    assert det.state_dict()["state"]["record"] == 0.0
