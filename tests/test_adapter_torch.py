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
    model3 = mlp()
    w3 = TorchWatcher(model3, torch.optim.SGD(model3.parameters(), lr=0.1), per_layer=None)
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


# ------------------------------------------------------------------------------------------
# Set-ups that used to pass unnoticed, wrong input
# ------------------------------------------------------------------------------------------
def test_an_optimizer_over_another_model_is_refused_and_one_over_part_of_it_warns() -> None:
    """An optimizer built before the model was rebuilt steps other tensors: the watched weights never
    change (the update ratios were exactly 0 with no event). One that leaves trainable parameters
    out names them; one over every parameter says nothing."""
    stale = torch.optim.Adam(mlp().parameters(), 1e-3)
    with pytest.raises(ValueError, match="optimizer holds none of the model's 6 parameters"):
        TorchWatcher(mlp(), stale)
    model = mlp()
    with pytest.warns(RuntimeWarning, match=r"4 of the model's 6 trainable parameters are not in the optimizer "
                                            r"\(0\.weight, 0\.bias, 2\.weight, 2\.bias\)"):
        w = TorchWatcher(model, torch.optim.Adam(model[4].parameters(), 1e-3))
    assert w.param_names == tuple(n for n, _ in model.named_parameters())   # still watched: they never learn
    w.close()
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TorchWatcher(model, torch.optim.Adam(model.parameters(), 1e-3)).close()


def test_a_per_sample_loss_or_grad_norm_is_refused_before_anything_is_consumed() -> None:
    """A tensor of several values used to be cut to its first element; it is refused (as the Monitor
    refuses an array), and the step's measurements are still there for a correct call."""
    model = mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for sync_every in (1, 4):            # refused at the call, not when the block is fed
        w = TorchWatcher(model, opt, sync_every=sync_every)
        spy = Spy(w)
        X, y = digits()
        per_sample = F.cross_entropy(model(X[:32]), y[:32], reduction="none")
        per_sample.mean().backward()
        expected = math.sqrt(sum(p.grad.norm().item() ** 2 for p in model.parameters()))
        opt.step()
        with pytest.raises(TypeError, match=r"loss must be one number, got a tensor of shape \(32,\).*loss\.mean"):
            w.update(loss=per_sample)
        with pytest.raises(TypeError, match=r"grad_norm must be one number, got a tensor of shape \(2,\)"):
            w.update(loss=per_sample.mean(), grad_norm=torch.tensor([5.0, 6.0]))
        with pytest.raises(TypeError, match="val_loss must be a real number"):
            w.update(loss=per_sample.mean(), val_loss="x")
        with pytest.raises(TypeError, match="step must be an integer, got float 10.7"):
            w.update(loss=per_sample.mean(), step=10.7)
        w.update(loss=per_sample.mean().reshape(1, 1))     # one element, any shape
        w.close()
        assert len(spy.fed) == 1 and spy.fed[0]["step"] == 0
        assert spy.fed[0]["loss"] == pytest.approx(per_sample.mean().item(), rel=1e-6)
        assert spy.fed[0]["grad_norm"] == pytest.approx(expected, rel=1e-5)
        opt.zero_grad()


def test_a_restored_monitor_continues_its_steps() -> None:
    """A watcher given a Monitor restored from a snapshot goes on at its step + 1 (it used to start
    at 0 and the Monitor refused the first update: "step must not decrease")."""
    import trainsignals as ts

    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    w = TorchWatcher(model, opt, total_steps=100)
    for s in range(50):
        one_step(model, opt, w, seed=s % 40)
    w.close()
    saved = w.monitor.state_dict()
    mon = ts.Monitor(total_steps=100)
    mon.load_state_dict(saved)
    w2 = TorchWatcher(model, opt, mon)
    assert w2.step == 50
    spy = Spy(w2)
    for s in range(5):
        one_step(model, opt, w2, seed=s)
    assert [kw["step"] for kw in spy.fed] == [50, 51, 52, 53, 54] and mon.step == 54
    with pytest.raises(ValueError, match="step must not decrease: got 3 after 54"):
        w2.update(step=3)
    w2.close()


@pytest.mark.parametrize("bug", ["no_backward", "zero_grad_before_step"])
def test_a_step_without_any_gradient_feeds_no_grad_norm(bug: str) -> None:
    """No parameter has a gradient (``backward()`` forgotten, ``zero_grad()`` before ``step()``): the
    grad norm is not measured — neither global nor per layer — instead of a measured 0."""
    model = mlp()
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    w = TorchWatcher(model, opt, update_ratio_every=1)
    spy = Spy(w)
    X, y = digits()
    for _ in range(3):
        loss = F.cross_entropy(model(X[:32]), y[:32])
        if bug == "zero_grad_before_step":
            loss.backward()
            opt.zero_grad()
        opt.step()
        w.update(loss=loss)
    fed = spy.fed[-1]
    assert "grad_norm" not in fed and "layer_grad_norms" not in fed
    assert fed["loss"] > 0 and fed["update_ratio"] == 0.0          # the weights did not move: measured 0
    assert [e for e in w.monitor.events if e.kind.value == "nonfinite"] == []
    one_step(model, opt, w)                                          # gradients again: measured again
    assert spy.fed[-1]["grad_norm"] > 0 and len(spy.fed[-1]["layer_grad_norms"]) == 6
    w.close()


def test_layers_frozen_before_the_watcher_are_reported_once_and_measured_once_unfrozen(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The usual recipe — freeze layers, build the optimizer over every parameter, unfreeze later —
    used to leave those layers unwatched for the whole run. They are reported at the first update
    (``update_ratio_low``), not measured while frozen (NaN: neither normed nor copied, and no 0 to
    drag the median layer down: the learning layers are not called "far too violent"; the global
    update ratio is that of the parameters that learn), and measured from their first gradient."""
    model = mlp()
    model[0].requires_grad_(False)
    model[2].requires_grad_(False)                        # 4 of the 6 tensors frozen
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    w = TorchWatcher(model, opt, total_steps=300, update_ratio_every=5)
    assert w.param_names == tuple(n for n, _ in model.named_parameters())
    spy = Spy(w)
    copied: list[int] = []
    real_mul = torch._foreach_mul

    def counted_mul(tensors: Any, *a: Any, **k: Any) -> Any:
        copied.append(sum(t.numel() for t in tensors))
        return real_mul(tensors, *a, **k)

    monkeypatch.setattr(torch, "_foreach_mul", counted_mul)
    X, y = digits()
    g = torch.Generator().manual_seed(0)
    events = []
    for s in range(220):
        if s == 200:
            model[2].requires_grad_(True)                 # unfrozen
        idx = torch.randint(0, len(X), (128,), generator=g)
        loss = F.cross_entropy(model(X[idx]), y[idx])
        loss.backward()
        direct = math.sqrt(sum(p.grad.norm().item() ** 2 for p in model.parameters() if p.grad is not None))
        learning = [p for p in model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in learning]
        opt.step()
        events += w.update(loss=loss)
        opt.zero_grad()
        fed = spy.fed[-1]
        assert fed["grad_norm"] == pytest.approx(direct, rel=1e-5)
        assert math.isnan(fed["layer_grad_norms"]["0.weight"])
        assert math.isnan(fed["layer_grad_norms"]["2.weight"]) == (s < 200)
        if s % 5 == 0:
            ratios = fed["layer_update_ratios"]
            assert math.isnan(ratios["0.weight"]) and math.isnan(ratios["2.weight"]) == (s < 200)
            assert ratios["4.weight"] > 0 and (s < 200 or ratios["2.weight"] > 0)
            d = math.sqrt(sum((p.detach() - b).norm().item() ** 2 for p, b in zip(learning, before)))
            assert fed["update_ratio"] == pytest.approx(d / math.sqrt(sum(b.norm().item() ** 2 for b in before)),
                                                        rel=1e-4)
    monkeypatch.undo()
    trainable = sum(p.numel() for p in model[4].parameters())
    assert copied[:40] == [trainable] * 40                 # the frozen layers were never copied
    note = events[0]
    assert (note.step, note.kind.value, note.severity, note.detector, note.layer) == \
        (0, "update_ratio_low", "warning", "TorchWatcher", "0.weight")
    assert "4 layers frozen (requires_grad off) when the watcher was built do not learn: " \
           "0.weight, 0.bias, 2.weight, 2.bias" in note.message
    assert note in w.monitor.events
    assert [str(e) for e in events if e.kind.value == "update_ratio_high"] == []
    assert [str(e) for e in events[1:] if e.step < 200 and e.severity != "info"] == []
    w.close()


def test_frozen_parameters_cost_no_host_to_device_copy_per_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Parameters without a gradient step after step (frozen, in the optimizer) reuse the device index
    built at the first step: no ``torch.tensor`` from host lists per step (on a GPU each one waits for
    the stream)."""
    model = mlp()
    model[0].requires_grad_(False)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    w = TorchWatcher(model, opt, update_ratio_every=1)
    one_step(model, opt, w)
    made: list[int] = []
    real = torch.tensor

    def counted(*a: Any, **k: Any) -> Any:
        made.append(1)
        return real(*a, **k)

    monkeypatch.setattr(torch, "tensor", counted)
    for s in range(1, 4):
        one_step(model, opt, w, seed=s)
    monkeypatch.undo()
    assert made == []
    w.close()


def test_wrong_arguments_are_refused_at_construction_naming_them() -> None:
    """A wrong ``monitor`` (a positional total_steps) used to fail at the first update with an
    AttributeError, swapped arguments with a bare AttributeError."""
    model = nn.Linear(2, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    bad: list[tuple[Any, str]] = [
        (lambda: TorchWatcher(opt, model), "model and optimizer are in the wrong order"),   # type: ignore[arg-type]
        (lambda: TorchWatcher("model", opt), "model must be a torch.nn.Module, got str"),   # type: ignore[arg-type]
        (lambda: TorchWatcher(model, None), "optimizer must be a torch.optim.Optimizer, got NoneType"),  # type: ignore[arg-type]
        (lambda: TorchWatcher(model, opt, 300),                                            # type: ignore[arg-type]
         "monitor must be a trainsignals.Monitor or None, got 300; total_steps is keyword-only"),
        (lambda: TorchWatcher(model, opt, "m"), "monitor must be a trainsignals.Monitor or None, got 'm'"),  # type: ignore[arg-type]
        (lambda: TorchWatcher(nn.ReLU(), opt), "model has no parameters"),
    ]
    for make, match in bad:
        with pytest.raises(ValueError, match=match):
            make()
    assert len(opt._optimizer_step_pre_hooks) == 0          # nothing was hooked
