"""``PPOSettings`` and the module's own settings are validated when the module is built, before
any model loads; unknown names raise instead of falling through to a default branch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lit_rlhf.modules import PPOModule
from lit_rlhf.training import PPOSettings, compute_advantages
from tests.helpers import ConstantReward

BAD = [
    (dict(clip_low=1.0), "clip_low=1.0 must be in \\(0, 1\\)"),
    (dict(clip_low=0.0), "clip_low=0.0 must be in \\(0, 1\\)"),
    (dict(clip_high=-0.1), "clip_high=-0.1 must be > 0"),
    (dict(dual_clip=1.0), "dual_clip=1.0 must be > 1"),
    (dict(value_clip=0.0), "value_clip=0.0 must be > 0, or null"),
    (dict(vf_coef=-1.0), "vf_coef=-1.0 must be >= 0"),
    (dict(gamma=1.5), "gamma=1.5 must be in \\[0, 1\\]"),
    (dict(lam=-0.1), "lam=-0.1 must be in \\[0, 1\\]"),
    (dict(ppo_epochs=0), "ppo_epochs=0 must be >= 1"),
    (dict(micro_batch_size=0), "micro_batch_size=0 must be >= 1"),
    (dict(mini_batch_size=0), "mini_batch_size=0 must be >= 1"),
    (
        dict(advantage="ppo"),
        "advantage='ppo' is not one of \\['gae', 'grpo', 'rloo', 'reinforce_pp', "
        "'reinforce_pp_baseline'\\]",
    ),
    (dict(kl_estimator="k4"), "kl_estimator='k4' is not one of"),
    (dict(loss_agg="sum"), "loss_agg='sum' is not one of"),
    (dict(kl_in="both"), "kl_in='both' is not one of"),
    (dict(critic="shared"), "critic='shared' is not one of"),
    (dict(advantage="grpo", samples_per_prompt=1), "samples_per_prompt >= 2"),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD, ids=[m[:24] for _, m in BAD])
def test_bad_update_settings_fail_when_the_module_is_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOSettings(**kwargs)
    # the module fails the same way at construction, before loading its (nonexistent) model
    with pytest.raises(ValueError, match=message):
        PPOModule(reward=ConstantReward(1.0), model="/no/such/model", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(lr=-1e-6), "lr=-1e-06 must be > 0"),
        (dict(lr=0.0), "lr=0.0 must be > 0"),
        (dict(critic_lr=0.0), "critic_lr=0.0 must be > 0"),
        (dict(weight_decay=-0.1), "weight_decay=-0.1 must be >= 0"),
        (dict(kl_coef=-0.1), "kl_coef=-0.1 must be >= 0"),
        (dict(max_grad_norm=0.0), "max_grad_norm must be > 0 or None"),
    ],
)
def test_bad_module_settings_fail_when_the_module_is_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOModule(reward=ConstantReward(1.0), model="/no/such/model", **kwargs)


def test_settings_are_frozen_and_read_from_hparams():
    module = PPOModule(reward=ConstantReward(1.0), clip_high=0.28, dual_clip=3.0, ppo_epochs=2)
    assert module.settings == PPOSettings(clip_high=0.28, dual_clip=3.0, ppo_epochs=2)
    with pytest.raises(dataclasses.FrozenInstanceError):
        module.settings.clip_high = 0.5  # type: ignore[misc]


def test_single_update_rule():
    assert PPOSettings().single_update(8)
    assert not PPOSettings(ppo_epochs=2).single_update(8)
    assert not PPOSettings(mini_batch_size=4).single_update(8)
    assert PPOSettings(mini_batch_size=16).single_update(8)
    assert not PPOSettings(recompute_old_log_probs=True).single_update(8)


def test_an_unknown_advantage_raises_instead_of_falling_through():
    settings = PPOSettings()
    object.__setattr__(settings, "advantage", "reinforce")  # bypass validation on purpose

    class FakeRollout:
        scores = torch.ones(4)
        group_ids = torch.tensor([0, 0, 1, 1])
        response_mask = torch.ones(4, 3, dtype=torch.bool)
        agent_mask = turn_ends = turn_rewards = None  # a single-turn rollout

    with pytest.raises(ValueError, match="unknown advantage 'reinforce'"):
        compute_advantages(
            FakeRollout(),  # type: ignore[arg-type]
            settings,
            old_log_probs=None,
            ref_log_probs=None,
            values=None,
            kl_coef=0.0,
        )
