"""LayerUpdateRatio: a layer out of line with the others is named; a whole network that stops
(or blows up) is not blamed on the one layer that did not."""

from __future__ import annotations

import json

import numpy as np
import pytest

import trainsignals as ts


def ratios(seed: int, n: int = 600, layers: int = 6) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = 10 ** rng.uniform(-4, -3, layers)
    return base * np.exp(rng.normal(0, 0.3, (n, layers)))


@pytest.mark.parametrize("seed", range(5))
def test_a_frozen_layer_is_named_once_and_healthy_layers_stay_quiet(seed: int) -> None:
    r = ratios(seed)
    assert ts.LayerUpdateRatio().scan(layer_update_ratios=r) == []                 # healthy: quiet
    r[300:, 2] = 0.0                                           # one layer frozen
    evs = ts.LayerUpdateRatio().scan(layer_update_ratios=r)
    assert [(e.kind, e.layer) for e in evs] == [(ts.Kind.UPDATE_RATIO_LOW, "layer2")]
    assert 300 <= evs[0].step <= 302 and evs[0].onset_step < evs[0].step


@pytest.mark.parametrize("seed", range(5))
def test_a_network_that_stops_is_not_one_violent_layer(seed: int) -> None:
    # a learning-rate blow-up kills most layers: their updates stop; the one still moving is
    # "far above the median layer" only because the median collapsed
    r = ratios(seed)
    r[300:, 1:] = 0.0
    evs = ts.LayerUpdateRatio().scan(layer_update_ratios=r)
    assert not [e for e in evs if e.kind is ts.Kind.UPDATE_RATIO_HIGH]
    # and the same on the streaming path
    det = ts.LayerUpdateRatio()
    streamed = [e for t, row in enumerate(r) for e in det.update(layer_update_ratios=row, step=t)]
    assert [(e.kind, e.step, e.layer) for e in streamed] == [(e.kind, e.step, e.layer) for e in evs]


@pytest.mark.parametrize("seed", range(5))
def test_one_layer_blowing_up_is_named(seed: int) -> None:
    r = ratios(seed)
    r[400:, 4] *= 1e3
    evs = ts.LayerUpdateRatio().scan(layer_update_ratios=r)
    assert [(e.kind, e.layer) for e in evs] == [(ts.Kind.UPDATE_RATIO_HIGH, "layer4")]
    assert 400 <= evs[0].step <= 405


def test_bad_configuration_names_the_parameter() -> None:
    for kw, name in (({"gap": 0}, "gap"), ({"drop": -1}, "drop"), ({"warmup": 0}, "warmup"),
                     ({"fast": 0.01, "slow": 0.1}, "slow")):
        with pytest.raises(ValueError, match=name):
            ts.LayerUpdateRatio(**kw)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_layer_measured_late_starts_its_levels_at_its_first_value(seed):
    """A layer without values at first (frozen when the watcher was built, an expert routed late) is not
    a layer at ratio 1 or grad norm 1: it draws nothing when its values arrive, and a later freeze of it is
    still named; scan gives update's events and state on such a run, in random chunks."""
    rng = np.random.default_rng(seed)
    late = np.tile([5e-3, 6e-3, 3e-3, 4e-3], (400, 1)) * np.exp(rng.normal(0, 0.1, (400, 4)))
    late[:200, 0] = np.nan
    frozen = late.copy()
    frozen[300:, 0] = 1e-9
    for cls, signal in ((ts.LayerUpdateRatio, "layer_update_ratios"), (ts.MedianGapGradCliff, "layer_grad_norms"),
                        (ts.OwnDropGradCliff, "layer_grad_norms")):
        assert cls().scan(**{signal: late}) == [], cls.__name__
        streamed, det = [], cls()
        for t, row in enumerate(frozen):
            streamed += det.update(step=t, **{signal: row})
        assert streamed and streamed[0].layer == "layer0" and 300 <= streamed[0].step <= 310, cls.__name__
        cuts = np.sort(rng.choice(np.arange(1, 400), 9, replace=False)).tolist()
        batched, twin = [], cls()
        for lo, hi in zip([0, *cuts], [*cuts, 400], strict=True):
            batched += twin.scan(steps=np.arange(lo, hi), **{signal: frozen[lo:hi]})
        assert [e.to_dict() for e in batched] == [e.to_dict() for e in streamed], cls.__name__
        assert json.dumps(twin.state_dict(), allow_nan=False) == json.dumps(det.state_dict(), allow_nan=False)
