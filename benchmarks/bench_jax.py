"""Overhead of the JAX adapter, as % of a jitted train step, on a small transformer-like model.

Run:  python benchmarks/bench_jax.py [--steps 50] [--repeat 7] [--json out.json]

Target (issue "JAX and Keras 3 adapters"): measuring costs <= 3 % of the train step.

The model: token embedding, 2 pre-norm blocks (single-head causal self-attention + GELU MLP),
a linear head; adam; written in plain jax.numpy. Timed, interleaved, best of ``--repeat``:

* ``base``: the jitted step (loss, grads, adam update) — no measurement;
* ``grad_stats``: the same jitted step also returning ``grad_stats(grads, params, updates)``;
* ``monitored``: the optimizer wrapped in ``monitored(...)``, stats read with ``measurements``;
* ``host``: per step, ``jax.device_get`` of the stats + ``to_monitor_kwargs`` + ``Monitor.update``
  timed on its own, and end to end in loops that feed the Monitor every step: synchronously
  (fetch right after the step: the host waits for the device, and the device then waits for the
  next dispatch — compare with a base loop that also does ``float(loss)`` each step, as most
  loops do) and with ``LaggedFeed`` (fetch one step behind: dispatch is not stalled).
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import trainsignals as ts
from trainsignals.adapters.jax import (
    LaggedFeed,
    grad_stats,
    leaf_names,
    measurements,
    monitored,
    to_monitor_kwargs,
)


def init(key: Any, vocab: int, dim: int, blocks: int, seq: int) -> dict[str, Any]:
    def dense(k: Any, a: int, b: int) -> dict[str, Any]:
        return {"kernel": jax.random.normal(k, (a, b)) / np.sqrt(a), "bias": jnp.zeros(b)}

    keys = iter(jax.random.split(key, 4 + 6 * blocks))
    p: dict[str, Any] = {
        "embed": jax.random.normal(next(keys), (vocab, dim)) * 0.02,
        "pos": jax.random.normal(next(keys), (seq, dim)) * 0.02,
        "head": dense(next(keys), dim, vocab),
    }
    for i in range(blocks):
        p[f"block_{i}"] = {
            "ln1": {"scale": jnp.ones(dim), "bias": jnp.zeros(dim)},
            "qkv": dense(next(keys), dim, 3 * dim),
            "proj": dense(next(keys), dim, dim),
            "ln2": {"scale": jnp.ones(dim), "bias": jnp.zeros(dim)},
            "fc1": dense(next(keys), dim, 4 * dim),
            "fc2": dense(next(keys), 4 * dim, dim),
        }
    return p


def _ln(p: dict[str, Any], x: Any) -> Any:
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / jnp.sqrt(var + 1e-5) * p["scale"] + p["bias"]


def _dense(p: dict[str, Any], x: Any) -> Any:
    return x @ p["kernel"] + p["bias"]


def forward(p: dict[str, Any], tokens: Any) -> Any:
    seq = tokens.shape[1]
    x = p["embed"][tokens] + p["pos"][:seq]
    mask = jnp.tril(jnp.ones((seq, seq), bool))
    for name in sorted(k for k in p if k.startswith("block_")):
        b = p[name]
        q, k, v = jnp.split(_dense(b["qkv"], _ln(b["ln1"], x)), 3, axis=-1)
        att = jnp.where(mask, q @ k.swapaxes(-1, -2) / np.sqrt(q.shape[-1]), -1e9)
        x = x + _dense(b["proj"], jax.nn.softmax(att, -1) @ v)
        x = x + _dense(b["fc2"], jax.nn.gelu(_dense(b["fc1"], _ln(b["ln2"], x))))
    return _dense(p["head"], x)


def loss_fn(p: dict[str, Any], tokens: Any) -> Any:
    logits = forward(p, tokens[:, :-1])
    return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50, help="train steps per timed loop")
    ap.add_argument("--repeat", type=int, default=5, help="timed loops per variant (best is kept)")
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--blocks", type=int, default=2)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)

    params = init(jax.random.PRNGKey(0), args.vocab, args.dim, args.blocks, args.seq + 1)
    names = leaf_names(params)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (args.batch, args.seq + 1), 0, args.vocab)
    adam = optax.adam(1e-3)
    mon_tx = monitored(optax.adam(1e-3))

    @jax.jit
    def step_base(p: Any, s: Any, t: Any) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(p, t)
        u, s = adam.update(g, s, p)
        return optax.apply_updates(p, u), s, loss

    @jax.jit
    def step_stats(p: Any, s: Any, t: Any) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(p, t)
        u, s = adam.update(g, s, p)
        return optax.apply_updates(p, u), s, {**grad_stats(g, p, u), "loss": loss}

    @jax.jit
    def step_monitored(p: Any, s: Any, t: Any) -> Any:
        loss, g = jax.value_and_grad(loss_fn)(p, t)
        u, s = mon_tx.update(g, s, p)
        return optax.apply_updates(p, u), s, {**measurements(s), "loss": loss}

    variants: dict[str, tuple[Callable[..., Any], Any]] = {
        "base": (step_base, adam.init(params)),
        "grad_stats": (step_stats, adam.init(params)),
        "monitored": (step_monitored, mon_tx.init(params)),
    }

    def loop(fn: Callable[..., Any], state: Any, feed: str = "") -> float:
        """Mean seconds a step; feed: "" (nothing fetched), "loss" (float(loss) each step, as
        most loops log it), "sync" (fetch stats + Monitor.update each step), "lagged" (LaggedFeed)."""
        p, s = params, state
        mon = ts.Monitor(total_steps=args.steps)
        lagged = LaggedFeed(mon, names)
        t0 = time.perf_counter()
        for i in range(args.steps):
            p, s, out = fn(p, s, tokens)
            if feed == "loss":
                float(out if not isinstance(out, dict) else out["loss"])
            elif feed == "sync":
                mon.update(step=i, **to_monitor_kwargs(jax.device_get(out), names))
            elif feed == "lagged":
                lagged(i, out)
        lagged.flush()
        jax.block_until_ready((p, s, out))
        return (time.perf_counter() - t0) / args.steps

    runs: dict[str, tuple[Callable[..., Any], Any, str]] = {k: (fn, st, "") for k, (fn, st) in variants.items()}
    runs["base (again: noise floor)"] = (step_base, variants["base"][1], "")
    runs["base, float(loss) each step"] = (step_base, variants["base"][1], "loss")
    runs["stats+host, sync"] = (step_stats, variants["grad_stats"][1], "sync")
    runs["stats+host, lagged"] = (step_stats, variants["grad_stats"][1], "lagged")
    for fn, state, feed in runs.values():  # compile + warm up
        loop(fn, state, feed)
    best: dict[str, float] = {k: float("inf") for k in runs}
    for _ in range(args.repeat):  # interleaved, so drifts in machine speed hit every variant alike
        for k, (fn, state, feed) in runs.items():
            best[k] = min(best[k], loop(fn, state, feed))

    # host side alone: fetch + convert + Monitor.update, on already computed stats
    p, s, out = step_stats(params, variants["grad_stats"][1], tokens)
    jax.block_until_ready(out)
    mon = ts.Monitor()
    n_host = 2000
    t0 = time.perf_counter()
    for i in range(n_host):
        mon.update(step=i, **to_monitor_kwargs(jax.device_get(out), names))
    host = (time.perf_counter() - t0) / n_host

    # the measurement alone, jitted on the step's own trees: the least noisy figure of its cost
    g = jax.grad(loss_fn)(params, tokens)
    u, _ = adam.update(g, adam.init(params), params)
    stats_only = jax.jit(grad_stats)
    jax.block_until_ready(stats_only(g, params, u))
    alone = float("inf")
    for _ in range(args.repeat):
        t0 = time.perf_counter()
        for _ in range(100):
            r = stats_only(g, params, u)
        jax.block_until_ready(r)
        alone = min(alone, (time.perf_counter() - t0) / 100)

    base = best["base"]
    figures = {
        "platform": f"{platform.processor() or platform.machine()}, {jax.devices()[0].platform}, jax {jax.__version__}",
        "model": f"{args.blocks} blocks, dim {args.dim}, seq {args.seq}, batch {args.batch}, "
        f"{sum(x.size for x in jax.tree_util.tree_leaves(params)):,} params in {len(names)} leaves",
        "step_ms": {k: v * 1e3 for k, v in best.items()},
        "host_update_us": host * 1e6,
        "grad_stats_alone_us": alone * 1e6,
        "overhead_pct": {
            "grad_stats alone (own jit) / base step": 100 * alone / base,
            "noise floor (base vs base)": 100 * (best["base (again: noise floor)"] / base - 1),
            "grad_stats (in jit)": 100 * (best["grad_stats"] / base - 1),
            "monitored (in jit)": 100 * (best["monitored"] / base - 1),
            "host transfer + Monitor.update": 100 * host / base,
            "end to end, sync fetch each step vs base": 100 * (best["stats+host, sync"] / base - 1),
            "end to end, sync fetch vs base + float(loss)": 100
            * (best["stats+host, sync"] / best["base, float(loss) each step"] - 1),
            "end to end, LaggedFeed vs base": 100 * (best["stats+host, lagged"] / base - 1),
        },
    }
    print(f"{figures['platform']}; {figures['model']}")
    for k, v in figures["step_ms"].items():
        print(f"  step {k:<28} {v:8.3f} ms")
    print(f"  grad_stats(grads, params, updates) alone, own jit: {alone * 1e6:.1f} us")
    print(f"  host: device_get + to_monitor_kwargs + Monitor.update  {host * 1e6:.1f} us/step")
    for k, v in figures["overhead_pct"].items():
        print(f"  overhead {k:<46} {v:+6.2f} %   (target <= 3 %)")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return figures


if __name__ == "__main__":
    main()
