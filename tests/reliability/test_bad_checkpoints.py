"""``--ckpt_path`` given something that is not this run's checkpoint (issue [3/5]): every case
ends with one message naming the path and the cause, as the last line the user reads, before
any model loads. Real checkpoints are stood in for by what the CLI reads of them: the
``hyper_parameters`` of a ``torch.save`` file, and the layout of a DeepSpeed folder (a real
ZeRO-3 folder of another model: ``tests/distributed/test_ckpt_zero3_folder.py``)."""

from __future__ import annotations

import re
import traceback
from pathlib import Path
from typing import Any

import pytest
import torch

from lit_rlhf.cli import LitRLHFCLI, cli_main
from lit_rlhf.cli.checkpoints import CheckpointError

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "ppo" / "countdown_tiny.yaml")
PPO = "lit_rlhf.modules.PPOModule"


def _fake_checkpoint(path: Path, hparams: dict[str, Any], class_path: str | None = PPO) -> str:
    saved = {**({"_class_path": class_path} if class_path else {}), **hparams}
    torch.save({"hyper_parameters": saved}, path)
    return str(path)


def _last_line(error: BaseException) -> str:
    return "".join(traceback.format_exception(error)).strip().splitlines()[-1]


def _refused(args: list[str], message: str, error: type = CheckpointError) -> None:
    with pytest.raises(error, match=message) as info:
        cli_main(args)
    assert re.search(message, _last_line(info.value)), _last_line(info.value)


@pytest.mark.parametrize("damage", ["truncated", "empty", "text"])
def test_corrupt_ckpt_path_names_the_file(tmp_path, damage):
    good = Path(_fake_checkpoint(tmp_path / "good.ckpt", {"lr": 0.5}))
    bad = tmp_path / "bad.ckpt"
    content = {"truncated": good.read_bytes()[: good.stat().st_size // 2], "empty": b"",
               "text": b"epoch: 3\nnot a checkpoint\n"}[damage]  # fmt: skip
    bad.write_bytes(content)
    message = rf"--ckpt_path {re.escape(str(bad))}: not a readable checkpoint .*Fix: pass an intact"
    _refused(["validate", "--config", TINY, f"--ckpt_path={bad}"], message)


def test_another_modules_checkpoint_names_both_classes(tmp_path):
    ckpt = _fake_checkpoint(
        tmp_path / "compressor.ckpt",
        {"num_memory_tokens": 4},
        class_path="lit_rlhf.modules.CompressorDecoderModule",
    )
    message = (
        rf"--ckpt_path {re.escape(ckpt)}: a checkpoint of "
        rf"lit_rlhf.modules.CompressorDecoderModule, but the config's model is {PPO}\. "
        r"Fix: pass a checkpoint of a PPOModule run"
    )
    for subcommand in ("fit", "validate"):
        _refused([subcommand, "--config", TINY, f"--ckpt_path={ckpt}"], message)


def test_another_modules_checkpoint_saved_outside_the_cli_names_its_settings(tmp_path):
    ckpt = _fake_checkpoint(
        tmp_path / "plain.ckpt", {"compressor": "builtin:tiny-llama", "lr": 0.1}, class_path=None
    )
    message = (
        rf"--ckpt_path {re.escape(ckpt)}: a checkpoint of another module: its settings "
        r"\['compressor'\] are not PPOModule's"
    )
    _refused(["fit", "--config", TINY, f"--ckpt_path={ckpt}"], message)


def test_evaluating_another_models_checkpoint_names_the_path_and_both_models(tmp_path):
    ckpt = _fake_checkpoint(tmp_path / "qwen.ckpt", {"model": "builtin:tiny-qwen2"})
    message = (
        rf"--ckpt_path {re.escape(ckpt)}: a checkpoint of other networks than the config's "
        r"\(model: checkpoint 'builtin:tiny-qwen2', config 'builtin:tiny-llama'\)"
    )
    _refused(["validate", "--config", TINY, f"--ckpt_path={ckpt}"], message)


def test_resume_from_another_models_checkpoint_with_the_configs_tokenizer_is_refused(tmp_path):
    ckpt = _fake_checkpoint(tmp_path / "qwen.ckpt", {"model": "builtin:tiny-qwen2"})
    message = (
        rf"--ckpt_path {re.escape(ckpt)}: a run of model 'builtin:tiny-qwen2'.*trains "
        r"'builtin:tiny-llama' with its tokenizer.*Fix: set model\.init_args\.model "
        r"and data\.init_args\.tokenizer"
    )
    _refused(["fit", "--config", TINY, f"--ckpt_path={ckpt}"], message)


def _deepspeed_folder(root: Path, hparams: dict[str, Any], *, drop: str | None = None) -> Path:
    """A folder laid out as DeepSpeed writes one (``latest`` -> tag folder with rank 0's model
    states, which hold Lightning's hyperparameters, and the optimizer states)."""
    root.mkdir()
    (root / "latest").write_text("checkpoint")
    tag = root / "checkpoint"
    tag.mkdir()
    files = {
        "zero_pp_rank_0_mp_rank_00_model_states.pt": {"hyper_parameters": hparams},
        "zero_pp_rank_0_mp_rank_00_optim_states.pt": {"optimizer_state_dict": {}},
    }
    for name, content in files.items():
        if name != drop:
            torch.save(content, tag / name)
    return root


def test_a_deepspeed_folder_of_another_model_names_the_path_and_both_models(tmp_path):
    folder = _deepspeed_folder(
        tmp_path / "zero3", {"_class_path": PPO, "model": "builtin:tiny-qwen2"}
    )
    message = (
        rf"--ckpt_path {re.escape(str(folder))}: a checkpoint of other networks than the "
        r"config's \(model: checkpoint 'builtin:tiny-qwen2', config 'builtin:tiny-llama'\)"
    )
    _refused(["validate", "--config", TINY, f"--ckpt_path={folder}"], message)


@pytest.mark.parametrize(
    ("drop", "message"),
    [
        ("zero_pp_rank_0_mp_rank_00_optim_states.pt", r"which lacks \*optim_states\.pt"),
        ("zero_pp_rank_0_mp_rank_00_model_states.pt", r"which lacks \*model_states\.pt"),
    ],
)
def test_a_deepspeed_folder_without_its_files_says_what_it_lacks(tmp_path, drop, message):
    folder = _deepspeed_folder(tmp_path / "run", {"_class_path": PPO}, drop=drop)
    where = re.escape(str(folder))
    full = rf"--ckpt_path {where}: a DeepSpeed checkpoint folder without its files.*{message}"
    _refused(["fit", "--config", TINY, f"--ckpt_path={folder}"], full)


def test_a_folder_that_is_no_checkpoint_says_what_it_holds(tmp_path):
    folder = tmp_path / "outputs"
    folder.mkdir()
    (folder / "metrics.csv").write_text("step,loss\n")
    message = (
        rf"--ckpt_path {re.escape(str(folder))}: a folder without a checkpoint's files .*it holds "
        r"\['metrics\.csv'\]\)\. Fix: pass the folder DeepSpeed wrote"
    )
    _refused(["validate", "--config", TINY, f"--ckpt_path={folder}"], message)


def test_resume_with_changed_settings_says_the_checkpoints_win(tmp_path, monkeypatch):
    monkeypatch.setattr(LitRLHFCLI, "_run_subcommand", lambda self, subcommand: None)
    saved = {"model": "builtin:tiny-llama", "optim": {"lr": 0.5}}  # a group: one field given
    ckpt = _fake_checkpoint(tmp_path / "run.ckpt", saved)
    with pytest.warns(
        UserWarning,
        match=r"checkpoint's settings replace the config's \(optim\.lr: "
        r"config 0\.001, checkpoint 0\.5\)\. Fix: to train on with new settings",
    ):
        cli = cli_main(["fit", "--config", TINY, f"--ckpt_path={ckpt}"])
    assert cli.model.optim.lr == 0.5
    assert cli.model.optim.micro_batch_size == 8  # the config's value for the fields not saved


def test_a_deepspeed_folder_of_this_run_is_read(tmp_path, monkeypatch):
    monkeypatch.setattr(LitRLHFCLI, "_run_subcommand", lambda self, subcommand: None)
    folder = _deepspeed_folder(
        tmp_path / "zero3", {"_class_path": PPO, "model": "builtin:tiny-llama", "lr": 0.5}
    )
    # written before settings groups (flat lr): regrouped, then compared
    with pytest.warns(UserWarning, match=r"optim\.lr: config 0\.001, checkpoint 0\.5"):
        cli = cli_main(["fit", "--config", TINY, f"--ckpt_path={folder}"])
    assert cli.model.optim.lr == 0.5


@pytest.mark.parametrize(("flags", "expected"), [([], True), (["--weights_only=false"], False)])
def test_ckpt_path_is_loaded_weights_only_unless_the_user_says_otherwise(
    tmp_path, monkeypatch, flags, expected
):
    """The Trainer's load of --ckpt_path unpickles tensors and plain types only (no code)."""
    monkeypatch.setattr(LitRLHFCLI, "_run_subcommand", lambda self, subcommand: None)
    ckpt = _fake_checkpoint(tmp_path / "run.ckpt", {"model": "builtin:tiny-llama"})
    cli = cli_main(["fit", "--config", TINY, f"--ckpt_path={ckpt}", *flags])
    assert cli.config_init["fit"]["weights_only"] is expected
