"""RewardByTask: each row's task picks its reward; info per task, NaN elsewhere; logged as means
over that task's rows only."""

from __future__ import annotations

import math

import pytest
import torch

from lit_rlhf.rewards import DigitFractionReward, RewardByTask
from lit_rlhf.training.rollouts import rollout_stats
from lit_rlhf.types import RewardOutput


def _length(prompts, completions, rows):  # type: ignore[no-untyped-def]
    lengths = torch.tensor([float(len(c)) for c in completions])
    return RewardOutput(lengths, {"long": (lengths > 3).float()})


def test_rows_are_scored_by_their_tasks_reward_and_info_is_per_task() -> None:
    reward = RewardByTask({"digits": DigitFractionReward(), "chat": _length})
    rows = [{"task": "digits"}, {"task": "chat"}, {"task": "digits"}, {"task": "chat"}]
    out = reward(["p"] * 4, ["12ab", "hello", "9", "hi"], rows)
    torch.testing.assert_close(out.scores, torch.tensor([0.5, 5.0, 1.0, 2.0]))
    chat_long = out.info["chat/long"]
    assert math.isnan(chat_long[0]) and chat_long[1] == 1.0 and chat_long[3] == 0.0
    torch.testing.assert_close(out.info["digits/score"][[0, 2]], torch.tensor([0.5, 1.0]))
    assert out.info["digits/score"][[1, 3]].isnan().all()


def test_rollout_stats_average_each_task_over_its_own_rows() -> None:
    reward = RewardByTask({"digits": DigitFractionReward(), "chat": _length})
    rows = [{"task": "digits"}, {"task": "chat"}, {"task": "chat"}]
    out = reward(["p"] * 3, ["12", "hello", "hi"], rows)

    class _Rollout:
        scores, response_mask = out.scores, torch.ones(3, 2, dtype=torch.bool)
        reward_info, term_stats, group_ids = out.info, {}, torch.arange(3)

        def __len__(self) -> int:
            return 3

    stats = rollout_stats(_Rollout())  # type: ignore[arg-type]
    assert float(stats["reward/chat/score"]) == pytest.approx(3.5)  # (5 + 2) / 2, not / 3
    assert float(stats["reward/digits/score"]) == pytest.approx(1.0)


def test_unknown_tasks_fail_naming_the_row_unless_a_default_is_given() -> None:
    reward = RewardByTask({"chat": _length})
    with pytest.raises(ValueError, match=r"row 1 \(query 'q1'\) has task 'math'"):
        reward(["p", "p"], ["a", "b"], [{"task": "chat"}, {"task": "math", "query_id": "q1"}])
    fallback = RewardByTask({"chat": _length}, default=DigitFractionReward())
    out = fallback(["p"], ["42"], [{"task": "math"}])
    assert float(out.scores[0]) == 1.0 and "math/score" in out.info
    with pytest.raises(ValueError, match="at least one task"):
        RewardByTask({})
