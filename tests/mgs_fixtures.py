"""A plain LightningModule with its own task labels that trains through the core's
OptimizerStep, for the MGS callback tests (single process and DDP)."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from lit_rlhf.training import OptimizerStep

TASKS = ("chat", "ifeval", "math")


class TaskData(Dataset):
    """Eight samples; the tasks pull the output in opposite directions (conflicting gradients)."""

    # under 2-process DDP rank 0 gets rows 0, 2, 4, 6 (chat, math, math, chat) and rank 1 rows
    # 1, 3, 5, 7 (chat, ifeval, ifeval, ifeval): each rank lacks one task
    ORDER = ("chat", "chat", "math", "ifeval", "math", "ifeval", "chat", "ifeval")

    def __init__(self) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(len(self.ORDER), 4, generator=g)
        self.tasks = list(self.ORDER)
        sign = {"chat": 1.0, "ifeval": -1.0, "math": 0.5}
        self.y = torch.tensor([sign[t] * 2.0 for t in self.tasks])

    def __len__(self) -> int:
        return len(self.tasks)

    def __getitem__(self, i: int) -> tuple[Tensor, Tensor, str]:
        return self.x[i], self.y[i], self.tasks[i]


class TaskModule(L.LightningModule):
    """Per-sample micro-batches labelled with their task; loss = sum of squared errors divided
    by the local batch size (so the DDP average over ranks equals one process on all data)."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))
        self.lr = lr
        self.step_fn = OptimizerStep(max_grad_norm=None)
        self.stats: list[dict[str, Tensor]] = []

    def training_step(self, batch: Any, batch_idx: int) -> None:
        x, y, tasks = batch
        n = len(x)
        micro = [(x[i : i + 1], y[i : i + 1], tasks[i]) for i in range(n)]

        def loss(m: tuple[Tensor, Tensor, str]) -> Tensor:
            return ((self.net(m[0]).squeeze(-1) - m[1]) ** 2).sum() / n

        self.stats.append(
            self.step_fn(self, self.optimizers(), micro, loss, task_of=lambda m: m[2])
        )

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=self.lr)


def loader(batch_size: int) -> DataLoader:
    return DataLoader(TaskData(), batch_size=batch_size, shuffle=False)
