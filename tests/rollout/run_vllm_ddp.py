"""``python -m tests.rollout.run_vllm_ddp OUT [CLI ARGS...]``: ``lit-rlhf fit`` of the tiny vLLM
config under the DDP fragment (or what CLI ARGS compose after it, e.g. the CPU ZeRO-3 fragment),
then, on every rank, greedy output of that rank's vLLM engine against transformers on the trained
policy, for prompts of its own (rank 0 three, rank 1 one: a tensor-parallel group must hand each
rank back exactly its own); each rank writes ``OUT.rank<r>.json``.

Run from the repository root: Lightning's ddp launcher re-runs this command line for rank 1.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from lit_rlhf.cli import cli_main
from lit_rlhf.models.partitioned import gathered
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.strategies import shutdown_distributed

CONFIGS = Path(__file__).parents[2] / "configs"
PROMPTS = ["hello there", "Using the numbers [1, 2]", "The quick brown fox", "What is 15 + 27?"]


def main(out: str, extra: list[str]) -> None:
    cli = cli_main(
        [
            "fit",
            "--config",
            str(CONFIGS / "ppo" / "countdown_tiny_vllm.yaml"),
            "--config",
            str(CONFIGS / "trainer" / "ddp.yaml"),
            "--trainer.fast_dev_run=true",
            # digits vary in random text, so advantages are non-zero and the weights move
            "--model.init_args.reward=lit_rlhf.rewards.DigitFractionReward",
            "--model.init_args.eval.pass_metric=null",  # that reward has no `correct` info
            *extra,
        ]
    )
    module = cli.model
    engine, policy, tokenizer = module.engine, module.policy, module.tokenizer
    # FSDP2: read before the forwards below (the root's parameters stay unsharded after one)
    sharded = all(isinstance(p, DTensor) for p in policy.parameters())
    own = PROMPTS[:3] if dist.get_rank() == 0 else PROMPTS[3:]
    batch = tokenizer(own, return_tensors="pt", padding=True)
    hf = HFGenerationEngine(max_new_tokens=engine.max_new_tokens)
    ref = hf.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    got = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
    diff = (got.log_probs - ref.log_probs)[got.response_mask].abs().max()
    with gathered(*policy.parameters()):  # ZeRO-3: full-size (a collective), else a no-op
        full = [p.full_tensor() if isinstance(p, DTensor) else p for p in policy.parameters()]
        weights = torch.cat([p.detach().flatten() for p in full])
    result = {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "rollout_step": module.rollout_step,
        "last_sync_tensors": engine.last_sync_tensors,
        "last_sync_buckets": engine.last_sync_buckets,
        "partitioned": hasattr(next(policy.parameters()), "ds_id"),
        "sharded": sharded,
        "strategy": type(cli.trainer.strategy).__name__,
        "tensor_parallel_size": engine.tensor_parallel_size,
        "prompts": len(own),
        "responses": len(got.response_ids),
        "n_params": len(list(policy.parameters())),
        "tokens_equal": bool(torch.equal(got.response_ids, ref.response_ids)),
        "max_log_prob_diff": float(diff),
        "weights_sum": float(weights.double().sum()),
    }
    Path(f"{out}.rank{result['rank']}.json").write_text(json.dumps(result))
    module.close()
    shutdown_distributed()


if __name__ == "__main__":
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    main(sys.argv[1], sys.argv[2:])
