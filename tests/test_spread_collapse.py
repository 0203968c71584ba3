"""A regression's silent collapse: its predictions lose their spread while its loss keeps falling.

The curves here are drawn fresh from seeds no threshold was chosen on: each step's ``pred_spread``
is the standard deviation of a batch of predictions drawn around the spread the model has then
(rising from an untrained network's to the targets' own), so the batch-to-batch scatter is the
real one of a small batch, not a made-up noise level.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.detectors import SpreadCollapse

WINDOW = 60  # steps after the onset within which a collapse must be named (runs of 600 steps: 10 %)


def _run(seed: int, *, collapse_at: int | None = None, ramp: int = 1, n: int = 600, loss_up: bool = False):
    """``(pred_spread, loss)`` of a regression: batches of 8-64 predictions whose spread grows to
    about the targets', and, from ``collapse_at``, shrinks to 2 % of it over ``ramp`` steps."""
    rng = np.random.default_rng(seed)
    batch = int(rng.choice([8, 16, 32, 64]))
    t = np.arange(n)
    level = float(rng.uniform(0.2, 5.0))  # the targets' spread: its scale means nothing
    grow = float(rng.uniform(20, 200))
    spread = level * (1.0 - (1.0 - rng.uniform(0.02, 0.3)) * np.exp(-t / grow))
    spread *= np.exp(0.1 * np.sin(t / rng.uniform(30, 120)))  # a slow drift: the schedule, the data order
    loss = np.exp(-t / rng.uniform(150, 600)) * np.exp(rng.normal(0, 0.1, n))
    if collapse_at is not None:
        k = np.clip((t - collapse_at + 1) / ramp, 0.0, 1.0)
        spread = spread * np.exp(np.log(0.02) * k)
        if loss_up:  # the loss rising 5x as the answers go, and staying there: not silent
            loss = np.where(t < collapse_at, loss, loss[collapse_at] * rng.lognormal(0, 0.1, n)) * np.exp(np.log(5.0) * k)
    draws = rng.normal(0.0, 1.0, (n, batch)) * spread[:, None]
    return draws.std(axis=1), loss


@pytest.mark.parametrize("ramp", [1, 20, 40])
def test_a_collapse_is_named_within_the_window(ramp):
    named = 0
    for seed in range(9100, 9130):
        spread, loss = _run(seed, collapse_at=300, ramp=ramp)
        evs = SpreadCollapse().scan(pred_spread=spread, loss=loss)
        assert all(e.step >= 300 for e in evs), (seed, [e.step for e in evs])
        named += any(300 <= e.step <= 300 + WINDOW for e in evs)
        if evs:
            assert evs[0].kind is ts.Kind.SILENT_COLLAPSE and 250 <= evs[0].onset_step <= evs[0].step
    assert named == 30, named


def test_healthy_regressions_stay_quiet():
    # 300 fresh runs, spreads growing from 2-30 % of the targets' and drifting by 10 % either way
    assert sum(bool(SpreadCollapse().scan(pred_spread=s, loss=x)) for s, x in (_run(s) for s in range(9200, 9500))) == 0


def test_a_loss_that_rises_as_the_spread_goes_is_not_a_silent_collapse():
    for seed in range(9600, 9610):
        spread, loss = _run(seed, collapse_at=300, ramp=20, loss_up=True)
        assert SpreadCollapse().scan(pred_spread=spread, loss=loss) == []


def test_an_untrained_network_shrinking_its_outputs_is_no_collapse():
    """The first ``warmup`` values set no peak: an initialisation's large random outputs that the
    first steps shrink are not a spread the model held."""
    rng = np.random.default_rng(9700)
    t = np.arange(400)
    spread = np.where(t < 15, 5.0, 0.5) * np.exp(rng.normal(0, 0.1, 400))
    assert SpreadCollapse().scan(pred_spread=spread, loss=np.exp(-t / 300)) == []


def test_a_spread_of_zero_is_a_total_collapse_and_nan_changes_nothing():
    spread, loss = _run(9800)
    spread[300:] = 0.0
    evs = SpreadCollapse().scan(pred_spread=spread, loss=loss)
    assert evs and 300 <= evs[0].step <= 305 and math.isfinite(evs[0].value)
    det = SpreadCollapse()
    for i in range(200):
        det.update(step=i, pred_spread=float(spread[i]), loss=float(loss[i]))
    before = det.state_dict()["state"]
    det.update(step=200, pred_spread=math.nan, loss=float(loss[200]))
    after = det.state_dict()["state"]
    assert after["last_step"] == 200
    assert {k: v for k, v in after.items() if k != "last_step"} == {k: v for k, v in before.items() if k != "last_step"}


def test_the_default_monitor_holds_the_collapsed_status_while_it_lasts():
    spread, loss = _run(9900, collapse_at=300, ramp=20)
    mon = ts.Monitor(total_steps=600)
    seen, first = [], None
    for t in range(600):
        evs = mon.update(step=t, loss=float(loss[t]), pred_spread=float(spread[t]))
        if first is None and any(e.detector == "SpreadCollapse" for e in evs):
            first = t
        seen.append(mon.status)
    assert first is not None and 300 <= first <= 300 + WINDOW
    assert set(seen[first:]) == {"collapsed"} and "collapsed" not in seen[:300]
    assert "spread_collapse" in ts.default_suite() and ts.scan(loss=loss, pred_spread=spread)


@pytest.mark.parametrize(("kw", "err"), [({"pred_spread": -0.5}, ValueError), ({"pred_spread": "wide"}, TypeError)])
def test_bad_input_is_refused_naming_the_signal_and_changes_nothing(kw, err):
    mon = ts.Monitor()
    mon.update(loss=1.0, pred_spread=0.5)
    before = mon.state_dict()
    with pytest.raises(err, match="pred_spread"):
        mon.update(loss=1.0, **kw)
    assert mon.state_dict() == before


@pytest.mark.parametrize(("kw", "param"), [({"fall": 1.0}, "fall"), ({"slow": 0.3}, "slow"), ({"warmup": 0}, "warmup"),
                                           ({"loss_tolerance": 0.9}, "loss_tolerance"), ({"alpha": 0.0}, "alpha")])
def test_bad_settings_name_the_parameter(kw, param):
    with pytest.raises(ValueError, match=param):
        SpreadCollapse(**kw)


def test_traces_record_and_replay_the_spread(tmp_path):
    from trainsignals.io.traces import TraceWriter, read_trace, trace_signals

    spread, loss = _run(9901, collapse_at=300, ramp=1)
    p = tmp_path / "run.arrow"
    mon = ts.Monitor(total_steps=600, recorder=TraceWriter(p))
    live = [e for t in range(600) for e in mon.update(step=t, loss=float(loss[t]), pred_spread=float(spread[t]))]
    mon.recorder.close()
    table = read_trace(p)
    assert table.column("pred_spread").to_pylist()[:3] == [float(x) for x in spread[:3]]
    replayed = ts.Monitor(total_steps=600).scan(**trace_signals(table))
    assert [(e.step, e.detector) for e in replayed] == [(e.step, e.detector) for e in live]
    assert any(e.detector == "SpreadCollapse" for e in replayed)


def test_the_adapters_measure_the_spread():
    torch = pytest.importorskip("torch")
    from trainsignals.adapters.torch import pred_spread

    out = torch.tensor([[1.0, 0.0], [3.0, 0.0]], requires_grad=True)
    got = pred_spread(out)
    assert isinstance(got, torch.Tensor) and got.dim() == 0 and float(got) == 0.5
    assert float(pred_spread(torch.full((8, 3, 4), 2.5))) == 0.0  # one answer: no spread
    assert math.isnan(float(pred_spread(torch.zeros(1, 3))))
    mon = ts.Monitor()
    mon.update(step=0, loss=1.0, pred_spread=pred_spread(out))  # a 0-d tensor is a number
    pytest.importorskip("jax")
    import jax.numpy as jnp

    from trainsignals.adapters.jax import pred_spread as jax_spread
    from trainsignals.adapters.jax import to_monitor_kwargs

    assert float(jax_spread(jnp.array([[1.0, 0.0], [3.0, 0.0]]))) == 0.5
    assert to_monitor_kwargs({"loss": 1.0, "pred_spread": jax_spread(jnp.ones((4, 2)))})["pred_spread"] == 0.0
    with pytest.raises(ValueError, match="at least 2"):
        jax_spread(jnp.ones((1, 3)))


def test_a_curve_holds_a_regressions_spread_at_its_prediction_steps():
    import dataclasses

    from trainsignals.curves import generate

    c = generate("healthy", seed=9950)
    assert len(c.pred_steps), "the synthetic healthy curves sample their answers"
    spread = np.linspace(0.1, 1.0, len(c.pred_steps))
    reg = dataclasses.replace(c, pred_top_share=np.zeros(0), pred_spread=spread)
    got = reg.signals()["pred_spread"]
    assert np.array_equal(got[0], c.pred_steps) and np.array_equal(got[1], spread) and "pred_top_share" not in reg.signals()
    assert "pred_spread" not in reg.withheld("pred_spread").signals() and not len(reg.withheld("pred_spread").pred_steps)
    with pytest.raises(ValueError, match="pred_spread"):
        dataclasses.replace(c, pred_spread=spread[:-1])
    with pytest.raises(ValueError, match="pred_steps"):
        dataclasses.replace(c, pred_top_share=np.zeros(0))
