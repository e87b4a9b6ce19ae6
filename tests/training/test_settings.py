"""The settings groups, their combinations (``PPOSettings``) and the module's own settings are
validated when the module is built, before any model loads; unknown names raise instead of
falling through to a default branch."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from lit_rlhf.modules import PPOModule
from lit_rlhf.settings import OptimSettings, PolicyLossSettings, UpdateSettings
from lit_rlhf.settings.flat import group_params
from lit_rlhf.training import PPOSettings, compute_advantages
from tests.helpers import ConstantReward

GROUPS = group_params(PPOModule)  # argument name -> settings group class


def ppo_settings(**groups):
    """The core's record from group dicts, as the module builds it."""
    return PPOSettings(**{name: GROUPS[name].coerce(value) for name, value in groups.items()})


BAD = [
    (dict(loss={"clip_low": 1.0}), "clip_low=1.0 must be in \\(0, 1\\)"),
    (dict(loss={"clip_low": 0.0}), "clip_low=0.0 must be in \\(0, 1\\)"),
    (dict(loss={"clip_high": -0.1}), "clip_high=-0.1 must be > 0"),
    (dict(loss={"dual_clip": 1.0}), "dual_clip=1.0 must be > 1"),
    (dict(critic={"value_clip": 0.0}), "value_clip=0.0 must be > 0, or null"),
    (dict(critic={"vf_coef": -1.0}), "vf_coef=-1.0 must be >= 0"),
    (dict(advantage={"gamma": 1.5}), "gamma=1.5 must be in \\[0, 1\\]"),
    (dict(advantage={"lam": -0.1}), "lam=-0.1 must be in \\[0, 1\\]"),
    (dict(update={"ppo_epochs": 0}), "ppo_epochs=0 must be >= 1"),
    (dict(optim={"micro_batch_size": 0}), "optim.micro_batch_size=0 must be an integer >= 1"),
    (dict(update={"mini_batch_size": 0}), "mini_batch_size=0 must be >= 1"),
    (
        dict(advantage={"estimator": "ppo"}),
        "advantage.estimator='ppo' is not one of \\['gae', 'grpo', 'rloo', 'reinforce_pp', "
        "'reinforce_pp_baseline'\\]",
    ),
    (dict(kl={"estimator": "k4"}), "kl.estimator='k4' is not one of"),
    (dict(loss={"loss_agg": "sum"}), "loss_agg='sum' is not one of"),
    (dict(kl={"placement": "both"}), "kl.placement='both' is not one of"),
    (dict(critic={"kind": "shared"}), "critic.kind='shared' is not one of"),
    (
        dict(advantage={"estimator": "grpo"}, rollout={"samples_per_prompt": 1}),
        "rollout.samples_per_prompt >= 2",
    ),
]


@pytest.mark.parametrize(("kwargs", "message"), BAD, ids=[m[:24] for _, m in BAD])
def test_bad_update_settings_fail_when_the_module_is_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        ppo_settings(**kwargs)
    # the module fails the same way at construction, before loading its (nonexistent) model
    with pytest.raises(ValueError, match=message):
        PPOModule(reward=ConstantReward(1.0), model="/no/such/model", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(optim={"lr": -1e-6}), "optim.lr=-1e-06 must be > 0"),
        (dict(optim={"lr": 0.0}), "optim.lr=0.0 must be > 0"),
        (dict(critic={"lr": 0.0}), "critic.lr=0.0 must be > 0"),
        (dict(optim={"weight_decay": -0.1}), "optim.weight_decay=-0.1 must be >= 0"),
        (dict(kl={"coef": -0.1}), "kl.coef=-0.1 must be >= 0"),
        (dict(optim={"max_grad_norm": 0.0}), "optim.max_grad_norm=0.0 must be > 0, or null"),
    ],
)
def test_bad_module_settings_fail_when_the_module_is_built(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOModule(reward=ConstantReward(1.0), model="/no/such/model", **kwargs)


def test_settings_are_frozen_and_read_from_hparams():
    module = PPOModule(
        reward=ConstantReward(1.0),
        loss={"clip_high": 0.28, "dual_clip": 3.0},
        update={"ppo_epochs": 2},
    )
    assert module.settings == PPOSettings(
        loss=PolicyLossSettings(clip_high=0.28, dual_clip=3.0),
        update=UpdateSettings(ppo_epochs=2),
        optim=OptimSettings(lr=1e-6),  # PPOModule's default lr
    )
    assert module.hparams["loss"]["clip_high"] == 0.28  # hparams hold plain dicts
    with pytest.raises(dataclasses.FrozenInstanceError):
        module.settings.loss.clip_high = 0.5  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        module.settings.loss = PolicyLossSettings()  # type: ignore[misc]


def test_a_flat_argument_is_refused_with_its_dotted_name():
    with pytest.raises(TypeError, match=r"PPOModule\(clip_low=...\).*now loss.clip_low"):
        PPOModule(reward=ConstantReward(1.0), clip_low=0.1)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(critic={"lr": 1e-3}), "critic.lr: PPOModule does not read it"),
        (dict(env={"max_turns": 3}), "env.max_turns: PPOModule does not read it"),
    ],
)
def test_groups_the_module_would_not_read_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PPOModule(reward=ConstantReward(1.0), model="/no/such/model", **kwargs)


def test_single_update_rule():
    assert PPOSettings().single_update(8)
    assert not ppo_settings(update={"ppo_epochs": 2}).single_update(8)
    assert not ppo_settings(update={"mini_batch_size": 4}).single_update(8)
    assert ppo_settings(update={"mini_batch_size": 16}).single_update(8)
    assert not ppo_settings(update={"recompute_old_log_probs": True}).single_update(8)


def test_an_unknown_advantage_raises_instead_of_falling_through():
    settings = PPOSettings()
    object.__setattr__(settings.advantage, "estimator", "reinforce")  # bypass validation

    class FakeRollout:
        scores = torch.ones(4)
        group_ids = torch.tensor([0, 0, 1, 1])
        response_mask = torch.ones(4, 3, dtype=torch.bool)
        agent_mask = turn_ends = turn_rewards = None  # a single-turn rollout

    with pytest.raises(ValueError, match=r"unknown advantage\.estimator 'reinforce'"):
        compute_advantages(
            FakeRollout(),  # type: ignore[arg-type]
            settings,
            old_log_probs=None,
            ref_log_probs=None,
            values=None,
            kl_coef=0.0,
        )
