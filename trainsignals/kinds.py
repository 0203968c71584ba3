"""One table of the failure kinds: what the project states about each, in one place.

:data:`KINDS` gives, per :class:`~trainsignals.Kind`, the likely cause and first fix every event
of the kind carries (:func:`trainsignals.make_event`), the failed state its events put a run in
(:mod:`trainsignals.status`) and the window after its onset within which the bench counts it as
caught (:func:`default_window`; the real-run builder checks its labels over the same window).
The edges key their own per-kind code by the same kinds: the label checks
(``trainsignals.curves.labels.check_label``) and the fault injectors of the synthetic generator
(``trainsignals.curves.generate``) and of the real-run builders; a test holds them to this table
(:attr:`KindInfo.labelled`, :attr:`KindInfo.injected`).
"""

from __future__ import annotations

from dataclasses import dataclass

from ._events import Kind

__all__ = ["KINDS", "KindInfo", "default_window"]


@dataclass(frozen=True)
class KindInfo:
    """The facts of one failure kind.

    Attributes:
        cause: The likely cause, as events state it (from the project"s failure-mode reference).
        fix: The first fix to try.
        status: The failed state of :attr:`trainsignals.Monitor.status` its events enter, or
            ``None`` (the kind never changes the status).
        window: ``(floor, share)``: the detection window is ``max(floor, share * total_steps)``
            steps after the onset.
        labelled: The real-run label checks know the kind (it is injected into real runs).
        injected: The synthetic generator makes curves of the kind.
    """

    cause: str
    fix: str
    status: str | None = None
    window: tuple[int, float] = (100, 0.10)
    labelled: bool = False
    injected: bool = True


#: Every kind"s facts. Windows: most kinds ``max(100, 10 %)``; ``stall`` ``max(150, 25 %)``, since
#: the stall rules need "no new best loss within 10 % of the planned steps"; ``overfitting``
#: ``max(300, 25 %)``, since validation runs only every 25 to 100 steps and a rise must show over
#: several evaluations; ``silent_collapse``, ``dead_units``, ``saturation`` ``max(250, 15 %)``, since
#: they develop gradually (the suite"s hard cases ramp over up to 250 steps) and a healthy grad
#: norm can drift over a decade in that time.
KINDS: dict[Kind, KindInfo] = {
    Kind.NONFINITE: KindInfo(
        cause="numerical overflow: learning rate too high, bad data, or low-precision overflow",
        fix="lower the learning rate; check the data; use loss scaling in low precision",
        status="diverging",
    ),
    Kind.DIVERGENCE: KindInfo(
        cause="learning rate far too high, bad initialisation or numerics",
        fix="lower the learning rate; add gradient clipping; check the first steps",
        status="diverging",
        labelled=True,
    ),
    Kind.GRAD_EXPLOSION: KindInfo(
        cause="unstable step: learning rate too high, missing normalisation or a bad batch",
        fix="clip gradients; lower the learning rate; add normalisation",
        status="diverging",
        labelled=True,
    ),
    Kind.LOSS_SPIKE: KindInfo(
        cause="a bad batch or an unstable step",
        fix="inspect or skip the batch; clip gradients",
        labelled=True,
    ),
    Kind.STALL: KindInfo(
        cause="learning rate too small, a flat region or dead units",
        fix="raise the learning rate or momentum; try a new seed",
        status="stalled",
        window=(150, 0.25),
        labelled=True,
    ),
    Kind.OSCILLATION: KindInfo(
        cause="learning rate too high or missing normalisation",
        fix="lower the learning rate; clip gradients; add batch normalisation",
        status="oscillating",
        labelled=True,
    ),
    Kind.VANISHING_GRADIENT: KindInfo(
        cause="gradients die before reaching early layers (saturating activations, depth, init)",
        fix="He/Xavier init, skip connections, normalisation placement, GELU",
        labelled=True,
    ),
    Kind.SILENT_COLLAPSE: KindInfo(
        cause="the model collapses to one safe answer while the loss still falls",
        fix="check labels and class balance, initialisation and learning rate; look at per-class metrics",
        status="collapsed",
        window=(250, 0.15),
        labelled=True,
    ),
    Kind.UPDATE_RATIO_HIGH: KindInfo(
        cause="updates too violent for the weights' size: learning rate too high",
        fix="lower the learning rate (per layer or group)",
    ),
    Kind.UPDATE_RATIO_LOW: KindInfo(
        cause="updates too small to change the weights: learning rate too small or dead gradients",
        fix="raise the learning rate (per layer or group)",
    ),
    Kind.OVERFITTING: KindInfo(
        cause="the model memorises the training set",
        fix="stop early and keep the best checkpoint; regularise; use a smaller model",
        window=(300, 0.25),
        labelled=True,
    ),
    Kind.DEAD_UNITS: KindInfo(
        cause="ReLU units pushed into the zero region for every input",
        fix="lower the learning rate; use LeakyReLU/GELU; revisit initialisation",
        window=(250, 0.15),
        labelled=True,
    ),
    Kind.SATURATION: KindInfo(
        cause="tanh/sigmoid units piled at their limits, derivatives near 0",
        fix="add normalisation; revisit initialisation; use another activation",
        window=(250, 0.15),
    ),
    Kind.LR_ANOMALY: KindInfo(
        cause="the scheduler is not wired as intended",
        fix="check the scheduler wiring (warmup, decay, restarts)",
    ),
    Kind.REPLICA_DIVERGENCE: KindInfo(
        cause="data-parallel replicas no longer hold the same weights or gradients: a gradient-sync bug (wrong world-size scaling, a parameter left out of the all-reduce, a rank that skipped a step) or silent data corruption on one device",
        fix="stop and restore the last checkpoint; check which parameters are synced and how gradients are averaged; test the named rank's device",
        injected=False,
    ),
    Kind.BAD_RANK: KindInfo(
        cause="one rank's local loss or gradients sit far outside the others': a corrupted data shard or a failing device",
        fix="inspect the named rank's data shard and device; exclude or replace the node",
        injected=False,
    ),
}


def default_window(kind: str, total_steps: int) -> int:
    """The detection window, in steps after the onset, for a failure kind (:data:`KINDS`).

    A name that is not a kind (``"healthy"``) gets the common window, ``max(100, 10 %)``.

    Example:
        >>> default_window("divergence", 2000), default_window("stall", 400)
        (200, 150)
    """
    try:
        floor, share = KINDS[Kind(kind)].window
    except ValueError:
        floor, share = KindInfo("", "").window
    return max(floor, int(share * total_steps))
