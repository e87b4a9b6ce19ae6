"""Checkpoints with settings groups, from the outside: a module built in Python (groups as
dataclasses) saves a checkpoint whose hparams are plain dicts (``weights_only`` loads it), which
the CLI resumes and ``lit-rlhf export`` exports; a checkpoint written with the flat arguments of
before the groups is regrouped by the CLI (with a warning naming the moves) and refused from
Python in one line that names the migration."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from lightning import Trainer

from lit_rlhf.data import SFTDataModule
from lit_rlhf.modules import SFTModule
from lit_rlhf.settings import OptimSettings

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "configs" / "sft" / "tiny.yaml")
SAMPLE = str(ROOT / "lit_rlhf" / "data" / "samples" / "chat_prompts.jsonl")


@pytest.fixture(scope="module")
def python_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One optimizer step of an SFTModule built in Python, saved by the Trainer."""
    folder = tmp_path_factory.mktemp("python_built")
    module = SFTModule(model="builtin:tiny-llama", optim=OptimSettings(lr=1e-3, micro_batch_size=2))
    data = SFTDataModule(
        tokenizer="builtin:tiny-llama", train=SAMPLE, batch_size=4,
        prompt_field="question", response_field="reference",
    )  # fmt: skip
    trainer = Trainer(
        accelerator="cpu", max_steps=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, limit_val_batches=0, default_root_dir=folder,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    path = folder / "python.ckpt"
    trainer.save_checkpoint(path)
    return path


def _cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI run from the repository (the config's data paths are relative to it), writing
    nothing there: no logger, no checkpoints, no export_dir, the root dir in ``cwd``."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    quiet = [f"--trainer.default_root_dir={cwd}", "--trainer.logger=false"]
    cmd = [sys.executable, "-m", "lit_rlhf.cli", *args]
    if args[0] != "export":
        cmd += [*quiet, "--trainer.enable_checkpointing=false", "--model.init_args.export_dir=null"]
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_hparams_are_plain_dicts_that_load_weights_only(python_checkpoint: Path) -> None:
    hparams = torch.load(python_checkpoint, weights_only=True)["hyper_parameters"]
    assert hparams["optim"]["lr"] == 1e-3 and hparams["optim"]["micro_batch_size"] == 2
    assert hparams["precision"] == {
        "dtype": "float32", "reference_dtype": None, "gradient_checkpointing": False,
        "memory_check": "refuse",
    }  # fmt: skip
    rebuilt = SFTModule.load_from_checkpoint(python_checkpoint)
    assert rebuilt.optim == OptimSettings(lr=1e-3, micro_batch_size=2)
    logged = SFTModule(optim=OptimSettings(lr=1e-3)).hparams_initial  # what loggers record
    assert logged["optim"]["lr"] == 1e-3 and isinstance(logged["precision"], dict)


def test_a_python_built_checkpoint_resumes_through_the_cli_and_exports(
    python_checkpoint: Path, tmp_path: Path
) -> None:
    resumed = _cli(
        "fit", "--config", CONFIG, "--ckpt_path", str(python_checkpoint),
        "--trainer.max_steps=2", "--trainer.max_epochs=-1", cwd=tmp_path,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "Restored all states from the checkpoint" in resumed.stderr + resumed.stdout
    exported = _cli(
        "export", "--config", CONFIG, "--ckpt_path", str(python_checkpoint),
        "--out", str(tmp_path / "hf"), cwd=tmp_path,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-4000:]
    assert (tmp_path / "hf" / "config.json").is_file()


def _flat_copy(checkpoint: Path, dest: Path) -> Path:
    """The checkpoint with its hparams written the way lit-rlhf wrote them before groups."""
    saved = torch.load(checkpoint, weights_only=True)
    grouped = saved["hyper_parameters"]
    flat = {k: v for k, v in grouped.items() if not isinstance(v, dict)}
    flat.update(grouped["optim"])
    flat.update(grouped["precision"])
    saved["hyper_parameters"] = flat
    torch.save(saved, dest)
    return dest


def test_an_old_flat_checkpoint_is_regrouped_by_the_cli(
    python_checkpoint: Path, tmp_path: Path
) -> None:
    old = _flat_copy(python_checkpoint, tmp_path / "old.ckpt")
    assert "lr" in torch.load(old, weights_only=True)["hyper_parameters"]
    done = _cli("validate", "--config", CONFIG, "--ckpt_path", str(old), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "written before settings groups; its flat settings were moved into groups" in (
        done.stderr
    )
    assert "lr -> optim.lr" in done.stderr
    exported = _cli(
        "export", "--config", CONFIG, "--ckpt_path", str(old), "--out", str(tmp_path / "hf"),
        cwd=tmp_path,
    )  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-4000:]


def test_an_old_flat_checkpoint_is_refused_from_python_naming_the_migration(
    python_checkpoint: Path, tmp_path: Path
) -> None:
    old = _flat_copy(python_checkpoint, tmp_path / "old.ckpt")
    with pytest.raises(TypeError) as info:
        SFTModule.load_from_checkpoint(old)
    message = str(info.value)
    assert "\n" not in message
    assert "it is now optim." in message and "regroup_flat" in message
