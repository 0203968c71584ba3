# A tiny LightningModule and loaders (random data, CPU); Lightning's own output silenced.
import logging
import warnings

import lightning as L
import torch
from lightning.pytorch.loggers import CSVLogger
from torch import nn
from torch.nn import functional as F

logging.getLogger("lightning").setLevel(logging.ERROR)
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
warnings.filterwarnings("ignore", module="lightning")


class TinyModel(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))

    def training_step(self, batch, batch_idx):
        x, y = batch
        return F.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        self.log("val_loss", F.cross_entropy(self.net(x), y))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)


torch.manual_seed(0)
_data = torch.utils.data.TensorDataset(torch.randn(256, 16), torch.randint(0, 4, (256,)))
train_loader = torch.utils.data.DataLoader(_data, batch_size=32)
val_loader = torch.utils.data.DataLoader(_data, batch_size=128)
model = TinyModel()
_Trainer = L.Trainer
L.Trainer = lambda **kw: _Trainer(**{**kw, "max_steps": 40, "enable_progress_bar": False,  # tiny and quiet
                                      "enable_model_summary": False})
