"""GPU paths (run by scripts/gpu_check.sh): a bf16-mixed PPO run on CUDA."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import DigitFractionReward
from lit_rlhf.rollout import HFGenerationEngine
from tests.helpers import prompt_loader

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_ppo_bf16_mixed_on_cuda(tiny_model_dir, tmp_path, advantage):
    tokenizer = load_tokenizer(tiny_model_dir)
    module = PPOModule(
        reward=DigitFractionReward(),
        model=tiny_model_dir,
        tokenizer=tokenizer,
        engine=HFGenerationEngine(max_new_tokens=16),
        advantage={"estimator": advantage},
        optim={"lr": 1e-3},
    )
    trainer = L.Trainer(
        accelerator="cuda",
        devices=1,
        precision="bf16-mixed",
        max_epochs=1,
        limit_train_batches=2,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    prompts = [f"Using the numbers [{i}, {i + 1}]" for i in range(8)]
    trainer.fit(module, prompt_loader(tokenizer, prompts, 4))
    assert module.rollout_step == 2
    assert next(module.policy.parameters()).is_cuda
    assert torch.isfinite(torch.stack([p.sum() for p in module.policy.parameters()])).all()
