"""QLoRA on CUDA (run by scripts/gpu_check.sh): a PPO step with the base in 4 bits (NF4,
bitsandbytes) and LoRA adapters; the checkpoint holds the adapters only."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import DigitFractionReward
from lit_rlhf.rollout import HFGenerationEngine
from tests.helpers import prompt_loader, quiet_trainer

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(
        importlib.util.find_spec("bitsandbytes") is None, reason="needs bitsandbytes"
    ),
]


def test_qlora_ppo_step_on_cuda(tmp_path):
    model = "builtin:small-llama"  # hidden sizes that bitsandbytes' 4-bit kernels accept
    tokenizer = load_tokenizer(model)
    module = PPOModule(
        reward=DigitFractionReward(),
        model=model,
        tokenizer=tokenizer,
        engine=HFGenerationEngine(max_new_tokens=8),
        samples_per_prompt=2,
        lr=1e-3,
        kl_coef=0.05,
        lora_rank=8,
        lora_alpha=16,
        quantize="4bit",
    )
    trainer = quiet_trainer(
        tmp_path, accelerator="cuda", devices=1, precision="bf16-mixed", limit_train_batches=2
    )
    prompts = [f"Using the numbers [{i}, {i + 1}]" for i in range(4)]
    trainer.fit(module, prompt_loader(tokenizer, prompts, 2))
    assert module.rollout_step == 2 and module.ref_policy is None
    quantized = [m for m in module.policy.modules() if type(m).__name__ == "Linear4bit"]
    assert quantized, "the base was not loaded in 4 bits"
    trained = [p for n, p in module.policy.named_parameters() if "lora_B" in n]
    assert trained and any(p.abs().sum() > 0 for p in trained)
    assert all(p.dtype == torch.float32 for p in module.policy.parameters() if p.requires_grad)
    ckpt = tmp_path / "qlora.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=False)["state_dict"]
    assert saved and all(".lora_" in key for key in saved)
