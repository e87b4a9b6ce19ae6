"""The engine is asked for the sampled tokens' log-probs only when something reads them; with one
update per rollout the update fills ``rollout.old_log_probs`` from its own forward instead, and
they equal what a forward of the rollout policy gives."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlhf.models import load_tokenizer
from lit_rlhf.models.forward import forward_response
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import HFGenerationEngine
from tests.helpers import merge_groups, prompt_loader, quiet_trainer

PROMPTS = [f"Using the numbers [{i}, {i + 3}]" for i in range(8)]


class SpyEngine(HFGenerationEngine):
    """HF generation that records whether each call asked for log-probs."""

    def __init__(self) -> None:
        super().__init__(max_new_tokens=6)
        self.asked: list[bool] = []

    def generate(self, *args, log_probs=True, **kwargs):
        self.asked.append(log_probs)
        return super().generate(*args, log_probs=log_probs, **kwargs)


class CheckedPPO(PPOModule):
    """Before each update: the rollout policy's log-probs from a plain forward; after it: the
    experience's ``old_log_probs``."""

    pairs: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]  # set by fit()

    def optimize(self, experience):
        rollout = experience.rollout
        with torch.no_grad():
            expected = forward_response(
                self.policy,
                rollout.input_ids,
                rollout.attention_mask,
                rollout.response_ids,
                temperature=self.engine.temperature,
                share_prompts=False,
            ).log_probs
        stats = super().optimize(experience)
        self.pairs.append((expected, experience.old_log_probs, rollout.response_mask))
        return stats


def fit(tiny_model_dir, tmp_path, **kwargs):
    tokenizer = load_tokenizer(tiny_model_dir)
    defaults = dict(
        reward=lambda prompts, completions, rows: _digits(completions),
        model=tiny_model_dir,
        tokenizer=tokenizer,
        engine=SpyEngine(),
        optim={"lr": 1e-3},
    )
    module = CheckedPPO(**merge_groups(defaults, kwargs))
    module.pairs = []
    loaders = prompt_loader(tokenizer, PROMPTS, 4)
    trainer = quiet_trainer(tmp_path, limit_train_batches=2, limit_val_batches=1)
    trainer.fit(module, loaders, loaders)
    return module, trainer


def _digits(completions):
    from lit_rlhf.types import RewardOutput

    scores = [sum(c.isdigit() for c in x) / max(1, len(x)) for x in completions]
    return RewardOutput(torch.tensor(scores))


def test_one_update_with_kl_in_the_loss_skips_them_and_fills_old_log_probs(
    tiny_model_dir, tmp_path
):
    module, trainer = fit(tiny_model_dir, tmp_path, kl={"coef": 0.05, "placement": "loss"})
    # validation (sanity check + the epoch's) and both training rollouts: never asked
    assert module.engine.asked and not any(module.engine.asked)
    assert len(module.pairs) == 2
    for expected, filled, mask in module.pairs:
        assert filled is not None
        torch.testing.assert_close(filled[mask], expected[mask], atol=1e-5, rtol=1e-5)
        assert (filled[~mask] == 0).all()
    kl = float(trainer.callback_metrics["rollout/kl"])
    assert math.isfinite(kl) and kl != 0.0  # the reference drifts from the trained policy


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(update={"ppo_epochs": 2}),  # the ratio's denominator
        dict(update={"mini_batch_size": 4}),  # two optimizer steps per rollout
        dict(
            kl={"coef": 0.05, "placement": "reward"}
        ),  # the KL enters the advantages before the update
    ],
    ids=["ppo-epochs-2", "mini-batches", "kl-in-reward"],
)
def test_training_rollouts_ask_when_something_reads_them(tiny_model_dir, tmp_path, kwargs):
    module, _ = fit(tiny_model_dir, tmp_path, **kwargs)
    # validation calls (greedy, for scoring only) never ask; the two training rollouts do
    assert sum(module.engine.asked) == 2
