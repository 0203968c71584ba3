"""LayerUpdateRatio: a layer out of line with the others is named; a whole network that stops
(or blows up) is not blamed on the one layer that did not."""

from __future__ import annotations

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
