"""Demonstrations for the calculator example's warm start (lit_rlhf.envs.demos,
scripts/data/calculator_demos.py): scripted episodes against the real environment, encoded for SFT
as exactly the token stream the multi-turn RL loop builds for the same turns."""

from __future__ import annotations

import json

import pytest

from lit_rlhf.data.prompts import render_chat_prompt
from lit_rlhf.data.sft import IGNORE, SFTEncoder
from lit_rlhf.envs import CountdownCalculatorEnv, StepResult
from lit_rlhf.envs.demos import (
    arithmetic_answer,
    arithmetic_calculator_turns,
    countdown_answer,
    countdown_calculator_turns,
    scripted_messages,
)
from lit_rlhf.models import load_tokenizer
from lit_rlhf.rewards.countdown import evaluate_expression
from lit_rlhf.settings import EnvironmentSettings
from lit_rlhf.training.multiturn import MultiTurnRollout, observation_role
from tests.helpers import load_script

ROW = {"numbers": [9, 4], "target": 5}


def _demos_script():
    return load_script("data/calculator_demos")


@pytest.mark.parametrize("numbers,target,expected", [
    ([9, 4], 13, "<answer>9 + 4</answer>"),
    ([9, 4], 5, "<answer>9 - 4</answer>"),
    ([4, 9], 5, "<answer>9 - 4</answer>"),
])  # fmt: skip
def test_countdown_answer_reaches_the_target(numbers, target, expected):
    answer = countdown_answer(numbers, target)
    assert answer == expected
    value, _ = evaluate_expression(answer.removeprefix("<answer>").removesuffix("</answer>"))
    assert value == target


def test_countdown_answer_refuses_an_unreachable_target():
    with pytest.raises(ValueError, match="neither 9 \\+ 4 nor their difference reaches 7"):
        countdown_answer([9, 4], 7)
    with pytest.raises(ValueError, match="two numbers"):
        countdown_answer([1, 2, 3], 6)


def test_scripted_messages_hold_the_environments_own_answers():
    turns = countdown_calculator_turns(ROW["numbers"], ROW["target"])
    row = scripted_messages(CountdownCalculatorEnv(), ROW, turns, question="Q", system_prompt="S")
    assert row["messages"] == [
        {"role": "system", "content": "S"},
        {"role": "user", "content": "Q"},
        {"role": "assistant", "content": "<tool>calculator: 9 + 4</tool>"},
        {"role": "tool", "content": "<result>13</result>"},  # the sum is not 5: answer 9 - 4
        {"role": "assistant", "content": "<answer>9 - 4</answer>"},
    ]


class _Faulty:
    def reset(self, row):
        pass

    def step(self, turn):
        return StepResult("<error>bad</error>", fault="malformed tool call")


def test_scripted_messages_refuse_faults_and_misplaced_ends():
    env = CountdownCalculatorEnv()
    with pytest.raises(ValueError, match=r"turn 0 .* is a fault: malformed tool call"):
        scripted_messages(_Faulty(), ROW, ["x"], question="Q")
    with pytest.raises(ValueError, match="ends after turn 0 of 2"):
        scripted_messages(env, ROW, ["<answer>9 - 4</answer>", "more"], question="Q")
    with pytest.raises(ValueError, match="does not end after turn 0 of 1"):
        scripted_messages(env, ROW, ["<tool>calculator: 9 + 4</tool>"], question="Q")
    with pytest.raises(ValueError, match="at least one agent turn"):
        scripted_messages(env, ROW, [], question="Q")


def test_shipped_demonstrations_are_what_the_script_writes():
    script = _demos_script()
    for arm in script.CONFIGS:
        shipped = [json.loads(line) for line in script.demo_file(arm).read_text().splitlines()]
        assert shipped == script.demo_rows(arm, len(shipped), seed=2)
        assert len(shipped) == 128
        calls = sum(m["role"] == "tool" for row in shipped for m in row["messages"])
        assert calls == (64 if "calculator" in arm else 0)  # half the calculator demos call it


def test_sft_tokens_of_a_demonstration_are_the_rl_loops_tokens():
    """The SFT encoding of a calculator demonstration is the token stream the multi-turn loop
    builds from the same agent turns (prompt, turn 1 + EOS, the environment turn rendered once,
    turn 2 + EOS); SFT trains the agent tokens and the newline after each EOS, never the
    prompt or the tool's turn."""
    tokenizer = load_tokenizer("builtin:smollm2-135m-instruct")
    demo = json.loads(_demos_script().demo_file("calculator").read_text().splitlines()[3])
    system, user, turn1, tool, turn2 = (m["content"] for m in demo["messages"])
    assert demo["messages"][3]["role"] == observation_role(tokenizer) == "tool"
    encoded = SFTEncoder(tokenizer, max_length=512, chat_template=True).encode(demo, "demo")

    def ids(text):
        return tokenizer(text, add_special_tokens=False)["input_ids"]

    eos = tokenizer.eos_token_id
    loop = MultiTurnRollout(CountdownCalculatorEnv(), EnvironmentSettings(max_turns=2))
    prompt = ids(render_chat_prompt(tokenizer, user, system_prompt=system))
    agent1, env, agent2 = [*ids(turn1), eos], ids(loop.render(tokenizer, tool)), [*ids(turn2), eos]
    stream = prompt + agent1 + env + agent2
    assert encoded["input_ids"][: len(stream)] == stream
    trained = [i for i, label in enumerate(encoded["labels"]) if label != IGNORE]
    start1, start2 = len(prompt), len(prompt) + len(agent1) + len(env)
    newline = ids("\n")
    assert env[: len(newline)] == newline  # the environment turn opens with the EOS's newline
    expected = [*range(start1, start1 + len(agent1) + len(newline)),
                *range(start2, start2 + len(agent2) + len(newline))]  # fmt: skip
    assert trained == expected


def test_arithmetic_demonstration_boxes_the_calculators_result():
    turns = arithmetic_calculator_turns("78 * 98", "7644")
    row = scripted_messages(CountdownCalculatorEnv(), {}, turns, question="Q")
    assert [m["content"] for m in row["messages"]] == [
        "Q",
        "<tool>calculator: 78 * 98</tool>",
        "<result>7644</result>",
        "\\boxed{7644}",
    ]
    assert arithmetic_answer("12") == "\\boxed{12}"
