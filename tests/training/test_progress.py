"""PlainProgress: one line per training step with the bar's metrics, seconds per step and the
ETA when stdout is not a terminal; nothing on a terminal."""

from __future__ import annotations

import io
import re

import lightning as L
import torch
from torch.utils.data import DataLoader

from lit_rlhf.training.progress import PlainProgress


class _Module(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).pow(2).mean()
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def _fit(stream, **trainer_args) -> str:
    trainer = L.Trainer(
        accelerator="cpu", callbacks=[PlainProgress(stream)], logger=False,
        enable_checkpointing=False, enable_model_summary=False, enable_progress_bar=False,
        **trainer_args,
    )  # fmt: skip
    trainer.fit(_Module(), DataLoader(torch.randn(8, 2), batch_size=2))
    return stream.getvalue()


def test_one_line_per_step_with_the_bar_metrics_and_the_eta_when_not_a_terminal():
    lines = _fit(io.StringIO(), max_epochs=2).splitlines()
    assert len(lines) == 8  # 4 batches x 2 epochs
    pattern = r"lit-rlhf: step (\d+)/8 \| loss [-0-9.e]+ \| [0-9.]+ s/step \| ETA \d+m\d\ds"
    assert [int(re.fullmatch(pattern, line).group(1)) for line in lines] == list(range(1, 9))


def test_max_steps_bounds_the_total_and_a_terminal_gets_nothing():
    assert _fit(io.StringIO(), max_steps=3).splitlines()[-1].startswith("lit-rlhf: step 3/3 |")
    assert _fit(_Terminal(), max_steps=3) == ""
