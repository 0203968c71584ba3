"""EWMASpike's loss-spike rule on the real-run suite (``datasets/real``).

The real loss-spike runs are small PyTorch trainings fed one bad batch (or a few) at the onset:
the loss jumps far above anything the run produced recently, then comes back. Some of these
runs have a small loss with heavy-tailed minibatch noise (values from 0.007 to 0.4 around a
median of 0.05), whose log-space scale makes the z-score of even a 190x jump small: the peak
rule (a value ``peak_ratio`` times the largest of the previous ``peak_window`` values) catches
them. The detector runs as the Monitor configures it (``_DEFAULTS``); it must catch the
loss-spike runs within the bench's window after the onset, keep every healthy run quiet, raise
nothing before the onset of a faulty run, and keep the gradient-explosion configuration
(``GuardedEWMASpike`` on the gradient norm) as it was. Rates are asserted over the suite,
never per curve.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from trainsignals.curves import load_suite
from trainsignals.detectors import EWMASpike, GuardedEWMASpike
from trainsignals.eval.bench import default_window
from trainsignals.suite import default_settings

sys.path.insert(0, str(Path(__file__).parent))
from test_scan_equivalence import close_events, close_state  # noqa: E402


def loss_events(curve, **kw):
    cfg = {**default_settings("loss_spike"), **kw}
    return [e for e in EWMASpike(**cfg).scan(loss=curve.loss, steps=curve.steps) if e.severity != "info"]


def grad_events(curve, **kw):
    if curve.grad_norm is None:
        return []
    cfg = {**default_settings("grad_explosion"), **kw}
    return [e for e in GuardedEWMASpike(**cfg).scan(grad_norm=curve.grad_norm, loss=curve.loss, steps=curve.steps)
            if e.severity != "info"]


def caught(curve, evs, kind: str) -> bool:
    hi = curve.onset_step + default_window(kind, curve.total_steps)
    return any(curve.onset_step <= e.step < hi and e.kind.value == kind for e in evs)


@pytest.fixture(scope="module")
def real():
    return load_suite("datasets/real")


def test_real_loss_spike_runs_are_caught_within_the_window(real):
    runs = [c for c in real if c.kind == "loss_spike"]
    assert len(runs) >= 10
    rate = np.mean([caught(c, loss_events(c), "loss_spike") for c in runs])
    assert rate >= 0.9, rate


def test_the_peak_rule_catches_spikes_the_z_score_misses(real):
    runs = [c for c in real if c.kind == "loss_spike"]
    with_rule = sum(caught(c, loss_events(c), "loss_spike") for c in runs)
    without = sum(caught(c, loss_events(c, peak_ratio=None), "loss_spike") for c in runs)
    assert with_rule > without, (with_rule, without)


def test_healthy_real_runs_stay_quiet(real):
    healthy = [c for c in real if c.healthy]
    assert len(healthy) >= 100
    loud = [c.name for c in healthy if loss_events(c) or grad_events(c)]
    assert len(loud) / len(healthy) <= 0.03, loud


def test_no_event_before_the_onset_of_a_faulty_run(real):
    faulty = [c for c in real if not c.healthy]
    early = [c.name for c in faulty
             if any(e.step < c.onset_step for e in loss_events(c) + grad_events(c))]
    assert len(early) / len(faulty) <= 0.02, early


def test_real_gradient_explosions_are_still_caught(real):
    runs = [c for c in real if c.kind == "grad_explosion"]
    assert len(runs) >= 10
    rate = np.mean([caught(c, grad_events(c), "grad_explosion") for c in runs])
    assert rate >= 0.9, rate


def test_scan_equals_streaming_on_real_runs(real):
    names = {"loss_spike", "healthy", "grad_explosion", "divergence"}
    for curve in [c for c in real if c.kind in names][::4]:
        ref = EWMASpike(**default_settings("loss_spike"))
        streamed = [e for x, s in zip(curve.loss.tolist(), curve.steps.tolist())
                    for e in ref.update(loss=x, step=s)]
        det = EWMASpike(**default_settings("loss_spike"))
        batched = det.scan(loss=curve.loss, steps=curve.steps)
        assert close_events(streamed, batched), curve.name
        assert close_state(ref.state_dict(), det.state_dict()), curve.name


@pytest.mark.parametrize("direction", ["up", "down", "both"])
@pytest.mark.parametrize("seed", range(4))
def test_peak_rule_scan_equals_streaming(direction, seed):
    # heavy-tailed log noise (Student t, 2 dof) with jumps of 5-50x either way, some early
    rng = np.random.default_rng(seed)
    n = 1500
    x = 0.05 * np.exp(0.8 * rng.standard_t(2, n))
    for at in rng.choice(np.arange(25, n), 12, replace=False):
        x[at] = x[at] * rng.uniform(5, 50) ** rng.choice([-1, 1])
    cut = sorted(rng.choice(np.arange(1, n), 4, replace=False).tolist())
    kw = dict(direction=direction, peak_window=int(rng.choice([1, 30, 100])))
    ref = EWMASpike(**kw)
    streamed = [e for t in range(n) for e in ref.update(loss=float(x[t]), step=t)]
    det = EWMASpike(**kw)
    batched = []
    for lo, hi in zip([0, *cut], [*cut, n]):
        batched += det.scan(loss=x[lo:hi], steps=np.arange(lo, hi))
    assert any("largest" in e.message or "smallest" in e.message for e in streamed)
    assert close_events(streamed, batched)
    assert close_state(ref.state_dict(), det.state_dict())


def test_peak_rule_state_round_trips():
    x = 0.05 * np.exp(0.8 * np.random.default_rng(0).standard_t(2, 400))
    det = EWMASpike(peak_window=50)
    det.scan(loss=x)
    clone = EWMASpike(peak_window=50)
    clone.load_state_dict(det.state_dict())
    assert clone.state_dict() == det.state_dict()
    spike = 20.0 * float(x[-50:].max())
    assert [e.step for e in det.scan(loss=[spike], steps=[400])] == [e.step for e in clone.scan(loss=[spike], steps=[400])]


@pytest.mark.parametrize("kw, name", [
    ({"peak_ratio": 1.0}, "peak_ratio"),
    ({"peak_ratio": 0.5}, "peak_ratio"),
    ({"peak_window": 0}, "peak_window"),
    ({"peak_window": 2.5}, "peak_window"),
])
def test_bad_peak_config_names_the_parameter(kw, name):
    with pytest.raises(ValueError, match=name):
        EWMASpike(**kw)
