"""Values at the ends of the float range are signals, never exceptions.

The rules work on logs, and a difference of two logs turned back into a factor overflows
``math.exp`` (and ``10 ** d``) long before it overflows a float: a loss that goes from 1e-300 to
1e+300 rose 1e600 times. A learning rate that falls from 1.8e308 to 1e-300 has a ratio that
underflows to 0. A signed loss of +-1e308 has second differences beyond the range. Fed such
streams through ``update`` and ``scan``, the default Monitor raises nothing (nor warns: a
``RuntimeWarning`` is an error here), and every event it gives has a message.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

import trainsignals as ts
from trainsignals.detectors._factors import exp_or_inf, expm1_or_inf, pow10_or_inf, times

HI, LO, N = 1e300, 1e-300, 400
T = np.arange(N)
PATTERNS = {
    "climb": np.exp(np.log(LO) + np.minimum(345.0 * np.maximum(T - 199, 0), 1381.0)),  # 1e-300 to 1e300 in 4
    "jump up": np.where(T < 200, LO, HI),
    "jump down": np.where(T < 200, HI, LO),
    "alternating": np.where(T % 2 == 0, LO, HI),
    "falls, then alternates": np.where(T < 250, LO * np.exp(-T / 100), np.where(T % 2 == 0, LO, HI)),
    "falls": np.geomspace(HI, LO, N),
    "rises": np.geomspace(LO, HI, N),
    "blocks": np.where((T // 37) % 2 == 0, LO, HI),
}
BIG = 1.7976931348623157e308  # the largest float
SIGNED = {
    "alternating +-1e300": np.where(T % 2 == 0, -1e300, 1e300),
    "jumps to -1e300": np.where(T < 200, -1e-300, -1e300),
    "climbs from -1e300": -np.geomspace(1e300, 1e-300, N),
    "mixed": np.where(T < 150, 1.0, np.where(T % 3 == 0, -1e308, 1e-300)),
    "the largest floats": np.where(T % 2 == 0, BIG, -BIG),
}
RATES = {"constant": np.full(N, 1e-3), "largest, then tiny": np.where(T < 150, 1.7e308, LO), "the loss": None}


def _signals(x: np.ndarray, lr: np.ndarray, grad: np.ndarray) -> dict:
    val = T[::10]
    return dict(loss=x, grad_norm=grad, lr=lr, update_ratio=x, val_loss=(val, x[val]),
                val_metric=(val, np.clip(x[val], 0.0, 1.0)), pred_top_share=(T, x / (1.0 + x)),
                layer_grad_norms={"a": x, "b": grad, "c": np.ones(N)})


pytestmark = pytest.mark.filterwarnings("error::RuntimeWarning")


@pytest.mark.parametrize("pattern", sorted(PATTERNS))
def test_the_default_monitor_takes_the_ends_of_the_float_range(pattern):
    x = PATTERNS[pattern]
    for lr in RATES.values():
        lr = x if lr is None else lr
        for grad in (x, x[::-1], np.ones(N)):
            sig = _signals(x, lr, grad)
            scanned = ts.Monitor(total_steps=N).scan(**sig)
            mon = ts.Monitor(total_steps=N)
            streamed = []
            for i in range(N):
                kw = {k: float(v[i]) for k, v in sig.items() if isinstance(v, np.ndarray)}
                kw["pred_top_share"] = float(sig["pred_top_share"][1][i])
                kw["layer_grad_norms"] = {k: float(v[i]) for k, v in sig["layer_grad_norms"].items()}
                if i % 10 == 0:
                    kw.update(val_loss=float(x[i]), val_metric=float(np.clip(x[i], 0.0, 1.0)))
                streamed += mon.update(step=i, **kw)
            for ev in scanned + streamed:
                assert isinstance(ev, ts.Event) and ev.message


@pytest.mark.parametrize("pattern", sorted(SIGNED))
def test_signed_losses_and_layer_signals_at_the_ends_of_the_range(pattern):
    x = SIGNED[pattern]
    a = np.abs(x)
    acts = {"l1": {"dead_frac": np.where(T % 2 == 0, 0.0, 1.0), "saturation": np.where(T < 200, 1e-300, 1.0)},
            "l2": {"dead_frac": np.full(N, 1e-300), "saturation": np.full(N, 0.5)}}
    ratios = {"a": a, "b": np.where(T % 2 == 0, 1e-300, 1e300)}
    val = T[::10]
    scanned = ts.Monitor(total_steps=N).scan(
        loss=x, grad_norm=a, lr=a, update_ratio=a, val_loss=(val, x[val]), val_metric=(val, x[val]),
        activations=(T, acts), layer_update_ratios=ratios, layer_grad_norms={"a": a, "b": np.ones(N)})
    mon = ts.Monitor(total_steps=N)
    streamed = []
    for i in range(N):
        kw = dict(loss=float(x[i]), grad_norm=float(a[i]), lr=float(a[i]), update_ratio=float(a[i]),
                  activations={k: {s: float(v[i]) for s, v in d.items()} for k, d in acts.items()},
                  layer_update_ratios={k: float(v[i]) for k, v in ratios.items()},
                  layer_grad_norms={"a": float(a[i]), "b": 1.0})
        if i % 10 == 0:
            kw.update(val_loss=float(x[i]), val_metric=float(x[i]))
        streamed += mon.update(step=i, **kw)
    for ev in scanned + streamed:
        assert isinstance(ev, ts.Event) and ev.message


def test_factors_turned_back_from_logs_never_overflow():
    assert exp_or_inf(1382.0) == math.inf and exp_or_inf(-1382.0) == 0.0
    assert expm1_or_inf(1382.0) == math.inf and expm1_or_inf(-1382.0) == -1.0
    assert pow10_or_inf(600.0) == math.inf and pow10_or_inf(2.0) == 100.0
    assert times(2.0 * math.log(1e300)) == "1e+600"  # a loss from 1e-300 to 1e300
    assert times(608.25, base10=True) == "1.78e+608" and times(math.inf) == "inf" and times(math.nan) == "nan"


def test_a_value_past_the_linear_range_leaves_the_signed_rule_watching():
    """A signed loss of -2e301 (a policy loss gone wrong) is beyond what the linear z-score can square:
    folded in, its variance became inf (every later z-score 0, the rule blind for the rest of the run)
    and, a few values on, NaN (a state that no longer equals itself after a JSON round trip). It is
    skipped as a non-finite value is; a later jump is still named, and the state round-trips."""
    rng = np.random.default_rng(5230)
    loss = -1.0 + 0.01 * rng.standard_normal(300)
    loss[50] = -1.9696468660290533e301
    loss[200] = 5.0  # a jump of 600 noise units
    for det in (ts.SignedZSpike(), ts.EWMAZSpike(log=False, direction="both")):
        streamed = [e.step for t, v in enumerate(loss.tolist()) for e in det.update(loss=v, step=t)]
        assert 200 in streamed
        state = det.state_dict()
        assert all(math.isfinite(v) for v in (state["state"]["mean"], state["state"]["var"]))
        again = det.clone()
        again.load_state_dict(json.loads(json.dumps(state)))
        assert again.state_dict() == state
        assert [e.step for e in det.clone().scan(loss=loss)] == streamed


def test_a_count_or_a_number_past_any_run_is_refused_naming_the_parameter():
    """A window, patience or hold of 10**30 (found by fuzzing the constructors) reached a deque or an
    index array and raised ``OverflowError`` or ``IndexError``; a Python int past the float range given
    for a threshold raised ``OverflowError`` from the check itself. Both are ``ValueError`` naming it."""
    import inspect

    from test_conformance import ALL_CLASSES

    checked = 0
    for cls in ALL_CLASSES:
        for p in inspect.signature(cls).parameters.values():
            if p.default is inspect.Parameter.empty or isinstance(p.default, bool) or not isinstance(
                    p.default, (int, float)):
                continue
            big = 10 ** 30 if isinstance(p.default, int) else 10 ** 400
            kw = {"schedule": lambda step: 1e-3} if "schedule" in inspect.signature(cls).parameters else {}
            with pytest.raises(ValueError, match=p.name):
                cls(**kw, **{p.name: big})
            checked += 1
    assert checked > 100


def test_a_jump_across_the_float_range_is_reported_as_a_factor_not_as_inf():
    """1e-300 to 1e+300: the spike's message gives the factor (1e+600x), as the divergence's does."""
    rng = np.random.default_rng(0)
    loss = np.r_[1e-300 * np.exp(rng.normal(0, 0.05, 200)), np.full(50, 1e300)]
    spikes = [e for e in ts.scan(loss=loss) if e.kind is ts.Kind.LOSS_SPIKE]
    assert spikes and "e+600x its recent level" in spikes[0].message
    climbs = [e for e in ts.scan(loss=loss) if e.kind is ts.Kind.DIVERGENCE]
    assert climbs and "e+600x" in climbs[0].message
