"""Hugging Face ``transformers.Trainer`` adapter: a callback that runs a :class:`~trainsignals.adapters.torch.TorchWatcher`.

Add it to the Trainer; nothing else needs configuring::

    from transformers import Trainer
    from trainsignals.adapters.transformers import TrainSignalsCallback

    cb = TrainSignalsCallback()
    trainer = Trainer(model=model, args=args, train_dataset=train, eval_dataset=val, callbacks=[cb])
    trainer.train()
    print(cb.monitor.summary())

When training begins (``on_train_begin``) the callback puts a ``TorchWatcher`` on the model and
on the torch optimizer inside the Trainer's ``AcceleratedOptimizer`` and removes its hooks when
training ends. Where each signal is read:

* **training loss** — the step's own loss, not the Trainer's logged window mean: the callback
  wraps the Trainer's ``training_step`` (an attribute set on the Trainer instance, removed at
  ``on_train_end``) and sums the loss tensors it returns over the step's micro-batches (the
  Trainer already divides each by the number of micro-batches, or normalises it by the step's
  token count, so the sum is the step's loss). The sum stays on the device until the watcher's
  one transfer. It is read *before* the Trainer's ``logging_nan_inf_filter`` replaces a NaN/Inf
  loss by the running mean in its own logs, so a non-finite loss reaches the Monitor at the step
  it happens whatever that setting is;
* **gradient norms before clipping** — the global norm and one per module owning parameters
  (``per_layer="module"``, the default here: the root-square-sum of its tensors' norms), in the
  watcher's one fused kernel. Per parameter tensor (``per_layer="parameter"``, the
  ``TorchWatcher`` default) is not the default because in attention with a separate key
  projection (BERT, RoBERTa, ViT...) the key bias's gradient is zero by construction (softmax
  ignores a shift shared by all keys), which the per-layer check reports as a vanishing
  gradient. The Trainer clips (``max_grad_norm > 0``) or, with clipping off, measures the norm
  with ``max_norm=inf``, through ``trainer.accelerator.clip_grad_norm_`` — once per optimizer
  step, after the last micro-batch's ``backward()`` and before ``on_pre_optimizer_step``. The
  callback wraps that method on the Trainer's ``Accelerator`` instance and calls
  :meth:`TorchWatcher.capture_grads` just before it runs, so the norms are the unclipped ones
  (under fp16 the GradScaler's scale is divided out: the gradients are not unscaled yet). When
  clipping is on, the norm of the clipped gradients the step applied is logged too
  (``trainsignals/grad_norm_applied``), from the unclipped norm by torch's clipping rule
  (``norm · min(1, max_norm / (norm + 1e-6))``: no second pass over the gradients). If the Trainer does not call that method (a sharding
  set-up that clips elsewhere), the optimizer's pre-hook measures the gradients it applies;
* **learning rate** — ``param_groups[0]["lr"]`` of the torch optimizer, read in
  ``on_optimizer_step``, i.e. the rate the step used (before the LR scheduler steps);
* **update ratio** ‖Δw‖/‖w‖ — every ``update_ratio_every`` optimizer steps (10 by default), as
  the watcher does;
* **validation** — ``metrics[val_metric]`` (``"eval_loss"``) in ``on_evaluate`` is fed as
  ``val_loss`` at the latest optimizer step (the Monitor can then call overfitting); an
  accuracy-like metric of the same evaluation (``score_metric``; by default the first of
  ``eval_accuracy``, ``eval_acc``, ``eval_f1``, ``eval_exact_match``,
  ``eval_matthews_correlation``) is kept in :attr:`TrainSignalsCallback.val_history`, logged and
  fed as ``val_metric`` (higher is better, the Monitor's default ``val_metric_mode``; for a
  ``score_metric`` where lower is better, pass ``monitor=Monitor(val_metric_mode="min")``), so a
  score falling back to chance while the training loss falls is reported as ``silent_collapse``.

The Trainer is found when training begins by looking up the call stack for the ``Trainer`` whose
callbacks hold this one (any subclass counts); :meth:`TrainSignalsCallback.attach` names it
instead. Without it only the gradients (as applied), the learning rate and the update ratio are
fed, and one warning says so.

**Once per optimizer step**, in ``on_optimizer_step`` (right after ``optimizer.step()``; with
gradient accumulation once per ``gradient_accumulation_steps`` micro-batches), the watcher
feeds the Monitor with one host transfer, at the 0-based optimizer step (the Trainer's
``state.global_step`` before it is incremented). Under fp16 a step the GradScaler skips is an
``info`` event, not a divergence (see ``TorchWatcher``).

**Logging.** The callback wraps the Trainer's ``log`` (on the instance, removed when training
ends) and adds to every row it writes while training ``trainsignals/loss``,
``trainsignals/grad_norm``, ``trainsignals/lr``, ``trainsignals/update_ratio`` (the latest
measured values), ``trainsignals/grad_norm_applied`` when clipping, ``trainsignals/<metric>``
of the latest evaluation, and the cumulative event counts ``trainsignals/events/<kind>``,
``trainsignals/events/total`` and ``trainsignals/events/critical``. The row reaches
``state.log_history`` and every ``report_to`` integration (they are callbacks that read the
same row). A step with an event sets ``control.should_log``, so it gets its own row. Events are
also reported through the Python logger ``trainsignals.adapters.transformers`` on the main
process (info → INFO, warning → WARNING, critical → ERROR; ``verbose`` chooses which), which
gets a stream handler when the root logger has none.

**Acting.** A critical event (of a kind in the Monitor's ``stop_on``, not handled by the
watcher's ``rollback``), or an event of a kind in ``also_stop_on``, does what ``on_critical``
says: ``"stop"`` sets ``control.should_training_stop`` (the run ends after the current step;
the Trainer's own checkpoint of that step is cancelled unless ``save_on_stop=True``, so the
newest checkpoint stays one from before the failure), ``"raise"`` raises
:class:`~trainsignals.TrainingFailure` out of ``trainer.train()``, ``"warn"`` issues a
``RuntimeWarning`` and trains on. On a stop, :attr:`TrainSignalsCallback.last_good_checkpoint`
names the newest ``checkpoint-N`` in ``args.output_dir`` saved before the failure's onset
(N ≤ the onset step), also in the ERROR message: resume from it with
``trainer.train(resume_from_checkpoint=...)``, e.g. with a lower learning rate.

**Guards** (the watcher's, passed through): ``skip_nonfinite_steps=True`` makes a step whose
gradients hold inf/nan change nothing (decided on the device; an ``info`` event, and the step's
non-finite loss is not fed); ``rollback=True`` goes back to an in-memory snapshot instead of
stopping (model and optimizer; the Trainer's LR scheduler is not rewound).

**Several processes** (``accelerate launch``/``torchrun``, DDP). Each rank runs its own
watcher and Monitor on its own loss (the gradients are all-reduced, so identical). After each
step (and each evaluation) the ranks share two flags — "act" and "this step had an event" — in
one ``all_reduce`` (MAX) of two numbers, so when one rank stops or raises every rank does at the
same step, and every rank forces the same log rows (the Trainer's logging is a collective).
Events are logged on the main process only.

**Checkpoints.** The callback is an ``ExportableState``: :meth:`TrainSignalsCallback.state`
puts the Monitor's state, the event counts and the validation history in every checkpoint's
``trainer_state.json`` (``stateful_callbacks``). On ``trainer.train(resume_from_checkpoint=...)``
the callback restores them when training begins (``state.global_step > 0``), whatever
``restore_callback_states_from_checkpoint`` says; the detectors carry on where they were
instead of warming up again. With that option True the Trainer replaces the callback by a new
instance built from ``state()["args"]``: read it from ``trainer.callback_handler.callbacks``
(and pass ``monitor=None``: a Monitor you gave cannot be rebuilt). Under several processes the
saved state is the main process's, restored on every rank.

Not supported: DeepSpeed (it clips inside its engine: the norm read is the applied one) and
sharded set-ups are untested; several ``TrainSignalsCallback`` on one Trainer are refused.

Importing this module imports ``torch`` and ``transformers``; ``import trainsignals`` does not.
"""

from __future__ import annotations

import inspect
import json
import logging
import math
import os
import re
import warnings
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal

import torch
import transformers
from accelerate.optimizer import AcceleratedOptimizer
from torch import nn
from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

try:   # transformers >= 4.41
    from transformers.trainer_callback import ExportableState
except ImportError:  # pragma: no cover - older transformers: no state in checkpoints
    class ExportableState:  # type: ignore[no-redef]
        """Stand-in for transformers' mixin on versions without it."""

import trainsignals as ts
from trainsignals import TrainingFailure
from trainsignals.adapters.torch import TorchWatcher, check_watcher_options
from trainsignals.signals import DENSE_SIGNALS

__all__ = ["TrainSignalsCallback", "TrainingFailure"]

_log = logging.getLogger(__name__)
if not logging.getLogger().hasHandlers():   # as the Lightning adapter does
    _log.setLevel(logging.INFO)
    _log.addHandler(logging.StreamHandler())
    _log.propagate = False

_LEVEL = {"info": logging.INFO, "warning": logging.WARNING, "critical": logging.ERROR}
_SIGNALS = DENSE_SIGNALS
#: TorchWatcher arguments the callback sets itself.
#: metric names (after the evaluation prefix) taken as the accuracy-like score with score_metric="auto"
_SCORES = ("accuracy", "acc", "f1", "exact_match", "matthews_correlation")
_KINDS = tuple(k.value for k in ts.Kind)
_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")
#: the key of the callback's own state in ``state()`` (next to the Trainer's "args"/"attributes")
_STATE_KEY = "trainsignals"


def _check_kinds(name: str, kinds: Iterable[str]) -> tuple[str, ...]:
    if isinstance(kinds, str):
        raise ValueError(f"{name} must be a sequence of kind names, got the string {kinds!r}")
    out = tuple(kinds)
    bad = [k for k in out if k not in _KINDS]
    if bad:
        raise ValueError(f"{name}: unknown kind(s) {bad}; kinds are {list(_KINDS)}")
    return out



def _jsonable(value: Any) -> bool:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False
    return True


def _torch_optimizer(optimizer: Any) -> torch.optim.Optimizer:
    """The torch optimizer inside accelerate's ``AcceleratedOptimizer`` wrapper(s)."""
    opt = optimizer
    while isinstance(opt, AcceleratedOptimizer):
        opt = opt.optimizer
    if not isinstance(opt, torch.optim.Optimizer):
        raise ValueError(f"TrainSignalsCallback needs a torch.optim.Optimizer; the Trainer has {type(optimizer).__name__}")
    return opt


def _distributed() -> bool:
    return (torch.distributed.is_available() and torch.distributed.is_initialized()
            and torch.distributed.get_world_size() > 1)


class _Patch:
    """An attribute set on one object (a wrapper of its method), undone exactly once."""

    def __init__(self, obj: Any, name: str, make: Callable[[Callable[..., Any]], Callable[..., Any]]) -> None:
        self.obj, self.name = obj, name
        self.had = name in vars(obj)
        self.previous = vars(obj).get(name)
        self.wrapper = make(getattr(obj, name))
        setattr(obj, name, self.wrapper)

    def undo(self) -> None:
        if vars(self.obj).get(self.name) is not self.wrapper:
            return              # replaced since by someone else: leave theirs
        if self.had:
            setattr(self.obj, self.name, self.previous)
        else:
            delattr(self.obj, self.name)


class TrainSignalsCallback(TrainerCallback, ExportableState):
    """Watches ``Trainer.train`` with a :class:`TorchWatcher`; logs signals and events; stops on failure.

    Args:
        monitor: the Monitor to feed; a default ``Monitor(total_steps=...)`` if None (created
            when training first begins and kept for later runs).
        total_steps: planned optimizer steps for the default Monitor; if None, the Trainer's
            ``state.max_steps``.
        on_critical: what a critical event does: ``"stop"`` sets
            ``control.should_training_stop``, ``"raise"`` raises :class:`TrainingFailure`
            (carrying the events) out of ``trainer.train()``, ``"warn"`` only issues a
            ``RuntimeWarning``. Only critical kinds in the Monitor's ``stop_on`` count, and
            not those the watcher's ``rollback`` handled.
        also_stop_on: warning kinds that also stop the run under ``on_critical``'s policy,
            e.g. ``("overfitting",)`` for early stopping.
        val_metric: the ``on_evaluate`` metric fed as ``val_loss``; None feeds none. A missing
            key gives one warning.
        score_metric: an accuracy-like evaluation metric kept in :attr:`val_history`, logged
            and fed as ``val_metric``: a metric name, ``"auto"`` (the first of ``accuracy``, ``acc``, ``f1``,
            ``exact_match``, ``matthews_correlation`` with ``val_metric``'s prefix, e.g.
            ``eval_accuracy``), or None.
        save_on_stop: keep the checkpoint the Trainer would save at the step this callback
            stops at (by default it is cancelled: the weights are the failed ones).
        prefix: the logged names' prefix.
        verbose: 0 reports nothing, 1 warning and critical events, 2 every event.
        **watcher_kwargs: passed to :class:`TorchWatcher` (``per_layer``, ``"module"`` by
            default here — see the module docstring —,
            ``update_ratio_every``, ``activations_every``, ``skip_nonfinite_steps``,
            ``rollback``...); checked here.

    Attributes:
        watcher: the ``TorchWatcher`` of the training in progress (None outside it).
        monitor: the Monitor fed.
        events: the events so far (``monitor.events``).
        event_counts: how many events of each kind this callback saw (a ``Counter`` of kind strings).
        val_history: one dict per evaluation fed: ``step``, ``val_loss`` and the score metric
            (by its name) when present.
        stopped_step: the (0-based) optimizer step at which this callback stopped the run, or None.
        failure_events: the events that caused the stop (empty on a rank stopped by another).
        last_good_checkpoint: on a stop, the newest checkpoint directory saved before the
            failure's onset, or None.

    Raises:
        ValueError: a bad ``monitor``, ``total_steps``, ``on_critical``, ``verbose``,
            ``val_metric``, ``score_metric``, ``prefix`` or kind name, or a bad, reserved or
            unknown watcher option (the message names it).
    """

    def __init__(
        self,
        monitor: ts.Monitor | None = None,
        *,
        total_steps: int | None = None,
        on_critical: Literal["stop", "raise", "warn"] = "stop",
        also_stop_on: Iterable[str] = (),
        val_metric: str | None = "eval_loss",
        score_metric: str | None = "auto",
        save_on_stop: bool = False,
        prefix: str = "trainsignals",
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
        if verbose not in (0, 1, 2) or isinstance(verbose, bool):
            raise ValueError(f"verbose must be 0, 1 or 2, got {verbose!r}")
        for name, v in (("val_metric", val_metric), ("score_metric", score_metric)):
            if v is not None and (not isinstance(v, str) or not v):
                raise ValueError(f"{name} must be a metric name or None, got {v!r}")
        if not isinstance(prefix, str) or not prefix:
            raise ValueError(f"prefix must be a non-empty string, got {prefix!r}")
        if not isinstance(save_on_stop, bool):
            raise ValueError(f"save_on_stop must be a bool, got {save_on_stop!r}")
        self.also_stop_on = _check_kinds("also_stop_on", also_stop_on)
        watcher_kwargs.setdefault("per_layer", "module")
        check_watcher_options(watcher_kwargs)
        self._monitor = monitor
        self._own_monitor = False
        self.total_steps = total_steps
        self.on_critical = on_critical
        self.val_metric = val_metric
        self.score_metric = score_metric
        self.save_on_stop = save_on_stop
        self.prefix = prefix
        self.verbose = verbose
        self.watcher_kwargs = dict(watcher_kwargs)
        self.watcher: TorchWatcher | None = None
        self.event_counts: Counter[str] = Counter()
        self.val_history: list[dict[str, float]] = []
        self.stopped_step: int | None = None
        self.failure_events: list[ts.Event] = []
        self.last_good_checkpoint: str | None = None
        self._n_critical = 0
        self._trainer: Any = None
        self._patches: list[_Patch] = []
        self._loss: torch.Tensor | None = None     # the step's summed micro-batch losses, on the device
        self._captured = False                     # capture_grads ran for this step
        self._max_norm: float | None = None        # the step's clipping threshold (None: no clipping)
        self._latest: dict[str, float] = {}        # the latest value of each logged signal
        self._offset = 0
        self._last_step = -1
        self._stop_now = False                     # stopped at the step in progress: cancel its save
        self._warned: set[str] = set()

    # ------------------------------------------------------------------------------------
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

    def attach(self, trainer: Any) -> TrainSignalsCallback:
        """Name the Trainer this callback watches (found on the call stack when not named).

        Args:
            trainer: the ``transformers.Trainer`` (or subclass) whose callbacks hold this one.

        Returns:
            This callback.

        Raises:
            ValueError: ``trainer`` is not a ``transformers.Trainer``.
        """
        if not isinstance(trainer, transformers.Trainer):
            raise ValueError(f"trainer must be a transformers.Trainer, got {type(trainer).__name__}")
        self._trainer = trainer
        return self

    def _find_trainer(self) -> Any:
        """The Trainer whose callback handler holds this callback, from the call stack (or None)."""
        if self._trainer is not None:
            return self._trainer
        frame = inspect.currentframe()
        try:
            f = frame.f_back if frame is not None else None
            for _ in range(16):
                if f is None:
                    break
                obj = f.f_locals.get("self")
                if isinstance(obj, transformers.Trainer) and any(
                        cb is self for cb in obj.callback_handler.callbacks):
                    return obj
                f = f.f_back
        finally:
            del frame
        return None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            warnings.warn(message, RuntimeWarning, stacklevel=3)

    # ------------------------------------------------------------------------------------
    # Checkpoints (ExportableState)
    # ------------------------------------------------------------------------------------
    def state(self) -> dict[str, Any]:
        """What the Trainer saves in each checkpoint's ``trainer_state.json``.

        ``args`` rebuild an equivalent callback (the JSON-serialisable options; used by the
        Trainer with ``restore_callback_states_from_checkpoint=True``); the ``trainsignals`` key
        holds the Monitor's state, the event counts and the validation history, restored when
        training resumes from the checkpoint.
        """
        args: dict[str, Any] = {
            "total_steps": self.total_steps, "on_critical": self.on_critical,
            "also_stop_on": list(self.also_stop_on), "val_metric": self.val_metric,
            "score_metric": self.score_metric, "save_on_stop": self.save_on_stop, "prefix": self.prefix,
            "verbose": self.verbose,
        }
        args.update({k: v for k, v in self.watcher_kwargs.items() if _jsonable(v)})
        # no Monitor yet (the Trainer asks before training begins): none is created here, so that
        # the default one still takes the Trainer's max_steps
        mon = self._monitor.state_dict() if self._monitor is not None else None
        return {"args": args, "attributes": {},
                _STATE_KEY: {"monitor": mon, "event_counts": dict(self.event_counts),
                             "n_critical": self._n_critical, "val_history": list(self.val_history)}}

    def _restore(self, saved: Mapping[str, Any]) -> None:
        """Continue from a :meth:`state` saved in a checkpoint."""
        missing = sorted({"monitor", "event_counts", "n_critical", "val_history"} - set(saved))
        if missing:
            raise ValueError(f"the checkpoint's {type(self).__name__} state lacks keys {missing}")
        mon = saved["monitor"]
        if mon is None:             # saved before any training step
            return
        config = mon.get("config", {}) if isinstance(mon, Mapping) else {}
        total = config.get("total_steps")
        if self._monitor is None or (self._own_monitor and self._monitor.total_steps != total):
            recorder = self._monitor.recorder if self._monitor is not None else None
            self._monitor = ts.Monitor(total_steps=total, recorder=recorder)
            self._own_monitor = True
            self.total_steps = total
        self._monitor.load_state_dict(mon)
        self.event_counts = Counter({str(k): int(v) for k, v in saved["event_counts"].items()})
        self._n_critical = int(saved["n_critical"])
        self.val_history = [dict(v) for v in saved["val_history"]]

    # ------------------------------------------------------------------------------------
    # Set-up and tear-down
    # ------------------------------------------------------------------------------------
    def on_train_begin(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                       **kwargs: Any) -> None:
        """Restore a resumed run's state, put the watcher on the model and wrap the Trainer's methods."""
        self._close()
        trainer = self._find_trainer()
        if trainer is not None:
            ours = [cb for cb in trainer.callback_handler.callbacks if isinstance(cb, TrainSignalsCallback)]
            if len(ours) > 1:
                raise ValueError("callbacks: a Trainer takes one TrainSignalsCallback; "
                                 f"this one has {len(ours)}")
        stored: Any = state.stateful_callbacks   # a dict of states by class name once built
        saved = stored.get(type(self).__name__) if isinstance(stored, Mapping) else None
        if state.global_step > 0 and isinstance(saved, Mapping) and _STATE_KEY in saved:
            self._restore(saved[_STATE_KEY])    # resumed from a checkpoint
        if self._monitor is None and self.total_steps is None and state.max_steps and state.max_steps > 0:
            self.total_steps = int(state.max_steps)
        model = kwargs.get("model")
        if not isinstance(model, nn.Module):
            raise ValueError("TrainSignalsCallback needs the Trainer's model (an nn.Module)")
        optimizer = _torch_optimizer(kwargs.get("optimizer"))
        accelerator = getattr(trainer, "accelerator", None)
        scaler = getattr(accelerator, "scaler", None)
        self.watcher = TorchWatcher(model, optimizer, self.monitor, total_steps=self.total_steps,
                                    scaler=scaler, on_critical="stop", **self.watcher_kwargs)
        # a Monitor reused by a new training run (global_step from 0 again) continues its numbering
        self._offset = max(0, self.monitor.step + 1 - state.global_step)
        self._last_step = self.monitor.step
        self._loss, self._captured, self._stop_now = None, False, False
        self.stopped_step = None
        self.failure_events = []
        self.last_good_checkpoint = None
        if trainer is None:
            self._warn_once("trainer", "TrainSignalsCallback could not find the Trainer on the call stack: the "
                            "loss is not fed and the grad norm is the applied (clipped) one; call "
                            "callback.attach(trainer) before train()")
            return
        self._patches = [_Patch(trainer, "training_step", self._wrap_training_step),
                         _Patch(trainer, "log", self._wrap_log)]
        if accelerator is not None and hasattr(accelerator, "clip_grad_norm_"):
            self._patches.append(_Patch(accelerator, "clip_grad_norm_", self._wrap_clip))

    def _close(self) -> None:
        for p in reversed(self._patches):
            p.undo()
        self._patches = []
        if self.watcher is not None:
            self.watcher.close()
            self.watcher = None

    def on_train_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                     **kwargs: Any) -> None:
        """Remove the watcher's hooks and the Trainer's wrappers."""
        self._close()

    # ------------------------------------------------------------------------------------
    # The wrappers
    # ------------------------------------------------------------------------------------
    def _wrap_training_step(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def training_step(*args: Any, **kwargs: Any) -> Any:
            loss = original(*args, **kwargs)
            if self.watcher is not None and isinstance(loss, torch.Tensor):
                mine = loss.detach()
                self._loss = mine if self._loss is None else self._loss + mine
            return loss
        return training_step

    def _wrap_clip(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def clip_grad_norm_(parameters: Any, max_norm: Any, *args: Any, **kwargs: Any) -> Any:
            if self.watcher is not None and not self._captured:
                self._captured = True
                limit = float(max_norm)
                self._max_norm = limit if math.isfinite(limit) else None
                # after backward, before the clip (and before accelerate unscales fp16 gradients); the
                # applied norm follows from the clipping rule: no second pass over the gradients
                self.watcher.capture_grads(applied=False)
            return original(parameters, max_norm, *args, **kwargs)
        return clip_grad_norm_

    def _wrap_log(self, original: Callable[..., Any]) -> Callable[..., Any]:
        def log(logs: dict[str, float], *args: Any, **kwargs: Any) -> Any:
            if self.watcher is None or not isinstance(logs, dict):
                return original(logs, *args, **kwargs)
            ours = self._row()
            row = {**logs, **ours}
            try:
                return original(row, *args, **kwargs)
            finally:
                # what the Trainer adds to the caller's dict (the epoch...) it still adds, but not our
                # values: evaluate() returns the dict it logged
                logs.update({k: v for k, v in row.items() if k not in ours})
        return log

    def _row(self) -> dict[str, float]:
        p = self.prefix
        row = {f"{p}/{k}": float(v) for k, v in self._latest.items()}
        if self.event_counts:
            row.update({f"{p}/events/{k}": float(n) for k, n in sorted(self.event_counts.items())})
            row[f"{p}/events/total"] = float(sum(self.event_counts.values()))
            row[f"{p}/events/critical"] = float(self._n_critical)
        return row

    # ------------------------------------------------------------------------------------
    # Training
    # ------------------------------------------------------------------------------------
    def on_optimizer_step(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                          **kwargs: Any) -> None:
        """Feed the watcher this optimizer step's loss and measurements (one transfer); act on events."""
        if self.watcher is None:
            return
        step = state.global_step + self._offset
        loss, self._loss, self._captured = self._loss, None, False
        max_norm, self._max_norm = self._max_norm, None
        events = self.watcher.update(loss=loss, step=step)
        self._last_step = step
        handled = not self.watcher.should_stop    # critical events a rollback took care of
        # with sync_every > 1 the step may still be held on the device: its signals come later
        if self.watcher.monitor.step == step:
            got = self.watcher.last_signals
            latest = self.watcher.latest_signals     # also the held steps' of a sync_every block
            self._latest.update({k: float(latest[k]) for k in _SIGNALS if k in latest})
            if max_norm is not None and "grad_norm" in got:
                # torch's clip_grad_norm_ scales by min(1, max_norm / (norm + 1e-6))
                norm = float(got["grad_norm"])
                self._latest["grad_norm_applied"] = norm * min(1.0, max_norm / (norm + 1e-6))
        self._handle(args, state, control, step, events, criticals_count=not handled, in_step=True)

    def on_step_end(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    **kwargs: Any) -> None:
        """Cancel the checkpoint of the step this callback stopped at (unless ``save_on_stop``)."""
        if self._stop_now and not self.save_on_stop:
            control.should_save = False
        self._stop_now = False

    def on_evaluate(self, args: TrainingArguments, state: TrainerState, control: TrainerControl,
                    metrics: Mapping[str, Any] | None = None, **kwargs: Any) -> None:
        """Feed the validation loss at the latest optimizer step; keep the score metric."""
        if self.watcher is None or self.val_metric is None or not metrics:
            return
        value = metrics.get(self.val_metric)
        if value is None:
            self._warn_once("val", f"TrainSignalsCallback: val_metric {self.val_metric!r} is not among the "
                            f"evaluation metrics {sorted(metrics)}; no validation loss is fed")
            return
        step = max(self._last_step, 0)
        record: dict[str, float] = {"step": float(step), "val_loss": float(value)}
        name = self._score_name(metrics)
        score = None
        if name is not None and isinstance(metrics.get(name), (int, float)):
            score = record[name] = float(metrics[name])
            self._latest[name] = float(metrics[name])
        self.val_history.append(record)
        self._latest[self.val_metric] = float(value)
        held = self.watcher.flush()   # steps that sync_every held back come first
        events = held + self.monitor.update(step=step, val_loss=float(value), val_metric=score)
        self._handle(args, state, control, step, events, criticals_count=True, in_step=False)

    def _score_name(self, metrics: Mapping[str, Any]) -> str | None:
        if self.score_metric is None:
            return None
        if self.score_metric != "auto":
            return self.score_metric if self.score_metric in metrics else None
        head = self.val_metric.rsplit("_", 1)[0] + "_" if self.val_metric and "_" in self.val_metric else ""
        return next((head + s for s in _SCORES if head + s in metrics), None)

    # ------------------------------------------------------------------------------------
    # Reporting and acting
    # ------------------------------------------------------------------------------------
    def _handle(self, args: TrainingArguments, state: TrainerState, control: TrainerControl, step: int,
                events: list[ts.Event], *, criticals_count: bool, in_step: bool) -> None:
        self.event_counts.update(e.kind.value for e in events)
        self._n_critical += sum(e.severity == "critical" for e in events)
        if state.is_world_process_zero:
            for e in events:
                if self.verbose >= 2 or (self.verbose >= 1 and e.severity != "info"):
                    _log.log(_LEVEL.get(e.severity, logging.WARNING), "[trainsignals] %s", e)
        failing = [e for e in events
                   if (criticals_count and self.monitor.stops_on(e)) or e.kind.value in self.also_stop_on]
        act = bool(failing) and self.stopped_step is None
        any_events = bool(events)
        if _distributed():   # one rank acts: all act; one rank logs a row: all do (logging is a collective)
            flags = torch.tensor([float(act), float(any_events)], device=args.device)
            torch.distributed.all_reduce(flags, op=torch.distributed.ReduceOp.MAX)
            act, any_events = bool(flags[0].item()), bool(flags[1].item())
        if any_events and in_step:
            control.should_log = True
        if not act:
            return
        if self.on_critical == "warn":
            for e in failing:
                warnings.warn(str(e), RuntimeWarning, stacklevel=3)
            return
        self.stopped_step = step
        self.failure_events = failing
        control.should_training_stop = True
        self._stop_now = in_step
        onset = min((e.onset_step for e in failing), default=step) - self._offset
        self.last_good_checkpoint = _checkpoint_before(args.output_dir, onset)
        if state.is_world_process_zero and self.verbose >= 1:
            where = (f"; the last checkpoint before the onset is {self.last_good_checkpoint} "
                     f"(trainer.train(resume_from_checkpoint=...))" if self.last_good_checkpoint else "")
            why = "; ".join(f"{e.kind.value} since step {e.onset_step}" for e in failing) or "another process"
            _log.error("[trainsignals] training %s at step %d: %s%s",
                       "stopped" if self.on_critical == "stop" else "failed", step, why, where)
        if self.on_critical == "raise":
            self._close()            # the Trainer calls no on_train_end when train() raises
            raise TrainingFailure(failing)


def _checkpoint_before(output_dir: str | None, onset: int) -> str | None:
    """The newest ``checkpoint-N`` directory of ``output_dir`` with ``N <= onset`` (its weights
    are those before step ``onset`` ran), or None.
    """
    if not output_dir or not os.path.isdir(output_dir):
        return None
    best: tuple[int, str] | None = None
    for name in os.listdir(output_dir):
        m = _CHECKPOINT.match(name)
        path = os.path.join(output_dir, name)
        if m and int(m.group(1)) <= onset and os.path.isdir(path) and (best is None or int(m.group(1)) > best[0]):
            best = (int(m.group(1)), path)
    return best[1] if best is not None else None
