"""TorchWatcher on a small CNN and a tiny transformer (CPU), with faults injected at known steps, and under
``torch.compile``.

Models:

* a CNN (two Conv2d + ReLU + MaxPool blocks, a Linear head) on scikit-learn's 8x8 digits as 1x8x8 images;
* a one-block pre-norm transformer (``nn.TransformerEncoderLayer``, d_model 32, 4 heads, GELU module,
  causal mask) trained as a character-level language model on the source of the standard library's
  ``argparse`` (ships with Python: nothing is downloaded).

Both train with the optimizers and learning rates people use (Adam/AdamW 1e-3, SGD with momentum 0.9).
Faults are injected at step ``FAULT``: the learning rate x 100, one corrupted batch, one layer's weights
x 100, the labels collapsed to the majority class. Each fault must be reported within a window after it,
by the kinds the project's failure-mode reference (``FAILURE_MODES.md``) gives for it, and nothing loud
(warning or critical) may be noticed before it; healthy runs must stay quiet over several seeds.

Both run with the default Monitor. (Over seeds 0-5, 300 steps, the healthy CNN still draws one
oscillation warning, SGD 0.05 + momentum seed 5 at step 239; the README lists it among the known misses.)
"""

from __future__ import annotations

import argparse
import inspect
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional
dynamo = pytest.importorskip("torch._dynamo")

from test_adapter_torch import Spy, digits  # noqa: E402

import trainsignals as ts  # noqa: E402
from trainsignals.adapters.torch import TorchWatcher  # noqa: E402

FAULT = 150                    # the step at which every fault is injected
FAULT_STEPS = 220              # length of a faulty run
HEALTHY_STEPS = 300            # length of a healthy run


# ---- acceptable kinds, from the failure-mode reference (FAILURE_MODES.md) -----------------------------
# lr x 100: "diverging (exploding) ... cause: learning rate far too high": divergence, grad_explosion,
# nonfinite must be among what is reported. The first reactions may also be the jump itself (loss_spike),
# the lr change (lr_anomaly), a violent update ratio (> 0.1: update_ratio_high) or, for a too-high lr,
# oscillation.
LR_REQUIRED = {"divergence", "grad_explosion", "nonfinite"}
LR_FIRST = LR_REQUIRED | {"loss_spike", "lr_anomaly", "update_ratio_high", "oscillation"}
# One corrupted batch: "loss spike (transient): sudden jump then recovery within a few steps; often a bad
# batch ... report it, don't stop", and the gradient of that batch jumps (gradient explosion).
BATCH_KINDS = {"loss_spike", "grad_explosion"}
# One layer's weights x 100: "gradient explosion: grad norm jumps orders of magnitude above its own
# recent level", with the loss jumping (loss spike) or climbing (divergence, "bad init, numerics").
SCALE_KINDS = {"grad_explosion", "loss_spike", "divergence", "nonfinite"}
# Labels collapsed to one class: the collapse is "silent collapse (decoupling): loss keeps falling ... while
# grad norm vanishes (or explodes); model collapses to one safe answer" -- the silent_collapse /
# vanishing_gradient family of GradLossDecoupling and JointCollapse; the switch itself is a sudden jump
# of the gradient (the error signal changed: gradient explosion) and, when the model gave the new class
# little probability, of the loss (loss spike). What fires in practice (measured, seeds 0-5): the jump at the switch, then
# nothing of the silent_collapse family -- the grad norm falls with the loss (the coupled case that
# GradLossDecoupling leaves alone), and its 250-step lag is longer than these runs.
COLLAPSE_KINDS = {"loss_spike", "grad_explosion", "silent_collapse", "vanishing_gradient"}


@pytest.fixture(autouse=True, scope="module")
def one_thread() -> Iterator[None]:
    """Tiny models run fastest on one thread; two threads on a shared 2-core machine can be 10x slower."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ------------------------------------------------------------------------------------------
# Models and data
# ------------------------------------------------------------------------------------------
def cnn(seed: int) -> Any:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(8, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64, 10),
    )


TEXT = inspect.getsource(argparse)
VOCAB = sorted(set(TEXT))
CTX = 32


class TinyLM(nn.Module):
    """Token + learned position embeddings, pre-norm transformer blocks with a causal mask, a linear head."""

    def __init__(self, vocab: int, d_model: int = 32, layers: int = 1) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, d_model)
        self.pos = nn.Parameter(torch.zeros(CTX, d_model))
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(d_model, 4, 2 * d_model, dropout=0.0, activation=nn.GELU(),
                                       batch_first=True, norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab)
        self.register_buffer("mask", nn.Transformer.generate_square_subsequent_mask(CTX), persistent=False)

    def forward(self, idx: Any) -> Any:
        n = idx.shape[1]
        x = self.emb(idx) + self.pos[:n]
        for block in self.blocks:
            x = block(x, src_mask=self.mask[:n, :n], is_causal=True)
        return self.head(self.norm(x))


def lm(seed: int) -> Any:
    torch.manual_seed(seed)
    return TinyLM(len(VOCAB))


_IDS: list[Any] = []


def text_ids() -> Any:
    if not _IDS:
        index = {c: i for i, c in enumerate(VOCAB)}
        _IDS.append(torch.tensor([index[c] for c in TEXT]))
    return _IDS[0]


def images() -> tuple[Any, Any]:
    X, y = digits()
    return X.reshape(-1, 1, 8, 8), y


def make_batches(model_kind: str, seed: int) -> Callable[[], tuple[Any, Any]]:
    """Random minibatches: 64 digits, or 32 windows of 32 characters (targets: the next character)."""
    g = torch.Generator().manual_seed(seed)
    if model_kind == "cnn":
        X, y = images()

        def digit_batch() -> tuple[Any, Any]:
            idx = torch.randint(0, len(X), (64,), generator=g)
            return X[idx], y[idx]

        return digit_batch
    ids = text_ids()
    offsets = torch.arange(CTX + 1)

    def text_batch() -> tuple[Any, Any]:
        start = torch.randint(0, len(ids) - CTX - 1, (32, 1), generator=g)
        seq = ids[start + offsets]
        return seq[:, :-1], seq[:, 1:]

    return text_batch


def chance_loss(model_kind: str) -> float:
    return math.log(10 if model_kind == "cnn" else len(VOCAB))


def make_optimizer(name: str, model: Any) -> Any:
    if name == "adam":
        return torch.optim.Adam(model.parameters(), 1e-3)
    if name == "adamw":
        return torch.optim.AdamW(model.parameters(), 1e-3, weight_decay=0.01)
    if name == "sgd":   # SGD with momentum; the transformer takes a larger step than the CNN
        lr = 0.05 if isinstance(model, nn.Sequential) else 0.1
        return torch.optim.SGD(model.parameters(), lr, momentum=0.9)
    raise AssertionError(name)


def loss_of(out: Any, target: Any) -> Any:
    return F.cross_entropy(out.reshape(-1, out.shape[-1]), target.reshape(-1))


# ------------------------------------------------------------------------------------------
# A training run with one fault
# ------------------------------------------------------------------------------------------
@dataclass
class Run:
    events: list[Any] = field(default_factory=list)
    losses: list[float] = field(default_factory=list)
    watcher: Any = None

    def loud(self) -> list[Any]:
        return [e for e in self.events if e.severity in ("warning", "critical")]


def train(model_kind: str, optimizer: str, seed: int, steps: int, fault: str | None = None) -> Run:
    """Train through a TorchWatcher; inject ``fault`` at step ``FAULT``.

    Faults: ``"lr"`` every group's learning rate x 100 from then on; ``"batch"`` one corrupted batch (the
    digits' pixels x 1e3; for the language model, a batch of uniformly random characters, since its
    inputs are token ids); ``"scale"`` one layer's weights x 100 (the CNN's first convolution, the
    transformer's output head); ``"collapse"`` every label replaced by the majority class from then on
    (the digit class most frequent in the data, the space character); ``"freeze"`` one layer stops
    learning from then on (``requires_grad`` off: the CNN's first convolution, the transformer's
    token embedding).
    """
    model = cnn(seed) if model_kind == "cnn" else lm(seed)
    opt = make_optimizer(optimizer, model)
    monitor = ts.Monitor(total_steps=steps)
    w = TorchWatcher(model, opt, monitor, activations_every=10)
    batch = make_batches(model_kind, seed)
    majority = int(torch.bincount(images()[1]).argmax()) if model_kind == "cnn" else VOCAB.index(" ")
    g = torch.Generator().manual_seed(10_000 + seed)
    run = Run(watcher=w)
    for s in range(steps):
        x, y = batch()
        if s == FAULT and fault == "lr":
            for group in opt.param_groups:
                group["lr"] *= 100.0
        if s == FAULT and fault == "batch":
            if model_kind == "cnn":
                x = x * 1e3
            else:
                seq = torch.randint(0, len(VOCAB), (x.shape[0], CTX + 1), generator=g)
                x, y = seq[:, :-1], seq[:, 1:]
        if s == FAULT and fault == "scale":
            with torch.no_grad():
                (model[0] if model_kind == "cnn" else model.head).weight.mul_(100.0)
        if s >= FAULT and fault == "collapse":
            y = torch.full_like(y, majority)
        if s == FAULT and fault == "freeze":
            for p in (model[0] if model_kind == "cnn" else model.emb).parameters():
                p.requires_grad_(False)
                p.grad = None
        loss = loss_of(model(x), y)
        loss.backward()
        opt.step()
        run.events += w.update(loss=loss)
        opt.zero_grad()
        run.losses.append(float(loss.detach()))
    w.close()
    return run


def assert_caught(run: Run, *, first_kinds: set[str], first_within: int, required: set[str],
                  within: int) -> None:
    """Nothing loud before ``FAULT``; the first loud step comes within ``first_within`` steps of it and its
    kinds are all in ``first_kinds``; a loud event of a ``required`` kind within ``within`` steps."""
    loud = run.loud()
    assert [str(e) for e in loud if e.step < FAULT] == []
    assert loud, "the fault went unnoticed"
    first = min(e.step for e in loud)
    assert first <= FAULT + first_within, [str(e) for e in loud]
    assert {e.kind.value for e in loud if e.step == first} <= first_kinds, [str(e) for e in loud]
    assert [e for e in loud if e.kind.value in required and e.step <= FAULT + within], [str(e) for e in loud]


# ------------------------------------------------------------------------------------------
# Healthy runs stay quiet
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("model_kind", "optimizer", "seed"), [
    ("cnn", "adam", 0), ("cnn", "adam", 1), ("cnn", "sgd", 0), ("cnn", "sgd", 1),
    ("lm", "adamw", 0), ("lm", "adamw", 1), ("lm", "sgd", 0), ("lm", "sgd", 1),
])
def test_healthy_run_is_quiet(model_kind: str, optimizer: str, seed: int) -> None:
    run = train(model_kind, optimizer, seed, HEALTHY_STEPS)
    assert [str(e) for e in run.loud()] == []
    assert sum(run.losses[-20:]) / 20 < 0.6 * chance_loss(model_kind)   # it learned
    assert run.watcher.monitor.status == "healthy" and not run.watcher.should_stop


# ------------------------------------------------------------------------------------------
# Faults at a known step
# ------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("model_kind", "optimizer", "seed"), [("cnn", "adam", 0), ("lm", "adamw", 1)])
def test_lr_x100_is_a_divergence_or_an_explosion(model_kind: str, optimizer: str, seed: int) -> None:
    run = train(model_kind, optimizer, seed, FAULT_STEPS, fault="lr")
    assert_caught(run, first_kinds=LR_FIRST, first_within=3, required=LR_REQUIRED, within=15)


@pytest.mark.parametrize(("model_kind", "optimizer", "seed"), [("cnn", "adam", 2), ("lm", "adamw", 3)])
def test_corrupted_batch_is_a_transient_spike_at_its_step(model_kind: str, optimizer: str, seed: int) -> None:
    run = train(model_kind, optimizer, seed, FAULT_STEPS, fault="batch")
    assert run.losses[FAULT] > 2 * run.losses[FAULT - 1] > max(run.losses[FAULT + 5:FAULT + 20])  # transient
    assert_caught(run, first_kinds=BATCH_KINDS, first_within=0, required=BATCH_KINDS, within=0)
    after = [e for e in run.loud() if e.step <= FAULT + 20]
    assert {e.kind.value for e in after} <= BATCH_KINDS and all(e.severity == "warning" for e in after)
    assert not run.watcher.should_stop                      # "report it, don't stop"


def test_corrupted_batch_under_sgd_kills_the_relus() -> None:
    """With SGD + momentum the bad batch's gradient (x 1e3) is applied as it is: the CNN's ReLUs die."""
    run = train("cnn", "sgd", 0, FAULT_STEPS, fault="batch")
    dead_for_a_while = run.losses[FAULT + 10:FAULT + 30]
    assert sum(dead_for_a_while) / 20 > 0.9 * chance_loss("cnn")          # not transient: the CNN died
    # the update ratio is sampled every 10 steps and the bad batch's step is one of them: its update is
    # "too violent" (update ratio > 0.1 in the reference)
    assert_caught(run, first_kinds=BATCH_KINDS | {"update_ratio_high"}, first_within=0, required=BATCH_KINDS,
                  within=0)
    dead = [e for e in run.loud() if e.kind.value == "dead_units"]
    # activations are sampled every 10 steps; a layer must be >= 90 % dead in 3 samples in a row
    assert dead and all(FAULT <= e.onset_step and e.step <= FAULT + 40 for e in dead), [str(e) for e in dead]


@pytest.mark.parametrize(("model_kind", "optimizer", "seed"), [("cnn", "adam", 4), ("lm", "adamw", 5)])
def test_a_layer_scaled_x100_is_an_explosion_at_its_step(model_kind: str, optimizer: str, seed: int) -> None:
    run = train(model_kind, optimizer, seed, FAULT_STEPS, fault="scale")
    assert_caught(run, first_kinds=SCALE_KINDS, first_within=0, required={"grad_explosion"}, within=0)


@pytest.mark.parametrize(("model_kind", "optimizer", "seed"), [("cnn", "adam", 6), ("lm", "adamw", 7)])
def test_labels_collapsed_to_one_class_are_noticed_at_the_switch(model_kind: str, optimizer: str,
                                                                 seed: int) -> None:
    run = train(model_kind, optimizer, seed, FAULT_STEPS, fault="collapse")
    assert_caught(run, first_kinds=COLLAPSE_KINDS, first_within=2, required=COLLAPSE_KINDS, within=2)
    # the model did collapse onto the one class: the loss falls far below anything the real task reaches
    # (for the language model without any jump: the space was already its likeliest answer)
    assert run.losses[-1] < 0.05 * run.losses[FAULT - 1]


@pytest.mark.parametrize(("model_kind", "optimizer", "seed"), [("cnn", "adam", 8), ("cnn", "sgd", 9),
                                                                ("lm", "adamw", 10)])
def test_a_frozen_layer_is_named_by_its_update_ratio(model_kind: str, optimizer: str, seed: int) -> None:
    # "update ratio out of band ... per layer shows which layers learn": the frozen layer's updates stop
    # (ratio 0) while the others go on; the update ratio is measured every 10 steps by default
    run = train(model_kind, optimizer, seed, FAULT_STEPS, fault="freeze")
    frozen = "0." if model_kind == "cnn" else "emb."
    loud = run.loud()
    assert [str(e) for e in loud if e.step < FAULT] == []
    low = [e for e in loud if e.kind.value == "update_ratio_low"]
    assert low and FAULT <= low[0].step <= FAULT + run.watcher.update_ratio_every, [str(e) for e in loud]
    assert low[0].layer.startswith(frozen) and low[0].onset_step < low[0].step
    assert run.watcher.last_layer_update_ratios[low[0].layer] == 0.0
    # a frozen layer is one report (until it learns again), not one per window
    assert len([e for e in low if e.layer == low[0].layer]) == 1


# ------------------------------------------------------------------------------------------
# torch.compile
# ------------------------------------------------------------------------------------------
# What torch 2.13's dynamo does with the watcher (measured here):
# * the optimizer hooks run outside the compiled forward: grad norms, per-layer norms, update ratios and
#   the loss are those of the uncompiled model (bit for bit with the "eager" and "aot_eager" backends,
#   within float rounding with inductor);
# * forward hooks present at the first compiled call are traced into the graph, without a graph break
#   (fullgraph=True compiles): the activation statistics are measured, equal to eager;
# * dynamo does not guard on hooks (torch._dynamo.config.skip_nnmodule_hook_guards): hooks registered
#   after the first compiled call never run, so the statistics are absent (NaN, "not measured");
#   removing them (close()) is seen, since their own guards fail and the forward recompiles;
# * the activation hook reads one bool of the watcher (measure this step or not), which dynamo guards
#   on: two graphs in all, one that measures and one that does not (a hook reading the step counter
#   would recompile at every step until torch._dynamo.config.recompile_limit, then run uncompiled).
@pytest.fixture
def fresh_dynamo() -> Iterator[None]:
    dynamo.reset()      # compiled code is cached per code object (nn.Sequential.forward is shared)
    yield
    dynamo.reset()


def measure(model_kind: str, steps: int, compile_kw: dict[str, Any] | None, *, watch_compiled: bool = False,
            watch_from: int = 0, **watcher_kw: Any) -> tuple[list[dict[str, Any]], Any]:
    """Train seed 0 with SGD for ``steps`` steps, compiled when ``compile_kw`` is given; returns what the
    Monitor was fed and the watcher.

    The watcher is made at step ``watch_from`` (0: before the first forward), on the compiled module
    when ``watch_compiled``, else on the original one.
    """
    model = cnn(0) if model_kind == "cnn" else lm(0)
    opt = make_optimizer("sgd", model)
    runner = torch.compile(model, **compile_kw) if compile_kw is not None else model
    batch = make_batches(model_kind, 0)
    w = spy = None
    for s in range(steps):
        if s == watch_from:
            w = TorchWatcher(runner if watch_compiled else model, opt, **watcher_kw)
            spy = Spy(w)
        x, y = batch()
        loss = loss_of(runner(x), y)
        loss.backward()
        opt.step()
        if w is not None:
            w.update(loss=loss)
        opt.zero_grad()
    assert spy is not None
    return spy.fed, w


def same_measurements(got: list[dict[str, Any]], ref: list[dict[str, Any]], rel: float) -> None:
    """Every signal fed at every step equal to the reference within ``rel`` (NaN where it is NaN)."""
    assert len(got) == len(ref)
    for g, r in zip(got, ref):
        assert sorted(g) == sorted(r)
        for key in ("loss", "grad_norm", "update_ratio"):
            if key in r:
                assert g[key] == pytest.approx(r[key], rel=rel), key
        layers, ref_layers = list(g["layer_grad_norms"].values()), list(r["layer_grad_norms"].values())
        assert layers == pytest.approx(ref_layers, rel=rel)
        if "activations" in r:
            assert list(g["activations"]) == list(r["activations"])
            for layer, stats in r["activations"].items():
                for k, v in stats.items():
                    assert g["activations"][layer][k] == pytest.approx(v, rel=rel, abs=1e-9, nan_ok=True)


@pytest.mark.usefixtures("fresh_dynamo")
@pytest.mark.parametrize(("model_kind", "backend"), [("cnn", "eager"), ("cnn", "aot_eager"), ("lm", "eager")])
def test_compiled_model_gives_the_eager_measurements_activations_included(model_kind: str,
                                                                          backend: str) -> None:
    kw: dict[str, Any] = {"activations_every": 2, "update_ratio_every": 1}
    ref, _ = measure(model_kind, 4, None, **kw)
    got, w = measure(model_kind, 4, {"backend": backend, "fullgraph": True}, **kw)   # no graph break
    same_measurements(got, ref, rel=1e-6)
    assert sum("activations" in f for f in got) == 2
    acts = [f["activations"] for f in got if "activations" in f]
    assert all(math.isfinite(s["dead_frac"]) for a in acts for s in a.values())        # measured, not absent
    assert w.layer_names == tuple(n for n, _ in (cnn(0) if model_kind == "cnn" else lm(0)).named_parameters())


@pytest.mark.usefixtures("fresh_dynamo")
# inductor imports torch.utils.mkldnn, which uses the deprecated torch.jit.script_method
@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_with_inductor_gives_the_eager_grad_norms() -> None:
    ref, _ = measure("cnn", 4, None, update_ratio_every=1)
    got, _ = measure("cnn", 4, {}, update_ratio_every=1)                              # the default backend
    same_measurements(got, ref, rel=1e-5)


@pytest.mark.usefixtures("fresh_dynamo")
def test_a_watcher_on_the_compiled_module_measures_the_same() -> None:
    kw: dict[str, Any] = {"activations_every": 2, "update_ratio_every": 1, "per_layer": "module"}
    ref, w_ref = measure("cnn", 4, None, **kw)
    got, w = measure("cnn", 4, {"backend": "eager"}, watch_compiled=True, **kw)
    # the watcher names the layers after the original module, without the "_orig_mod." prefix
    assert w.layer_names == w_ref.layer_names
    for g, r in zip(got, ref):
        layers, ref_layers = list(g["layer_grad_norms"].values()), list(r["layer_grad_norms"].values())
        assert layers == pytest.approx(ref_layers, rel=1e-6)
        assert g["grad_norm"] == pytest.approx(r["grad_norm"], rel=1e-6)
        if "activations" in r:
            assert [s["dead_frac"] for s in g["activations"].values()] == \
                pytest.approx([s["dead_frac"] for s in r["activations"].values()], rel=1e-6)


@pytest.mark.usefixtures("fresh_dynamo")
def test_hooks_registered_after_the_first_compiled_call_do_not_run() -> None:
    fed, _ = measure("cnn", 4, {"backend": "eager"}, watch_from=2, activations_every=1)
    assert len(fed) == 2
    for f in fed:
        assert math.isfinite(f["grad_norm"]) and len(f["layer_grad_norms"]) == 6   # optimizer hooks: fine
        assert f["activations"] and all(math.isnan(s["dead_frac"]) for s in f["activations"].values())
    ref, _ = measure("cnn", 4, None, watch_from=2, activations_every=1)             # uncompiled: measured
    assert all(math.isfinite(s["dead_frac"]) for f in ref for s in f["activations"].values())


@pytest.mark.usefixtures("fresh_dynamo")
def test_close_removes_the_activation_hooks_of_a_compiled_model() -> None:
    model = cnn(0)
    opt = make_optimizer("sgd", model)
    w = TorchWatcher(model, opt, activations_every=1)
    spy = Spy(w)
    runner = torch.compile(model, backend="eager")
    batch = make_batches("cnn", 0)
    for s in range(4):
        if s == 2:
            w.close()
        x, y = batch()
        loss_of(runner(x), y).backward()
        opt.step()
        w.update()
        opt.zero_grad()
    dead = [[s["dead_frac"] for s in f["activations"].values()] for f in spy.fed]
    assert all(math.isfinite(v) for v in dead[0] + dead[1])
    assert all(math.isnan(v) for v in dead[2] + dead[3])
    assert all("grad_norm" not in f for f in spy.fed[2:])


@pytest.mark.usefixtures("fresh_dynamo")
def test_activation_hooks_do_not_recompile_every_step() -> None:
    graphs: list[int] = []

    def counting_backend(gm: Any, example_inputs: Any) -> Any:
        graphs.append(1)
        return gm.forward

    measure("cnn", 5, {"backend": counting_backend, "fullgraph": True}, activations_every=2)
    assert len(graphs) <= 2        # one graph that measures, one that does not
