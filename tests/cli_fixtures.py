"""Small importable classes that CLI tests name by ``class_path``."""

from __future__ import annotations

from typing import Any

import lightning as L
import torch


class NoTokenizerModule(L.LightningModule):
    """Not one of ours: a LightningModule whose ``__init__`` takes no ``tokenizer``. It reads
    the prompt batches of ``PromptDataModule`` and records how many it saw."""

    def __init__(self, lr: float = 0.1) -> None:
        super().__init__()
        self.lr = lr
        self.weight = torch.nn.Parameter(torch.zeros(()))
        self.batches_seen = 0

    def training_step(self, batch: dict[str, Any], batch_idx: int) -> torch.Tensor:
        self.batches_seen += 1
        return self.weight * batch["attention_mask"].float().mean()

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.lr)
