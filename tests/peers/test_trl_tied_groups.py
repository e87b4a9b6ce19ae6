"""``reward/tied_groups`` (lit-rlhf) against TRL 1.16's own ``frac_reward_zero_std``: TRL's
``_generate_and_score_completions`` scores the scripted rollout (2 prompts x 4 responses) with a
reward that ties some groups, logs the share of groups whose reward std is zero, and lit-rlhf's
``tied_group_share`` reads the same scores. They agree wherever the scores of a group are exactly
equal or plainly different; they part on a near tie (a spread under ``torch.isclose``'s 1e-8
tolerance), which TRL counts as tied although its advantages there are not all 0, and lit-rlhf
does not, because its advantages there are not 0 either (``group_advantages`` zeroes exactly the
groups whose max equals their min)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from lit_rlhf.algos.advantages import group_advantages, tied_group_share
from tests.peers import trl_side
from tests.peers.trl_side import G, trl_trainer

pytestmark = [pytest.mark.vllm, pytest.mark.peers]

CASES = {
    "none_tied": [1.0, 0.0, 0.5, 2.0, 0.3, 0.3015, 0.3, 0.3007],
    "first_tied": [0.5, 0.5, 0.5, 0.5, 0.0, 1.0, 0.0, 0.0],
    "both_tied": [0.0] * 4 + [1.0] * 4,
    "tied_at_zero_and_one": [1.0] * 4 + [0.1, 0.1, 0.1, 0.1],
}


def _trl(scores: list[float], tmp: str) -> tuple[float, torch.Tensor]:
    """TRL's ``frac_reward_zero_std`` after its own scoring of the scripted rollout, and its
    advantages."""

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        assert len(completions) == len(scores)
        return list(scores)

    trainer = trl_trainer({}, {}, tmp)
    trainer.reward_funcs = [reward]
    prompts = [{"prompt": f"p{i // G}"} for i in range(trl_side.scenario().batch_size)]
    inputs = trainer._generate_and_score_completions(prompts)
    return float(trainer._metrics["train"]["frac_reward_zero_std"][-1]), inputs["advantages"]


def _ours(scores: list[float]) -> float:
    share = tied_group_share(torch.tensor(scores), torch.arange(len(scores)) // G)
    assert share is not None
    return float(share)


@pytest.mark.parametrize("name", sorted(CASES))
def test_tied_groups_equal_trl_frac_reward_zero_std(name: str, trl: Any, tmp_path: Path) -> None:
    scores = CASES[name]
    share, advantages = _trl(scores, str(tmp_path))
    assert _ours(scores) == pytest.approx(share)
    tied = [g for g in range(len(scores) // G) if len(set(scores[g * G : (g + 1) * G])) == 1]
    assert share == len(tied) / (len(scores) // G)
    for g in tied:  # TRL gives a tied group's samples no advantage, as lit-rlhf does
        assert advantages[g * G : (g + 1) * G].abs().max() == 0


def test_near_tie_is_where_the_two_definitions_part(trl: Any, tmp_path: Path) -> None:
    scores = [0.0, 1e-8, 0.0, 0.0, 0.0, 1.0, 0.0, 0.0]  # group 0: std 5e-9, under isclose's 1e-8
    share, trl_advantages = _trl(scores, str(tmp_path))
    assert share == 0.5  # TRL: isclose(std, 0) counts group 0 as tied ...
    assert bool((trl_advantages[:4] != 0).any())  # ... and still gives it advantages
    assert _ours(scores) == 0.0  # lit-rlhf: max != min, not tied
    adv = group_advantages(torch.tensor(scores), torch.arange(8) // G)
    assert bool((adv[:4] != 0).any())  # and its advantages there are not 0: consistent
