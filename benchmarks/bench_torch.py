"""Per-step cost of :class:`trainsignals.adapters.torch.TorchWatcher` against the usual recipes.

For a 100-layer MLP (width 256), a small CNN and a GPT-2-small-like transformer, times one
training step (forward, backward, ``optimizer.step()``, ``zero_grad()``) bare and with each way
of measuring per-parameter grad norms every step:

* ``watcher``: ``watcher.update(loss=loss)`` (fused ``torch._foreach_norm`` in the optimizer
  pre-hook, one host transfer, plus ``Monitor.update`` with every per-parameter norm), update
  ratio off; ``watcher+ratio``: the same with the update ratio every 10 steps (the default);
  ``watcher+ratio1``: the update ratio every step; ``watcher/sync10``: ``sync_every=10`` (the
  measurements held on the device, one transfer and ten ``Monitor.update`` calls every 10 steps;
  the steps still held at the end are flushed inside the timing);
The recipes (a) to (c) run where users measure, and where the watcher's optimizer pre-hook
does: after ``backward()``, before ``optimizer.step()`` (and any clipping). On a CPU the first
code that reads the fresh gradients pays to bring them into its core's cache (on the small CNN
2-4 times what its norms cost once they are there: ``probe_cold_start.py``); measured after the
step, a recipe would find them already warmed by the optimizer.

* (a) ``recipe``: ``{n: p.grad.norm().item() for n, p in model.named_parameters()}`` plus
  ``loss.item()`` (one host sync per parameter);
* (b) ``lightning``: Lightning's ``grad_norm(model, 2)`` utility, each value turned into a
  float as ``log_dict`` does;
* (c) ``foreach``: a bare ``torch._foreach_norm`` over the same grads, ``torch.stack`` with the
  loss and one ``.tolist()`` (the practical floor for the measurement, no Monitor);
* (d) the memory-bandwidth floor: the gradients' bytes divided by the read bandwidth measured
  in the same run (``sum`` of a 256 MB buffer).

Prints, per variant (medians over interleaved repeats): the step time, its difference from the
bare step (noisy on a shared CPU: it carries the step's own jitter), and the *own time* — the
wall time spent in the measuring code itself, timed around it (for the watcher: its hooks and
``update``) — in ms and as % of the bare step; then the watcher's own time as a ratio to (a),
(b), (c) and (d), and the watcher's ``Monitor.update`` time inside the loop against the same
inputs replayed alone outside it. On a GPU, where the kernels run asynchronously, judge by the step difference:
own time counts only what the host waits for.

Run: ``python benchmarks/bench_torch.py [--steps 30] [--repeats 3] [--device cpu] [--models mlp,cnn,gpt2] [--optimizer sgdm|adamw]``.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

import trainsignals as ts
from trainsignals.adapters.torch import TorchWatcher


def deep_mlp(depth: int = 100, width: int = 256) -> nn.Module:
    layers: list[nn.Module] = [nn.Linear(64, width), nn.ReLU()]
    for _ in range(depth - 2):
        layers += [nn.Linear(width, width), nn.ReLU()]
    layers.append(nn.Linear(width, 10))
    return nn.Sequential(*layers)


def small_cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(64, 64, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
        nn.Linear(64, 10),
    )


class GPT2Like(nn.Module):
    """GPT-2 small's shape (12 pre-norm blocks, d_model 768, 12 heads, GELU MLP 3072, tied
    embeddings, vocabulary 50257, 1024 positions) from stock PyTorch layers."""

    def __init__(self, vocab: int = 50257, d: int = 768, layers: int = 12, heads: int = 12, ctx: int = 1024) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(ctx, d)
        block = nn.TransformerEncoderLayer(d, heads, 4 * d, dropout=0.0, activation="gelu",
                                           batch_first=True, norm_first=True)
        self.blocks = nn.TransformerEncoder(block, layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        t = idx.shape[1]
        h = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        h = self.norm(self.blocks(h, mask=mask, is_causal=True))
        return h @ self.tok.weight.T          # tied output head


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


class TimedWatcher(TorchWatcher):
    """A TorchWatcher that adds up the wall time spent in its own code (hooks and update)."""

    own = 0.0

    def watch_monitor(self) -> None:
        """Also time the Monitor's ``update`` on its own and keep what it was fed."""
        self.mon_time = 0.0
        self.rows: list[dict[str, Any]] = []
        update = self.monitor.update

        def timed(**kw: Any) -> Any:
            t0 = time.perf_counter()
            out = update(**kw)
            self.mon_time += time.perf_counter() - t0
            self.rows.append(kw)
            return out

        self.monitor.update = timed  # type: ignore[method-assign]

    def replayed_monitor_time(self) -> float:
        """Seconds per update of a fresh Monitor fed the same rows outside the training loop."""
        mon = ts.Monitor()
        t0 = time.perf_counter()
        for kw in self.rows:
            mon.update(**kw)
        return (time.perf_counter() - t0) / max(1, len(self.rows))

    def _pre_hook(self, *args: Any) -> None:
        t0 = time.perf_counter()
        super()._pre_hook(*args)
        self.own += time.perf_counter() - t0

    def _post_hook(self, *args: Any) -> None:
        t0 = time.perf_counter()
        super()._post_hook(*args)
        self.own += time.perf_counter() - t0

    def update(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        out = super().update(*args, **kwargs)
        self.own += time.perf_counter() - t0
        return out


def time_variant(make: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, variant: str,
                 steps: int, device: torch.device) -> tuple[float, float, tuple[float, float] | None]:
    """Seconds per step of ``steps`` training steps with the given measurement, seconds per step
    spent in the measuring code itself (timed around it), and for the watcher the seconds per
    ``Monitor.update`` inside the loop and replayed alone on the same inputs."""
    torch.manual_seed(0)
    model = make().to(device)
    opt = (torch.optim.AdamW(model.parameters(), lr=1e-4) if OPTIMIZER == "adamw"
           else torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9))
    watcher: TimedWatcher | None = None
    if variant.startswith("watcher"):
        every = {"watcher": 0, "watcher+ratio": 10, "watcher+ratio1": 1, "watcher/sync10": 0}[variant]
        watcher = TimedWatcher(model, opt, update_ratio_every=every, sync_every=10 if variant.endswith("sync10") else 1)
    own = 0.0
    loss_fn = lm_loss if y.dim() == 2 else F.cross_entropy
    named = list(model.named_parameters())
    params = [p for _, p in named]
    sink: Any = None

    def step() -> None:
        nonlocal sink, own
        loss = loss_fn(model(x), y)
        loss.backward()
        if watcher is not None:
            opt.step()                        # its pre-hook measures the gradients here
            sink = watcher.update(loss=loss)  # the watcher times itself, hooks included
            opt.zero_grad()
            return
        # the recipes measure where users do (and where the watcher's pre-hook does): after
        # backward, before clipping and the step; the first code to read the fresh gradients
        # pays to bring them into its core's cache (tens of us on a CPU), whoever it is
        t0 = time.perf_counter()
        if variant == "recipe":
            sink = ({n: p.grad.norm().item() for n, p in named if p.grad is not None}, loss.item())
        elif variant == "lightning":
            sink = ({k: float(v) for k, v in lightning_grad_norm(model, 2).items()}, loss.item())
        elif variant == "foreach":
            norms = torch._foreach_norm([p.grad for p in params if p.grad is not None])  # noqa: SLF001 - torch's fused multi-tensor norm has no public name
            sink = torch.stack([loss.detach(), *norms]).tolist()
        else:
            sink = loss.detach()
        own += time.perf_counter() - t0
        opt.step()
        opt.zero_grad()

    for _ in range(5):
        step()
    own = 0.0
    if watcher is not None:
        watcher.own = 0.0
        watcher.watch_monitor()
    if device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(steps):
        step()
    if watcher is not None and watcher.sync_every > 1:   # the steps still held count too
        t1 = time.perf_counter()
        watcher.flush()
        watcher.own += time.perf_counter() - t1
    if device.type == "cuda":
        torch.cuda.synchronize()
    elapsed = time.perf_counter() - t0
    mon: tuple[float, float] | None = None
    if watcher is not None:
        own = watcher.own
        mon = (watcher.mon_time / steps, watcher.replayed_monitor_time())
        watcher.close()
    del sink
    return elapsed / steps, own / steps, mon


try:
    from lightning.pytorch.utilities import grad_norm as lightning_grad_norm
except ImportError:  # pragma: no cover - the [lightning] extra is not installed
    lightning_grad_norm = None

#: ``sgdm``: SGD with momentum 0.9 (the update ratio is read from its momentum buffers); ``adamw``:
#: AdamW (the update ratio needs a copy of the parameters on measuring steps). Set by ``--optimizer``.
OPTIMIZER = "sgdm"

VARIANTS = ("bare", "watcher", "watcher/sync10", "watcher+ratio", "watcher+ratio1", "recipe", "lightning", "foreach")


def read_bandwidth(device: torch.device, mb: int = 256) -> float:
    """Bytes per second that a ``sum`` over a large buffer reads (best of 5)."""
    buf = torch.ones(mb * 2**20 // 4, device=device)
    best = math.inf
    for _ in range(6):
        if device.type == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        buf.sum().item()
        best = min(best, time.perf_counter() - t0)
    return buf.numel() * 4 / best


def bench(name: str, make: Callable[[], nn.Module], x: torch.Tensor, y: torch.Tensor, steps: int,
          repeats: int, device: torch.device, bandwidth: float) -> None:
    variants = [v for v in VARIANTS if v != "lightning" or lightning_grad_norm is not None]
    per: dict[str, list[float]] = {v: [] for v in variants}
    owns: dict[str, list[float]] = {v: [] for v in variants}
    mons: list[tuple[float, float]] = []
    for _ in range(repeats):                      # interleave the variants: drift hits all alike
        for v in variants:
            total, own_t, mon = time_variant(make, x, y, v, steps, device)
            per[v].append(total)
            owns[v].append(own_t)
            if v == "watcher" and mon is not None:
                mons.append(mon)
    med = {v: statistics.median(t) for v, t in per.items()}
    own = {v: statistics.median(t) for v, t in owns.items()}
    params = list(make().parameters())
    grad_bytes = sum(p.numel() * p.element_size() for p in params)
    floor = grad_bytes / bandwidth
    bare = med["bare"]
    print(f"\n{name}: {len(params)} parameter tensors, {grad_bytes / 1e6:.1f} MB of gradients, "
          f"bare step {bare * 1e3:.2f} ms (median of {repeats})")
    added = {v: med[v] - bare for v in variants if v != "bare"}
    print("  variant          step (ms)   step - bare (ms)    own time (ms, % of the bare step)")
    for v, a in added.items():
        print(f"  {v:15s} {med[v] * 1e3:9.2f}   {a * 1e3:+9.3f}          {own[v] * 1e3:8.3f}  ({100 * own[v] / bare:5.2f} %)")
    print(f"  (d) bandwidth floor: {floor * 1e3:.3f} ms ({100 * floor / bare:.2f} % of the step)")
    w = own["watcher"]
    parts = [f"{label} {w / own[v]:.2f}x" for v, label in (("recipe", "(a) recipe"), ("lightning", "(b) Lightning"),
                                                          ("foreach", "(c) foreach")) if v in own and own[v] > 0]
    print(f"  watcher own time vs: {', '.join(parts)}, (d) bandwidth floor {w / floor:.2f}x;"
          f"  foreach (c) / (d): {own['foreach'] / floor:.2f}x")
    ws = own["watcher/sync10"]
    parts = [f"{label} {ws / own[v]:.2f}x" for v, label in (("recipe", "(a) recipe"), ("lightning", "(b) Lightning"),
                                                           ("foreach", "(c) foreach")) if v in own and own[v] > 0]
    print(f"  watcher with sync_every=10 own time vs: {', '.join(parts)}")
    if mons:
        in_loop = statistics.median(m[0] for m in mons)
        alone = statistics.median(m[1] for m in mons)
        print(f"  the watcher's Monitor.update: {in_loop * 1e6:.0f} us inside the training loop, "
              f"{alone * 1e6:.0f} us replayed alone on the same inputs ({in_loop / alone:.1f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--models", default="mlp,cnn,gpt2", help="comma-separated: mlp, mlp256, cnn, gpt2")
    ap.add_argument("--gpt2-batch", type=int, default=1)
    ap.add_argument("--gpt2-seq", type=int, default=64)
    ap.add_argument("--optimizer", default="sgdm", choices=("sgdm", "adamw"),
                    help="sgdm: SGD + momentum 0.9 (default); adamw: AdamW")
    args = ap.parse_args()
    global OPTIMIZER
    OPTIMIZER = args.optimizer
    device = torch.device(args.device)
    torch.manual_seed(0)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    bw = read_bandwidth(device)
    print(f"torch {torch.__version__}, device {device} ({name}), {torch.get_num_threads()} threads, "
          f"read bandwidth {bw / 1e9:.1f} GB/s, optimizer {OPTIMIZER}")
    models = args.models.split(",")
    if "mlp" in models:
        bench("MLP 100 layers x 256, batch 64", deep_mlp, torch.randn(64, 64, device=device),
              torch.randint(0, 10, (64,), device=device), args.steps, args.repeats, device, bw)
    if "mlp256" in models:
        bench("MLP 100 layers x 256, batch 256", deep_mlp, torch.randn(256, 64, device=device),
              torch.randint(0, 10, (256,), device=device), args.steps, args.repeats, device, bw)
    if "cnn" in models:
        bench("CNN 3 conv layers, 32x32x3, batch 32", small_cnn, torch.randn(32, 3, 32, 32, device=device),
              torch.randint(0, 10, (32,), device=device), args.steps, args.repeats, device, bw)
    if "gpt2" in models:
        b, t = args.gpt2_batch, args.gpt2_seq
        tokens = torch.randint(0, 50257, (b, t + 1), device=device)
        bench(f"GPT-2-small-like, 124M parameters, batch {b} x {t} tokens", GPT2Like, tokens[:, :-1],
              tokens[:, 1:], max(3, args.steps // 6), args.repeats, device, bw)


if __name__ == "__main__":
    main()
