import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import TensorDataset

import trainers


def loss(model: nn.Module, batch: tuple[torch.Tensor, ...]) -> torch.Tensor:
    x, y = batch  # one batch of the dataset, already on the model's device
    return F.cross_entropy(model(x), y)


def build(preset: str, *, seed: int) -> trainers.Workload:
    width = {"tiny": 64, "small": 1024}[preset]
    torch.manual_seed(seed)  # the same preset and seed give the same weights and data
    model = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))
    data = TensorDataset(torch.randn(2048, width), torch.randint(0, 10, (2048,)))
    adam = trainers.workloads.adam(1e-3)  # a factory (params, capturable) -> optimizer
    return trainers.workload_from_parts(model, data, loss, optimizer=adam, batch_size=32)
