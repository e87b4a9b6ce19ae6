"""PPOModule(val_samples=k): pass@k and the sampled pass@1 of k engine samples per prompt at
validation, on hand-set pass flags (the engine and reward stubbed out)."""

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import CountdownReward


def test_pass_at_k_and_sampled_pass_at_1_from_k_samples(monkeypatch) -> None:
    module = PPOModule(reward=CountdownReward(), eval={"samples": 3, "pass_metric": "correct"})
    calls: list[dict[str, Any]] = []
    # prompt 0: one of its 3 samples correct; prompt 1: none
    correct = torch.tensor([0.0, 1.0, 0.0, 0.0, 0.0, 0.0])

    def collect(policy: Any, tokenizer: Any, batch: Any, **kwargs: Any) -> Any:
        calls.append(kwargs)
        return SimpleNamespace(reward_info={"correct": correct}, scores=correct)

    monkeypatch.setattr(module.rollouts, "collect", collect)
    module._evaluate_sampled({"prompt": ["a", "b"]}, "val", module.eval_settings.samples)
    # sampled with the engine (not greedy), 3 per prompt
    assert calls == [{"samples_per_prompt": 3, "log_probs": False}]
    # pass@3 = mean(any) = mean(1, 0) = 0.5; sampled pass@1 = mean(1/3, 0) = 1/6
    assert module.pass_at_k["val"].compute().item() == pytest.approx(0.5)
    assert module.sampled_pass["val"].compute().item() == pytest.approx(1 / 6)
    assert module.pass_at_k["test"].update_count == 0  # stages kept apart


def test_val_samples_below_one_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match=r"eval\.samples=0 must be >= 1"):
        PPOModule(reward=CountdownReward(), eval={"samples": 0})
