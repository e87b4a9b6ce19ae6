"""Evaluate a pairwise judge on preference pairs: pairwise accuracy, positional consistency (each
pair in both orders), format-valid rate, tie rate and per-subset accuracy, printed as a table.

    python scripts/eval_judge.py --model builtin:smollm2-135m-instruct --pairs pairs.jsonl
    python scripts/eval_judge.py --checkpoint runs/.../last.ckpt --pairs rewardbench.jsonl
    python scripts/eval_judge.py --model builtin:tiny-llama --synthetic 32   # no file needed

``--model`` is any HF causal LM (hub id, folder, ``builtin:``); ``--checkpoint`` a
``GenerativeRewardModule`` checkpoint. Pairs: a JSONL/parquet/folder/hub id in ``--schema``
(RewardBench's by default: prompt, chosen, rejected, subset, id), or ``--synthetic N`` generated
arithmetic pairs. ``--samples N`` judges by majority of N sampled outputs (default: 1 greedy);
``--inference reflective --samples 8`` with ReflectRM's two-stage reflective inference.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

import lightning as L


def build(opts: argparse.Namespace) -> tuple[Any, Any]:
    from lit_rlhf.data import PreferencePairs, PromptDataModule, SyntheticPairs
    from lit_rlhf.modules import GenerativeRewardModule
    from lit_rlhf.rollout import HFGenerationEngine

    engine = HFGenerationEngine(max_new_tokens=opts.max_new_tokens, temperature=opts.temperature)
    judging = {"eval_samples": opts.samples, "inference": opts.inference}
    if opts.checkpoint:
        module = GenerativeRewardModule.load_from_checkpoint(
            opts.checkpoint, weights_only=True, engine=engine, **judging
        )
        model = module.hparams.model
    else:
        model = opts.model
        module = GenerativeRewardModule(model=model, engine=engine, **judging)
    if opts.synthetic:
        source: Any = SyntheticPairs(
            num_examples=opts.synthetic, seed=opts.seed, template=opts.template, swap="both"
        )
    else:
        source = PreferencePairs(
            opts.pairs, schema=opts.schema, split=opts.split, template=opts.template, swap="both"
        )
    data = PromptDataModule(
        tokenizer=model,
        train=source,
        test=source,
        batch_size=opts.batch_size,
        max_prompt_length=opts.max_prompt_length,
    )
    return module, data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--model", help="HF causal LM: hub id, folder or builtin:<name>")
    which.add_argument("--checkpoint", help="a GenerativeRewardModule checkpoint")
    pairs = parser.add_mutually_exclusive_group(required=True)
    pairs.add_argument("--pairs", help="preference pairs: file, folder or hub id")
    pairs.add_argument("--synthetic", type=int, help="N generated arithmetic pairs instead")
    schemas = ["pairs", "helpsteer3", "hh_rlhf", "ultrafeedback", "rewardbench"]
    parser.add_argument("--schema", default="rewardbench", choices=schemas)
    parser.add_argument("--split", default="train")
    parser.add_argument("--template", default="consistrm-v1")
    parser.add_argument("--samples", type=int, default=1, help="judge outputs per pair")
    parser.add_argument(
        "--inference",
        choices=["single", "majority", "reflective"],
        help="default: single for one sample, majority for several",
    )
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--max-prompt-length", type=int, default=2048)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", help="also write the metrics to this JSON file")
    opts = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    L.seed_everything(opts.seed, verbose=False)
    module, data = build(opts)
    trainer = L.Trainer(
        accelerator="auto",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    (metrics,) = trainer.test(module, datamodule=data, verbose=False)
    lines = ["| metric | value |", "|---|---|"]
    lines += [f"| {key.removeprefix('test/')} | {value:.3f} |" for key, value in metrics.items()]
    print("\n".join(lines))
    if opts.json:
        with open(opts.json, "w", encoding="utf-8") as handle:
            json.dump(metrics, handle, indent=1)


if __name__ == "__main__":
    main()
