"""``TorchWatcher(sync_every=k)``: measurements held on the device and brought to the host once
every ``k`` steps; the Monitor sees exactly what it sees with ``sync_every=1``, later."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from trainsignals import TrainingFailure  # noqa: E402
from trainsignals.adapters.torch import TorchWatcher  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from test_adapter_torch import count_host_calls, digits, mlp  # noqa: E402


def run(sync_every: int, steps: int = 240, *, lr_bump: int | None = None, nan_at: int | None = None,
        close: bool = True, keep: list[Any] | None = None, **kw: Any
        ) -> tuple[TorchWatcher, list[tuple[int, list[Any]]]]:
    """Train the digits MLP; returns the watcher and (step, events returned) per update (the
    watcher is also appended to ``keep`` as soon as it exists)."""
    X, y = digits()
    g = torch.Generator().manual_seed(3)
    model = mlp(3)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    w = TorchWatcher(model, opt, total_steps=steps, update_ratio_every=3, activations_every=5,
                     sync_every=sync_every, **kw)
    if keep is not None:
        keep.append(w)
    returned: list[tuple[int, list[Any]]] = []
    for s in range(steps):
        idx = torch.randint(0, len(X), (64,), generator=g)
        if lr_bump is not None and s == lr_bump:
            opt.param_groups[0]["lr"] *= 100.0
        loss = F.cross_entropy(model(X[idx]), y[idx])
        loss.backward()
        if nan_at is not None and s == nan_at:
            next(model.parameters()).grad[0, 0] = float("nan")
        opt.step()
        val = float(F.cross_entropy(model(X[:200]), y[:200]).detach()) if s % 40 == 39 else None
        returned.append((s, w.update(loss=loss, val_loss=val)))
        opt.zero_grad()
        if w.should_stop:
            break
    if close:
        w.close()
    return w, returned


def as_dicts(events: list[Any]) -> list[dict[str, Any]]:
    return [e.to_dict() for e in events]


@pytest.mark.parametrize("k", [4, 7])
def test_the_monitor_sees_the_same_run(k: int) -> None:
    one, _ = run(1)
    held, returned = run(k)
    assert held.monitor.step == one.monitor.step == 239
    assert as_dicts(held.monitor.events) == as_dicts(one.monitor.events)
    assert as_dicts(held.events) == as_dicts(one.events)
    assert held.monitor.state_dict() == one.monitor.state_dict()
    assert held.last_signals.keys() == one.last_signals.keys()
    # updates return nothing on held steps; the flushing update returns the block's events
    for s, evs in returned:
        if (s + 1) % k:
            assert evs == []
        assert all(s - k < e.step <= s for e in evs)


def test_one_transfer_per_block(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = count_host_calls(monkeypatch)
    X, y = digits()
    model = mlp(0)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    w = TorchWatcher(model, opt, update_ratio_every=1, activations_every=1, sync_every=8)
    del calls[:]
    for s in range(16):
        loss = F.cross_entropy(model(X[:64]), y[:64])
        loss.backward()
        opt.step()               # the hooks transfer nothing (test_adapter_torch checks the whole loop)
        before = len(calls)
        w.update(loss=loss)
        opt.zero_grad()
        assert calls[before:] == ([] if s not in (7, 15) else ["cpu", "numpy"])
    monkeypatch.undo()
    assert w.monitor.step == 15


def test_a_fault_stops_the_run_within_one_block() -> None:
    w, returned = run(8, lr_bump=120)
    crit = [e for e in w.events if e.severity == "critical"]
    assert crit and crit[0].step >= 120
    stopped_at = returned[-1][0]
    assert w.should_stop and crit[0].step <= stopped_at < crit[0].step + 8
    assert w.monitor.step == stopped_at        # every held step was fed


def test_close_feeds_the_steps_still_held() -> None:
    w, _ = run(8, steps=61, close=False)
    assert w.monitor.step == 55                # 7 blocks of 8 fed, 5 steps held
    w.close()
    assert w.monitor.step == 60
    assert w.flush() == []


def test_raise_comes_after_every_held_step_is_fed() -> None:
    keep: list[Any] = []
    with pytest.raises(TrainingFailure) as info:
        run(8, lr_bump=120, on_critical="raise", close=False, keep=keep)
    w = keep[0]
    step = info.value.events[0].step
    flushed = w.step - 1                       # the update that raised: the end of a block
    assert flushed % 8 == 7 and step <= flushed < step + 8 and step >= 120
    assert w.monitor.step == flushed           # its whole block was fed before the raise
    assert w.failure_events == info.value.events


def test_skipped_steps_match_the_unheld_run() -> None:
    one, _ = run(1, steps=80, nan_at=50, skip_nonfinite_steps=True)
    held, _ = run(5, steps=80, nan_at=50, skip_nonfinite_steps=True)
    assert any(e.step == 50 and e.severity == "info" for e in held.events)
    assert as_dicts(held.monitor.events) == as_dicts(one.monitor.events)


@pytest.mark.parametrize("bad", [0, -1, True, 2.0, "4"])
def test_bad_sync_every_names_it(bad: Any) -> None:
    model = mlp(0)
    with pytest.raises(ValueError, match="sync_every"):
        TorchWatcher(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=bad)


def test_rollback_needs_every_step() -> None:
    model = mlp(0)
    with pytest.raises(ValueError, match="sync_every"):
        TorchWatcher(model, torch.optim.SGD(model.parameters(), lr=0.1), sync_every=4, rollback=True)
