"""A plain LightningModule that trains through ``OptimizerStep`` with a gradient-rewriting
callback, under a chosen strategy; prints the result as JSON on its last line.

    python -m tests.training.run_gradient_hook KIND      # KIND: plain | zero2 | zero3

Setup: y = w * x with w a [4] parameter initialised to 1, SGD with lr 1, no clipping, two
micro-batches per step. The callback records the gradient it reads and replaces every gradient
by 0.25, so after one step each weight is exactly 1 - 0.25 = 0.75 whatever the loss was.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader

from lit_rlhf.strategies import CPUDeepSpeedStrategy, shutdown_distributed
from lit_rlhf.training import OptimizerStep

X = torch.tensor([[1.0, 2.0, 3.0, 4.0], [2.0, 0.0, 1.0, 1.0]])  # two micro-batches of one row


class Linear(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.w = nn.Parameter(torch.ones(4))
        self.step_optimizer = OptimizerStep(max_grad_norm=None)

    def configure_model(self) -> None:
        self.step_optimizer.configure(self.trainer.strategy)

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=1.0)

    def training_step(self, batch: Any, batch_idx: int) -> None:
        # loss = sum over rows of 0.5 * (w . x)^2, d/dw = (w . x) x: [10, 20, 30, 40] + [8, 0, 4, 4]
        stats = self.step_optimizer(
            self, self.optimizers(), [0, 1], lambda i: 0.5 * (self.w * X[i]).sum().square()
        )
        self.norm = float(stats["train/grad_norm"])


class ConstantGradient(L.Callback):
    def on_gradients(self, trainer: Any, pl_module: Any, grads: Any) -> dict[str, torch.Tensor]:
        self.seen = {name: grads.get(name).detach().cpu().tolist() for name in grads.names()}
        for name in grads.names():
            grads.set(name, torch.full_like(grads.get(name), 0.25))
        return {"rewritten": torch.tensor(1.0)}


def main(kind: str) -> None:
    strategy: Any = "auto"
    if kind in ("zero2", "zero3"):
        strategy = CPUDeepSpeedStrategy(stage=int(kind[-1]))
    hook = ConstantGradient()
    module = Linear()
    trainer = L.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[hook],
    )
    trainer.fit(module, DataLoader(torch.zeros(1, 1)))
    weights = trainer.strategy.lightning_module.w
    if kind == "zero3":
        import deepspeed

        with deepspeed.zero.GatheredParameters([weights]):
            final = weights.detach().cpu().tolist()
    else:
        final = weights.detach().cpu().tolist()
    print(json.dumps({"seen": hook.seen, "weights": final, "norm": module.norm}))
    shutdown_distributed()


if __name__ == "__main__":
    main(sys.argv[1])
