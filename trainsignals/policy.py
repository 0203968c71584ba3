"""The Monitor's event policy: what happens to detectors' events across rules (documented once).

Four cross-cutting behaviours sit here, not in the detectors, so each detector implements one
rule and the policy is the same for every rule that reports a kind:

1. **Merge.** Two rules may see one failure (the peak-ratio rule at a spike and the z-score rule
   a step later; the early-climb and the trend rule on one divergence): an event that comes
   after a kept event of the same ``(kind, signal)`` from *another* detector, at no higher
   severity (as the rule reported it), is dropped when it is within ``merge_window`` steps of it for the kinds in
   ``escalate_kinds`` (spikes: each bad batch is its own incident) and within
   ``incident_window`` steps for every other kind (lasting failures: a divergence, a stall, an
   overfit is one incident while it lasts). The first report stands, so the user sees one event
   per incident; a more severe report of it still comes through. A detector's own repeated
   events are never merged (its re-arm rule decides those).
2. **Escalation.** Frequent spikes precede divergence: a warning of a kind in
   ``escalate_kinds`` becomes ``critical`` when it is the ``escalate_after``-th such event of
   its ``(kind, signal)`` within ``escalate_window`` steps (merged events do not count).
3. **The loss guard.** A gradient-norm jump while the loss falls is not a run being lost (loss
   down with the grad norm up is the decoupling of a silent collapse, which the coupling check
   reports; a loss that does climb is caught on the loss itself). For kinds in ``guard_kinds``:

   * an escalation stays a warning when the loss's EWMA level (weight 0.1 on ``log(loss)``,
     before the event's step) is not above its level at the first of the counted events;
   * a critical event (the level-shift rule's "jumped and did not come back") becomes a warning
     when the median of ``log(loss)`` over the last ``GUARD_TAIL`` losses up to its step is not
     above the loss's EWMA level just before its ``onset_step``.

   A loss that is missing, non-finite or non-positive at a step is not used; with no loss
   before the step in question (or none in the last ``GUARD_MEMORY`` losses) the guard does not
   apply.

4. **The divergence hold.** A run that diverged is not healthy again while its loss stays up: each
   kept event (or finding given to the Monitor) that puts the run in the ``diverging`` state
   (:func:`trainsignals.status.state_of`)
   opens a hold at the loss's EWMA level before its ``onset_step`` (the guard's level, from the
   same memory), and the hold ends at the first loss of a later step whose level is back within
   :data:`RECOVERED` of it. While a hold is open (:attr:`EventPolicy.holding`) the Monitor's
   status stays ``diverging`` past its ``recovery`` steps; :func:`hold_sweep` is the same rule
   over a stretch of losses, for the batch path and the report's status timeline.

Per step the policy folds the loss into its EWMA (a log and two multiplications) and, while a hold
is open, compares the level with it; the rest runs only when a detector raised an event.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections import deque
from collections.abc import Sequence
from typing import Any

import numpy as np

from ._events import Event, check_kinds
from ._validate import check_range
from .detectors._ewma_jump import ALPHA, HOLD
from .detectors._interval import MIN_HOLD, MIN_VALUES
from .detectors._ops import column_log, ewma, first_unusable, shared_ewma
from .detectors._ops import log as _log
from .status import state_of

__all__ = ["EventPolicy", "GUARD_MEMORY", "NO_HOLD", "RECOVERED", "hold_marks", "hold_sweep", "loss_levels"]

#: how many of the latest losses the guard of a critical event takes the median of: the second half of the
#: level-shift rule's 10-value watch (the values its verdict rests on)
GUARD_TAIL = 5
#: how many losses the policy remembers to find the loss's level before an event's onset: a level-shift
#: verdict comes 10 values after its jump, or 10 more per "still coming back"; 256 leaves room for 24 of those
GUARD_MEMORY = 256
#: frequent spikes precede divergence: 3 within 200 steps is critical (the former EWMASpike's escalation defaults)
ESCALATE_AFTER = 3
ESCALATE_WINDOW = 200
#: steps within which another rule's report of a lasting failure is the same incident: the cooldown the
#: former multi-rule detectors (SlopeDivergence, TrainValGap) shared between their rules
INCIDENT_WINDOW = 100
#: a loss level at most this far (in log space) above its level before a divergence's onset has come back:
#: 10 %, a round figure for "back where it was". It sets how long the status holds ``diverging``; no event
#: depends on it
RECOVERED = math.log(1.1)
_RANK = {"info": 0, "warning": 1, "critical": 2}
_B = 1.0 - ALPHA

#: a hold: (the lowest threshold of the holds opened at steps before ``step``, the lowest of those opened
#: at ``step``, ``step``); ``None`` for a threshold with no hold. A loss at ``step`` itself came before
#: that step's events, so it can end only the first
Hold = tuple[float | None, float | None, int]
NO_HOLD: Hold = (None, None, -1)
_NO_STEPS = np.zeros(0, dtype=np.int64)
_NO_LEVELS = np.zeros(0)


def _lowest(a: float | None, b: float | None) -> float | None:
    return b if a is None else a if b is None else min(a, b)


def hold_sweep(hold: Hold, marks: Sequence[tuple[int, float]], loss_steps: np.ndarray,
               levels: np.ndarray) -> tuple[Hold, list[tuple[int, bool]]]:
    """The divergence hold (rule 4 of this module) over a stretch: ``marks`` are the ``(step, threshold)``
    of the holds its events open, in step order, ``loss_steps`` and ``levels`` the steps and EWMA levels
    of its usable losses. Returns the hold after the stretch and where it opened or closed:
    ``[(step, open), ...]``.

    >>> hold_sweep(NO_HOLD, [(10, 0.5)], np.array([9, 10, 11, 12]), np.array([0.4, 2.0, 1.0, 0.5]))
    ((None, None, -1), [(10, True), (12, False)])
    """
    old, cur, at = hold
    changes: list[tuple[int, bool]] = []
    pos = 0
    for t, thr in [*marks, (None, None)]:
        stop = len(loss_steps) if t is None else int(np.searchsorted(loss_steps, t, side="left"))
        if stop > pos and (old is not None or cur is not None):
            seg, lev = loss_steps[pos:stop], levels[pos:stop]
            same = int(np.searchsorted(seg, at, side="right"))  # losses of the hold's own step: they came first
            if old is not None and same:
                hit = np.flatnonzero(lev[:same] <= old)
                if len(hit):
                    old = None
                    if cur is None:
                        changes.append((int(seg[hit[0]]), False))
            if same < len(seg):
                old, cur = _lowest(old, cur), None
                if old is not None:
                    hit = np.flatnonzero(lev[same:] <= old)
                    if len(hit):
                        old = None
                        changes.append((int(seg[same + hit[0]]), False))
        pos = max(pos, stop)
        if t is None:
            break
        was = old is not None or cur is not None
        if t > at:
            old, cur, at = _lowest(old, cur), thr, t
        else:
            cur = _lowest(cur, thr)
        if not was:
            changes.append((t, True))
    return (NO_HOLD if old is None and cur is None else (old, cur, at)), changes


def hold_marks(events: Sequence[Event], steps: np.ndarray, levels: np.ndarray) -> list[tuple[int, float]]:
    """The holds the ``diverging`` ones of ``events`` (in step order) open: ``(step, threshold)`` (rule 4),
    the threshold :data:`RECOVERED` above the loss's level before each one's onset, among the last
    ``GUARD_MEMORY`` usable losses up to its step (``steps``, ``levels``: those losses, in order).
    """
    marks = []
    for ev in events:
        if state_of(ev) == "diverging":
            end = int(np.searchsorted(steps, ev.step, side="right"))
            lo = max(0, end - GUARD_MEMORY)
            i = lo + int(np.searchsorted(steps[lo:end], ev.onset_step, side="left"))
            if i > lo:
                marks.append((ev.step, float(levels[i - 1]) + RECOVERED))
    return marks


def loss_levels(log_loss: np.ndarray, start: float | None = None) -> np.ndarray:
    """The loss's EWMA level after each of ``log_loss`` (the logs of usable losses), from the level
    ``start`` (``None``: the first log is the first level), as :meth:`EventPolicy.apply` folds them.
    """
    if not len(log_loss):
        return np.zeros(0)
    if start is None:
        return np.concatenate((log_loss[:1], ewma(log_loss[1:], ALPHA, _B, float(log_loss[0]))))
    return ewma(log_loss, ALPHA, _B, start)


class EventPolicy:
    """Merge, escalation, the loss guard and the divergence hold of the Monitor's events (see the module docstring).

    Args:
        escalate_after: events of a ``(kind, signal)`` within ``escalate_window`` steps that make
            the latest critical, >= 0 (0: never).
        escalate_window: the window, in steps, for escalation, >= 1.
        escalate_kinds: the kinds whose warnings are merged and escalated.
        guard_kinds: the kinds the loss guard vets (a subset of ``escalate_kinds`` or not).
        merge_window: steps after a kept event of a kind in ``escalate_kinds`` within which
            another detector's event of the same ``(kind, signal)``, no more severe, is dropped,
            >= 0 (0: only the same step); by default the z-rule's 10-value watch, within which
            the former single spike detector raised no second event.
        incident_window: the same, for every other kind, >= 0.

    Raises:
        ValueError: a bad setting (named).

    Example:
        Three grad-norm spikes within 200 steps, while the loss climbs, then while it falls:

        >>> from trainsignals import Kind, make_event
        >>> def spikes(policy, loss):
        ...     out = []
        ...     for step in range(300):
        ...         evs = [make_event(Kind.GRAD_EXPLOSION, "warning", step, step, "EWMAZSpike", "grad_norm",
        ...                           9.0, 6.0, "jump")] if step in (100, 150, 200) else []
        ...         out += policy.apply(evs, step, loss(step))
        ...     return [e.severity for e in out]
        >>> spikes(EventPolicy(), lambda t: 1.0 + t / 100)
        ['warning', 'warning', 'critical']
        >>> spikes(EventPolicy(), lambda t: 1.0 - t / 1000)
        ['warning', 'warning', 'warning']
    """

    def __init__(self, escalate_after: int = ESCALATE_AFTER, escalate_window: int = ESCALATE_WINDOW,
                 escalate_kinds: Sequence[str] = ("loss_spike", "grad_explosion"),
                 guard_kinds: Sequence[str] = ("grad_explosion",), merge_window: int = HOLD,
                 incident_window: int = INCIDENT_WINDOW) -> None:
        check_range("escalate_after", escalate_after, 0, None, integer=True)
        check_range("escalate_window", escalate_window, 1, None, integer=True)
        check_range("merge_window", merge_window, 0, None, integer=True)
        check_range("incident_window", incident_window, 0, None, integer=True)
        self.escalate_after = escalate_after
        self.escalate_window = escalate_window
        self.escalate_kinds = check_kinds("escalate_kinds", escalate_kinds)
        self.guard_kinds = check_kinds("guard_kinds", guard_kinds)
        self.merge_window = merge_window
        self.incident_window = incident_window
        self._spikes = frozenset(self.escalate_kinds)
        self.reset()

    @classmethod
    def for_interval(cls, every: int) -> EventPolicy:
        """The default policy for a stream logged every ``every`` steps (what ``Monitor(log_every=every)``
        uses): its windows, in steps, cover at least as many logged values as the rules they follow
        need. The merge window covers the z-rule's watch (at least ``MIN_HOLD`` values, as
        :func:`~trainsignals.detectors.interval_settings` makes it), the escalation and incident
        windows at least ``MIN_VALUES`` values: 200 steps are less than one row of a log written
        every 500, where three spikes could never fall within one window.

        >>> EventPolicy.for_interval(1).config() == EventPolicy().config()
        True
        >>> p = EventPolicy.for_interval(500)
        >>> p.merge_window, p.escalate_window, p.incident_window
        (1000, 4000, 4000)

        Raises:
            ValueError: ``every`` is not an integer >= 1.
        """
        check_range("every", every, 1, None, integer=True)
        return cls(escalate_window=max(ESCALATE_WINDOW, MIN_VALUES * every), merge_window=max(HOLD, MIN_HOLD * every),
                   incident_window=max(INCIDENT_WINDOW, MIN_VALUES * every))

    def config(self) -> dict[str, Any]:
        """The settings (a Monitor snapshot must match them to be loaded)."""
        return {"escalate_after": self.escalate_after, "escalate_window": self.escalate_window,
                "escalate_kinds": list(self.escalate_kinds), "guard_kinds": list(self.guard_kinds),
                "merge_window": self.merge_window, "incident_window": self.incident_window}

    def __repr__(self) -> str:
        return "EventPolicy(" + ", ".join(f"{k}={v!r}" for k, v in self.config().items()) + ")"

    def reset(self) -> None:
        """Forget every event and loss seen."""
        self._alarms: dict[str, list[list[Any]]] = {}  # "kind/signal" -> [[step, loss level or None], ...]
        self._kept: dict[str, list[Any]] = {}  # "kind/signal" -> [step, detector, severity rank] of the last kept event
        self._hist: deque[tuple[int, float, float]] = deque(maxlen=GUARD_MEMORY)  # (step, log loss, level after)
        self._hold: Hold = NO_HOLD  # the divergence hold (rule 4)

    @property
    def holding(self) -> bool:
        """Whether a divergence hold is open: the loss has not come back since a ``diverging`` event."""
        return self._hold[0] is not None or self._hold[1] is not None

    def state_dict(self) -> dict[str, Any]:
        """JSON-serialisable state."""
        return {"alarms": {k: [list(a) for a in v] for k, v in self._alarms.items()},
                "kept": {k: list(v) for k, v in self._kept.items()},
                "hist": [list(h) for h in self._hist], "hold": list(self._hold)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore :meth:`state_dict`'s snapshot.

        Raises:
            ValueError: the keys differ (named). A snapshot from before the divergence hold (no
                ``hold``) is taken with no hold open.
        """
        want = {"alarms", "kept", "hist", "hold"}
        if not isinstance(state, dict) or set(state) | {"hold"} != want:
            got = sorted(state) if isinstance(state, dict) else type(state).__name__
            raise ValueError(f"policy state keys differ: expected {sorted(want)}, got {got}")
        o, c, a = state.get("hold", NO_HOLD)
        hold: Hold = NO_HOLD if o is None and c is None else (
            None if o is None else float(o), None if c is None else float(c), int(a))
        alarms = {str(k): [[int(a[0]), None if a[1] is None else float(a[1])] for a in v]
                  for k, v in state["alarms"].items()}
        kept = {str(k): [int(v[0]), str(v[1]), int(v[2])] for k, v in state["kept"].items()}
        hist = deque(((int(s), float(g), float(m)) for s, g, m in state["hist"]), maxlen=GUARD_MEMORY)
        self._alarms, self._kept, self._hist, self._hold = alarms, kept, hist, hold  # all parsed: a refused one changes nothing

    # -- the streaming path: one step ------------------------------------------------------
    def apply(self, events: list[Event], step: int, loss: float = math.nan,
              log_loss: float | None = None, given: Sequence[Event] = ()) -> list[Event]:
        """Fold this step's ``loss`` in (``log_loss``: its log, when already taken), then pass this
        step's detector events through the policy. ``given`` are findings made outside the Monitor at
        this step (``Monitor.update(events=...)``): not judged, but a ``diverging`` one opens a hold too.
        """
        if loss > 0.0 and loss - loss == 0.0:
            gl = _log(loss) if log_loss is None else log_loss
            h = self._hist
            lv = ALPHA * gl + _B * h[-1][2] if h else gl
            h.append((step, gl, lv))
            if self._hold is not NO_HOLD:
                self._hold_loss(step, lv)
        if not events and not given:
            return events
        hist = np.array(self._hist, dtype=np.float64).reshape(-1, 3)
        out, marks = self._judge(events, hist) if events else (events, [])
        for t, thr in marks + self._marks(given, hist):
            self._hold = hold_sweep(self._hold, [(t, thr)], _NO_STEPS, _NO_LEVELS)[0]
        return out

    def _hold_loss(self, step: int, level: float) -> None:
        """One loss of ``step`` at ``level`` against the open hold (rule 4; :func:`hold_sweep`'s scalar twin)."""
        old, cur, at = self._hold
        if step > at and cur is not None:
            old, cur = _lowest(old, cur), None
        if old is not None and level <= old:
            old = None
        self._hold = NO_HOLD if old is None and cur is None else (old, cur, at)

    # -- the batch path --------------------------------------------------------------------
    def apply_scan(self, events: list[Event], loss_steps: np.ndarray, loss: np.ndarray,
                   given: Sequence[Event] = ()) -> list[Event]:
        """The batch twin of :meth:`apply`: events sorted by step, every loss of the scan with its step,
        and the findings ``given`` during the scan, sorted by step.
        """
        old = np.array(self._hist, dtype=np.float64).reshape(-1, 3)
        st = gl = lev = np.zeros(0)
        if len(loss):
            whole = first_unusable(loss, 0, len(loss), positive=True) == len(loss)
            with np.errstate(divide="ignore", invalid="ignore"):
                ok = (loss > 0.0) & np.isfinite(loss)
                gl = column_log(loss, 0, len(loss)) if whole else np.log(loss[ok])
            st = loss_steps[ok].astype(np.float64)
            if len(gl):
                m0 = float(old[-1, 2]) if len(old) else None
                # a whole loss column: the level is the average the detectors of the scan may have run already
                if not whole:
                    lev = loss_levels(gl, m0)
                elif m0 is not None:
                    lev = shared_ewma(loss, 0, "log", gl, ALPHA, _B, m0)
                else:  # the first loss is the level
                    lev = np.concatenate((gl[:1], shared_ewma(loss, 1, "log", gl[1:], ALPHA, _B, float(gl[0]))))
        out = events
        marks: list[tuple[int, float]] = []
        if events or given:
            new = np.column_stack((st, gl, lev))
            hist = np.concatenate((old, new)) if len(new) else old
            if events:
                out, marks = self._judge(events, hist)
            if given:
                marks = sorted(marks + self._marks(given, hist), key=lambda m: m[0])
        if marks or self._hold is not NO_HOLD:
            self._hold = hold_sweep(self._hold, marks, st.astype(np.int64), lev)[0]
        tail = slice(max(0, len(gl) - GUARD_MEMORY), len(gl))
        self._hist.extend(zip(st[tail].astype(np.int64).tolist(), gl[tail].tolist(), lev[tail].tolist()))
        return out

    # -- the rules -------------------------------------------------------------------------
    def _judge(self, events: list[Event], hist: np.ndarray) -> tuple[list[Event], list[tuple[int, float]]]:
        """``hist``: rows (step, log loss, level after), every loss up to the events' steps. Returns the
        kept events and the holds the ``diverging`` ones open: ``(step, threshold)`` (rule 4).
        """
        out = []
        for ev in events:
            got = self._one(ev, ev.kind.value, hist)
            if got is not None:
                out.append(got)
        return out, self._marks(out, hist)

    @staticmethod
    def _marks(events: Sequence[Event], hist: np.ndarray) -> list[tuple[int, float]]:
        return hold_marks(events, hist[:, 0], hist[:, 2])

    @staticmethod
    def _level_before(step: int, hist: np.ndarray, lo: int, end: int) -> float | None:
        """The loss's EWMA level before ``step`` (None: no loss before it in memory)."""
        i = lo + int(np.searchsorted(hist[lo:end, 0], step, side="left"))
        return float(hist[i - 1, 2]) if i > lo else None

    def _one(self, ev: Event, kind: str, hist: np.ndarray) -> Event | None:
        # the losses the streaming path would remember at this event: the last GUARD_MEMORY up to its step
        end = int(np.searchsorted(hist[:, 0], ev.step, side="right"))
        lo = max(0, end - GUARD_MEMORY)
        key = f"{kind}/{ev.signal}"
        guarded = kind in self.guard_kinds
        rank = _RANK.get(ev.severity, 1)  # as the rule reported it (before the guard)
        kept = self._kept.get(key)
        window = self.merge_window if kind in self._spikes else self.incident_window
        if kept is not None and kept[1] != ev.detector and ev.step - kept[0] <= window and rank <= kept[2]:
            return None  # the same incident, seen by another rule: the first report stands
        self._kept[key] = [ev.step, ev.detector, rank]
        if ev.severity == "critical":
            return self._guard_critical(ev, hist, lo, end) if guarded and ev.onset_step < ev.step else ev
        if ev.severity != "warning" or kind not in self._spikes:
            return ev
        level = self._level_before(ev.step, hist, lo, end) if guarded else None
        alarms = [a for a in self._alarms.get(key, []) if a[0] > ev.step - self.escalate_window]
        alarms.append([ev.step, level])
        self._alarms[key] = alarms
        if not self.escalate_after or len(alarms) < self.escalate_after:
            return ev
        extra = f"; {len(alarms)} such events within {self.escalate_window} steps"
        first = alarms[0][1]
        if guarded and first is not None and level is not None and level <= first:
            return dataclasses.replace(ev, message=(
                f"{ev.message}{extra}, but the loss did not rise ({math.exp(first):.4g} -> {math.exp(level):.4g})"))
        return dataclasses.replace(ev, severity="critical", message=ev.message + extra)

    def _guard_critical(self, ev: Event, hist: np.ndarray, lo: int, end: int) -> Event:
        """A critical jump that stayed, while the loss did not rise: a warning."""
        ref = self._level_before(ev.onset_step, hist, lo, end)
        tail = hist[max(lo, end - GUARD_TAIL):end, 1].tolist()
        if ref is None or not tail:
            return ev
        before, now = math.exp(ref), math.exp(statistics.median(tail))
        if now > before:
            return ev
        return dataclasses.replace(ev, severity="warning", message=(
            f"{ev.message}, while the loss did not rise ({before:.4g} -> {now:.4g}): not a divergence "
            f"(a falling loss with a jumped gradient norm points to a silent collapse)"))
