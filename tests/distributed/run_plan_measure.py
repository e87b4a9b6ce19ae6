"""Measure the peak of live tensor bytes of the update phase of a short ``lit-rlhf fit`` on
``builtin:mid-llama``, for the plan's CPU validation (tests/plan/test_plan_cpu_validation.py):

    python -m tests.distributed.run_plan_measure CASE OUT.json

CASE: ``ppo_critic`` (PPO with GAE and a separate critic), ``grm`` (the generative reward
model, RFT), ``mgs`` (PPO with ModularGradientSurgery over three domains), ``zero2`` /
``zero3`` (the PPO case under the CPU DeepSpeed fragments, 2 processes). Two rollouts run, so
the second update runs with the optimizer's states (allocated at the first step). The whole
fit is profiled (:class:`lit_rlhf.plan.tracking.LiveTensorBytes`, baseline: before the
trainer's setup); the update phase is every call of ``PolicyStep.optimize``. Every rank writes
``OUT.rank<r>.json``: the update's peak, the live bytes when the last update starts, and the
shapes of every micro-batch's policy forward (what the prediction is computed for).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from lit_rlhf.cli.app import cli_main
from lit_rlhf.plan.tracking import LiveTensorBytes
from lit_rlhf.strategies import shutdown_distributed
from lit_rlhf.training import policy_step, ppo_update

MODEL = "builtin:mid-llama"
PPO_CONFIG = "--config=configs/ppo/countdown_tiny.yaml"
COMMON = [
    "--trainer.limit_train_batches=2",
    "--trainer.limit_val_batches=0",
    "--trainer.max_epochs=1",
    "--trainer.logger=false",
    "--trainer.enable_checkpointing=false",
    "--trainer.enable_progress_bar=false",
    "--trainer.enable_model_summary=false",
    f"--model.init_args.model={MODEL}",
    f"--data.init_args.tokenizer={MODEL}",
]
PPO = [
    "--trainer.callbacks=[]",  # the Countdown config's reward plot
    "--data.init_args.max_prompt_length=164",  # the longest Countdown prompt: the plan's length
    "--model.init_args.engine.init_args.max_new_tokens=16",
    "--data.init_args.batch_size=2",
    "--model.init_args.optim.micro_batch_size=4",
]
CASES: dict[str, list[str]] = {  # the configs, then the overrides
    "ppo_critic": [PPO_CONFIG, *COMMON, *PPO, "--model.init_args.advantage.estimator=gae"],
    "grm": [
        "--config=configs/grm/rft_tiny.yaml",
        *COMMON,
        "--trainer.callbacks=[]",
        "--data.init_args.max_prompt_length=240",
        "--model.init_args.engine.init_args.max_new_tokens=16",
        "--data.init_args.batch_size=1",
        "--model.init_args.optim.micro_batch_size=4",
    ],
    "mgs": [
        "--config=configs/ppo/multidomain_tiny.yaml",
        *COMMON,
        "--data.init_args.max_prompt_length=240",
        "--model.init_args.engine.init_args.max_new_tokens=16",
        "--data.init_args.batch_size=3",
        "--model.init_args.optim.micro_batch_size=4",
    ],
    "zero2": [PPO_CONFIG, "--config=configs/trainer/cpu_deepspeed_zero2.yaml", *COMMON, *PPO],
    "zero3": [PPO_CONFIG, "--config=configs/trainer/cpu_deepspeed_zero3.yaml", *COMMON, *PPO],
}


@contextmanager
def instrumented(tracker: LiveTensorBytes, shapes: list[dict[str, int]]) -> Iterator[None]:
    """While inside: every ``PolicyStep.optimize`` call is one occurrence of the phase ``update``
    and the update's padded forward records each micro-batch's rows, lengths and distinct
    prompts (the originals are put back on exit)."""
    forward, optimize = ppo_update.forward_response, policy_step.PolicyStep.optimize

    def recorded(model: Any, input_ids: Any, attention_mask: Any, response_ids: Any, **kw: Any):
        r = int(response_ids.shape[1])
        prompt = input_ids[:, :-r].masked_fill(~attention_mask[:, :-r].bool(), -1)
        shapes.append(
            {
                "sequences": int(input_ids.shape[0]),
                "seq_len": int(input_ids.shape[1]),
                "response_len": r,
                "distinct_prompts": int(torch.unique(prompt, dim=0).shape[0]),
            }
        )
        return forward(model, input_ids, attention_mask, response_ids, **kw)

    def marked(self: Any, module: Any, experience: Any) -> Any:
        with tracker.phase("update"):
            return optimize(self, module, experience)

    ppo_update.forward_response = recorded  # type: ignore[assignment]
    policy_step.PolicyStep.optimize = marked  # type: ignore[method-assign]
    try:
        yield
    finally:
        ppo_update.forward_response = forward  # type: ignore[assignment]
        policy_step.PolicyStep.optimize = optimize  # type: ignore[method-assign]


def networks(module: Any) -> dict[str, dict[str, int]]:
    """Parameter bytes of each network the module holds (trained or frozen)."""
    out: dict[str, dict[str, int]] = {}
    for name, child in module.named_children():
        params = list(child.parameters())
        if not params:
            continue
        out[name] = {
            "numel": sum(p.numel() for p in params if p.numel() > 0),
            "bytes": sum(p.numel() * p.element_size() for p in params),
            "trainable": sum(p.numel() for p in params if p.requires_grad),
        }
    return out


def measure(case: str) -> dict[str, Any]:
    """Run ``case`` profiled; the update's peak and what the prediction needs (this process)."""
    torch.manual_seed(0)
    shapes: list[dict[str, int]] = []
    tracker = LiveTensorBytes("cpu")
    with instrumented(tracker, shapes), tracker:
        cli = cli_main(["fit", *CASES[case]])
    resident = [*cli.model.parameters(), *cli.model.buffers()]
    # weights memory-mapped from the checkpoint file never pass through the allocator
    untracked = tracker.untracked_bytes(resident)
    return {
        "case": case,
        "rank": cli.trainer.global_rank,
        "world_size": cli.trainer.world_size,
        "peak_update": tracker.peak("update") + untracked,
        "untracked": untracked,
        "update_starts": [
            tracker.timeline.at(start) + untracked for start, _ in tracker.phases["update"]
        ],
        "shapes": shapes,
        "networks": networks(cli.model),
        "config": cli.config["fit"].as_dict(),
    }


def main() -> None:
    case, out = sys.argv[1], Path(sys.argv[2])
    result = measure(case)
    Path(f"{out}.rank{result['rank']}.json").write_text(json.dumps(result, indent=1, default=str))
    shutdown_distributed()


if __name__ == "__main__":
    main()
