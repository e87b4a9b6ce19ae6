"""MathReward: boxed extraction, GSM8K references, math-verify equivalence, thread safety."""

from __future__ import annotations

import threading

import pytest

import lit_rlhf.rewards.math as math_reward
from lit_rlhf.rewards import MathReward, RewardFunction
from lit_rlhf.rewards.math import extract_boxed, reference_answer


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (r"so \boxed{72}.", "72"),
        (r"\boxed{\frac{1}{2}}", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{\sqrt{\frac{a}{b}}} done", r"\sqrt{\frac{a}{b}}"),
        (r"\boxed{1} then \boxed{2}", "2"),  # the last one wins
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are not structure
        (r"$\boxed 5$", "5"),
        (r"\boxed {3}", "3"),
        (r"\boxed{1} then \boxed{2", None),  # a truncated last box
        ("no box here", None),
        (r"\boxed", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


def test_reference_answer():
    assert reference_answer({"answer": "Natalia sold 48/2 = 24 ...\n#### 72"}) == "72"
    assert reference_answer({"answer": "a #### b #### 1,000 "}) == "1,000"
    assert reference_answer({"solution": r"\frac{1}{2}"}, "solution") == r"\frac{1}{2}"
    assert reference_answer({"answer": 72}) == "72"
    with pytest.raises(ValueError, match="'answer'"):
        reference_answer({"question": "?"})


def score(reward: MathReward, completions: list[str], answers: list[str]):
    rows = [{"answer": a} for a in answers]
    return reward([""] * len(rows), completions, rows)


EQUIVALENT = [
    (r"\boxed{\frac{1}{2}}", "0.5"),
    (r"\boxed{0.5}", r"\frac{1}{2}"),
    (r"\boxed{\dfrac{1}{2}}", r"\frac12"),
    (r"The answer is \boxed{72}.", "Natalia sold 48/2 = 24 clips in May.\n#### 72"),
    (r"\boxed{1000}", "#### 1,000"),
    (r"\boxed{\frac{\sqrt{2}}{2}}", r"\frac{1}{\sqrt{2}}"),  # nested braces, symbolic
    (r"\boxed{x^{2}+1}", "x^2 + 1"),
    (r"\boxed{\{2, 1\}}", r"\{1, 2\}"),
    (r"\boxed{\pi}", r"\pi"),
]


@pytest.mark.parametrize(("completion", "answer"), EQUIVALENT)
def test_equivalent_answers_score_one(completion, answer):
    out = score(MathReward(), [completion], [answer])
    assert out.scores.item() == 1.0
    assert out.info["correct"].item() == 1.0 and out.info["has_boxed"].item() == 1.0


def test_wrong_missing_and_format_scores():
    reward = MathReward(format_reward=0.1, correct_reward=2.0)
    completions = [r"\boxed{72}", r"\boxed{73}", "72", r"\boxed{}", r"\boxed{x+}"]
    out = score(reward, completions, ["#### 72"] * 5)
    # correct, boxed but wrong, no box, empty box, unparsable box
    assert out.scores.tolist() == pytest.approx([2.0, 0.1, 0.0, 0.0, 0.1])
    assert out.info["correct"].tolist() == [1.0, 0.0, 0.0, 0.0, 0.0]
    assert out.info["has_boxed"].tolist() == [1.0, 1.0, 0.0, 0.0, 1.0]


def test_answer_field_and_length_cap():
    reward = MathReward(answer_field="solution", max_answer_chars=3)
    rows = [{"solution": "1234"}, {"solution": "123"}]
    out = reward(["", ""], [r"\boxed{1234}", r"\boxed{123}"], rows)
    assert out.scores.tolist() == [0.0, 1.0]  # the 4-character answer is never parsed
    with pytest.raises(ValueError, match="'solution'"):
        reward([""], [r"\boxed{1}"], [{"answer": "1"}])


def test_math_verify_failure_scores_only_that_sample(monkeypatch):
    real_parse = math_reward.parse

    def flaky_parse(text, **kwargs):
        if "boom" in text:
            raise RuntimeError("math-verify blew up")
        if "slow" in text:
            raise math_reward.TimeoutException("timed out")  # a BaseException
        return real_parse(text, **kwargs)

    monkeypatch.setattr(math_reward, "parse", flaky_parse)
    out = score(MathReward(), [r"\boxed{2}", r"\boxed{boom}", r"\boxed{slow}"], ["2", "2", "2"])
    assert out.scores.tolist() == [1.0, 0.0, 0.0]


def test_runs_in_a_worker_thread():
    # with signal-based timeouts math-verify raises off the main thread; a 1 proves they are off
    result: dict[str, object] = {}

    def work():
        try:
            result["out"] = score(
                MathReward(), [r"\boxed{\frac{1}{2}}", r"\boxed{3}"], ["0.5", "4"]
            )
        except BaseException as err:
            result["error"] = err

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(timeout=60)
    assert "error" not in result
    assert result["out"].scores.tolist() == [1.0, 0.0]


def test_protocol_and_validation():
    assert isinstance(MathReward(), RewardFunction)
    for kwargs, match in [
        ({"timeout_seconds": 0}, "timeout_seconds"),
        ({"answer_field": ""}, "answer_field"),
        ({"format_reward": float("nan")}, "format_reward"),
        ({"max_answer_chars": 0}, "max_answer_chars"),
    ]:
        with pytest.raises(ValueError, match=match):
            MathReward(**kwargs)
    with pytest.raises(ValueError, match="same length"):
        MathReward()([""], [], [])


@pytest.mark.parametrize(
    ("boxed", "literal_score"),
    [
        ("3850", 1.0),
        (" 3850 ", 1.0),
        ("3,850", 1.0),
        ("3850.0", 1.0),
        ("77 * 50", 0.1),  # math-verify evaluates it to 3850: correct without literal_answers
        ("77 \\times 50", 0.1),
        ("3851", 0.1),
    ],
)
def test_literal_answers_refuse_a_boxed_expression(boxed, literal_score):
    """For a task whose answer is the computation, a boxed expression equal to the reference is
    the question copied, not an answer: literal_answers scores it as wrong (format only)."""
    row = {"answer": "3850"}
    completion = f"so \\boxed{{{boxed}}}"
    plain = MathReward(format_reward=0.1)(["q"], [completion], [row]).scores.item()
    literal = MathReward(format_reward=0.1, literal_answers=True)(["q"], [completion], [row])
    assert literal.scores.item() == pytest.approx(literal_score)
    assert plain == pytest.approx(0.1 if boxed == "3851" else 1.0)
