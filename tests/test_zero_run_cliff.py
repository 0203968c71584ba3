"""ZeroRunGradCliff: a layer that had gradients gets exactly none, step after step.

Layer grad norms are drawn fresh per test (seeded, never a committed suite); the real-run test
trains deep saturating MLPs of the held-out family with seeds no suite holds (7102, 7104) and
their healthy draws.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.detectors.zero_run_grad_cliff import PATIENCE, WARMUP


def healthy_norms(seed: int, steps: int = 400, n_layers: int = 8) -> np.ndarray:
    """Per-layer grad norms of a run that trains: log-normal scatter around a slow decline, no zero."""
    rng = np.random.default_rng(seed)
    level = rng.uniform(-2, 1, n_layers)
    t = np.arange(steps)[:, None]
    return 10 ** (level - t / steps * rng.uniform(0.1, 1.0) + rng.normal(0, 0.2, (steps, n_layers)))


def events(norms: np.ndarray, **kw: Any) -> list[ts.Event]:
    return ts.ZeroRunGradCliff(**kw).scan(layer_grad_norms=norms)


@pytest.mark.parametrize("seed", range(10))
def test_layers_cut_off_from_the_loss_are_named_at_the_patience_and_healthy_ones_stay_quiet(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    norms = healthy_norms(seed)
    assert events(norms) == []
    onset = int(rng.integers(WARMUP + 1, 300))
    cut = int(rng.integers(1, norms.shape[1]))       # the first `cut` layers lose their gradient
    norms[onset:, :cut] = 0.0
    got = events(norms)
    assert [(e.step, e.onset_step, e.kind) for e in got] == [(onset + PATIENCE - 1, onset, ts.Kind.VANISHING_GRADIENT)]
    assert got[0].layer == f"layer{0}" and f"{cut} of {norms.shape[1]} layers are at 0" in got[0].message


def test_a_layer_used_on_some_batches_only_never_fires() -> None:
    """Zeros that end (an expert the router skipped, a branch) make a layer intermittent: even a later
    run of zeros longer than the patience is one more skipped stretch."""
    norms = healthy_norms(1)
    norms[100:103, 2] = 0.0          # skipped three batches, then used again
    norms[200:260, 2] = 0.0          # then skipped 60
    assert events(norms) == []


def test_a_layer_that_starts_at_zero_has_no_gradients_to_lose() -> None:
    norms = healthy_norms(2)
    norms[:50, 3] = 0.0              # frozen at first, trained from step 50, frozen again at 300
    norms[300:, 3] = 0.0
    assert events(norms) == []
    norms = healthy_norms(2)
    norms[:WARMUP - 1, 3] = np.nan   # not measured: no positive values yet when the zeros come
    norms[WARMUP - 1:WARMUP + 10, 3] = 0.0
    assert events(norms) == []


def test_non_finite_values_neither_extend_nor_end_a_run() -> None:
    norms = healthy_norms(3)
    norms[200:, 0] = 0.0
    norms[202:210, 0] = np.nan       # eight unmeasured steps inside the run: it goes on after them
    (e,) = events(norms)
    assert (e.step, e.onset_step) == (212, 200)


def test_streaming_matches_the_batch_path_and_the_monitor_names_it() -> None:
    norms = healthy_norms(4, steps=300)
    norms[150:, 1:4] = 0.0
    det = ts.ZeroRunGradCliff()
    streamed = [e for k, row in enumerate(norms) for e in det.update(layer_grad_norms=row, step=k)]
    assert [e.to_dict() for e in streamed] == [e.to_dict() for e in events(norms)]
    mon = ts.Monitor(total_steps=300)
    got = [e for e in mon.scan(layer_grad_norms=norms) if e.detector == "ZeroRunGradCliff"]
    assert [(e.step, e.layer) for e in got] == [(154, "layer1")]


@pytest.mark.parametrize(("kw", "param"), [({"patience": 0}, "patience"), ({"warmup": 0}, "warmup"),
                                           ({"cooldown": -1}, "cooldown"), ({"patience": 2.5}, "patience")])
def test_bad_configuration_names_the_parameter(kw: dict[str, Any], param: str) -> None:
    with pytest.raises(ValueError, match=param):
        ts.ZeroRunGradCliff(**kw)


@pytest.fixture(scope="module")
def torch() -> Any:
    pytest.importorskip("sklearn.datasets")
    return pytest.importorskip("torch")


@pytest.mark.parametrize("seed", [7102, 7104])
def test_fresh_saturated_deep_mlps_are_named_within_the_target_window(torch: Any, seed: int) -> None:
    """A bias shift that saturates a deep tanh/sigmoid MLP's middle layers leaves the layers below them
    with grad norms of exactly 0: the default Monitor names the vanishing gradient within
    max(50, 10 % of the run), where before this rule it said only divergence and saturation; the
    healthy draw of the same seed draws no vanishing-gradient event."""
    from trainsignals.curves.families import draw_spec
    from trainsignals.curves.real_runs import run
    from trainsignals.eval.bench import target_window

    curve = run(draw_spec("vanishing_gradient", "deepmlp", seed, 0))["curve"]
    assert curve is not None and curve.kind == "vanishing_gradient"
    assert (curve.layer_grad_norms[curve.onset_step:] == 0.0).any()
    evs = ts.Monitor(total_steps=curve.total_steps).scan(**curve.signals())
    named = [e.step for e in evs if e.kind is ts.Kind.VANISHING_GRADIENT and e.step >= curve.onset_step]
    assert named and named[0] <= curve.onset_step + target_window(curve.total_steps)
    assert not [e for e in evs if e.step < curve.onset_step and e.severity != "info"]
    without = ts.Monitor(total_steps=curve.total_steps, suite=ts.default_suite(curve.total_steps, layer_cliff_zero=False))
    assert not [e for e in without.scan(**curve.signals()) if e.kind is ts.Kind.VANISHING_GRADIENT
                and curve.onset_step <= e.step <= curve.onset_step + target_window(curve.total_steps)]
    healthy = run(draw_spec("healthy", "deepmlp", seed, 0))["curve"]
    assert healthy is not None and healthy.kind == "healthy"
    assert not [e for e in ts.Monitor(total_steps=healthy.total_steps).scan(**healthy.signals())
                if e.kind is ts.Kind.VANISHING_GRADIENT]
