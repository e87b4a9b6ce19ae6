"""MetricsPlot writes its PNG into the run's folder, and nothing under fast_dev_run; proved with a
plain LightningModule that logs one metric."""

from __future__ import annotations

import logging
from pathlib import Path

import lightning as L
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from lit_rlhf.callbacks import MetricsPlot
from tests.helpers import quiet_trainer

STEPS = 4


class LoggingRegression(L.LightningModule):
    """Not one of ours: a one-weight regression that logs its loss as ``train/loss``."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(()))

    def training_step(self, batch: torch.Tensor, batch_idx: int) -> torch.Tensor:
        loss = (self.weight * batch - 1.0).square().mean()
        self.log("train/loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(torch.ones(STEPS, 2), batch_size=1)


def fit(root: Path | None, **trainer_kwargs) -> MetricsPlot:
    plot = MetricsPlot(metrics=["train/loss"], filename="loss.png")
    trainer = quiet_trainer(root, callbacks=[plot], log_every_n_steps=1, **trainer_kwargs)
    trainer.fit(LoggingRegression())
    return plot


def test_png_lands_in_the_csv_logger_version_folder(tmp_path: Path) -> None:
    for version in (0, 1):  # a second run gets its own plot, not one beside the versions
        plot = fit(tmp_path / "root", logger=CSVLogger(tmp_path / "logs", name="run"))
        folder = tmp_path / "logs" / "run" / f"version_{version}"
        assert plot.path == str(folder / "loss.png") and (folder / "loss.png").is_file()
        assert (folder / "metrics.csv").is_file()  # the logger's own files are beside it
        assert len(plot.history["train/loss"]) == STEPS
    assert not (tmp_path / "logs" / "run" / "loss.png").exists()
    assert not (tmp_path / "root").exists()


def test_without_a_logger_png_lands_in_default_root_dir(tmp_path: Path) -> None:
    plot = fit(tmp_path / "root", logger=False)
    assert plot.path == str(tmp_path / "root" / "loss.png")
    assert (tmp_path / "root" / "loss.png").is_file()


def test_fast_dev_run_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.chdir(tmp_path)  # default_root_dir is the working directory
    with caplog.at_level(logging.INFO):
        plot = fit(None, logger=True, fast_dev_run=True)
    assert plot.path is None and len(plot.history["train/loss"]) == 1
    assert list(tmp_path.iterdir()) == []
    assert "fast_dev_run, so loss.png is not written" in caplog.text
