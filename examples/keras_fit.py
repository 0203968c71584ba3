"""trainsignals watching ``keras.Model.fit`` (Keras 3, JAX backend; runs on a CPU in ~15 s).

Two runs of the same MLP on synthetic 8x8 "digits":

1. a healthy run: the callback stays quiet;
2. the learning rate is multiplied by 10,000 at epoch 3, step 90 (a mis-wired scheduler): the
   callback warns at once (``lr_anomaly`` and ``update_ratio_high`` at step 90, ``loss_spike``
   and ``grad_explosion`` at step 91, as the loss leaps from 0.33 to 1e7 and beyond); when the
   weights overflow nine steps later (step 99: an infinite update ratio and a NaN validation
   loss, ``nonfinite``, critical) it stops ``fit`` and puts back the weights of the best
   validation loss. No ``divergence`` is reported before that: the loss rises three steps in a
   row (the geometric-climb rule needs four), then falls back to hundreds, and the rules that
   compare levels need 20 steps after the jump.

Run: ``python examples/keras_fit.py`` (needs ``pip install keras jax``).
"""

from __future__ import annotations

import os

os.environ.setdefault("KERAS_BACKEND", "jax")  # must be set before keras is imported

import keras  # noqa: E402
import numpy as np  # noqa: E402

from trainsignals.adapters.keras import TrainSignalsCallback, with_grad_stats  # noqa: E402


def digits(n: int = 1500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Ten noisy, jittered 8x8 binary prototypes: a small stand-in for handwritten digits."""
    rng = np.random.default_rng(seed)
    protos = (rng.random((10, 8, 8)) > 0.6) * 16.0
    y = rng.integers(0, 10, n)
    x = protos[y] + rng.normal(0, 6.0, (n, 8, 8))
    shifts = rng.integers(-1, 2, (n, 2))
    x = np.stack([np.roll(img, tuple(s), axis=(0, 1)) for img, s in zip(x, shifts)])
    return (x.reshape(n, 64) / 16).astype("float32"), y.astype("int32")


def make_model(lr: float) -> keras.Model:
    """A small MLP whose train_step also logs grad_norm and update_ratio."""
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((64,)),
        keras.layers.Dense(64, activation="relu"),
        keras.layers.Dense(32, activation="relu"),
        keras.layers.Dense(10),
    ])
    model = with_grad_stats(model)  # gradients are not visible to callbacks otherwise
    model.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model


def main() -> None:
    """Run the healthy fit, then the one with the learning-rate blow-up."""
    x, y = digits()
    print(f"Keras {keras.__version__}, backend {keras.backend.backend()}")

    print("\n== 1. healthy run (lr 0.02) ==")
    model = make_model(0.02)
    cb = TrainSignalsCallback()
    hist = model.fit(x, y, batch_size=40, epochs=10, validation_split=0.2, callbacks=[cb], verbose=0)
    print(f"epochs run: {len(hist.history['loss'])}, final val_loss {hist.history['val_loss'][-1]:.3f}, "
          f"val accuracy {hist.history['val_accuracy'][-1]:.2f}")
    print(f"status: {cb.monitor.status}; warning/critical events: "
          f"{sum(e.severity != 'info' for e in cb.events)}")

    print("\n== 2. the learning rate jumps 10,000x at epoch 3 ==")
    model = make_model(0.05)
    blowup = keras.callbacks.LearningRateScheduler(lambda epoch, lr: 0.05 * (1e4 if epoch >= 3 else 1.0))
    cb = TrainSignalsCallback(restore_best_weights=True)   # prints events as they fire
    hist = model.fit(x, y, batch_size=40, epochs=10, validation_split=0.2, callbacks=[cb, blowup],
                     verbose=0)
    print(f"epochs run: {len(hist.history['loss'])} of 10; stopped at step {cb.stopped_step} "
          f"(the jump was at step {3 * 30})")
    val_loss, val_acc = model.evaluate(x[1200:], y[1200:], verbose=0)
    print(f"after restoring the best weights: val_loss {val_loss:.3f}, val accuracy {val_acc:.2f}")
    print()
    print(cb.monitor.summary())


if __name__ == "__main__":
    main()
