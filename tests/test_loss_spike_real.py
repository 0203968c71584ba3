"""The spike rules on the real-run suite (``datasets/real``).

The real loss-spike runs are small PyTorch trainings fed one bad batch (or a few) at the onset:
the loss jumps far above anything the run produced recently, then comes back. Some of these
runs have a small loss with heavy-tailed minibatch noise (values from 0.007 to 0.4 around a
median of 0.05), whose log-space scale makes the z-score of even a 190x jump small: the peak
rule (``PeakRatioSpike``: a value ``peak_ratio`` times the largest of the previous ``window``
values) catches them. The rules run as the default suite configures them (``loss_spike``,
``loss_peak``, ``loss_shift`` and the grad-norm ``grad_explosion``, ``grad_peak``,
``grad_shift``), behind the Monitor's event policy: they must catch the loss-spike runs within
the bench's window after the onset, keep every healthy run quiet, raise nothing before the
onset of a faulty run, and keep catching the gradient explosions. Rates are asserted over the
suite, never per curve.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.curves import load_suite
from trainsignals.detectors import LevelShift, PeakRatioSpike
from trainsignals.eval.bench import default_window

sys.path.insert(0, str(Path(__file__).parent))
from test_scan_equivalence import close_events, close_state  # noqa: E402

LOSS_RULES = ("loss_spike", "loss_peak", "loss_shift")
GRAD_RULES = ("grad_explosion", "grad_peak", "grad_shift")


def monitor(names, drop=()):
    suite = ts.default_suite()
    return ts.Monitor(suite={n: suite[n] for n in names if n not in drop})


def loss_events(curve, drop=()):
    return [e for e in monitor(LOSS_RULES, drop).scan(loss=curve.loss, step=curve.steps) if e.severity != "info"]


def grad_events(curve):
    if curve.grad_norm is None:
        return []
    mon = monitor(GRAD_RULES)
    return [e for e in mon.scan(grad_norm=curve.grad_norm, loss=curve.loss, step=curve.steps) if e.severity != "info"]


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
    without = sum(caught(c, loss_events(c, drop=("loss_peak",)), "loss_spike") for c in runs)
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
    for curve in [c for c in real if c.kind in names and c.grad_norm is not None][::4]:
        ref = monitor(LOSS_RULES + GRAD_RULES)
        streamed = [e for x, g, s in zip(curve.loss.tolist(), curve.grad_norm.tolist(), curve.steps.tolist())
                    for e in ref.update(loss=x, grad_norm=g, step=s)]
        mon = monitor(LOSS_RULES + GRAD_RULES)
        batched = mon.scan(loss=curve.loss, grad_norm=curve.grad_norm, step=curve.steps)
        assert close_events(streamed, batched), curve.name
        assert close_state(ref.state_dict(), mon.state_dict()), curve.name


def heavy_tailed(seed, n=1500):
    """Heavy-tailed log noise (Student t, 2 dof) with jumps of 5-50x either way, some early."""
    rng = np.random.default_rng(seed)
    x = 0.05 * np.exp(0.8 * rng.standard_t(2, n))
    for at in rng.choice(np.arange(25, n), 12, replace=False):
        x[at] = x[at] * rng.uniform(5, 50) ** rng.choice([-1, 1])
    x[rng.choice(n, 5)] = np.nan
    return x, sorted(rng.choice(np.arange(1, n), 4, replace=False).tolist()), rng


@pytest.mark.parametrize("seed", range(5000, 5004))
@pytest.mark.parametrize("make", [
    lambda rng: PeakRatioSpike(window=int(rng.choice([1, 30, 100])), cooldown=int(rng.choice([0, 10]))),
    lambda rng: PeakRatioSpike(min_ratio=3.0),
    lambda rng: LevelShift(hold=int(rng.choice([2, 10]))),
], ids=["peak", "peak-level", "shift"])
def test_peak_rules_scan_equals_streaming(make, seed):
    x, cut, rng = heavy_tailed(seed)
    n = len(x)
    proto = make(rng)
    ref = proto.clone()
    streamed = [e for t in range(n) for e in ref.update(loss=float(x[t]), step=t)]
    det = proto.clone()
    batched = []
    for lo, hi in zip([0, *cut], [*cut, n]):
        batched += det.scan(loss=x[lo:hi], steps=np.arange(lo, hi))
    if isinstance(proto, PeakRatioSpike) and proto.min_ratio == 1.0:
        assert streamed
    assert close_events(streamed, batched)
    assert close_state(ref.state_dict(), det.state_dict())


def test_peak_rule_state_round_trips():
    x = 0.05 * np.exp(0.8 * np.random.default_rng(5000).standard_t(2, 400))
    det = PeakRatioSpike(window=50)
    det.scan(loss=x)
    clone = PeakRatioSpike(window=50)
    clone.load_state_dict(det.state_dict())
    assert clone.state_dict() == det.state_dict()
    spike = 20.0 * float(x[-50:].max())
    assert [e.step for e in det.scan(loss=[spike], steps=[400])] == [400]
    assert [e.step for e in clone.scan(loss=[spike], steps=[400])] == [400]


@pytest.mark.parametrize("kw, name", [
    ({"peak_ratio": 1.0}, "peak_ratio"),
    ({"peak_ratio": 0.5}, "peak_ratio"),
    ({"window": 0}, "window"),
    ({"window": 2.5}, "window"),
    ({"min_ratio": 0.5}, "min_ratio"),
])
def test_bad_peak_config_names_the_parameter(kw, name):
    with pytest.raises(ValueError, match=name):
        PeakRatioSpike(**kw)
