# A tiny linear model in JAX with optax, and a Monitor.
import jax
import jax.numpy as jnp
import numpy as np
import optax

import trainsignals as ts

_rng = np.random.default_rng(0)
batch = (jnp.asarray(_rng.normal(size=(64, 8)), jnp.float32), jnp.asarray(_rng.normal(size=64), jnp.float32))
params = {"w": jnp.zeros(8), "b": jnp.zeros(())}


def loss_fn(params, batch):
    x, y = batch
    return jnp.mean((x @ params["w"] + params["b"] - y) ** 2)


mon = ts.Monitor(total_steps=100)
i = 0
