"""JAX / optax adapter: measure gradients on device, one host transfer per step.

Everything that touches arrays here is jit-compatible and runs *inside* your jitted train
step; the host side only turns a handful of fetched numbers into :meth:`Monitor.update`
keywords. Importing this module imports ``jax`` (and ``optax`` for :func:`monitored`);
``import trainsignals`` does not.

Three ways to wire it, from least to most intrusive:

* :func:`grad_stats` in your step: ``stats = grad_stats(grads, params, updates)`` returns a
  small dict of device arrays (global grad norm, per-leaf grad norms in a fixed leaf order,
  ‖updates‖/‖params‖ globally and per leaf). Return it from the jitted step, fetch it once
  with ``jax.device_get`` and feed ``mon.update(step=..., loss=..., **to_monitor_kwargs(stats,
  names))`` where ``names = leaf_names(params)`` (``params/Dense_0/kernel``, …).
  Fetching every step makes the host wait for the device before it can dispatch the next
  step; :class:`LaggedFeed` fetches step *t*'s stats after step *t + 1* was dispatched, so
  an accelerator need not idle while the host feeds the Monitor (events arrive one step
  later, with their true step numbers). On the CPU backend, where host and "device" share
  the cores, it brought no measurable gain (``benchmarks/bench_jax.py``).
* :func:`monitored` wraps an optax ``GradientTransformation``: it measures the gradients that
  flow into it, the updates it emits and (when ``params`` is passed to ``update``) the update
  ratio, and keeps the latest measurements in its state, in optax's own style;
  :func:`measurements` finds them in the optimizer state (also the learning rate when an
  ``optax.inject_hyperparams`` state is inside). Wrap the whole chain — ``monitored(
  optax.chain(clip, adam))`` — to see the gradients before clipping.
* Fully jitted loops (``lax.scan`` over steps) have two routes:

  (a) **collect, then replay**: return the stats (and the loss) as scan outputs, fetch the
      stacked arrays once after the loop and replay them with ``mon.scan(**to_scan_kwargs(
      stacked, names))``. Fastest — nothing leaves the device during the loop — but the
      events only exist after the loop ends, so a diverging run cannot be stopped early.
  (b) **stream out**: call ``cb = host_callback_update(mon, names)`` once, then
      ``cb(step, stats, loss=loss)`` inside the scan body. Each step sends its stats to the
      host through ``jax.debug.callback(..., ordered=True)`` and feeds ``mon.update`` live
      (events are printed / collected as they happen). Costs a device→host round trip per
      step and serialises the callbacks (``ordered=True`` keeps steps in order, which the
      Monitor needs: steps must not decrease). Callbacks run asynchronously: call
      ``cb.flush()`` (``jax.effects_barrier()``) before reading ``cb.events`` after the loop.
      A jitted loop cannot be broken from the host; read ``mon.should_stop`` between chunks.

  Both routes give the same events (the Monitor's batch path is exact).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from trainsignals import LayerValues

__all__ = [
    "HostMonitorCallback",
    "LaggedFeed",
    "MonitoredState",
    "grad_stats",
    "host_callback_update",
    "leaf_names",
    "measurements",
    "monitored",
    "pred_spread",
    "pred_top_share",
    "to_monitor_kwargs",
    "to_scan_kwargs",
]

PyTree = Any
Stats = dict[str, Any]

# Keys passed straight through to Monitor.update / Monitor.scan when present in a stats dict.
_PASSTHROUGH = ("loss", "lr", "val_loss", "val_metric", "pred_top_share", "pred_spread")


def pred_top_share(outputs: jax.Array, axis: int = -1) -> jax.Array:
    """The share of the most-predicted class in a batch of logits: the ``pred_top_share`` signal.

    Jit-compatible (the class count is the static size of ``axis``): return it from your step
    in the stats dict (``stats["pred_top_share"] = pred_top_share(logits)``) and
    :func:`to_monitor_kwargs` / :func:`to_scan_kwargs` pass it on. Works on NumPy arrays too.

    Args:
        outputs: logits or probabilities with the classes along ``axis`` (at least 2-D).
        axis: the class axis.

    Returns:
        A 0-d array in [0, 1].

    Example:
        >>> float(pred_top_share(jnp.array([[2.0, 0.1], [1.5, 0.2], [0.1, 3.0], [0.9, 0.1]])))
        0.75
    """
    if jnp.ndim(outputs) < 2:
        raise ValueError(f"outputs must have the classes along axis {axis} (at least 2-D), got shape "
                         f"{jnp.shape(outputs)}")
    preds = jnp.argmax(outputs, axis=axis).reshape(-1)
    counts = jnp.bincount(preds, length=jnp.shape(outputs)[axis])
    return counts.max() / preds.size


def pred_spread(outputs: jax.Array) -> jax.Array:
    """The spread of a batch's predictions: the ``pred_spread`` signal of a regression.

    The standard deviation of ``outputs`` across the batch (axis 0), averaged over the other
    axes; a regression whose predictions collapse to one answer while its loss falls loses it
    (:class:`trainsignals.SpreadCollapse`). Jit-compatible: return it in the stats dict
    (``stats["pred_spread"] = pred_spread(preds)``). Works on NumPy arrays too.

    Args:
        outputs: the batch's predictions, ``(batch,)`` or ``(batch, ...)``, at least 2 of them.

    Returns:
        A 0-d array ``>= 0``.

    Example:
        >>> float(pred_spread(jnp.array([[1.0, 0.0], [3.0, 0.0]])))
        0.5
    """
    if jnp.ndim(outputs) < 1 or jnp.shape(outputs)[0] < 2:
        raise ValueError(f"outputs must hold a batch of at least 2 predictions along axis 0, got shape "
                         f"{jnp.shape(outputs)}")
    x = jnp.reshape(outputs, (jnp.shape(outputs)[0], -1))
    return jnp.mean(jnp.std(x, axis=0))


def _key_name(key: Any) -> str:
    """One path entry as plain text: ``DictKey('params')`` → ``params``."""
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return jax.tree_util.keystr((key,))


def leaf_names(tree: PyTree) -> list[str]:
    """Names of a pytree's leaves, in the order :func:`grad_stats` measures them.

    Built from the pytree paths (``jax.tree_util.tree_flatten_with_path``), joined with
    ``/``: a Flax linen ``{"params": {"Dense_0": {"kernel": ...}}}`` gives
    ``params/Dense_0/kernel``; lists and tuples give their index.

    Args:
        tree: the parameter (or gradient) pytree; only its structure is read.

    Returns:
        One name per leaf, in ``jax.tree_util.tree_leaves`` order.

    Example:
        >>> import jax.numpy as jnp
        >>> leaf_names({"params": {"Dense_0": {"bias": jnp.zeros(2), "kernel": jnp.zeros((3, 2))}}})
        ['params/Dense_0/bias', 'params/Dense_0/kernel']
    """
    flat, _ = jax.tree_util.tree_flatten_with_path(tree)
    names = []
    for path, _leaf in flat:
        try:
            name = jax.tree_util.keystr(path, simple=True, separator="/")
        except TypeError:  # older jax without simple=/separator=
            name = "/".join(_key_name(k) for k in path)
        names.append(name or "<root>")
    return names


def _sq_norms(tree: PyTree) -> jax.Array:
    """Per-leaf squared L2 norms as one float vector (non-float leaves count as 0)."""
    leaves = jax.tree_util.tree_leaves(tree)
    sq = []
    for x in leaves:
        x = jnp.asarray(x)
        if not jnp.issubdtype(x.dtype, jnp.inexact):
            sq.append(jnp.zeros((), jnp.float32))
            continue
        x = x.astype(jnp.promote_types(x.dtype, jnp.float32))
        if jnp.iscomplexobj(x):
            x = jnp.abs(x)
        sq.append(jnp.sum(jnp.square(x)).astype(jnp.float32))
    if not sq:
        return jnp.zeros((0,), jnp.float32)
    return jnp.stack(sq)


def _ratio(num: jax.Array, den: jax.Array) -> jax.Array:
    """Num / den, NaN where den == 0 (the ratio is undefined there, e.g. a zero-initialised bias)."""
    safe = jnp.where(den > 0, den, 1.0)
    return jnp.where(den > 0, num / safe, jnp.nan)


def grad_stats(
    grads: PyTree,
    params: PyTree | None = None,
    updates: PyTree | None = None,
    *,
    per_leaf: bool = True,
) -> Stats:
    """Gradient and update statistics of one step, as a small dict of device arrays.

    Jit-compatible (call it inside your jitted train step, on the same pytrees); the result is
    a handful of scalars plus, with ``per_leaf``, vectors of one entry per leaf in
    :func:`leaf_names` order — so one ``jax.device_get`` per step fetches everything.

    Args:
        grads: gradient pytree (before clipping, to see what the optimizer was given).
        params: parameter pytree *before* the update; needed for the update ratio.
        updates: the optimizer's updates (the step actually applied to ``params``).
        per_leaf: also return per-leaf vectors (``layer_grad_norms``, and
            ``layer_update_ratios`` when both ``params`` and ``updates`` are given).

    Returns:
        A dict with ``grad_norm`` (global L2 norm, float32 scalar) and, when requested or
        available: ``layer_grad_norms`` (vector), ``update_norm``; with ``params`` as well:
        ``param_norm``, ``update_ratio`` (‖updates‖/‖params‖, NaN when ‖params‖ = 0) and
        ``layer_update_ratios`` (vector; NaN for an all-zero leaf such as a fresh bias).
        Norms are accumulated in float32 (float64 leaves stay float64 until the final cast).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> g = {"a": jnp.array([3.0, 4.0]), "b": jnp.array([0.0])}
        >>> s = jax.jit(grad_stats)(g)
        >>> float(s["grad_norm"]), s["layer_grad_norms"].tolist()
        (5.0, [5.0, 0.0])
    """
    gsq = _sq_norms(grads)
    out: Stats = {"grad_norm": jnp.sqrt(jnp.sum(gsq))}
    if per_leaf:
        out["layer_grad_norms"] = jnp.sqrt(gsq)
    if updates is not None:
        usq = _sq_norms(updates)
        out["update_norm"] = jnp.sqrt(jnp.sum(usq))
        if params is not None:
            psq = _sq_norms(params)
            out["param_norm"] = jnp.sqrt(jnp.sum(psq))
            out["update_ratio"] = _ratio(out["update_norm"], out["param_norm"])
            if per_leaf:
                out["layer_update_ratios"] = _ratio(jnp.sqrt(usq), jnp.sqrt(psq))
    return out


def _as_float(x: Any) -> float:
    return float(np.asarray(x))


def to_monitor_kwargs(stats: Mapping[str, Any], names: Sequence[str] | None = None) -> dict[str, Any]:
    """Host side: fetched stats of one step → :meth:`Monitor.update` keywords.

    Args:
        stats: the dict from :func:`grad_stats` or :func:`measurements`, already on the host
            (``jax.device_get``); device arrays also work but each costs a transfer. Extra keys
            ``loss``, ``lr``, ``val_loss``, ``val_metric``, ``pred_top_share`` and
            ``pred_spread`` (if you put them in the dict) pass through.
        names: leaf names (from :func:`leaf_names`) for ``layer_grad_norms`` and
            ``layer_update_ratios``; without them the layers are named by index.

    Returns:
        ``grad_norm``, ``update_ratio`` (omitted while ‖params‖ = 0 or when it was not
        measured), ``layer_grad_norms`` and ``layer_update_ratios`` (:class:`trainsignals.LayerValues`
        mappings, name -> value; a leaf whose ratio is NaN — an all-zero leaf, or not measured —
        is "not measured" for the Monitor; the ratios are omitted when no leaf was measured or
        the step updated nothing, ``update_norm`` 0: an ``optax.MultiSteps`` accumulation step)
        and the pass-through keys, as Python floats. The per-leaf update ratios feed the
        Monitor's per-layer check: a leaf that stops moving while the others learn (a frozen
        layer) is reported as ``update_ratio_low``.
    """
    kw: dict[str, Any] = {}
    if "grad_norm" in stats:
        kw["grad_norm"] = _as_float(stats["grad_norm"])
    if "update_ratio" in stats:
        pn = stats.get("param_norm")
        r = _as_float(stats["update_ratio"])
        if (pn is None or _as_float(pn) > 0) and not (pn is None and np.isnan(r)):
            kw["update_ratio"] = r
    for key, what in (("layer_grad_norms", "layer grad norms"), ("layer_update_ratios", "layer update ratios")):
        if key not in stats:
            continue
        v = np.asarray(stats[key], dtype=np.float64).reshape(-1)
        keys = tuple(names) if names is not None else tuple(str(i) for i in range(len(v)))
        if len(keys) != len(v):
            raise ValueError(f"{len(keys)} names for {len(v)} {what}")
        if key == "layer_update_ratios" and ("update_norm" in stats and not _as_float(stats["update_norm"]) > 0):
            continue    # no update at all this step (a MultiSteps micro-step, a skipped step): nothing to compare
        if len(v) and (key == "layer_grad_norms" or not np.isnan(v).all()):
            kw[key] = LayerValues(keys, v)
    for k in _PASSTHROUGH:
        if k in stats and stats[k] is not None:
            kw[k] = _as_float(stats[k])
    return kw


def to_scan_kwargs(
    stacked: Mapping[str, Any], names: Sequence[str] | None = None, *, step: Any = None
) -> dict[str, Any]:
    """Host side: stats stacked over steps (``lax.scan`` outputs) → :meth:`Monitor.scan` keywords.

    Route (a) of the module docstring: ``ys = jax.device_get(ys)`` after the loop, then
    ``mon.scan(**to_scan_kwargs(ys, names, step=steps))``. Gives the same events as feeding
    :func:`to_monitor_kwargs` of each step to :meth:`Monitor.update`.

    Args:
        stacked: a dict like :func:`grad_stats`'s with a leading step axis on every entry
            (plus ``loss``/``lr``/``val_loss``/``val_metric``/``pred_top_share``/``pred_spread``
            arrays if collected).
        names: leaf names for the columns of ``layer_grad_norms`` and ``layer_update_ratios``.
        step: the step numbers (optional; by default they continue the Monitor's count).

    Returns:
        Keywords for :meth:`Monitor.scan`: dense float arrays; ``update_ratio`` is a masked
        array (a gap, "not measured") where ‖params‖ was 0; ``layer_grad_norms`` and
        ``layer_update_ratios`` are ``{name: column}`` (NaN: not measured — the update ratios
        of a step that updated nothing, ``update_norm`` 0, are NaN).
    """
    kw: dict[str, Any] = {}
    if step is not None:
        kw["step"] = np.asarray(step)
    if "grad_norm" in stacked:
        kw["grad_norm"] = np.asarray(stacked["grad_norm"], dtype=np.float64).reshape(-1)
    if "update_ratio" in stacked:
        r = np.asarray(stacked["update_ratio"], dtype=np.float64).reshape(-1)
        if "param_norm" in stacked:
            gap = ~(np.asarray(stacked["param_norm"], dtype=np.float64).reshape(-1) > 0)
            kw["update_ratio"] = np.ma.masked_array(r, mask=gap) if gap.any() else r
        else:
            kw["update_ratio"] = r
    for key, what in (("layer_grad_norms", "layer grad norm"), ("layer_update_ratios", "layer update ratio")):
        if key not in stacked:
            continue
        m = np.asarray(stacked[key], dtype=np.float64)
        m = m.reshape(m.shape[0], -1)
        keys = list(names) if names is not None else [str(i) for i in range(m.shape[1])]
        if len(keys) != m.shape[1]:
            raise ValueError(f"{len(keys)} names for {m.shape[1]} {what} columns")
        if key == "layer_update_ratios" and "update_norm" in stacked:
            # steps without any update (MultiSteps micro-steps, skipped steps): not measured
            moved = np.asarray(stacked["update_norm"], dtype=np.float64).reshape(-1) > 0
            m = np.where(moved[:, None], m, np.nan)
        if m.shape[1] and (key == "layer_grad_norms" or not np.isnan(m).all()):
            kw[key] = {k: m[:, i] for i, k in enumerate(keys)}
    for k in _PASSTHROUGH:
        if k in stacked and stacked[k] is not None:
            kw[k] = np.asarray(stacked[k], dtype=np.float64).reshape(-1)
    return kw


class LaggedFeed:
    """Feeds a Monitor one step behind, so the host transfer can overlap the next step's compute.

    ``feed(step, stats, loss=loss)`` with the *device* arrays of the step just dispatched
    queues them and feeds the previous step's (fetching them now: they are ready or nearly),
    returning that step's events. Call :meth:`flush` after the loop for the last step.

    Example::

        feed = LaggedFeed(mon, leaf_names(params))
        for step, batch in enumerate(loader):
            params, opt_state, stats, loss = train_step(params, opt_state, batch)
            for e in feed(step, stats, loss=loss):
                print(e)
        feed.flush()

    Attributes:
        monitor: the Monitor fed.
        names: leaf names for the per-layer grad norms.
    """

    def __init__(self, monitor: Any, names: Sequence[str] | None = None) -> None:
        self.monitor = monitor
        self.names = list(names) if names is not None else None
        self._pending: tuple[Any, dict[str, Any]] | None = None

    def __call__(self, step: Any, stats: Mapping[str, Any], **extra: Any) -> list[Any]:
        """Queue this step's stats; feed the previous step's. Returns the events raised."""
        unknown = set(extra) - set(_PASSTHROUGH)
        if unknown:
            raise TypeError(f"unexpected signals {sorted(unknown)}; allowed: {list(_PASSTHROUGH)}")
        events = self.flush()
        self._pending = (step, {**stats, **{k: v for k, v in extra.items() if v is not None}})
        return events

    def flush(self) -> list[Any]:
        """Feed the queued step, if any; returns its events."""
        if self._pending is None:
            return []
        step, stats = self._pending
        self._pending = None
        host = jax.device_get(stats)
        return list(self.monitor.update(step=int(np.asarray(step)), **to_monitor_kwargs(host, self.names)))


# ----------------------------------------------------------------------------------- optax


class MonitoredState(NamedTuple):
    """State of :func:`monitored`: the wrapped transformation's state and the latest stats."""

    inner: Any
    stats: Stats


def monitored(tx: Any, *, per_leaf: bool = True) -> Any:
    """Wrap an optax ``GradientTransformation`` so that it measures what flows through it.

    Each ``update`` computes :func:`grad_stats` of the incoming gradients, the emitted updates
    and — when ``params`` is passed to ``update`` — the update ratio, and stores them in the
    state (``MonitoredState.stats``), like ``optax.apply_if_finite`` keeps its flags there.
    The stats have a fixed structure (``update_ratio`` entries are NaN when ``params`` was
    not given), so the state can be carried through ``jit`` and ``lax.scan``.

    Args:
        tx: the transformation to wrap; wrap the whole chain to see gradients before clipping.
        per_leaf: also keep the per-leaf vectors.

    Returns:
        An ``optax.GradientTransformation``; read its measurements with :func:`measurements`.
    """
    import optax

    def _empty(params: PyTree) -> Stats:
        n = len(jax.tree_util.tree_leaves(params))
        zero = jnp.zeros((), jnp.float32)
        nan = jnp.full((), jnp.nan, jnp.float32)
        s: Stats = {"grad_norm": zero, "update_norm": zero, "param_norm": zero, "update_ratio": nan}
        if per_leaf:
            s["layer_grad_norms"] = jnp.zeros((n,), jnp.float32)
            s["layer_update_ratios"] = jnp.full((n,), jnp.nan, jnp.float32)
        return s

    def init_fn(params: PyTree) -> MonitoredState:
        return MonitoredState(inner=tx.init(params), stats=_empty(params))

    def update_fn(updates: PyTree, state: MonitoredState, params: PyTree | None = None) -> Any:
        new_updates, inner = tx.update(updates, state.inner, params)
        if params is not None:
            stats = grad_stats(updates, params, new_updates, per_leaf=per_leaf)
        else:
            stats = grad_stats(updates, None, new_updates, per_leaf=per_leaf)
            n = stats["layer_grad_norms"].shape[0] if per_leaf else 0
            stats["param_norm"] = jnp.zeros((), jnp.float32)
            stats["update_ratio"] = jnp.full((), jnp.nan, jnp.float32)
            if per_leaf:
                stats["layer_update_ratios"] = jnp.full((n,), jnp.nan, jnp.float32)
        return new_updates, MonitoredState(inner=inner, stats=stats)

    return optax.GradientTransformation(init_fn, update_fn)


def _find_lr(state: Any) -> Any:
    """The ``learning_rate`` of the first ``inject_hyperparams`` state inside ``state``, or None."""
    found: list[Any] = []

    def visit(x: Any) -> bool:
        hp = getattr(x, "hyperparams", None)
        if isinstance(hp, Mapping) and "learning_rate" in hp:
            found.append(hp["learning_rate"])
            return True
        return False

    jax.tree_util.tree_leaves(state, is_leaf=visit)
    return found[0] if found else None


def measurements(opt_state: Any) -> Stats:
    """The latest measurements of the (first) :func:`monitored` transformation in ``opt_state``.

    Works on device (inside jit: return it from the step) or on a fetched state. When an
    ``optax.inject_hyperparams`` state with a ``learning_rate`` sits inside the monitored
    transformation, its current value is added as ``lr``.

    Args:
        opt_state: the optimizer state (any nesting: ``chain``, ``multi_transform``, …).

    Returns:
        The stats dict (see :func:`grad_stats`), plus ``lr`` when found.

    Raises:
        ValueError: no :func:`monitored` state inside ``opt_state``.
    """
    states = [
        x
        for x in jax.tree_util.tree_leaves(opt_state, is_leaf=lambda x: isinstance(x, MonitoredState))
        if isinstance(x, MonitoredState)
    ]
    if not states:
        raise ValueError("no monitored() state found in opt_state; wrap the optimizer with monitored(tx)")
    stats = dict(states[0].stats)
    lr = _find_lr(states[0].inner)
    if lr is not None:
        stats["lr"] = lr
    return stats


# -------------------------------------------------------------------------- host callbacks


class HostMonitorCallback:
    """Feeds a host :class:`~trainsignals.Monitor` from inside jitted code (route (b)).

    Call the instance inside the jitted function / ``lax.scan`` body with the step number,
    the stats dict and optional ``loss``/``lr``/``val_loss``/``val_metric``... arrays (the keys
    :func:`to_monitor_kwargs` passes through). Each call issues one
    ordered ``jax.debug.callback``; on the host it runs ``monitor.update`` and appends the
    events to :attr:`events` (and calls ``on_event`` for each, if given).

    Attributes:
        monitor: the Monitor fed.
        names: leaf names for the per-layer grad norms.
        events: every event raised so far through this callback, in order.
    """

    def __init__(
        self,
        monitor: Any,
        names: Sequence[str] | None = None,
        on_event: Callable[[Any], None] | None = None,
    ) -> None:
        self.monitor = monitor
        self.names = list(names) if names is not None else None
        self.on_event = on_event
        self.events: list[Any] = []

    def _host(self, step: Any, stats: Mapping[str, Any]) -> None:
        kw = to_monitor_kwargs(stats, self.names)
        evs = self.monitor.update(step=int(np.asarray(step)), **kw)
        self.events.extend(evs)
        if self.on_event is not None:
            for e in evs:
                self.on_event(e)

    def __call__(self, step: Any, stats: Mapping[str, Any], **extra: Any) -> None:
        """Send one step to the host (inside or outside jit).

        Args:
            step: the step number (an int array is fine).
            stats: the dict of :func:`grad_stats` / :func:`measurements`.
            **extra: ``loss``, ``lr``, ``val_loss``, ``val_metric``, ``pred_top_share``,
                ``pred_spread`` arrays to feed as well.
        """
        unknown = set(extra) - set(_PASSTHROUGH)
        if unknown:
            raise TypeError(f"unexpected signals {sorted(unknown)}; allowed: {list(_PASSTHROUGH)}")
        payload = {**stats, **{k: v for k, v in extra.items() if v is not None}}
        jax.debug.callback(self._host, step, payload, ordered=True)

    def flush(self) -> list[Any]:
        """Wait for every pending callback (``jax.effects_barrier``); returns :attr:`events`."""
        jax.effects_barrier()
        return self.events


def host_callback_update(
    monitor: Any,
    names: Sequence[str] | None = None,
    *,
    on_event: Callable[[Any], None] | None = None,
) -> HostMonitorCallback:
    """A function to call inside a jitted loop that streams each step to ``monitor`` (route (b)).

    Example (inside a ``lax.scan`` body)::

        cb = host_callback_update(mon, leaf_names(params), on_event=print)

        def body(carry, step):
            ...
            cb(step, grad_stats(grads, params, updates), loss=loss)
            return carry, None

        jax.lax.scan(body, carry, jnp.arange(n))
        cb.flush()   # all callbacks done; mon is up to date

    Args:
        monitor: a :class:`~trainsignals.Monitor` (anything with the same ``update``).
        names: leaf names (:func:`leaf_names`) for the per-layer grad norms.
        on_event: called on the host with each event as it is raised.

    Returns:
        A :class:`HostMonitorCallback`.
    """
    return HostMonitorCallback(monitor, names, on_event)
