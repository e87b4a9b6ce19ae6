"""``reward/tied_groups``: the share of prompt groups whose rewards all tie (zero GRPO / RLOO
advantage), logged with the rollout statistics, over the samples whose reward did not fail."""

from __future__ import annotations

import pytest
import torch

from lit_rlhf.algos.advantages import group_advantages, tied_group_share


def test_the_share_counts_groups_not_samples_and_matches_zero_advantages() -> None:
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.5])
    groups = torch.tensor([4, 4, 7, 7, 9, 9, 9])  # group ids need not be 0..n-1
    assert float(tied_group_share(scores, groups)) == pytest.approx(2 / 3)
    # exactly the groups GRPO gives zero advantage
    adv = group_advantages(scores, groups, scale_by_std=True, eps=1e-6)
    zero = {int(g) for g in groups.unique() if adv[groups == g].abs().max() == 0}
    assert zero == {4, 9}


def test_single_sample_groups_are_not_counted() -> None:
    assert tied_group_share(torch.tensor([1.0, 0.0]), torch.tensor([0, 1])) is None
    assert tied_group_share(torch.tensor([]), torch.tensor([], dtype=torch.long)) is None
    # the lone sample of group 0 counts for nothing, tied or not
    lone = torch.tensor([0, 1, 1])
    assert float(tied_group_share(torch.tensor([1.0, 0.0, 0.0]), lone)) == 1.0
    assert float(tied_group_share(torch.tensor([0.0, 0.0, 1.0]), lone)) == 0.0
