"""Demonstrations: scripted episodes of an environment written out as chat rows for supervised
fine-tuning (a warm start before RL, as tool-use recipes do when the base model never calls the
tool from the instruction alone).

:func:`scripted_messages` plays given agent turns against the real environment, so every
observation in a demonstration is exactly what the environment answers during RL, and returns
a ``{"messages": [...]}`` row that :class:`~lit_rlhf.data.SFTDataModule` trains on (loss on the
assistant turns only). :func:`countdown_calculator_turns` is the Countdown calculator example's
script: check the sum with the calculator, then answer the sum when the result is the target
and the difference otherwise; :func:`arithmetic_calculator_turns` the arithmetic example's: call
the calculator on the expression, then box its result.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from lit_rlhf.envs.base import Environment


def scripted_messages(
    env: Environment,
    row: Mapping[str, Any],
    turns: Sequence[str],
    *,
    question: str,
    system_prompt: str | None = None,
    observation_role: str = "tool",
) -> dict[str, list[dict[str, str]]]:
    """``{"messages": [system?, user: question, assistant: turns[0], <observation_role>: the
    environment's answer, assistant: turns[1], ...]}`` from stepping a copy of ``env`` reset on
    ``row``. ``observation_role`` must be the role the multi-turn loop renders environment turns
    with for the tokenizer that will train on the row
    (:func:`lit_rlhf.training.multiturn.observation_role`).

    Raises ValueError when a turn makes a fault (a demonstration must show good calls), when the
    episode ends before the last turn or does not end after it."""
    if not turns:
        raise ValueError("a demonstration needs at least one agent turn")
    episode = copy.deepcopy(env)
    episode.reset(row)
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": question})
    for index, turn in enumerate(turns):
        messages.append({"role": "assistant", "content": turn})
        result = episode.step(turn)
        if result.fault is not None:
            raise ValueError(f"demonstration turn {index} ({turn!r}) is a fault: {result.fault}")
        last = index == len(turns) - 1
        if result.done != last:
            state = "ends after" if result.done else "does not end after"
            raise ValueError(f"the episode {state} turn {index} of {len(turns)} ({turn!r})")
        if not last:
            messages.append({"role": observation_role, "content": result.observation})
    return {"messages": messages}


def countdown_calculator_turns(numbers: Sequence[int], target: int) -> list[str]:
    """The calculator example's agent turns for two numbers: ``<tool>calculator: a + b</tool>``
    (the numbers in the question's order), then ``<answer>a + b</answer>`` when ``a + b`` is the
    target, else ``<answer>larger - smaller</answer>``. ValueError when neither reaches it."""
    return [
        f"<tool>calculator: {numbers[0]} + {numbers[1]}</tool>",
        countdown_answer(numbers, target),
    ]


def countdown_answer(numbers: Sequence[int], target: int) -> str:
    """``<answer>a + b</answer>`` or ``<answer>larger - smaller</answer>``, whichever reaches
    ``target`` (two numbers, + or -); ValueError when neither does."""
    if len(numbers) != 2:
        raise ValueError(f"the calculator script takes two numbers, got {list(numbers)}")
    a, b = numbers
    if a + b == target:
        return f"<answer>{a} + {b}</answer>"
    if abs(a - b) == target:
        return f"<answer>{max(a, b)} - {min(a, b)}</answer>"
    raise ValueError(f"neither {a} + {b} nor their difference reaches {target}")


def arithmetic_calculator_turns(expression: str, answer: str) -> list[str]:
    """The arithmetic calculator example's agent turns: ``<tool>calculator: EXPRESSION</tool>``,
    then the ``<result>`` value as ``\\boxed{VALUE}``."""
    return [f"<tool>calculator: {expression}</tool>", arithmetic_answer(answer)]


def arithmetic_answer(answer: str) -> str:
    """``\\boxed{VALUE}``: the answer format :class:`~lit_rlhf.rewards.MathReward` reads."""
    return f"\\boxed{{{answer}}}"
