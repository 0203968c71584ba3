"""Watch a JAX / optax training run with trainsignals, then break it on purpose.

Run:  python examples/jax_optax.py          (CPU, a few seconds; needs jax, optax)

A small MLP learns a noisy 1-D regression with SGD. The optimizer is wrapped in
``monitored(...)``, so the jitted step measures the gradient norm, per-layer gradient norms
and the update ratio on device; one ``jax.device_get`` per step feeds ``Monitor.update``.

Three runs: a healthy one (quiet), one whose batch at step 150 is corrupted (inputs x1000:
a loss spike and a gradient explosion, survived thanks to clipping), and one whose learning
rate is multiplied by 100 at step 150 (divergence, then non-finite values: the Monitor asks
to stop). Finally the same faulty run as one fully jitted ``lax.scan``, replayed afterwards.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import trainsignals as ts
from trainsignals.adapters.jax import (
    grad_stats,
    leaf_names,
    measurements,
    monitored,
    to_monitor_kwargs,
    to_scan_kwargs,
)

STEPS, FAULT, LR, BATCH = 300, 150, 0.05, 64


def init_mlp(key: Any, sizes: tuple[int, ...] = (8, 32, 32, 1)) -> dict[str, dict[str, Any]]:
    """Plain-JAX MLP parameters: {"dense_i": {"kernel", "bias"}}."""
    params = {}
    for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
        key, sub = jax.random.split(key)
        params[f"dense_{i}"] = {"kernel": jax.random.normal(sub, (a, b)) / np.sqrt(a), "bias": jnp.zeros(b)}
    return params


def mlp(params: dict[str, dict[str, Any]], x: Any) -> Any:
    layers = list(params.values())
    for layer in layers[:-1]:
        x = jax.nn.relu(x @ layer["kernel"] + layer["bias"])
    return (x @ layers[-1]["kernel"] + layers[-1]["bias"])[:, 0]


def loss_fn(params: Any, x: Any, y: Any) -> Any:
    return jnp.mean((mlp(params, x) - y) ** 2)


def data(steps: int, bad_step: int | None, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    w = rng.normal(size=8)
    x = rng.normal(size=(steps, BATCH, 8)).astype(np.float32)
    y = (np.sin(x @ w / np.sqrt(8)) + 0.1 * rng.normal(size=(steps, BATCH))).astype(np.float32)
    if bad_step is not None:
        x[bad_step] *= 1e3
    return x, y


def optimizer(lr_step: int | None, clip: float | None) -> Any:
    sched = (lambda count: jnp.where(count >= lr_step, LR * 100, LR)) if lr_step is not None else LR
    tx = optax.inject_hyperparams(optax.sgd)(learning_rate=sched)
    if clip is not None:
        tx = optax.chain(optax.clip_by_global_norm(clip), tx)
    return monitored(tx)  # outermost: sees the gradients before clipping


def train(title: str, lr_step: int | None = None, bad_step: int | None = None, clip: float | None = None) -> None:
    print(f"\n== {title}")
    params = init_mlp(jax.random.PRNGKey(0))
    tx = optimizer(lr_step, clip)
    opt_state = tx.init(params)
    names = leaf_names(params)  # dense_0/bias, dense_0/kernel, ...

    @jax.jit
    def step(params: Any, opt_state: Any, x: Any, y: Any) -> Any:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)  # params: for the update ratio
        return optax.apply_updates(params, updates), opt_state, {**measurements(opt_state), "loss": loss}

    mon = ts.Monitor(total_steps=STEPS)
    xs, ys = data(STEPS, bad_step)
    for s in range(STEPS):
        params, opt_state, stats = step(params, opt_state, xs[s], ys[s])
        for e in mon.update(step=s, **to_monitor_kwargs(jax.device_get(stats), names)):  # one transfer
            print(e)
        if mon.should_stop:
            print(f"stopping at step {s}")
            break
    print(f"status: {mon.status}")


def scanned(title: str, lr_step: int) -> None:
    """The whole run inside one jit (lax.scan); stats come out as scan outputs, replayed after."""
    print(f"\n== {title}")
    params = init_mlp(jax.random.PRNGKey(0))
    tx = optimizer(lr_step, None)
    xs, ys = data(STEPS, None)

    def body(carry: Any, batch: Any) -> Any:
        params, opt_state = carry
        loss, grads = jax.value_and_grad(loss_fn)(params, *batch)
        updates, opt_state = tx.update(grads, opt_state, params)
        stats = grad_stats(grads, params, updates)
        return (optax.apply_updates(params, updates), opt_state), {**stats, "loss": loss}

    run = jax.jit(lambda p, xs, ys: jax.lax.scan(body, (p, tx.init(p)), (xs, ys))[1])
    stacked = jax.device_get(run(params, xs, ys))
    mon = ts.Monitor(total_steps=STEPS)
    for e in mon.scan(**to_scan_kwargs(stacked, leaf_names(params), step=np.arange(STEPS))):
        print(e)
    print(f"status: {mon.status}")


def main() -> None:
    train("healthy run: nothing should fire")
    train(f"corrupted batch at step {FAULT} (inputs x1000), gradients clipped to 1", bad_step=FAULT, clip=1.0)
    train(f"learning rate x100 at step {FAULT}", lr_step=FAULT)
    scanned(f"same fault, whole run in one lax.scan, replayed with Monitor.scan (lr x100 at step {FAULT})", FAULT)


if __name__ == "__main__":
    main()
