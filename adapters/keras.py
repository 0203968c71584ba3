"""Keras 3 adapter: a callback that feeds a :class:`~trainsignals.Monitor` during ``fit``.

Two pieces:

* :class:`TrainSignalsCallback` — a ``keras.callbacks.Callback``. Each batch it feeds the
  Monitor the training loss, the learning rate read from the optimizer (a schedule is evaluated
  at the iteration of the step just taken) and, when the logs carry them, ``grad_norm`` and
  ``update_ratio``; each epoch it feeds ``val_loss`` at the current global step. On a critical
  event it stops training (``model.stop_training = True``), warns, or raises
  :class:`TrainingFailure`; with ``restore_best_weights=True`` it keeps the weights of the
  best validation loss and puts them back when it stops the run.
* :func:`with_grad_stats` (or the :class:`GradStatsMixin` for subclassed models) — Keras
  callbacks never see gradients, so this replaces the model's ``train_step`` by one that
  computes the global gradient norm (and the update ratio ‖Δw‖/‖w‖, optionally per-variable
  gradient norms) inside the step and returns them in the logs, where the callback picks them
  up. JAX and PyTorch backends (TensorFlow is not supported).

How the ``train_step`` override works (Keras 3.x): on the JAX backend ``train_step(state,
data)`` is stateless and jitted; the override is the stock one (``jax.value_and_grad`` of
``compute_loss_and_updates``, then ``optimizer.stateless_apply``) plus the norms, computed
with ``jax.numpy`` inside the same jitted function. On the PyTorch backend ``train_step(data)``
runs ``loss.backward()`` and ``optimizer.apply``; the override reads the ``.grad`` of each
trainable variable before ``apply`` and, for the update ratio, copies the weights first.
Gradients are of the loss before any loss scaling (a ``LossScaleOptimizer``'s scale is
divided out) and before the optimizer's clipping.

The batch ``loss`` Keras puts in the logs is the running mean over the epoch. The callback
recovers each batch's own loss from consecutive means (exact for equal batch sizes; a smaller
last batch is pulled toward the mean, never into a false spike); with :func:`with_grad_stats`
the step also logs ``batch_loss``, which is used instead.

Example::

    import keras
    from trainsignals.adapters.keras import TrainSignalsCallback, with_grad_stats

    model = with_grad_stats(keras.Sequential([...]))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    cb = TrainSignalsCallback(restore_best_weights=True)
    model.fit(x, y, validation_split=0.2, epochs=20, callbacks=[cb])
    print(cb.monitor.summary())
"""

from __future__ import annotations

import math
import types
import warnings
from collections.abc import Iterable
from typing import Any

import keras

import trainsignals as ts
from trainsignals import TrainingFailure, check_kinds

__all__ = ["GradStatsMixin", "TrainSignalsCallback", "TrainingFailure", "with_grad_stats"]

_STATS_KEYS = ("grad_norm", "update_ratio", "batch_loss", "layer_grad_norms")


# ------------------------------------------------------------------------------------------
# Gradient statistics inside train_step
# ------------------------------------------------------------------------------------------
def _jax_train_step(model: Any, state: Any, data: Any, *, layer_norms: bool, update_ratio: bool) -> Any:
    """Keras 3's ``JAXTrainer.train_step`` plus the gradient statistics (stateless, jittable)."""
    import jax
    import jax.numpy as jnp

    trainable, non_trainable, opt_vars, metric_vars = state
    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
    (loss, aux), grads = grad_fn(
        trainable, non_trainable, metric_vars, x, y, sample_weight,
        training=True, optimizer_variables=opt_vars,
    )
    unscaled_loss, y_pred, non_trainable, metric_vars = aux
    new_trainable, opt_vars = model.optimizer.stateless_apply(opt_vars, grads, trainable)
    logs, metric_vars = model._update_metrics_variables(  # noqa: SLF001 - Keras' own metric update, no public equivalent
        metric_vars, unscaled_loss, x, y, y_pred, sample_weight
    )
    scale = jnp.where(unscaled_loss != 0, loss / jnp.where(unscaled_loss != 0, unscaled_loss, 1.0), 1.0)
    sq = [jnp.sum(jnp.square(g.astype(jnp.float32))) for g in grads if g is not None]
    stats: dict[str, Any] = {
        "grad_norm": jnp.sqrt(sum(sq, jnp.float32(0.0))) / jnp.abs(scale),
        "batch_loss": unscaled_loss,
    }
    if layer_norms and sq:
        stats["layer_grad_norms"] = jnp.sqrt(jnp.stack(sq)) / jnp.abs(scale)
    if update_ratio:
        dw = sum((jnp.sum(jnp.square((n - o).astype(jnp.float32))) for n, o in zip(new_trainable, trainable)),
                 jnp.float32(0.0))
        w = sum((jnp.sum(jnp.square(o.astype(jnp.float32))) for o in trainable), jnp.float32(0.0))
        stats["update_ratio"] = jnp.sqrt(dw) / jnp.maximum(jnp.sqrt(w), 1e-12)
    return {**logs, **stats}, (new_trainable, non_trainable, opt_vars, metric_vars)


def _torch_train_step(model: Any, data: Any, *, layer_norms: bool, update_ratio: bool) -> Any:
    """Keras 3's ``TorchTrainer.train_step`` plus the gradient statistics."""
    import torch

    x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
    y_pred = model(x, training=True) if model._call_has_training_arg else model(x)  # noqa: SLF001 - Keras' own flag, no public equivalent
    model.zero_grad()
    compute_loss = getattr(model, "_compute_loss", model.compute_loss)
    loss = compute_loss(x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=True)
    model._loss_tracker.update_state(  # noqa: SLF001 - the tracker Keras reports the loss from
        loss, sample_weight=next(i for i in keras.tree.flatten(x) if i is not None).shape[0]
    )
    batch_loss = loss.detach()
    if model.optimizer is not None:
        loss = model.optimizer.scale_loss(loss)
    stats: dict[str, Any] = {"batch_loss": batch_loss}
    if model.trainable_weights:
        loss.backward()
        weights = model.trainable_weights[:]
        grads = [v.value.grad for v in weights]
        with torch.no_grad():
            scale = (loss.detach() / batch_loss).abs() if float(batch_loss) != 0 else 1.0
            zero = torch.zeros((), device=batch_loss.device)
            sq = [zero if g is None else torch.sum(torch.square(g.float())) for g in grads]
            if sq:
                stats["grad_norm"] = torch.sqrt(torch.stack(sq).sum()) / scale
                if layer_norms:
                    per = torch.sqrt(torch.stack(sq)) / scale
                    if any(g is None for g in grads):  # a weight left out of the graph this step: not measured
                        absent = torch.tensor([g is None for g in grads], device=per.device)
                        per = torch.where(absent, torch.full_like(per, float("nan")), per)
                    stats["layer_grad_norms"] = per.cpu().numpy()
            old = [v.value.detach().clone() for v in weights] if update_ratio else None
            model.optimizer.apply(grads, weights)
            if old is not None:
                dw = torch.stack([torch.sum(torch.square((v.value - o).float())) for v, o in zip(weights, old)]).sum()
                w = torch.stack([torch.sum(torch.square(o.float())) for o in old]).sum()
                stats["update_ratio"] = torch.sqrt(dw) / torch.clamp(torch.sqrt(w), min=1e-12)
    else:
        warnings.warn("The model does not have any trainable weights.", stacklevel=2)
    logs = model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)
    return {**logs, **stats}


def _grad_stats_step(model: Any, args: tuple[Any, ...], layer_norms: bool, update_ratio: bool) -> Any:
    backend = keras.backend.backend()
    if backend == "jax":
        return _jax_train_step(model, args[0], args[1], layer_norms=layer_norms, update_ratio=update_ratio)
    if backend == "torch":
        return _torch_train_step(model, args[0], layer_norms=layer_norms, update_ratio=update_ratio)
    raise NotImplementedError(f"gradient statistics support the jax and torch backends, not {backend!r}")


class GradStatsMixin:
    """Mixin for subclassed Keras models: ``train_step`` also logs gradient statistics.

    Put it before ``keras.Model``: ``class Net(GradStatsMixin, keras.Model): ...``. The logs
    gain ``grad_norm``, ``batch_loss`` and (``grad_stats_update_ratio = True``, the default)
    ``update_ratio``; set ``grad_stats_layer_norms = True`` for ``layer_grad_norms`` (a
    vector, one norm per trainable variable). See :func:`with_grad_stats` for functional and
    ``Sequential`` models.
    """

    grad_stats_layer_norms: bool = False
    grad_stats_update_ratio: bool = True

    def train_step(self, *args: Any) -> Any:
        """The backend's stock training step, plus the gradient statistics in the logs."""
        return _grad_stats_step(self, args, self.grad_stats_layer_norms, self.grad_stats_update_ratio)


def with_grad_stats(model: Any, *, layer_norms: bool = False, update_ratio: bool = True) -> Any:
    """Make ``model.fit`` log gradient statistics for :class:`TrainSignalsCallback`.

    Replaces the instance's ``train_step`` (the model's class is unchanged, so saving and
    loading are unaffected — a loaded model needs ``with_grad_stats`` again; an already
    compiled train function is dropped and rebuilt). Not for models with their own
    ``train_step`` (add the norms there), nor with Flax NNX enabled on JAX (Keras then calls
    ``type(model).train_step``: use :class:`GradStatsMixin`).

    Args:
        model: a Keras 3 model on the JAX or PyTorch backend (any kind: ``Sequential``,
            functional, subclassed — as long as it uses the stock ``train_step``).
        layer_norms: also log ``layer_grad_norms``, one gradient norm per trainable variable
            (a vector; the callback removes it from the logs before the progress bar).
        update_ratio: also log ``update_ratio`` = ‖Δw‖/‖w‖ of the step (costs a copy of the
            weights on the PyTorch backend).

    Returns:
        The same model, modified in place.

    Raises:
        NotImplementedError: the backend is neither ``jax`` nor ``torch``.
    """
    backend = keras.backend.backend()
    if backend not in ("jax", "torch"):
        raise NotImplementedError(f"gradient statistics support the jax and torch backends, not {backend!r}")

    def train_step(self: Any, *args: Any) -> Any:
        return _grad_stats_step(self, args, layer_norms, update_ratio)

    object.__setattr__(model, "train_step", types.MethodType(train_step, model))
    model.train_function = None
    return model


# ------------------------------------------------------------------------------------------
# The callback
# ------------------------------------------------------------------------------------------
def _scalar(value: Any) -> float:
    return float(keras.ops.convert_to_numpy(value))


class TrainSignalsCallback(keras.callbacks.Callback):
    """Feeds a :class:`~trainsignals.Monitor` during ``model.fit`` and acts on its events.

    Args:
        monitor: the Monitor to feed; a default one (``Monitor(total_steps=...)``) if None.
        total_steps: planned number of training steps for the default Monitor; if None, taken
            from ``fit``'s ``epochs * steps`` when known.
        on_critical: what a critical event does: ``"stop"`` sets ``model.stop_training``
            (the epoch ends at this batch), ``"warn"`` only issues a ``RuntimeWarning``,
            ``"raise"`` raises :class:`TrainingFailure` (carrying the events) out of ``fit``.
            Only critical kinds in the Monitor's ``stop_on`` count.
        restore_best_weights: keep the weights of the best ``val_loss`` (taken at epoch
            ends, like ``keras.callbacks.EarlyStopping``) and restore them when this callback
            stops (or raises out of) the run.
        log_every: feed the Monitor every this many batches (the loss fed is the mean over
            those batches; grad norm and update ratio are the latest).
        also_stop_on: warning kinds that also stop the run under ``on_critical``'s policy,
            e.g. ``("overfitting",)`` for early stopping.
        verbose: 0 silent, 1 print warning and critical events as they fire, 2 all events.

    Attributes:
        monitor: the Monitor fed.
        events: every event raised so far (also ``monitor.events``).
        global_step: training steps seen, across epochs and ``fit`` calls.
        stopped_step: the (0-based, global) step at which this callback stopped the run, None
            if it did not.
        failure_events: the events that caused the stop.

    Raises:
        ValueError: a bad ``monitor`` (not a Monitor), ``total_steps``, ``on_critical``,
            ``restore_best_weights``, ``log_every``, ``verbose`` or kind name (the message names it).
    """

    def __init__(
        self,
        monitor: ts.Monitor | None = None,
        *,
        total_steps: int | None = None,
        on_critical: str = "stop",
        restore_best_weights: bool = False,
        log_every: int = 1,
        also_stop_on: Iterable[str] = (),
        verbose: int = 1,
    ) -> None:
        super().__init__()
        if on_critical not in ("stop", "warn", "raise"):
            raise ValueError(f"on_critical must be 'stop', 'warn' or 'raise', got {on_critical!r}")
        if monitor is not None and not isinstance(monitor, ts.Monitor):
            raise ValueError(f"monitor must be a trainsignals.Monitor or None, got {monitor!r}")
        if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                        or total_steps < 1):
            raise ValueError(f"total_steps must be an integer >= 1 or None, got {total_steps!r}")
        if isinstance(log_every, bool) or not isinstance(log_every, int) or log_every < 1:
            raise ValueError(f"log_every must be an integer >= 1, got {log_every!r}")
        if verbose not in (0, 1, 2) or isinstance(verbose, bool):
            raise ValueError(f"verbose must be 0, 1 or 2, got {verbose!r}")
        if not isinstance(restore_best_weights, bool):
            raise ValueError(f"restore_best_weights must be a bool, got {restore_best_weights!r}")
        self.also_stop_on = check_kinds("also_stop_on", also_stop_on)
        self._monitor = monitor
        self.total_steps = total_steps
        self.on_critical = on_critical
        self.restore_best_weights = restore_best_weights
        self.log_every = log_every
        self.verbose = verbose
        self.global_step = 0
        self.stopped_step: int | None = None
        self.failure_events: list[ts.Event] = []
        self.best_val_loss = math.inf
        self.best_step: int | None = None
        self.best_weights: list[Any] | None = None
        self._prev_mean = 0.0
        self._prev_count = 0
        self._chunk_loss = 0.0
        self._chunk_n = 0
        self._iterations0 = 0
        self._steps_this_fit = 0
        self._pending_restore = False
        self._since_feed = 0
        self._var_names: tuple[str, ...] = ()

    # -- public state ------------------------------------------------------------------
    @property
    def monitor(self) -> ts.Monitor:
        """The Monitor fed (created on first use when none was given)."""
        if self._monitor is None:
            self._monitor = ts.Monitor(total_steps=self.total_steps)
        return self._monitor

    @property
    def events(self) -> list[ts.Event]:
        """Every event raised so far."""
        return self.monitor.events

    # -- helpers -----------------------------------------------------------------------
    def _opt_value(self, var: Any) -> Any:
        """A (possibly purged) optimizer variable's current value, also mid-epoch on JAX."""
        model = self.model
        state = getattr(model, "_jax_state", None)
        if state and not getattr(model, "_jax_state_synced", True) and state.get("optimizer_variables"):
            for ref, val in zip(model.optimizer.variables, state["optimizer_variables"]):
                if ref is var:
                    return val
        return var.value

    def current_lr(self) -> float | None:
        """The learning rate applied at the step just taken, or None if it cannot be read."""
        opt = getattr(self.model, "optimizer", None)
        if opt is None:
            return None
        try:
            lr = opt._learning_rate  # noqa: SLF001 - the schedule object behind the optimizer's learning rate
            if isinstance(lr, keras.optimizers.schedules.LearningRateSchedule):
                iteration = self._iterations0 + max(self._steps_this_fit - 1, 0)
                return _scalar(lr(iteration))
            if isinstance(lr, keras.Variable):
                return _scalar(self._opt_value(lr))
            if callable(lr):
                return _scalar(lr())
            return _scalar(lr)
        except Exception:  # an exotic optimizer: no lr rather than a crash
            return None

    def _report(self, events: list[ts.Event]) -> None:
        for e in events:
            if self.verbose >= 2 or (self.verbose >= 1 and e.severity != "info"):
                print(f"[trainsignals] {e}")
        failing = [e for e in events if self.monitor.stops_on(e) or e.kind.value in self.also_stop_on]
        if not failing or self.stopped_step is not None:
            return
        if self.on_critical == "warn":
            for e in failing:
                warnings.warn(str(e), RuntimeWarning, stacklevel=3)
            return
        self.stopped_step = self.monitor.step
        self.failure_events = failing
        self.model.stop_training = True
        if self.on_critical == "raise":
            if self.restore_best_weights:
                self._restore()
            raise TrainingFailure(failing)
        self._pending_restore = self.restore_best_weights

    def _restore(self) -> None:
        if self.best_weights is None:
            warnings.warn("restore_best_weights: no validation loss was seen, weights kept",
                          RuntimeWarning, stacklevel=3)
            return
        sync = getattr(self.model, "jax_state_sync", None)
        if sync is not None:
            sync()  # JAX: reattach the training state first, so it does not overwrite ours
        self.model.set_weights(self.best_weights)
        if self.verbose:
            print(f"[trainsignals] restored the weights of step {self.best_step} "
                  f"(val_loss {self.best_val_loss:.4g})")

    # -- Keras hooks -------------------------------------------------------------------
    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        """Set up the Monitor and read the optimizer's iteration count."""
        if self._monitor is None and self.total_steps is None:
            epochs, steps = self.params.get("epochs"), self.params.get("steps")
            if epochs and steps:
                self.total_steps = int(epochs) * int(steps)
        _ = self.monitor
        self._var_names = tuple(str(getattr(v, "path", v.name)) for v in self.model.trainable_variables)
        self._steps_this_fit = 0
        self._pending_restore = False
        self.stopped_step = None
        opt = getattr(self.model, "optimizer", None)
        try:
            self._iterations0 = int(_scalar(opt.iterations)) if opt is not None else 0
        except Exception:
            self._iterations0 = 0

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Reset the running-mean bookkeeping (Keras resets its metrics each epoch)."""
        self._prev_mean, self._prev_count = 0.0, 0

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        """Feed the loss, learning rate and gradient statistics of the step(s) just taken."""
        logs = logs if logs is not None else {}
        layer_norms = logs.pop("layer_grad_norms", None)
        count = batch + 1
        n = max(count - self._prev_count, 1)
        self.global_step += n
        self._steps_this_fit += n
        loss: float | None = None
        if "batch_loss" in logs:
            loss = float(logs["batch_loss"])
        elif "loss" in logs:
            mean = float(logs["loss"])
            loss = (count * mean - self._prev_count * self._prev_mean) / n if self._prev_count else mean
            if not math.isfinite(mean):
                loss = mean
            self._prev_mean = mean
        self._prev_count = count
        if loss is not None:
            self._chunk_loss += loss * n
            self._chunk_n += n
        self._since_feed += n
        if self._since_feed < self.log_every:
            return
        self._since_feed = 0
        signals: dict[str, Any] = {}
        if self._chunk_n:
            signals["loss"] = self._chunk_loss / self._chunk_n
        self._chunk_loss, self._chunk_n = 0.0, 0
        for key in ("grad_norm", "update_ratio"):
            if key in logs:
                signals[key] = float(logs[key])
        if layer_norms is not None:
            vec = keras.ops.convert_to_numpy(layer_norms).astype(float).ravel()
            names = self._var_names if len(self._var_names) == len(vec) else tuple(str(i) for i in range(len(vec)))
            signals["layer_grad_norms"] = ts.LayerValues(names, vec)
        lr = self.current_lr()
        if lr is not None:
            signals["lr"] = lr
        self._report(self.monitor.update(step=self.global_step - 1, **signals))

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        """Feed ``val_loss`` at the current step; keep the best weights if asked."""
        logs = logs if logs is not None else {}
        logs.pop("layer_grad_norms", None)
        if "val_loss" not in logs:
            return
        val = float(logs["val_loss"])
        step = max(self.global_step - 1, 0)
        if self.restore_best_weights and math.isfinite(val) and val < self.best_val_loss \
                and self.stopped_step is None:
            self.best_val_loss, self.best_step = val, step
            self.best_weights = self.model.get_weights()
        self._report(self.monitor.update(step=step, val_loss=val))

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        """Restore the best weights if this callback stopped the run."""
        if self._pending_restore:
            self._pending_restore = False
            self._restore()
