"""The one table of failure kinds (``trainsignals.kinds.KINDS``) and the code that reads it."""

from __future__ import annotations

import pytest

from trainsignals import DISTRIBUTED_KINDS, Kind, make_event
from trainsignals.curves import KINDS as GENERATED_KINDS
from trainsignals.curves import generate
from trainsignals.curves.labels import _CHECKS
from trainsignals.curves.training import FAULT_KINDS
from trainsignals.kinds import KINDS, default_window
from trainsignals.status import RANK, STATE_OF, STATUSES


def test_every_kind_has_its_facts_once():
    assert list(KINDS) == list(Kind)
    for info in KINDS.values():
        assert info.cause and info.fix and info.cause != info.fix
        assert info.status is None or info.status in STATUSES and info.status in RANK
        floor, share = info.window
        assert floor >= 50 and 0 < share <= 0.25


def test_events_status_and_windows_are_the_tables():
    for kind, info in KINDS.items():
        ev = make_event(kind, "critical", 10, 5, "demo", "loss", 1.0, 0.5, "x")
        assert (ev.cause, ev.fix) == (info.cause, info.fix)
        assert STATE_OF.get(kind) == info.status
        floor, share = info.window
        assert default_window(kind.value, 10_000) == max(floor, int(share * 10_000))
        assert default_window(kind.value, 10) == floor
    assert default_window("healthy", 2000) == 200


def test_the_edges_cover_exactly_the_kinds_the_table_names():
    # the real-run builders inject and check these kinds, and only these
    assert set(_CHECKS) == set(FAULT_KINDS) == {k.value for k, i in KINDS.items() if i.labelled}
    # the synthetic generator makes these kinds, and refuses the others
    assert set(GENERATED_KINDS) == {k.value for k, i in KINDS.items() if i.injected}
    for kind in Kind:
        if KINDS[kind].injected:
            assert generate(kind.value, 0, "easy").kind == kind.value
        else:
            assert kind in DISTRIBUTED_KINDS
            with pytest.raises(ValueError, match="kind"):
                generate(kind.value, 0)
