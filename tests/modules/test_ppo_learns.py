"""PPO really learns: a tiny random model trained on an easy procedural task raises its reward."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.callbacks import MetricsPlot
from lit_rlhf.data import CountdownPrompts, PromptDataModule
from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import DigitFractionReward
from lit_rlhf.rollout import HFGenerationEngine
from tests.helpers import quiet_trainer


@pytest.mark.parametrize("advantage", ["grpo", "gae"])
def test_reward_rises_on_digit_task(tiny_model_dir, tmp_path, advantage):
    # The task: answer Countdown prompts with digits only (reward = fraction of digit characters).
    # A random 0.1M-parameter model starts near the digits' share of its vocabulary.
    L.seed_everything(0)
    data = PromptDataModule(
        tokenizer=tiny_model_dir,
        train=CountdownPrompts(num_examples=120, seed=0, num_numbers=3, max_value=20),
        batch_size=4,
    )
    module = PPOModule(
        reward=DigitFractionReward(),
        model=tiny_model_dir,
        tokenizer=data.tokenizer,
        engine=HFGenerationEngine(max_new_tokens=8),
        advantage={"estimator": advantage},
        rollout={"samples_per_prompt": 8},
        optim={"micro_batch_size": 32, "lr": 3e-3},
        **({"critic": {"lr": 3e-3}} if advantage == "gae" else {}),  # a critic to train
    )
    plot = MetricsPlot(metrics=["reward/mean"], filename="reward.png")
    trainer = quiet_trainer(tmp_path, callbacks=[plot])
    trainer.fit(module, datamodule=data)
    rewards = torch.tensor(plot.history["reward/mean"])
    assert len(rewards) == 30
    first, last = rewards[:5].mean(), rewards[-5:].mean()
    assert last > first + 0.15, (first, last, rewards)
    assert plot.path is not None and plot.path.endswith("reward.png")
