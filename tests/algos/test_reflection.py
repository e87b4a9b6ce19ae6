"""ReflectRM's two-stage inference rules on hand-made inputs."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from lit_rlhf.algos import confidence, reflective_vote, select_anchor


def test_confidence_averages_the_lowest_tenth_of_each_row() -> None:
    # row 0: 20 tokens -> the lowest 2: (-5 + -4) / 2; row 1: 3 real tokens -> ceil(0.3) = 1
    # token, the lowest (-2); the padding (-100 under a false mask) is never counted.
    row0 = [-5.0, -4.0] + [-0.1] * 18
    row1 = [-1.0, -2.0, -0.5] + [-100.0] * 17
    log_probs = torch.tensor([row0, row1])
    mask = torch.tensor([[1] * 20, [1] * 3 + [0] * 17])
    assert confidence(log_probs, mask).tolist() == pytest.approx([-4.5, -2.0])


def test_thirty_tokens_give_three_not_four() -> None:
    # 0.1 * 30 is 3.0000000000000004 in floats; ceil must still give 3 tokens.
    log_probs = torch.tensor([[-3.0, -2.0, -1.0] + [-0.5] * 27])
    out = confidence(log_probs, torch.ones(1, 30))
    assert out.item() == pytest.approx(-2.0)  # (-3 - 2 - 1) / 3; four would give -1.625


def test_empty_row_is_least_confident_and_fraction_one_is_the_mean() -> None:
    log_probs = torch.tensor([[-1.0, -3.0], [0.0, 0.0]])
    mask = torch.tensor([[1, 1], [0, 0]])
    out = confidence(log_probs, mask, lowest_fraction=1.0)
    assert out[0].item() == pytest.approx(-2.0) and out[1].item() == -math.inf
    assert select_anchor(out) == 0


@given(
    st.lists(st.floats(-20, 0), min_size=1, max_size=40),
    st.sampled_from([0.05, 0.1, 0.25, 0.5, 1.0]),
)
def test_confidence_matches_a_sorted_reference(values: list[float], fraction: float) -> None:
    count = max(1, -(-len(values) * round(fraction * 100) // 100))  # exact integer ceil
    expected = float(np.mean(sorted(values)[:count]))
    out = confidence(torch.tensor([values]), torch.ones(1, len(values)), lowest_fraction=fraction)
    assert out.item() == pytest.approx(expected, abs=1e-5)


def test_confidence_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="lowest_fraction must be in"):
        confidence(torch.zeros(1, 2), torch.ones(1, 2), lowest_fraction=0.0)
    with pytest.raises(ValueError, match=r"must both be \[B, T\]"):
        confidence(torch.zeros(1, 2), torch.ones(1, 3))


def test_select_anchor_takes_the_first_of_equals_and_refuses_nan() -> None:
    assert select_anchor(torch.tensor([-2.0, -0.5, -0.5, -1.0])) == 1
    with pytest.raises(ValueError, match="NaN"):
        select_anchor(torch.tensor([-1.0, float("nan")]))
    with pytest.raises(ValueError, match="non-empty"):
        select_anchor(torch.tensor([]))


@pytest.mark.parametrize(
    ("verdicts", "winners", "anchor", "expected"),
    [
        ([1, -1, -1, 1], [1, 2], 0, -1),  # the winners agree (-1), overriding the anchor (+1)
        ([1, -1, 1, -1], [1, 2], 0, 1),  # the winners tie (-1, +1): the anchor (+1) decides
        ([-1, 1, 1, 1], [], 0, -1),  # no winners: the anchor's verdict
        ([1, -1, -1, -1, 1], [1, 2, 4], 0, -1),  # majority 2 : 1 of the winners
        ([-1, 1], [1], 0, 1),  # a single winner beats the anchor
    ],
)
def test_reflective_vote(verdicts: list[int], winners: list[int], anchor: int, expected: int):
    assert reflective_vote(verdicts, winners, anchor) == expected


def test_reflective_vote_refuses_bad_input() -> None:
    with pytest.raises(ValueError, match="-1 or \\+1"):
        reflective_vote([1, 0], [], 0)
    with pytest.raises(ValueError, match="cannot be among the winners"):
        reflective_vote([1, -1], [0, 1], 0)
    with pytest.raises(ValueError, match="distinct rollout indices"):
        reflective_vote([1, -1], [1, 1], 0)
    with pytest.raises(ValueError, match="not a rollout index"):
        reflective_vote([1, -1], [], 2)
