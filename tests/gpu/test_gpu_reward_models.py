"""GPU paths of the reward models (run by scripts/gpu_check.sh): the judge (RFT, ConsistRM with
the critique embedder, ReflectRM with reflective validation), the Bradley-Terry reward model and
PPO scored by a scalar reward model or a judge, each one bf16-mixed fast_dev_run on CUDA through
the CLI configs."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.cli import cli_main

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize(
    ("config", "extra"),
    [
        ("configs/grm/rft_tiny.yaml", []),
        ("configs/grm/consistrm_tiny.yaml", []),
        ("configs/rm/bt_tiny.yaml", []),
        ("configs/ppo/chat_rm_tiny.yaml", ["--model.init_args.reward.init_args.device=cuda"]),
        ("configs/grm/reflectrm_tiny.yaml", []),  # validation by reflective inference
        ("configs/ppo/chat_judge_tiny.yaml", ["--model.init_args.reward.init_args.device=cuda"]),
    ],
)
def test_reward_model_configs_on_cuda(config: str, extra: list[str], tmp_path) -> None:
    cli = cli_main(
        [
            "fit",
            "--config",
            config,
            "--trainer.accelerator=cuda",
            "--trainer.devices=1",
            "--trainer.precision=bf16-mixed",
            "--trainer.fast_dev_run=true",
            f"--trainer.default_root_dir={tmp_path}",
            *extra,
        ]
    )
    assert cli.trainer.state.finished
    params = next(iter(cli.model.parameters()))
    assert params.device.type == "cuda"
