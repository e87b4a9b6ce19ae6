"""ArithmeticPrompts: seeded questions whose reference answer is the expression's value, and
settings refused when the source is built."""

from __future__ import annotations

import pytest

from lit_rlhf.data import ArithmeticPrompts
from lit_rlhf.rewards import MathReward
from lit_rlhf.rewards.countdown import evaluate_expression


def test_rows_are_seeded_and_answers_are_the_values():
    rows = ArithmeticPrompts(num_examples=20, seed=3, operators="+-*").rows()
    assert rows == ArithmeticPrompts(num_examples=20, seed=3, operators="+-*").rows()
    assert rows != ArithmeticPrompts(num_examples=20, seed=4, operators="+-*").rows()
    for i, row in enumerate(rows):
        value, _ = evaluate_expression(row["expression"])
        assert row["answer"] == str(value) and row["query_id"] == f"arithmetic-3-{i}"
        a, _, b = row["expression"].split()
        assert 11 <= int(a) <= 99 and 11 <= int(b) <= 99
        assert row["question"] == f"Compute {row['expression']}. Put the value in \\boxed{{}}."
    assert {r["expression"].split()[1] for r in rows} == {"+", "-", "*"}


def test_math_reward_scores_the_boxed_value():
    row = ArithmeticPrompts(num_examples=1, seed=0).rows()[0]
    out = MathReward(format_reward=0.1)(
        ["q", "q"], [f"\\boxed{{{row['answer']}}}", "\\boxed{1}"], [row, row]
    )
    assert out.scores.tolist() == pytest.approx([1.0, 0.1])


@pytest.mark.parametrize("kwargs,match", [
    ({"num_examples": 0}, "num_examples must be >= 1"),
    ({"min_a": 50, "max_a": 10}, "empty operand range"),
    ({"operators": "/"}, "operators must be a non-empty subset"),
    ({"question_template": "Compute {x}"}, "may use only {expression}"),
])  # fmt: skip
def test_bad_settings_are_refused(kwargs, match):
    with pytest.raises(ValueError, match=match):
        ArithmeticPrompts(**kwargs)
