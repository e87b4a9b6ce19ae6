"""FSDP2 distributed checkpoints (torch DCP folders) that reshard and survive a kill: written by
2 processes, resumed by 1 (weights exactly, AdamW's state shown by the next epoch ending where
the uninterrupted run's does), read by the CLI's checkpoint checks and ``lit-rlhf export``, and
left whole when a save is killed before its folder is in place.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import pytest
import torch

from lit_rlhf.cli.export_weights import read_checkpoint
from tests.distributed.launch import run_python, step_checkpoint_fit
from tests.distributed.test_ppo_distributed import STEPS, assert_weights_close, run_ppo

pytestmark = pytest.mark.distributed


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_a_checkpoint_of_two_processes_resumes_in_one_and_survives_a_killed_save(
    tiny_model_dir, tmp_path
):
    # about 30 s: one 2-process epoch, the single-process reference, the 1-process resume
    ckpt = tmp_path / "epoch0.ckpt"
    first = run_ppo(tmp_path, "first", "fsdp2", 2, "--save-checkpoint", str(ckpt))
    assert torch.load(ckpt / "meta.pt", weights_only=True)["world_size"] == 2
    assert not list(tmp_path.glob(".epoch0.ckpt.*"))  # the staging folder was renamed
    single = run_ppo(tmp_path, "single", "plain", 1, "--epochs", "2")
    before = _digest(ckpt)
    # one process takes the checkpoint on, then dies while saving over it
    again = ["--epochs", "2", "--resume", str(ckpt), "--save-checkpoint", str(ckpt)]
    out = tmp_path / "resumed.json"
    run_python(
        "-m", "tests.distributed.run_ppo", "fsdp2", "1", str(STEPS), str(out), *again,
        "--kill-in-save", expect_failure=True,
    )  # fmt: skip
    resumed = {tag: torch.load(f"{out}.{tag}.rank0.pt") for tag in ("init", "epoch1")}
    assert_weights_close(resumed["init"], first["weights"]("epoch0"), atol=0.0)
    # the optimizer state came back resharded: the second epoch ends where one uninterrupted
    # process's does (within the 2-process tolerance of test_ppo_distributed)
    assert_weights_close(resumed["epoch1"], single["weights"]("epoch1"))
    # the killed save left its shards in the staging folder and the checkpoint untouched
    assert (tmp_path / ".epoch0.ckpt.partial" / ".metadata").is_file()
    assert _digest(ckpt) == before
    state, hparams = read_checkpoint(str(ckpt))  # export's reader, no process group
    trained = {k: v for k, v in state.items() if k in first["weights"]("epoch0")}
    assert_weights_close(trained, first["weights"]("epoch0"), atol=0.0)
    assert hparams["update"]["ppo_epochs"] == 2  # the module's settings, from meta.pt


def test_the_cli_resumes_an_fsdp2_folder_on_one_process_and_exports_it(tiny_model_dir, tmp_path):
    # a user's path: fit on 2 processes (a DCP folder per checkpoint), resume on 1, export
    from transformers import AutoModelForCausalLM

    fit = step_checkpoint_fit("cpu_fsdp2", tmp_path)
    run_python(*fit, "--trainer.max_steps=1")  # a mid-epoch checkpoint (1 of 4 batches)
    folder = tmp_path / "ckpt" / "epoch=0-step=1.ckpt"
    assert folder.is_dir() and (folder / ".metadata").is_file()
    # on one process: the loader position (8 prompts on 2 ranks) is rescaled, one more step
    run_python(*fit, "--trainer.devices=1", "--trainer.max_steps=2", f"--ckpt_path={folder}")
    resumed = tmp_path / "ckpt" / "epoch=0-step=2.ckpt"
    assert torch.load(resumed / "meta.pt", weights_only=True)["world_size"] == 1
    out = tmp_path / "export"
    run_python(
        "-m", "lit_rlhf.cli", "export", "--config", "configs/ppo/countdown_tiny.yaml",
        f"--ckpt_path={resumed}", f"--out={out}",
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(out)
    state, _ = read_checkpoint(str(resumed))
    exported = model.state_dict()
    for name, value in exported.items():
        saved = state.get(f"policy.model.{name}", state.get(f"policy.{name}"))
        if saved is not None:
            assert torch.equal(saved.to(value.dtype), value), name
    assert any(f"policy.model.{n}" in state or f"policy.{n}" in state for n in exported)
