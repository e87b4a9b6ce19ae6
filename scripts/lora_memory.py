"""Peak CPU memory of PPO update steps with LoRA against full fine-tuning, each arm in its own
process; prints both figures and their ratio.

    python scripts/lora_memory.py                              # builtin:mid-llama, ~1-2 min
    python scripts/lora_memory.py --model builtin:tiny-llama --steps 1 --max-new-tokens 8

Each arm builds a ``PPOModule`` (GRPO, ``kl_coef`` > 0: full fine-tuning loads a frozen
reference copy, LoRA computes the reference with its adapters off) and fits ``--steps`` rollout
batches on Countdown prompts with a digit-fraction reward. The figures are the process's peak
resident set size (``getrusage(RUSAGE_SELF).ru_maxrss``) over the whole run, and its growth
during ``fit`` above the peak once the networks are built (gradients, AdamW state, activations;
the full arm's reference copy is in the baseline). Run it alone on the machine: other processes
do not change RSS, but they slow it down.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
from typing import Any


def peak_mib() -> float:
    """This process's peak resident set size in MiB (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def run_arm(args: argparse.Namespace) -> dict[str, Any]:
    """One arm, in this process: build the module, record the baseline, fit, record the peak."""
    import lightning as L
    import torch

    from lit_rlhf.data import CountdownPrompts, PromptDataModule
    from lit_rlhf.modules import PPOModule
    from lit_rlhf.rewards import DigitFractionReward
    from lit_rlhf.rollout import HFGenerationEngine

    torch.manual_seed(0)
    data = PromptDataModule(
        tokenizer=args.model,
        train=CountdownPrompts(num_examples=args.batch * args.steps, seed=0),
        batch_size=args.batch,
        use_chat_template=False,
    )
    rank = args.rank if args.arm == "lora" else 0
    module = PPOModule(
        reward=DigitFractionReward(), model=args.model, tokenizer=data.tokenizer,
        engine=HFGenerationEngine(max_new_tokens=args.max_new_tokens),
        samples_per_prompt=args.samples, kl_coef=0.05, lr=1e-5, micro_batch_size=args.micro,
        lora_rank=rank, lora_alpha=2 * max(rank, 1),
    )  # fmt: skip
    module.configure_model()  # the networks, before the baseline is read
    trainable = sum(p.numel() for p in module.policy.parameters() if p.requires_grad)
    baseline = peak_mib()
    trainer = L.Trainer(
        accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False,
    )  # fmt: skip
    trainer.fit(module, datamodule=data)
    peak = peak_mib()
    return {
        "arm": args.arm,
        "trainable": trainable,
        "baseline_mib": baseline,
        "peak_mib": peak,
        "step_mib": peak - baseline,
        "steps": trainer.global_step,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="builtin:mid-llama")
    parser.add_argument("--rank", type=int, default=16, help="lora_rank of the LoRA arm")
    parser.add_argument("--batch", type=int, default=4, help="prompts per rollout batch")
    parser.add_argument("--samples", type=int, default=4, help="samples_per_prompt")
    parser.add_argument("--micro", type=int, default=8, help="micro_batch_size")
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2, help="rollout batches (updates)")
    parser.add_argument("--arm", choices=["lora", "full"], help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.arm is not None:  # a child: one arm, one JSON line
        print("ARM " + json.dumps(run_arm(args)), flush=True)
        return
    flags = list(argv if argv is not None else sys.argv[1:])
    rows = {arm: _child(arm, flags) for arm in ("full", "lora")}
    print(f"model {args.model}, {args.steps} PPO updates of {args.batch} x {args.samples} "
          f"sequences, {args.max_new_tokens} new tokens, LoRA rank {args.rank}")  # fmt: skip
    print("| arm | trainable params | peak RSS (MiB) | growth during fit (MiB) |")
    print("|---|---|---|---|")
    for arm, row in rows.items():
        print(f"| {arm} | {row['trainable']:,} | {row['peak_mib']:.0f} | {row['step_mib']:.0f} |")
    full, lora = rows["full"], rows["lora"]
    print(f"peak RSS ratio lora / full: {lora['peak_mib'] / full['peak_mib']:.3f}; growth "
          f"ratio: {lora['step_mib'] / max(full['step_mib'], 1e-9):.3f}")  # fmt: skip


def _child(arm: str, flags: list[str]) -> dict[str, Any]:
    """Run one arm in a fresh Python process (its own peak RSS) and parse its result line."""
    cmd = [sys.executable, __file__, *flags, "--arm", arm]
    done = subprocess.run(cmd, capture_output=True, text=True, check=False)
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("ARM ")]
    if done.returncode != 0 or not lines:
        raise SystemExit(f"the {arm} arm failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    return dict(json.loads(lines[-1][4:]))


if __name__ == "__main__":
    main()
