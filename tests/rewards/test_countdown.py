"""CountdownReward: hand cases, the AST whitelist against hostile input, and fuzzing."""

from __future__ import annotations

import contextlib
from fractions import Fraction
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from lit_rlhf.rewards import CountdownReward, RewardFunction
from lit_rlhf.rewards.countdown import evaluate_expression, extract_answer


def score_one(reward: CountdownReward, completion: str, numbers, target, prompt: str = ""):
    out = reward([prompt], [completion], [{"numbers": numbers, "target": target}])
    return out.scores.item(), out.info["correct"].item(), out.info["format_ok"].item()


@pytest.mark.parametrize(
    ("completion", "numbers", "target", "expected"),
    [
        # (1 + 2) * 3 = 9, literals {1, 2, 3}: correct
        ("<think>ok</think><answer>(1 + 2) * 3</answer>", [1, 2, 3], 9, (1.0, 1, 1)),
        # 1 + 2 + 3 = 6 != 9: wrong value, valid format
        ("<answer>1 + 2 + 3</answer>", [1, 2, 3], 9, (0.1, 0, 1)),
        # value 9 but literals {1, 2, 3} != {1, 2, 4}: wrong multiset
        ("<answer>(1 + 2) * 3</answer>", [1, 2, 4], 9, (0.1, 0, 1)),
        # 3 * 3 = 9 reuses 3 and skips 1
        ("<answer>3 * 3</answer>", [3, 1], 9, (0.1, 0, 1)),
        # 3 * 3 = 9 leaves the second 1 unused
        ("<answer>3 * 3 * 1</answer>", [3, 3, 1, 1], 9, (0.1, 0, 1)),
        # the number order in the row does not matter
        ("<answer>3 * (2 + 1)</answer>", [2, 1, 3], 9, (1.0, 1, 1)),
        ("(1 + 2) * 3", [1, 2, 3], 9, (0.0, 0, 0)),  # no tag
        ("<answer>(1 + 2) * 3", [1, 2, 3], 9, (0.0, 0, 0)),  # unclosed tag
        ("<answer></answer>", [1, 2, 3], 9, (0.0, 0, 0)),  # empty answer
        # the last tag wins, both ways round
        ("<answer>1 + 2 + 3</answer> no: <answer>(1 + 2) * 3</answer>", [1, 2, 3], 9, (1.0, 1, 1)),
        ("<answer>(1 + 2) * 3</answer> no: <answer>1 + 2 + 3</answer>", [1, 2, 3], 9, (0.1, 0, 1)),
        # (6 / 4) * 8 = 3/2 * 8 = 12 exactly in Fraction arithmetic
        ("<answer>(6 / 4) * 8</answer>", [6, 4, 8], 12, (1.0, 1, 1)),
        # 1 / 3 * 3 * 7 = 7 exactly (in floats 1/3*3 is already inexact in general)
        ("<answer>1 / 3 * 3 * 7</answer>", [1, 3, 3, 7], 7, (1.0, 1, 1)),
        # a fractional target: 5 / 2 = 2.5
        ("<answer>5 / 2</answer>", [5, 2], 2.5, (1.0, 1, 1)),
        # 4 / (2 - 2): division by zero is invalid
        ("<answer>4 / (2 - 2)</answer>", [4, 2, 2], 1, (0.0, 0, 0)),
        # unary minus: -1 + 10 = 9 negates a given number
        ("<answer>-1 + 10</answer>", [1, 10], 9, (0.0, 0, 0)),
        ("<answer>1.5 * 6</answer>", [1, 6], 9, (0.0, 0, 0)),  # float literal
        ("<answer>3 ** 2</answer>", [3, 2], 9, (0.0, 0, 0)),  # power
        ("<answer>19 // 2</answer>", [19, 2], 9, (0.0, 0, 0)),  # floor division
        ("<answer>19 % 10</answer>", [19, 10], 9, (0.0, 0, 0)),  # modulo
        # whitespace and newlines inside the tag are fine
        ("<answer>\n  (1 + 2)\n  * 3\n</answer>", [1, 2, 3], 9, (1.0, 1, 1)),
    ],
)
def test_hand_cases(completion, numbers, target, expected):
    reward = CountdownReward(format_reward=0.1)
    assert score_one(reward, completion, numbers, target) == pytest.approx(expected)


def test_tolerance_and_rewards_configurable():
    # 10 / 3 = 3.333..., target 3.3333 is 3.3e-5 away
    reward = CountdownReward(correct_reward=2.0, tolerance=1e-4)
    assert score_one(reward, "<answer>10 / 3</answer>", [10, 3], 3.3333)[0] == 2.0
    assert score_one(CountdownReward(), "<answer>10 / 3</answer>", [10, 3], 3.3333)[0] == 0.0


def test_require_think():
    reward = CountdownReward(require_think=True, format_reward=0.1)
    answer = "<answer>(1 + 2) * 3</answer>"
    assert score_one(reward, answer, [1, 2, 3], 9) == (0.0, 0, 0)
    assert score_one(reward, "<think>x</think>" + answer, [1, 2, 3], 9) == (1.0, 1, 1)
    # the opening tag pre-filled by the prompt's template
    assert score_one(reward, "x</think>" + answer, [1, 2, 3], 9, prompt="...<think>\n") == (
        1.0,
        1,
        1,
    )
    # a think block after the answer does not count
    assert score_one(reward, answer + "<think>x</think>", [1, 2, 3], 9) == (0.0, 0, 0)


def test_batch_shapes_and_protocol():
    reward = CountdownReward()
    assert isinstance(reward, RewardFunction)
    rows = [{"numbers": [1, 2], "target": 3}] * 3
    out = reward(["p"] * 3, ["<answer>1 + 2</answer>", "<answer>2 - 1</answer>", ""], rows)
    assert out.scores.tolist() == [1.0, 0.0, 0.0]
    assert out.scores.dtype == out.info["correct"].dtype == out.info["format_ok"].dtype
    assert out.info["format_ok"].tolist() == [1.0, 1.0, 0.0]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"tolerance": -1.0}, "tolerance"),
        ({"tolerance": float("nan")}, "tolerance"),
        ({"format_reward": float("inf")}, "format_reward"),
        ({"correct_reward": float("nan")}, "correct_reward"),
        ({"max_expression_chars": 0}, "max_expression_chars"),
    ],
)
def test_constructor_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        CountdownReward(**kwargs)


@pytest.mark.parametrize(
    ("row", "match"),
    [
        ({"target": 3}, "'numbers'"),
        ({"numbers": [1, 2]}, "'target'"),
        ({"numbers": 5, "target": 3}, "malformed"),
    ],
)
def test_bad_row(row, match):
    with pytest.raises(ValueError, match=match):
        CountdownReward()([""], ["<answer>1 + 2</answer>"], [row])


def test_length_mismatch():
    with pytest.raises(ValueError, match="same length"):
        CountdownReward()(["", ""], [""], [{"numbers": [1], "target": 1}])


MALICIOUS = [
    "__import__('os').system('touch {path}')",
    "open('{path}', 'w').write('pwned')",
    "__import__('pathlib').Path('{path}').touch()",
    "(1).__class__.__bases__[0].__subclasses__()",
    "[x for x in (1, 2, 3)]",
    "lambda: 1",
    "9 ** 9 ** 9 ** 9",  # would never finish if evaluated
    "10 ** 10 ** 10",
    "1 << 10000000",
    "1 + 2; import os",
    "a + b",
    "True + 1",
    "None",
    "'1' + '2'",
    "f'{1}'",
    "1 if 1 else 2",
    "(1, 2)",
    "{1: 2}",
    "1 < 2",
    "not 1",
    "~1",
    "+1 + 2",
    "(x := 3)",
    "0x10",
    "1_0",
    "1e3",
    "１ + ２",  # full-width digits
    "٣ + ٣",  # Arabic-Indic digits
    "1 +\x00 2",
    "(" * 5000 + "1" + ")" * 5000,
    "1 + " * 5000 + "1",
    "-" * 5000 + "1",
    "<answer>1 + 2</answer>",
]


@pytest.mark.parametrize("template", MALICIOUS)
def test_malicious_answers_score_zero_without_side_effects(template, tmp_path: Path):
    path = tmp_path / "pwned"
    answer = template.replace("{path}", str(path))
    reward = CountdownReward(format_reward=0.1)
    # nested tags: the last answer reads "1 + 2</answer>", which is not an expression
    out = reward([""], [f"<answer>{answer}</answer>"], [{"numbers": [1, 2, 3], "target": 6}])
    assert out.scores.item() == 0.0
    assert out.info["format_ok"].item() == 0.0
    assert not path.exists()
    with pytest.raises(ValueError):
        evaluate_expression(answer)


def test_long_answer_rejected_before_parsing():
    reward = CountdownReward(max_expression_chars=10)
    assert score_one(reward, "<answer>1 + 2 + 3 + 4</answer>", [1, 2, 3, 4], 10)[0] == 0.0
    assert score_one(reward, "<answer>1+2+3+4</answer>", [1, 2, 3, 4], 10)[0] == 1.0


def test_evaluate_expression():
    # (6 / 4) * 8 = 12; literals in reading order
    assert evaluate_expression("(6 / 4) * 8") == (Fraction(12), [6, 4, 8])
    assert evaluate_expression("7 - 10") == (Fraction(-3), [7, 10])  # negative results are fine
    with pytest.raises(ValueError, match="max_chars"):
        evaluate_expression("1 + 2", max_chars=3)
    with pytest.raises(ValueError, match="ZeroDivisionError"):
        evaluate_expression("1 / 0")


def test_extract_answer():
    assert extract_answer("a <answer> 1 + 2 </answer> b") == "1 + 2"
    assert extract_answer("<answer>1</answer><answer>2</answer>") == "2"
    assert extract_answer("<answer>1</answer><answer>2") == "1"
    assert extract_answer("2</answer>") is None
    assert extract_answer("") is None


# A random expression tree over small ints with its exact value, computed independently.
_leaf = st.integers(0, 50).map(lambda n: (str(n), Fraction(n), [n]))


def _combine(children):
    def build(args):
        (ls, lv, ll), op, (rs, rv, rl) = args
        if op == "/" and rv == 0:
            op = "+"
        value = {"+": lv + rv, "-": lv - rv, "*": lv * rv, "/": lv / rv if rv else 0}[op]
        return (f"({ls} {op} {rs})", value, ll + rl)

    return st.tuples(children, st.sampled_from("+-*/"), children).map(build)


_trees = st.recursive(_leaf, _combine, max_leaves=6)


@settings(max_examples=100, deadline=None)
@given(_trees)
def test_evaluate_matches_independent_value(tree):
    text, value, literals = tree
    assert evaluate_expression(text) == (value, literals)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=80))
def test_arbitrary_text_never_crashes(text):
    reward = CountdownReward(format_reward=0.1)
    out = reward([""], [f"<answer>{text}</answer>"], [{"numbers": [1, 2], "target": 3}])
    assert out.scores.item() in (0.0, pytest.approx(0.1), 1.0)
    with contextlib.suppress(ValueError):
        evaluate_expression(text)
