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
from lit_rlhf.cli.log_folder import continue_log_folders, logged_batches, unlogged_row
from lit_rlhf.training.run_checkpoint import UNLOGGED_ROW, without_periodic


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


def _fit(callback: ModelCheckpoint, root: Path, batches: int = 4, logger=False) -> list[str]:
    trainer = Trainer(
        default_root_dir=root, max_epochs=1, limit_train_batches=batches, logger=logger,
        callbacks=[callback], enable_progress_bar=False, enable_model_summary=False,
        log_every_n_steps=1,
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


def test_each_batch_end_checkpoint_carries_the_row_lightning_logs_after_it(tmp_path):
    logger = CSVLogger(tmp_path, name="run", version=0)
    callback = PeriodicCheckpoint(every_n_train_steps=4, dirpath=tmp_path / "checkpoints")
    _fit(callback, tmp_path, batches=5, logger=logger)
    logged = {
        r["step"]: r
        for r in csv.DictReader((tmp_path / "run" / "version_0" / "metrics.csv").open())
    }
    folder = tmp_path / "checkpoints"
    for name, step in (("step=6.ckpt", 1), ("step=9.ckpt", 2), ("step=12.ckpt", 3)):
        row = unlogged_row(torch.load(folder / name, weights_only=True))
        assert row is not None and row["step"] == step and row["epoch"] == 0
        assert row["loss"] == pytest.approx(float(logged[str(step)]["loss"]))  # the same row
    end = torch.load(folder / "last.ckpt", weights_only=True)  # saved after fit: nothing pending
    assert end["global_step"] == 15 and UNLOGGED_ROW not in end


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


def _write_rows(path: Path, fields: list[str], rows: list[dict]) -> None:
    with path.open("w", newline="") as file:
        writer = csv.DictWriter(file, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)


def test_the_resumed_csv_gets_back_the_row_a_kill_after_the_save_lost(tmp_path):
    run = tmp_path / "runs" / "demo" / "version_0"
    (run / "checkpoints").mkdir(parents=True)
    rows = [{"loss": str(0.1 * s), "step": str(s)} for s in range(3)]  # killed before row 3
    _write_rows(run / "metrics.csv", ["loss", "step"], [*rows, {"step": "3"}])  # no loss: other
    row = {"loss": 0.3, "reward/mean": 0.5, "epoch": 0, "step": 3}
    ckpt = str(run / "checkpoints" / "last.ckpt")
    logger = CSVLogger(tmp_path / "runs", name="demo")
    assert continue_log_folders(_Trainer(logger), ckpt, 4, row) == [str(run)]
    logger.log_metrics({"loss": 9.0}, step=4)
    logger.save()
    back = list(csv.DictReader((run / "metrics.csv").open()))
    assert [(r["step"], r["loss"]) for r in back] == [
        ("0", "0.0"),
        ("1", "0.1"),
        ("2", "0.2"),
        ("3", ""),
        ("3", "0.3"),
        ("4", "9.0"),
    ]
    assert back[4]["reward/mean"] == "0.5"  # a column the file did not have yet
    again = CSVLogger(tmp_path / "runs", name="demo")  # resumed once more from the same step
    continue_log_folders(_Trainer(again), ckpt, 4, row)
    steps = [r["step"] for r in csv.DictReader((run / "metrics.csv").open())]
    assert steps == ["0", "1", "2", "3", "3"]  # the row is not written twice


def test_a_checkpoint_outside_the_loggers_runs_or_a_set_version_is_left_alone(tmp_path):
    elsewhere = CSVLogger(tmp_path / "runs", name="demo")
    assert continue_log_folders(_Trainer(elsewhere), str(tmp_path / "x" / "last.ckpt"), 2) == []
    fixed = CSVLogger(tmp_path / "runs", name="demo", version="mine")
    ckpt = tmp_path / "runs" / "demo" / "version_0" / "checkpoints" / "last.ckpt"
    assert continue_log_folders(_Trainer(fixed), str(ckpt), 2) == []
    assert fixed.version == "mine"


def test_lightnings_own_checkpoint_carries_the_row_with_unlogged_row(tmp_path):
    """Lightning's ModelCheckpoint has the same race (it saves in on_train_batch_end too);
    UnloggedRow, which every lit-rlhf module returns from configure_callbacks, closes it there.
    Without it no row travels."""
    from lit_rlhf.callbacks import UnloggedRow
    from lit_rlhf.training.model_hooks import module_callbacks

    assert any(isinstance(c, UnloggedRow) for c in module_callbacks())
    for extra, carried in (([UnloggedRow()], True), ([], False)):
        root = tmp_path / str(carried)
        saver = ModelCheckpoint(dirpath=root / "ckpt", every_n_train_steps=3, save_top_k=-1)
        trainer = Trainer(
            default_root_dir=root, max_epochs=1, limit_train_batches=3, log_every_n_steps=1,
            logger=CSVLogger(root, name="run", version=0), callbacks=[saver, *extra],
            enable_progress_bar=False, enable_model_summary=False,
        )  # fmt: skip
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # Lightning's manual-optimisation warning
            trainer.fit(ThreeStepsPerBatch())
        saved = torch.load(root / "ckpt" / "epoch=0-step=3.ckpt", weights_only=True)
        row = unlogged_row(saved)
        assert (row is not None) is carried
        if carried:
            logged = list(csv.DictReader((root / "run" / "version_0" / "metrics.csv").open()))
            assert row["step"] == 0 and row["loss"] == pytest.approx(float(logged[0]["loss"]))
