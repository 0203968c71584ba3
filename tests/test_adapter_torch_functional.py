"""TorchWatcher's ``functional_activations``: activation *functions* called in a forward, measured.

Data: scikit-learn's bundled 8x8 digits; models: small MLPs whose hidden layers apply their
activation as a function (``F.relu``, ``torch.relu``, ``x.relu()``, ``torch.tanh``...) instead
of an ``nn.ReLU`` module. The statistics must equal the module version's, nothing may be counted
twice, a dead layer must be named, and the mode must never stay entered.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_adapter_torch import Spy, digits  # noqa: E402

from trainsignals.adapters import torch as adapter  # noqa: E402
from trainsignals.adapters.torch import TorchWatcher  # noqa: E402

FORMS: dict[str, Callable[[Any], Any]] = {
    "F.relu": F.relu,
    "torch.relu": torch.relu,
    "method": lambda z: z.relu(),
    "F.relu inplace": lambda z: F.relu(z, inplace=True),
    "torch.relu_": torch.relu_,
    "method_": lambda z: z.relu_(),
    "F.gelu": F.gelu,
    "torch.tanh": torch.tanh,
    "F.tanh": F.tanh,
    "torch.sigmoid": torch.sigmoid,
    "method sigmoid": lambda z: z.sigmoid(),
}
KIND = {"F.gelu": "gelu", "torch.tanh": "tanh", "F.tanh": "tanh", "torch.sigmoid": "sigmoid",
        "method sigmoid": "sigmoid"}


class Hidden(nn.Module):
    """A linear layer followed by an activation applied as a function."""

    def __init__(self, n_in: int, n_out: int, form: str) -> None:
        super().__init__()
        self.fc = nn.Linear(n_in, n_out)
        self.act = FORMS[form]

    def forward(self, x: Any) -> Any:
        return self.act(self.fc(x))


class Net(nn.Module):
    """64 -> 64 -> 64 -> 10, the hidden activations applied as functions in ``h1`` and ``h2``."""

    def __init__(self, seed: int = 0, form: str = "F.relu") -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.h1 = Hidden(64, 64, form)
        self.h2 = Hidden(64, 64, form)
        self.out = nn.Linear(64, 10)

    def forward(self, x: Any) -> Any:
        return self.out(self.h2(self.h1(x)))


class Flat(nn.Module):
    """Both activations in the model's own forward: layers ``Flat:relu`` and ``Flat:relu#1``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.fc1, self.fc2, self.out = nn.Linear(64, 64), nn.Linear(64, 64), nn.Linear(64, 10)
        self.fail = False

    def forward(self, x: Any) -> Any:
        h = F.relu(self.fc2(F.relu(self.fc1(x))))
        if self.fail:
            raise RuntimeError("the forward failed")
        return self.out(h)


def step(model: Any, opt: Any, w: TorchWatcher, s: int, n: int = 128, scale: float = 1.0) -> list[Any]:
    X, y = digits()
    idx = torch.randint(0, len(X), (n,), generator=torch.Generator().manual_seed(s))
    loss = F.cross_entropy(model(X[idx] * scale), y[idx])
    loss.backward()
    opt.step()
    events = w.update(loss=loss)
    opt.zero_grad()
    return events


def train(model: Any, steps: int, *, fault: int | None = None, **kw: Any) -> tuple[list[Any], TorchWatcher]:
    opt = torch.optim.Adam(model.parameters(), 3e-4)
    w = TorchWatcher(model, opt, total_steps=steps, activations_every=1, functional_activations=True, **kw)
    events = []
    for s in range(steps):
        if s == fault:
            with torch.no_grad():
                model.h2.fc.bias -= 100.0          # every unit of h2 now outputs 0: dead
        events += step(model, opt, w, s)
    w.close()
    return events, w


# ------------------------------------------------------------------------------------------
# Detection
# ------------------------------------------------------------------------------------------
FAULT = 30


def test_functional_relu_layers_are_measured_and_a_dead_one_is_named() -> None:
    events, w = train(Net(0), 60)
    acts = w.last_signals["activations"]
    assert list(acts) == ["h1:relu", "h2:relu"]
    assert all(0.0 <= a["dead_frac"] <= 1.0 and math.isnan(a["saturation"]) for a in acts.values())
    assert [e for e in events if e.kind.value == "dead_units"] == []            # healthy: quiet

    events, w = train(Net(0), 60, fault=FAULT)
    dead = [e for e in events if e.kind.value == "dead_units"]
    assert dead and all(e.layer == "h2:relu" for e in dead), [str(e) for e in dead]
    assert FAULT <= dead[0].step <= FAULT + 2
    assert w.last_signals["activations"]["h2:relu"]["dead_frac"] == 1.0


def test_calls_in_the_models_own_forward_are_indexed_in_call_order() -> None:
    model = Flat()
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = TorchWatcher(model, opt, activations_every=1, functional_activations=True)
    X, _ = digits()
    idx = torch.randint(0, len(X), (128,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model.fc2.bias -= 100.0                  # the second call's outputs: all 0
        h1 = F.relu(model.fc1(X[idx]))
    step(model, opt, w, 0)
    acts = w.last_signals["activations"]
    assert list(acts) == ["Flat:relu", "Flat:relu#1"]
    assert acts["Flat:relu"]["dead_frac"] == pytest.approx((h1 == 0).all(0).float().mean().item())
    assert acts["Flat:relu#1"]["dead_frac"] == 1.0


# ------------------------------------------------------------------------------------------
# Measurements
# ------------------------------------------------------------------------------------------
def module_twin(net: Net) -> Any:
    """The same network with ``nn.ReLU`` modules, the same weights."""
    seq = nn.Sequential(nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    for dst, src in ((seq[0], net.h1.fc), (seq[2], net.h2.fc), (seq[4], net.out)):
        dst.load_state_dict(src.state_dict())
    return seq


def test_functional_relu_equals_the_module_version() -> None:
    net = Net(1)
    with torch.no_grad():
        net.h1.fc.bias -= 0.3                # part of the units dead: a value that can differ
        net.h2.fc.bias -= 0.2
    twin = module_twin(net)
    got = {}
    for name, model, functional in (("functional", net, True), ("module", twin, False)):
        opt = torch.optim.Adam(model.parameters(), 3e-4)
        w = TorchWatcher(model, opt, activations_every=2, functional_activations=functional)
        spy = Spy(w)
        for s in range(5):
            step(model, opt, w, s)
        got[name] = [f["activations"] for f in spy.fed if "activations" in f]
    assert len(got["functional"]) == 3
    for fn, mod in zip(got["functional"], got["module"]):
        assert 0.0 < fn["h1:relu"]["dead_frac"] < 1.0
        assert (fn["h1:relu"]["dead_frac"], fn["h2:relu"]["dead_frac"]) == (mod["1"]["dead_frac"],
                                                                          mod["3"]["dead_frac"])


@pytest.mark.parametrize("act", [nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid])
def test_activation_modules_are_not_counted_twice(act: type) -> None:
    fed = []
    for functional in (False, True):
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(64, 64), act(), nn.Linear(64, 64), act(), nn.Linear(64, 10))
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        w = TorchWatcher(model, opt, activations_every=1, functional_activations=functional)
        spy = Spy(w)
        for s in range(3):
            step(model, opt, w, s, scale=5.0)
        fed.append([f["activations"] for f in spy.fed])
    assert list(fed[1][0]) == ["1", "3"]
    assert repr(fed[0]) == repr(fed[1])          # the same values (NaN included)


def test_a_module_outside_activation_types_is_measured_as_its_function() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), nn.GELU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = TorchWatcher(model, opt, activations_every=1, activation_types=(nn.ReLU,), functional_activations=True)
    step(model, opt, w, 0)
    assert list(w.last_signals["activations"]) == ["3", "1:gelu"]


class Inner(nn.Module):
    def forward(self, x: Any) -> Any:
        return F.relu(x)


class CustomAct(nn.Module):
    """An activation module whose function is called by a submodule of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Inner()

    def forward(self, x: Any) -> Any:
        return self.inner(x)


def test_calls_anywhere_inside_a_hooked_activation_module_are_its_own() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), CustomAct(), nn.Linear(64, 10))
    opt = torch.optim.SGD(model.parameters(), lr=0.0)
    w = TorchWatcher(model, opt, activations_every=1, activation_types=(CustomAct,), functional_activations=True)
    step(model, opt, w, 0)
    assert list(w.last_signals["activations"]) == ["1"]
    w.close()
    w2 = TorchWatcher(model, opt, activations_every=1, activation_types=(nn.ReLU,), functional_activations=True)
    step(model, opt, w2, 0)
    assert list(w2.last_signals["activations"]) == ["1.inner:relu"]


@pytest.mark.parametrize("form", list(FORMS))
def test_every_form_is_captured_and_equals_a_direct_computation(form: str) -> None:
    net = Net(2, form)
    with torch.no_grad():
        net.h1.fc.bias -= 0.3
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    w = TorchWatcher(net, opt, activations_every=1, functional_activations=True)
    X, _ = digits()
    idx = torch.randint(0, len(X), (128,), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        z = net.h1.fc(X[idx])
        h = FORMS[form](z)
    step(net, opt, w, 0)
    kind = KIND.get(form, "relu")
    acts = w.last_signals["activations"]
    assert list(acts) == [f"h1:{kind}", f"h2:{kind}"]
    got = acts[f"h1:{kind}"]
    assert got["dead_frac"] == pytest.approx((h == 0).all(0).float().mean().item())
    band = {"tanh": (-0.99, 0.99), "sigmoid": (0.01, 0.99)}.get(kind)
    if band is None:
        assert math.isnan(got["saturation"])
    else:
        assert got["saturation"] == pytest.approx(((h < band[0]) | (h > band[1])).float().mean().item())


@pytest.mark.parametrize("form", ["torch.tanh", "F.tanh", "torch.sigmoid", "method sigmoid"])
def test_scaled_up_inputs_saturate_tanh_and_sigmoid(form: str) -> None:
    net = Net(3, form)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    w = TorchWatcher(net, opt, activations_every=1, functional_activations=True)
    kind = KIND[form]
    step(net, opt, w, 0)
    assert w.last_signals["activations"][f"h1:{kind}"]["saturation"] < 0.2
    events = step(net, opt, w, 1, scale=1e3)
    assert w.last_signals["activations"][f"h1:{kind}"]["saturation"] > 0.95
    for s in range(2, 4):                                  # the detector's patience: 3 samples
        events += step(net, opt, w, s, scale=1e3)
    assert any(e.kind.value == "saturation" and e.layer == f"h1:{kind}" for e in events)


def test_gradient_accumulation_averages_the_passes() -> None:
    net = Net(4)
    opt = torch.optim.SGD(net.parameters(), lr=0.0)
    w = TorchWatcher(net, opt, activations_every=1, functional_activations=True)
    X, y = digits()
    dead = []
    for i in range(2):
        xb = X[64 * i:64 * (i + 1)]
        with torch.no_grad():
            dead.append((net.h1(xb) == 0).all(0).float().mean().item())
        F.cross_entropy(net(xb), y[64 * i:64 * (i + 1)]).backward()
    opt.step()
    w.update()
    assert w.last_signals["activations"]["h1:relu"]["dead_frac"] == pytest.approx(sum(dead) / 2)


# ------------------------------------------------------------------------------------------
# The set of layers
# ------------------------------------------------------------------------------------------
class Branchy(Net):
    """Calls one more activation function once ``late`` is set."""

    late = False

    def forward(self, x: Any) -> Any:
        h = self.h2(self.h1(x))
        return self.out(torch.sigmoid(h) if self.late else h)


def test_a_call_site_found_after_the_first_measurement_warns_once_and_is_ignored() -> None:
    model = Branchy()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = TorchWatcher(model, opt, activations_every=1, functional_activations=True)
    step(model, opt, w, 0)
    names = list(w.last_signals["activations"])
    model.late = True
    with pytest.warns(RuntimeWarning, match="Branchy:sigmoid"):
        step(model, opt, w, 1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        step(model, opt, w, 2)                            # warned once
    assert list(w.last_signals["activations"]) == names == ["h1:relu", "h2:relu"]


def test_a_call_site_not_called_on_a_measuring_step_reads_nan() -> None:
    model = Branchy()
    model.late = True
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = TorchWatcher(model, opt, activations_every=1, functional_activations=True)
    step(model, opt, w, 0)
    model.late = False
    step(model, opt, w, 1)
    acts = w.last_signals["activations"]
    assert list(acts) == ["h1:relu", "h2:relu", "Branchy:sigmoid"]
    assert math.isnan(acts["Branchy:sigmoid"]["saturation"]) and math.isfinite(acts["h2:relu"]["dead_frac"])


# ------------------------------------------------------------------------------------------
# Costs, hooks and the mode stack
# ------------------------------------------------------------------------------------------
def test_no_mode_on_steps_without_activation_measurement(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[int] = []
    orig = adapter._FunctionalActs.__torch_function__

    def counted(self: Any, *a: Any, **k: Any) -> Any:
        calls.append(1)
        return orig(self, *a, **k)

    monkeypatch.setattr(adapter._FunctionalActs, "__torch_function__", counted)
    net = Net(5)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    w = TorchWatcher(net, opt, activations_every=3, functional_activations=True)
    per_step = []
    for s in range(4):
        del calls[:]
        step(net, opt, w, s)
        per_step.append(len(calls))
    assert per_step[0] > 0 and per_step[3] > 0           # the measuring steps 0 and 3
    assert per_step[1] == per_step[2] == 0                # the others: not entered at all
    del calls[:]
    net.eval()
    with torch.no_grad():
        net(digits()[0][:32])                              # an eval pass on a measuring step
    assert calls == []


def all_hooks(model: Any) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) for m in model.modules())


def test_close_removes_every_hook() -> None:
    net = Net(6)
    opt = torch.optim.SGD(net.parameters(), lr=0.01)
    before = all_hooks(net)
    w = TorchWatcher(net, opt, activations_every=1, functional_activations=True)
    assert all_hooks(net) > before
    step(net, opt, w, 0)
    w.close()
    assert all_hooks(net) == before == 0
    assert len(opt._optimizer_step_pre_hooks) == 0 and len(opt._optimizer_step_post_hooks) == 0


def test_a_forward_that_raises_does_not_leave_the_mode_entered() -> None:
    model = Flat()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = TorchWatcher(model, opt, activations_every=1, functional_activations=True)
    X, _ = digits()
    model.fail = True
    with pytest.raises(RuntimeError, match="the forward failed"):
        model(X[:32])
    assert torch._C._len_torch_function_stack() == 0
    model.fail = False
    step(model, opt, w, 0)                                # measures normally afterwards
    assert torch._C._len_torch_function_stack() == 0
    assert list(w.last_signals["activations"]) == ["Flat:relu", "Flat:relu#1"]
    w.close()


class Other(torch.overrides.TorchFunctionMode):
    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        return func(*args, **(kwargs or {}))


class LeavesAModeOn(Net):
    """Enters a mode of its own in the forward and does not leave it."""

    def forward(self, x: Any) -> Any:
        self.other = Other()
        self.other.__enter__()
        return super().forward(x)


def test_only_the_watchers_mode_is_taken_off_the_stack() -> None:
    model = LeavesAModeOn(7)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    w = TorchWatcher(model, opt, activations_every=1, functional_activations=True)
    try:
        step(model, opt, w, 0)
        assert torch._C._len_torch_function_stack() == 1
        assert torch.overrides._get_current_function_mode() is model.other
    finally:
        while torch._C._len_torch_function_stack():
            torch._C._pop_torch_function_stack()
    w.close()


# ------------------------------------------------------------------------------------------
# Configuration
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", ["yes", 1, None])
def test_functional_activations_must_be_a_bool(bad: Any) -> None:
    net = Net()
    with pytest.raises(ValueError, match="^functional_activations must be a bool"):
        TorchWatcher(net, torch.optim.SGD(net.parameters(), 0.1), activations_every=1, functional_activations=bad)


def test_ignored_without_activation_measurement() -> None:
    net = Net()
    w = TorchWatcher(net, torch.optim.SGD(net.parameters(), 0.1), functional_activations=True)
    assert not w.functional_activations and all_hooks(net) == 0


def test_distributed_watcher_refuses_it() -> None:
    dist = pytest.importorskip("torch.distributed")
    from trainsignals.adapters.distributed import DistributedWatcher

    assert not dist.is_initialized()
    net = Net()
    with pytest.raises(ValueError, match="^functional_activations is not supported by DistributedWatcher"):
        DistributedWatcher(net, torch.optim.SGD(net.parameters(), 0.1), activations_every=1,
                           functional_activations=True)
