"""FSDP2 on one CUDA GPU (run by scripts/gpu_check.sh, step 3): the tiny Countdown config under
``configs/trainer/fsdp2.yaml`` (NCCL, bf16-mixed, a world of one) trains two steps and writes a
distributed-checkpoint folder per step; a resume from the first continues to a third step, and
``lit-rlhf export`` turns the last folder into a transformers model that loads."""

from __future__ import annotations

import pytest
import torch

from tests.distributed.launch import run_python, step_checkpoint_fit

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


def test_fsdp2_fragment_trains_resumes_and_exports_on_one_gpu(tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    fit = [*step_checkpoint_fit("fsdp2", tmp_path), "--trainer.devices=1"]
    output = run_python(*fit, "--trainer.max_steps=2")
    assert "distributed_backend=nccl" in output
    first = tmp_path / "ckpt" / "epoch=0-step=1.ckpt"
    assert (first / ".metadata").is_file() and (tmp_path / "ckpt" / "epoch=0-step=2.ckpt").is_dir()
    run_python(*fit, "--trainer.max_steps=3", f"--ckpt_path={first}")
    last = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    assert (last / ".metadata").is_file()
    out = tmp_path / "export"
    run_python(
        "-m", "lit_rlhf.cli", "export", "--config", "configs/ppo/countdown_tiny.yaml",
        f"--ckpt_path={last}", f"--out={out}",
    )  # fmt: skip
    model = AutoModelForCausalLM.from_pretrained(out)
    assert sum(p.numel() for p in model.parameters()) > 0
