"""The example environments and the tool-call format, step by step (no model)."""

from __future__ import annotations

import pytest

from lit_rlhf.envs import (
    CountdownCalculatorEnv,
    Environment,
    GuessNumberEnv,
    GuessNumberPrompts,
    StepResult,
    ToolCallError,
    parse_tool_call,
)


def test_tool_call_tag_is_parsed_and_malformed_calls_are_refused():
    call = parse_tool_call("think <tool>calculator: 3*(4+5)</tool> more")
    assert call == ("calculator", "3*(4+5)")
    assert parse_tool_call("no call here") is None
    for bad in ("<tool>calculator 3</tool>", "<tool>calculator: 3", "<tool>: 3</tool>"):
        with pytest.raises(ToolCallError):
            parse_tool_call(bad)


def test_calculator_env_answers_tool_calls_with_the_safe_parser():
    env = CountdownCalculatorEnv()
    assert isinstance(env, Environment)
    env.reset({"numbers": [3, 4, 5], "target": 27})
    assert env.step("<tool>calculator: 3*(4+5)</tool>") == StepResult(
        "<result>27</result>", tool_call=True
    )
    assert env.step("<tool>calculator: 7/2</tool>").observation == "<result>7/2</result>"
    # model text is never eval-ed: names, calls and ** are errors, answered and counted
    for turn in ("<tool>calculator: __import__('os')</tool>", "<tool>calculator: 2**99</tool>"):
        result = env.step(turn)
        assert result.fault == "calculator error" and result.observation.startswith("<error>")
        assert not result.done
    assert env.step("<tool>python: 1</tool>").fault == "unknown tool"
    assert env.step("<tool>calculator 1</tool>").fault == "malformed tool call"
    assert env.step("<answer>3*(4+5)</answer>").done
    assert env.step("no call, no answer").done
    # tool_call flags a well-formed call of any name, even one that fails; not a malformed tag,
    # a turn without a call, or a call beside an <answer> (not run)
    flagged = [
        "<tool>calculator: 1+1</tool>",
        "<tool>python: 1</tool>",
        "<tool>calculator: x</tool>",
    ]
    unflagged = [
        "<tool>calculator 1</tool>",
        "no call",
        "<tool>calculator: 1</tool><answer>1</answer>",
    ]
    assert [env.step(t).tool_call for t in flagged + unflagged] == [True] * 3 + [False] * 3


def test_guess_number_env_gives_per_turn_feedback():
    env = GuessNumberEnv(max_guesses=2)
    env.reset({"target": 7})
    # guess 3 < 7: "higher", reward 0, one guess left
    assert env.step("<guess>3</guess>") == StepResult("higher")
    assert env.step("<guess>7</guess>") == StepResult("correct", 1.0, done=True)
    env.reset({"target": 2})
    assert env.step("five").fault == "no guess"
    assert env.step("<guess>9</guess>") == StepResult("lower", done=True)  # the last guess


def test_env_settings_are_validated():
    with pytest.raises(ValueError, match="Fix:"):
        GuessNumberEnv(max_guesses=0)
    with pytest.raises(ValueError, match="Fix:"):
        CountdownCalculatorEnv(max_expression_chars=0)
    rows = GuessNumberPrompts(num_examples=5, seed=3, max_value=10).load()
    assert len(rows) == 5 and all(1 <= r["target"] <= 10 for r in rows)
