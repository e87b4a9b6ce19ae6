"""PPO with DAPO's dynamic sampling under Lightning DDP on 2 CPU processes, for
tests/distributed/test_dapo_ddp.py:

    python -m tests.distributed.run_dapo OUT_PREFIX

Every rank writes OUT_PREFIX.rank<r>.json: for each update, the number of samples, of groups,
whether every group's rewards differ; and the trainer's optimizer steps.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import lightning as L

from lit_rlhf.models import load_tokenizer, resolve
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.strategies import shutdown_distributed
from tests.helpers import prompt_loader
from tests.training.test_dapo_dynamic_sampling import G, HalfConstantReward, _groups_differ

PROMPTS = [f"Using the numbers [{i}, {i + 3}]" for i in range(32)]
PER_RANK = 2  # prompts per rank and batch: an update needs 2 informative groups on each rank


def main(out: Path) -> None:
    model = resolve("builtin:tiny-llama")
    tokenizer = load_tokenizer(model)
    module = PPOModule(
        reward=HalfConstantReward(), model=model, tokenizer=tokenizer,
        engine=HFGenerationEngine(max_new_tokens=8), optim={"lr": 1e-3, "micro_batch_size": 4},
        rollout={"samples_per_prompt": G, "dynamic_sampling": True,
                 "dynamic_sampling_max_rounds": 8},
    )  # fmt: skip
    updates: list[dict] = []
    prepare = module.prepare_update

    def recording(rollout):
        updates.append({"samples": len(rollout), "groups": int(rollout.group_ids.unique().numel()),
                        "differ": _groups_differ(rollout)})  # fmt: skip
        return prepare(rollout)

    module.prepare_update = recording  # type: ignore[method-assign]
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, limit_train_batches=6,
        logger=False, enable_checkpointing=False, enable_progress_bar=False,
        enable_model_summary=False,
    )  # fmt: skip
    try:
        trainer.fit(module, prompt_loader(tokenizer, PROMPTS, PER_RANK))
    finally:
        shutdown_distributed()
    summary = {"updates": updates, "global_step": trainer.global_step}
    out.with_suffix(f".rank{trainer.global_rank}.json").write_text(json.dumps(summary))


if __name__ == "__main__":
    main(Path(sys.argv[1]))
