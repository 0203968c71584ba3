"""Per-layer values as a read-only mapping over a names tuple and a NumPy vector."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np


class LayerValues(Mapping[str, float]):
    """One value per layer: a read-only ``{layer name: float}`` mapping backed by a vector.

    Adapters measure every layer at once and bring the values to the host as one array; turning
    that array into a ``dict`` each step, only for :meth:`Monitor.update` to turn it back into a
    vector, costs more than the Monitor's own per-layer work on a model with hundreds of
    layers. A ``LayerValues`` is accepted wherever a per-layer mapping is
    (``layer_grad_norms=``, ``layer_update_ratios=``) and hands the Monitor its vector as is.
    As a mapping it behaves like the equivalent ``dict`` (iteration in layer order, lookup by
    name, ``==`` with a dict). It is a value: its vector must not change once it was passed
    (what the detectors derive from it is computed once and shared).

    Args:
        names: the layer names, in the vector's order (a tuple is kept as is: pass the same
            tuple every step and the Monitor compares it by identity).
        values: one real number per name (any 1-D array-like; kept as a float64 vector,
            without a copy when it already is one).

    Raises:
        TypeError: values that are not real numbers.
        ValueError: as many values as names, or a vector that is not 1-D, is required.

    Example:
        >>> lv = LayerValues(("fc1.weight", "fc2.weight"), [0.5, 0.25])
        >>> lv["fc2.weight"], list(lv), lv == {"fc1.weight": 0.5, "fc2.weight": 0.25}
        (0.25, ['fc1.weight', 'fc2.weight'], True)
    """

    __slots__ = ("names", "array", "shared", "_index", "_log", "_low")

    def __init__(self, names: Sequence[str], values: Any) -> None:
        self.names: tuple[str, ...] = names if isinstance(names, tuple) else tuple(names)
        try:
            arr = np.asarray(values, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise TypeError("LayerValues values must be real numbers") from exc
        if arr.ndim != 1 or len(arr) != len(self.names):
            raise ValueError(f"LayerValues needs one value per name: {len(self.names)} names, "
                             f"values of shape {arr.shape}")
        self.array: np.ndarray = arr
        #: scratch space for results derived from this value (read-only arrays, keyed by their recipe),
        #: so that the detectors reading it in one step compute each of them once
        self.shared: dict[Any, Any] = {}
        self._index: dict[str, int] | None = None
        self._log: tuple[float, np.ndarray] | None = None
        self._low: float | None = None

    def low(self) -> float:
        """The smallest value (``nan`` when a value is ``nan``), computed once per value.

        Example:
            >>> LayerValues(("a", "b"), [3.0, 0.5]).low()
            0.5
        """
        got = self._low
        if got is None:
            a = self.array
            got = self._low = a.item(a.argmin()) if len(a) else float("inf")  # argmin finds a nan first, and is faster
        return got

    def log10(self, floor: float = 0.0) -> np.ndarray:
        """``log10`` of the values, each taken at least ``floor`` (a zero or negative value gives a
        non-finite one), as a read-only vector computed once per value and floor: every detector
        reading this value in a step shares it.

        Example:
            >>> LayerValues(("a", "b"), [100.0, 0.0]).log10(1e-30).tolist()
            [2.0, -30.0]
        """
        got = self._log
        if got is not None and got[0] == floor:
            return got[1]
        if floor:  # every value at least floor > 0 (or nan): nothing to warn about
            u = np.log10(np.maximum(self.array, floor))
        elif self.low() > 0.0:  # positive values (inf and nan give themselves without a warning)
            u = np.log10(self.array)
        else:
            with np.errstate(divide="ignore", invalid="ignore"):
                u = np.log10(self.array)
        u.flags.writeable = False
        self._log = (floor, u)
        return u

    def release(self) -> None:
        """Drop what was derived from this value (its ``log10``, the shared results), keeping the vector.

        The :class:`~trainsignals.Monitor` calls it once the step that read the value is judged,
        so that values a caller keeps hold no more memory than their vectors (a value read
        again derives them again).
        """
        self.shared.clear()
        self._log = None

    def __getitem__(self, name: str) -> float:
        if self._index is None:
            self._index = {n: i for i, n in enumerate(self.names)}
        return float(self.array[self._index[name]])

    def __iter__(self) -> Iterator[str]:
        return iter(self.names)

    def __len__(self) -> int:
        return len(self.names)

    def __repr__(self) -> str:
        return f"LayerValues({dict(self)!r})"
