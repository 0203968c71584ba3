"""The batch path gives the events and the state of the streaming path (property tests)."""

from __future__ import annotations

import numpy as np
from conftest import SCALAR_FACTORIES
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import trainsignals as ts
from trainsignals.testing import close_events, close_state  # noqa: F401 - other tests import them from here

NAMES = sorted(SCALAR_FACTORIES)


def regime_stream(seed: int, n: int, n_regimes: int, nan_rate: float, nsig: int) -> list[np.ndarray]:
    """Positive streams made of random regimes (flat, falling, climbing, sawtooth, spikes)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(nsig):
        cuts = np.sort(rng.integers(0, n, n_regimes))
        y = np.zeros(n)
        level = rng.normal(0, 2)
        start = 0
        for c in list(cuts) + [n]:
            m = c - start
            if m <= 0:
                continue
            mode = rng.integers(0, 5)
            t = np.arange(m)
            if mode == 0:
                seg = np.zeros(m)
            elif mode == 1:
                seg = -t * rng.uniform(0, 0.02)
            elif mode == 2:
                seg = t * rng.uniform(0, 0.2)
            elif mode == 3:
                seg = np.where(t % 2 == 0, 1, -1) * rng.uniform(0, 1)
            else:
                seg = np.zeros(m)
                seg[rng.integers(0, m, max(1, m // 20))] = rng.uniform(0.5, 4)
            y[start:c] = level + seg + rng.standard_t(3, m) * rng.uniform(0.001, 0.2)
            level = y[c - 1] if c > start else level
            start = c
        x = np.exp(np.clip(y, -300, 300))
        bad = rng.random(n) < nan_rate
        x[bad] = rng.choice([np.nan, np.inf, 0.0, -1.0], bad.sum())
        out.append(x)
    return out


def as_fraction(a: np.ndarray) -> np.ndarray:
    """A positive stream squeezed into [0, 1] (a fraction signal refuses anything else); NaN stays."""
    with np.errstate(invalid="ignore"):
        return np.where(np.isinf(a), 1.0, a / (1.0 + a))


@settings(max_examples=int(__import__("os").environ.get("TS_EXAMPLES", 150)), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(NAMES),
    seed=st.integers(0, 2**32 - 1),
    n=st.integers(1, 1500),
    n_regimes=st.integers(0, 8),
    nan_rate=st.sampled_from([0.0, 0.0, 0.001, 0.05]),
    cuts=st.lists(st.floats(0, 1), max_size=6),
)
# found with TS_EXAMPLES=1500: the jump tracker's 21st value, learned through the full judgement (not the
# quiet inline case), was folded with warm-up weights although its steps already covered the warm-up
@example(name="ConfirmedZSpike-linear-both-cooldown", seed=0, n=48, n_regimes=5, nan_rate=0.05, cuts=[0.375])
def test_scan_in_random_chunks_equals_streaming(name, seed, n, n_regimes, nan_rate, cuts):
    ref = SCALAR_FACTORIES[name]()
    names = [i.name for i in ref.inputs]
    arrays = dict(zip(names, regime_stream(seed, n, n_regimes, nan_rate, len(names))))
    # a negative grad norm, rate or ratio is refused (ValueError); the streams' -1 becomes 0 there
    arrays = {k: np.where(a < 0, 0.0, a) if ts.SIGNALS[k].nonneg else a for k, a in arrays.items()}
    arrays = {k: as_fraction(a) if ts.SIGNALS[k].fraction else a for k, a in arrays.items()}
    streamed = []
    for t in range(n):
        streamed += ref.update(step=t, **{k: float(a[t]) for k, a in arrays.items()})
    det = SCALAR_FACTORIES[name]()
    bounds = sorted({0, n, *(int(c * n) for c in cuts)})
    batched = []
    for lo, hi in zip(bounds[:-1], bounds[1:]):
        batched += det.scan(steps=np.arange(lo, hi), **{k: a[lo:hi] for k, a in arrays.items()})
    assert close_events(streamed, batched), (streamed, batched)
    assert close_state(ref.state_dict(), det.state_dict())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), n=st.integers(50, 3000))
def test_long_regimes_equal_streaming_for_all_detectors(seed, n):
    for name in NAMES:
        ref = SCALAR_FACTORIES[name]()
        names = [i.name for i in ref.inputs]
        arrays = dict(zip(names, regime_stream(seed, n, 4, 0.0, len(names))))
        arrays = {k: as_fraction(a) if ts.SIGNALS[k].fraction else a for k, a in arrays.items()}
        streamed = [e for t in range(n) for e in ref.update(step=t, **{k: float(a[t]) for k, a in arrays.items()})]
        det = SCALAR_FACTORIES[name]()
        assert close_events(streamed, det.scan(**arrays)), name
        assert close_state(ref.state_dict(), det.state_dict()), name


def test_the_per_step_log_is_the_batch_log_bit_for_bit():
    # the batch paths take np.log / np.log10 of whole columns; the per-step paths must get the same
    # numbers on every CPU (with AVX-512, NumPy's vectorised log differs from math.log in the last
    # bit for a few values in a thousand, and scan and update would drift apart)
    from trainsignals.detectors._ops import column_log, log, log10

    rng = np.random.default_rng(7)
    x = np.concatenate((np.exp(rng.uniform(-30, 30, 50_000)), rng.uniform(1e-3, 10, 50_000)))
    per_step = np.array([log(v) for v in x.tolist()])
    assert np.array_equal(per_step, column_log(x, 0, len(x)))
    assert np.array_equal(np.array([log10(v) for v in x.tolist()]), column_log(x, 0, len(x), base10=True))


def test_trend_divergence_scan_equals_streaming_on_a_noisy_loss_with_many_candidates():
    # heavy-tailed additive noise puts ~8 % of the values past the rise bar, so the batch path's
    # vectorised trend pre-filter screens thousands of windows; short climbs make real events
    for seed in range(3):
        rng = np.random.default_rng(seed)
        n = 20_000
        loss = 2 * np.exp(-np.arange(n) / 5000) + 0.1 * rng.standard_normal(n) ** 2 + 0.5
        for a in range(2000, n, 2500):
            loss[a:a + 60] *= np.exp(np.linspace(0, 1.2, 60))
        ref = ts.TrendDivergence()
        streamed = [e for t in range(n) for e in ref.update(loss=float(loss[t]))]
        det = ts.TrendDivergence()
        batched = det.scan(loss=loss)
        assert len(streamed) >= 5
        assert close_events(streamed, batched)
        assert close_state(ref.state_dict(), det.state_dict())


def test_a_shared_average_joins_an_earlier_stretch_and_gives_the_plain_average_bit_for_bit(monkeypatch):
    # shared_ewma from another state at an earlier position computes a span, then takes the rest
    # from the stored stretch once the two averages meet: the numbers are those of ewma itself
    from trainsignals.detectors import _ops

    rng = np.random.default_rng(3)
    col = np.exp(rng.normal(0, 0.3, 20_000))
    y = np.log(col)
    computed = []
    plain = _ops.ewma

    def counting(x, a, b, m0):
        computed.append(len(x))
        return plain(x, a, b, m0)

    monkeypatch.setattr(_ops, "ewma", counting)
    with _ops.sharing():
        first = _ops.shared_ewma(col, 500, "log", y[500:], 0.1, 0.9, 0.0)
        later = _ops.shared_ewma(col, 10, "log", y[10:], 0.1, 0.9, 5.0)  # far from the first's state
        slow = _ops.shared_ewma(col, 10, "log", y[10:], 0.001, 0.999, 5.0)  # never meets: computed whole
    assert np.array_equal(first, plain(y[500:], 0.1, 0.9, 0.0))
    assert np.array_equal(later, plain(y[10:], 0.1, 0.9, 5.0))
    assert np.array_equal(slow, plain(y[10:], 0.001, 0.999, 5.0))
    assert computed[1] < 3000 < computed[0]  # the second average computed one span, the rest was shared
    assert sum(computed[2:]) == len(y) - 10


def test_monitor_scan_equals_streaming_over_many_blocks_with_events():
    # the detectors of one Monitor.scan share averages across their block boundaries; a long run
    # with regimes and spikes must still give the streamed events and state exactly
    loss, grad = regime_stream(11, 12_000, 6, 0.0, 2)
    ref = ts.Monitor()
    streamed = [e for a, b in zip(loss.tolist(), grad.tolist()) for e in ref.update(loss=a, grad_norm=b)]
    mon = ts.Monitor()
    batched = mon.scan(loss=loss, grad_norm=grad)
    assert streamed and close_events(streamed, batched)
    assert close_state(ref.state_dict(), mon.state_dict())


def test_a_long_scan_taken_in_chunks_gives_the_events_and_state_of_one_pass(monkeypatch):
    # Monitor.scan takes dense scalar signals longer than SCAN_CHUNK steps a chunk at a time (to bound
    # its memory); with a small chunk, a run with gaps and events must come out as in one pass
    from trainsignals import _monitor

    loss, grad = regime_stream(12, 6_000, 6, 0.0, 2)
    loss[[500, 2501, 4000]] = [np.nan, np.inf, np.nan]
    gaps = np.zeros(len(grad), bool)
    gaps[::7] = True
    masked = np.ma.masked_array(grad, mask=gaps)
    whole = ts.Monitor()
    want = whole.scan(loss=loss, grad_norm=masked)
    monkeypatch.setattr(_monitor, "SCAN_CHUNK", 1_000)
    chunked = ts.Monitor()
    got = chunked.scan(loss=loss, grad_norm=masked)
    assert want and close_events(want, got)
    assert close_state(whole.state_dict(), chunked.state_dict())


def test_edge_of_stability_with_a_learning_rate_scans_as_it_streams():
    """The swing rule reads the rate's bands in its batch path too: warm-up from exactly 0, cosine restarts,
    gaps and zeros in the rate, bumps at the end of each cycle; random chunks; events and state as streamed."""
    for seed in range(4):
        rng = np.random.default_rng(seed)
        n = 3000
        t = np.arange(n)
        lr = np.minimum(1e-3, 1e-3 * t / 200)
        lr = np.where(t > 1500, lr * 0.5 * (1 + np.cos(np.pi * (t % 500) / 500)), lr)
        lr[rng.random(n) < 0.02] = np.nan
        lr[rng.integers(0, n, 5)] = 0.0
        if seed % 2:
            lr[1000:1100] = np.nan
        bump = np.where(t % 500 > 450, 3.0, 1.0)
        loss = (2 * np.exp(-t / 500) + 0.3) * np.exp(rng.normal(0, 0.1, n)) * bump
        grad = np.exp(rng.normal(0, 0.2, n)) * np.where(t % 500 > 450, 2.0, 1.0)
        ref, det = ts.SwingRatioEdgeOfStability(), ts.SwingRatioEdgeOfStability()
        streamed = [e for k in range(n)
                    for e in ref.update(step=k, loss=float(loss[k]), grad_norm=float(grad[k]), lr=float(lr[k]))]
        cuts = np.sort(rng.choice(np.arange(1, n), 20, replace=False)).tolist()
        batched = [e for lo, hi in zip([0, *cuts], [*cuts, n], strict=True)
                   for e in det.scan(steps=t[lo:hi], loss=loss[lo:hi], grad_norm=grad[lo:hi], lr=lr[lo:hi])]
        assert ref.state_dict()["state"]["rates"][0], "no rate band was recorded: the test reads nothing"
        assert close_events(streamed, batched)
        assert close_state(ref.state_dict(), det.state_dict())
