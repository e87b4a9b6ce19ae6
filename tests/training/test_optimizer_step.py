"""``OptimizerStep``: exact micro-batch accumulation, and the gradient hook between backward and
clipping, with and without DeepSpeed (ZeRO-2 in the default run, ZeRO-3 in the ``distributed``
group; one CPU process each, in a subprocess as the DeepSpeed tests do)."""

from __future__ import annotations

import json

import lightning as L
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from lit_rlhf.training import OptimizerStep
from tests.distributed.launch import run_python
from tests.helpers import quiet_trainer


@pytest.mark.parametrize(
    "kind", ["plain", "zero2", pytest.param("zero3", marks=pytest.mark.distributed)]
)
def test_a_callback_rewrites_gradients_before_the_step(kind):
    out = run_python("-m", "tests.training.run_gradient_hook", kind, timeout=240)
    result = json.loads([line for line in out.splitlines() if line.startswith('{"seen"')][-1])
    # d/dw of 0.5 (w.x1)^2 + 0.5 (w.x2)^2 at w = 1: (10) * [1, 2, 3, 4] + (4) * [2, 0, 1, 1]
    assert result["seen"] == {"w": [18.0, 20.0, 34.0, 44.0]}  # the reduced, accumulated gradient
    assert result["weights"] == [0.75, 0.75, 0.75, 0.75]  # 1 - lr 1 x the rewritten 0.25
    assert result["norm"] == pytest.approx(0.5)  # the norm is taken after the hook: |0.25 x 4|


class Regression(L.LightningModule):
    """Least squares on fixed data; the step's micro-batches come from ``split``."""

    def __init__(self, split: int, max_grad_norm: float | None) -> None:
        super().__init__()
        self.automatic_optimization = False
        torch.manual_seed(0)
        self.net = nn.Linear(3, 1)
        self.x, self.y = torch.randn(8, 3), torch.randn(8, 1)
        self.split = split
        self.step_optimizer = OptimizerStep(max_grad_norm=max_grad_norm)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def training_step(self, batch, batch_idx):
        def loss(rows):  # each micro-batch's share of the mean over all 8 rows
            return (self.net(self.x[rows]) - self.y[rows]).square().sum() / len(self.x)

        self.stats = self.step_optimizer(
            self, self.optimizers(), torch.arange(8).split(self.split), loss
        )


@pytest.mark.parametrize("max_grad_norm", [None, 0.05])
def test_micro_batches_accumulate_to_one_pass(tmp_path, max_grad_norm):
    results = []
    for split in (8, 3):  # one micro-batch; three of 3, 3, 2 rows
        module = Regression(split, max_grad_norm)
        quiet_trainer(tmp_path, max_steps=2).fit(module, DataLoader(torch.zeros(2, 1)))
        results.append((module.net.weight.detach().clone(), module.stats["train/grad_norm"]))
    torch.testing.assert_close(results[1][0], results[0][0])
    torch.testing.assert_close(results[1][1], results[0][1])
    if max_grad_norm is not None:  # clipping acted: the pre-clip norm exceeds the limit
        assert float(results[0][1]) > max_grad_norm


def test_settings_are_checked():
    with pytest.raises(ValueError, match="max_grad_norm must be > 0 or None"):
        OptimizerStep(max_grad_norm=-1.0)
    with pytest.raises(ValueError, match="at least one micro-batch"):
        OptimizerStep(max_grad_norm=None)(Regression(8, None), None, [], lambda rows: rows)
