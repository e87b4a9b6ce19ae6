"""PlainProgress: lines with the bar's metrics, seconds per step and the ETA when stdout is not a
terminal (the first step, the last, at most one per ``min_interval`` seconds between); nothing
on a terminal."""

from __future__ import annotations

import io
import re

import lightning as L
import pytest
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


class _StopAt(L.Callback):
    def __init__(self, step: int) -> None:
        self.step = step

    def on_train_batch_end(self, trainer, *args) -> None:
        trainer.should_stop = trainer.should_stop or trainer.global_step >= self.step


def _fit(stream, min_interval: float = 0.0, stop: list | None = None, **trainer_args) -> str:
    callbacks = [PlainProgress(stream, min_interval=min_interval), *(stop or [])]
    trainer = L.Trainer(
        accelerator="cpu", callbacks=callbacks, logger=False,
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


def test_fast_steps_print_the_first_and_the_last_line_only():
    lines = _fit(io.StringIO(), min_interval=60.0, max_epochs=2).splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["lit-rlhf: step 1/8", "lit-rlhf: step 8/8"]


def test_a_run_stopped_before_its_bound_still_prints_its_last_step():
    lines = _fit(io.StringIO(), min_interval=60.0, stop=[_StopAt(3)], max_steps=6).splitlines()
    assert [line.split(" | ")[0] for line in lines] == ["lit-rlhf: step 1/6", "lit-rlhf: step 3/6"]


def test_a_negative_interval_is_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"min_interval=-1.*must be >= 0"):
        PlainProgress(min_interval=-1)
