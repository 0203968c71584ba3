"""The status rule, stated once: which events put a run in which failed state.

:attr:`trainsignals.Monitor.status` (streaming) and :func:`trainsignals.io.report.status_timeline`
(a whole run's events at once) both read it. A failed state is entered by an event of its
kinds and lasts ``recovery`` steps after the latest one; the worst live state wins.

Example:
    >>> from trainsignals import Kind
    >>> from trainsignals._events import make_event
    >>> ev = make_event(Kind.GRAD_EXPLOSION, "warning", 10, 5, "demo", "grad_norm", 50.0, 10.0, "jump")
    >>> state_of(ev), state_of(make_event(Kind.STALL, "warning", 10, 5, "demo", "loss", 0.0, 0.0, "flat"))
    (None, 'stalled')
    >>> state_of(make_event(Kind.LOSS_SPIKE, "critical", 10, 10, "demo", "loss", 50.0, 6.0, "third spike"))
    'diverging'
"""

from __future__ import annotations

from typing import Any

from ._events import Event, Kind
from .detectors._interval import MIN_WARM, covered
from .kinds import KINDS

__all__ = ["STATUSES", "STATE_OF", "RANK", "WARM_VALUES", "state_of", "warmed_up"]

#: finite losses that end the warm-up before ``warmup`` of them once they span ``warmup`` steps: a log
#: written every N steps leaves ``warming_up`` after 8 rows, as the detectors judge it
WARM_VALUES = MIN_WARM

#: Every value :attr:`Monitor.status` takes, from the start of a run to the worst state.
STATUSES = ("warming_up", "healthy", "stalled", "oscillating", "collapsed", "diverging")

#: Which kinds put the run in which failed state (the ``status`` column of :data:`trainsignals.kinds.KINDS`).
STATE_OF: dict[Kind, str] = {kind: info.status for kind, info in KINDS.items() if info.status is not None}

#: How bad each failed state is (the worst live one is the status). A collapsed run answers one
#: class while its loss looks fine: worse than a stalled or oscillating one, which may still
#: learn; a diverging run is lost outright.
RANK: dict[str, int] = {"diverging": 4, "collapsed": 3, "oscillating": 2, "stalled": 1}


#: the kinds that put a run in ``diverging`` only when critical
_WHEN_CRITICAL = frozenset({Kind.GRAD_EXPLOSION, Kind.LOSS_SPIKE})


def state_of(event: Event) -> str | None:
    """The failed state ``event`` puts the run in, or ``None``.

    ``info`` events never change the status; a gradient explosion does only when critical (a
    grad-norm jump while the loss falls stays a warning and is not a run being lost). A loss spike,
    which is no failed state on its own, puts the run in ``diverging`` when critical: the policy
    makes the third spike within its window critical, since frequent spikes precede divergence,
    and a critical event advises a stop (:attr:`trainsignals.Monitor.should_stop`), which a
    ``healthy`` status would contradict.
    """
    if event.severity == "info":
        return None
    if event.kind in _WHEN_CRITICAL:
        return "diverging" if event.severity == "critical" else None
    return STATE_OF.get(event.kind)


def warmed_up(n: Any, first_step: Any, step: Any, warmup: int) -> Any:
    """Whether a run read at ``step`` has left ``warming_up``: ``n`` finite losses seen, the first at
    ``first_step``, are ``warmup`` of them, or :data:`WARM_VALUES` that span ``warmup`` steps
    (elementwise for NumPy arrays of counts and steps).

    >>> warmed_up(20, 0, 19, 20), warmed_up(8, 0, 7, 20), warmed_up(8, 0, 3500, 20), warmed_up(7, 0, 3500, 20)
    (True, False, True, False)
    """
    return covered(n, first_step, step, warmup)
