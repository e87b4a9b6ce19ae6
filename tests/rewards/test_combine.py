"""WeightedRewards: sums, logging keys, names, validation, and YAML construction."""

from __future__ import annotations

import pytest
import torch
from jsonargparse import ArgumentParser

from lit_rlhf.rewards import (
    CountdownReward,
    DigitFractionReward,
    MathReward,
    RewardFunction,
    WeightedRewards,
)
from lit_rlhf.rewards.adapt import reward_name as default_reward_name
from lit_rlhf.types import RewardOutput

ROWS = [{"numbers": [1, 2], "target": 3}, {"numbers": [1, 2], "target": 3}]
COMPLETIONS = ["<answer>1 + 2</answer>", "<answer>2 - 1</answer>"]


def test_weighted_sum_and_logging_keys():
    combined = WeightedRewards([DigitFractionReward(), CountdownReward()], weights=[0.5, 2.0])
    out = combined(["", ""], COMPLETIONS, ROWS)
    # digit fraction: "<answer>" (8) + "1+2" (3) + "</answer>" (9) = 20 non-space chars,
    # 2 of them digits; the same for "2-1"
    digits = 2 / 20
    # countdown: 1 + 2 = 3 is correct, 2 - 1 = 1 is not
    assert out.scores.tolist() == pytest.approx([0.5 * digits + 2.0, 0.5 * digits])
    assert set(out.info) == {
        "digit_fraction",
        "countdown",
        "countdown/correct",
        "countdown/format_ok",
    }
    assert out.info["countdown"].tolist() == [1.0, 0.0]
    assert out.info["countdown/format_ok"].tolist() == [1.0, 1.0]
    assert out.scores.dtype == torch.float32


def test_default_weights_are_one():
    out = WeightedRewards([CountdownReward(), CountdownReward()])(["", ""], COMPLETIONS, ROWS)
    assert out.scores.tolist() == [2.0, 0.0]


def my_scorer(prompts, completions, rows) -> RewardOutput:
    return RewardOutput(scores=torch.ones(len(completions)))


class HTTPScoreReward(DigitFractionReward):
    pass


def test_default_names():
    assert default_reward_name(CountdownReward()) == "countdown"
    assert default_reward_name(MathReward()) == "math"
    assert default_reward_name(DigitFractionReward()) == "digit_fraction"
    assert default_reward_name(HTTPScoreReward()) == "http_score"
    assert default_reward_name(my_scorer) == "my_scorer"


def test_duplicate_names_get_suffixes():
    same = WeightedRewards([DigitFractionReward()] * 3)
    assert same.names == ["digit_fraction", "digit_fraction_1", "digit_fraction_2"]
    # a suffix never collides with a name given outright
    given = WeightedRewards([DigitFractionReward()] * 3, names=["a", "a", "a_1"])
    assert given.names == ["a", "a_2", "a_1"]


def test_function_rewards_and_protocol():
    combined = WeightedRewards([my_scorer], weights=[3.0])
    assert isinstance(combined, RewardFunction)
    out = combined(["", ""], COMPLETIONS, ROWS)
    assert out.scores.tolist() == [3.0, 3.0] and set(out.info) == {"my_scorer"}


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"rewards": []}, "at least one"),
        ({"weights": [1.0]}, "weights has 1"),
        ({"weights": [1.0, float("nan")]}, "finite"),
        ({"names": ["a"]}, "names has 1"),
        ({"names": ["a", ""]}, "non-empty"),
    ],
)
def test_validation(kwargs, match):
    kwargs = {"rewards": [DigitFractionReward(), DigitFractionReward()], **kwargs}
    with pytest.raises(ValueError, match=match):
        WeightedRewards(**kwargs)


def test_component_with_wrong_shape_is_reported():
    def bad(prompts, completions, rows) -> RewardOutput:
        return RewardOutput(scores=torch.zeros(len(completions) + 1))

    with pytest.raises(ValueError, match="'bad'"):
        WeightedRewards([bad])(["", ""], COMPLETIONS, ROWS)


def test_constructible_from_yaml(tmp_path):
    config = tmp_path / "reward.yaml"
    config.write_text(
        """
reward:
  class_path: lit_rlhf.rewards.WeightedRewards
  init_args:
    rewards:
      - class_path: lit_rlhf.rewards.CountdownReward
        init_args: {format_reward: 0.1, require_think: true}
      - class_path: lit_rlhf.rewards.MathReward
        init_args: {answer_field: solution, timeout_seconds: 3}
      - class_path: lit_rlhf.rewards.DigitFractionReward
    weights: [1.0, 0.5, 0.1]
    names: [cd, math, digits]
"""
    )
    parser = ArgumentParser()
    parser.add_argument("--config", action="config")
    parser.add_argument("--reward", type=RewardFunction)
    cfg = parser.parse_args(["--config", str(config)])
    instantiate = getattr(parser, "instantiate", None) or parser.instantiate_classes
    reward = instantiate(cfg).reward
    assert isinstance(reward, WeightedRewards)
    assert reward.names == ["cd", "math", "digits"] and reward.weights == [1.0, 0.5, 0.1]
    countdown, math, digits = reward.rewards
    assert isinstance(countdown, CountdownReward) and countdown.format_reward == 0.1
    assert countdown.require_think
    assert isinstance(math, MathReward) and math.answer_field == "solution"
    assert isinstance(digits, DigitFractionReward)
