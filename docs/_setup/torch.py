# A tiny PyTorch model, optimizer and loader (random data, CPU).
import torch
from torch import nn

torch.manual_seed(0)
_x, _y = torch.randn(256, 16), torch.randint(0, 4, (256,))
loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(_x, _y), batch_size=32, shuffle=True)
model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
n_steps = len(loader)
