"""REINFORCE++ advantages against a reference written from OpenRLHF's own code.

Peer: OpenRLHF, commit 3c3be6234e0cb353e76bb8019947db9dfe99fca7,
``openrlhf/trainer/ppo_utils/experience_maker.py``: ``compute_advantages_and_returns`` (the
baseline subtraction per prompt for ``reinforce_baseline`` with gamma forced to 1, the token
rewards, ``get_cumulative_returns``, then the normalisation over every action token of the
batch: population variance, ``rsqrt(max(var, 1e-8))``), with ``compute_reward`` and
``compute_approx_kl`` of ``openrlhf/models/utils.py`` (the score on the last action token, minus
``kl_coef`` times the per-token KL estimate, clamped to [-10, 10]). :func:`openrlhf_advantages`
restates those steps as plain torch; lit-rlhf's side is its experience code
(``lit_rlhf.training.experience.compute_advantages``) on a rollout, with
``advantage.estimator: reinforce_pp`` / ``reinforce_pp_baseline`` and ``kl.placement: reward``.
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from torch import Tensor

from lit_rlhf.settings import AdvantageSettings, KLSettings, RolloutSettings
from lit_rlhf.training.experience import compute_advantages
from lit_rlhf.training.settings import PPOSettings
from lit_rlhf.types import Rollout

pytestmark = [pytest.mark.vllm, pytest.mark.peers]

G = 4
LENGTHS = [6, 3, 5, 6, 4, 6, 1, 2]
TOL = 1e-5


def openrlhf_advantages(
    scores: Tensor, mask: Tensor, log_probs: Tensor, ref_log_probs: Tensor, *,
    kl_coef: float, kl_estimator: str, gamma: float, baseline: bool,
) -> Tensor:  # fmt: skip
    """OpenRLHF's REINFORCE++ (``reinforce``) / REINFORCE++-baseline (``reinforce_baseline``)
    advantages, step by step as in the functions named in the module docstring."""
    # compute_approx_kl
    log_ratio = log_probs.float() - ref_log_probs.float()
    if kl_estimator == "k1":
        kl = log_ratio
    elif kl_estimator == "k2":
        kl = log_ratio**2 / 2.0
    else:
        kl = (-log_ratio).exp() - 1 + log_ratio
    kl = kl.clamp(min=-10, max=10)
    # compute_advantages_and_returns: baseline per prompt, gamma forced to 1 for it
    rewards = scores.reshape(-1, G)
    if baseline:
        rewards = rewards - rewards.mean(-1, keepdim=True)
        gamma = 1.0
    rewards = rewards.reshape(-1)
    # compute_reward: the score on the last action token, the KL on every token
    last = mask.size(1) - 1 - mask.long().fliplr().argmax(dim=1, keepdim=True)
    token_rewards = torch.zeros_like(kl).scatter_(1, last, rewards[:, None].to(kl.dtype))
    token_rewards = token_rewards - kl_coef * kl
    # get_cumulative_returns
    token_rewards = mask * token_rewards
    returns = torch.zeros_like(token_rewards)
    running = torch.zeros(token_rewards.size(0))
    for t in reversed(range(token_rewards.size(1))):
        running = token_rewards[:, t] + gamma * running
        returns[:, t] = running
    # the batch normalisation (estimators gae / reinforce / reinforce_baseline)
    n = mask.sum()
    mean = (returns * mask).sum() / n
    var = ((returns - mean).pow(2) * mask).sum() / n
    return (returns - mean) * var.clamp(min=1e-8).rsqrt()


def _rollout() -> tuple[Rollout, Tensor, Tensor]:
    gen = torch.Generator().manual_seed(0)
    b, r = len(LENGTHS), max(LENGTHS)
    mask = torch.arange(r)[None, :] < torch.tensor(LENGTHS)[:, None]
    old = (-torch.rand(b, r, generator=gen) * 3).masked_fill(~mask, 0.0)
    ref = (old + 0.5 * torch.randn(b, r, generator=gen)).masked_fill(~mask, 0.0)
    scores = torch.tensor([1.0, 0.0, 0.5, 2.0, -1.0, 0.25, 0.0, 3.0])
    ones = torch.ones(b, 2, dtype=torch.long)
    rollout = Rollout(
        prompt_ids=ones, prompt_mask=ones.bool(), response_ids=torch.ones(b, r, dtype=torch.long),
        response_mask=mask, sample_log_probs=old, group_ids=torch.arange(b) // G,
        query_ids=[str(i // G) for i in range(b)], tasks=["parity"] * b, rows=[{}] * b,
        prompts=[""] * b, responses=[""] * b, scores=scores, reward_info={},
    )  # fmt: skip
    return rollout, old, ref


def _lit(estimator: str, *, kl_coef: float, kl_estimator: str, gamma: float) -> Tensor:
    rollout, old, ref = _rollout()
    settings = PPOSettings(
        rollout=RolloutSettings(samples_per_prompt=G),
        advantage=AdvantageSettings(estimator=estimator, gamma=gamma),
        kl=KLSettings(coef=kl_coef, placement="reward", estimator=kl_estimator),
    )
    advantages, _ = compute_advantages(
        rollout, settings, old_log_probs=old, ref_log_probs=ref, values=None, kl_coef=kl_coef
    )
    return advantages


CASES = [
    # (lit-rlhf estimator, kl_coef, kl estimator, gamma, the one setting changed)
    ("reinforce_pp", 0.05, "k3", 1.0, {"kl_estimator": "k1"}),
    ("reinforce_pp", 0.1, "k1", 0.9, {"gamma": 1.0}),
    ("reinforce_pp_baseline", 0.05, "k2", 1.0, {"estimator": "reinforce_pp"}),
]


@pytest.mark.parametrize(
    "estimator, kl_coef, kl_estimator, gamma, mutation",
    [pytest.param(*c, id=f"{c[0]}-{c[2]}-gamma{c[3]}") for c in CASES],
)
def test_reinforce_pp_advantages_equal_openrlhf(
    estimator: str, kl_coef: float, kl_estimator: str, gamma: float, mutation: dict[str, Any]
) -> None:
    rollout, old, ref = _rollout()
    mask = rollout.response_mask
    theirs = openrlhf_advantages(
        rollout.scores, mask, old, ref, kl_coef=kl_coef, kl_estimator=kl_estimator, gamma=gamma,
        baseline=estimator == "reinforce_pp_baseline",
    )  # fmt: skip
    args = {"estimator": estimator, "kl_estimator": kl_estimator, "gamma": gamma}
    ours = _lit(args.pop("estimator"), kl_coef=kl_coef, **args)
    assert (ours[mask] - theirs[mask]).abs().max() < TOL
    assert (ours[~mask] == 0).all()  # lit-rlhf zeroes what OpenRLHF's action mask leaves out
    changed = {"estimator": estimator, "kl_estimator": kl_estimator, "gamma": gamma, **mutation}
    mutated = _lit(changed.pop("estimator"), kl_coef=kl_coef, **changed)
    assert (mutated[mask] - theirs[mask]).abs().max() > 100 * TOL, f"{mutation} changed nothing"
