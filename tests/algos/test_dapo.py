"""DAPO's rollout shaping (arXiv 2503.14476): the soft overlong punishment of eq. 13 at chosen
lengths, the truncation flag, and dynamic sampling's filter of equal-reward groups."""

import pytest
import torch

from lit_rlhf.algos import informative_groups, overlong_penalty, truncated_responses


@pytest.mark.parametrize(
    "length,expected",
    [(0, 0.0), (10, 0.0), (16, 0.0), (17, -0.25), (18, -0.5), (19, -0.75), (20, -1.0), (25, -1.0)],
)
def test_overlong_penalty_at_chosen_lengths(length, expected):
    # L_max = 20, L_cache = 4: 0 up to 16 tokens, ((20 - 4) - |y|) / 4 inside the buffer, -1 beyond
    got = overlong_penalty(torch.tensor([length]), max_length=20, buffer=4)
    assert float(got) == pytest.approx(expected)
    scaled = overlong_penalty(torch.tensor([length]), max_length=20, buffer=4, factor=0.5)
    assert float(scaled) == pytest.approx(0.5 * expected)


def test_overlong_penalty_refuses_a_buffer_longer_than_the_cap():
    with pytest.raises(ValueError, match="buffer must be in"):
        overlong_penalty(torch.tensor([3]), max_length=4, buffer=5)


def test_truncated_responses_are_the_non_empty_ones_without_an_end():
    mask = torch.tensor([[1, 1, 1], [1, 0, 0], [0, 0, 0]], dtype=torch.bool)
    ended = torch.tensor([False, True, False])
    assert truncated_responses(mask, ended).tolist() == [True, False, False]


def test_informative_groups_drop_groups_whose_rewards_are_all_equal():
    scores = torch.tensor([1.0, 1.0, 0.0, 1.0, 0.5, 0.5, 0.0, 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2, 3, 3])
    assert informative_groups(scores, groups).tolist() == [False, False, True, True] + [False] * 4
    near = torch.tensor([1.0, 1.0 + 1e-9])
    assert informative_groups(near, torch.tensor([5, 5]), atol=1e-6).tolist() == [False, False]
