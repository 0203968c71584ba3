# A tiny PyTorch model and dataset for the Hugging Face Trainer (CPU, no download), quiet.
import os
import tempfile

import torch
from torch import nn
from transformers import TrainingArguments
from transformers.utils import logging as _hf_logging

_hf_logging.set_verbosity_error()
os.environ.setdefault("WANDB_DISABLED", "true")


class TinyClassifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def forward(self, x, labels=None):
        logits = self.net(x)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


torch.manual_seed(0)
model = TinyClassifier()
train_dataset = [{"x": torch.randn(16), "labels": int(torch.randint(0, 4, ()))} for _ in range(128)]
args = TrainingArguments(output_dir=tempfile.mkdtemp(), max_steps=20, per_device_train_batch_size=16,
                         logging_steps=5, report_to=[], use_cpu=True, disable_tqdm=True, save_strategy="no")
