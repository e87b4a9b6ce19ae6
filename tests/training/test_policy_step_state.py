"""A stateful reward's ``state_dict`` travels in the checkpoint of any module built on PolicyStep
(ScalarRMReward's running mean must survive a resume)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import torch
from torch import nn

from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.training import PolicyStep, PPOSettings, RolloutCollector
from lit_rlhf.types import RewardOutput


class CountingReward:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, prompts: Any, completions: Any, rows: Any) -> RewardOutput:
        self.calls += 1
        return RewardOutput(scores=torch.zeros(len(completions)), info={})

    def state_dict(self) -> dict[str, int]:
        return {"calls": self.calls}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.calls = state["calls"]


def _step(reward: Any) -> PolicyStep:
    collector = RolloutCollector(HFGenerationEngine(), reward)
    return PolicyStep(PPOSettings(), collector)


def test_reward_state_is_saved_and_restored() -> None:
    saved_reward = CountingReward()
    saved_reward.calls = 7
    module = nn.Module()
    module.rollout_step, module.kl_coef = 3, 0.0  # type: ignore[assignment]
    checkpoint: dict[str, Any] = {"state_dict": {}}
    _step(saved_reward).save(module, checkpoint)
    assert checkpoint["lit_rlhf"]["reward"] == {"calls": 7}
    fresh = CountingReward()
    _step(fresh).load(module, checkpoint)
    assert fresh.calls == 7


def test_a_stateless_reward_adds_nothing() -> None:
    checkpoint: dict[str, Any] = {"state_dict": {}}
    module = SimpleNamespace(rollout_step=0, kl_coef=0.0)
    _step(lambda p, c, r: RewardOutput(scores=torch.zeros(len(c)), info={})).save(
        module, checkpoint
    )
    assert "reward" not in checkpoint["lit_rlhf"]


def test_a_metric_missing_from_a_later_step_is_logged_as_nan_not_its_stale_value() -> None:
    """Lightning re-logs a step metric's last value when a later step does not log it; a domain
    absent from a batch (sequential multi-domain RL) must read as undefined, not as frozen."""
    from lit_rlhf.types import Experience, Rollout

    logged: list[dict[str, float]] = []
    module = SimpleNamespace(
        rollout_step=1, kl_coef=0.0,
        log_dict=lambda d, **kw: logged.append({k: float(v) for k, v in d.items()}),
        log=lambda *a, **kw: None,
    )  # fmt: skip

    def experience(info: dict[str, torch.Tensor]) -> Experience:
        ids, mask = torch.zeros(2, 3, dtype=torch.long), torch.ones(2, 3, dtype=torch.bool)
        rollout = Rollout(ids, mask, ids, mask, None, torch.arange(2), ["a", "b"], ["t", "t"],
                          [{}, {}], ["p", "p"], ["r", "r"], torch.ones(2), info)  # fmt: skip
        return Experience(rollout, torch.zeros(2, 3), torch.zeros(2, 3))

    step = _step(CountingReward())
    step.log(module, experience({"math/score": torch.tensor([1.0, 0.0])}), {})
    step.log(module, experience({"chat/score": torch.tensor([0.5, 0.5])}), {})
    assert logged[0]["reward/math/score"] == 0.5
    assert torch.isnan(torch.tensor(logged[1]["reward/math/score"]))
    assert logged[1]["reward/chat/score"] == 0.5
