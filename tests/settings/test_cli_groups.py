"""Settings groups through the CLI, as a user writes them: a module of the user's own (in a
folder outside the repository) that takes lit-rlhf's ``OptimSettings`` group, run by
``python -m lit_rlhf.cli`` in a subprocess. A group field is set from the command line and
merged from a config; an abbreviation and a typo are refused with the key named."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

USER_MODULE = '''
import torch
from lightning import LightningDataModule, LightningModule
from torch.utils.data import DataLoader, TensorDataset

from lit_rlhf.settings import OptimSettings

_OPTIM = OptimSettings(lr=0.05, micro_batch_size=None)


class Regression(LightningModule):
    """A user's module that takes lit-rlhf's optimisation group.

    Args:
        optim: lit-rlhf's optimisation settings.
    """

    def __init__(self, optim: OptimSettings = _OPTIM) -> None:
        super().__init__()
        self.optim = OptimSettings.coerce(optim, _OPTIM)
        print("OPTIM", self.optim.lr, self.optim.lr_schedule, self.optim.lr_total_steps)
        self.layer = torch.nn.Linear(2, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.optim.lr)


class Points(LightningDataModule):
    def train_dataloader(self):
        x = torch.randn(8, 2)
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=4)
'''
CONFIG = """
model:
  class_path: user_module.Regression
  init_args:
    optim: {lr_schedule: cosine}
data: user_module.Points
trainer: {fast_dev_run: true, accelerator: cpu, logger: false, enable_checkpointing: false}
"""


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    (tmp_path / "user_module.py").write_text(USER_MODULE)
    (tmp_path / "run.yaml").write_text(CONFIG)
    return tmp_path


def _cli(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(folder), "HF_HUB_OFFLINE": "1"}
    cmd = [sys.executable, "-m", "lit_rlhf.cli", "fit", "--config", "run.yaml", *args]
    return subprocess.run(cmd, cwd=folder, env=env, capture_output=True, text=True, timeout=240)


def test_a_group_field_from_the_command_line_merges_with_the_config(user_folder: Path) -> None:
    done = _cli(user_folder, "--model.init_args.optim.lr_total_steps=7")
    assert done.returncode == 0, done.stderr[-3000:]
    # the module's default lr, the config's schedule, the command line's total
    assert "OPTIM 0.05 cosine 7" in done.stdout


def test_an_abbreviated_group_field_is_refused(user_folder: Path) -> None:
    done = _cli(user_folder, "--model.init_args.optim.lr_total=7")
    assert done.returncode == 2, done.stdout[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    # jsonargparse would complete it to lr_total_steps
    wanted = "unrecognized arguments: --model.init_args.optim.lr_total (an abbreviation of "
    assert wanted + "--model.init_args.optim.lr_total_steps" in last
    assert "OPTIM" not in done.stdout  # refused before the module was built


def test_an_abbreviated_trainer_option_is_refused(user_folder: Path) -> None:
    # jsonargparse would complete it to --trainer.max_epochs
    done = _cli(user_folder, "--trainer.max_epoch=2")
    assert done.returncode == 2, done.stdout[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert (
        "unrecognized arguments: --trainer.max_epoch (an abbreviation of --trainer.max_epochs"
        in last
    )


def test_a_misspelt_group_field_in_a_config_is_refused_with_the_key(user_folder: Path) -> None:
    (user_folder / "run.yaml").write_text(CONFIG.replace("lr_schedule", "lr_shedule"))
    done = _cli(user_folder)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith(
        "error: model.init_args.optim.lr_shedule: Group 'optim' does not accept option 'lr_shedule'"
    )
    assert "did you mean optim.lr_schedule?" in last


def test_a_bad_group_value_is_refused_with_its_dotted_key(user_folder: Path) -> None:
    done = _cli(user_folder, "--model.init_args.optim.lr=-1")
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert re.match(r"lit-rlhf: error: optim\.lr=-1(\.0)? must be > 0 and finite", last), last
