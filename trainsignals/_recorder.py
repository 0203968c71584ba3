"""What a Monitor hands to a recorder (e.g. ``trainsignals.TraceWriter``) at each update."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

from ._events import Event

__all__ = ["Recorder"]


@runtime_checkable
class Recorder(Protocol):
    """Receives every step a :class:`~trainsignals.Monitor` sees, and the events it raised.

    ``Monitor(recorder=r)`` calls :meth:`record` once per ``update`` (after the detectors ran)
    and :meth:`record_batch` once per ``scan``. When the Monitor is given per-layer update
    ratios, both also get a ``layer_update_ratios`` keyword, in the same forms as
    ``layer_grad_norms``, if their signature takes it (or ``**kwargs``): a recorder written
    without it keeps working, and does not see them. A recorder may also have a method
    ``plan(settings)`` (not part of the protocol's check): the Monitor calls it once, when it is
    built, with its own settings as a dict (``total_steps``, ``log_every``,
    ``val_metric_mode``, ``warmup``, ``recovery``, ``min_patience``, ``max_events``, ``stop_on``,
    the detector ``settings``, ``suite``: ``"default"`` or ``"custom"``, ``policy``);
    :meth:`trainsignals.io.traces.TraceWriter.plan` keeps them in the trace for ``replay``.
    """

    def record(
        self,
        *,
        step: int,
        signals: Mapping[str, float],
        layer_grad_norms: tuple[np.ndarray, tuple[str, ...]] | None,
        activations: tuple[np.ndarray, tuple[str, ...]] | None,
        events: Sequence[Event],
    ) -> None:
        """One update.

        Args:
            step: The step.
            signals: The scalar signals given (``loss``, ``grad_norm``, ``lr``, ``update_ratio``,
                ``val_loss``), as floats; absent ones are missing from the mapping.
            layer_grad_norms: ``(vector, layer names)`` or None.
            activations: ``(matrix of shape (2, layers): rows dead_frac, saturation, with nan where
                not given; layer names)`` or None.
            events: The events raised at this step.
        """

    def record_batch(
        self,
        *,
        steps: np.ndarray,
        signals: Mapping[str, np.ndarray],
        val_loss: tuple[np.ndarray, np.ndarray] | None,
        layer_grad_norms: tuple[np.ndarray, np.ndarray, tuple[str, ...] | None] | None,
        activations: tuple[np.ndarray, Mapping[str, Any]] | None,
        events: Sequence[Event],
    ) -> None:
        """One ``scan``: dense signals aligned with ``steps``; ``val_loss`` as ``(steps, values)``;
        ``layer_grad_norms`` as ``(steps, matrix (n, layers), names or None when unnamed)``; ``activations`` as
        ``(steps, {layer: {stat: array}})``; all the events the scan raised.
        """
