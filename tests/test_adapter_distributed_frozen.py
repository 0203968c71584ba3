"""The DistributedWatcher with layers frozen when it is built, in one gloo process (world size 1).

The watcher measures them as the TorchWatcher does (a one-time ``update_ratio_low`` note; NaN,
"not measured", while they have no gradient; measured once unfrozen), both with whole
parameters and with the squared-sum layout of sharded ones (``sharded=True``).
"""

from __future__ import annotations

import datetime
import math
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from trainsignals.adapters.distributed import DistributedWatcher  # noqa: E402


@pytest.fixture()
def group(tmp_path: Path) -> Any:
    if not dist.is_available() or dist.is_initialized():
        pytest.skip("needs torch.distributed, not initialised by another test")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1,
                            timeout=datetime.timedelta(seconds=30))
    try:
        yield
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("sharded", [False, True])
def test_layers_frozen_when_built_are_noted_not_measured_then_measured(group: Any, sharded: bool) -> None:
    torch.manual_seed(0)
    nn = torch.nn
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 3))
    model[0].requires_grad_(False)
    model[2].requires_grad_(False)
    opt = torch.optim.Adam(model.parameters(), 1e-3)
    w = DistributedWatcher(model, opt, sharded=sharded, update_ratio_every=2, check_every=0, timeout=20.0)
    x, y = torch.randn(64, 8), torch.randint(0, 3, (64,))
    events = []
    for s in range(12):
        if s == 6:
            model[2].requires_grad_(True)
        learning = [p for p in model.parameters() if p.requires_grad]
        before = [p.detach().clone() for p in learning]
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        events += w.update(loss=1.0)
        opt.zero_grad()
        if s % 2 == 0:
            ratios = w.last_layer_update_ratios
            assert ratios is not None
            assert math.isnan(ratios["0.weight"]) and math.isnan(ratios["2.weight"]) == (s < 6)
            assert ratios["4.weight"] > 0 and (s < 6 or ratios["2.weight"] > 0)
            d = math.sqrt(sum((p.detach() - b).norm().item() ** 2 for p, b in zip(learning, before)))
            wn = math.sqrt(sum(b.norm().item() ** 2 for b in before))
            assert w.last_signals["update_ratio"] == pytest.approx(d / wn, rel=1e-4)
    w.close()
    notes = [e for e in events if e.detector == "TorchWatcher"]
    assert [(e.step, e.kind.value, e.layer) for e in notes] == [(0, "update_ratio_low", "0.weight")]
