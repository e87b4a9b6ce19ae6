"""Rewards as users write them (issue [3/5]): TRL-style functions, untyped classes, lists of
numbers with None, weighted lists, all training a tiny PPO run and logged as
``reward/<name>``; every wrong return refused on the first batch with one line naming the
reward."""

from __future__ import annotations

import math
from typing import Any

import pytest
import torch

from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import WeightedRewards
from lit_rlhf.rewards.adapt import RewardReturnError, calling_convention
from lit_rlhf.rollout import HFGenerationEngine
from tests.helpers import prompt_loader, quiet_trainer
from tests.rewards import user_rewards as ur

PROMPTS = [f"Using the numbers [{i}, {i + 3}]" for i in range(4)]


def fit(tiny_model_dir: str, tmp_path: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
    """One rollout batch of a tiny PPO run; the metrics it logged."""
    module = PPOModule(
        model=tiny_model_dir,
        tokenizer=load_tokenizer(tiny_model_dir),
        engine=HFGenerationEngine(max_new_tokens=6),
        optim={"micro_batch_size": 8},
        **kwargs,
    )
    trainer = quiet_trainer(tmp_path, limit_train_batches=1)
    loader = prompt_loader(module.tokenizer, PROMPTS, 2, row=lambda p: {"target": p[-2]})
    trainer.fit(module, loader)
    assert module.rollout_step == 1
    return dict(trainer.logged_metrics)


@pytest.mark.parametrize(
    ("kwargs", "logged"),
    [
        (dict(reward=ur.brevity), ["brevity"]),
        (dict(reward=ur.has_digit), ["has_digit"]),
        (dict(reward=ur.Untyped(0.5)), ["untyped"]),
        (
            dict(reward=[ur.brevity, ur.Untyped(2.0)], reward_weights=[1.0, 0.25]),
            ["brevity", "untyped"],
        ),
        (dict(reward=[ur.only_short, ur.brevity]), ["only_short", "brevity"]),
    ],
    ids=["trl-function", "keyword-row-field", "untyped-class", "weighted-pair", "none-entries"],
)
def test_users_rewards_train_a_tiny_ppo_run(tiny_model_dir, tmp_path, kwargs, logged) -> None:
    metrics = fit(tiny_model_dir, tmp_path, **kwargs)
    for name in logged:
        assert f"reward/{name}" in metrics, sorted(metrics)
        assert math.isfinite(float(metrics[f"reward/{name}"]))
    assert math.isfinite(float(metrics["reward/mean"]))
    if "reward_weights" in kwargs:  # the weighted sum of the parts' batch means
        expected = float(metrics["reward/brevity"]) + 0.25 * float(metrics["reward/untyped"])
        assert float(metrics["reward/mean"]) == pytest.approx(expected, rel=1e-5)


def test_a_sample_no_reward_scores_gets_the_fallback_and_is_counted(
    tiny_model_dir, tmp_path
) -> None:
    with pytest.warns(RuntimeWarning, match="gave no score .* 8 of 8 samples"):
        metrics = fit(tiny_model_dir, tmp_path, reward=ur.never_scores, reward_fallback=-0.5)
    assert float(metrics["reward/unscored"]) == 1.0
    assert float(metrics["reward/mean"]) == -0.5


def test_none_terms_are_skipped_in_a_weighted_sum() -> None:
    combined = WeightedRewards([ur.only_short, ur.brevity, ur.never_scores], [2.0, 1.0, 5.0])
    out = combined(["p", "p"], ["short", "a much longer answer"], [{}, {}])
    assert out.scores[0] == pytest.approx(2.0 + 1 / 6)  # both scored terms
    assert out.scores[1] == pytest.approx(1 / 21)  # only_short: None, skipped
    assert math.isnan(out.info["only_short"][1]) and out.info["never_scores"].isnan().all()
    nothing = WeightedRewards([ur.never_scores])(["p"], ["x"], [{}])
    assert nothing.scores.isnan().all()  # no score at all: the collector's fallback


@pytest.mark.parametrize(
    ("reward", "match"),
    [
        (ur.returns_text, r"reward 'returns_text' returned str 'great answer'; expected"),
        (ur.returns_too_few, r"reward 'returns_too_few' returned 7 values for 8 completions"),
        (ur.returns_2d, r"reward 'returns_2d' returned a ndarray of shape \(8, 2\)"),
        (ur.returns_strings, r"reward 'returns_strings' returned str '1.0' at position 0"),
    ],
    ids=["a-string", "wrong-length", "2-d", "strings"],
)
def test_a_wrong_return_is_refused_on_the_first_batch_in_one_line(
    tiny_model_dir, tmp_path, reward, match
) -> None:
    with pytest.raises(RewardReturnError, match=match) as raised:
        fit(tiny_model_dir, tmp_path, reward=reward)
    assert "\n" not in str(raised.value)


def test_names_the_rollout_statistics_use_are_suffixed() -> None:
    def mean(prompts: Any, completions: Any, **kwargs: Any) -> list[float]:
        return [0.0] * len(completions)

    names = WeightedRewards([mean, ur.brevity, ur.brevity]).names
    assert names == ["mean_1", "brevity", "brevity_1"]


def test_calling_conventions_follow_the_signature() -> None:
    assert calling_convention(ur.brevity) == ("keywords", None)
    assert calling_convention(ur.has_digit)[0] == "keywords"
    assert calling_convention(ur.Untyped()) == ("rows", None)
    assert calling_convention(lambda p, c: [0.0] * len(c)) == ("pair", None)
    with pytest.raises(TypeError, match="a reward takes"):
        calling_convention(lambda x: x)


def test_weights_for_a_single_reward_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match=r"reward_weights=.* single reward"):
        PPOModule(reward=ur.brevity, reward_weights=[2.0])
    with pytest.raises(ValueError, match="weights has 1 entries but rewards has 2"):
        PPOModule(reward=[ur.brevity, ur.Untyped()], reward_weights=[2.0])


def test_the_cli_takes_a_function_and_a_weighted_list_by_import_path(tmp_path) -> None:
    from lit_rlhf.cli import cli_main

    train = '{"class_path": "lit_rlhf.data.CountdownPrompts", "init_args": {"num_examples": 4}}'
    common = [
        "fit",
        "--model=lit_rlhf.modules.PPOModule",
        "--model.engine=lit_rlhf.rollout.HFGenerationEngine",
        "--model.engine.max_new_tokens=4",
        "--data=lit_rlhf.data.PromptDataModule",
        "--data.tokenizer=builtin:tiny-llama",
        "--data.batch_size=2",
        f"--data.train={train}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
        "--trainer.limit_train_batches=1",
        "--trainer.max_epochs=1",
        f"--trainer.default_root_dir={tmp_path}",
    ]
    one = cli_main([*common, "--model.reward=tests.rewards.user_rewards.brevity"])
    assert "reward/brevity" in one.trainer.logged_metrics
    pair = (
        '["tests.rewards.user_rewards.brevity", '
        '{"class_path": "tests.rewards.user_rewards.Untyped", "init_args": {"scale": 2.0}}]'
    )
    two = cli_main([*common, f"--model.reward={pair}", "--model.reward_weights=[1.0, 0.5]"])
    assert isinstance(two.model.rollouts.reward, WeightedRewards)
    assert two.model.rollouts.reward.weights == [1.0, 0.5]
    assert float(two.trainer.logged_metrics["reward/untyped"]) == 2.0
    # the run's config.yaml holds the list, so the run can be repeated from it
    import yaml

    saved = yaml.safe_load((tmp_path / "config.yaml").read_text())["model"]["init_args"]
    assert saved["reward"][0] == "tests.rewards.user_rewards.brevity"
    assert saved["reward"][1]["class_path"] == "tests.rewards.user_rewards.Untyped"
    assert saved["reward_weights"] == [1.0, 0.5]
