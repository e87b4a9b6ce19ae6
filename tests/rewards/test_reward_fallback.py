"""``GuardedReward``: a reward that raises, hangs or returns a non-finite score on one sample marks
that sample (``reward_error`` info, ``fault/reward_errors``; with ``on_error='mask'``, the
default, ``reward_masked`` too, which takes it out of the update: tests/training/
test_reward_mask.py) and gives it the fallback score, and the batch goes on; a batch where every
sample fails is an error at once (``fallback``) or after ``max_failed_batches`` in a row
(``mask``); wrong settings are refused."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Sequence
from typing import Any

import pytest
import torch
from jsonargparse import ArgumentParser

from lit_rlhf.rewards import GuardedReward, RewardByTask, RewardFunction
from lit_rlhf.rewards.guarded import REWARD_ERROR_KEY, REWARD_MASKED_KEY, FailedBatchError
from lit_rlhf.training import rollout_stats
from lit_rlhf.types import RewardOutput, Rollout


class LengthReward:
    """Score = completion length; ``"boom"`` raises, ``"slow"`` sleeps ``sleep_s``, ``"nan"``
    scores NaN. Info ``length`` and the number of calls made."""

    def __init__(self, sleep_s: float = 100.0) -> None:
        self.sleep_s, self.calls = sleep_s, 0

    def __call__(
        self, prompts: Sequence[str], completions: Sequence[str], rows: Any
    ) -> RewardOutput:
        self.calls += 1
        if "boom" in completions:
            raise KeyError("boom")
        if "slow" in completions:
            time.sleep(self.sleep_s)
        special = {"nan": math.nan, "inf": math.inf}
        scores = torch.tensor([special.get(c, float(len(c))) for c in completions])
        return RewardOutput(scores, {"length": torch.tensor([float(len(c)) for c in completions])})


def score(reward: RewardFunction, completions: list[str]) -> RewardOutput:
    return reward([""] * len(completions), completions, [{}] * len(completions))


def test_a_sample_that_raises_gets_the_fallback_and_is_counted() -> None:
    inner = LengthReward()
    with pytest.warns(RuntimeWarning, match=r"sample 1 of the batch failed \(KeyError: 'boom'\)"):
        out = score(GuardedReward(inner, fallback=-1.0), ["ab", "boom", "abcd"])
    assert out.scores.tolist() == [2.0, -1.0, 4.0]
    assert out.info[REWARD_ERROR_KEY].tolist() == [0.0, 1.0, 0.0]
    assert out.info["length"].tolist()[::2] == [2.0, 4.0] and math.isnan(out.info["length"][1])
    assert out.info[REWARD_MASKED_KEY].tolist() == [0.0, 1.0, 0.0]  # on_error="mask"
    assert inner.calls == 4  # the batch, then each sample alone


def test_fallback_mode_marks_no_sample_for_masking() -> None:
    guarded = GuardedReward(LengthReward(), fallback=-1.0, on_error="fallback", timeout_s=None)
    with pytest.warns(RuntimeWarning, match=r"failed \(KeyError: 'boom'\); scored -1.0"):
        out = score(guarded, ["ab", "boom"])
    assert out.scores.tolist() == [2.0, -1.0] and out.info[REWARD_ERROR_KEY].tolist() == [0, 1]
    assert REWARD_MASKED_KEY not in out.info
    assert REWARD_MASKED_KEY not in score(guarded, ["ab", "c"]).info  # nor on a healthy batch


def test_a_sample_past_the_time_limit_gets_the_fallback_within_the_limit() -> None:
    guarded = GuardedReward(LengthReward(sleep_s=2.0), fallback=0.5, timeout_s=0.2)
    start = time.monotonic()
    with pytest.warns(RuntimeWarning, match="sample 0 of the batch failed .RewardTimeout"):
        out = score(guarded, ["slow", "abc"])
    # the batch call and sample 0's call each abandoned after 0.2 s (they sleep 2 s)
    assert time.monotonic() - start < 1.5
    assert out.scores.tolist() == [0.5, 3.0]
    assert out.info[REWARD_ERROR_KEY].tolist() == [1.0, 0.0]


def test_an_infinite_score_gets_the_fallback() -> None:
    inner = LengthReward()
    with pytest.warns(RuntimeWarning, match="RewardReturnError: reward 'length' returned inf"):
        out = score(GuardedReward(inner, timeout_s=None), ["inf", "a"])
    # the batch, then each sample: only the infinite one falls back
    assert out.scores.tolist() == [0.0, 1.0] and inner.calls == 3
    assert out.info[REWARD_ERROR_KEY].tolist() == [1.0, 0.0]


def test_a_nan_score_means_no_score_and_is_not_a_failure() -> None:
    inner = LengthReward()
    out = score(GuardedReward(inner, timeout_s=None), ["nan", "a"])
    assert math.isnan(out.scores[0]) and out.scores[1] == 1.0 and inner.calls == 1
    assert out.info[REWARD_ERROR_KEY].tolist() == [0.0, 0.0]
    assert out.info[REWARD_MASKED_KEY].tolist() == [0.0, 0.0]  # reward_fallback's, not masked


def test_a_healthy_batch_is_scored_once_in_the_callers_grad_mode() -> None:
    seen: list[bool] = []

    def reward(prompts: Any, completions: Sequence[str], rows: Any) -> RewardOutput:
        seen.append(torch.is_grad_enabled())
        assert threading.current_thread() is not threading.main_thread()
        return RewardOutput(torch.ones(len(completions)))

    with torch.no_grad():
        out = score(GuardedReward(reward), ["a", "b"])
    assert seen == [False] and out.info[REWARD_ERROR_KEY].tolist() == [0.0, 0.0]


def test_only_the_first_three_errors_are_warned_about() -> None:
    guarded = GuardedReward(LengthReward(), timeout_s=None)
    with pytest.warns(RuntimeWarning) as caught:
        for _ in range(3):
            score(guarded, ["boom", "a"])
    assert len(caught) == 3 and "only counted" in str(caught[-1].message)
    assert guarded.errors == 3


def test_with_fallback_a_batch_where_every_sample_fails_is_an_error() -> None:
    guarded = GuardedReward(LengthReward(), timeout_s=None, on_error="fallback")
    with pytest.raises(RuntimeError, match="failed on all 2 samples") as error:
        score(guarded, ["boom", "boom"])
    assert isinstance(error.value, FailedBatchError)
    assert isinstance(error.value.__cause__, KeyError)


def test_with_mask_only_max_failed_batches_in_a_row_are_an_error() -> None:
    guarded = GuardedReward(LengthReward(), timeout_s=None, max_failed_batches=2)
    with pytest.warns(RuntimeWarning, match=r"failed on all 2 samples .* makes no update \(1 "):
        out = score(guarded, ["boom", "boom"])
    assert out.info[REWARD_MASKED_KEY].tolist() == [1.0, 1.0]
    score(guarded, ["a", "bc"])  # a healthy batch in between starts the count again
    with pytest.warns(RuntimeWarning, match="makes no update"):
        score(guarded, ["boom", "boom"])
    with pytest.raises(FailedBatchError, match="failed on all 2 samples of the batch and 2 in"):
        score(guarded, ["boom", "boom"])


def test_too_many_stalled_calls_are_an_error() -> None:
    guarded = GuardedReward(LengthReward(sleep_s=1.0), timeout_s=0.05, max_stalled_calls=1)
    with pytest.raises(RuntimeError, match=r"2 calls ran past timeout_s=0\.05"):
        score(guarded, ["slow", "a"])  # the batch call and sample 0's call both stall


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"timeout_s": -1.0}, "timeout_s must be > 0"),
        ({"timeout_s": 0.0}, "timeout_s must be > 0"),
        ({"fallback": math.nan}, "fallback must be a finite"),
        ({"max_stalled_calls": -1}, "max_stalled_calls must be >= 0"),
        ({"on_error": "drop"}, "on_error must be 'mask' or 'fallback'"),
        ({"max_failed_batches": 0}, "max_failed_batches must be >= 1"),
    ],
)
def test_wrong_settings_are_refused_at_construction(kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        GuardedReward(LengthReward(), **kwargs)


def test_errors_of_guarded_parts_are_counted_in_the_rollout_stats() -> None:
    reward = RewardByTask({"a": GuardedReward(LengthReward(), timeout_s=None), "b": LengthReward()})
    rows = [{"task": "a"}, {"task": "a"}, {"task": "b"}]
    with pytest.warns(RuntimeWarning):
        out = reward([""] * 3, ["boom", "xy", "xyz"], rows)
    ids, mask = torch.zeros(3, 1, dtype=torch.long), torch.ones(3, 1, dtype=torch.bool)
    rollout = Rollout(
        prompt_ids=ids, prompt_mask=mask, response_ids=ids, response_mask=mask,
        sample_log_probs=None, group_ids=torch.arange(3), query_ids=["q"] * 3,
        tasks=["a", "a", "b"], rows=rows, prompts=[""] * 3, responses=["boom", "xy", "xyz"],
        scores=out.scores, reward_info=out.info,
    )  # fmt: skip
    stats = rollout_stats(rollout)
    assert float(stats["fault/reward_errors"]) == 1.0  # "a/reward_error": NaN on task b's row
    assert float(stats["reward/a/reward_error"]) == 0.5
    assert out.scores.tolist() == [0.0, 2.0, 3.0]


def test_the_wrapper_is_built_from_yaml() -> None:
    parser = ArgumentParser()
    parser.add_argument("--reward", type=RewardFunction)
    config = parser.parse_object({"reward": {
        "class_path": "lit_rlhf.rewards.GuardedReward",
        "init_args": {"reward": {"class_path": "lit_rlhf.rewards.DigitFractionReward"},
                      "fallback": -0.5, "timeout_s": 2.0, "on_error": "fallback"},
    }})  # fmt: skip
    reward = parser.instantiate_classes(config).reward
    assert isinstance(reward, GuardedReward) and reward.fallback == -0.5
    assert reward.on_error == "fallback"
    assert reward.timeout_s == 2.0 and type(reward.reward).__name__ == "DigitFractionReward"
