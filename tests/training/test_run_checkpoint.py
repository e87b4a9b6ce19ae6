"""PeriodicCheckpoint (``last.ckpt`` and every N optimizer steps, under manual optimisation with
several optimizer steps per batch) and the resumed run's log folder (lit_rlhf.cli.log_folder)."""

from __future__ import annotations

import csv
import warnings
from pathlib import Path

import pytest
import torch
from lightning import LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger
from torch.utils.data import DataLoader

from lit_rlhf.callbacks import PeriodicCheckpoint
from lit_rlhf.cli.app import LitRLHFTrainer
from lit_rlhf.cli.log_folder import continue_log_folders, logged_batches
from lit_rlhf.training.run_checkpoint import without_periodic


class ThreeStepsPerBatch(LightningModule):
    """Manual optimisation, three optimizer steps per training batch (a PPO batch's epochs x
    mini-batches)."""

    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        optimizer = self.optimizers()
        for _ in range(3):
            optimizer.zero_grad()
            self.manual_backward(self.layer(batch).pow(2).mean())
            optimizer.step()
        self.log("loss", self.layer(batch).pow(2).mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(torch.randn(5, 2), batch_size=1)


def _fit(callback: ModelCheckpoint, root: Path, batches: int = 4) -> list[str]:
    trainer = Trainer(
        default_root_dir=root, max_epochs=1, limit_train_batches=batches, logger=False,
        callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # Lightning's manual-optimisation warning
        warnings.filterwarnings("ignore", message=".*does not have many workers.*")
        trainer.fit(ThreeStepsPerBatch())
    return sorted(p.name for p in (root / "checkpoints").iterdir())


def test_a_batch_that_crosses_the_interval_saves_and_last_holds_the_end(tmp_path):
    # optimizer steps after each batch: 3, 6, 9, 12, 15; interval 4 is crossed at 6, 9, 12
    names = _fit(PeriodicCheckpoint(every_n_train_steps=4), tmp_path / "p", batches=5)
    assert names == ["last.ckpt", "step=12.ckpt", "step=15.ckpt", "step=6.ckpt", "step=9.ckpt"]
    last = torch.load(tmp_path / "p" / "checkpoints" / "last.ckpt", weights_only=True)
    assert last["global_step"] == 15  # the end of fit, not the last multiple


def test_lightnings_own_checkpoint_misses_the_steps_it_jumps_over(tmp_path):
    callback = ModelCheckpoint(every_n_train_steps=4, save_top_k=-1, save_last=True)
    trainer = Trainer(
        default_root_dir=tmp_path, max_epochs=1, limit_train_batches=5, logger=False,
        callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    with pytest.warns(UserWarning, match="manual optimization and every_n_train_steps"):
        trainer.fit(ThreeStepsPerBatch())
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["epoch=0-step=12.ckpt", "last.ckpt"]  # 4 and 8 were jumped over


def test_the_k_newest_are_kept(tmp_path):
    names = _fit(PeriodicCheckpoint(every_n_train_steps=3, save_top_k=2), tmp_path / "k")
    assert names == ["last.ckpt", "step=12.ckpt", "step=9.ckpt"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"every_n_train_steps": 0}, "must be >= 1"),
        ({"every_n_train_steps": -2}, "must be >= 1"),
        ({"every_n_train_steps": 2.5}, "must be an integer"),
        ({"every_n_train_steps": True}, "must be an integer"),
        ({"save_last": False}, "cannot be resumed by name"),
    ],
)
def test_settings_that_would_leave_no_resumable_checkpoint_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PeriodicCheckpoint(**kwargs)


def test_enable_checkpointing_false_leaves_the_configs_periodic_checkpoint_out(tmp_path):
    periodic = PeriodicCheckpoint(every_n_train_steps=2)
    assert without_periodic([periodic, "other"]) == ["other"] and without_periodic(None) is None
    trainer = LitRLHFTrainer(
        enable_checkpointing=False, callbacks=[periodic], default_root_dir=tmp_path, logger=False
    )
    assert not [c for c in trainer.callbacks if isinstance(c, ModelCheckpoint)]


def _loop_state(stepped: int, completed: int, processed: int) -> dict:
    total = {"ready": processed, "started": processed, "processed": processed}
    return {
        "loops": {
            "fit_loop": {
                "epoch_loop.state_dict": {"_batches_that_stepped": stepped},
                "epoch_loop.batch_progress": {"total": {**total, "completed": completed}},
            }
        }
    }


def test_the_first_step_a_resumed_run_logs():
    assert logged_batches(_loop_state(5, 5, 6)) == 6  # saved at a batch's end: batch 5 is done
    assert logged_batches(_loop_state(6, 6, 6)) == 6  # saved after the batch's count went up
    assert logged_batches({}) is None


class _Trainer:
    is_global_zero = True

    def __init__(self, logger: CSVLogger) -> None:
        self.loggers = [logger]


def test_the_resumed_csv_keeps_the_rows_before_the_checkpoint(tmp_path):
    run = tmp_path / "runs" / "demo" / "version_3"
    (run / "checkpoints").mkdir(parents=True)
    with (run / "metrics.csv").open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=["loss", "step"])
        writer.writeheader()
        writer.writerows({"loss": str(0.1 * s), "step": str(s)} for s in range(6))
    logger = CSVLogger(tmp_path / "runs", name="demo")
    folders = continue_log_folders(_Trainer(logger), str(run / "checkpoints" / "last.ckpt"), 4)
    assert folders == [str(run)] and logger.version == 3
    logger.log_metrics({"loss": 9.0}, step=4)
    logger.save()
    rows = list(csv.DictReader((run / "metrics.csv").open()))
    assert [r["step"] for r in rows] == ["0", "1", "2", "3", "4"] and rows[-1]["loss"] == "9.0"
    assert (run / "metrics.csv.before-resume").is_file()  # the dropped rows are kept aside


def test_a_checkpoint_outside_the_loggers_runs_or_a_set_version_is_left_alone(tmp_path):
    elsewhere = CSVLogger(tmp_path / "runs", name="demo")
    assert continue_log_folders(_Trainer(elsewhere), str(tmp_path / "x" / "last.ckpt"), 2) == []
    fixed = CSVLogger(tmp_path / "runs", name="demo", version="mine")
    ckpt = tmp_path / "runs" / "demo" / "version_0" / "checkpoints" / "last.ckpt"
    assert continue_log_folders(_Trainer(fixed), str(ckpt), 2) == []
    assert fixed.version == "mine"
