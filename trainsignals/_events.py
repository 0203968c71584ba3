"""The event vocabulary: what a detector says when it fires."""

from __future__ import annotations

import enum
import math
from dataclasses import asdict, dataclass
from typing import Any

__all__ = ["DISTRIBUTED_KINDS", "Event", "Kind", "Severity", "SEVERITIES", "TrainingFailure", "check_kinds"]


class Kind(str, enum.Enum):
    """The kinds of failure trainsignals reports (``str`` values, stable)."""

    NONFINITE = "nonfinite"
    DIVERGENCE = "divergence"
    GRAD_EXPLOSION = "grad_explosion"
    LOSS_SPIKE = "loss_spike"
    STALL = "stall"
    OSCILLATION = "oscillation"
    VANISHING_GRADIENT = "vanishing_gradient"
    SILENT_COLLAPSE = "silent_collapse"
    UPDATE_RATIO_HIGH = "update_ratio_high"
    UPDATE_RATIO_LOW = "update_ratio_low"
    OVERFITTING = "overfitting"
    DEAD_UNITS = "dead_units"
    SATURATION = "saturation"
    LR_ANOMALY = "lr_anomaly"
    REPLICA_DIVERGENCE = "replica_divergence"
    BAD_RANK = "bad_rank"

    def __str__(self) -> str:
        return self.value


#: Kinds that only a data-parallel job shows (several ranks compared); a single run's curves never do.
DISTRIBUTED_KINDS: tuple[Kind, ...] = (Kind.REPLICA_DIVERGENCE, Kind.BAD_RANK)


def check_kinds(name: str, values: Any) -> tuple[str, ...]:
    """Validate a collection of kinds (``Kind`` members or their strings); returns the strings.

    Raises:
        ValueError: naming ``name`` and the values that are not kinds.
    """
    kinds = tuple(k.value for k in Kind)
    if isinstance(values, str):  # one kind's string would be read as its letters
        hint = Kind(values).value if values in kinds else values
        raise ValueError(f"{name} must be a sequence of kinds, e.g. [{hint!r}], got {values!r}")
    out = tuple(Kind(k).value if k in kinds else k for k in values)
    bad = [k for k in out if k not in kinds]
    if bad:
        raise ValueError(f"{name} must contain Kind values {kinds}, got {bad}")
    return out


Severity = str  # "info" | "warning" | "critical"
SEVERITIES = ("info", "warning", "critical")


def _fmt(x: float | None) -> str:
    if x is None:
        return "-"
    if not math.isfinite(x):
        return str(x)
    if x == 0 or 1e-3 <= abs(x) < 1e4:
        return f"{x:.4g}"
    return f"{x:.3e}"


@dataclass(frozen=True, slots=True)
class Event:
    """One finding of a detector, as plain data.

    Attributes:
        kind: What went wrong (a :class:`Kind`).
        severity: ``"info"``, ``"warning"`` or ``"critical"``.
        step: The step at which the detector noticed it.
        onset_step: Best estimate of the step at which it began.
        detector: Name of the detector that fired.
        signal: The signal it watched (``"loss"``, ``"grad_norm"``, ``"layer_grad_norms[fc1]"``...).
        value: The statistic that crossed the threshold.
        threshold: The threshold it crossed.
        message: What was seen, in words.
        cause: The likely cause.
        fix: The first fix to try.
        layer: The layer concerned, for per-layer signals.
        healthy_rate: How often the rule that fired raises an alarm on healthy runs at the
            threshold in force: alarms per 10,000 healthy steps, measured by calibration
            (:mod:`trainsignals.eval.calibrate`) on the tuning suites; ``None`` when not
            measured (a setting changed from the default, or a detector without a knob).
        heldout_rate: The same rate on held-out healthy runs: model families and generator
            seeds that no threshold was ever chosen on, so the figure to expect on a run of
            your own (``None`` when not measured, as for ``healthy_rate``).
    """

    kind: Kind
    severity: str
    step: int
    onset_step: int
    detector: str
    signal: str
    value: float
    threshold: float
    message: str
    cause: str
    fix: str
    layer: str | None = None
    healthy_rate: float | None = None
    heldout_rate: float | None = None

    def __str__(self) -> str:
        since = "" if self.onset_step == self.step else f" (since step {self.onset_step})"
        return (
            f"step {self.step} {self.severity.upper()} {self.kind.value}{since}: {self.message} "
            f"[{self.detector} on {self.signal}: {_fmt(self.value)} vs threshold {_fmt(self.threshold)}{self.rate_text()}; "
            f"cause: {self.cause}; fix: {self.fix}]"
        )

    def rate_text(self) -> str:
        """The rule's healthy-run rates in words, held-out first, or ``""`` when not measured.

        Example:
            >>> ev = Event(Kind.STALL, "warning", 9, 9, "d", "loss", 1.0, 0.5, "m", "c", "f",
            ...            healthy_rate=0.25, heldout_rate=1.0)
            >>> ev.rate_text()
            ', fires on 1 in 10,000 held-out healthy steps (1 in 40,000 tuning ones)'
            >>> Event(Kind.STALL, "warning", 9, 9, "d", "loss", 1.0, 0.5, "m", "c", "f", healthy_rate=0.0).rate_text()
            ', never fired on the tuning healthy runs'
        """
        tuned, held = self.healthy_rate, self.heldout_rate
        if tuned is None and held is None:
            return ""
        if held is None:
            assert tuned is not None
            return ", never fired on the tuning healthy runs" if tuned <= 0 else \
                f", fires on 1 in {1e4 / tuned:,.0f} healthy steps"
        text = ", never fired on the held-out healthy runs" if held <= 0 else \
            f", fires on 1 in {1e4 / held:,.0f} held-out healthy steps"
        if tuned is None:
            return text
        return text + (" (never on the tuning ones)" if tuned <= 0 else f" (1 in {1e4 / tuned:,.0f} tuning ones)")

    def to_dict(self) -> dict[str, Any]:
        """A JSON-serialisable dict (``kind`` as its string value)."""
        d = asdict(self)
        d["kind"] = self.kind.value
        for key in ("value", "threshold"):
            v = d[key]
            if not math.isfinite(v):
                d[key] = str(v)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Event:
        """Inverse of :meth:`to_dict`."""
        d = dict(d)
        d["kind"] = Kind(d["kind"])
        d["value"] = float(d["value"])
        d["threshold"] = float(d["threshold"])
        for key in ("healthy_rate", "heldout_rate"):
            if d.get(key) is not None:
                d[key] = float(d[key])
        return cls(**d)


class TrainingFailure(RuntimeError):
    """Raised by an adapter set to ``on_critical="raise"`` when the run fails.

    Attributes:
        events: the events that made the run fail.
    """

    def __init__(self, events: list[Event]) -> None:
        self.events = list(events)
        lines = "\n".join(str(e) for e in self.events)
        super().__init__(f"training failed:\n{lines}")


def make_event(
    kind: Kind,
    severity: str,
    step: int,
    onset_step: int,
    detector: str,
    signal: str,
    value: float,
    threshold: float,
    message: str,
    layer: str | None = None,
) -> Event:
    """Build an event with the standard cause and fix for its kind."""
    from .kinds import KINDS  # the table of kinds imports this module's Kind

    info = KINDS[kind]
    cause, fix = info.cause, info.fix
    return Event(
        kind, severity, int(step), int(onset_step), detector, signal,
        float(value), float(threshold), message, cause, fix, layer,
    )
