"""Countdown with a calculator tool: the agent may call ``<tool>calculator: EXPR</tool>`` (see
:mod:`lit_rlhf.envs.tools`) before it writes its ``<answer>``.

The calculator evaluates with the Countdown reward's whitelisting parser
(:func:`lit_rlhf.rewards.countdown.evaluate_expression`: digits, ``+ - * /`` and parentheses,
exact fractions; model text is never ``eval``-ed). The environment gives no reward of its own:
the episode is scored by the module's injected reward (``CountdownReward``) on the whole
transcript, whose last ``<answer>`` is the agent's.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from lit_rlhf.envs.base import StepResult
from lit_rlhf.envs.tools import ToolCallError, error_text, parse_tool_call, result_text
from lit_rlhf.rewards.countdown import evaluate_expression


class CountdownCalculatorEnv:
    """Args:
    max_expression_chars: longer calculator arguments are refused (an ``<error>`` observation
        and a fault), bounding the parser's time.
    """

    def __init__(self, max_expression_chars: int = 200) -> None:
        if max_expression_chars < 1:
            raise ValueError(
                f"max_expression_chars must be >= 1, got {max_expression_chars}. Fix: set a "
                "positive limit (200 fits any Countdown expression)."
            )
        self.max_expression_chars = max_expression_chars
        self.calls = 0

    def reset(self, row: Mapping[str, Any]) -> None:
        self.calls = 0

    def step(self, turn: str) -> StepResult:
        """An ``<answer>`` (or a turn with no tool call) ends the episode; a calculator call is
        answered with ``<result>VALUE</result>``; a bad call with ``<error>...</error>``. A
        well-formed call (of any tool name) is flagged ``tool_call``; a call in a turn that also
        holds an ``<answer>`` is not run and not flagged."""
        if "<answer>" in turn:
            return StepResult("", done=True)
        try:
            call = parse_tool_call(turn)
        except ToolCallError as err:
            return StepResult(error_text(str(err)), fault="malformed tool call")
        if call is None:
            return StepResult("", done=True)
        if call.name != "calculator":
            reason = f"unknown tool {call.name!r}; the only tool is calculator"
            return StepResult(error_text(reason), fault="unknown tool", tool_call=True)
        self.calls += 1
        try:
            value, _ = evaluate_expression(call.argument, max_chars=self.max_expression_chars)
        except ValueError as err:
            return StepResult(error_text(str(err)), fault="calculator error", tool_call=True)
        text = str(value.numerator) if value.denominator == 1 else str(value)
        return StepResult(result_text(text), tool_call=True)
