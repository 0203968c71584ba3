"""TorchWatcher's guards: ``on_critical``, ``skip_nonfinite_steps`` and ``rollback``, on a real digits MLP.

Faults are injected at known steps (NaN gradients, learning rate x 100); the guards must do what
the adapter documents: skip exactly the bad step's update, stop / raise / warn, or restore the
saved state bit for bit and lower the learning rate.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from test_adapter_torch import digits, mlp  # noqa: E402

from trainsignals import TrainingFailure  # noqa: E402
from trainsignals.adapters.torch import TorchWatcher  # noqa: E402


def params_of(model: Any) -> list[Any]:
    return [p.detach().clone() for p in model.parameters()]


def same(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def run(model: Any, opt: Any, w: TorchWatcher, steps: int, *, poison: set[int] = frozenset(),  # type: ignore[assignment]
        lr_bump: tuple[int, float] | None = None, seed: int = 0, on_step: Any = None) -> list[Any]:
    """Train ``steps`` steps on digits batches; NaN gradients at the ``poison`` steps."""
    X, y = digits()
    g = torch.Generator().manual_seed(seed)
    events: list[Any] = []
    for s in range(steps):
        idx = torch.randint(0, len(X), (64,), generator=g)
        if lr_bump is not None and s == lr_bump[0]:
            for group in opt.param_groups:
                group["lr"] *= lr_bump[1]
        loss = F.cross_entropy(model(X[idx]), y[idx])
        (loss * (math.nan if s in poison else 1.0)).backward()
        before = params_of(model)
        opt.step()
        events += w.update(loss=loss)
        opt.zero_grad()
        if on_step is not None:
            on_step(s, before)
        if w.should_stop:
            break
    return events


def loud(events: list[Any]) -> list[Any]:
    return [e for e in events if e.severity != "info"]


# ------------------------------------------------------------------------------------------
# skip_nonfinite_steps
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("fused", [False, True])
def test_skip_nonfinite_steps_leaves_the_weights_of_a_bad_step_untouched(fused: bool) -> None:
    model = mlp()
    opt = (torch.optim.AdamW(model.parameters(), 1e-3, fused=True) if fused
           else torch.optim.SGD(model.parameters(), 0.05, momentum=0.9))
    w = TorchWatcher(model, opt, skip_nonfinite_steps=True)
    seen: dict[int, bool] = {}

    def check(s: int, before: list[Any]) -> None:
        seen[s] = same(before, params_of(model))

    events = run(model, opt, w, 60, poison={30}, on_step=check)
    assert seen[30] is True                                   # the bad step changed nothing
    assert not any(seen[s] for s in range(60) if s != 30)     # every other step did move the weights
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert [(e.kind.value, e.severity, e.step) for e in events] == [("nonfinite", "info", 30)]
    assert not w.should_stop and w.monitor.status == "healthy"
    if fused:   # the fused optimizer skipped the step itself: its step count did not advance
        assert all(int(st["step"]) == 59 for st in opt.state.values())


def test_skip_nonfinite_steps_gives_up_after_max_skipped_in_a_row() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05)
    w = TorchWatcher(model, opt, skip_nonfinite_steps=True, max_skipped=5)
    events = run(model, opt, w, 40, poison=set(range(10, 40)))
    assert [(e.severity, e.step) for e in events] == [("info", 10), ("critical", 14)]
    assert events[-1].onset_step == 10
    assert w.should_stop and w.monitor.step == 14


def test_without_skip_a_nonfinite_step_is_critical_and_stops() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05)
    w = TorchWatcher(model, opt)
    events = run(model, opt, w, 40, poison={20})
    assert w.should_stop and w.monitor.step == 20
    assert ("nonfinite", "critical") in [(e.kind.value, e.severity) for e in events]
    assert w.failure_events and all(e.severity == "critical" for e in w.failure_events)


# ------------------------------------------------------------------------------------------
# on_critical
# ------------------------------------------------------------------------------------------
def test_on_critical_raise_carries_the_events() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05)
    w = TorchWatcher(model, opt, on_critical="raise")
    with pytest.raises(TrainingFailure) as info:
        run(model, opt, w, 40, poison={25})
    assert info.value.events and info.value.events[0].kind.value == "nonfinite"
    assert info.value.events[0].step == 25 and w.monitor.step == 25


def test_on_critical_warn_trains_on() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05)
    w = TorchWatcher(model, opt, on_critical="warn", skip_nonfinite_steps=True, max_skipped=2)
    with pytest.warns(RuntimeWarning, match="nonfinite"):
        run(model, opt, w, 40, poison={10, 11})
    assert not w.should_stop and w.monitor.step == 39        # it did not stop
    assert w.failure_events and w.failure_events[0].step == 11


# ------------------------------------------------------------------------------------------
# rollback
# ------------------------------------------------------------------------------------------
def test_rollback_restores_the_saved_weights_exactly_and_lowers_the_lr() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9)
    w = TorchWatcher(model, opt, rollback=True, rollback_every=50, rollback_lr_factor=0.5, total_steps=500)
    saved: dict[int, tuple[list[Any], Any]] = {}
    restored: list[tuple[int, bool]] = []

    def check(s: int, before: list[Any]) -> None:
        if s % 50 == 0:
            saved[s] = (params_of(model), {k: v["momentum_buffer"].clone() for k, v in opt.state.items()})
        if any(e.detector == "rollback" and e.step == s for e in w.events):
            good = int(w.events[-1].message.split("step ")[1].split(" ")[0])
            weights, momenta = saved[good]
            restored.append((good, same(weights, params_of(model)) and all(
                torch.equal(momenta[k], v["momentum_buffer"]) for k, v in opt.state.items())))

    events = run(model, opt, w, 500, lr_bump=(250, 100.0), on_step=check)
    backs = [e for e in events if e.detector == "rollback"]
    assert len(backs) == w.n_rollbacks >= 1
    first = backs[0]
    assert 250 <= first.step <= 290 and first.kind.value in ("divergence", "grad_explosion", "nonfinite")
    assert restored and all(ok for _, ok in restored)             # bit-for-bit the saved state
    assert restored[0][0] < 250                                    # a snapshot from before the fault
    # the optimizer's state_dict brought back the lr of the snapshot (0.05), then x 0.5 per rollback
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.5 ** w.n_rollbacks)
    assert not w.should_stop and w.monitor.step == 499             # it trained on to the end
    assert w.monitor.status == "healthy"
    assert all(math.isfinite(p.sum().item()) for p in model.parameters())
    late = [e for e in loud(events) if e.step > backs[-1].step + 20 and e.kind.value != "oscillation"]
    assert late == []


def test_rollback_to_the_users_checkpoint() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05, momentum=0.9)
    ckpt: dict[str, Any] = {}
    calls: list[Any] = []

    def restore(event: Any) -> str:
        calls.append(event)
        model.load_state_dict(ckpt["model"])
        opt.load_state_dict(ckpt["opt"])
        return "ckpt-200.pt"

    def save(s: int, before: list[Any]) -> None:
        if s == 200:
            ckpt["model"] = {k: v.clone() for k, v in model.state_dict().items()}
            ckpt["opt"] = opt.state_dict()

    w = TorchWatcher(model, opt, rollback=restore, rollback_lr_factor=0.1, total_steps=400)
    events = run(model, opt, w, 400, lr_bump=(250, 100.0), on_step=save)
    assert calls and calls[0].severity == "critical" and calls[0].step >= 250
    back = next(e for e in events if e.detector == "rollback")
    assert "ckpt-200.pt" in back.message and back.step == calls[0].step
    assert opt.param_groups[0]["lr"] == pytest.approx(0.05 * 0.1 ** len(calls))
    assert not w.should_stop


def test_rollback_gives_up_after_max_rollbacks() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05)
    w = TorchWatcher(model, opt, rollback=True, rollback_every=10, max_rollbacks=1, skip_nonfinite_steps=False)
    events = run(model, opt, w, 200, poison={100, 150})
    assert [e.step for e in events if e.detector == "rollback"] == [100]
    assert w.n_rollbacks == 1 and w.should_stop and w.monitor.step == 150


def test_rollback_without_a_snapshot_stops() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), 0.05)
    w = TorchWatcher(model, opt, rollback=True, rollback_every=100)
    run(model, opt, w, 50, poison={0})        # fails before the first snapshot (taken at quiet step 0)
    assert w.n_rollbacks == 0 and w.should_stop and w.monitor.step == 0


@pytest.mark.parametrize(("kw", "name"), [
    ({"on_critical": "halt"}, "on_critical"),
    ({"rollback_every": 0}, "rollback_every"),
    ({"rollback_lr_factor": 0.0}, "rollback_lr_factor"),
    ({"rollback_lr_factor": 2.0}, "rollback_lr_factor"),
    ({"rollback": "yes"}, "rollback"),
    ({"max_rollbacks": -1}, "max_rollbacks"),
    ({"rollback_on": ("explode",)}, "rollback_on"),
    ({"skip_nonfinite_steps": 1}, "skip_nonfinite_steps"),
])
def test_bad_guard_settings_name_the_parameter(kw: dict[str, Any], name: str) -> None:
    model = mlp()
    with pytest.raises(ValueError, match=name):
        TorchWatcher(model, torch.optim.SGD(model.parameters(), 0.1), **kw)


def test_a_frozen_optimizer_is_named_a_stall_once_and_a_stepping_rhythm_is_not() -> None:
    torch.manual_seed(0)
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = TorchWatcher(model, opt)
    X, y = digits()
    events: list[Any] = []
    for s in range(120):
        loss = F.cross_entropy(model(X[:64]), y[:64])
        loss.backward()
        if s < 40 or s >= 100:              # frozen from step 40 to 99: gradients, no step
            opt.step()
        opt.zero_grad()
        events += w.update(loss=loss)
    stalls = [e for e in events if e.kind.value == "stall" and e.detector == "TorchWatcher"]
    assert [(e.step, e.onset_step) for e in stalls] == [(59, 40)]
    assert stalls[0].severity == "warning" and stalls[0] in w.monitor.events

    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = TorchWatcher(model, opt)
    rhythm: list[Any] = []
    for s in range(300):                  # a step every 8 updates (updates called per micro-batch)
        loss = F.cross_entropy(model(X[:64]), y[:64])
        loss.backward()
        if s % 8 == 7:
            opt.step()
            opt.zero_grad()
        rhythm += w.update(loss=loss)
    assert not [e for e in rhythm if e.detector == "TorchWatcher"]
