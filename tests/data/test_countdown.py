"""The procedural Countdown generator: solvable by construction, deterministic, validated."""

from __future__ import annotations

import ast
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.data.countdown import countdown_question, generate_countdown
from lit_rlhf.rewards.countdown import CountdownReward, evaluate_expression


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    num_numbers=st.sampled_from([2, 3, 4, 5, (3, 4), (2, 6)]),
    operators=st.sampled_from(["+-*/", "+", "+-", "*/+", "-*"]),
    max_value=st.integers(1, 99),
)
def test_every_solution_scores_one(seed, num_numbers, operators, max_value):
    rows = generate_countdown(
        8, seed=seed, num_numbers=num_numbers, max_value=max_value, operators=operators
    )
    out = CountdownReward()(
        [""] * len(rows), [f"<answer>{r['solution']}</answer>" for r in rows], rows
    )
    assert out.scores.tolist() == [1.0] * len(rows)
    low, high = (num_numbers, num_numbers) if isinstance(num_numbers, int) else num_numbers
    for row in rows:
        value, literals = evaluate_expression(row["solution"])
        assert value == row["target"] and Counter(literals) == Counter(row["numbers"])
        assert low <= len(row["numbers"]) <= high
        assert all(1 <= n <= max_value for n in row["numbers"])
        assert 1 <= row["target"] <= 999
        assert set(row["solution"]) <= set("0123456789()" + operators + " ")


def test_row_format():
    rows = generate_countdown(3, seed=7)
    assert [r["query_id"] for r in rows] == ["countdown-7-0", "countdown-7-1", "countdown-7-2"]
    for row in rows:
        assert set(row) == {"query_id", "numbers", "target", "solution"}
        assert isinstance(row["target"], int)
        assert all(isinstance(n, int) for n in row["numbers"])


def test_deterministic_by_seed_and_prefix_stable():
    assert generate_countdown(20, seed=3) == generate_countdown(20, seed=3)
    assert generate_countdown(20, seed=3) != generate_countdown(20, seed=4)
    assert generate_countdown(20, seed=3)[:5] == generate_countdown(5, seed=3)
    assert generate_countdown(0, seed=3) == []


def _intermediates(solution: str) -> list:
    """The value of every operator node of the solution's expression tree."""
    tree = ast.parse(solution, mode="eval")
    return [
        evaluate_expression(ast.unparse(node))[0]
        for node in ast.walk(tree)
        if isinstance(node, ast.BinOp)
    ]


@pytest.mark.parametrize("max_target", [10, 999])
def test_intermediates_are_positive_integers_within_max_target(max_target):
    for row in generate_countdown(50, seed=0, max_value=9, max_target=max_target):
        values = _intermediates(row["solution"])
        assert values and all(v.denominator == 1 and 1 <= v <= max_target for v in values)


def test_question_mentions_numbers_target_and_tags():
    row = {"numbers": [3, 5, 7], "target": 22}
    text = countdown_question(row)
    assert "[3, 5, 7]" in text and "22" in text
    assert "<think>" in text and "<answer>" in text


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_examples": -1}, "num_examples"),
        ({"num_numbers": 1}, "num_numbers"),
        ({"num_numbers": (4, 3)}, "num_numbers"),
        ({"num_numbers": (2, 3, 4)}, "num_numbers"),
        ({"num_numbers": True}, "num_numbers"),
        ({"min_value": 0}, "min_value"),
        ({"min_value": 50, "max_value": 10}, "max_value"),
        ({"max_target": 0}, "max_target"),
        ({"operators": ""}, "operators"),
        ({"operators": "+^"}, "operators"),
    ],
)
def test_argument_validation(kwargs, match):
    kwargs = {"num_examples": 2, **kwargs}
    with pytest.raises(ValueError, match=match):
        generate_countdown(seed=0, **kwargs)


def test_impossible_configuration_fails_clearly():
    # 1 - 1 = 0 is never a positive result: no task exists
    with pytest.raises(ValueError, match="could not build"):
        generate_countdown(1, seed=0, num_numbers=2, min_value=1, max_value=1, operators="-")
