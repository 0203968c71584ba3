"""The baselines on tiny hand-made curves whose answers are worked out by hand."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pytest

from trainsignals.eval.baselines import (
    Alarm,
    Baseline,
    LightningEarlyStopping,
    NaNStop,
    RiverADWIN,
    RiverPageHinkley,
    ZClip,
    default_baselines,
)


@dataclass
class Run:
    """Just the attributes the baselines read."""

    loss: np.ndarray | None = None
    grad_norm: np.ndarray | None = None
    val_steps: np.ndarray | None = None
    val_loss: np.ndarray | None = None
    steps: np.ndarray | None = None


# --------------------------------------------------------------------------- NaN stop


def test_nan_stop_stops_at_first_nan() -> None:
    loss = np.array([3.0, 2.0, 1.5, np.nan, 1.0, np.nan])
    assert NaNStop().run(Run(loss=loss)) == [Alarm(3, "nonfinite")]


def test_nan_stop_fires_on_inf_too_and_uses_steps() -> None:
    loss = np.array([3.0, np.inf, np.nan])
    assert NaNStop().run(Run(loss=loss, steps=np.array([10, 11, 12]))) == [Alarm(11, "nonfinite")]
    assert NaNStop().run(Run(loss=np.array([3.0, -np.inf]))) == [Alarm(1, "nonfinite")]


def test_nan_stop_quiet_on_finite_or_missing_loss() -> None:
    assert NaNStop().run(Run(loss=np.linspace(5, 1, 100))) == []
    assert NaNStop().run(Run()) == []


# --------------------------------------------------------------------------- Lightning


def test_lightning_patience_counts_checks_without_improvement() -> None:
    # best: 1.0 (s0), 0.8 (s10); 0.9 wait 1; 0.8 ties best -> no improvement, wait 2;
    # 0.7 improves -> wait 0; 0.75, 0.71, 0.72 -> waits 1, 2, 3 -> stop at step 70.
    val = np.array([1.0, 0.8, 0.9, 0.8, 0.7, 0.75, 0.71, 0.72, 0.1])
    run = Run(val_steps=np.arange(0, 90, 10), val_loss=val)
    assert LightningEarlyStopping(monitor="val_loss", patience=3).run(run) == [Alarm(70, "overfitting")]
    # patience 4 waits one more check, and the 0.1 at step 80 is an improvement: never stops.
    assert LightningEarlyStopping(monitor="val_loss", patience=4).run(run) == []


def test_lightning_min_delta_an_improvement_must_exceed_it() -> None:
    # min_delta 0.1: 1.0 best; 0.9 improves by exactly 0.1 -> not an improvement (wait 1);
    # 0.95 -> wait 2 -> stop with patience 2 at step 2.
    run = Run(val_steps=np.arange(3), val_loss=np.array([1.0, 0.9, 0.95]))
    assert LightningEarlyStopping(monitor="val_loss", patience=2, min_delta=0.1).run(run) == [
        Alarm(2, "overfitting")
    ]
    # 0.89 improves by 0.11 > 0.1: best 0.89; 0.85 is not below 0.79: wait 1 < patience 2.
    run = Run(val_steps=np.arange(3), val_loss=np.array([1.0, 0.89, 0.85]))
    assert LightningEarlyStopping(monitor="val_loss", patience=2, min_delta=0.1).run(run) == []


def test_lightning_check_finite() -> None:
    run = Run(val_steps=np.array([25, 50, 75]), val_loss=np.array([1.0, math.inf, 0.5]))
    assert LightningEarlyStopping(monitor="val_loss").run(run) == [Alarm(50, "nonfinite")]
    # Without check_finite an inf is simply no improvement (patience 3 is not reached).
    assert LightningEarlyStopping(monitor="val_loss", check_finite=False).run(run) == []


def test_lightning_train_loss_cadence_and_stall_kind() -> None:
    # Checks after steps 49, 99, 149, ...: loss 1.0 everywhere except a falling start.
    loss = np.ones(400)
    loss[:60] = np.linspace(2.0, 1.0, 60)
    # check values: s49 > 1.0 (best), s99 = 1.0 (improves), s149 1.0 wait1, s199 wait2, s249 wait3.
    es = LightningEarlyStopping(monitor="loss", patience=3, check_every=50)
    assert es.run(Run(loss=loss)) == [Alarm(249, "stall")]


def test_lightning_train_loss_only_sees_the_check_steps() -> None:
    # A NaN between checks is never seen; one at a check step is.
    loss = np.linspace(2.0, 1.0, 200)
    loss[60] = np.nan
    es = LightningEarlyStopping(monitor="loss", patience=10, check_every=50)
    assert es.run(Run(loss=loss)) == []
    loss[99] = np.nan
    assert es.run(Run(loss=loss)) == [Alarm(99, "nonfinite")]


def test_lightning_divergence_factor_and_threshold() -> None:
    # initial loss 2.0 -> threshold 20; the loss grows x1.05 per step from step 100.
    loss = np.full(300, 2.0)
    loss[100:] = 2.0 * 1.05 ** np.arange(1, 201)
    first_above = int(np.argmax(loss > 20.0))  # 147
    es = LightningEarlyStopping(monitor="loss", patience=100, check_every=10, divergence_factor=10.0)
    expected = next(s for s in range(300) if (s + 1) % 10 == 0 and loss[s] > 20.0)
    assert expected >= first_above
    assert es.run(Run(loss=loss)) == [Alarm(expected, "divergence")]
    es = LightningEarlyStopping(monitor="loss", patience=100, check_every=10, divergence_threshold=20.0)
    assert es.run(Run(loss=loss)) == [Alarm(expected, "divergence")]


def test_lightning_stopping_threshold_stops_without_alarm() -> None:
    run = Run(val_steps=np.arange(6), val_loss=np.array([1.0, 0.5, 0.05, 2.0, 2.0, 2.0]))
    assert LightningEarlyStopping(monitor="val_loss", stopping_threshold=0.1).run(run) == []
    assert LightningEarlyStopping(monitor="val_loss").run(run) == [Alarm(5, "overfitting")]


def test_lightning_mode_max_mirrors_min() -> None:
    run = Run(val_steps=np.arange(5), val_loss=np.array([0.1, 0.3, 0.2, 0.25, 0.3]))
    assert LightningEarlyStopping(monitor="val_loss", mode="max", patience=3).run(run) == [
        Alarm(4, "overfitting")
    ]


def test_lightning_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError, match="patience"):
        LightningEarlyStopping(patience=0)
    with pytest.raises(ValueError, match="monitor"):
        LightningEarlyStopping(monitor="acc")
    with pytest.raises(ValueError, match="divergence_factor"):
        LightningEarlyStopping(divergence_factor=10.0, divergence_threshold=5.0)


# --------------------------------------------------------------------------- ZClip


def _alternating(n: int) -> np.ndarray:
    # mean 1.1, population std 0.1 exactly over any even-length prefix
    return np.tile([1.0, 1.2], n // 2)


def test_zclip_recurrence_by_hand() -> None:
    # warm-up 4: [1.0, 1.2, 1.0, 1.2] -> m = 1.1, v = 0.01 (population), std 0.1.
    # step 4: 1.34 -> z = 0.24 / 0.1 = 2.4 -> quiet, learnt as is:
    #   m = 0.97 * 1.1 + 0.03 * 1.34 = 1.1072
    #   v = 0.97 * 0.01 + 0.03 * (1.34 - 1.1072) ** 2 = 0.011325...
    # step 5: 1.4 -> z = (1.4 - 1.1072) / sqrt(v) = 2.75 -> spike.
    m, v = 1.1072, 0.97 * 0.01 + 0.03 * (1.34 - 1.1072) ** 2
    z5 = (1.4 - m) / (math.sqrt(v) + 1e-6)
    assert 2.7 < z5 < 2.8
    g = np.array([1.0, 1.2, 1.0, 1.2, 1.34, 1.4])
    assert ZClip(warmup=4).run(Run(grad_norm=g)) == [Alarm(5, "grad_explosion")]
    # The spike is learnt as c = m + 2.5 * std / (z / 2.5), not as 1.4. A 7th value just
    # below the spike threshold of the clipped statistics stays quiet; just above fires.
    c = m + 2.5 * math.sqrt(v) / (z5 / 2.5)
    m6 = 0.97 * m + 0.03 * c
    v6 = 0.97 * v + 0.03 * (c - m6) ** 2
    edge = m6 + 2.5 * (math.sqrt(v6) + 1e-6)
    quiet = np.r_[g, edge - 1e-4]
    loud = np.r_[g, edge + 1e-4]
    assert ZClip(warmup=4).run(Run(grad_norm=quiet)) == [Alarm(5, "grad_explosion")]
    assert ZClip(warmup=4).run(Run(grad_norm=loud)) == [
        Alarm(5, "grad_explosion"),
        Alarm(6, "grad_explosion"),
    ]


def test_zclip_fires_on_100x_jump_after_warmup_not_during() -> None:
    g = _alternating(100)
    g_warm = g.copy()
    g_warm[10] *= 100  # during warm-up: only fills the buffer
    assert ZClip().run(Run(grad_norm=g_warm)) == []
    g_after = g.copy()
    g_after[60] *= 100
    assert ZClip().run(Run(grad_norm=g_after)) == [Alarm(60, "grad_explosion")]


def test_zclip_spike_does_not_inflate_the_statistics() -> None:
    # Two 100x spikes in a row: the first is clipped before it updates the EWMA,
    # so the second is still a spike.
    g = _alternating(100)
    g[60] = g[61] = 110.0
    assert ZClip().run(Run(grad_norm=g)) == [Alarm(60, "grad_explosion"), Alarm(61, "grad_explosion")]


def test_zclip_nonfinite_grad_norms() -> None:
    g = _alternating(60)
    g[40] = np.inf
    g[45] = np.nan
    g[5] = np.inf  # during warm-up: skipped
    assert ZClip().run(Run(grad_norm=g)) == [Alarm(40, "grad_explosion")]


def test_zclip_quiet_on_steady_norms_and_missing_signal() -> None:
    assert ZClip().run(Run(grad_norm=_alternating(500))) == []
    assert ZClip().run(Run(loss=np.ones(10))) == []


def test_zclip_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError, match="alpha"):
        ZClip(alpha=1.5)
    with pytest.raises(ValueError, match="warmup"):
        ZClip(warmup=1)


# --------------------------------------------------------------------------- river


@pytest.mark.parametrize("cls", [RiverPageHinkley, RiverADWIN])
def test_river_fires_on_level_shift_up_as_divergence(cls: type) -> None:
    pytest.importorskip("river")
    loss = np.r_[np.full(300, 1.0), np.full(300, 11.0)]
    alarms = cls().run(Run(loss=loss))
    assert alarms, "a 10-unit level shift must be detected"
    assert 300 <= alarms[0].step < 400
    assert alarms[0].kind == "divergence"


@pytest.mark.parametrize("cls", [RiverPageHinkley, RiverADWIN])
def test_river_fires_on_level_shift_down_as_stall(cls: type) -> None:
    pytest.importorskip("river")
    loss = np.r_[np.full(300, 11.0), np.full(300, 1.0)]
    alarms = cls().run(Run(loss=loss))
    assert alarms and 300 <= alarms[0].step < 400
    assert alarms[0].kind == "stall"


@pytest.mark.parametrize("cls", [RiverPageHinkley, RiverADWIN])
def test_river_quiet_on_constant_series_and_skips_nonfinite(cls: type) -> None:
    pytest.importorskip("river")
    assert cls().run(Run(loss=np.full(1000, 2.5))) == []
    loss = np.full(500, 2.5)
    loss[[10, 200, 201]] = [np.nan, np.inf, -np.inf]
    assert cls().run(Run(loss=loss)) == []


def test_river_page_hinkley_exact_step() -> None:
    pytest.importorskip("river")
    # Same as the docstring: deterministic for a noiseless step.
    loss = np.r_[np.full(100, 1.0), np.full(100, 11.0)]
    assert RiverPageHinkley().run(Run(loss=loss)) == [Alarm(105, "divergence")]


# --------------------------------------------------------------------------- the bench set


def test_default_baselines_follow_the_protocol() -> None:
    bases = default_baselines()
    names = [b.name for b in bases]
    assert len(set(names)) == len(names)
    assert names == [
        "nan-stop",
        "lightning-es(val_loss)",
        "lightning-es(loss)",
        "river-ph",
        "river-adwin",
        "zclip",
    ]
    for b in bases:
        assert isinstance(b, Baseline)
        b.reset()
        assert b.run(Run()) == []
        assert repr(b)


def test_alarm_repr_and_equality() -> None:
    assert repr(Alarm(3, "stall")) == "Alarm(step=3, kind='stall')"
    assert repr(Alarm(3, "stall", 1)) == "Alarm(step=3, kind='stall', onset_step=1)"
    assert Alarm(3, "stall") != Alarm(3, "stall", 1)
