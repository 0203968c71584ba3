"""Data-parallel training with ``torch.distributed``: one decision on every rank, replica divergence, bad ranks.

:class:`DistributedWatcher` is a :class:`~trainsignals.adapters.torch.TorchWatcher` for a job of
several processes (DDP, FSDP2 ``fully_shard``, or your own all-reduce). Use it exactly like the
single-process watcher, on **every** rank, with the same arguments::

    dist.init_process_group("nccl", timeout=datetime.timedelta(minutes=5))   # or "gloo" on CPU
    model = DDP(net.to(device), device_ids=[local_rank])
    watcher = DistributedWatcher(model, optimizer, total_steps=n_steps)    # before the first step
    for x, y in loader:                                                     # a DistributedSampler shard
        loss = loss_fn(model(x), y)
        loss.backward()                    # DDP all-reduces the gradients here
        optimizer.step()
        events = watcher.update(loss=loss) # the local loss: the watcher averages it across ranks
        optimizer.zero_grad()
        if watcher.should_stop:            # True on every rank at the same step
            break
    watcher.close()

What it adds to the single-process watcher, each step:

* **One collective.** Everything the step measured on this rank — local loss, grad norms,
  update ratio, learning rates, activation statistics, the local grad norm before the
  all-reduce and, every ``check_every`` steps, the replica fingerprints — is packed into one
  float64 vector of fixed length (``K`` values, NaN where a signal is absent) and gathered from
  every rank with **one** ``all_gather_single`` (``all_gather_into_tensor`` on older torch) of
  ``8·K·world_size`` bytes, then brought to the host with one copy. ``K`` is about
  ``3·(number of parameter tensors)`` plus a few dozen (``5·`` with a ``tolerance``); its
  length does not depend on the step, so ranks that disagree on what they measured (or on the
  step) never send tensors of different sizes.
* **Identical inputs, identical decisions.** The Monitor on every rank is fed the same values,
  computed on the host from the same gathered bytes by the same code: the mean over ranks of
  the local losses (the global-batch loss for equal shards), of the validation losses (ranks that
  passed none are left out: ``val_loss`` on rank 0 only works), of the grad norms and update
  ratios (identical across ranks after the all-reduce; under sharding the squared norms are
  summed across ranks instead) and of the activation statistics. Every rank therefore gets the
  same events, the same :attr:`should_stop`, and ``on_critical``, ``skip_nonfinite_steps`` and
  ``rollback`` act identically everywhere. Pass the same Monitor configuration on every rank
  (checked at construction) and a ``recorder`` on rank 0 only.
* **Replica divergence** (``replica_divergence``, critical). After the all-reduce, data-parallel
  replicas hold bit-identical gradients and parameters. Every step the watcher compares across
  ranks the step number, whether the optimizer stepped, the learning rates and the global grad
  norm after sync; every ``check_every`` steps also a fingerprint of every parameter tensor and
  of its gradient, taken in the optimizer's step pre-hook (after the all-reduce, before the
  update). With ``tolerance=0`` (the default: replicas must be bit-identical) the fingerprint is
  :func:`bit_checksum`, the wrapping 32-bit integer sum of the tensor's bits: exact, independent
  of the summation order, changed by any single flipped bit, and as cheap as a float32 sum. With
  ``tolerance > 0`` (nondeterministic kernels) it is the float64 sum of the values and of their
  absolute values, and two values agree when they differ by at most ``tolerance`` times the sum
  of absolute values (so the bound reads "no element differs by more than ``tolerance``
  relative"; about 60x the cost of a float32 sum on CPU, cheap on GPUs). The reference is the
  per-value median over ranks, so with 3 ranks or more the event names the minority that
  disagrees; with 2 ranks both are named (which one is wrong cannot be told). The event names the
  ranks and the parameter tensors; :attr:`DistributedWatcher.findings` holds them as tuples.
* **Bad rank** (``bad_rank``, ``warning`` by default). Each rank's *local* loss and local grad
  norm *before* the all-reduce are compared across ranks by :class:`RankOutliers` (median and
  median absolute deviation, scale-free; see there for the rule, its defaults and what happens
  with 2 ranks). A rank whose value is non-finite while the others' are finite is named at once.
  Under DDP the local grad norm is measured by a **communication hook**
  (``DistributedDataParallel.register_comm_hook``) that wraps the default all-reduce hook: it
  adds the squared norm of each gradient bucket, on the device, before handing the bucket to
  ``allreduce_hook`` (which divides by the world size and all-reduces, as DDP's built-in path
  does). DDP allows one hook: with your own, pass ``comm_hook=False`` and register
  ``watcher.wrap_comm_hook(your_hook)`` instead. Without DDP call :meth:`capture_local_grads`
  before your own all-reduce, or pass ``update(local_grad_norm=...)``; else only the local loss
  is compared. The hook costs a norm per bucket plus DDP's own overhead for a Python hook (about
  2–3 ms a step on a CPU, see ``benchmarks/bench_distributed.py``); ``comm_hook=False`` avoids it.
* **Timeouts.** A rank that stops calling :meth:`~DistributedWatcher.update` (crashed, broke out
  of the loop alone, skipped a step) must not hang the others: the gather waits at most
  ``timeout`` seconds (default: the process group's own ``init_process_group(timeout=...)``)
  and then raises ``RuntimeError`` naming the step. The construction does one small gather too
  (the ranks compare the model's structure and the watcher's configuration).

**Supported** (what ``tests/test_distributed.py`` runs: CPU, ``gloo``, jobs of 2 and 4 processes):
DDP with the comm hook; FSDP2 (``torch.distributed.fsdp.fully_shard``: parameters are
``DTensor`` shards, detected, ``sharded=True``): grad norms, per-layer norms and update ratio
are combined from the shards' squared norms, so the Monitor sees the full model's values;
replica fingerprints and the grad-norm comparison are off (shards differ by design; the step,
optimizer-step and learning-rate comparisons stay), the local grad norm before the
reduce-scatter is not measured (pass ``local_grad_norm=`` if you have it), and
``skip_nonfinite_steps`` is refused (the decision would be per shard). **Not tested here:**
``nccl`` (the code keeps the gathered vector on the GPU for it: one device-to-host copy a step),
FSDP1 (``FullyShardedDataParallel``: treated as sharded, flat-parameter names), hybrid sharding,
rollback under FSDP2. Each rank must construct the watcher and call ``update()`` once per
optimizer step, in the same order (they are collectives).

Importing this module imports ``torch`` and ``torch.distributed``; ``import trainsignals`` does not.
"""

from __future__ import annotations

import datetime
import json
import math
import warnings
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.distributed as dist
from torch import nn

import trainsignals as ts
from trainsignals import Kind, check_range, make_event
from trainsignals.adapters.torch import TorchWatcher
from trainsignals.detectors.rank_outliers import RankOutliers

__all__ = ["DistributedWatcher", "RankFinding", "RankOutliers", "bit_checksum", "replica_disagreement"]

_TINY = 1e-300
_all_gather_single: Callable[..., Any] = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


# ----------------------------------------------------------------------------------------------
# Pure rules (NumPy only): testable without processes
# ----------------------------------------------------------------------------------------------
def replica_disagreement(values: Any, tolerance: float = 0.0, scale: Any = None
                         ) -> tuple[np.ndarray, np.ndarray]:
    """Which ranks disagree, value by value, with the others: ``(mask, relative difference)``.

    Args:
        values: ``[world_size, n]`` — one row per rank.
        tolerance: 0 — any difference disagrees (bit-identical replicas); > 0 — a value
            disagrees when it differs from the reference by more than ``tolerance × scale``.
        scale: ``[world_size, n]`` scales (e.g. sums of absolute values), or None for the
            magnitude of the reference itself.

    The reference of each value is the median over ranks (non-finite values ignored), so with 3
    ranks or more a minority that differs is flagged and the majority is not; with 2 ranks both
    are flagged when they differ. Non-finite values agree only with the same non-finite value.

    Returns:
        ``mask`` (bool, ``[world_size, n]``) and the difference relative to the scale (float).

    Example:
        >>> m, _ = replica_disagreement([[1.0, 2.0], [1.0, 2.0], [1.0, 2.5]])
        >>> m.tolist()
        [[False, False], [False, False], [False, True]]
        >>> replica_disagreement([[1.0], [1.0 + 1e-9]], tolerance=1e-6)[0].tolist()
        [[False], [False]]
    """
    v = np.asarray(values, dtype=np.float64)
    if v.ndim != 2:
        raise ValueError(f"values must be 2-d [world_size, n], got shape {v.shape}")
    w = v.shape[0]
    if w < 2 or v.shape[1] == 0:
        return np.zeros(v.shape, dtype=bool), np.zeros(v.shape)
    if w == 2:
        ref = v[::-1]
    else:
        finite = np.where(np.isfinite(v), v, np.nan)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)    # all-NaN columns: the reference is NaN
            med = np.nanmedian(finite, axis=0)
        allnf = ~np.isfinite(v).any(axis=0)                     # no finite value: compare to rank 0's
        ref = np.broadcast_to(np.where(allnf, v[0], med), v.shape)
    if scale is None:
        s = np.abs(ref)
    else:
        sc = np.abs(np.asarray(scale, dtype=np.float64))
        s = np.maximum(sc, sc[::-1]) if w == 2 else np.broadcast_to(np.median(sc, axis=0), v.shape)
    same_nf = (~np.isfinite(v)) & (~np.isfinite(ref)) & ((v == ref) | (np.isnan(v) & np.isnan(ref)))
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(v - ref)
        rel = np.where(same_nf, 0.0, diff / np.maximum(s, _TINY))
        bad = np.where(same_nf, False, ~(diff <= tolerance * s) if tolerance > 0 else ~(v == ref))
    return bad.astype(bool), np.nan_to_num(rel, nan=np.inf)


def bit_checksum(t: torch.Tensor) -> torch.Tensor:
    """An exact, order-independent fingerprint of a tensor's bits: the wrapping int32 sum of its 32-bit words.

    Integer addition modulo 2**32 is associative, so the result does not depend on how the sum is
    split across threads or kernels, and any single flipped bit changes it. It costs what a float32
    sum costs (a float64 sum of float32 values is ~60x slower on CPU). Tensors whose byte size is
    not a multiple of 4 (an odd number of 16-bit values) fall back to their float64 sum.

    Returns:
        A 0-d int32 tensor on ``t``'s device (a float64 sum for the fallback).

    Example:
        >>> x = torch.linspace(-1, 1, 1000)
        >>> y = x.clone()
        >>> y.view(torch.int32)[500] ^= 1          # flip the lowest mantissa bit of one value
        >>> bool(bit_checksum(x) == bit_checksum(x.flip(0))), bool(bit_checksum(x) == bit_checksum(y))
        (True, False)
    """
    flat = t.detach().reshape(-1)
    if (flat.numel() * flat.element_size()) % 4 or flat.dtype == torch.bool:
        return flat.sum(dtype=torch.float64)
    return flat.contiguous().view(torch.int32).sum(dtype=torch.int32)


@dataclass(frozen=True)
class RankFinding:
    """The ranks and parameter tensors behind a ``replica_divergence`` or ``bad_rank`` event.

    Attributes:
        event: the event.
        ranks: the ranks named (global ranks).
        layers: the parameter tensors that disagree (replica divergence), else empty.
        signals: what disagreed: ``"step"``, ``"stepped"``, ``"lr"``, ``"grad_norm"``,
            ``"param_checksum"``, ``"grad_checksum"`` (``tolerance=0``), ``"param_sum"``,
            ``"grad_sum"`` (``tolerance > 0``) (replica divergence) or the signal (bad rank).
    """

    event: ts.Event
    ranks: tuple[int, ...]
    layers: tuple[str, ...] = ()
    signals: tuple[str, ...] = ()


def _is_dtensor(t: Any) -> bool:
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def _local(t: Any) -> Any:
    return t.to_local() if _is_dtensor(t) else t


def _ranks_text(ranks: Sequence[int]) -> str:
    return f"rank {ranks[0]}" if len(ranks) == 1 else "ranks " + ",".join(str(r) for r in ranks)


def _names_text(names: Sequence[str], n_all: int, limit: int = 5) -> str:
    shown = ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")
    return f"{len(names)} of {n_all} parameter tensors ({shown})"


# ----------------------------------------------------------------------------------------------
# The watcher
# ----------------------------------------------------------------------------------------------
_CODED = ("loss", "grad_norm", "val_loss", "lrs", "local")      # 0 absent, 1 on the device, 2 from the host
_FLAGS = ("stepped", "measured", "layers", "ratio", "fp")       # 0 absent, 1 present


class DistributedWatcher(TorchWatcher):
    """A :class:`~trainsignals.adapters.torch.TorchWatcher` for data-parallel jobs: one collective a step.

    Construct it on every rank (after ``init_process_group`` and the DDP/FSDP wrapping, before
    the first training step) and call :meth:`update` once per optimizer step on every rank.
    See the module docstring for what is gathered, how ranks are combined, the replica and
    bad-rank checks, and what is supported.

    Args:
        model: the model: a ``DistributedDataParallel`` (unwrapped for the names; its
            communication hook measures the local grad norm), an FSDP2 module, or a plain module
            whose gradients you synchronise yourself.
        optimizer: the optimizer.
        monitor: the Monitor to feed (same configuration on every rank), or None for a new one.
        process_group: the group to gather over (default: the world).
        check_every: compare the replicas' parameter and gradient fingerprints every this many
            steps (0: never; the step, learning-rate and grad-norm comparisons run every step).
        tolerance: relative difference replicas may show (0: bit-identical, the default; e.g.
            1e-6 for nondeterministic kernels).
        bad_rank_threshold: :class:`RankOutliers` ``threshold`` (0 turns the bad-rank check off).
        bad_rank_patience: :class:`RankOutliers` ``patience``.
        bad_rank_warmup: :class:`RankOutliers` ``warmup``.
        bad_rank_window: :class:`RankOutliers` ``window``.
        bad_rank_severity: severity of ``bad_rank`` events.
        comm_hook: register the local-grad-norm communication hook on a DDP model.
        timeout: seconds the watcher's gather may wait for the other ranks (None: the process
            group's timeout).
        sharded: parameters are shards (FSDP); None detects ``DTensor`` parameters and FSDP1.
        **kwargs: every :class:`~trainsignals.adapters.torch.TorchWatcher` option.

    Raises:
        ValueError: a bad setting (the message names it), ``skip_nonfinite_steps`` with sharded
            parameters, or a model or configuration that differs across ranks.
        RuntimeError: ``torch.distributed`` is not initialised.

    Attributes:
        rank: this process's rank in ``process_group``.
        world_size: the group's size.
        ranks: the global ranks of the group's members (events name these).
        findings: one :class:`RankFinding` per ``replica_divergence`` / ``bad_rank`` event.
        last_signals: the keyword arguments fed to the Monitor at the latest update (identical on
            every rank).
        last_rank_values: ``{"loss": [...], "local_grad_norm": [...]}``, one value per rank, at the
            latest update (NaN where not measured).
    """

    #: the gathered layout has no slot for it: not measured
    _measures_applied = False

    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        monitor: ts.Monitor | None = None,
        *,
        process_group: Any = None,
        check_every: int = 10,
        tolerance: float = 0.0,
        bad_rank_threshold: float = 10.0,
        bad_rank_patience: int = 3,
        bad_rank_warmup: int = 20,
        bad_rank_window: int = 100,
        bad_rank_severity: Literal["warning", "critical"] = "warning",
        comm_hook: bool = True,
        timeout: float | None = None,
        sharded: bool | None = None,
        **kwargs: Any,
    ) -> None:
        check_range("check_every", check_every, 0, None, integer=True)
        if kwargs.get("functional_activations"):
            raise ValueError("functional_activations is not supported by DistributedWatcher: the functional "
                             "call sites are found while training, and the ranks must agree on the "
                             "activation layers when the watcher is built")
        if kwargs.get("sync_every", 1) != 1:
            raise ValueError("sync_every must be 1 for a DistributedWatcher: every step's measurements are "
                             "gathered across the ranks when they are taken")
        check_range("tolerance", tolerance, 0.0, None)
        if not math.isfinite(float(tolerance)):
            raise ValueError(f"tolerance must be finite, got {tolerance!r}")
        check_range("bad_rank_threshold", bad_rank_threshold, 0.0, None)
        if timeout is not None:
            check_range("timeout", timeout, 0.0, None, lo_open=True)
        if not isinstance(comm_hook, bool):
            raise ValueError(f"comm_hook must be a bool, got {comm_hook!r}")
        if sharded is not None and not isinstance(sharded, bool):
            raise ValueError(f"sharded must be True, False or None, got {sharded!r}")
        try:
            outliers = RankOutliers(bad_rank_threshold or 1.0, patience=bad_rank_patience, warmup=bad_rank_warmup,
                                    window=bad_rank_window, severity=bad_rank_severity)
        except ValueError as exc:        # name the watcher's parameter
            raise ValueError(f"bad_rank_{exc}") from None
        self._outliers: RankOutliers | None = outliers if bad_rank_threshold > 0 else None
        if not (dist.is_available() and dist.is_initialized()):
            raise RuntimeError("torch.distributed is not initialised: call dist.init_process_group() first")
        ddp = isinstance(model, nn.parallel.DistributedDataParallel)
        inner: nn.Module = model.module if ddp else model   # type: ignore[assignment]
        if sharded is None:
            sharded = _is_fsdp1(model) or any(_is_dtensor(p) for p in inner.parameters())
        if sharded and kwargs.get("skip_nonfinite_steps"):
            raise ValueError("skip_nonfinite_steps is not supported with sharded parameters (FSDP): "
                             "each rank would decide on its own shard")
        self.sharded = bool(sharded)
        self.check_every = int(check_every)
        self.tolerance = float(tolerance)
        self.timeout = None if timeout is None else float(timeout)
        self.process_group = process_group
        self.rank = dist.get_rank(process_group)
        self.world_size = dist.get_world_size(process_group)
        try:
            self.ranks: tuple[int, ...] = tuple(dist.get_process_group_ranks(
                process_group if process_group is not None else dist.group.WORLD))
        except (AttributeError, RuntimeError, ValueError):
            self.ranks = tuple(range(self.world_size))
        super().__init__(inner, optimizer, monitor, **kwargs)
        self.ddp_model = model if ddp else None
        self.findings: list[RankFinding] = []
        self.last_signals: dict[str, Any] = {}
        self.last_rank_values: dict[str, list[float]] = {}
        self._cur_step = 0
        self._local_sq: torch.Tensor | None = None
        self._local_given: Any = None
        self._fp: torch.Tensor | None = None
        self._diverged: set[int] = set()
        self._last_agree = -1
        self._hook_on = True
        backend = str(dist.get_backend(process_group))
        self._comm_device = torch.device("cpu") if backend == "gloo" else self._device
        # the fixed layout of the gathered vector
        n_p, n_l = len(self.param_names), len(self.layer_names)
        self._n_groups = len(optimizer.param_groups)
        self._act_names = tuple(self._acts)
        a = len(self._act_names)
        self._fp_width = 0 if self.sharded else (4 if self.tolerance > 0 else 2) * n_p
        host = [("step", 1), ("codes", len(_CODED)), ("flags", len(_FLAGS)), ("acts", a),
                ("lrs_h", self._n_groups), ("loss_h", 1), ("grad_norm_h", 1), ("val_loss_h", 1), ("local_h", 1)]
        device = [("loss_d", 1), ("grad_norm_d", 1), ("val_loss_d", 1), ("lrs_d", self._n_groups), ("local_d", 1),
                  ("measured", 1), ("layers", n_l if self.per_layer is not None else 0),
                  ("ratio", (2 if self.sharded else 1) * (1 + n_l)), ("dead", a), ("sat", a),
                  ("fp", self._fp_width)]
        self._slots: dict[str, slice] = {}
        pos = 0
        for key, width in host + device:
            self._slots[key] = slice(pos, pos + width)
            pos += width
        self._device_slots = device
        # what must be identical on every rank (a fast path checks them all at once)
        self._agree_cols = np.r_[tuple(np.arange(self._slots[k].start, self._slots[k].stop)
                                       for k in ("step", "flags", "lrs_h", "lrs_d", "fp")
                                       + (() if self.sharded else ("measured",)))]
        self._width = pos
        self._nan = torch.full((max(w for _, w in device) + 1,), math.nan, dtype=torch.float64, device=self._device)
        self._handles.append(optimizer.register_step_pre_hook(self._fingerprint_hook))
        if ddp and comm_hook:
            try:
                model.register_comm_hook(getattr(model, "process_group", None),  # type: ignore[operator]
                                         self.wrap_comm_hook())
            except RuntimeError as exc:
                warnings.warn(f"could not register the local-grad-norm communication hook ({exc}); pass "
                              "comm_hook=False and register watcher.wrap_comm_hook(your_hook) yourself",
                              RuntimeWarning, stacklevel=2)
        self._check_same_everywhere(inner)

    # ------------------------------------------------------------------------------------
    # Measuring: local grad norm before sync, fingerprints after sync
    # ------------------------------------------------------------------------------------
    def wrap_comm_hook(self, hook: Callable[[Any, Any], Any] | None = None) -> Callable[[Any, Any], Any]:
        """A DDP communication hook that adds each bucket's squared norm (the local gradients) then calls ``hook``.

        ``hook`` defaults to ``torch.distributed.algorithms.ddp_comm_hooks.default_hooks.allreduce_hook``
        (divide by the world size, all-reduce). Register the result with
        ``ddp_model.register_comm_hook(state, watcher.wrap_comm_hook(hook))`` when you construct
        the watcher with ``comm_hook=False``. The norm is kept on the device; it is gathered by
        the next :meth:`update`. After :meth:`close` the wrapper only forwards to ``hook``
        (DDP cannot unregister a hook).
        """
        if hook is None:
            from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
            hook = default_hooks.allreduce_hook

        def measured_hook(state, bucket):  # type: ignore[no-untyped-def]  # DDP checks the annotations: none
            if self._hook_on:
                with torch.no_grad():
                    sq = torch.linalg.vector_norm(bucket.buffer(), dtype=torch.float32).square().to(self._device)
                    self._local_sq = sq if self._local_sq is None else self._local_sq + sq
            return hook(state, bucket)

        return measured_hook

    def capture_local_grads(self) -> None:
        """Measure this rank's local gradients now: call after ``backward()``, before your own all-reduce.

        For data parallelism without DDP (or inside ``no_sync()`` before the synchronising step).
        Kept on the device until the next :meth:`update`.
        """
        with torch.no_grad():
            self._local_sq = self._grad_sq_now().sum()

    def _norms(self, tensors: list[torch.Tensor]) -> torch.Tensor:
        if self.sharded:
            tensors = [_local(t) for t in tensors]
        return super()._norms(tensors)

    def _fingerprint_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        """Optimizer step pre-hook: fingerprints of parameters and gradients (after sync) on check steps.

        ``tolerance == 0``: per tensor, the wrapping 32-bit integer sum of its bits
        (:func:`bit_checksum`); ``tolerance > 0``: float64 sums of the values and of their absolute values.
        """
        if self._fp_width == 0 or self.check_every == 0 or self._step % self.check_every:
            return
        with torch.no_grad():
            dev = self._device
            params = [p.detach() for p in self._params]
            grads = [p.grad.detach() if p.grad is not None else None for p in self._params]
            nan = self._nan[0]
            fp = bit_checksum if self.tolerance == 0 else (lambda t: t.sum(dtype=torch.float64))
            parts = [torch.stack([fp(p).to(dev, torch.float64) for p in params]),
                     torch.stack([fp(g).to(dev, torch.float64) if g is not None else nan for g in grads])]
            if self.tolerance > 0:
                parts.append(torch.stack([n.to(dev) for n in torch._foreach_norm(params, 1, dtype=torch.float64)]))  # noqa: SLF001 - torch's fused multi-tensor norm has no public name
                parts.append(torch.stack([torch.linalg.vector_norm(g, 1, dtype=torch.float64).to(dev)
                                          if g is not None else nan for g in grads]))
            self._fp = torch.cat(parts)

    def _post_hook(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        snap: list[torch.Tensor] | None = getattr(self, "_snapshot", None)
        w_sq: torch.Tensor | None = getattr(self, "_w_sq", None)
        if not self.sharded or snap is None or w_sq is None:
            super()._post_hook(optimizer, args, kwargs)
            return
        # sharded: keep the squared sums (global, per layer) so the ranks' shards can be added up
        self._stepped = True
        with torch.no_grad():
            torch._foreach_sub_(snap, self._snapped_params())
            d_sq = self._full(self._norms(snap), self._snap_active) if snap else torch.zeros_like(w_sq)
            d_l = self._per_layer(d_sq)
            if self._dormant:   # layers frozen since the watcher was built: not measured (NaN)
                d_l = torch.where(self._cached(("dormant", self._dormant), self._dormant_layers)[1:], math.nan, d_l)
            self._ratio = torch.cat([d_sq.sum().reshape(1), d_l, w_sq.sum().reshape(1), self._per_layer(w_sq)])
        self._snapshot = None
        self._w_sq = None

    # ------------------------------------------------------------------------------------
    # The per-step call
    # ------------------------------------------------------------------------------------
    def update(self, loss: Any = None, *, grad_norm: Any = None, val_loss: Any = None, step: int | None = None,
               local_grad_norm: Any = None) -> list[ts.Event]:
        """Gather this step's measurements from every rank (one collective) and feed the Monitor.

        Call on every rank, once per optimizer step, after ``optimizer.step()``.

        Args:
            loss: this rank's local training loss (tensor or number); the Monitor gets the mean
                over the ranks that passed one.
            grad_norm: overrides the measured global grad norm (e.g. what ``clip_grad_norm_``
                returned); the mean over ranks is fed.
            val_loss: a validation loss (mean over the ranks that passed one: rank 0 alone works).
            step: the step number (default: the number of updates so far).
            local_grad_norm: this rank's grad norm before synchronisation, when neither the DDP
                hook nor :meth:`capture_local_grads` measures it.

        Returns:
            The step's events, identical on every rank: the Monitor's, then the replica and
            bad-rank findings and the adapter's own.

        Raises:
            RuntimeError: the gather failed or timed out (another rank did not call ``update``).
            TrainingFailure: with ``on_critical="raise"``, on every rank alike.
        """
        self._cur_step = self._step if step is None else self._check_step(step)
        self._local_given = local_grad_norm
        if len(self.optimizer.param_groups) != self._n_groups:
            raise ValueError(f"the optimizer had {self._n_groups} param groups when the watcher was built, "
                             f"now {len(self.optimizer.param_groups)}: build a new watcher")
        loss, grad_norm, val_loss = (v.full_tensor() if _is_dtensor(v) else v for v in (loss, grad_norm, val_loss))
        try:
            return super().update(loss, grad_norm=grad_norm, val_loss=val_loss, step=step)
        finally:
            self._local_sq = None
            self._local_given = None
            self._fp = None

    def _local_vector(self, packed: torch.Tensor | None, layout: list[tuple[str, int]],
                      host: dict[str, Any]) -> torch.Tensor:
        """This rank's measurements in the fixed layout, float64, on the device."""
        pieces: dict[str, list[torch.Tensor]] = {}
        if packed is not None:
            for (key, _), t in zip(layout, packed.to(torch.float64).split([w for _, w in layout])):
                pieces.setdefault(key, []).append(t)
        codes = [0.0] * len(_CODED)
        hv: dict[str, list[float]] = {}
        for i, key in enumerate(("loss", "grad_norm", "val_loss")):
            if key in pieces:
                codes[i] = 1.0
            elif key in host:
                codes[i] = 2.0
                hv[key + "_h"] = [float(host[key])]
        if "lrs" in pieces:
            codes[3] = 1.0
        else:
            codes[3] = 2.0
            hv["lrs_h"] = [float(x) for x in host["lrs"]]
        local: torch.Tensor | None = None
        given = self._local_given
        if isinstance(given, torch.Tensor):
            codes[4], local = 1.0, _local(given).detach().reshape(1).to(self._device, torch.float64)
        elif given is not None:
            codes[4] = 2.0
            hv["local_h"] = [float(given)]
        elif self._local_sq is not None:
            codes[4], local = 1.0, self._local_sq.detach().reshape(1).to(torch.float64).sqrt()
        called = set(host.get("act_names", ()))
        flags = [float(self._stepped), float("measured" in pieces), float("layers" in pieces),
                 float("ratio" in pieces), float(self._fp is not None)]
        head = [float(self._cur_step), *codes, *flags, *(float(n in called) for n in self._act_names)]
        for key in ("lrs_h", "loss_h", "grad_norm_h", "val_loss_h", "local_h"):
            width = self._slots[key].stop - self._slots[key].start
            head.extend(hv.get(key, [math.nan] * width))
        parts = [torch.tensor(head, dtype=torch.float64, device=self._device)]
        dead = iter(pieces.get("dead", []))
        sat = iter(pieces.get("sat", []))
        act = {n: (next(dead), next(sat)) for n in self._act_names if n in called}
        for key, width in self._device_slots:
            if key in ("dead", "sat"):
                j = 0 if key == "dead" else 1
                parts.extend(act[n][j] if n in act else self._nan[:1] for n in self._act_names)
                continue
            src = {"loss_d": "loss", "grad_norm_d": "grad_norm", "val_loss_d": "val_loss", "lrs_d": "lrs"}.get(key, key)
            got: torch.Tensor | None
            if key == "local_d":
                got = local
            elif key == "fp":
                got = self._fp
            else:
                got = pieces[src][0] if src in pieces else None
            if got is not None and got.numel() != width:
                raise RuntimeError(f"{src} has {got.numel()} values, the layout {width}")
            parts.append(got.to(self._device) if got is not None else self._nan[:width])
        return torch.cat(parts)

    def _gather(self, vec: torch.Tensor) -> np.ndarray:
        """One all-gather of every rank's vector; ``[world_size, K]`` float64 on the host."""
        vec = vec.to(self._comm_device)
        out = torch.empty(self.world_size * vec.numel(), dtype=vec.dtype, device=vec.device)
        what = f"rank {self.ranks[self.rank]}: the watcher's all-gather at step {self._cur_step}"
        try:
            work = _all_gather_single(out, vec, group=self.process_group, async_op=True)
            done = work.wait() if self.timeout is None else work.wait(timeout=datetime.timedelta(seconds=self.timeout))
        except RuntimeError as exc:
            raise RuntimeError(f"{what} failed ({exc}): another rank did not call update() for this step "
                               "(it crashed, stopped or skipped a step) or the process group is broken") from exc
        if done is False:
            raise RuntimeError(f"{what} timed out after {self.timeout} s")
        return out.view(self.world_size, -1).cpu().numpy().astype(np.float64, copy=False)

    def _transfer(self, packed: torch.Tensor | None, layout: list[tuple[str, int]], host: dict[str, Any]
                  ) -> tuple[list[float], list[tuple[str, int]]]:
        """Gather every rank's measurements, check the replicas and the ranks, return the combined
        values in the combined layout (the keys some rank measured); ``host`` gets the combined
        activation names.
        """
        m = self._gather(self._local_vector(packed, layout, host))
        step = self._cur_step
        self._pending.extend(self._check_replicas(m, step))
        self._pending.extend(self._check_ranks(m, step))
        return self._combine(m, host)

    def _col(self, m: np.ndarray, key: str) -> np.ndarray:
        return m[:, self._slots[key]]

    def _coded(self, m: np.ndarray, key: str) -> tuple[np.ndarray, np.ndarray]:
        """Per rank values of a key that comes from the device or from the host, and which ranks have it."""
        code = m[:, self._slots["codes"].start + _CODED.index(key)]
        dev, hst = self._col(m, key + "_d"), self._col(m, key + "_h")
        return np.where((code == 1.0)[:, None], dev, hst), code > 0

    def _flag(self, m: np.ndarray, key: str) -> np.ndarray:
        return m[:, self._slots["flags"].start + _FLAGS.index(key)] > 0

    def _combine(self, m: np.ndarray, host: dict[str, Any]) -> tuple[list[float], list[tuple[str, int]]]:
        values: list[float] = []
        layout: list[tuple[str, int]] = []

        def put(key: str, v: np.ndarray) -> None:
            layout.append((key, int(v.size)))
            values.extend(float(x) for x in v)

        for key in ("loss", "grad_norm", "val_loss"):
            v, has = self._coded(m, key)
            if has.any():
                put(key, v[has].mean(axis=0))
        for key in ("measured", "layers", "ratio"):
            has = self._flag(m, key)
            if not has.any():
                continue
            block = self._col(m, key)[has]
            if not self.sharded:
                put(key, block.mean(axis=0))
            elif key == "ratio":           # squared sums [d, d per layer, w, w per layer]
                half = block.shape[1] // 2
                d, w = np.sqrt(block[:, :half].sum(axis=0)), np.sqrt(block[:, half:].sum(axis=0))
                put(key, d / np.maximum(w, 1e-30))
            else:
                put(key, np.sqrt(np.square(block).sum(axis=0)))
        lrs, has = self._coded(m, "lrs")
        put("lrs", lrs[has].mean(axis=0))
        called = m[:, self._slots["acts"]] > 0
        names = []
        for j, n in enumerate(self._act_names):
            rows = called[:, j]
            if rows.any():
                names.append(n)
                put("dead", m[rows, self._slots["dead"].start + j].mean(keepdims=True))
                put("sat", m[rows, self._slots["sat"].start + j].mean(keepdims=True))
        if names:
            host["act_names"] = names
        else:
            host.pop("act_names", None)
        return values, layout

    # ------------------------------------------------------------------------------------
    # Checks
    # ------------------------------------------------------------------------------------
    def _check_replicas(self, m: np.ndarray, step: int) -> list[ts.Event]:
        """Compare what must be identical on every rank; one event per newly disagreeing set of ranks."""
        w = self.world_size
        if w < 2:
            return []
        sub = m[:, self._agree_cols]
        if ((sub == sub[0]) | (np.isnan(sub) & np.isnan(sub[0]))).all():     # the usual case: all identical
            if self._flag(m, "fp").all() or self._fp_width == 0 or self.check_every == 0:
                self._last_agree = step
                self._diverged.clear()
            return []
        bad_ranks: set[int] = set()
        signals: list[str] = []
        layers: list[str] = []
        worst = 0.0
        n_differ = 0
        onset = step

        def note(sig: str, mask: np.ndarray, rel: np.ndarray, cols: Sequence[str] = ()) -> None:
            nonlocal worst, n_differ
            n_differ += int(mask.any(axis=0).sum())
            rows = np.flatnonzero(mask.any(axis=1))
            if len(rows) == 0:
                return
            bad_ranks.update(int(r) for r in rows)
            signals.append(sig)
            worst = max(worst, float(np.max(np.where(mask, rel, 0.0))))
            for j in np.flatnonzero(mask.any(axis=0)).tolist():
                if cols and cols[j] not in layers:
                    layers.append(cols[j])

        note("step", *replica_disagreement(m[:, self._slots["step"]]))
        stepped = self._flag(m, "stepped")
        if stepped.any() and not stepped.all():      # the ranks that did not step the optimizer
            mask = (~stepped)[:, None] if stepped.sum() * 2 > w or w == 2 else stepped[:, None]
            note("stepped", mask, np.ones((w, 1)))
        lrs, has = self._coded(m, "lrs")
        if has.all():
            note("lr", *replica_disagreement(lrs, self.tolerance))
        measured = self._flag(m, "measured")
        if not self.sharded and measured.all():
            note("grad_norm", *replica_disagreement(self._col(m, "measured"), self.tolerance))
        fp = self._flag(m, "fp")
        full_check = bool(fp.all()) and self._fp_width > 0
        if full_check:
            n_p = len(self.param_names)
            block = self._col(m, "fp")
            psum, gsum = block[:, :n_p], block[:, n_p:2 * n_p]
            pabs = block[:, 2 * n_p:3 * n_p] if self.tolerance > 0 else None
            gabs = block[:, 3 * n_p:] if self.tolerance > 0 else None
            before = len(signals)
            kind = "checksum" if self.tolerance == 0 else "sum"
            note(f"param_{kind}", *replica_disagreement(psum, self.tolerance, pabs), self.param_names)
            note(f"grad_{kind}", *replica_disagreement(gsum, self.tolerance, gabs), self.param_names)
            if len(signals) > before:
                onset = min(onset, self._last_agree + 1)
        if not bad_ranks:
            if full_check or self._fp_width == 0 or self.check_every == 0:
                self._last_agree = step
                self._diverged.clear()
            return []
        new = bad_ranks - self._diverged
        self._diverged |= bad_ranks
        if not new:
            return []
        named = [self.ranks[r] for r in sorted(bad_ranks)]
        who = (f"{_ranks_text(named)} disagree" if w == 2 else
               f"{_ranks_text(named)} disagree{'s' if len(named) == 1 else ''} with the other "
               f"{w - len(named)} of {w} ranks")
        what = ", ".join(signals)
        if layers:
            what += " in " + _names_text(layers, len(self.param_names))
        how = (f"replicas must be bit-identical: {n_differ} value(s) differ" if self.tolerance == 0 else
               f"largest relative difference {worst:.3g}, tolerance {self.tolerance:g}")
        pair = " (2 ranks: which one is wrong cannot be told)" if w == 2 else ""
        ev = make_event(
            Kind.REPLICA_DIVERGENCE, "critical", step, max(onset, 0), "replica_fingerprint",
            f"{signals[0]}[{_ranks_text(named)}]", n_differ if self.tolerance == 0 else worst, self.tolerance,
            f"{who}{pair} after gradient sync: {what} ({how})",
            layer=layers[0] if layers else None)
        self.findings.append(RankFinding(ev, tuple(named), tuple(layers), tuple(signals)))
        return [ev]

    def _check_ranks(self, m: np.ndarray, step: int) -> list[ts.Event]:
        loss, has_loss = self._coded(m, "loss")
        local, has_local = self._coded(m, "local")
        self.last_rank_values = {"loss": np.where(has_loss, loss[:, 0], np.nan).tolist(),
                                 "local_grad_norm": np.where(has_local, local[:, 0], np.nan).tolist()}
        if self._outliers is None or self.world_size < 2:
            return []
        events = self._outliers.update(
            step, {"loss": loss[:, 0], "local_grad_norm": local[:, 0]},
            present={"loss": has_loss, "local_grad_norm": has_local}, ranks=self.ranks)
        for e in events:
            r = int(e.signal.rsplit("rank ", 1)[1].rstrip("]"))
            self.findings.append(RankFinding(e, (r,), (), (e.signal.split("[", 1)[0],)))
        return events

    def _signals(self, got: dict[str, list[float]], host: dict[str, Any]) -> dict[str, Any]:
        kw = super()._signals(got, host)
        self.last_signals = dict(kw)
        return kw

    def _check_same_everywhere(self, inner: nn.Module) -> None:
        """One gather at construction: every rank must have the same model structure and configuration."""
        shapes = ";".join(f"{n}:{tuple(p.shape)}" for n, p in zip(self.param_names, self._params))
        config = json.dumps(_stable([self.check_every, self.tolerance, self.sharded, self.per_layer,
                                     self.update_ratio_every, self.activations_every, self._act_names,
                                     self._n_groups, self.monitor.config()]), sort_keys=True)
        mine = torch.tensor([float(self._width), float(zlib.crc32(shapes.encode())),
                             float(zlib.crc32(config.encode()))], dtype=torch.float64)
        m = self._gather(mine)
        for j, what in enumerate(("the watcher's gathered vector length", "the model's parameter names and shapes",
                                  "the watcher's and the Monitor's configuration")):
            differ = np.flatnonzero(m[:, j] != m[0, j])
            if len(differ):
                raise ValueError(f"{what} differ across ranks (ranks {[self.ranks[r] for r in differ]} differ "
                                 f"from rank {self.ranks[0]}): construct the watcher identically on every rank")

    def close(self) -> None:
        """Remove the hooks; a DDP communication hook only forwards from now on (DDP cannot remove it)."""
        self._hook_on = False
        super().close()

    def __enter__(self) -> DistributedWatcher:
        return self


def _stable(obj: Any) -> Any:
    """``obj`` as JSON-able data that is the same on every rank (no memory addresses)."""
    if isinstance(obj, Mapping):
        return {str(k): _stable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_stable(v) for v in obj]
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    return type(obj).__name__


def _is_fsdp1(model: nn.Module) -> bool:
    try:
        from torch.distributed.fsdp import FullyShardedDataParallel
    except ImportError:        # pragma: no cover - torch builds without FSDP
        return False
    return isinstance(model, FullyShardedDataParallel)
