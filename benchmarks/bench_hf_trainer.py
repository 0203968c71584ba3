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
the per-repeat ratios. Both the wall time (``perf_counter``) and the process's CPU time
(``process_time``) are given: on a CPU shared with other work the wall time carries their
jitter, the CPU time much less of it (with one torch thread it is this process's own work).

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
    """``perf_counter`` and ``process_time`` at the end of every optimizer step."""

    def __init__(self) -> None:
        self.marks: list[tuple[float, float]] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.marks.append((time.perf_counter(), time.process_time()))


def run(opts: argparse.Namespace, data: TokenData, watched: bool) -> tuple[list[float], list[float]]:
    """One training run; the kept per-step wall and CPU durations in seconds."""
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
    return ([b[0] - a[0] for a, b in zip(marks, marks[1:])],
            [b[1] - a[1] for a, b in zip(marks, marks[1:])])


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
    wall: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    ratios: dict[str, list[float]] = {"wall": [], "cpu": []}
    for r in range(opts.repeats):
        order = (False, True) if r % 2 == 0 else (True, False)    # interleaved, alternating which goes first
        med: dict[str, dict[bool, float]] = {"wall": {}, "cpu": {}}
        for watched in order:
            w, c = run(opts, data, watched)
            wall[watched].extend(w)
            cpu[watched].extend(c)
            med["wall"][watched], med["cpu"][watched] = statistics.median(w), statistics.median(c)
        for k in ratios:
            ratios[k].append(med[k][True] / med[k][False] - 1.0)
        print(f"repeat {r + 1}/{opts.repeats}: wall without {med['wall'][False] * 1e3:.2f} ms, with "
              f"{med['wall'][True] * 1e3:.2f} ms ({100 * ratios['wall'][-1]:+.1f} %); CPU "
              f"{100 * ratios['cpu'][-1]:+.1f} %", flush=True)
    print(f"\ntiny GPT-2 (layers {opts.layers}, width {opts.width}, seq {opts.seq}, batch {opts.batch}, "
          f"vocab {opts.vocab}), {opts.steps} steps x {opts.repeats} repeats, torch threads "
          f"{torch.get_num_threads()}, torch {torch.__version__}, transformers {transformers.__version__}")
    for label, times in (("wall", wall), ("CPU", cpu)):
        bare, watched = statistics.median(times[False]), statistics.median(times[True])
        rs = ratios[label.lower()]
        print(f"{label:>4} time per step: {bare * 1e3:.2f} ms without the callback, {watched * 1e3:.2f} ms with it: "
              f"overhead {100 * (watched / bare - 1.0):+.1f} % (per repeat {min(rs) * 100:+.1f} % to "
              f"{max(rs) * 100:+.1f} %)")


if __name__ == "__main__":
    main()
