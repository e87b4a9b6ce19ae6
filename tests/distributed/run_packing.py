"""Packed micro-batches (``micro_batch_tokens``) on 2 CPU processes, for
tests/distributed/test_packing_distributed.py:

    python -m tests.distributed.run_packing MODE OUT_PREFIX     # MODE: ddp | zero3

Rank 0's prompts are short and rank 1's long (each rank its own loader), so their token-budget
plans hold different numbers of micro-batches; the ranks must still run the same number of
forward passes (ZeRO-3 gathers the weights inside every one). Every rank writes
OUT_PREFIX.rank<r>.json: its micro-batches (padding ones counted apart), the prompts it saw and
the optimizer steps taken, and under DDP OUT_PREFIX.rank<r>.pt: the weights after the step.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch

from lit_rlhf.models import load_tokenizer, resolve
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.strategies import CPUDeepSpeedStrategy, shutdown_distributed
from lit_rlhf.training.ppo_update import PPOUpdate
from tests.helpers import prompt_loader
from tests.modules.test_ppo import DigitsReward

LONG = "Using the numbers in the list below, write an equation that equals the target " * 3
# each rank's own prompts (no distributed sampler): rank 0 the short ones, rank 1 the long ones
PROMPTS = [["1 2", "3 4"], [LONG + "1", LONG + "2"]]


def main(mode: str, out: Path) -> None:
    torch.manual_seed(0)
    model = resolve("builtin:tiny-llama")
    tokenizer = load_tokenizer(model)
    module = PPOModule(
        reward=DigitsReward(),
        model=model,
        tokenizer=tokenizer,
        engine=HFGenerationEngine(max_new_tokens=8),
        rollout={"samples_per_prompt": 4},
        optim={"lr": 1e-3},
        update={"micro_batch_tokens": 100},
    )
    calls: list[bool] = []
    prompts: set[str] = set()
    plan = PPOUpdate.micro_batches

    def counted(self: PPOUpdate, index: torch.Tensor, **kwargs: Any) -> list[Any]:
        micro = plan(self, index, **kwargs)
        calls.extend(bool(mb.padding) for mb in micro)
        prompts.update(self.experience.rollout.prompts[int(r)][:8] for r in index)
        return micro

    PPOUpdate.micro_batches = counted  # type: ignore[method-assign]
    strategy: Any = CPUDeepSpeedStrategy(stage=3) if mode == "zero3" else "ddp"
    trainer = L.Trainer(
        accelerator="cpu", devices=2, max_epochs=1, limit_train_batches=1, strategy=strategy,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False, use_distributed_sampler=False,
    )  # fmt: skip
    # Lightning's launcher sets LOCAL_RANK in the processes it starts (rank 0 is this one)
    prompts_of_rank = PROMPTS[int(os.environ.get("LOCAL_RANK", 0))]
    try:
        trainer.fit(module, prompt_loader(tokenizer, prompts_of_rank, 2))
    finally:
        shutdown_distributed()
    rank = trainer.global_rank
    summary = {
        "micro_batches": len(calls),
        "padding": sum(calls),
        "steps": trainer.global_step,
        "prompts": sorted(prompts),
    }
    out.with_suffix(f".rank{rank}.json").write_text(json.dumps(summary))
    if mode == "ddp":
        weights = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
        torch.save(weights, out.with_suffix(f".rank{rank}.pt"))


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
