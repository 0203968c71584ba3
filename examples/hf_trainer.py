"""A Hugging Face ``Trainer`` run watched by :class:`trainsignals.adapters.transformers.TrainSignalsCallback`.

A tiny GPT-2-like causal LM (built from a config: random weights, no download) learns made-up
token sequences ``(a + b·t) mod 64`` with AdamW, validating every 40 steps and checkpointing
every 20. At optimizer step 100 the LR schedule multiplies the learning rate by 100 (a
mis-wired scheduler); the callback reports what happened, when and why, stops the Trainer and
names the last checkpoint saved before the failure began. Its signals and event counts are in
the Trainer's logs (``trainer.state.log_history``, and every ``report_to`` integration).

Run: ``python examples/hf_trainer.py [--fault-step 100] [--no-fault]`` (about 10 s on a CPU).
"""

from __future__ import annotations

import argparse
import logging
import tempfile
import warnings
from typing import Any

import torch
import transformers
from transformers import GPT2Config, GPT2LMHeadModel, PrinterCallback, Trainer, TrainingArguments

from trainsignals.adapters.transformers import TrainSignalsCallback

VOCAB, SEQ = 64, 16


class Sequences(torch.utils.data.Dataset):
    """Arithmetic token sequences; the labels are the inputs (the model shifts them)."""

    def __init__(self, n: int, seed: int) -> None:
        g = torch.Generator().manual_seed(seed)
        start = torch.randint(0, VOCAB, (n, 1), generator=g)
        stride = torch.randint(1, 5, (n, 1), generator=g)
        self.x = (start + stride * torch.arange(SEQ)) % VOCAB

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"input_ids": self.x[i], "labels": self.x[i]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--fault-step", type=int, default=100, help="optimizer step from which the lr is 100x")
    ap.add_argument("--no-fault", action="store_true", help="a healthy run")
    ap.add_argument("--steps", type=int, default=200)
    opts = ap.parse_args()
    if opts.steps < 1 or opts.fault_step < 0:
        raise ValueError("--steps must be >= 1 and --fault-step >= 0")
    torch.set_num_threads(1)
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    warnings.filterwarnings("ignore", category=FutureWarning)
    logging.basicConfig(level=logging.INFO, format="%(message)s")   # the callback's reports

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_positions=SEQ, n_layer=2, n_head=2, n_embd=32))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    fault = None if opts.no_fault else opts.fault_step
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: 100.0 if fault is not None and step >= fault else 1.0)

    cb = TrainSignalsCallback()
    with tempfile.TemporaryDirectory() as out:
        args = TrainingArguments(output_dir=out, max_steps=opts.steps, per_device_train_batch_size=16,
                                 logging_steps=20, eval_strategy="steps", eval_steps=40, save_strategy="steps",
                                 save_steps=20, report_to=[], use_cpu=True, dataloader_num_workers=0,
                                 disable_tqdm=True, seed=0)
        trainer = Trainer(model=model, args=args, train_dataset=Sequences(2048, 0),
                          eval_dataset=Sequences(256, 1), callbacks=[cb], optimizers=(optimizer, schedule))
        trainer.remove_callback(PrinterCallback)    # the Trainer's printing of every log row
        trainer.train()

        print(f"\ntrained {trainer.state.global_step} of {opts.steps} steps"
              + (f"; stopped at step {cb.stopped_step}" if cb.stopped_step is not None else ""))
        if cb.last_good_checkpoint:
            print(f"last checkpoint before the onset: {cb.last_good_checkpoint.rsplit('/', 1)[-1]}")
        print(cb.monitor.summary())
        last = [r for r in trainer.state.log_history if "trainsignals/loss" in r][-1]
        print("\nthe last log row's trainsignals/* values:")
        for key, value in last.items():
            if key.startswith("trainsignals/"):
                print(f"  {key} = {value:.4g}")


if __name__ == "__main__":
    main()
