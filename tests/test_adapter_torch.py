"""The PyTorch adapter (:class:`trainsignals.adapters.torch.TorchWatcher`) on CPU.

Data: scikit-learn's bundled 8x8 digits; model: a ReLU MLP trained with Adam (lr 3e-4, batch
128), which stays quiet for 300 steps on every seed tried. Failures are injected at known
steps and must be reported within a window after them, and nothing before.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from trainsignals.adapters.torch import TorchWatcher  # noqa: E402
from trainsignals.detectors import LevelShift  # noqa: E402

_DATA: dict[str, Any] = {}


def digits() -> tuple[Any, Any]:
    if not _DATA:
        sklearn_datasets = pytest.importorskip("sklearn.datasets")
        X, y = sklearn_datasets.load_digits(return_X_y=True)
        _DATA["X"] = torch.tensor(X / 16.0, dtype=torch.float32)
        _DATA["y"] = torch.tensor(y)
    return _DATA["X"], _DATA["y"]


def mlp(seed: int = 0, act: type = nn.ReLU) -> Any:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 64), act(), nn.Linear(64, 64), act(), nn.Linear(64, 10))


def train(seed: int = 0, steps: int = 300, *, lr_bump: tuple[int, float] | None = None, corrupt: int | None = None,
          collapse: int | None = None, **watcher_kw: Any) -> tuple[list[Any], list[float], TorchWatcher]:
    X, y = digits()
    g = torch.Generator().manual_seed(seed)
    model = mlp(seed)
    opt = torch.optim.Adam(model.parameters(), 3e-4)
    w = TorchWatcher(model, opt, total_steps=steps, **watcher_kw)
    events, losses = [], []
    for s in range(steps):
        idx = torch.randint(0, len(X), (128,), generator=g)
        xb, yb = X[idx], y[idx]
        if corrupt is not None and s == corrupt:
            xb = xb * 1e3
        if collapse is not None and s >= collapse:
            yb = torch.zeros_like(yb)
        if lr_bump is not None and s == lr_bump[0]:
            opt.param_groups[0]["lr"] *= lr_bump[1]
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        opt.step()
        events += w.update(loss=loss)
        opt.zero_grad()
        losses.append(float(loss.detach()))
    w.close()
    return events, losses, w


def loud(events: list[Any]) -> list[Any]:
    return [e for e in events if e.severity in ("warning", "critical")]


# ------------------------------------------------------------------------------------------
# Detection on a real run
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("seed", [0, 1])
def test_healthy_run_is_quiet(seed: int) -> None:
    events, losses, w = train(seed, activations_every=10)
    assert loud(events) == []
    assert sum(losses[-20:]) / 20 < 0.4 * sum(losses[:20]) / 20     # it did learn
    assert w.monitor.step == 299
    assert w.monitor.status == "healthy"


def test_lr_bump_diverges_after_and_not_before() -> None:
    events, _, _ = train(0, lr_bump=(150, 1000.0))
    assert all(e.step >= 150 for e in loud(events))
    # flagged at once (a warning on the jump), and critical once the jump has not come back:
    # the spike detector's verdict takes one or two watches of ``hold`` values after the jump
    assert 150 <= loud(events)[0].step <= 152
    crit = [e for e in events if e.severity == "critical" and e.kind.value in ("divergence", "nonfinite")]
    assert crit and 150 <= crit[0].step <= 151 + 2 * LevelShift().hold
    assert any(e.kind.value == "lr_anomaly" and e.step == 150 for e in events)


def test_lr_bump_x100_is_flagged() -> None:
    events, _, _ = train(1, lr_bump=(150, 100.0))
    assert all(e.step >= 150 for e in loud(events))
    assert {"loss_spike", "grad_explosion"} & {e.kind.value for e in events if e.step <= 155}


def test_corrupted_batch_is_a_spike_at_its_step() -> None:
    events, _, _ = train(2, corrupt=150)
    assert all(e.step >= 150 for e in loud(events))
    assert {"loss_spike", "grad_explosion"} & {e.kind.value for e in events if 150 <= e.step <= 152}


def test_labels_collapsed_to_one_class_are_noticed() -> None:
    events, _, _ = train(3, collapse=150)
    assert all(e.step >= 150 for e in loud(events))
    assert [e for e in loud(events) if 150 <= e.step <= 155]


# ------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------
def one_step(model: Any, opt: Any, w: TorchWatcher, seed: int = 0, n: int = 32) -> tuple[Any, list[Any]]:
    X, y = digits()
    loss = F.cross_entropy(model(X[seed * n:(seed + 1) * n]), y[seed * n:(seed + 1) * n])
    loss.backward()
    opt.step()
    ev = w.update(loss=loss)
    opt.zero_grad()
    return loss, ev


class Spy:
    """Feeds the Monitor through ``update`` and keeps what was fed."""

    def __init__(self, w: TorchWatcher) -> None:
        self.fed: list[dict[str, Any]] = []
        inner = w.monitor.update

        def update(**kw: Any) -> Any:
            self.fed.append(kw)
            return inner(**kw)

        w.monitor.update = update  # type: ignore[method-assign]


def test_layer_names_and_grad_norms_match_named_parameters() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = TorchWatcher(model, opt)
    spy = Spy(w)
    X, y = digits()
    F.cross_entropy(model(X[:32]), y[:32]).backward()
    expected = {n: p.grad.norm().item() for n, p in model.named_parameters()}
    opt.step()
    w.update()
    fed = spy.fed[0]
    assert list(fed["layer_grad_norms"]) == [n for n, _ in model.named_parameters()]
    for n, v in fed["layer_grad_norms"].items():
        assert v == pytest.approx(expected[n], rel=1e-5)
    assert fed["grad_norm"] == pytest.approx(math.sqrt(sum(v * v for v in expected.values())), rel=1e-5)
    assert fed["lr"] == 0.0

    model2 = mlp()
    opt2 = torch.optim.SGD(model2.parameters(), lr=0.1)
    w2 = TorchWatcher(model2, opt2, per_layer="module")
    spy2 = Spy(w2)
    one_step(model2, opt2, w2)
    assert list(spy2.fed[0]["layer_grad_norms"]) == ["0", "2", "4"]
    w3 = TorchWatcher(mlp(), torch.optim.SGD(mlp().parameters(), lr=0.1), per_layer=None)
    assert w3.layer_names
    with pytest.raises(ValueError, match="per_layer"):
        TorchWatcher(model, opt, per_layer="layer")  # type: ignore[arg-type]


def count_host_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Patch every Tensor method that brings values to the host; the list they append their names to."""
    calls: list[str] = []
    for meth in ("item", "tolist", "cpu", "numpy", "__float__", "__bool__", "__int__", "__index__"):
        orig = getattr(torch.Tensor, meth)

        def counted(self: Any, *a: Any, _orig: Any = orig, _name: str = meth, **k: Any) -> Any:
            calls.append(_name)
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, meth, counted)
    return calls


def test_one_host_transfer_per_update(monkeypatch: pytest.MonkeyPatch) -> None:
    """Count every host transfer of the loop with and without the watcher: the watcher adds one."""
    calls = count_host_calls(monkeypatch)
    X, y = digits()

    def loop(watch: bool) -> list[str]:
        model = mlp(act=nn.Tanh)
        opt = torch.optim.Adam(model.parameters(), 1e-3)
        w = TorchWatcher(model, opt, update_ratio_every=1, activations_every=1) if watch else None
        del calls[:]
        for _ in range(3):
            loss = F.cross_entropy(model(X[:64]), y[:64])
            loss.backward()
            opt.step()
            if w is not None:
                w.update(loss=loss)
            opt.zero_grad()
        return sorted(calls)

    bare, watched = loop(False), loop(True)
    monkeypatch.undo()
    # per step one .cpu() (the transfer; on a GPU the one synchronisation) and .numpy() (a view
    # of that host copy, no transfer)
    assert sorted(bare + ["cpu", "numpy"] * 3) == watched


def test_close_removes_every_hook() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = TorchWatcher(model, opt, activations_every=1)
    acts = [m for m in model.modules() if isinstance(m, nn.ReLU)]
    assert len(opt._optimizer_step_pre_hooks) == 1 and len(opt._optimizer_step_post_hooks) == 1
    assert all(len(m._forward_hooks) == 1 for m in acts)
    w.close()
    assert len(opt._optimizer_step_pre_hooks) == 0 and len(opt._optimizer_step_post_hooks) == 0
    assert all(len(m._forward_hooks) == 0 for m in acts)
    spy = Spy(w)
    one_step(model, opt, w)
    assert "grad_norm" not in spy.fed[0] and "loss" in spy.fed[0]


def test_gradient_accumulation_is_measured_once_per_optimizer_step() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    w = TorchWatcher(model, opt, update_ratio_every=1)
    spy = Spy(w)
    pre = []
    opt.register_step_pre_hook(lambda *a: pre.append(1))
    X, y = digits()
    for step in range(3):
        total = 0.0
        for micro in range(4):
            sl = slice((step * 4 + micro) * 16, (step * 4 + micro + 1) * 16)
            loss = F.cross_entropy(model(X[sl]), y[sl]) / 4
            loss.backward()
            total += loss.detach()
        expected = math.sqrt(sum(p.grad.norm().item() ** 2 for p in model.parameters()))
        opt.step()
        w.update(loss=total)
        opt.zero_grad()
        assert spy.fed[-1]["grad_norm"] == pytest.approx(expected, rel=1e-5)
    assert len(spy.fed) == 3 and len(pre) == 3
    assert [kw["step"] for kw in spy.fed] == [0, 1, 2]


@pytest.mark.parametrize(("make_opt", "every"), [
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 3),        # lr * ||momentum buffer||, no copy
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), 1),
    (lambda ps: torch.optim.SGD([{"params": ps[:2], "lr": 0.3}, {"params": ps[2:]}], lr=0.05, momentum=0.8,
                                dampening=0.3, weight_decay=1e-2), 2),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True), 3),   # a copy per measuring step
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9, nesterov=True), 1),   # one kept buffer
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3), 1),
    (lambda ps: torch.optim.AdamW(ps, lr=1e-3), 2),
    (lambda ps: torch.optim.SGD(ps, lr=0.1), 3),                      # plain SGD: lr * ||g||, no copy
    (lambda ps: torch.optim.SGD([{"params": ps[:2], "lr": 0.3}, {"params": ps[2:]}], lr=0.05), 1),
])
def test_update_ratio_matches_a_direct_computation(make_opt: Any, every: int) -> None:
    model = mlp()
    opt = make_opt(list(model.parameters()))
    w = TorchWatcher(model, opt, update_ratio_every=every)
    spy = Spy(w)
    for step in range(7):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        one_step(model, opt, w, seed=step)
        after = dict(model.named_parameters())
        fed = spy.fed[-1]
        if step % every:
            assert "update_ratio" not in fed
            continue
        d = {n: (after[n].detach() - before[n]).norm().item() for n in before}
        ww = {n: before[n].norm().item() for n in before}
        glob = math.sqrt(sum(v * v for v in d.values())) / math.sqrt(sum(v * v for v in ww.values()))
        assert fed["update_ratio"] == pytest.approx(glob, rel=1e-4)
        assert w.last_layer_update_ratios is not None
        for n in d:
            assert w.last_layer_update_ratios[n] == pytest.approx(d[n] / ww[n], rel=1e-4)


def test_activation_statistics_match_a_direct_computation() -> None:
    model = mlp(act=nn.Tanh)
    model[3] = nn.ReLU()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = TorchWatcher(model, opt, activations_every=2)
    spy = Spy(w)
    X, y = digits()
    with torch.no_grad():
        h1 = model[1](model[0](X[:32]))
        h2 = model[3](model[2](h1))
    one_step(model, opt, w)
    acts = spy.fed[0]["activations"]
    assert list(acts) == ["1", "3"]
    assert acts["1"]["saturation"] == pytest.approx((h1.abs() > 0.99).float().mean().item())
    assert acts["3"]["dead_frac"] == pytest.approx((h2 == 0).all(0).float().mean().item())
    assert math.isnan(acts["3"]["saturation"])
    model.eval()
    with torch.no_grad():
        model(X)                                      # eval passes do not count
    model.train()
    one_step(model, opt, w, seed=1)
    assert "activations" not in spy.fed[1]            # not a measuring step


def test_capture_grads_sees_the_norm_before_clipping() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = TorchWatcher(model, opt)
    spy = Spy(w)
    X, y = digits()
    F.cross_entropy(model(X[:32]), y[:32]).backward()
    w.capture_grads()
    total = nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    opt.step()
    w.update()
    assert spy.fed[0]["grad_norm"] == pytest.approx(total.item(), rel=1e-5)
    # the norm the step applied, after clipping, is recorded too
    assert total.item() > 1e-2 and w.last_applied_grad_norm == pytest.approx(1e-3, rel=1e-3)
    F.cross_entropy(model(X[:32]), y[:32]).backward()
    total = nn.utils.clip_grad_norm_(model.parameters(), 1e-3)
    opt.step()
    w.update(grad_norm=total)
    assert spy.fed[1]["grad_norm"] == pytest.approx(total.item(), rel=1e-5)
    assert w.last_applied_grad_norm is None     # without capture_grads the hook measured after clipping
    assert math.sqrt(sum(v * v for v in spy.fed[1]["layer_grad_norms"].values())) == pytest.approx(1e-3, rel=1e-3)


def test_grad_scaler_skips_are_info_and_a_long_run_is_critical() -> None:
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    w = TorchWatcher(model, opt, scaler=scaler)
    spy = Spy(w)
    X, y = digits()

    def step(poison: bool, capture: bool = False) -> list[Any]:
        loss = F.cross_entropy(model(X[:32]), y[:32])
        scaler.scale(loss * (math.nan if poison else 1.0)).backward()
        if capture:
            w.capture_grads()
        scaler.step(opt)
        scaler.update()
        ev = w.update(loss=loss)
        opt.zero_grad()
        return ev

    loss = F.cross_entropy(model(X[:32]), y[:32])
    loss.backward()
    expected = math.sqrt(sum(p.grad.norm().item() ** 2 for p in model.parameters()))
    opt.zero_grad()
    assert step(False) == [] and spy.fed[0]["grad_norm"] == pytest.approx(expected, rel=1e-4)
    assert step(False, capture=True) == []
    assert spy.fed[1]["grad_norm"] == pytest.approx(spy.fed[0]["grad_norm"], rel=1e-2)
    ev = step(True)
    assert [(e.kind.value, e.severity) for e in ev] == [("nonfinite", "info")]
    assert "GradScaler skipped the step" in ev[0].message
    assert "grad_norm" not in spy.fed[2] and not w.should_stop and w.monitor.status != "diverging"
    assert step(False) == []                              # recovered: the run restarts
    evs = [e for _ in range(10) for e in step(True)]
    assert [(e.kind.value, e.severity) for e in evs] == [("nonfinite", "info"), ("nonfinite", "critical")]
    assert w.should_stop and w.monitor.should_stop         # the adapter's events reach the Monitor
    assert [e.detector for e in w.monitor.events] == ["GradScaler"] * 3
    assert w.monitor.status == "diverging"                 # the critical one; the info ones never



def test_a_layer_left_out_of_the_graph_is_not_measured_and_a_zero_gradient_is_zero() -> None:
    """A layer none of whose parameters got a gradient this step (an unused branch: ``.grad`` is
    None) is fed as ``nan``, not measured; a layer whose gradient was computed as exactly 0 is fed
    as 0 (what ``ZeroRunGradCliff`` reads as vanishing)."""
    torch.manual_seed(0)
    model = nn.ModuleDict({"used": nn.Linear(4, 2), "branch": nn.Linear(4, 2), "dead": nn.Linear(4, 4)})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    w = TorchWatcher(model, opt, per_layer="module")
    spy = Spy(w)
    x = torch.randn(8, 4)
    with torch.no_grad():
        model["dead"].bias.fill_(-100.0)   # every unit's ReLU output 0: no gradient flows through it
    out = model["used"](torch.relu(model["dead"](x)) + x)
    out.square().mean().backward()
    opt.step()
    w.update()
    fed = spy.fed[0]["layer_grad_norms"]
    assert math.isnan(fed["branch"]) and fed["dead"] == 0.0 and fed["used"] > 0.0
    assert spy.fed[0]["grad_norm"] == pytest.approx(fed["used"], rel=1e-6)
