"""The demo's policy through ``lit-rlhf export`` (``-m slow``, about 4 minutes on 2 busy CPU cores):
``configs/ppo/countdown_smollm2.yaml`` (the embedded SmolLM2-135M-Instruct) trained one
optimizer step on two prompts, exported from its Lightning checkpoint, loads back in
transformers with the demo's weights, tokenizer and chat template, and gives the same greedy
answers to chat-rendered Countdown prompts. The tiny-model version of this check runs by
default: tests/test_export.py::test_ppo_checkpoint_exports_the_policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.test_export import CONFIGS, assert_round_trip, export, train_and_save

DEMO = str(CONFIGS / "ppo" / "countdown_smollm2.yaml")
ONE_STEP = [
    "--data.init_args.batch_size=2",
    "--data.init_args.train.init_args.num_examples=2",
    "--model.init_args.rollout.samples_per_prompt=2",
]


@pytest.mark.slow
def test_demo_policy_exports_with_the_same_greedy_answers(tmp_path: Path) -> None:
    module, ckpt = train_and_save(DEMO, tmp_path, *ONE_STEP, perturb=False)
    out = export(DEMO, ckpt, tmp_path / "hf", *ONE_STEP)
    tokenizer = module.tokenizer
    prompts = [
        tokenizer.apply_chat_template(
            [
                {"role": "system", "content": "You solve arithmetic puzzles."},
                {"role": "user", "content": f"Combine {a} and {b} with + to reach {a + b}."},
            ],
            tokenize=False,
            add_generation_prompt=True,
        )
        + "<answer>"
        for a, b in [(3, 4), (2, 9), (5, 5)]
    ]
    assert_round_trip(module.policy, tokenizer, out, prompts)
