"""Countdown with a calculator tool: the agent may call ``<tool>calculator: EXPR</tool>`` (see
:mod:`lit_rlhf.envs.tools`) before it writes its ``<answer>``.

The calculator evaluates with the Countdown reward's whitelisting parser
(:func:`lit_rlhf.rewards.countdown.evaluate_expression`: digits, ``+ - * /`` and parentheses,
exact fractions; model text is never ``eval``-ed). The environment gives no reward of its own:
the episode is scored by the module's injected reward (``CountdownReward``) on the whole
transcript, whose last ``<answer>`` is the agent's.
"""

from __future__ import annotations

from lit_rlhf.envs.tool_env import ToolEnv
from lit_rlhf.rewards.countdown import evaluate_expression


class CountdownCalculatorEnv(ToolEnv):
    """A :class:`~lit_rlhf.envs.ToolEnv` with one tool, ``calculator``: ``<answer>`` (or a turn
    with no tool call) ends the episode; a call is answered with ``<result>VALUE</result>``
    (exact: ``7/2``), a bad one with ``<error>...</error>`` and a fault.

    Args:
        max_expression_chars: longer calculator arguments are refused (an ``<error>``
            observation and a fault), bounding the parser's time.
    """

    def __init__(self, max_expression_chars: int = 200) -> None:
        if max_expression_chars < 1:
            raise ValueError(
                f"max_expression_chars must be >= 1, got {max_expression_chars}. Fix: set a "
                "positive limit (200 fits any Countdown expression)."
            )
        self.max_expression_chars = max_expression_chars
        super().__init__({"calculator": self._calculate})

    def _calculate(self, expression: str) -> str:
        value, _ = evaluate_expression(expression, max_chars=self.max_expression_chars)
        return str(value.numerator) if value.denominator == 1 else str(value)
