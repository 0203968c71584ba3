"""PyTorch Lightning adapter: a callback that runs a :class:`~trainsignals.adapters.torch.TorchWatcher`.

:class:`TrainSignalsCallback` puts a ``TorchWatcher`` on the ``LightningModule`` and its
optimizer when ``fit`` starts and removes its hooks when ``fit`` ends (or fails). In between:

* **once per optimizer step** it feeds the watcher the step's training loss — with
  ``accumulate_grad_batches=k`` the mean of the ``k`` micro-batch losses, measured once, at the
  step — and the watcher measures the gradients, the learning rate and (sampled) the update
  ratio on the device, with one host transfer per step. The gradients are read in
  ``on_before_optimizer_step``, i.e. after ``backward()`` and *before* Lightning clips them
  (``gradient_clip_val``) and, under ``precision="16-mixed"``, after the GradScaler unscaled
  them: the grad norm is the unclipped, unscaled one. A step the GradScaler skips is an
  ``info`` event, not a divergence (see ``TorchWatcher``);
* **when validation ends** it feeds ``trainer.callback_metrics[val_metric]`` (``"val_loss"``
  by default: log it with ``self.log("val_loss", ...)`` in ``validation_step``) at the current
  step, so the Monitor can call overfitting; the sanity check is ignored; with
  ``score_metric`` (e.g. ``"val_acc"``) that metric is fed as ``val_metric`` too, so a
  validation accuracy falling back to chance is seen (its direction: the Monitor's
  ``val_metric_mode``, ``"max"`` by default);
* when ``training_step`` returns a dict with the batch's logits under ``logits_key``
  (``{"loss": loss, "logits": logits}``), it feeds the share of the most-predicted class
  (:func:`~trainsignals.adapters.torch.pred_top_share`, on the device, in the step's one
  transfer) as ``pred_top_share``: predictions collapsing onto one class while the loss falls
  are a silent collapse; a regression's predictions under ``preds_key`` (``{"loss": loss,
  "preds": preds}``) feed their spread (:func:`~trainsignals.adapters.torch.pred_spread`) as
  ``pred_spread``, its form of the same;
* it **logs** the signals and cumulative event counts through every logger of the trainer
  (``logger.log_metrics``): ``trainsignals/loss``, ``trainsignals/grad_norm``,
  ``trainsignals/lr``, ``trainsignals/update_ratio``, ``trainsignals/grad_norm_applied`` (when
  the gradients are clipped) — each the latest value measured: the update ratio is measured
  every ``update_ratio_every`` steps, with ``sync_every`` the steps come in blocks — and
  ``trainsignals/events/<kind>`` — how many events of that kind fired so far — with
  ``trainsignals/events/total`` and ``trainsignals/events/critical``. A row is written every
  ``log_every_n_steps`` optimizer steps (the trainer's setting by default) and at every step
  with an event, at the 0-based optimizer step (Lightning's own logging step when there is
  one optimizer). Metrics logged with ``self.log`` cannot be written from
  ``on_validation_end``, hence the loggers directly;
* it **reports** events through the Python logger ``trainsignals.adapters.lightning``
  (info → INFO, warning → WARNING, critical → ERROR; ``verbose`` chooses which), on global
  rank 0 only. Like Lightning's own logger it gets a stream handler when the root logger has
  none;
* it **acts** on a critical event (of a kind in the Monitor's ``stop_on``, not handled by the
  watcher's ``rollback``) or on a kind in ``also_stop_on``: ``on_critical="stop"`` sets
  ``trainer.should_stop`` (the run ends after the current batch), ``"raise"`` raises
  :class:`~trainsignals.TrainingFailure` out of ``trainer.fit``, ``"warn"`` issues a
  ``RuntimeWarning`` and trains on (Lightning honours ``min_steps``/``min_epochs`` before a
  stop). Under several processes the decision is shared (``strategy.reduce_boolean_decision``,
  one small collective per optimizer step): when one rank stops or raises, all do;
* it **checkpoints**: the Monitor's state and the event counts are saved in Lightning
  checkpoints (``state_dict``) and restored by ``trainer.fit(ckpt_path=...)``, so the
  detectors carry on where they were instead of warming up again.

What is supported:

* **automatic optimization** (one optimizer, Lightning's rule), with or without gradient
  accumulation, gradient clipping, LR schedulers and mixed precision;
* **manual optimization** with one optimizer: the loss is ``training_step``'s return value
  (a tensor, or ``output[loss_key]`` of a dict; without it only the gradients and the learning
  rate are fed), the step is measured in ``opt.step()``. If the optimizer steps several times
  in one batch, the batch gives one update with the last step's measurements;
* **several optimizers** (manual optimization): one callback per optimizer, each with
  ``optimizer_index`` and the ``loss_key`` of its loss in ``training_step``'s returned dict;
  the watcher then measures only the parameters that optimizer holds (names as in
  ``named_parameters()``) and activation statistics are not available. Without
  ``optimizer_index`` a module with several optimizers is refused at ``fit`` start.

Not supported: strategies whose optimizer step bypasses Lightning's
``on_before_optimizer_step`` hook (the gradients would be read before ``backward``). Sharded
strategies (FSDP, DeepSpeed ZeRO) are untested: each rank would measure its own shard.

Example::

    import lightning as L
    from lightning.pytorch.loggers import CSVLogger
    from trainsignals.adapters.lightning import TrainSignalsCallback

    cb = TrainSignalsCallback(per_layer="module")      # TorchWatcher options pass through
    trainer = L.Trainer(max_steps=2000, callbacks=[cb], logger=CSVLogger("logs"))
    trainer.fit(model, train_loader, val_loader)
    print(cb.monitor.summary())
    if cb.stopped_step is not None:
        print("stopped at", cb.stopped_step, [str(e) for e in cb.failure_events])

Importing this module imports ``torch`` and ``lightning``; ``import trainsignals`` does not.
"""

from __future__ import annotations

import logging
import math
import warnings
from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch import nn

import trainsignals as ts
from trainsignals import TrainingFailure, check_kinds
from trainsignals.adapters.torch import TorchWatcher, check_watcher_options, pred_spread, pred_top_share
from trainsignals.signals import DENSE_SIGNALS

__all__ = ["TrainSignalsCallback", "TrainingFailure"]

_log = logging.getLogger(__name__)
if not logging.getLogger().hasHandlers():   # as lightning.pytorch does for its own logger
    _log.setLevel(logging.INFO)
    _log.addHandler(logging.StreamHandler())
    _log.propagate = False

_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}
_SIGNALS = DENSE_SIGNALS
_LOGGED = (*_SIGNALS, "grad_norm_applied")   # the norm after clipping: logged, not a Monitor input
#: TorchWatcher arguments the callback sets itself.


class _ParamView(nn.Module):
    """A module holding (not copying) some of another module's parameters under their own names."""

    def __init__(self, named: Iterable[tuple[str, nn.Parameter]]) -> None:
        super().__init__()
        for name, p in named:
            *path, leaf = name.split(".")
            mod: nn.Module = self
            for part in path:
                child = mod._modules.get(part)  # noqa: SLF001 - torch's module registry: submodules by name
                if child is None:
                    child = nn.Module()
                    mod.add_module(part, child)
                mod = child
            mod.register_parameter(leaf, p)



def _as_float(value: Any) -> float:
    if isinstance(value, torch.Tensor):
        return float(value.detach().float().reshape(-1)[0].item())
    return float(value)


class TrainSignalsCallback(Callback):
    """Watches ``trainer.fit`` with a :class:`TorchWatcher`; logs signals and events; stops on failure.

    Args:
        monitor: the Monitor to feed; a default ``Monitor(total_steps=...)`` if None (created
            at the first ``fit`` and kept for later ones).
        total_steps: planned optimizer steps for the default Monitor; if None, the trainer's
            ``max_steps``, else its ``estimated_stepping_batches`` when finite.
        on_critical: what a critical event does: ``"stop"`` sets ``trainer.should_stop``,
            ``"raise"`` raises :class:`TrainingFailure` (carrying the events) out of ``fit``,
            ``"warn"`` only issues a ``RuntimeWarning``. Only critical kinds in the Monitor's
            ``stop_on`` count, and not those the watcher's ``rollback`` handled.
        also_stop_on: warning kinds that also stop the run under ``on_critical``'s policy,
            e.g. ``("overfitting",)`` for early stopping.
        val_metric: the ``trainer.callback_metrics`` key fed as ``val_loss`` when validation
            ends; None feeds no validation loss. A missing key gives one warning.
        loss_key: where the training loss is in ``training_step``'s returned dict (a returned
            tensor is the loss itself).
        logits_key: where the batch's logits (classes along the last dimension) are in
            ``training_step``'s returned dict, fed as ``pred_top_share``; None feeds none.
        preds_key: where a regression's predictions (the batch along the first dimension) are
            in ``training_step``'s returned dict, fed as ``pred_spread``; None feeds none.
        score_metric: the ``trainer.callback_metrics`` key fed as ``val_metric`` when
            validation ends (an accuracy, ...); None (default) feeds none.
        optimizer_index: which of the trainer's optimizers to watch; required when there are
            several (manual optimization), one callback per optimizer.
        log_every_n_steps: write the signals to the loggers every this many optimizer steps
            (steps with events are always written); None: the trainer's ``log_every_n_steps``;
            0: only steps with events.
        prefix: the metric names' prefix; default ``"trainsignals"``, or
            ``"trainsignals/opt<i>"`` with ``optimizer_index=i``.
        verbose: 0 reports nothing, 1 warning and critical events, 2 every event.
        **watcher_kwargs: passed to :class:`TorchWatcher` (``per_layer``,
            ``update_ratio_every``, ``activations_every``, ``skip_nonfinite_steps``,
            ``rollback``...); checked here.

    Attributes:
        watcher: the ``TorchWatcher`` of the ``fit`` in progress (None outside ``fit``).
        monitor: the Monitor fed.
        events: the events so far (``monitor.events``).
        event_counts: how many events of each kind this callback saw (a ``Counter`` of kind strings).
        stopped_step: the (0-based) optimizer step at which this callback stopped the run, or None.
        failure_events: the events that caused the stop.

    Raises:
        ValueError: a bad ``on_critical``, ``verbose``, ``log_every_n_steps``,
            ``optimizer_index``, ``val_metric``, ``loss_key`` or kind name, or a bad, reserved
            or unknown watcher option (the message names it).
    """

    def __init__(
        self,
        monitor: ts.Monitor | None = None,
        *,
        total_steps: int | None = None,
        on_critical: Literal["stop", "raise", "warn"] = "stop",
        also_stop_on: Iterable[str] = (),
        val_metric: str | None = "val_loss",
        loss_key: str = "loss",
        logits_key: str | None = "logits",
        preds_key: str | None = "preds",
        score_metric: str | None = None,
        optimizer_index: int | None = None,
        log_every_n_steps: int | None = None,
        prefix: str | None = None,
        verbose: int = 1,
        **watcher_kwargs: Any,
    ) -> None:
        super().__init__()
        if on_critical not in ("stop", "warn", "raise"):
            raise ValueError(f"on_critical must be 'stop', 'warn' or 'raise', got {on_critical!r}")
        if monitor is not None and not isinstance(monitor, ts.Monitor):
            raise ValueError(f"monitor must be a trainsignals.Monitor or None, got {monitor!r}")
        if total_steps is not None and (isinstance(total_steps, bool) or not isinstance(total_steps, int)
                                        or total_steps < 1):
            raise ValueError(f"total_steps must be an integer >= 1 or None, got {total_steps!r}")
        for name, v, low in (("optimizer_index", optimizer_index, 0), ("log_every_n_steps", log_every_n_steps, 0)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < low):
                raise ValueError(f"{name} must be an integer >= {low} or None, got {v!r}")
        if verbose not in (0, 1, 2) or isinstance(verbose, bool):
            raise ValueError(f"verbose must be 0, 1 or 2, got {verbose!r}")
        if val_metric is not None and (not isinstance(val_metric, str) or not val_metric):
            raise ValueError(f"val_metric must be a metric name or None, got {val_metric!r}")
        if not isinstance(loss_key, str) or not loss_key:
            raise ValueError(f"loss_key must be a non-empty string, got {loss_key!r}")
        for name, key in (("logits_key", logits_key), ("preds_key", preds_key), ("score_metric", score_metric)):
            if key is not None and (not isinstance(key, str) or not key):
                raise ValueError(f"{name} must be a non-empty string or None, got {key!r}")
        if prefix is not None and not isinstance(prefix, str):
            raise ValueError(f"prefix must be a string or None, got {prefix!r}")
        self.also_stop_on = check_kinds("also_stop_on", also_stop_on)
        check_watcher_options(watcher_kwargs)
        self._monitor = monitor
        self.total_steps = total_steps
        self.on_critical = on_critical
        self.val_metric = val_metric
        self.loss_key = loss_key
        self.logits_key = logits_key
        self.preds_key = preds_key
        self.score_metric = score_metric
        self.optimizer_index = optimizer_index
        self.log_every_n_steps = log_every_n_steps
        self.prefix = prefix if prefix is not None else (
            "trainsignals" if optimizer_index is None else f"trainsignals/opt{optimizer_index}")
        self.verbose = verbose
        self.watcher_kwargs = dict(watcher_kwargs)
        self.watcher: TorchWatcher | None = None
        self.event_counts: Counter[str] = Counter()
        self.stopped_step: int | None = None
        self.failure_events: list[ts.Event] = []
        self._n_critical = 0
        self._own_monitor = False
        self._pending: dict[str, Any] | None = None
        self._optimizer: torch.optim.Optimizer | None = None
        self._offset = 0
        self._last_step = -1
        self._opt_steps = 0                      # our optimizer's steps during the current batch
        self._loss_sum: torch.Tensor | float | None = None
        self._loss_n = 0
        self._share: torch.Tensor | None = None  # the latest micro-batch's pred_top_share
        self._spread: torch.Tensor | None = None  # and pred_spread
        self._warned_val = False
        self._latest: dict[str, float] = {}      # the latest measured value of each logged signal

    @property
    def state_key(self) -> str:
        """Distinguishes several callbacks of this class on one trainer (one per optimizer)."""
        return self._generate_state_key(optimizer_index=self.optimizer_index, prefix=self.prefix)

    @property
    def monitor(self) -> ts.Monitor:
        """The Monitor fed (created on first use when none was given)."""
        if self._monitor is None:
            self._monitor = ts.Monitor(total_steps=self.total_steps)
            self._own_monitor = True
        return self._monitor

    @property
    def events(self) -> list[ts.Event]:
        """Every event raised so far, in order (``monitor.events``: its latest ``max_events``)."""
        return self.monitor.events

    # ------------------------------------------------------------------------------------
    # Set-up and tear-down
    # ------------------------------------------------------------------------------------
    def _pick_optimizer(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> tuple[nn.Module, Any]:
        optimizers = list(trainer.optimizers)
        if not optimizers:
            raise ValueError("TrainSignalsCallback needs an optimizer: configure_optimizers returned none")
        if self.optimizer_index is None:
            if len(optimizers) > 1:
                raise ValueError(
                    f"optimizer_index: the LightningModule has {len(optimizers)} optimizers; add one "
                    f"TrainSignalsCallback per optimizer, each with optimizer_index=i (and the loss_key of "
                    f"its loss in training_step's returned dict)")
            return pl_module, optimizers[0]
        if self.optimizer_index >= len(optimizers):
            raise ValueError(f"optimizer_index must be < {len(optimizers)} (the number of optimizers), "
                             f"got {self.optimizer_index}")
        opt = optimizers[self.optimizer_index]
        if len(optimizers) == 1:
            return pl_module, opt
        if self.watcher_kwargs.get("activations_every", 0):
            raise ValueError("activations_every must be 0 with several optimizers: the watcher of one "
                             "optimizer sees its parameters, not the module's activations")
        mine = {id(p) for g in opt.param_groups for p in g["params"]}
        return _ParamView((n, p) for n, p in pl_module.named_parameters() if id(p) in mine), opt

    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Put a TorchWatcher on the module and its optimizer (the optimizers exist from here on)."""
        self._close()
        model, opt = self._pick_optimizer(trainer, pl_module)
        if self._pending is not None:          # a checkpoint restored before on_fit_start
            self._apply_pending()
        if self._monitor is None and self.total_steps is None:
            if trainer.max_steps and trainer.max_steps > 0:
                self.total_steps = int(trainer.max_steps)
            else:
                est = trainer.estimated_stepping_batches
                if math.isfinite(est) and est >= 1:
                    self.total_steps = int(est)
        monitor = self.monitor
        self._optimizer = opt
        self.watcher = TorchWatcher(model, opt, monitor, total_steps=self.total_steps,
                                    scaler=getattr(trainer.precision_plugin, "scaler", None),
                                    on_critical="stop", **self.watcher_kwargs)
        self._opt_steps = 0
        self._loss_sum, self._loss_n = None, 0
        self._latest = {}
        self.stopped_step = None
        self.failure_events = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Align the Monitor's steps with the trainer's (after a checkpoint was restored)."""
        # a Monitor reused by a new Trainer (global_step from 0 again) continues its step numbering
        self._offset = max(0, self.monitor.step + 1 - trainer.global_step)
        self._last_step = self.monitor.step

    def state_dict(self) -> dict[str, Any]:
        """The Monitor's state and the event counts, saved in Lightning checkpoints."""
        return {"monitor": self.monitor.state_dict(), "event_counts": dict(self.event_counts),
                "n_critical": self._n_critical}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict` (``trainer.fit(ckpt_path=...)``): the Monitor continues.

        A Monitor this callback created takes the saved one's ``total_steps``; a Monitor you
        gave must have the saved configuration (else ``ValueError`` names the keys). Lightning
        restores callbacks before or after ``on_fit_start`` depending on the strategy; both work.
        """
        missing = sorted({"monitor", "event_counts", "n_critical"} - set(state_dict))
        if missing:
            raise ValueError(f"state_dict is not a TrainSignalsCallback state: missing keys {missing}")
        self._pending = dict(state_dict)
        if self.watcher is not None:
            self._apply_pending()

    def _apply_pending(self) -> None:
        state, self._pending = self._pending, None
        assert state is not None
        saved = state["monitor"]
        config = saved.get("config", {}) if isinstance(saved, Mapping) else {}
        total = config.get("total_steps")
        if self._monitor is None or (self._own_monitor and self._monitor.total_steps != total):
            recorder = self._monitor.recorder if self._monitor is not None else None
            self._monitor = ts.Monitor(total_steps=total, recorder=recorder)
            self._own_monitor = True
            self.total_steps = total
            if self.watcher is not None:
                self.watcher.monitor = self._monitor
        self._monitor.load_state_dict(saved)
        self.event_counts = Counter({str(k): int(v) for k, v in state["event_counts"].items()})
        self._n_critical = int(state["n_critical"])

    def _close(self) -> None:
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None
        self._optimizer = None

    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Remove the watcher's hooks."""
        self._close()

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Remove the watcher's hooks (also after a ``fit`` that ended early)."""
        self._close()

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        """Remove the watcher's hooks when ``fit`` fails (Lightning skips ``teardown`` then)."""
        self._close()

    # ------------------------------------------------------------------------------------
    # Training
    # ------------------------------------------------------------------------------------
    def on_before_optimizer_step(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                                 optimizer: torch.optim.Optimizer) -> None:
        """Measure the gradients: after backward, before clipping, unscaled under a GradScaler."""
        if self.watcher is None or getattr(optimizer, "_optimizer", optimizer) is not self._optimizer:
            return
        # the applied (clipped) norm differs only when Lightning clips, or the user may (manual optimization)
        clip = trainer.gradient_clip_val
        self.watcher.capture_grads(applied=bool(clip) or not pl_module.automatic_optimization)
        self._opt_steps += 1

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                           batch: Any, batch_idx: int) -> None:
        """Collect the micro-batch loss; after an optimizer step, feed the watcher once and act."""
        if self.watcher is None:
            return
        loss = outputs.get(self.loss_key) if isinstance(outputs, Mapping) else outputs
        if isinstance(loss, torch.Tensor | int | float) and not isinstance(loss, bool):
            loss = loss.detach() if isinstance(loss, torch.Tensor) else float(loss)
            self._loss_sum = loss if self._loss_sum is None else self._loss_sum + loss
            self._loss_n += 1
        logits = outputs.get(self.logits_key) if self.logits_key and isinstance(outputs, Mapping) else None
        if isinstance(logits, torch.Tensor) and logits.is_floating_point() and logits.dim() >= 2:
            self._share = pred_top_share(logits)
        preds = outputs.get(self.preds_key) if self.preds_key and isinstance(outputs, Mapping) else None
        if isinstance(preds, torch.Tensor) and preds.is_floating_point() and preds.dim() >= 1 and len(preds) >= 2:
            self._spread = pred_spread(preds)
        if self._opt_steps == 0:
            return                                # accumulating: no optimizer step in this batch
        step = trainer.global_step - 1 + self._offset
        mean = None
        if self._loss_sum is not None:
            # automatic optimization divides each micro-batch loss by accumulate_grad_batches
            scale = trainer.accumulate_grad_batches if pl_module.automatic_optimization else 1
            mean = self._loss_sum * (scale / self._loss_n)
        self._opt_steps = 0
        self._loss_sum, self._loss_n = None, 0
        (share, spread), self._share, self._spread = (self._share, self._spread), None, None
        events = self.watcher.update(loss=mean, step=step, pred_top_share=share, pred_spread=spread)
        self._last_step = step
        handled = not self.watcher.should_stop    # critical events a rollback took care of
        # with sync_every > 1 the step may still be held on the device: its signals come later
        if self.watcher.monitor.step == step:
            # the latest value of each signal, also one measured every few steps or held in a sync_every block
            latest = self.watcher.latest_signals
            self._latest.update({k: float(latest[k]) for k in _SIGNALS if k in latest})
            if self.watcher.last_applied_grad_norm is not None:   # after Lightning clipped
                self._latest["grad_norm_applied"] = self.watcher.last_applied_grad_norm
        self._handle(trainer, step, events, criticals_count=not handled, signals=self._latest)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Feed the validation loss (and score) at the current step (not during the sanity check)."""
        if self.watcher is None or trainer.sanity_checking:
            return
        fed: dict[str, float] = {}
        for key, signal in ((self.val_metric, "val_loss"), (self.score_metric, "val_metric")):
            if key is None:
                continue
            value = trainer.callback_metrics.get(key)
            if value is not None:
                fed[signal] = _as_float(value)
            elif not self._warned_val:
                self._warned_val = True
                warnings.warn(f"TrainSignalsCallback: {'val_metric' if signal == 'val_loss' else 'score_metric'} "
                              f"{key!r} is not among the logged metrics {sorted(trainer.callback_metrics)}; no "
                              f"{'validation loss' if signal == 'val_loss' else 'validation score'} is fed",
                              RuntimeWarning, stacklevel=2)
        if not fed:
            return
        step = max(self._last_step, 0)
        held = self.watcher.flush()   # steps that sync_every held back come first
        events = held + self.monitor.update(step=step, val_loss=fed.get("val_loss"), val_metric=fed.get("val_metric"))
        self._handle(trainer, step, events, criticals_count=True, signals={})

    # ------------------------------------------------------------------------------------
    # Logging, reporting, acting
    # ------------------------------------------------------------------------------------
    def _handle(self, trainer: pl.Trainer, step: int, events: list[ts.Event], *, criticals_count: bool,
                signals: Mapping[str, float]) -> None:
        self.event_counts.update(e.kind.value for e in events)
        self._n_critical += sum(e.severity == "critical" for e in events)
        self._report(trainer, events)
        failing = [e for e in events
                   if (criticals_count and self.monitor.stops_on(e)) or e.kind.value in self.also_stop_on]
        act = bool(failing) and self.stopped_step is None
        if self.on_critical != "warn":
            act = trainer.strategy.reduce_boolean_decision(act, all=False)   # one rank stops: all stop
        self._log(trainer, step, signals, force=bool(events) or act)
        if not act:
            return
        if self.on_critical == "warn":
            for e in failing:
                warnings.warn(str(e), RuntimeWarning, stacklevel=3)
            return
        self.stopped_step = step
        self.failure_events = failing
        trainer.should_stop = True
        if self.on_critical == "raise":
            raise TrainingFailure(failing)

    def _report(self, trainer: pl.Trainer, events: list[ts.Event]) -> None:
        if not trainer.is_global_zero:
            return
        for e in events:
            if self.verbose >= 2 or (self.verbose >= 1 and e.severity != "info"):
                _log.log(_LEVEL.get(e.severity, logging.WARNING), "[trainsignals] %s", e)

    def _log(self, trainer: pl.Trainer, step: int, signals: Mapping[str, float], *, force: bool) -> None:
        if not trainer.loggers:
            return
        every = getattr(trainer, "log_every_n_steps", 50) if self.log_every_n_steps is None else self.log_every_n_steps
        if not force and not (signals and every and (step + 1) % every == 0):
            return
        p = self.prefix
        metrics = {f"{p}/{k}": float(v) for k, v in signals.items() if k in _LOGGED}
        if self.event_counts:
            metrics.update({f"{p}/events/{k}": float(n) for k, n in self.event_counts.items()})
            metrics[f"{p}/events/total"] = float(sum(self.event_counts.values()))
            metrics[f"{p}/events/critical"] = float(self._n_critical)
        if not metrics:
            return
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=step)
