"""Data-parallel training (:mod:`trainsignals.adapters.distributed`) on CPU with ``gloo``.

Real jobs: this file launches itself as 2 and 4 processes (``python tests/test_distributed.py
--rank R ...``, one process per rank, a ``file://`` store in ``tmp_path``, a hard timeout on every
process and ``timeout=`` on every collective). Each rank trains a ReLU MLP wrapped in
``DistributedDataParallel`` on its own random shard of scikit-learn's 8x8 digits (Adam, lr 3e-4,
a global batch of 128 split over the ranks: quiet for 200 steps in the single-process tests), runs
several scenarios in a row on the same process group and writes what it saw to JSON files. Faults
are injected on known ranks at known steps; the tests check they are caught and named, within a
window, and that healthy runs stay quiet with every rank agreeing. The 2-rank jobs compare
replicas exactly (the default), the 4-rank jobs with ``tolerance=1e-6``. The pure rules
(:class:`RankOutliers`, :func:`replica_disagreement`) are tested in-process on seeded streams.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

from trainsignals.adapters.distributed import (  # noqa: E402
    DistributedWatcher,
    RankOutliers,
    bit_checksum,
    replica_disagreement,
)

LAUNCH_TIMEOUT = 150.0      # seconds a whole launch may take before its processes are killed
COLLECTIVE_TIMEOUT = 20.0   # seconds any collective may wait
FAULT_STEP = {"scaled_grads": 33, "bit_flip": 47, "bad_data": 60, "lr_all": 100}


# ==============================================================================================
# The ranks (run as ``python tests/test_distributed.py --rank R --world W --dir D --scenarios ...``)
# ==============================================================================================
def _mlp(hidden: int = 64) -> Any:
    nn = torch.nn
    torch.manual_seed(0)            # the same initial weights on every rank
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, 10))


def _train(rank: int, world: int, data: tuple[Any, Any], *, steps: int = 200, fault: str | None = None,
           **kw: Any) -> dict[str, Any]:
    """Train one DDP run on this rank; returns what the rank saw."""
    F = torch.nn.functional
    X, y = data
    model = torch.nn.parallel.DistributedDataParallel(_mlp())
    opt = torch.optim.Adam(model.parameters(), 3e-4)
    watcher = DistributedWatcher(model, opt, total_steps=steps, timeout=COLLECTIVE_TIMEOUT, **kw)
    gen = torch.Generator().manual_seed(1000 + rank)      # each rank its own shard of batches
    batch = 128 // world
    events: list[Any] = []
    stopped = None
    local_check: list[float] = []
    fed_vs_ranks: list[tuple[float, float]] = []
    acts: list[str] = []
    for s in range(steps):
        idx = torch.randint(0, len(X), (batch,), generator=gen)
        xb, yb = X[idx], y[idx]
        if fault == "bad_data" and rank == 3 and s >= FAULT_STEP["bad_data"]:
            yb = torch.randint(0, 10, yb.shape, generator=gen)            # a shard with corrupted labels
            xb = xb[torch.randperm(len(xb), generator=gen)] * 4.0
        if fault == "lr_all" and s == FAULT_STEP["lr_all"]:
            for g in opt.param_groups:
                g["lr"] *= 1000.0
        if s == 0:     # the local gradient of this rank, without DDP, to check the communication hook
            ref = _mlp()
            ref.load_state_dict(model.module.state_dict())
            F.cross_entropy(ref(xb), yb).backward()
            local_check.append(math.sqrt(sum(float(p.grad.square().sum()) for p in ref.parameters())))
        loss = F.cross_entropy(model(xb), yb)
        loss.backward()
        if fault == "scaled_grads" and rank == 2 and s == FAULT_STEP["scaled_grads"]:
            for p in model.parameters():
                p.grad.mul_(2.0)                               # a wrong world-size scaling on one rank
        opt.step()
        if fault == "bit_flip" and rank == 1 and s == FAULT_STEP["bit_flip"]:
            with torch.no_grad():
                model.module[2].weight.mul_(1.0 + 1e-6)        # silent corruption of one tensor
        new = watcher.update(loss=loss)
        events += new
        opt.zero_grad()
        if s == 0:
            local_check.append(watcher.last_rank_values["local_grad_norm"][rank])
        if s == 50:
            acts = sorted(watcher.last_signals.get("activations", {}))
        if s % 25 == 0:
            fed_vs_ranks.append((watcher.last_signals["loss"], float(np.mean(watcher.last_rank_values["loss"]))))
        if watcher.should_stop:
            stopped = s
            break
    watcher.close()
    state = json.dumps(watcher.monitor.state_dict(), sort_keys=True, default=str)
    return {
        "events": [e.to_dict() for e in events],
        "findings": [{"kind": f.event.kind.value, "step": f.event.step, "onset": f.event.onset_step,
                      "ranks": list(f.ranks), "layers": list(f.layers), "signals": list(f.signals)}
                     for f in watcher.findings],
        "stopped": stopped,
        "last_step": s,
        "state_sha": hashlib.sha256(state.encode()).hexdigest(),
        "local_check": local_check,
        "fed_vs_ranks": fed_vs_ranks,
        "acts": acts,
        "first_loss": fed_vs_ranks[0][0],
        "last_loss": watcher.last_signals.get("loss"),
    }


def _mismatch(rank: int, world: int) -> dict[str, Any]:
    """Rank 1 builds a wider model: every rank must refuse at construction, none may hang."""
    model = _mlp(64 if rank != 1 else 32)     # (DDP would refuse it first: the watcher guards its own gather)
    opt = torch.optim.SGD(model.parameters(), 0.1)
    try:
        DistributedWatcher(model, opt, timeout=COLLECTIVE_TIMEOUT)
    except ValueError as exc:
        return {"error": str(exc)}
    return {"error": None}


def _fsdp(rank: int, world: int, data: tuple[Any, Any], steps: int = 60) -> dict[str, Any]:
    """FSDP2 (fully_shard): the Monitor must see the full model's norms and update ratio."""
    from torch.distributed.fsdp import fully_shard
    F = torch.nn.functional
    X, y = data
    model = _mlp()
    fully_shard(model)
    opt = torch.optim.Adam(model.parameters(), 3e-4)
    watcher = DistributedWatcher(model, opt, total_steps=steps, timeout=COLLECTIVE_TIMEOUT, update_ratio_every=5)
    gen = torch.Generator().manual_seed(1000 + rank)
    events: list[Any] = []
    checks: list[list[float]] = []
    for s in range(steps):
        idx = torch.randint(0, len(X), (128 // world,), generator=gen)
        loss = F.cross_entropy(model(X[idx]), y[idx])
        loss.backward()
        full_grads = [p.grad.full_tensor() for p in model.parameters()]          # collectives: test only
        before = [p.detach().full_tensor() for p in model.parameters()]
        opt.step()
        after = [p.detach().full_tensor() for p in model.parameters()]
        events += watcher.update(loss=loss)
        opt.zero_grad()
        if s % 5 == 0:
            gnorm = math.sqrt(sum(float(g.square().sum()) for g in full_grads))
            layer0 = float(full_grads[0].norm())
            d = math.sqrt(sum(float((a - b).square().sum()) for a, b in zip(after, before)))
            w = math.sqrt(sum(float(b.square().sum()) for b in before))
            fed = watcher.last_signals
            checks.append([gnorm, fed["grad_norm"], layer0, fed["layer_grad_norms"]["0.weight"], d / w,
                           fed["update_ratio"]])
    watcher.close()
    return {"events": [e.to_dict() for e in events], "checks": checks, "sharded": watcher.sharded}


def _timeout(rank: int, world: int, data: tuple[Any, Any]) -> dict[str, Any]:
    """Rank 1 stops calling update() at step 5 (it crashed, or left the loop alone): rank 0 must not hang."""
    F = torch.nn.functional
    X, y = data
    model = _mlp()          # no DDP here: only the watcher's own collective is left waiting
    opt = torch.optim.SGD(model.parameters(), 0.01)
    watcher = DistributedWatcher(model, opt, timeout=2.0)
    t0 = time.monotonic()
    try:
        for s in range(20):
            F.cross_entropy(model(X[:32]), y[:32]).backward()
            opt.step()
            opt.zero_grad()
            if rank == 1 and s == 5:
                time.sleep(6.0)
                return {"error": None, "step": s}
            t0 = time.monotonic()
            watcher.update(loss=0.0)
    except RuntimeError as exc:
        return {"error": str(exc), "waited": time.monotonic() - t0, "step": s}
    return {"error": None, "step": s}


def _rank_main(args: argparse.Namespace) -> None:  # pragma: no cover - runs in the rank processes
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{args.dir}/store", rank=args.rank,
                            world_size=args.world, timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT))
    arr = np.load(Path(args.dir) / "digits.npz")
    data = (torch.tensor(arr["X"], dtype=torch.float32), torch.tensor(arr["y"]))
    tol = {"tolerance": 1e-6} if args.world == 4 else {}     # 4 ranks: the relative comparison; 2: exact
    for name in args.scenarios.split(","):
        if name == "mismatch":
            res = _mismatch(args.rank, args.world)
        elif name == "fsdp":
            res = _fsdp(args.rank, args.world, data)
        elif name == "timeout":
            res = _timeout(args.rank, args.world, data)
        elif name == "healthy":
            res = _train(args.rank, args.world, data, activations_every=10, **tol)
        else:      # a fault: the run only needs to last until it is caught (and a while after)
            res = _train(args.rank, args.world, data, fault=name, steps=FAULT_STEP[name] + 40, **tol)
        (Path(args.dir) / f"{name}.{args.rank}.json").write_text(json.dumps(res))
    sys.stdout.flush()
    os._exit(0)     # no teardown handshake: a rank that timed out leaves the group broken


# ==============================================================================================
# The launcher
# ==============================================================================================
def launch(tmp: Path, world: int, scenarios: list[str]) -> dict[str, list[dict[str, Any]]]:
    """Run ``world`` rank processes through ``scenarios``; kill them all past ``LAUNCH_TIMEOUT``."""
    sklearn_datasets = pytest.importorskip("sklearn.datasets")
    X, y = sklearn_datasets.load_digits(return_X_y=True)
    np.savez(tmp / "digits.npz", X=X / 16.0, y=y)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs = [subprocess.Popen([sys.executable, __file__, "--rank", str(r), "--world", str(world), "--dir", str(tmp),
                               "--scenarios", ",".join(scenarios)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True) for r in range(world)]
    deadline = time.monotonic() + LAUNCH_TIMEOUT
    logs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            pytest.fail(f"the {world}-rank job did not finish within {LAUNCH_TIMEOUT} s (a hang)")
        logs.append(out)
    for p, out in zip(procs, logs):
        assert p.returncode == 0, f"a rank failed:\n{out[-4000:]}"
    return {name: [json.loads((tmp / f"{name}.{r}.json").read_text()) for r in range(world)] for name in scenarios}


@pytest.fixture(scope="module")
def four(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return launch(tmp_path_factory.mktemp("ddp4"), 4, ["healthy", "scaled_grads", "bad_data"])


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return launch(tmp_path_factory.mktemp("ddp2"), 2, ["mismatch", "healthy", "bit_flip", "lr_all", "fsdp", "timeout"])


def loud(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e["severity"] in ("warning", "critical")]


def same_on_every_rank(results: list[dict[str, Any]], *keys: str) -> None:
    for key in keys:
        assert all(r[key] == results[0][key] for r in results), f"{key} differs across ranks"


# ----------------------------------------------------------------------------------------------
# Healthy runs: quiet, and every rank agrees
# ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize("job", ["two", "four"])
def test_healthy_run_is_quiet_and_ranks_agree(job: str, request: pytest.FixtureRequest) -> None:
    res = request.getfixturevalue(job)["healthy"]
    for r in res:
        assert loud(r["events"]) == [], r["events"]
        assert r["stopped"] is None and r["last_step"] == 199
        assert r["last_loss"] < 0.5 * r["first_loss"]                 # it did learn
        for fed, mean in r["fed_vs_ranks"]:                           # the Monitor gets the ranks' mean loss
            assert fed == pytest.approx(mean, rel=1e-12)
        assert r["acts"] == ["1", "3"]                                # activation statistics (both ReLUs) fed
    same_on_every_rank(res, "events", "state_sha", "fed_vs_ranks")    # identical inputs => identical state


@pytest.mark.parametrize("job", ["two", "four"])
def test_comm_hook_measures_the_local_grad_norm_before_sync(job: str, request: pytest.FixtureRequest) -> None:
    res = request.getfixturevalue(job)["healthy"]
    for r in res:
        direct, hooked = r["local_check"]
        assert hooked == pytest.approx(direct, rel=1e-5)
    assert len({round(r["local_check"][0], 6) for r in res}) == len(res)   # local norms differ by rank


# ----------------------------------------------------------------------------------------------
# Replica divergence
# ----------------------------------------------------------------------------------------------
def test_scaled_grads_on_one_rank_is_replica_divergence_naming_it(four: dict[str, Any]) -> None:
    res = four["scaled_grads"]
    k = FAULT_STEP["scaled_grads"]
    same_on_every_rank(res, "events", "findings", "stopped")
    for r in res:
        assert all(e["step"] >= k for e in loud(r["events"]))
        rep = [f for f in r["findings"] if f["kind"] == "replica_divergence"]
        assert rep and rep[0]["step"] == k and rep[0]["onset"] == k
        assert rep[0]["ranks"] == [2]
        assert "grad_norm" in rep[0]["signals"]
        ev = next(e for e in r["events"] if e["kind"] == "replica_divergence")
        assert ev["severity"] == "critical" and "rank 2" in ev["signal"] and "rank 2 disagrees" in ev["message"]
        assert r["stopped"] == k                                     # every rank stops at the same step


def test_bit_flip_on_one_rank_is_caught_at_the_next_check(two: dict[str, Any]) -> None:
    res = two["bit_flip"]
    k = FAULT_STEP["bit_flip"]
    check = (k // 10 + 1) * 10                                       # check_every=10
    same_on_every_rank(res, "events", "findings", "stopped")
    for r in res:
        assert all(e["step"] > k for e in loud(r["events"]))
        rep = [f for f in r["findings"] if f["kind"] == "replica_divergence"]
        assert rep and rep[0]["step"] == check
        assert rep[0]["onset"] == check - 10 + 1 <= k + 1            # after the last check that agreed
        assert rep[0]["ranks"] == [0, 1]                             # 2 ranks: both named
        assert rep[0]["layers"] == ["2.weight"]                      # only the corrupted tensor
        assert rep[0]["signals"] == ["param_checksum"]               # gradients after sync still agree
        assert r["stopped"] == check


# ----------------------------------------------------------------------------------------------
# Bad rank
# ----------------------------------------------------------------------------------------------
def test_corrupted_shard_is_a_bad_rank_naming_it(four: dict[str, Any]) -> None:
    res = four["bad_data"]
    k = FAULT_STEP["bad_data"]
    same_on_every_rank(res, "events", "findings", "state_sha")
    for r in res:
        bad = [f for f in r["findings"] if f["kind"] == "bad_rank"]
        assert bad, r["events"]
        assert all(f["ranks"] == [3] for f in bad)
        assert k <= bad[0]["onset"] and bad[0]["step"] <= k + 5
        assert not [e for e in loud(r["events"]) if e["step"] < k]
        assert not [f for f in r["findings"] if f["kind"] == "replica_divergence"]


# ----------------------------------------------------------------------------------------------
# A divergence on every rank stops every rank at the same step
# ----------------------------------------------------------------------------------------------
def test_divergence_on_all_ranks_stops_all_at_the_same_step(two: dict[str, Any]) -> None:
    res = two["lr_all"]
    k = FAULT_STEP["lr_all"]
    same_on_every_rank(res, "events", "stopped", "state_sha")
    stop = res[0]["stopped"]
    assert stop is not None and k <= stop <= k + 25
    assert not [e for e in loud(res[0]["events"]) if e["step"] < k]
    crit = [e for e in res[0]["events"] if e["severity"] == "critical"]
    assert crit and crit[-1]["step"] == stop
    assert not [e for e in res[0]["events"] if e["kind"] in ("replica_divergence", "bad_rank")]


# ----------------------------------------------------------------------------------------------
# FSDP2, construction across ranks, timeouts
# ----------------------------------------------------------------------------------------------
def test_fsdp2_shards_are_combined_into_the_full_model_norms(two: dict[str, Any]) -> None:
    res = two["fsdp"]
    same_on_every_rank(res, "events", "checks")
    assert res[0]["sharded"] is True
    assert loud(res[0]["events"]) == []
    for gnorm, fed, layer0, fed_layer0, ratio, fed_ratio in res[0]["checks"]:
        assert fed == pytest.approx(gnorm, rel=1e-5)
        assert fed_layer0 == pytest.approx(layer0, rel=1e-5)
        assert fed_ratio == pytest.approx(ratio, rel=1e-4)


def test_a_model_that_differs_across_ranks_is_refused_on_every_rank(two: dict[str, Any]) -> None:
    for r in two["mismatch"]:
        assert r["error"] and "parameter names and shapes differ across ranks" in r["error"]


def test_a_rank_that_stops_calling_update_times_out_instead_of_hanging(two: dict[str, Any]) -> None:
    r0 = two["timeout"][0]
    assert r0["step"] == 5
    assert r0["error"] and "step 5" in r0["error"] and "did not call update()" in r0["error"]
    assert r0["waited"] < 2.0 + 3.0


# ==============================================================================================
# In-process: configuration and the pure rules
# ==============================================================================================
@pytest.mark.parametrize("kw, name", [
    ({"check_every": -1}, "check_every"), ({"check_every": 1.5}, "check_every"),
    ({"tolerance": -1e-6}, "tolerance"), ({"tolerance": math.nan}, "tolerance"), ({"tolerance": math.inf}, "tolerance"),
    ({"bad_rank_threshold": -1.0}, "bad_rank_threshold"), ({"bad_rank_patience": 0}, "bad_rank_patience"),
    ({"bad_rank_warmup": 0}, "bad_rank_warmup"), ({"bad_rank_window": 0}, "bad_rank_window"),
    ({"bad_rank_warmup": 50, "bad_rank_window": 20}, "bad_rank_warmup"),
    ({"bad_rank_severity": "fatal"}, "bad_rank_severity"), ({"timeout": 0}, "timeout"),
    ({"comm_hook": "yes"}, "comm_hook"), ({"sharded": "auto"}, "sharded"),
])
def test_bad_config_raises_value_error_naming_the_parameter(kw: dict[str, Any], name: str) -> None:
    model = _mlp()
    with pytest.raises(ValueError, match=f"^{name} "):
        DistributedWatcher(model, torch.optim.SGD(model.parameters(), 0.1), **kw)


def test_without_a_process_group_it_says_so() -> None:
    assert not dist.is_initialized()
    model = _mlp()
    with pytest.raises(RuntimeError, match="init_process_group"):
        DistributedWatcher(model, torch.optim.SGD(model.parameters(), 0.1))


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("world", [3, 4, 8])
def test_rank_outliers_healthy_ranks_are_quiet(seed: int, world: int) -> None:
    rng = np.random.default_rng(seed)
    det = RankOutliers()
    for step in range(600):
        level = 2.0 * math.exp(-step / 300)                   # a falling loss, noise shrinking with it
        vals = level + 0.05 * level * rng.standard_normal(world)
        gn = np.exp(rng.normal(0.0, 0.3, world))             # heavier-tailed grad norms
        assert det.update(step, {"loss": vals, "local_grad_norm": gn}) == []


@pytest.mark.parametrize("seed", range(5))
def test_rank_outliers_name_the_rank_that_leaves_the_spread(seed: int) -> None:
    rng = np.random.default_rng(seed)
    det = RankOutliers()
    bad, onset = int(rng.integers(0, 5)), int(rng.integers(40, 200))
    events = []
    for step in range(300):
        vals = 1.0 + 0.05 * rng.standard_normal(5)
        if step >= onset:
            vals[bad] *= 3.0
        events += det.update(step, {"loss": vals})
    assert events and events[0].signal == f"loss[rank {bad}]"
    assert events[0].onset_step == onset and events[0].step == onset + det.patience - 1
    assert {e.signal for e in events} == {f"loss[rank {bad}]"}


def test_rank_outliers_a_shift_of_every_rank_is_not_a_bad_rank() -> None:
    rng = np.random.default_rng(0)
    det = RankOutliers()
    for step in range(300):
        vals = 1.0 + 0.05 * rng.standard_normal(4)
        if step >= 100:
            vals = vals * 50.0                                 # everyone diverges together
        assert det.update(step, {"loss": vals}) == []


@pytest.mark.parametrize("seed", range(4))
def test_rank_outliers_two_ranks_attribute_a_change_by_their_own_history(seed: int) -> None:
    rng = np.random.default_rng(seed)
    det = RankOutliers()
    bad = seed % 2
    quiet = []
    events = []
    for step in range(200):
        level = 2.0 * math.exp(-step / 200)
        vals = level + 0.05 * rng.standard_normal(2)
        if step >= 120:
            vals[bad] += 2.0
        new = det.update(step, {"loss": vals})
        (events if step >= 120 else quiet).extend(new)
    assert quiet == []
    assert events and events[0].signal == f"loss[rank {bad}]" and events[0].onset_step == 120
    assert "2 ranks" in events[0].message


def test_rank_outliers_name_a_non_finite_rank_at_once() -> None:
    det = RankOutliers()
    ev = det.update(0, {"loss": [1.0, math.nan, 1.1, 0.9]}, present={"loss": [True, True, True, True]})
    assert [e.signal for e in ev] == ["loss[rank 1]"]
    assert det.update(1, {"loss": [1.0, math.nan, 1.1, 0.9]}) == []      # absent, not non-finite


@pytest.mark.parametrize("kw", [{"threshold": 0}, {"patience": 0}, {"warmup": 0}, {"window": 5, "warmup": 6},
                                {"severity": "info"}])
def test_rank_outliers_bad_config(kw: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match=next(iter(kw))):
        RankOutliers(**kw)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float64"])
def test_bit_checksum_sees_one_flipped_bit_in_any_order(dtype: str) -> None:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4097 if dtype == "float32" else 4096, generator=g).to(getattr(torch, dtype))
    base = bit_checksum(x)
    words = x.view(torch.int32)
    shuffled = words[torch.randperm(len(words), generator=g)].view(x.dtype)
    assert bool(base == bit_checksum(shuffled))                 # the 32-bit words summed in any order
    for i in (0, 1234, len(x) - 1):
        for bit in (0, 7, 15):            # bits of the value's lowest 16: for float32/64 a relative change < 1e-3
            y = x.clone()
            y.view(torch.int16)[2 * i if x.element_size() > 2 else i] ^= 1 << bit
            assert bool(base != bit_checksum(y))
    odd = torch.randn(5, generator=g).to(torch.bfloat16)         # 10 bytes: the float64 sum instead
    assert bit_checksum(odd).dtype == torch.float64


def test_replica_disagreement_exact_and_relative() -> None:
    v = np.array([[1.0, 2.0, math.nan], [1.0, 2.0, math.nan], [1.0, 2.0 + 1e-12, math.nan], [1.0, 2.0, math.nan]])
    mask, rel = replica_disagreement(v)
    assert mask.tolist() == [[False] * 3, [False] * 3, [False, True, False], [False] * 3]   # NaN == NaN here
    assert rel[2, 1] == pytest.approx(0.5e-12, rel=1e-3)
    assert not replica_disagreement(v, tolerance=1e-9)[0].any()
    two = replica_disagreement(v[1:3])[0]
    assert two.tolist() == [[False, True, False], [False, True, False]]                     # 2 ranks: both
    scale = np.full_like(v, 1e6)                                # sums of |x|: a sum near 0 is not "relative 1"
    assert not replica_disagreement(v + [[0, 0, 0], [0, 0, 0], [1e-3, 0, 0], [0, 0, 0]], 1e-6, scale)[0].any()
    nf = np.array([[math.inf], [1.0], [1.0]])
    assert replica_disagreement(nf)[0][:, 0].tolist() == [True, False, False]


if __name__ == "__main__":  # pragma: no cover - a rank process launched by `launch`
    ap = argparse.ArgumentParser()
    ap.add_argument("--rank", type=int, required=True)
    ap.add_argument("--world", type=int, required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--scenarios", required=True)
    _rank_main(ap.parse_args())
