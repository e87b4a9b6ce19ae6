"""Peak CPU memory of PPO update steps with LoRA against full fine-tuning, each arm in its own
process; prints both figures and their ratio.

    python -m scripts.bench lora_memory                       # builtin:mid-llama, ~1-2 min
    python -m scripts.bench lora_memory --model builtin:tiny-llama --steps 1 --max-new-tokens 8

Workload and figures: docs/algorithms.md, "LoRA / QLoRA" (Memory).
"""

from __future__ import annotations

import argparse
from typing import Any

from scripts.bench.runner import Report, fit, peak_rss_mib, spawn

SMOKE = {"model": "builtin:tiny-llama", "steps": 1, "max_new_tokens": 8, "batch": 2}


def add_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="builtin:mid-llama")
    for flag, value, text in (("--rank", 16, "lora_rank of the LoRA arm"),
                              ("--batch", 4, "prompts per rollout batch"),
                              ("--samples", 4, "samples_per_prompt"),
                              ("--micro", 8, "micro_batch_size"), ("--max-new-tokens", 32, None),
                              ("--steps", 2, "rollout batches (updates)")):  # fmt: skip
        parser.add_argument(flag, type=int, default=value, help=text)


def child(opts: argparse.Namespace) -> dict[str, Any]:
    """One arm: build the module, record the baseline, fit, record the peak."""
    import torch

    from lit_rlhf.data import CountdownPrompts, PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import DigitFractionReward
    from lit_rlhf.rollout import HFGenerationEngine

    torch.manual_seed(0)
    prompts = CountdownPrompts(num_examples=opts.batch * opts.steps, seed=0)
    data = PromptDataModule(tokenizer=opts.model, train=prompts, batch_size=opts.batch,
                            use_chat_template=False)  # fmt: skip
    rank = opts.rank if opts.child == "lora" else 0
    module = PPOModule(
        reward=DigitFractionReward(), model=opts.model, tokenizer=data.tokenizer,
        engine=HFGenerationEngine(max_new_tokens=opts.max_new_tokens),
        rollout={"samples_per_prompt": opts.samples}, kl={"coef": 0.05},
        optim={"lr": 1e-5, "micro_batch_size": opts.micro},
        lora={"rank": rank, "alpha": 2 * max(rank, 1)},
    )  # fmt: skip
    module.configure_model()  # the networks, before the baseline is read
    trainable = sum(p.numel() for p in module.policy.parameters() if p.requires_grad)
    baseline = peak_rss_mib()
    trainer = fit(module, [], data)
    peak = peak_rss_mib()
    return {"arm": opts.child, "trainable": trainable, "baseline_mib": baseline,
            "peak_mib": peak, "step_mib": peak - baseline,
            "steps": trainer.global_step}  # fmt: skip


def run(opts: argparse.Namespace, report: Report) -> None:
    rows = {arm: spawn("lora_memory", [*opts.argv, "--child", arm]) for arm in ("full", "lora")}
    report.say(f"model {opts.model}, {opts.steps} PPO updates of {opts.batch} x {opts.samples} "
               f"sequences, {opts.max_new_tokens} new tokens, LoRA rank {opts.rank}")  # fmt: skip
    report.table(["arm", "trainable params", "peak RSS (MiB)", "growth during fit (MiB)"],
                 [(arm, f"{r['trainable']:,}", f"{r['peak_mib']:.0f}", f"{r['step_mib']:.0f}")
                  for arm, r in rows.items()])  # fmt: skip
    full, lora = rows["full"], rows["lora"]
    report.say(f"peak RSS ratio lora / full: {lora['peak_mib'] / full['peak_mib']:.3f}; growth "
               f"ratio: {lora['step_mib'] / max(full['step_mib'], 1e-9):.3f}")  # fmt: skip
    report.data = rows
