"""Per-step cost of :class:`trainsignals.adapters.transformers.TrainSignalsCallback` in a real ``Trainer``.

The same ``transformers.Trainer`` run — a tiny GPT-2-like causal LM built from a config (random
weights, no download) on made-up token ids, AdamW, the Trainer's default ``max_grad_norm=1.0``,
``logging_steps=50`` — with and without the callback (its defaults: per-module grad norms every
step, update ratio every 10 steps, one host transfer and one ``Monitor.update`` per step). The
variants alternate, ``--repeats`` times each, every run a fresh model with the same seed. The
step time is read by a timing callback present in both (``perf_counter`` at every
``on_step_end``); the first ``--warmup`` steps of each run are dropped.

Prints, per variant, the median step time over all kept steps of all its runs, then the
callback's overhead: (median with − median without) / median without, in %, with the spread of
the per-repeat ratios (the runs share a CPU with whatever else runs: judge the median).

Run: ``python benchmarks/bench_hf_trainer.py [--steps 200] [--repeats 5] [--threads 1]
[--layers 2] [--width 64] [--seq 64] [--batch 8]``.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import warnings
from typing import Any

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments

from trainsignals.adapters.transformers import TrainSignalsCallback


class TokenData(torch.utils.data.Dataset):
    """Arithmetic sequences ``(a + b·t) mod vocab`` (a learnable made-up corpus)."""

    def __init__(self, n: int, seq: int, vocab: int, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, vocab, (n, 1), generator=g)
        stride = torch.randint(1, 7, (n, 1), generator=g)
        self.x = (start + stride * torch.arange(seq)) % vocab

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


class StepClock(TrainerCallback):
    """``perf_counter`` at the end of every optimizer step."""

    def __init__(self) -> None:
        self.marks: list[float] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.append(time.perf_counter())


def run(opts: argparse.Namespace, data: TokenData, watched: bool) -> list[float]:
    """One training run; the kept per-step durations in seconds."""
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=opts.vocab, n_positions=opts.seq, n_layer=opts.layers,
                                       n_head=max(1, opts.width // 32), n_embd=opts.width))
    clock = StepClock()
    callbacks: list[TrainerCallback] = [clock]
    if watched:
        callbacks.append(TrainSignalsCallback(verbose=0))
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=opts.steps, per_device_train_batch_size=opts.batch,
                                 learning_rate=1e-3, logging_steps=50, report_to=[], save_strategy="no",
                                 use_cpu=opts.device == "cpu", dataloader_num_workers=0, disable_tqdm=True,
                                 seed=0)
        Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks).train()
    marks = clock.marks[opts.warmup:]
    return [b - a for a, b in zip(marks, marks[1:])]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads (0: torch's default)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--device", default="cpu", help="cpu, or the Trainer's default device with anything else")
    opts = ap.parse_args()
    for name in ("steps", "repeats", "layers", "width", "seq", "batch", "vocab"):
        if getattr(opts, name) < 1:
            raise ValueError(f"--{name} must be >= 1, got {getattr(opts, name)}")
    if not 0 <= opts.warmup < opts.steps - 1:
        raise ValueError(f"--warmup must be in [0, steps - 1), got {opts.warmup}")
    if opts.threads:
        torch.set_num_threads(opts.threads)
    transformers.logging.set_verbosity_error()
    warnings.filterwarnings("ignore")
    data = TokenData(opts.steps * opts.batch, opts.seq, opts.vocab)
    times: dict[bool, list[float]] = {False: [], True: []}
    ratios = []
    for r in range(opts.repeats):
        order = (False, True) if r % 2 == 0 else (True, False)    # interleaved, alternating which goes first
        med = {}
        for watched in order:
            steps = run(opts, data, watched)
            times[watched].extend(steps)
            med[watched] = statistics.median(steps)
        ratios.append(med[True] / med[False] - 1.0)
        print(f"repeat {r + 1}/{opts.repeats}: without {med[False] * 1e3:.2f} ms, with {med[True] * 1e3:.2f} ms "
              f"({100 * ratios[-1]:+.1f} %)", flush=True)
    bare, watched = statistics.median(times[False]), statistics.median(times[True])
    print(f"\ntiny GPT-2 (layers {opts.layers}, width {opts.width}, seq {opts.seq}, batch {opts.batch}, "
          f"vocab {opts.vocab}), {opts.steps} steps x {opts.repeats} repeats, torch threads "
          f"{torch.get_num_threads()}, torch {torch.__version__}, transformers {transformers.__version__}")
    print(f"median step without the callback: {bare * 1e3:.2f} ms")
    print(f"median step with the callback:    {watched * 1e3:.2f} ms")
    print(f"overhead: {100 * (watched / bare - 1.0):+.1f} % of the step "
          f"(per-repeat: {min(ratios) * 100:+.1f} % to {max(ratios) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
