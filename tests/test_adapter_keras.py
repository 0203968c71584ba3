"""The Keras 3 adapter on the JAX and PyTorch backends.

Keras fixes its backend when first imported, so every scenario runs in a child process
(this file run as a script with ``KERAS_BACKEND`` set) that prints its findings as JSON; the
tests below assert on them. The pytest process itself never imports keras (without
``KERAS_BACKEND`` keras would reach for TensorFlow, which is not a dependency).

Data: scikit-learn's bundled 8x8 digits (10 classes of noisy 8x8 blobs made with NumPy when
scikit-learn is absent); model: a Dense MLP.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from typing import Any

import pytest

BACKENDS = {"jax": "jax", "torch": "torch"}
EPOCHS = 10


def _skip_unless(backend: str) -> None:
    if importlib.util.find_spec("keras") is None:
        pytest.skip("keras is not installed")
    if importlib.util.find_spec(BACKENDS[backend]) is None:
        pytest.skip(f"{backend} is not installed")


_RESULTS: dict[str, dict[str, Any]] = {}


def results(backend: str) -> dict[str, Any]:
    """Run every scenario once per backend in a child process; cache the JSON."""
    _skip_unless(backend)
    if backend not in _RESULTS:
        env = {**os.environ, "KERAS_BACKEND": backend, "CUDA_VISIBLE_DEVICES": "",
               "JAX_PLATFORMS": "cpu", "PYTHONHASHSEED": "0"}
        proc = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True,
                              timeout=240)
        assert proc.returncode == 0, proc.stderr[-4000:]
        line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
        _RESULTS[backend] = json.loads(line[len("RESULT "):])
    return _RESULTS[backend]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_healthy_fit_is_quiet_and_logs_grad_norm(backend: str) -> None:
    r = results(backend)["healthy"]
    assert r["backend"] == backend
    assert r["events"] == []
    assert r["epochs_run"] == EPOCHS and not r["stopped"]
    assert r["final_val_loss"] < 0.5 * r["first_loss"]            # it did learn
    assert {"grad_norm", "update_ratio", "batch_loss"} <= set(r["log_keys"])
    assert "layer_grad_norms" not in r["log_keys"]                # popped before other callbacks
    assert r["n_updates"] == r["global_step"] == r["steps_per_epoch"] * EPOCHS
    assert set(r["fed"]) >= {"loss", "grad_norm", "lr", "update_ratio", "layer_grad_norms", "val_loss"}
    assert r["n_val"] == EPOCHS
    assert r["lr"] == pytest.approx(0.02)
    assert 0 < r["grad_norm"] < 100 and 0 < r["update_ratio"] < 0.1
    # the batch loss recovered from Keras' running mean matches the logged batch loss
    assert r["max_deaveraging_error"] < 1e-4


@pytest.mark.parametrize("backend", list(BACKENDS))
@pytest.mark.parametrize("scenario", ["diverge_plain", "diverge_stats"])
def test_lr_blowup_is_caught_and_stops_training(backend: str, scenario: str) -> None:
    r = results(backend)[scenario]
    assert r["stopped"]
    assert r["epochs_run"] < EPOCHS
    first = r["first_critical_step"]
    # the lr jumps 1e4x at the start of epoch 3: caught within that epoch, nothing before
    assert r["jump_step"] <= first < r["jump_step"] + r["steps_per_epoch"]
    assert r["events_before_jump"] == []
    assert r["critical_kinds"][0] in ("divergence", "nonfinite", "loss_spike", "grad_explosion", "lr_anomaly")
    assert r["stopped_step"] == first and r["global_step"] == first + 1   # stopped at that batch


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_on_critical_raise(backend: str) -> None:
    r = results(backend)["raise"]
    assert r["raised"] == "TrainingFailure"
    assert r["n_events"] >= 1 and "critical" in r["severities"]


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_restore_best_weights_after_blowup(backend: str) -> None:
    r = results(backend)["restore"]
    assert r["stopped"]
    assert r["weights_equal_best"]
    assert r["restored_val_loss"] == pytest.approx(r["best_val_loss"], rel=1e-4)


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_early_stopping_on_overfitting(backend: str) -> None:
    r = results(backend)["overfit"]
    assert r["stop_kinds"] == ["overfitting"]
    assert r["epochs_run"] < r["epochs_planned"]
    assert r["weights_equal_best"]
    assert r["restored_val_loss"] == pytest.approx(r["best_val_loss"], rel=1e-4)
    assert r["best_step"] == r["onset_step"]                      # the checkpoint the event names


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_mixin_logs_grad_stats(backend: str) -> None:
    assert {"grad_norm", "update_ratio", "batch_loss", "loss"} <= set(results(backend)["mixin"]["log_keys"])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_variable_no_gradient_reaches_is_not_measured_on_torch_and_zero_on_jax(backend: str) -> None:
    """A built layer the model never calls: on PyTorch its variables have no gradient (``None``), fed as
    ``nan`` (not measured); JAX differentiates every variable, and its gradient there is exactly 0."""
    r = results(backend)["spare"]
    assert len(r["spare"]) == 2 and all(v > 0 for v in r["others"])
    assert r["spare"] == (["nan", "nan"] if backend == "torch" else [0.0, 0.0])


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_schedule_and_log_every(backend: str) -> None:
    r = results(backend)["schedule"]
    # a fed lr is the schedule at the iteration of the step just taken
    assert r["max_lr_error"] < 1e-6
    assert r["n_loss_updates"] == r["global_step"] // 5


def test_import_trainsignals_does_not_import_keras() -> None:
    code = "import sys, trainsignals, trainsignals.adapters; print('keras' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_bad_arguments() -> None:
    """Every bad argument is refused when the callback is built, by a ValueError naming it (a wrong
    ``monitor`` or ``verbose`` used to pass and fail at the first batch, or print nothing)."""
    _skip_unless("jax")
    code = (
        "from trainsignals.adapters.keras import TrainSignalsCallback as C\n"
        "bad = [dict(on_critical='explode'), dict(log_every=0), dict(also_stop_on=('nope',)), dict(monitor='m'),\n"
        "       dict(monitor=300), dict(verbose='yes'), dict(verbose=3), dict(total_steps='100'),\n"
        "       dict(total_steps=0), dict(restore_best_weights='yes')]\n"
        "named = []\n"
        "for kw in bad:\n"
        "    try:\n        C(**kw)\n    except ValueError as e:\n        named.append(str(e).startswith(next(iter(kw))))\n"
        "C(also_stop_on=('overfitting',))\n"
        "print(len(bad), named.count(True))\n"
    )
    env = {**os.environ, "KERAS_BACKEND": "jax", "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "10 10"


# ------------------------------------------------------------------------------------------
# The child: runs under one backend, prints "RESULT {json}".
# ------------------------------------------------------------------------------------------
def _child() -> None:  # pragma: no cover - runs in a subprocess
    import keras
    import numpy as np

    import trainsignals as ts
    from trainsignals.adapters.keras import (
        GradStatsMixin,
        TrainingFailure,
        TrainSignalsCallback,
        with_grad_stats,
    )

    class Capture:
        """A Monitor recorder keeping every update."""

        def __init__(self) -> None:
            self.rows: list[dict[str, Any]] = []

        def record(self, *, step: int, signals: Any, layer_grad_norms: Any, activations: Any,
                   events: Any) -> None:
            self.rows.append({"step": step, **signals, "layers": layer_grad_norms is not None})

        def record_batch(self, **kwargs: Any) -> None:
            raise AssertionError("no scan expected")

    def digits(n: int = 1500, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        try:  # scikit-learn's bundled 8x8 digits (no download)
            from sklearn.datasets import load_digits

            data = load_digits()
            order = rng.permutation(len(data.target))[:n]  # n: the train split fills whole batches
            return (data.data[order] / 16).astype("float32"), data.target[order].astype("int32")
        except ImportError:  # the same shape of problem, made with NumPy
            pass
        protos = (rng.random((10, 8, 8)) > 0.6).astype("float32") * 16
        y = rng.integers(0, 10, n)
        x = protos[y] + rng.normal(0, 6.0, (n, 8, 8))
        shift = rng.integers(-1, 2, (n, 2))
        x = np.stack([np.roll(img, tuple(s), axis=(0, 1)) for img, s in zip(x, shift)])
        return (x.reshape(n, 64) / 16).astype("float32"), y.astype("int32")

    x, y = digits()
    batch_size = 40
    n_train = int(len(x) * 0.8)
    steps_per_epoch = -(-n_train // batch_size)

    def model(stats: bool, lr: float = 0.05) -> Any:
        keras.utils.set_random_seed(1)
        m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(64, activation="relu"),
                              keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
        if stats:
            m = with_grad_stats(m, layer_norms=True)
        m.compile(optimizer=keras.optimizers.SGD(lr, momentum=0.9),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
        return m

    class Spy(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.logs: list[dict[str, Any]] = []

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            self.logs.append(dict(logs or {}))

    def fit(m: Any, cb: Any, *extra: Any) -> Any:
        return m.fit(x, y, batch_size=batch_size, epochs=EPOCHS, validation_split=0.2, shuffle=True,
                     callbacks=[cb, *extra], verbose=0)

    jump_epoch = 3
    # x1e4 (to lr 500, momentum 0.9): the loss climbs geometrically, then overflows
    blowup = keras.callbacks.LearningRateScheduler(lambda e, lr: 0.05 * (1e4 if e >= jump_epoch else 1.0))
    out: dict[str, Any] = {}

    class NoBatchLoss(TrainSignalsCallback):
        """Sees the logs without ``batch_loss``: must recover it from Keras' running mean."""

        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            super().on_train_batch_end(batch, {k: v for k, v in (logs or {}).items() if k != "batch_loss"})

    # healthy, with gradient statistics
    cap, cap2 = Capture(), Capture()
    cb = TrainSignalsCallback(ts.Monitor(total_steps=EPOCHS * steps_per_epoch, recorder=cap), verbose=0)
    cb2 = NoBatchLoss(ts.Monitor(recorder=cap2), verbose=0)
    spy = Spy()
    m = model(True, lr=0.02)
    h = fit(m, cb, cb2, spy)
    loss_rows = [r for r in cap.rows if "loss" in r]
    recovered = {r["step"]: r["loss"] for r in cap2.rows if "loss" in r}
    deavg = [abs(recovered[r["step"]] - r["loss"]) / r["loss"] for r in loss_rows]
    fed: set[str] = set()
    for r in cap.rows:
        fed |= {k for k in r if k not in ("step", "layers")} | ({"layer_grad_norms"} if r["layers"] else set())
    out["healthy"] = {
        "backend": keras.backend.backend(),
        "events": [str(e) for e in cb.events + cb2.events if e.severity != "info"],
        "epochs_run": len(h.history["loss"]), "stopped": bool(m.stop_training),
        "first_loss": float(loss_rows[0]["loss"]), "final_val_loss": float(h.history["val_loss"][-1]),
        "log_keys": sorted(spy.logs[-1]), "n_updates": len(loss_rows), "global_step": cb.global_step,
        "steps_per_epoch": steps_per_epoch, "fed": sorted(fed),
        "n_val": sum("val_loss" in r for r in cap.rows), "lr": cap.rows[-2]["lr"],
        "grad_norm": float(spy.logs[-1]["grad_norm"]), "update_ratio": float(spy.logs[-1]["update_ratio"]),
        "max_deaveraging_error": max(deavg),
    }

    # divergence injected through the learning rate, without and with gradient statistics
    for name, stats in (("diverge_plain", False), ("diverge_stats", True)):
        cb = TrainSignalsCallback(verbose=0)
        m = model(stats)
        h = fit(m, cb, blowup)
        crit = [e for e in cb.events if e.severity == "critical"]
        jump = jump_epoch * steps_per_epoch
        out[name] = {
            "stopped": bool(m.stop_training), "epochs_run": len(h.history["loss"]),
            "first_critical_step": crit[0].step if crit else None, "jump_step": jump,
            "critical_kinds": [e.kind.value for e in crit],
            "events_before_jump": [str(e) for e in cb.events if e.step < jump and e.severity != "info"],
            "steps_per_epoch": steps_per_epoch, "global_step": cb.global_step,
            "stopped_step": cb.stopped_step,
        }

    # on_critical="raise"
    cb = TrainSignalsCallback(on_critical="raise", verbose=0)
    m = model(True)
    try:
        fit(m, cb, blowup)
        out["raise"] = {"raised": None, "n_events": 0, "severities": []}
    except TrainingFailure as exc:
        out["raise"] = {"raised": type(exc).__name__, "n_events": len(exc.events),
                        "severities": [e.severity for e in exc.events]}

    # restore_best_weights after the blow-up
    cb = TrainSignalsCallback(restore_best_weights=True, verbose=0)
    m = model(True)
    fit(m, cb, blowup)
    weights = m.get_weights()
    equal = cb.best_weights is not None and all(
        np.array_equal(a, b) for a, b in zip(weights, cb.best_weights))
    val_loss = m.evaluate(x[n_train:], y[n_train:], batch_size=batch_size, verbose=0)
    out["restore"] = {"stopped": bool(m.stop_training), "weights_equal_best": bool(equal),
                      "restored_val_loss": float(val_loss), "best_val_loss": cb.best_val_loss}

    # overfitting: a big net on 300 noisy-label points; early stopping through also_stop_on
    rng = np.random.default_rng(0)
    xo = rng.normal(size=(300, 20)).astype("float32")
    yo = (xo[:, 0] > 0).astype("int32")
    yo[rng.random(300) < 0.3] ^= 1
    xv = rng.normal(size=(1000, 20)).astype("float32")
    yv = (xv[:, 0] > 0).astype("int32")
    keras.utils.set_random_seed(0)
    m = keras.Sequential([keras.Input((20,)), keras.layers.Dense(256, activation="relu"),
                          keras.layers.Dense(256, activation="relu"), keras.layers.Dense(2)])
    m.compile(optimizer=keras.optimizers.Adam(3e-3),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cb = TrainSignalsCallback(restore_best_weights=True, also_stop_on=("overfitting",), verbose=0)
    h = m.fit(xo, yo, batch_size=30, epochs=60, validation_data=(xv, yv), callbacks=[cb], verbose=0)
    out["overfit"] = {
        "stop_kinds": [e.kind.value for e in cb.failure_events], "epochs_run": len(h.history["loss"]),
        "epochs_planned": 60, "best_step": cb.best_step,
        "onset_step": cb.failure_events[0].onset_step if cb.failure_events else None,
        "weights_equal_best": all(np.array_equal(a, b) for a, b in zip(m.get_weights(), cb.best_weights or [])),
        "restored_val_loss": float(m.evaluate(xv, yv, verbose=0)), "best_val_loss": cb.best_val_loss,
    }

    # a subclassed model with the mixin
    class Net(GradStatsMixin, keras.Model):
        def __init__(self) -> None:
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.out = keras.layers.Dense(10)

        def call(self, inputs: Any) -> Any:
            return self.out(self.hidden(inputs))

    keras.utils.set_random_seed(1)
    net = Net()
    net.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    spy = Spy()
    net.fit(x, y, batch_size=batch_size, epochs=1, callbacks=[spy], verbose=0)
    out["mixin"] = {"log_keys": sorted(spy.logs[-1])}

    # per-variable norms with a built layer the model never calls: no gradient reaches it
    class Branchy(GradStatsMixin, keras.Model):
        grad_stats_layer_norms = True

        def __init__(self) -> None:
            super().__init__()
            self.hidden = keras.layers.Dense(16, activation="relu")
            self.spare = keras.layers.Dense(16)
            self.spare.build((None, 64))
            self.out = keras.layers.Dense(10)

        def call(self, inputs: Any) -> Any:
            return self.out(self.hidden(inputs))

    keras.utils.set_random_seed(1)
    net = Branchy()
    net.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    spy = Spy()
    net.fit(x, y, batch_size=batch_size, epochs=1, callbacks=[spy], verbose=0)
    norms = np.asarray(spy.logs[-1]["layer_grad_norms"], dtype=float)
    spare = [i for i, w in enumerate(net.trainable_weights) if any(w is s for s in net.spare.trainable_weights)]
    out["spare"] = {"spare": [norms[i] if np.isfinite(norms[i]) else "nan" for i in spare],
                    "others": [float(v) for i, v in enumerate(norms) if i not in spare]}

    # a learning-rate schedule, fed every 5 steps
    sched = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=7, decay_rate=0.9)
    keras.utils.set_random_seed(1)
    m = keras.Sequential([keras.Input((64,)), keras.layers.Dense(32, activation="relu"), keras.layers.Dense(10)])
    m.compile(optimizer=keras.optimizers.SGD(sched),
              loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    cap = Capture()
    cb = TrainSignalsCallback(ts.Monitor(recorder=cap), log_every=5, verbose=0)
    m.fit(x, y, batch_size=batch_size, epochs=2, callbacks=[cb], verbose=0)
    errs = [abs(r["lr"] - 0.05 * 0.9 ** (r["step"] / 7)) for r in cap.rows if "lr" in r]
    out["schedule"] = {"max_lr_error": max(errs), "global_step": cb.global_step,
                       "n_loss_updates": sum("loss" in r for r in cap.rows)}
    print("RESULT " + json.dumps(out))


if __name__ == "__main__":  # pragma: no cover
    _child()
