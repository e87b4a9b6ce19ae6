"""Gradient communication under DDP on 2 CPU processes, counted by a DDP communication hook,
for tests/distributed/test_no_sync_ddp.py:

    python -m tests.distributed.run_no_sync OUT_PREFIX

One PPO rollout of 4 prompts x 4 samples per rank, one optimizer step of 4 micro-batches of 4.
Every rank writes OUT_PREFIX.rank<r>.json: the all-reduce calls per micro-batch backward and per
optimizer step, and OUT_PREFIX.rank<r>.pt: the weights after the step.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import lightning as L
import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from lit_rlhf.models import load_tokenizer, resolve
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.strategies import shutdown_distributed
from tests.helpers import prompt_loader
from tests.modules.test_ppo import PROMPTS, DigitsReward

CALLS: list[int] = []


def counting_allreduce(state, bucket):  # type: ignore[no-untyped-def]
    # no annotations: DDP checks them and these would be strings (future annotations)
    CALLS.append(1)
    return default_hooks.allreduce_hook(state, bucket)


class CommHook(L.Callback):
    """Lightning registers DDP communication hooks on CUDA only: register it here."""

    def on_train_start(self, trainer: L.Trainer, pl_module: L.LightningModule) -> None:
        trainer.strategy.model.register_comm_hook(None, counting_allreduce)


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
        optim={"lr": 1e-3, "micro_batch_size": 4},
    )
    per_backward: list[int] = []
    backward = module.manual_backward

    def counted(loss: Any, *args: Any, **kwargs: Any) -> None:
        before = len(CALLS)
        backward(loss, *args, **kwargs)
        per_backward.append(len(CALLS) - before)

    module.manual_backward = counted  # type: ignore[method-assign]
    trainer = L.Trainer(
        accelerator="cpu", devices=2, max_epochs=1, limit_train_batches=1, strategy="ddp",
        callbacks=[CommHook()],
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    try:
        trainer.fit(module, prompt_loader(tokenizer, PROMPTS[:8], 4))
    finally:
        shutdown_distributed()
    rank = trainer.global_rank
    summary = {"per_backward": per_backward, "steps": trainer.global_step}
    out.with_suffix(f".rank{rank}.json").write_text(json.dumps(summary))
    weights = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    torch.save(weights, out.with_suffix(f".rank{rank}.pt"))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
