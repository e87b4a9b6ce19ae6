"""DigitFractionReward: the smoke-test reward."""

from __future__ import annotations

import pytest

from lit_rlhf.rewards import DigitFractionReward, RewardFunction


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("123", 1.0),
        ("a1 2", 2 / 3),  # non-whitespace a, 1, 2: two digits of three
        ("ab\n\t c", 0.0),
        ("", 0.0),
        ("   ", 0.0),
        ("١٢٣", 0.0),  # Arabic-Indic digits are not ASCII digits
    ],
)
def test_digit_fraction(text, expected):
    reward = DigitFractionReward()
    assert isinstance(reward, RewardFunction)
    assert reward([""], [text], [{}]).scores.item() == pytest.approx(expected)
