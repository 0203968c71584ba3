"""PyTorch adapter: measure a hand-written training loop with optimizer hooks, one host transfer per step.

:class:`TorchWatcher` hooks the optimizer (``register_step_pre_hook`` /
``register_step_post_hook``) and, optionally, the model's activation modules
(``register_forward_hook``). It measures on the device and feeds a
:class:`~trainsignals.Monitor`:

* **gradients** — in the optimizer's step *pre*-hook, i.e. after ``backward()`` and after any
  clipping you did, before the weights change: one fused multi-tensor kernel
  (``torch._foreach_norm``) gives every parameter tensor's grad norm; the global norm and the
  per-layer norms are assembled from them on the device. A parameter whose ``.grad`` is None (a
  frozen layer, an unused branch) is not measured: a layer none of whose parameters has a
  gradient is fed as NaN, and at a step where no parameter has one (``backward()`` forgotten,
  ``zero_grad()`` before ``step()``) no grad norm is fed at all, global or per layer — a norm
  of exactly 0 always means gradients computed as 0;
* **update ratio** ‖Δw‖/‖w‖ — every ``update_ratio_every`` optimizer steps the pre-hook copies
  the parameters (**one extra copy of the parameters, on measuring steps only**, freed in the
  post-hook; kept allocated when measuring every step; none for plain SGD, whose
  ‖Δw‖ = lr‖g‖) and the post-hook differences them; global and per layer
  (the Monitor takes both: the per-layer ratios feed its ``layer_update_ratio`` check, and are
  also in :attr:`TorchWatcher.last_layer_update_ratios`);
* **learning rate** — ``optimizer.param_groups[0]["lr"]`` is fed as ``lr``; when groups differ,
  all of them are in :attr:`TorchWatcher.last_lrs`;
* **activations** (``activations_every > 0``) — forward hooks on modules of
  ``activation_types`` measure, on the measuring steps, the fraction of dead units (a unit —
  each output element past the batch dimension — is dead when it is exactly 0 for every sample
  of the batch) and, for ``Tanh`` (|y| > 0.99) and ``Sigmoid`` (y < 0.01 or y > 0.99), the
  saturated fraction. Only forward passes in training mode count (validation passes in
  ``model.eval()`` are ignored); several forward passes in one step (gradient accumulation)
  are averaged. With ``functional_activations=True`` the activation *functions* called in a
  forward (``F.relu``, ``torch.relu``, ``x.relu()``, ``F.gelu``, ``torch.tanh``,
  ``torch.sigmoid``...) are measured too, as layers ``"<module>:<function>"`` (see
  :class:`TorchWatcher`).

Everything — the loss, the norms, the ratios, the activation statistics — is stacked into
**one** tensor and brought to the host with **one** ``.cpu().numpy()`` in :meth:`TorchWatcher.update`:
no synchronisation per parameter.

Where to call it::

    watcher = TorchWatcher(model, optimizer, total_steps=len(loader) * epochs)
    for x, y in loader:
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()                   # the hooks measure here
        events = watcher.update(loss=loss)  # once per optimizer step, after optimizer.step()
        optimizer.zero_grad()              # before or after update(): the grads were read in the hook
        if watcher.should_stop:
            break
    watcher.close()                        # removes every hook

**Grad norm before clipping.** The pre-hook sees the gradients the optimizer applies, i.e.
*after* ``clip_grad_norm_``. For the norm before clipping either call
:meth:`TorchWatcher.capture_grads` right after ``backward()`` (before clipping; the pre-hook
then does not measure again), or pass the norm that ``clip_grad_norm_`` returns:
``watcher.update(loss=loss, grad_norm=total_norm)`` (it is a device tensor: still one transfer).

**Silent collapse** (predictions piling onto one class while the loss falls) shows in the
``pred_top_share`` signal: :func:`pred_top_share` turns a batch's logits (or class predictions)
into it on the device; pass it with the loss, ``watcher.update(loss=loss,
pred_top_share=pred_top_share(logits))``, and it travels in the step's one host transfer. A
regression shows it in the spread of its predictions: :func:`pred_spread` (``watcher.update(loss=loss,
pred_spread=pred_spread(outputs))``), their standard deviation across the batch falling while the
loss falls. A validation accuracy goes in as ``val_metric`` (``watcher.update(..., val_metric=acc)`` or
``monitor.update(step=..., val_metric=acc)``).

**Gradient accumulation** needs nothing: the hooks are on the optimizer step, so the
accumulated gradients are measured once per optimizer step; call :meth:`update` once per
optimizer step (pass the mean loss of the micro-batches).

**Mixed precision.** Pass ``scaler=`` your ``torch.amp.GradScaler``. ``scaler.step(optimizer)``
unscales the gradients before it calls ``optimizer.step()``, so the pre-hook measures unscaled
norms; :meth:`capture_grads` before ``scaler.unscale_`` divides by the current scale. When the
scaler skips a step (non-finite gradients: ``optimizer.step()`` is not called, the hooks do not
run) :meth:`update` returns an ``info`` event of kind ``nonfinite`` ("GradScaler skipped the
step...") instead of feeding the Monitor non-finite values — normal during loss-scale
calibration, not a divergence; 10 skipped steps in a row (``max_skipped``) give a critical
event and set :attr:`TorchWatcher.should_stop`. These adapter events are recorded by the
Monitor with the step's own (``monitor.update(events=...)``): they are in ``monitor.events``,
in a trace, and count for ``should_stop``; ``info`` events never change the Monitor's status.

**A frozen optimizer.** :meth:`update` calls that come without an ``optimizer.step()`` between
them (a condition in the loop that skips the step, a swallowed exception, an optimizer built
over other parameters) mean the weights stopped changing while the loss keeps coming: after
:data:`FROZEN_AFTER` such calls in a row — and four times the longest such run before, so a loop
that steps every k calls keeps its rhythm — the watcher reports a ``stall`` warning (detector
``TorchWatcher``) with the first unstepped update as its onset. Steps a GradScaler skipped are
not counted here (they have their own events).

**Guards** (opt-in):

* ``on_critical="stop" | "raise" | "warn"`` — what a critical event does: set
  :attr:`TorchWatcher.should_stop` (your loop breaks), raise :class:`TrainingFailure` out of
  :meth:`update`, or warn and train on.
* ``skip_nonfinite_steps=True`` — a step whose gradients hold inf/nan changes nothing. The
  decision stays on the device (no host synchronisation): a fused optimizer (``fused=True``)
  skips the step itself through its ``found_inf`` input, as under a GradScaler; otherwise the
  gradients are zeroed and the parameters restored after the step (exactly) from a copy.
* ``rollback=True`` (or ``rollback=your_restore_function``) — on a critical divergence,
  grad explosion or non-finite value, go back to the last quiet snapshot instead of stopping,
  optionally with a lower learning rate (``rollback_lr_factor``), at most ``max_rollbacks`` times.

See :class:`TorchWatcher` for the costs and the exact rules.

**torch.compile.** Gradients, per-layer norms, update ratios and the loss are read in the
optimizer's hooks, outside the compiled forward: they equal the uncompiled model's (bit for bit
with the ``eager`` and ``aot_eager`` backends, within float rounding with inductor; tested with
torch 2.13). Forward hooks that exist when the compiled model is first called are traced into its
graph without a graph break (``fullgraph=True`` compiles); the hook reads one bool (measure this
step or not), so the forward has two graphs in all. Dynamo does not guard on hooks added later
(``torch._dynamo.config.skip_nnmodule_hook_guards``): create the watcher before the first
forward, or the activation statistics stay NaN ("not measured"). ``close()`` takes effect (the
forward recompiles without the hooks). The watcher may be given the compiled module or the
original: layers are named after the original (no ``_orig_mod.`` prefix).
``functional_activations`` is eager only: in a compiled forward the activation functions are
not measured (the mode is not entered while dynamo traces; their layers stay NaN or are never
found), the modules' statistics still are.

Importing this module imports ``torch``; ``import trainsignals`` does not.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F
from torch.overrides import TorchFunctionMode

import trainsignals as ts
from trainsignals import Kind, TrainingFailure, check_kinds, make_event
from trainsignals.signals import scalar

__all__ = ["FROZEN_AFTER", "TorchWatcher", "TrainingFailure", "WRAPPER_SET", "check_watcher_options",
           "pred_spread", "pred_top_share"]

#: updates in a row without an ``optimizer.step()`` before the watcher reports a frozen optimizer:
#: twice ``max_skipped``'s default, since a loop's own conditions can skip a few steps too
FROZEN_AFTER = 20

_SATURATING: tuple[tuple[type[nn.Module], float, float], ...] = (
    (nn.Tanh, -0.99, 0.99),     # |y| > 0.99
    (nn.Sigmoid, 0.01, 0.99),   # y < 0.01 or y > 0.99
)


def _saturation_band(module_type: type[nn.Module]) -> tuple[float, float] | None:
    for cls, lo, hi in _SATURATING:
        if issubclass(module_type, cls):
            return lo, hi
    return None


# The activation functions measured with ``functional_activations=True``, in every form in which
# a call reaches ``__torch_function__`` (``F.tanh(x)`` arrives as ``Tensor.tanh``, ``F.relu_`` is
# ``torch.relu_``), mapped to the name the layer gets and the saturation band of the module twin.
_FUNCTIONAL: dict[Any, tuple[str, tuple[float, float] | None]] = {
    f: (name, _saturation_band(cls))
    for name, cls, forms in (
        ("relu", nn.ReLU, (F.relu, torch.relu, torch.relu_, torch.Tensor.relu, torch.Tensor.relu_)),
        ("gelu", nn.GELU, (F.gelu,)),
        ("tanh", nn.Tanh, (torch.tanh, torch.tanh_, torch.Tensor.tanh, torch.Tensor.tanh_)),
        ("sigmoid", nn.Sigmoid, (torch.sigmoid, torch.sigmoid_, torch.Tensor.sigmoid, torch.Tensor.sigmoid_)),
    )
    for f in forms
}


class _FunctionalActs(TorchFunctionMode):
    """Sees every torch call of a forward pass while entered; hands the activation functions' outputs on.

    Entered around the model's forward on measuring steps only. Inside ``__torch_function__`` the
    mode is off, so the call it runs (and the statistics ``on_call`` computes) are not seen again.
    """

    def __init__(self, on_call: Callable[[tuple[str, tuple[float, float] | None], torch.Tensor], None]) -> None:
        super().__init__()
        self._on_call = on_call

    def __torch_function__(self, func: Any, types: Any, args: Sequence[Any] = (),
                           kwargs: Mapping[str, Any] | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        spec = _FUNCTIONAL.get(func)
        if spec is not None and isinstance(out, torch.Tensor):
            self._on_call(spec, out)
        return out


class _ActStats:
    """Device accumulators of one hooked module for the current measuring step."""

    __slots__ = ("band", "calls", "dead", "sat")

    def __init__(self, band: tuple[float, float] | None) -> None:
        self.band = band
        self.calls = 0
        self.dead: torch.Tensor | None = None
        self.sat: torch.Tensor | None = None

    def add(self, y: torch.Tensor) -> None:
        with torch.no_grad():
            flat = y.detach().reshape(y.shape[0], -1) if y.dim() > 1 else y.detach().reshape(1, -1)
            dead = (flat == 0).all(dim=0).float().mean()
            self.dead = dead if self.dead is None else self.dead + dead
            if self.band is not None:
                lo, hi = self.band
                sat = ((flat < lo) | (flat > hi)).float().mean()
                self.sat = sat if self.sat is None else self.sat + sat
            self.calls += 1

    def clear(self) -> None:
        self.calls = 0
        self.dead = self.sat = None


def _watched_parameters(model: nn.Module, optimizer: torch.optim.Optimizer) -> list[tuple[str, nn.Parameter]]:
    """The parameters a watcher measures, by name: the model's trainable ones and those the optimizer
    steps (frozen now, they may be unfrozen later), in ``named_parameters()`` order.

    Raises:
        ValueError: the model has no parameters, or the optimizer holds none of them.

    Warns:
        RuntimeWarning: some trainable parameters are not in the optimizer (named).
    """
    named = list(model.named_parameters())
    if not named:
        raise ValueError("model has no parameters")
    held = {id(p) for group in optimizer.param_groups for p in group["params"]}
    if not any(id(p) in held for _, p in named):
        raise ValueError(
            f"optimizer holds none of the model's {len(named)} parameters: it steps other tensors (was it "
            "built over another instance of the model, before the model was rebuilt or reloaded?); build "
            "the optimizer over this model's parameters")
    watched = [(n, p) for n, p in named if p.requires_grad or id(p) in held]
    left = [n for n, p in watched if id(p) not in held]
    if left:
        shown = ", ".join(left[:5]) + (f" and {len(left) - 5} more" if len(left) > 5 else "")
        warnings.warn(
            f"{len(left)} of the model's {len(watched)} trainable parameters are not in the optimizer ({shown}): "
            "they get gradients but never change, and their layers will be reported as not learning "
            "(update_ratio_low); freeze them (requires_grad_(False)), add them to the optimizer, or watch "
            "the submodule the optimizer trains", RuntimeWarning, stacklevel=3)
    return watched


class TorchWatcher:
    """Watches a PyTorch training loop through optimizer and forward hooks; feeds a Monitor.

    Call :meth:`update` once per optimizer step, after ``optimizer.step()`` (see the module
    docstring for the exact place, clipping, accumulation and mixed precision).

    Args:
        model: the ``nn.Module`` being trained; its ``named_parameters()`` names the layers. The
            watched parameters (fixed here) are its trainable ones and those the optimizer holds,
            frozen or not. A layer frozen now (``requires_grad`` off) that the optimizer holds is
            reported once, at the first :meth:`update`, by an ``update_ratio_low`` warning (detector
            ``TorchWatcher``) naming it; until it first gets a gradient (unfrozen) its grad norm
            and update ratio are NaN, "not measured", and it costs nothing (not normed, not copied:
            a ratio of 0 would drag the median layer of the per-layer check down, and the global
            ratio is that of the parameters that learn); from then on it is measured like the
            others, and a layer that stops learning later reads 0 (``update_ratio_low`` from the
            per-layer check). A frozen parameter the optimizer does not hold is not watched.
        optimizer: the ``torch.optim.Optimizer`` that steps it (the hooks go on it). It must hold
            some of the model's parameters (``ValueError`` otherwise: an optimizer built over
            another instance of the model would leave the weights unchanged); trainable
            parameters it does not hold give one ``RuntimeWarning`` naming them, and stay
            watched (they never change: their layers are reported as ``update_ratio_low``).
        monitor: the Monitor to feed; a fresh ``Monitor(total_steps=..., recorder=...)`` when None.
            A Monitor restored from a snapshot (``load_state_dict``) goes on where it stopped:
            the first :meth:`update` without ``step=`` is its step + 1.
        per_layer: ``"parameter"`` — one grad norm per parameter tensor (names as in
            ``model.named_parameters()``), ``"module"`` — one per module owning parameters
            (the root-square-sum of its tensors' norms; names without the ``.weight``/``.bias``
            suffix), or None — the global norm only.
        update_ratio_every: measure ‖Δw‖/‖w‖ every this many optimizer steps (0: never). Costs
            one pass over the parameters (their norms) and one copy of them, taken in the
            pre-hook and differenced in the post-hook: allocated on measuring steps only, or kept
            allocated when measuring every step (``1``). No copy with ``torch.optim.SGD``: plain
            SGD (no momentum, no weight decay) steps by exactly ``-lr * g``, so ``‖Δw‖ = lr ‖g‖``
            comes from the grad norms already measured; SGD with momentum (not Nesterov) steps by
            ``-lr`` times the momentum buffer it leaves, so ``‖Δw‖ = lr ‖buffer‖`` (one norm pass
            over the buffers in the post-hook).
        activations_every: measure activation statistics every this many steps (0: never).
        activation_types: module classes whose outputs are measured.
        functional_activations: also measure the activation functions called inside the
            forwards (eager mode; ignored when ``activations_every`` is 0): ``relu``
            (``F.relu``, ``torch.relu``, ``x.relu()`` and their in-place forms), ``gelu``
            (``F.gelu``), ``tanh`` and ``sigmoid`` (``torch.*``, ``F.*``, the tensor methods;
            saturation as for their modules). On a measuring step's training forward a
            ``TorchFunctionMode`` is entered around the model's forward (left by its forward hook,
            also when the forward raises): every torch call of that forward then passes through
            one Python check. Each call is a layer named after the innermost named module whose
            forward made it, ``"<module>:<function>"``, ``#i`` for the i-th further call of that
            function by that module in the pass (``"block0.mlp:gelu"``, ``"block0.mlp:gelu#1"``;
            the model's own forward: its class name). Calls inside a hooked module of
            ``activation_types`` are that module's (not counted twice). The call sites are found
            on the first measured step and fixed then, as the Monitor needs: one that first
            appears later (a branch not taken then) gives one ``RuntimeWarning`` and is not
            measured; one not called on a measuring step reads NaN. Adds a forward pre-hook and a
            forward hook to every submodule (a bool check on the other steps). Only forward
            passes through the model itself count (not a submodule called directly). Not with
            ``torch.compile`` (the functions are not measured in a compiled forward) nor with
            :class:`~trainsignals.adapters.distributed.DistributedWatcher`.
        recorder: passed to the new Monitor (ignored when ``monitor`` is given).
        total_steps: passed to the new Monitor (ignored when ``monitor`` is given).
        scaler: a ``torch.amp.GradScaler`` in use, if any (mixed precision).
        max_skipped: consecutive skipped steps (by the scaler, or by ``skip_nonfinite_steps``)
            that make a critical event.
        on_critical: what a critical event (of a kind in the Monitor's ``stop_on``) does when no
            rollback handles it: ``"stop"`` sets :attr:`should_stop` (your loop breaks on it),
            ``"raise"`` raises :class:`TrainingFailure` from :meth:`update`, ``"warn"`` issues a
            ``RuntimeWarning`` and trains on.
        skip_nonfinite_steps: skip the update of a step whose gradients hold inf/nan, decided on
            the device (no host synchronisation). With a fused optimizer (``fused=True``: Adam,
            AdamW, SGD, Adagrad) the optimizer itself skips the step, state included, as under a
            GradScaler. With any other optimizer the non-finite gradients are zeroed before the
            step and the parameters restored after it from a copy taken in the pre-hook (one
            copy of the parameters kept, one extra pass over them per step); the optimizer's
            state (momentum, moments, step count) then sees a zero gradient for that step.
            A skipped step gives an ``info`` event; ``max_skipped`` in a row a critical one.
            Ignored while a GradScaler is given (it already skips such steps).
        rollback: on a critical event of a ``rollback_on`` kind, go back to the last good state
            instead of stopping. ``True``: every ``rollback_every`` steps the watcher keeps a copy
            of the model's and the optimizer's ``state_dict()`` (on ``rollback_device``; costs
            one copy of the parameters and of the optimizer state, the last two quiet
            snapshots kept), taken only when no warning or critical event fired in the
            ``rollback_every`` steps before; it restores the newest one older than the
            failure's onset. A callable ``rollback(event)`` restores from your own
            checkpointing instead (its return value, e.g. a path, is named in the event). In
            both cases the Monitor's detectors go back to that snapshot (the events stay) and
            an ``info`` event of the failure's kind from detector ``"rollback"`` is recorded.
            After ``max_rollbacks`` rollbacks, critical events follow ``on_critical`` again.
        rollback_every: steps between snapshots.
        rollback_lr_factor: multiply every param group's learning rate (and ``initial_lr``,
            which LR schedulers start from) by this factor on each rollback; in (0, 1].
        max_rollbacks: rollbacks allowed in the run.
        rollback_on: kinds whose critical events roll back.
        rollback_device: where in-memory snapshots live (default: the parameters' device;
            ``"cpu"`` spares accelerator memory at the cost of a copy).
        sync_every: steps whose measurements are held on the device and brought to the host
            together (one transfer every ``sync_every`` steps, then one ``Monitor.update`` per
            held step, in order). The Monitor sees exactly what it sees with 1, up to
            ``sync_every - 1`` steps later: :meth:`update` returns ``[]`` on held steps and the
            block's events on the last, when the guards act (``should_stop``, ``on_critical``);
            :meth:`flush` feeds the held steps at once and :meth:`close` does too. On a GPU this
            removes the per-step synchronisation. Not with ``rollback`` (ValueError).

    Raises:
        ValueError: a ``model``, ``optimizer`` or ``monitor`` of the wrong type (or the first two
            swapped), an optimizer that holds none of the model's parameters, a model without
            parameters, a bad ``per_layer``, ``on_critical``, cadence (``sync_every`` included),
            ``functional_activations``, rollback setting or kind (the message names the
            parameter).

    Attributes:
        monitor: the Monitor fed.
        last_lrs: the learning rate of every param group at the latest update.
        last_signals: the keyword arguments fed to ``monitor.update`` at the latest update
            (``loss``, ``grad_norm``, ``lr``, ``update_ratio``, ``layer_grad_norms``... as
            measured; absent when not measured or not fed).
        latest_signals: the latest value fed of each signal, whichever update fed it (a signal
            measured every few steps, such as ``update_ratio``, keeps its last value; with
            ``sync_every`` every step of a block counts).
        last_layer_update_ratios: per-layer ‖Δw‖/‖w‖ of the latest measuring step (or None).
        last_applied_grad_norm: the global norm of the gradients the latest step applied —
            after clipping (and unscaling) — when :meth:`capture_grads` measured them before
            (the Monitor's ``grad_norm`` is then the norm before clipping); None otherwise, and
            with :class:`~trainsignals.adapters.distributed.DistributedWatcher`.
        events: every event :meth:`update` returned (the Monitor's and the adapter's own).
        failure_events: the critical events that stopped (or would have stopped) the run.
        n_rollbacks: rollbacks done so far.
    """

    #: whether the norm of the applied (clipped) gradients is measured after capture_grads()
    _measures_applied = True

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        monitor: ts.Monitor | None = None,
        *,
        per_layer: Literal["parameter", "module"] | None = "parameter",
        update_ratio_every: int = 10,
        activations_every: int = 0,
        activation_types: tuple[type[nn.Module], ...] = (nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid),
        recorder: ts.Recorder | None = None,
        total_steps: int | None = None,
        scaler: Any = None,
        max_skipped: int = 10,
        on_critical: Literal["stop", "raise", "warn"] = "stop",
        skip_nonfinite_steps: bool = False,
        rollback: bool | Callable[[ts.Event], Any] = False,
        rollback_every: int = 100,
        rollback_lr_factor: float = 1.0,
        max_rollbacks: int = 3,
        rollback_on: tuple[str, ...] = ("nonfinite", "divergence", "grad_explosion"),
        rollback_device: str | torch.device | None = None,
        functional_activations: bool = False,
        sync_every: int = 1,
    ) -> None:
        if isinstance(model, torch.optim.Optimizer) and isinstance(optimizer, nn.Module):
            raise ValueError("model and optimizer are in the wrong order: TorchWatcher(model, optimizer)")
        if not isinstance(model, nn.Module):
            raise ValueError(f"model must be a torch.nn.Module, got {type(model).__name__}")
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise ValueError(f"optimizer must be a torch.optim.Optimizer, got {type(optimizer).__name__}")
        if monitor is not None and not isinstance(monitor, ts.Monitor):
            hint = "; total_steps is keyword-only: total_steps=..." if isinstance(monitor, int) else ""
            raise ValueError(f"monitor must be a trainsignals.Monitor or None, got {monitor!r}{hint}")
        if per_layer not in ("parameter", "module", None):
            raise ValueError(f"per_layer must be 'parameter', 'module' or None, got {per_layer!r}")
        if on_critical not in ("stop", "raise", "warn"):
            raise ValueError(f"on_critical must be 'stop', 'raise' or 'warn', got {on_critical!r}")
        for name, v in (("update_ratio_every", update_ratio_every), ("activations_every", activations_every),
                        ("max_skipped", max_skipped), ("max_rollbacks", max_rollbacks)):
            if not isinstance(v, int) or isinstance(v, bool) or v < 0:
                raise ValueError(f"{name} must be an integer >= 0, got {v!r}")
        if not isinstance(rollback_every, int) or isinstance(rollback_every, bool) or rollback_every < 1:
            raise ValueError(f"rollback_every must be an integer >= 1, got {rollback_every!r}")
        if not isinstance(sync_every, int) or isinstance(sync_every, bool) or sync_every < 1:
            raise ValueError(f"sync_every must be an integer >= 1, got {sync_every!r}")
        if sync_every > 1 and rollback is not False:
            raise ValueError("sync_every > 1 cannot be combined with rollback: a snapshot must be taken at "
                             "the step the Monitor has just judged quiet; use sync_every=1 with rollback")
        if not (isinstance(rollback, bool) or callable(rollback)):
            raise ValueError(f"rollback must be True, False or a callable, got {rollback!r}")
        if isinstance(rollback_lr_factor, bool) or not isinstance(rollback_lr_factor, (int, float)) \
                or not 0.0 < rollback_lr_factor <= 1.0:
            raise ValueError(f"rollback_lr_factor must be in (0, 1], got {rollback_lr_factor!r}")
        if not isinstance(skip_nonfinite_steps, bool):
            raise ValueError(f"skip_nonfinite_steps must be a bool, got {skip_nonfinite_steps!r}")
        if not isinstance(functional_activations, bool):
            raise ValueError(f"functional_activations must be a bool, got {functional_activations!r}")
        self.rollback_on = check_kinds("rollback_on", rollback_on)
        self.on_critical = on_critical
        self.skip_nonfinite_steps = skip_nonfinite_steps
        self.rollback = rollback
        self.rollback_every = rollback_every
        self.rollback_lr_factor = float(rollback_lr_factor)
        self.max_rollbacks = max_rollbacks
        self.rollback_device = torch.device(rollback_device) if rollback_device is not None else None
        self.n_rollbacks = 0
        self.sync_every = sync_every
        self._rows: list[tuple[int, torch.Tensor | None, list[tuple[str, int]], dict[str, Any], bool]] = []
        self.failure_events: list[ts.Event] = []
        self._stop = False
        self._pending: list[ts.Event] = []
        self._good: list[tuple[int, Any, Any, dict[str, Any]]] = []
        fused = any(g.get("fused") for g in optimizer.param_groups)
        self._fused_skip = bool(fused and getattr(optimizer, "_step_supports_amp_scaling", False))
        self._skip_copy: list[torch.Tensor] | None = None
        self._ok: torch.Tensor | None = None
        self.model = model
        self.optimizer = optimizer
        self.monitor = monitor if monitor is not None else ts.Monitor(total_steps=total_steps, recorder=recorder)
        self.per_layer = per_layer
        self.update_ratio_every = update_ratio_every
        self.activations_every = activations_every
        self.scaler = scaler
        self.max_skipped = max_skipped
        # a torch.compile'd model (OptimizedModule) holds the original as _orig_mod: name after it
        model = getattr(model, "_orig_mod", model)
        named = _watched_parameters(model, optimizer)
        self.param_names: tuple[str, ...] = tuple(n for n, _ in named)
        self._params: list[torch.Tensor] = [p for _, p in named]
        self._device = self._params[0].device
        self._one_device = all(p.device == self._device for p in self._params)
        if per_layer == "module":
            owners = [n.rsplit(".", 1)[0] if "." in n else n for n in self.param_names]
            self.layer_names: tuple[str, ...] = tuple(dict.fromkeys(owners))
            pos = {m: i for i, m in enumerate(self.layer_names)}
            self._module_index: torch.Tensor | None = torch.tensor([pos[o] for o in owners], device=self._device)
        else:
            owners = list(self.param_names)
            self.layer_names = self.param_names
            self._module_index = None
        # parameters frozen now (held by the optimizer): "dormant" — no update ratio measured (NaN), not
        # copied for it — until they first get a gradient (unfrozen); reported once at the first update
        self._dormant: tuple[int, ...] = tuple(i for i, (_, p) in enumerate(named) if not p.requires_grad)
        self._last_missing: tuple[int, ...] | None = None
        live = {owners[i] for i in range(len(named)) if i not in set(self._dormant)}
        self._frozen_note: list[str] = [n for n in dict.fromkeys(owners[i] for i in self._dormant) if n not in live]
        self.last_lrs: list[float] = []
        self.last_signals: dict[str, Any] = {}
        self.latest_signals: dict[str, Any] = {}
        self.last_layer_update_ratios: Mapping[str, float] | None = None
        self.events: list[ts.Event] = []
        # index of the optimizer step being measured: a Monitor restored from a snapshot goes on from its step
        self._step = self.monitor.step + 1
        self._grad_sq: torch.Tensor | None = None        # per-parameter squared norms of this step
        self._no_grad: torch.Tensor | None = None        # which parameters had no gradient then (None: all had)
        self._grads_absent = False                       # none had: no grad norm is fed
        self._index_cache: dict[tuple[str, tuple[int, ...]], torch.Tensor] = {}
        self._ratio: torch.Tensor | None = None          # [global, per layer...] update ratios
        self._snapshot: list[torch.Tensor] | None = None
        self._snap_active: tuple[int, ...] | None = None   # the parameters the snapshot holds (None: all)
        self._ratio_buf: list[torch.Tensor] | None = None
        self._lr_sq_key: tuple[float, ...] | None = None
        self._lr_sq: torch.Tensor | None = None
        self._w_sq: torch.Tensor | None = None
        self._buf_lr_sq: torch.Tensor | None = None
        self._applied_sq: torch.Tensor | None = None    # squared global norm of the gradients the step applied
        self._applied_due = False                        # capture_grads(applied=True) this step
        self.last_applied_grad_norm: float | None = None     # lr**2 when the update is read from SGD's momentum buffers
        self._stepped = False
        self._skipped_run = 0
        self._unstepped = 0                 # updates in a row without an optimizer step (not the scaler's)
        self._longest_gap = 0               # the longest such run that ended: the loop's own rhythm
        self._handles: list[Any] = [
            optimizer.register_step_pre_hook(self._pre_hook),
            optimizer.register_step_post_hook(self._post_hook),
        ]
        self._acts: dict[str, _ActStats] = {}
        self._acts_on = self._measure_acts()
        self._acts_fixed = False            # the layer names were fed to the Monitor: no new ones
        self._fn_on = False                 # the functional-activations mode is entered
        self.functional_activations = functional_activations and activations_every > 0
        if activations_every > 0:
            for name, module in model.named_modules():
                if isinstance(module, activation_types):
                    self._acts[name or type(module).__name__] = _ActStats(_saturation_band(type(module)))
                    self._handles.append(module.register_forward_hook(self._make_act_hook(name or type(module).__name__)))
        if self.functional_activations:
            self._hook_functional(model, activation_types)

    # ------------------------------------------------------------------------------------
    # Hooks
    # ------------------------------------------------------------------------------------
    def _make_act_hook(self, name: str) -> Any:
        stats = self._acts[name]

        def hook(module: nn.Module, args: Any, output: Any) -> None:
            # a plain bool set between steps: under torch.compile, reading the step counter here
            # would make every step's value a new constant and recompile the forward each step
            if self._acts_on and module.training and isinstance(output, torch.Tensor):
                stats.add(output)

        return hook

    def _hook_functional(self, model: nn.Module, activation_types: tuple[type[nn.Module], ...]) -> None:
        """Forward hooks that enter the functional-activations mode around the model's forward and
        track the module whose forward makes each call (``None`` inside a hooked activation module).
        """
        self._fn_mode = _FunctionalActs(self._functional_call)
        self._fn_root: str | None = None if isinstance(model, activation_types) else type(model).__name__
        self._fn_stack: list[str | None] = []          # the modules whose forward is running, innermost last
        self._fn_seen: dict[tuple[str, str], int] = {}  # calls so far in this pass, by (module, function)
        self._fn_late: set[str] = set()                 # call sites found after the names were fixed
        self._handles.append(model.register_forward_pre_hook(self._fn_enter, prepend=True))
        self._handles.append(model.register_forward_hook(self._fn_leave, always_call=True))
        for name, module in model.named_modules():
            if module is not model:
                pre, post = self._make_fn_scope(None if isinstance(module, activation_types) else name)
                self._handles.append(module.register_forward_pre_hook(pre))
                self._handles.append(module.register_forward_hook(post, always_call=True))

    def _make_fn_scope(self, name: str | None) -> tuple[Callable[[nn.Module, Any], None],
                                                        Callable[[nn.Module, Any, Any], None]]:
        """The forward pre-hook and forward hook of one submodule: push and pop its name on the
        stack of running forwards while the mode is entered (a bool check otherwise). ``None``
        marks a hooked activation module; everything it calls is its own.
        """
        stack = self._fn_stack

        def pre(module: nn.Module, args: Any) -> None:
            if self._fn_on:
                stack.append(name if stack[-1] is not None else None)

        def post(module: nn.Module, args: Any, output: Any) -> None:
            if self._fn_on and len(stack) > 1:
                stack.pop()

        return pre, post

    def _fn_enter(self, module: nn.Module, args: Any) -> None:
        """The model's forward pre-hook: enter the mode on a measuring step's training pass."""
        if self._fn_on:      # a pass that ended without its forward hook (interrupted): leave first
            self._fn_exit()
        if self._acts_on and module.training and not torch.compiler.is_compiling():
            self._fn_stack[:] = [self._fn_root]
            self._fn_seen.clear()
            self._fn_mode.__enter__()
            self._fn_on = True

    def _fn_leave(self, module: nn.Module, args: Any, output: Any) -> None:
        """The model's forward hook (also run when the forward raises): leave the mode."""
        if self._fn_on:
            self._fn_exit()

    def _fn_exit(self) -> None:
        """Take the mode off the torch-function mode stack, wherever it is: modes entered above it
        (and not left) stay, in their order.
        """
        self._fn_on = False
        above = []
        while torch._C._len_torch_function_stack() > 0:  # noqa: SLF001 - torch's function-mode stack has no public API
            top = torch._C._pop_torch_function_stack()  # noqa: SLF001 - torch's function-mode stack has no public API
            if top is self._fn_mode:
                break
            above.append(top)
        for mode in reversed(above):
            torch._C._push_on_torch_function_stack(mode)  # noqa: SLF001 - torch's function-mode stack has no public API

    def _functional_call(self, spec: tuple[str, tuple[float, float] | None], out: torch.Tensor) -> None:
        """Measure one activation-function call: layer ``"<module>:<function>"``, ``#i`` for its
        i-th call (from 0) by the same module in the pass.
        """
        owner = self._fn_stack[-1]
        if owner is None:    # inside a hooked activation module: its own hook measures it
            return
        fn, band = spec
        i = self._fn_seen.get((owner, fn), 0)
        self._fn_seen[owner, fn] = i + 1
        name = f"{owner}:{fn}" if i == 0 else f"{owner}:{fn}#{i}"
        stats = self._acts.get(name)
        if stats is None:
            if self._acts_fixed:
                if name not in self._fn_late:
                    self._fn_late.add(name)
                    warnings.warn(f"activation function call {name} appeared after the first measured step "
                                  "fixed the activation layers: it is not measured", RuntimeWarning, stacklevel=2)
                return
            stats = self._acts[name] = _ActStats(band)
        stats.add(out)

    def _measure_acts(self) -> bool:
        return self.activations_every > 0 and self._step % self.activations_every == 0

    def _measure_ratio(self) -> bool:
        return self.update_ratio_every > 0 and self._step % self.update_ratio_every == 0

    def _norms(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        """Squared L2 norms of ``tensors`` as one float32 vector on the watcher's device (fused kernels)."""
        if self._one_device:      # the parameters (and so their gradients) live on one device
            return torch.stack(torch._foreach_norm(tensors, 2, dtype=torch.float32)).square()  # noqa: SLF001 - torch's fused multi-tensor norm has no public name
        by_device: dict[torch.device, list[int]] = {}
        for i, t in enumerate(tensors):
            by_device.setdefault(t.device, []).append(i)
        out = torch.zeros(len(tensors), device=self._device)
        for idx in by_device.values():
            norms = torch.stack(torch._foreach_norm([tensors[i] for i in idx], 2, dtype=torch.float32))  # noqa: SLF001 - torch's fused multi-tensor norm has no public name
            out[torch.tensor(idx, device=self._device)] = norms.to(self._device).square()
        return out

    def _grad_sq_now(self) -> torch.Tensor:
        """Per-parameter squared grad norms now; notes which parameters have no gradient (``_no_grad``)
        and whether none has (``_grads_absent``: no grad norm is fed then).
        """
        grads = [p.grad for p in self._params]
        if all(g is not None for g in grads):
            self._no_grad = None
            self._grads_absent = False
            if self._dormant:
                self._wake(())
            return self._norms(grads)   # type: ignore[arg-type]
        missing = tuple(i for i, g in enumerate(grads) if g is None)
        self._grads_absent = len(missing) == len(grads)
        if self._dormant and missing != self._last_missing:   # the same pattern step after step: nothing to do
            self._wake(missing)
        self._no_grad = self._cached(("missing", missing), lambda: torch.tensor(
            [g is None for g in grads], device=self._device))
        return self._sq_norms(grads)

    def _wake(self, missing: tuple[int, ...]) -> None:
        """Dormant parameters that have a gradient now (``missing``: those without one) are measured from
        here on, as every other.
        """
        self._last_missing = missing
        lacking = set(missing)
        self._dormant = tuple(i for i in self._dormant if i in lacking)

    def _active(self) -> tuple[int, ...] | None:
        """The parameters the update ratio measures: all but the dormant ones (None: all)."""
        if not self._dormant:
            return None
        dormant = set(self._dormant)
        return tuple(i for i in range(len(self._params)) if i not in dormant)

    def _full(self, sq: torch.Tensor, active: tuple[int, ...] | None) -> torch.Tensor:
        """Per-parameter values of the ``active`` parameters spread over all of them (0 elsewhere)."""
        if active is None:
            return sq
        out = torch.zeros(len(self._params), device=self._device)
        if active:
            out[self._cached(("present", active), lambda: torch.tensor(active, device=self._device))] = sq
        return out

    def _cached(self, key: tuple[str, tuple[int, ...]], make: Callable[[], torch.Tensor]) -> torch.Tensor:
        """A small device tensor made once per key: the same parameters lacking a gradient step after
        step (frozen ones, an unused branch) cost no host-to-device copy after the first.
        """
        t = self._index_cache.get(key)
        if t is None:
            if len(self._index_cache) >= 32:     # patterns that keep changing (routed experts): bounded
                self._index_cache.clear()
            t = self._index_cache[key] = make()
        return t

    def _layer_norms(self, grad_sq: torch.Tensor) -> torch.Tensor:
        """Per-layer grad norms; ``nan`` (not measured) for a layer none of whose parameters has a
        gradient this step (left out of the graph: an expert the router skipped, an unused branch),
        so that a norm of exactly 0 always means a gradient computed as 0.
        """
        norms = self._per_layer(grad_sq).sqrt()
        if self._no_grad is None:
            return norms
        got = self._per_layer((~self._no_grad).float())
        return torch.where(got > 0, norms, torch.full_like(norms, float("nan")))

    def _sq_norms(self, tensors: list[torch.Tensor | None]) -> torch.Tensor:
        """Squared norms, one per parameter; 0 where the tensor is None."""
        if all(t is not None for t in tensors):
            return self._norms(tensors)   # type: ignore[arg-type]
        present = tuple(i for i, t in enumerate(tensors) if t is not None)
        out = torch.zeros(len(tensors), device=self._device)
        if present:
            sq = self._norms([t for t in tensors if t is not None])
            out[self._cached(("present", present), lambda: torch.tensor(present, device=self._device))] = sq
        return out

    def capture_grads(self, applied: bool = True) -> None:
        """Measure the gradients now (call after ``backward()``, before clipping or unscaling).

        The optimizer's pre-hook then does not measure this step's norms again, so the Monitor
        sees the norms before clipping. Under a GradScaler whose ``unscale_`` was not called yet,
        the norms are divided by the current scale (a device tensor: no synchronisation).

        Args:
            applied: also measure, after the step, the global norm of the gradients it applied
                (:attr:`last_applied_grad_norm`: after clipping and unscaling) — one more fused
                norm pass; pass False when nothing changes the gradients in between.
        """
        with torch.no_grad():
            sq = self._grad_sq_now()
            if self.scaler is not None and self.scaler.is_enabled() and not self._unscaled():
                scale = getattr(self.scaler, "_scale", None)
                inv = (1.0 / scale.to(self._device).float()) if isinstance(scale, torch.Tensor) else \
                    1.0 / float(self.scaler.get_scale())
                sq = sq * inv * inv
            self._grad_sq = sq
            self._applied_due = applied

    def _unscaled(self) -> bool:
        """Whether ``scaler.unscale_(optimizer)`` already ran for this step."""
        states = getattr(self.scaler, "_per_optimizer_states", {})
        stage = states.get(id(self.optimizer), {}).get("stage") if isinstance(states, Mapping) else None
        return getattr(stage, "name", "") == "UNSCALED"

    def _pre_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        # args are step()'s own, the optimizer first: step(self, closure=None)
        closure = kwargs.get("closure") if kwargs else (args[1] if len(args) > 1 else None)
        with torch.no_grad():
            # with a closure, backward runs inside step(), after this hook: the gradients here are
            # stale; call capture_grads() after backward() inside the closure instead
            from_hook = self._grad_sq is None and closure is None
            if from_hook:
                self._grad_sq = self._grad_sq_now()
            if self._measure_ratio():
                self._snap_active = active = self._active()   # frozen since the start: neither normed nor copied
                params = [p.detach() for p in self._params] if active is None else \
                    [self._params[i].detach() for i in active]
                self._w_sq = self._full(self._norms(params), active) if params else \
                    torch.zeros(len(self._params), device=self._device)
                lr_sq = self._sgd_lr_sq(optimizer, momentum=False) if from_hook else None
                if lr_sq is not None and self._grad_sq is not None:
                    # plain SGD: the step is exactly -lr * g, so ||dw|| = lr * ||g||: no copy needed
                    self._ratio = self._ratios(self._grad_sq * lr_sq, self._w_sq)
                    self._w_sq = None
                elif (buf_lr_sq := self._sgd_lr_sq(optimizer, momentum=True)) is not None:
                    # SGD with momentum: the step is -lr * the momentum buffer it leaves (read in the post-hook)
                    self._buf_lr_sq = buf_lr_sq
                elif self.update_ratio_every == 1:   # every step: one buffer, kept
                    if self._ratio_buf is None or len(self._ratio_buf) != len(params):
                        self._ratio_buf = [torch.empty_like(p) for p in params]
                    torch._foreach_copy_(self._ratio_buf, params)
                    self._snapshot = self._ratio_buf
                else:
                    self._snapshot = list(torch._foreach_mul(params, 1.0))   # one copy, freed in the post-hook  # noqa: SLF001 - torch's fused multi-tensor copy has no public name
            if self.skip_nonfinite_steps and self.scaler is None and self._grad_sq is not None:
                self._skip_prepare(optimizer)

    def _skip_prepare(self, optimizer: Any) -> None:
        """Decide on the device whether this step's gradients are finite; arrange the skip."""
        assert self._grad_sq is not None
        self._ok = None
        ok = torch.isfinite(self._grad_sq.sum())
        if self._fused_skip:
            optimizer.found_inf = (~ok).float()     # the fused kernels skip the step on the device
            return
        grads = [p.grad for p in self._params if p.grad is not None]
        for g in grads:
            g.nan_to_num_(0.0, 0.0, 0.0)
        torch._foreach_mul_(grads, ok.float())       # a non-finite step: all gradients 0
        params = [p.detach() for p in self._params]
        if self._skip_copy is None:
            self._skip_copy = [torch.empty_like(p) for p in params]
        torch._foreach_copy_(self._skip_copy, params)
        self._ok = ok

    def _skip_finish(self, optimizer: Any) -> None:
        if self._fused_skip:
            if hasattr(optimizer, "found_inf"):
                del optimizer.found_inf
            return
        if self._ok is not None and self._skip_copy is not None:
            bad = (~self._ok).float()
            # lerp(p, copy, 1) == copy and lerp(p, copy, 0) == p, exactly
            params = [p.detach() for p in self._params]
            torch._foreach_lerp_(params, self._skip_copy, [bad] * len(params))
            self._ok = None

    def _post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        self._stepped = True
        if self._applied_due and self._measures_applied:
            # capture_grads() measured the gradients before clipping (or unscaling); here they
            # are what the step applied (also when a closure ran backward inside step()): one
            # more fused norm pass, on such steps only
            grads = [p.grad for p in self._params]
            if any(g is not None for g in grads):
                with torch.no_grad():
                    self._applied_sq = self._sq_norms(grads).sum()
        if self.skip_nonfinite_steps and self.scaler is None:
            with torch.no_grad():
                self._skip_finish(optimizer)
        self._post_ratio(optimizer)
        if self._dormant and self._grad_sq is None:
            # a closure ran backward inside step() (the pre-hook saw no gradients): look now, after the
            # step's update ratio was taken with the parameters the pre-hook knew
            self._wake(tuple(i for i in self._dormant if self._params[i].grad is None))

    def _post_ratio(self, optimizer: Any) -> None:
        """Finish the update ratio of a measuring step: from SGD's momentum buffers, or the snapshot."""
        if self._buf_lr_sq is not None and self._w_sq is not None:
            with torch.no_grad():
                state = optimizer.state
                bufs = [state[p].get("momentum_buffer") if p.grad is not None and p in state else None
                        for p in self._params]   # no grad: SGD leaves the parameter (and its stale buffer)
                self._ratio = self._ratios(self._sq_norms(bufs) * self._buf_lr_sq, self._w_sq)
            self._buf_lr_sq = None
            self._w_sq = None
            return
        if self._snapshot is None or self._w_sq is None:
            return
        with torch.no_grad():
            snap = self._snapshot
            torch._foreach_sub_(snap, self._snapped_params())   # old - new, in place
            d_sq = self._full(self._norms(snap), self._snap_active) if snap else torch.zeros_like(self._w_sq)
            self._ratio = self._ratios(d_sq, self._w_sq)
        self._snapshot = None
        self._w_sq = None

    def _snapped_params(self) -> list[torch.Tensor]:
        """The parameters the update-ratio snapshot copied, in its order (all but the dormant ones)."""
        active = self._snap_active
        return [p.detach() for p in self._params] if active is None else [self._params[i].detach() for i in active]

    def _ratios(self, d_sq: torch.Tensor, w_sq: torch.Tensor) -> torch.Tensor:
        """[global, per layer...] ||dw|| / ||w|| from per-parameter squared norms; NaN (not measured)
        for a layer all of whose parameters are dormant (their norms are left out: 0 here).
        """
        glob = d_sq.sum().sqrt() / w_sq.sum().sqrt().clamp_min(1e-30)
        d_l, w_l = self._per_layer(d_sq), self._per_layer(w_sq)
        out = torch.cat([glob.reshape(1), d_l.sqrt() / w_l.sqrt().clamp_min(1e-30)])
        if self._dormant:
            out = torch.where(self._cached(("dormant", self._dormant), self._dormant_layers), math.nan, out)
        return out

    def _dormant_layers(self) -> torch.Tensor:
        """[False, per layer...]: True for a layer all of whose parameters are dormant."""
        mark = torch.zeros(len(self._params), device=self._device)
        mark[torch.tensor(self._dormant, device=self._device)] = 1.0
        full = self._per_layer(mark) == self._per_layer(torch.ones_like(mark))
        return torch.cat([torch.zeros(1, dtype=torch.bool, device=self._device), full])

    def _sgd_lr_sq(self, optimizer: Any, *, momentum: bool) -> torch.Tensor | None:
        """lr**2 per parameter when every param group is ``torch.optim.SGD`` of the kind asked
        (a float lr), else None: ``momentum=False``, plain SGD (no momentum, no weight decay),
        whose step is ``-lr * g``; ``momentum=True``, SGD with momentum and without Nesterov
        (weight decay, dampening, ``maximize`` allowed), whose step is ``-lr`` times the momentum
        buffer it leaves.
        """
        if type(optimizer) is not torch.optim.SGD:
            return None
        lrs: dict[int, float] = {}
        for group in optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                return None
            if momentum:
                if not group.get("momentum", 0) or group.get("nesterov", False):
                    return None
            elif group.get("momentum", 0) or group.get("weight_decay", 0):
                return None
            for p in group["params"]:
                lrs[id(p)] = float(group["lr"])
        if any(id(p) not in lrs for p in self._params):
            return None
        key = tuple(lrs[id(p)] for p in self._params)
        if self._lr_sq_key != key:
            self._lr_sq_key = key
            self._lr_sq = torch.tensor(key, dtype=torch.float32, device=self._device).square()
        return self._lr_sq

    def _per_layer(self, sq: torch.Tensor) -> torch.Tensor:
        if self._module_index is None:
            return sq
        return torch.zeros(len(self.layer_names), device=sq.device).index_add_(0, self._module_index, sq)

    # ------------------------------------------------------------------------------------
    # The per-step call
    # ------------------------------------------------------------------------------------
    def update(self, loss: Any = None, *, grad_norm: Any = None, val_loss: Any = None,
               step: int | None = None, val_metric: Any = None, pred_top_share: Any = None,
               pred_spread: Any = None) -> list[ts.Event]:
        """Feed the Monitor this optimizer step's measurements; one host transfer.

        Call once per optimizer step, after ``optimizer.step()`` (or ``scaler.step(optimizer)``).

        Args:
            loss: the step's training loss (a tensor — kept on the device until the single
                transfer — or a number). With gradient accumulation, the mean over the micro-batches.
            grad_norm: overrides the measured global grad norm (e.g. what ``clip_grad_norm_``
                returned: the norm before clipping).
            val_loss: a validation loss measured at this step.
            step: the step number (default: the number of updates so far, from 0).
            val_metric: a validation metric (accuracy...) measured at this step.
            pred_top_share: the share of the most-predicted class in a batch of this step
                (:func:`pred_top_share`; a device tensor joins the one transfer).
            pred_spread: the spread of a regression's predictions in a batch of this step
                (:func:`pred_spread`; a device tensor joins the one transfer).

        Returns:
            The events raised at this step: the Monitor's, then the adapter's own (skipped
            steps, rollbacks), all of them also in ``monitor.events``.

        Raises:
            TypeError: a signal that is not one number — a tensor of several elements (a per-sample
                loss: reduce it first), a string... — or a step that is not a whole number; checked
                before anything is measured or fed (a tensor's element count is read on the host:
                no synchronisation).
            ValueError: a step lower than the previous one.
            TrainingFailure: with ``on_critical="raise"``, when a critical event is not
                handled by a rollback.
        """
        if self._fn_on:      # a forward interrupted before its forward hook ran
            self._fn_exit()
        s = self._step if step is None else self._check_step(step)
        more = (("val_metric", val_metric), ("pred_top_share", pred_top_share), ("pred_spread", pred_spread))
        _check_values((("loss", loss), ("grad_norm", grad_norm), ("val_loss", val_loss), *more))
        if self._frozen_note:
            self._note_frozen(s)
        scaler_skipped = self.scaler is not None and not self._stepped
        self._track_frozen(s, self._stepped or scaler_skipped)
        packed, layout, host = self._pack(loss, grad_norm, val_loss, skipped=scaler_skipped, more=more)
        # reset for the next step
        self._grad_sq = None
        self._grads_absent = False
        self._applied_sq = None
        self._applied_due = False
        self._ratio = None
        self._stepped = False
        for a in self._acts.values():
            a.clear()
        self._step = s + 1
        self._acts_on = self._measure_acts()
        if self.sync_every > 1:   # held on the device until the block is full
            self._rows.append((s, packed, layout, host, scaler_skipped))
            return self.flush() if len(self._rows) >= self.sync_every else []
        values, layout = self._transfer(packed, layout, host)   # the one host transfer
        events = self._guard(s, self._feed(s, values, layout, host, scaler_skipped))
        self.events.extend(events)
        return events

    def _check_step(self, step: Any) -> int:
        """``step`` as an ``int``: a whole number (``TypeError`` otherwise, the Monitor's own check) not
        below the previous update's (``ValueError``), refused before anything is measured or held.
        """
        s = ts.to_step(step)
        if s < self._step - 1:
            raise ValueError(f"step must not decrease: got {s} after {self._step - 1}")
        return s

    def flush(self) -> list[ts.Event]:
        """Feed the Monitor the steps that ``sync_every`` held back, in one transfer.

        Called by :meth:`update` every ``sync_every`` steps and by :meth:`close`; call it
        yourself before reading ``watcher.monitor`` mid-block (e.g. at a validation or a
        checkpoint). Every held step is fed before the guards act, so nothing is lost when
        ``on_critical="raise"`` raises.

        Returns:
            The events of the held steps, in step order (also in :attr:`events`).

        Raises:
            TrainingFailure: with ``on_critical="raise"``, when a held step raised a critical event.
        """
        rows, self._rows = self._rows, []
        parts = [r[1] for r in rows if r[1] is not None]
        flat = torch.cat(parts).cpu().numpy() if parts else np.zeros(0)   # the block's one transfer
        fed: list[tuple[int, list[ts.Event]]] = []
        pos = 0
        for s, packed, layout, host, scaler_skipped in rows:
            width = 0 if packed is None else packed.numel()
            fed.append((s, self._feed(s, flat[pos:pos + width], layout, host, scaler_skipped)))
            pos += width
        events = [e for _, evs in fed for e in evs]
        self.events.extend(events)
        for s, evs in fed:
            self._guard(s, evs)
        return events

    def _feed(self, s: int, values: Sequence[float] | np.ndarray, layout: list[tuple[str, int]],
              host: dict[str, Any], scaler_skipped: bool) -> list[ts.Event]:
        """Decode one step's transferred values and feed them to the Monitor; its events."""
        vec = np.asarray(values, dtype=np.float64)
        spans: dict[str, list[np.ndarray]] = {}
        pos = 0
        for key, width in layout:
            spans.setdefault(key, []).append(vec[pos:pos + width])
            pos += width
        got = {k: v[0] if len(v) == 1 else np.concatenate(v) for k, v in spans.items()}
        kw = self._signals(got, host)
        self.last_applied_grad_norm = float(got["applied"][0]) if "applied" in got else None
        self._acts_fixed = self._acts_fixed or "activations" in kw
        nonfinite_skip = (self.skip_nonfinite_steps and not scaler_skipped and "measured" in got
                          and not math.isfinite(got["measured"][0]))
        own: list[ts.Event] = self._pending
        self._pending = []
        if scaler_skipped or nonfinite_skip:
            own = own + self._skip_events(s, "GradScaler" if scaler_skipped else "skip_nonfinite_steps")
            for key in ("loss", "grad_norm", "update_ratio", "layer_grad_norms"):   # not fed: inf/nan by design
                if key != "loss" or not _finite(kw.get("loss")):
                    kw.pop(key, None)
        elif self.scaler is not None or self.skip_nonfinite_steps:
            self._skipped_run = 0
        events = self.monitor.update(step=s, events=own, **kw)
        self.last_signals = kw
        self.latest_signals.update(kw)
        return events

    def _pack(self, loss: Any, grad_norm: Any, val_loss: Any, *, skipped: bool,
              more: Sequence[tuple[str, Any]] = ()) -> tuple[torch.Tensor | None, list[tuple[str, int]], dict[str, Any]]:
        """Everything measured on the device, as one float32 vector, its layout, and the host values."""
        parts: list[torch.Tensor] = []
        layout: list[tuple[str, int]] = []

        def put(key: str, t: torch.Tensor) -> None:
            if t.requires_grad:
                t = t.detach()
            if t.dim() != 1:
                t = t.reshape(-1)
            if t.dtype != torch.float32 or t.device != self._device:
                t = t.to(device=self._device, dtype=torch.float32)
            parts.append(t)
            layout.append((key, t.numel()))

        host: dict[str, Any] = {"measured_acts": self._measure_acts()}
        for key, v in (("loss", loss), ("grad_norm", grad_norm), ("val_loss", val_loss), *more):
            if isinstance(v, torch.Tensor):
                put(key, v)
            elif v is not None:
                host[key] = v
        grad_sq = self._grad_sq
        if grad_sq is not None and not skipped and not self._grads_absent:   # no gradient at all: not measured
            put("measured", grad_sq.sum().sqrt())
            if self.per_layer is not None:
                put("layers", self._layer_norms(grad_sq))
        if self._ratio is not None and not skipped:
            put("ratio", self._ratio)
        if self._applied_sq is not None and not skipped:
            put("applied", self._applied_sq.sqrt())
        lrs = [g["lr"] for g in self.optimizer.param_groups]
        if any(isinstance(lr, torch.Tensor) for lr in lrs):
            put("lrs", torch.stack([torch.as_tensor(lr, dtype=torch.float32).reshape(()).to(self._device)
                                    for lr in lrs]))
        else:
            host["lrs"] = [float(lr) for lr in lrs]
        for name, a in self._acts.items():
            if a.calls:
                assert a.dead is not None
                put("dead", a.dead / a.calls)
                put("sat", (a.sat / a.calls) if a.sat is not None
                    else torch.full((1,), math.nan, device=self._device))
                host.setdefault("act_names", []).append(name)
        return (torch.cat(parts) if parts else None), layout, host

    def _transfer(self, packed: torch.Tensor | None, layout: list[tuple[str, int]], host: dict[str, Any]
                  ) -> tuple[Sequence[float] | np.ndarray, list[tuple[str, int]]]:
        """Bring the packed measurements to the host: the step's one transfer (``.numpy()``).

        ``layout`` names the slices of ``packed`` (key, width); ``host`` holds the values that
        were already on the host. Returns the values (a vector or a list) and their layout. A
        subclass may combine the measurements across processes first (one collective on
        ``packed``), return the combined values in a layout of its own, update ``host`` to
        match and queue its own events in ``self._pending``.
        """
        return (packed.cpu().numpy() if packed is not None else np.zeros(0)), layout

    def _signals(self, got: dict[str, np.ndarray], host: dict[str, Any]) -> dict[str, Any]:
        """The Monitor's keyword arguments from the transferred values (float64 vectors by key)
        and the host ones. Per-layer values go to the Monitor as :class:`trainsignals.LayerValues`
        (a mapping over the vector: no per-layer Python objects).
        """
        kw: dict[str, Any] = {}
        if "measured" in got:
            kw["grad_norm"] = float(got["measured"][0])
        for key in ("loss", "grad_norm", "val_loss", "val_metric", "pred_top_share", "pred_spread"):
            if key in got:
                kw[key] = float(got[key][0])
            elif key in host:
                kw[key] = host[key]
        self.last_lrs = got["lrs"].tolist() if "lrs" in got else host["lrs"]
        if self.last_lrs:
            kw["lr"] = self.last_lrs[0]
        if "layers" in got:
            kw["layer_grad_norms"] = ts.LayerValues(self.layer_names, got["layers"])
        if "ratio" in got:
            kw["update_ratio"] = float(got["ratio"][0])
            self.last_layer_update_ratios = ts.LayerValues(self.layer_names, got["ratio"][1:])
            if self.last_layer_update_ratios:
                kw["layer_update_ratios"] = self.last_layer_update_ratios
        if self._acts and host.get("measured_acts"):
            dead = iter(got["dead"].tolist() if "dead" in got else [])
            sat = iter(got["sat"].tolist() if "sat" in got else [])
            called = set(host.get("act_names", ()))
            kw["activations"] = {
                n: ({"dead_frac": next(dead), "saturation": next(sat)} if n in called
                    else {"dead_frac": math.nan, "saturation": math.nan})
                for n in self._acts
            }
        return kw

    def _note_frozen(self, step: int) -> None:
        """Report, once, the layers frozen (``requires_grad`` off) when the watcher was built that the
        optimizer holds: they do not learn. Their update ratio is not measured while they have no
        gradient (a 0 would drag the median layer the per-layer check compares with).
        """
        names, self._frozen_note = self._frozen_note, []
        shown = ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
        self._pending.append(make_event(
            Kind.UPDATE_RATIO_LOW, "warning", step, step, "TorchWatcher", f"layer_update_ratios[{names[0]}]",
            0.0, 0.0, f"{len(names)} layer{'s' if len(names) > 1 else ''} frozen (requires_grad off) when the "
            f"watcher was built do{'' if len(names) > 1 else 'es'} not learn: {shown}; the optimizer holds "
            "them, and their update ratio is measured once they get gradients (unfrozen)", layer=names[0]))

    def _track_frozen(self, step: int, stepped: bool) -> None:
        """Report a frozen optimizer: no ``optimizer.step()`` for :data:`FROZEN_AFTER` updates in a row
        and four times the longest run without one before (a loop that steps every k updates, as
        with gradient accumulation, has runs of k - 1). Once per frozen stretch.
        """
        if stepped:
            self._longest_gap = max(self._longest_gap, self._unstepped)
            self._unstepped = 0
            return
        self._unstepped += 1
        if self._unstepped == max(FROZEN_AFTER, 4 * self._longest_gap + 1):
            n = self._unstepped
            self._pending.append(make_event(
                Kind.STALL, "warning", step, step - n + 1, "TorchWatcher", "update_ratio", float(n),
                float(FROZEN_AFTER), f"optimizer.step() has not run for {n} updates (since step {step - n + 1}) "
                "while the loss keeps coming: the weights do not change (a step skipped by a condition, a "
                "swallowed exception, an optimizer rebuilt without the model's parameters?)"))

    def _skip_events(self, step: int, who: str) -> list[ts.Event]:
        self._skipped_run += 1
        why = ("GradScaler skipped the step (non-finite gradients); the scale was lowered — normal while "
               "the loss scale calibrates") if who == "GradScaler" else \
            "the step's gradients were non-finite: its update was skipped (skip_nonfinite_steps)"
        if self._skipped_run == 1:
            return [make_event(Kind.NONFINITE, "info", step, step, who, "grad_norm", math.inf, 0.0, why)]
        if self._skipped_run == self.max_skipped:
            return [make_event(
                Kind.NONFINITE, "critical", step, step - self.max_skipped + 1, who, "grad_norm",
                float(self._skipped_run), float(self.max_skipped),
                f"{self._skipped_run} steps skipped in a row: the gradients stay non-finite")]
        return []

    # ------------------------------------------------------------------------------------
    # Guards
    # ------------------------------------------------------------------------------------
    def _guard(self, step: int, events: list[ts.Event]) -> list[ts.Event]:
        """Act on the step's events: roll back, stop, raise or warn; take a rollback snapshot."""
        failing = [e for e in events if self.monitor.stops_on(e)]
        if failing and self.rollback is not False and not self._stop:
            trigger = next((e for e in failing if e.kind.value in self.rollback_on), None)
            if trigger is not None and self.n_rollbacks < self.max_rollbacks:
                done = self._roll_back(step, trigger)
                if done is not None:
                    self.monitor.update(step=step, events=[done])
                    return events + [done]
        if failing and not self._stop:
            self.failure_events = failing
            if self.on_critical == "raise":
                self._stop = True
                raise TrainingFailure(failing)
            if self.on_critical == "warn":
                for e in failing:
                    warnings.warn(str(e), RuntimeWarning, stacklevel=3)
            else:
                self._stop = True
        if self.rollback is not False and step % self.rollback_every == 0 and not self._stop:
            self._snapshot_good(step)
        return events

    def _snapshot_good(self, step: int) -> None:
        """Keep the model, optimizer and Monitor state of ``step`` if the last stretch was quiet."""
        quiet_since = step - self.rollback_every
        for e in reversed(self.monitor.events):
            if e.step <= quiet_since:
                break
            if e.severity != "info":
                return
        dev = self.rollback_device

        def copy(t: Any) -> Any:
            if isinstance(t, torch.Tensor):
                return t.detach().to(dev, copy=True) if dev is not None else t.detach().clone()
            if isinstance(t, dict):
                return {k: copy(v) for k, v in t.items()}
            if isinstance(t, list):
                return [copy(v) for v in t]
            return t

        in_memory = self.rollback is True
        snap = (step, copy(self.model.state_dict()) if in_memory else None,
                copy(self.optimizer.state_dict()) if in_memory else None, self.monitor.state_dict())
        self._good = [*self._good[-1:], snap]   # the last two quiet snapshots

    def _roll_back(self, step: int, trigger: ts.Event) -> ts.Event | None:
        """Restore the newest quiet snapshot older than the failure's onset; lower the lr."""
        older = [g for g in self._good if g[0] < trigger.onset_step] or self._good[:1]
        if callable(self.rollback):
            restored = self.rollback(trigger)
            where = "the user's checkpoint" + (f" ({restored})" if restored is not None else "")
        elif not older:
            return None
        else:
            good_step, model_state, opt_state, _ = older[-1]
            self.model.load_state_dict(model_state)
            self.optimizer.load_state_dict(opt_state)
            where = f"step {good_step}"
        if older:   # the detectors go back to before the failure; the events stay
            self.monitor.load_state_dict(older[-1][3], rewind=True)
            self._good = [g for g in self._good if g[0] <= older[-1][0]]
        sched = ""
        if self.rollback_lr_factor != 1.0:
            for g in self.optimizer.param_groups:
                if isinstance(g["lr"], torch.Tensor):
                    g["lr"].mul_(self.rollback_lr_factor)
                else:
                    g["lr"] = g["lr"] * self.rollback_lr_factor
                if "initial_lr" in g:     # an attached LR scheduler derives its lr from it
                    g["initial_lr"] = g["initial_lr"] * self.rollback_lr_factor
            sched = f", learning rate × {self.rollback_lr_factor:g}"
        self.n_rollbacks += 1
        return make_event(
            trigger.kind, "info", step, trigger.onset_step, "rollback", trigger.signal, trigger.value,
            trigger.threshold,
            f"rolled back to {where} after {trigger.kind.value} (rollback {self.n_rollbacks} of at most "
            f"{self.max_rollbacks}){sched}")

    # ------------------------------------------------------------------------------------
    @property
    def should_stop(self) -> bool:
        """True once a critical event stopped the run (``on_critical="stop"``) and no rollback handled it.

        Critical events count when their kind is in the Monitor's ``stop_on``; the adapter's
        own critical event (``max_skipped`` steps skipped in a row) counts too.
        """
        return self._stop

    @property
    def step(self) -> int:
        """The number of the next step :meth:`update` will report."""
        return self._step

    def close(self) -> None:
        """Feed the steps still held back (``sync_every``), then remove every hook this watcher
        installed (optimizer and forward hooks).
        """
        if self._fn_on:      # a forward interrupted before its forward hook ran
            self._fn_exit()
        try:
            if self._rows:
                self.flush()
        finally:
            for h in self._handles:
                h.remove()
            self._handles = []
            self._snapshot = None

    def __enter__(self) -> TorchWatcher:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def pred_top_share(outputs: torch.Tensor, *, dim: int = -1, classes: int | None = None) -> torch.Tensor:
    """The share of the most-predicted class in a batch: the ``pred_top_share`` signal.

    A healthy classifier spreads its answers over the classes the batch holds; one that
    collapsed puts them all on one. Cheap: one ``argmax`` and one ``scatter_add_`` on the
    device, no host synchronisation (the result stays a tensor until you ``float()`` it or
    :meth:`TorchWatcher.update` brings it over with the step's one transfer).

    Args:
        outputs: logits or probabilities with the classes along ``dim`` (a floating tensor of
            at least 2 dimensions: ``(batch, classes)``, ``(batch, classes, H, W)`` with
            ``dim=1``...), or class predictions (an integer or bool tensor of any shape,
            classes ``>= 0``).
        dim: the class dimension of floating ``outputs``.
        classes: the number of classes of integer predictions (default: the largest + 1,
            which reads it back from the device).

    Returns:
        A 0-d float32 tensor in [0, 1] on ``outputs``' device (NaN for an empty batch).

    Raises:
        ValueError: floating ``outputs`` of fewer than 2 dimensions (scores of one class are
            ambiguous: give the class predictions).

    Example:
        >>> logits = torch.tensor([[2.0, 0.1, 0.3], [1.5, 0.2, 0.1], [0.1, 3.0, 0.2], [0.9, 0.1, 0.0]])
        >>> float(pred_top_share(logits))   # 3 of 4 predictions are class 0
        0.75
        >>> float(pred_top_share(torch.tensor([1, 1, 1, 1])))
        1.0
    """
    with torch.no_grad():
        x = outputs.detach()
        if x.is_floating_point():
            if x.dim() < 2:
                raise ValueError(f"outputs must have the classes along dim {dim} (at least 2 dimensions), "
                                 f"got shape {tuple(x.shape)}; pass class predictions for scores of one class")
            n_classes = x.shape[dim]
            preds = x.argmax(dim=dim).reshape(-1)
        else:
            preds = x.reshape(-1).long()
            n_classes = classes if classes is not None else (int(preds.max()) + 1 if preds.numel() else 1)
        if preds.numel() == 0:
            return torch.tensor(math.nan, device=x.device)
        counts = torch.zeros(n_classes, device=x.device, dtype=torch.float32)
        counts.scatter_add_(0, preds, torch.ones_like(preds, dtype=torch.float32))
        return counts.max() / preds.numel()


def _check_values(values: Sequence[tuple[str, Any]]) -> None:
    """Refuse, naming it, a signal that is not one number: a tensor of several elements (read on the
    host: ``numel()`` needs no synchronisation) or what the Monitor refuses (a string, an array...).
    """
    for key, v in values:
        if v is None or type(v) is float:
            continue
        if isinstance(v, torch.Tensor):
            if v.numel() != 1:
                hint = " (a per-sample loss? reduce it first: loss.mean())" if key == "loss" else ""
                raise TypeError(f"{key} must be one number, got a tensor of shape {tuple(v.shape)}{hint}")
        else:
            scalar(key, v)


def _finite(v: Any) -> bool:
    try:
        return math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


#: The TorchWatcher arguments a framework callback sets itself (from its trainer, or as its own options).
WRAPPER_SET = ("model", "optimizer", "monitor", "recorder", "total_steps", "scaler", "on_critical")


def check_watcher_options(kwargs: Mapping[str, Any], owner: str = "TrainSignalsCallback") -> None:
    """Refuse, when a framework callback is built, the TorchWatcher options it sets itself, unknown
    ones and bad values (a probe watcher is built and closed), rather than when training begins.

    Raises:
        ValueError: naming the option.
    """
    import inspect

    params = inspect.signature(TorchWatcher.__init__).parameters
    for key in kwargs:
        if key in WRAPPER_SET:
            raise ValueError(f"{key} is set by {owner}; pass it to {owner} itself"
                             if key in ("monitor", "total_steps", "on_critical") else
                             f"{key} is set by {owner} from the trainer; it cannot be passed")
        if key not in params or key == "self":
            known = sorted(k for k in params if k not in (*WRAPPER_SET, "self"))
            raise ValueError(f"{key} is not a TorchWatcher option; the options are {known}")
    probe = nn.Linear(1, 1)
    TorchWatcher(probe, torch.optim.SGD(probe.parameters(), lr=0.1), ts.Monitor(), **kwargs).close()


def pred_spread(outputs: torch.Tensor) -> torch.Tensor:
    """The spread of a batch's predictions: the ``pred_spread`` signal of a regression.

    The standard deviation of ``outputs`` across the batch (dimension 0; the population's, as
    :func:`trainsignals.adapters.jax.pred_spread` takes it), averaged over the other dimensions (the outputs of a multi-output regression, the pixels of an
    autoencoder). A healthy regression's predictions vary as its targets do; one that
    collapsed to a constant answer (its targets replaced by their mean, say) has none left,
    while its loss still falls. Cheap and on the device, no host synchronisation.

    Args:
        outputs: the batch's predictions, ``(batch,)`` or ``(batch, ...)``.

    Returns:
        A 0-d float32 tensor ``>= 0`` on ``outputs``' device (NaN for a batch of fewer than 2).

    Example:
        >>> float(pred_spread(torch.tensor([[1.0, 0.0], [3.0, 0.0]])))   # sd 1 and 0, averaged
        0.5
        >>> float(pred_spread(torch.full((8, 3), 2.5)))
        0.0
    """
    with torch.no_grad():
        x = outputs.detach().to(torch.float32)
        if x.dim() == 0 or x.shape[0] < 2:
            return torch.tensor(math.nan, device=x.device)
        return x.reshape(x.shape[0], -1).std(dim=0, correction=0).mean()
