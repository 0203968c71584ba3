"""The JAX / optax adapter on a real small model trained on CPU (a Flax linen MLP, numpy data)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import numpy as np
import pytest

jax = pytest.importorskip("jax")
optax = pytest.importorskip("optax")
nn = pytest.importorskip("flax.linen")

import jax.numpy as jnp  # noqa: E402

import trainsignals as ts  # noqa: E402
from trainsignals.adapters.jax import (  # noqa: E402
    LaggedFeed,
    grad_stats,
    host_callback_update,
    leaf_names,
    measurements,
    monitored,
    to_monitor_kwargs,
    to_scan_kwargs,
)

D, BATCH, LR, FAULT = 8, 64, 0.05, 150
BAD = ("warning", "critical")


class MLP(nn.Module):
    @nn.compact
    def __call__(self, x: Any) -> Any:
        x = nn.relu(nn.Dense(32)(x))
        x = nn.relu(nn.Dense(32)(x))
        return nn.Dense(1)(x)[:, 0]


MODEL = MLP()


def _data(n: int = 4096, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, D)).astype(np.float32)
    w = rng.normal(size=D)
    y = np.sin(x @ w / np.sqrt(D)) + 0.1 * rng.normal(size=n)
    return x, y.astype(np.float32)


X, Y = _data()


def _loss(params: Any, x: Any, y: Any) -> Any:
    return jnp.mean((MODEL.apply(params, x) - y) ** 2)


def _batches(n: int, seed: int = 1, bad_step: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, len(X), (n, BATCH))
    xb, yb = X[idx], Y[idx]
    if bad_step is not None:
        xb[bad_step] *= 1e3  # a corrupted batch
    return xb, yb


def _tx(lr_step: int | None = None, clip: float | None = None) -> Any:
    sched = (lambda c: jnp.where(c >= lr_step, LR * 100, LR)) if lr_step is not None else LR
    inner = optax.inject_hyperparams(optax.sgd)(learning_rate=sched)
    return monitored(optax.chain(optax.clip_by_global_norm(clip), inner) if clip else inner)


def _jitted_step(tx: Any) -> Any:
    """One jitted training step through ``tx`` (a ``monitored`` transform): new params and state, and the
    step's measurements with its loss."""

    @jax.jit
    def step(params: Any, opt: Any, x: Any, y: Any) -> Any:
        loss, g = jax.value_and_grad(_loss)(params, x, y)
        u, opt = tx.update(g, opt, params)
        return optax.apply_updates(params, u), opt, {**measurements(opt), "loss": loss}

    return step


def train(n: int = 300, lr_step: int | None = None, bad_step: int | None = None, clip: float | None = None) -> list[ts.Event]:
    """Python loop, jitted step, one device_get per step, Monitor.update on the host."""
    params = MODEL.init(jax.random.PRNGKey(0), X[:1])
    tx = _tx(lr_step, clip)
    opt = tx.init(params)
    names = leaf_names(params)

    step = _jitted_step(tx)

    mon = ts.Monitor(total_steps=n)
    xb, yb = _batches(n, bad_step=bad_step)
    events: list[ts.Event] = []
    for s in range(n):
        params, opt, st = step(params, opt, xb[s], yb[s])
        events += mon.update(step=s, **to_monitor_kwargs(jax.device_get(st), names))
    return events


def test_import_trainsignals_does_not_import_jax() -> None:
    code = "import sys, trainsignals, trainsignals.adapters; assert 'jax' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_leaf_names_from_flax_paths() -> None:
    params = MODEL.init(jax.random.PRNGKey(0), X[:1])
    names = leaf_names(params)
    assert "params/Dense_0/kernel" in names and "params/Dense_2/bias" in names
    assert len(names) == len(jax.tree_util.tree_leaves(params)) == 6
    assert leaf_names([jnp.zeros(1), (jnp.zeros(1),)]) == ["0", "1/0"]


def test_grad_stats_jit_matches_eager_and_numpy() -> None:
    params = MODEL.init(jax.random.PRNGKey(0), X[:1])
    g = jax.grad(_loss)(params, X[:64], Y[:64])
    u = jax.tree_util.tree_map(lambda x: -0.1 * x, g)
    eager = grad_stats(g, params, u)
    jitted = jax.jit(grad_stats)(g, params, u)
    assert set(eager) == set(jitted) == {
        "grad_norm", "layer_grad_norms", "update_norm", "param_norm", "update_ratio", "layer_update_ratios",
    }
    for k in eager:
        np.testing.assert_allclose(np.asarray(jitted[k]), np.asarray(eager[k]), rtol=1e-5, equal_nan=True)
    leaves = [np.asarray(x, np.float64) for x in jax.tree_util.tree_leaves(g)]
    np.testing.assert_allclose(eager["layer_grad_norms"], [np.linalg.norm(x) for x in leaves], rtol=1e-5)
    np.testing.assert_allclose(eager["grad_norm"], np.sqrt(sum((x**2).sum() for x in leaves)), rtol=1e-5)
    np.testing.assert_allclose(eager["update_ratio"], float(eager["update_norm"] / eager["param_norm"]), rtol=1e-6)
    # zero-initialised biases: per-leaf ratio undefined (NaN), kernels finite
    ratios = dict(zip(leaf_names(params), np.asarray(eager["layer_update_ratios"])))
    assert np.isnan(ratios["params/Dense_0/bias"]) and np.isfinite(ratios["params/Dense_0/kernel"])
    only = grad_stats(g, per_leaf=False)
    assert set(only) == {"grad_norm"}
    kw = to_monitor_kwargs(jax.device_get(eager), leaf_names(params))
    assert set(kw) == {"grad_norm", "update_ratio", "layer_grad_norms", "layer_update_ratios"}
    assert list(kw["layer_grad_norms"]) == list(kw["layer_update_ratios"]) == leaf_names(params)
    np.testing.assert_allclose(list(kw["layer_update_ratios"].values()), np.asarray(eager["layer_update_ratios"]),
                               rtol=1e-6, equal_nan=True)


def test_monitored_without_params_omits_update_ratio() -> None:
    params = MODEL.init(jax.random.PRNGKey(0), X[:1])
    tx = monitored(optax.adam(1e-3))
    opt = tx.init(params)
    g = jax.grad(_loss)(params, X[:64], Y[:64])
    _, opt = jax.jit(tx.update)(g, opt)
    st = jax.device_get(measurements(opt))
    assert "lr" not in st and np.isnan(st["update_ratio"])
    kw = to_monitor_kwargs(st, leaf_names(params))
    assert "update_ratio" not in kw and kw["grad_norm"] > 0
    with pytest.raises(ValueError, match="monitored"):
        measurements(optax.adam(1e-3).init(params))


def test_healthy_run_is_quiet() -> None:
    events = train(300)
    assert [e for e in events if e.severity in BAD] == []


def test_lr_times_100_diverges() -> None:
    events = train(220, lr_step=FAULT)
    assert not [e for e in events if e.step < FAULT and e.severity in BAD]
    fatal = [e for e in events if e.kind in ("divergence", "nonfinite")]
    assert fatal and FAULT <= fatal[0].step <= FAULT + 10, fatal


def test_corrupted_batch_spikes() -> None:
    events = train(220, bad_step=FAULT, clip=1.0)
    hits = [e for e in events if e.kind in ("loss_spike", "grad_explosion")]
    assert hits and all(FAULT <= e.step <= FAULT + 2 for e in hits), events
    assert not [e for e in events if e.severity in BAD and abs(e.step - FAULT) > 2]


def _scan_run(n: int, callback: Any | None) -> tuple[dict[str, Any], list[str]]:
    """A fully jitted loop: lax.scan over steps; stats as scan outputs (route a) or streamed (b)."""
    params = MODEL.init(jax.random.PRNGKey(0), X[:1])
    tx = _tx(lr_step=n - 40)
    names = leaf_names(params)
    xb, yb = _batches(n)

    def body(carry: Any, inp: Any) -> Any:
        params, opt = carry
        s, x, y = inp
        loss, g = jax.value_and_grad(_loss)(params, x, y)
        u, opt = tx.update(g, opt, params)
        stats = grad_stats(g, params, u)
        if callback is not None:
            callback(s, stats, loss=loss)
        return (optax.apply_updates(params, u), opt), {**stats, "loss": loss}

    @jax.jit
    def loop(params: Any, xb: Any, yb: Any) -> Any:
        _, ys = jax.lax.scan(body, (params, tx.init(params)), (jnp.arange(n), xb, yb))
        return ys

    return jax.device_get(loop(params, xb, yb)), names


def test_scan_routes_give_the_same_events() -> None:
    n = 200
    ys, names = _scan_run(n, None)
    mon_a = ts.Monitor(total_steps=n)
    ev_a = mon_a.scan(**to_scan_kwargs(ys, names, step=np.arange(n)))

    mon_b = ts.Monitor(total_steps=n)
    seen: list[ts.Event] = []
    cb = host_callback_update(mon_b, names, on_event=seen.append)
    _scan_run(n, cb)
    ev_b = cb.flush()

    assert any(e.kind in ("divergence", "nonfinite") for e in ev_a)
    assert [e.to_dict() for e in ev_a] == [e.to_dict() for e in ev_b] == [e.to_dict() for e in seen]
    assert mon_a.status == mon_b.status


def test_lagged_feed_gives_the_same_events_one_step_later() -> None:
    rng = np.random.default_rng(0)
    loss = np.exp(-np.arange(120) / 60) + 0.01 * rng.normal(size=120)
    loss[80:] *= 1.5 ** np.arange(40)  # a geometric blow-up
    grad = np.exp(rng.normal(0, 0.1, 120))
    direct, lagged = ts.Monitor(), ts.Monitor()
    feed = LaggedFeed(lagged, ["a"])
    ev_direct, ev_lagged = [], []
    for s in range(120):
        stats = {"grad_norm": jnp.float32(grad[s]), "layer_grad_norms": jnp.array([grad[s]], jnp.float32)}
        host = jax.device_get(stats)
        ev_direct += direct.update(step=s, **to_monitor_kwargs(host, ["a"]), loss=float(np.float32(loss[s])))
        ev_lagged += feed(s, stats, loss=jnp.float32(loss[s]))
    ev_lagged += feed.flush()
    assert ev_direct and [e.to_dict() for e in ev_direct] == [e.to_dict() for e in ev_lagged]
    with pytest.raises(TypeError, match="unexpected"):
        feed(0, {}, grad=1.0)


def _frozen_run(n: int, freeze_at: int, scan: bool) -> tuple[list[ts.Event], list[str]]:
    """Adam on every layer; the first Dense layer's learning rate drops to 0 at ``freeze_at`` (a layer
    frozen mid-run). Fed step by step (``to_monitor_kwargs``) or replayed (``to_scan_kwargs``)."""
    params = MODEL.init(jax.random.PRNGKey(0), X[:1])
    labels = jax.tree_util.tree_map_with_path(
        lambda path, _: "frozen" if "Dense_0" in jax.tree_util.keystr(path) else "train", params)
    tx = monitored(optax.multi_transform(
        {"train": optax.adam(1e-3),
         "frozen": optax.adam(optax.piecewise_constant_schedule(1e-3, {freeze_at: 0.0}))}, labels))
    names = leaf_names(params)

    step = _jitted_step(tx)

    opt = tx.init(params)
    xb, yb = _batches(n)
    mon = ts.Monitor(total_steps=n)
    rows, events = [], []
    for s in range(n):
        params, opt, st = step(params, opt, xb[s], yb[s])
        host = jax.device_get(st)
        rows.append(host)
        if not scan:
            events += mon.update(step=s, **to_monitor_kwargs(host, names))
    if scan:
        stacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
        events = mon.scan(**to_scan_kwargs(stacked, names, step=np.arange(n)))
    return events, names


@pytest.mark.parametrize("scan", [False, True])
def test_a_layer_frozen_mid_run_is_named_by_its_update_ratio(scan: bool) -> None:
    """The per-leaf update ratios reach the Monitor (they used to be measured and dropped): a layer
    whose updates stop while the others learn is an ``update_ratio_low`` event naming it."""
    n, at = 220, 150
    events, _ = _frozen_run(n, at, scan)
    loud = [e for e in events if e.severity in BAD]
    assert [str(e) for e in loud if e.step < at] == []
    low = [e for e in loud if e.kind.value == "update_ratio_low"]
    assert low and at <= low[0].step <= at + 5, [str(e) for e in loud]
    assert low[0].layer is not None and low[0].layer.startswith("params/Dense_0/")


def test_multisteps_micro_steps_feed_no_per_layer_update_ratios() -> None:
    """optax.MultiSteps updates nothing on its accumulation steps (``update_norm`` 0): no per-layer
    ratio is fed for them, and a healthy accumulated run stays quiet."""
    params = MODEL.init(jax.random.PRNGKey(0), X[:1])
    tx = monitored(optax.MultiSteps(optax.adam(1e-3), every_k_schedule=4))
    names = leaf_names(params)

    step = _jitted_step(tx)

    opt = tx.init(params)
    n = 300
    xb, yb = _batches(n)
    mon = ts.Monitor(total_steps=n)
    rows, events, fed = [], [], []
    for s in range(n):
        params, opt, st = step(params, opt, xb[s], yb[s])
        host = jax.device_get(st)
        rows.append(host)
        kw = to_monitor_kwargs(host, names)
        fed.append("layer_update_ratios" in kw)
        events += mon.update(step=s, **kw)
    assert fed == [s % 4 == 3 for s in range(n)]
    assert [str(e) for e in events if e.severity in BAD] == []
    stacked = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
    cols = to_scan_kwargs(stacked, names)["layer_update_ratios"]
    moved = np.arange(n) % 4 == 3
    for name, col in cols.items():
        assert np.isnan(col[~moved]).all()
        if name.endswith("kernel"):
            assert np.isfinite(col[moved]).all() and (col[moved] > 0).all()


def test_val_metric_passes_through() -> None:
    kw = to_monitor_kwargs({"grad_norm": np.float32(1.0), "val_metric": np.float32(0.75)})
    assert kw == {"grad_norm": 1.0, "val_metric": 0.75}
    cols = to_scan_kwargs({"loss": np.ones(3), "val_metric": np.array([np.nan, 0.5, np.nan])})
    np.testing.assert_array_equal(cols["val_metric"], [np.nan, 0.5, np.nan])
    rows: list[dict[str, float]] = []

    class Rows:
        def record(self, *, step: int, signals: Any, **_: Any) -> None:
            rows.append(dict(signals))

        def record_batch(self, **_: Any) -> None:
            raise AssertionError("LaggedFeed never scans")

    feed = LaggedFeed(ts.Monitor(recorder=Rows()))
    feed(0, {"grad_norm": jnp.float32(1.0)}, loss=jnp.float32(1.0), val_metric=jnp.float32(0.5))
    feed.flush()
    assert rows == [{"loss": 1.0, "grad_norm": 1.0, "val_metric": 0.5}]
