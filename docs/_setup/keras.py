# Keras 3 on the JAX backend (unless keras was already imported), a tiny model and data.
import os

os.environ.setdefault("KERAS_BACKEND", "jax")
import keras
import numpy as np

_rng = np.random.default_rng(0)
x, y = _rng.normal(size=(256, 16)).astype("float32"), _rng.integers(0, 4, 256)
model = keras.Sequential([keras.Input((16,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(4)])
model.compile(optimizer=keras.optimizers.SGD(0.05),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
_fit = model.fit
model.fit = lambda *a, **kw: _fit(*a, **{**kw, "epochs": 2, "verbose": 0})  # tiny and quiet
