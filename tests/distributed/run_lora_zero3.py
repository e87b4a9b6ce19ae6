"""PPO with LoRA under DeepSpeed ZeRO-3 on 2 CPU processes, for
tests/distributed/test_lora_zero3.py:

    python -m tests.distributed.run_lora_zero3 OUT_PREFIX

Two optimizer steps, then every rank computes the weights an inference engine is sent
(``served_parameters``: each adapted layer's partitions and adapters gathered for the merge, a
collective) and the adapters themselves (gathered); rank 0 writes both to OUT_PREFIX.pt.
"""

from __future__ import annotations

import sys
from pathlib import Path

import lightning as L
import torch

from lit_rlhf.models import load_tokenizer, resolve
from lit_rlhf.models.lora import served_parameters
from lit_rlhf.models.partitioned import gathered
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.strategies import CPUDeepSpeedStrategy, shutdown_distributed
from tests.helpers import prompt_loader
from tests.modules.test_ppo import PROMPTS, DigitsReward


def main(out: Path) -> None:
    torch.manual_seed(0)
    model = resolve("builtin:tiny-llama")
    tokenizer = load_tokenizer(model)
    module = PPOModule(
        reward=DigitsReward(),
        model=model,
        tokenizer=tokenizer,
        engine=HFGenerationEngine(max_new_tokens=8),
        rollout={"samples_per_prompt": 4},
        optim={"lr": 1e-2},
        lora={"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]},
        kl={"coef": 0.1},
    )
    trainer = L.Trainer(
        accelerator="cpu", devices=2, max_epochs=1, limit_train_batches=2,
        strategy=CPUDeepSpeedStrategy(stage=3), logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    try:
        trainer.fit(module, prompt_loader(tokenizer, PROMPTS[:8], 2))
        served = {name: value.clone() for name, value in served_parameters(module.policy)}
        adapters = {}
        for name, param in module.policy.named_parameters():
            with gathered(param):
                if ".lora_" in name or "base_layer.weight" in name:
                    adapters[name] = param.detach().clone()
    finally:
        shutdown_distributed()
    if trainer.global_rank == 0:
        torch.save({"served": served, "params": adapters}, out.with_suffix(".pt"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
