"""Countdown reward: use each given number exactly once with + - * / to reach the target.

Source: TinyZero's ``verl/utils/reward_score/countdown.py`` (Pan et al. 2025), as specified in
the TRE paper's Countdown setup (arXiv 2602.03635). Departures from TinyZero, all deliberate:

- TinyZero ``eval``s the answer after a character regex; here the answer is parsed with
  ``ast.parse`` and walked by a whitelist (int literals, binary + - * /, parentheses), then
  evaluated exactly with ``fractions.Fraction``. Model output is never executed.
- Unary minus is rejected: the numbers must be used as given, not negated.
- TinyZero pays its format score for any ``<answer>`` tag, even an unparsable one; here the
  format score needs a parsable expression that evaluates (division by zero does not), and
  optionally a ``<think>`` block.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Any

import torch

from lit_rlhf.rewards.base import check_batch_lengths
from lit_rlhf.types import RewardOutput

_ALLOWED_CHARS = re.compile(r"[0-9+\-*/()\s]*")  # cheap pre-filter before the AST whitelist
_OPERATORS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


def extract_answer(text: str) -> str | None:
    """The stripped content of the last ``<answer>...</answer>`` in ``text``, or None.

    "Last" means the last closing tag and the nearest opening tag before it. Two ``rfind`` calls
    keep this linear in the text length (a lazy regex is quadratic on many unclosed tags).
    """
    end = text.rfind("</answer>")
    if end < 0:
        return None
    start = text.rfind("<answer>", 0, end)
    if start < 0:
        return None
    return text[start + len("<answer>") : end].strip()


def evaluate_expression(expr: str, *, max_chars: int | None = None) -> tuple[Fraction, list[int]]:
    """Exact value of an arithmetic expression and the integer literals it uses, in order.

    Grammar: non-negative decimal int literals, binary ``+ - * /``, parentheses. Nothing else:
    no names, calls, attributes, unary operators, floats, ``**`` or ``//``.

    Raises:
        ValueError: on anything outside the grammar, on division by zero, on text longer than
            ``max_chars``, or when the parser gives up (too deeply nested input).
    """
    if max_chars is not None and len(expr) > max_chars:
        raise ValueError(f"expression has {len(expr)} characters, more than max_chars={max_chars}")
    if not expr.strip():
        raise ValueError("empty expression")
    if _ALLOWED_CHARS.fullmatch(expr) is None:
        raise ValueError("expression may contain only digits, + - * /, parentheses and spaces")
    literals: list[int] = []
    try:
        # newlines outside parentheses are a syntax error in eval mode; collapse all whitespace
        tree = ast.parse(" ".join(expr.split()), mode="eval")
        value = _evaluate_node(tree.body, literals)
    except (SyntaxError, RecursionError, MemoryError, ZeroDivisionError) as err:
        raise ValueError(f"invalid expression: {type(err).__name__}: {err}") from None
    return value, literals


def _evaluate_node(node: ast.AST, literals: list[int]) -> Fraction:
    if isinstance(node, ast.Constant):
        # bool is an int subclass; the character filter already excludes it, this is belt and braces
        if type(node.value) is not int:
            raise ValueError(f"only integer literals are allowed, got {node.value!r}")
        literals.append(node.value)
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        left = _evaluate_node(node.left, literals)
        right = _evaluate_node(node.right, literals)
        if isinstance(node.op, ast.Add):
            return left + right
        if isinstance(node.op, ast.Sub):
            return left - right
        if isinstance(node.op, ast.Mult):
            return left * right
        return left / right  # Fraction raises ZeroDivisionError on zero
    raise ValueError(f"{type(node).__name__} is not allowed in a Countdown answer")


class CountdownReward:
    """Countdown task reward (TinyZero; as used by arXiv 2602.03635).

    Per completion: ``correct_reward`` if the last ``<answer>`` holds an expression whose
    literals are exactly the row's ``numbers`` (as a multiset) and whose value is within
    ``tolerance`` of the row's ``target``; else ``format_reward`` if that answer is a valid
    expression (and a think block is present when ``require_think``); else 0.

    Args:
        format_reward: score for a well-formed but wrong answer (TinyZero uses 0.1).
        correct_reward: score for a correct answer.
        tolerance: largest accepted ``|value - target|``.
        require_think: also require a ``</think>`` before the answer, opened by ``<think>`` in the
            completion or at the end of the prompt (templates that pre-fill ``<think>``).
        max_expression_chars: longer answers score 0 without being parsed.

    A prompt that ends with ``<answer>`` (a response pre-fill) opens the answer for the
    completion.

    Info: ``correct`` and ``format_ok``, [B] float 1/0.
    """

    def __init__(
        self,
        format_reward: float = 0.0,
        correct_reward: float = 1.0,
        tolerance: float = 1e-5,
        require_think: bool = False,
        max_expression_chars: int = 256,
    ) -> None:
        for name, value in (("format_reward", format_reward), ("correct_reward", correct_reward)):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if not (math.isfinite(tolerance) and tolerance >= 0):
            raise ValueError(f"tolerance must be finite and >= 0 (e.g. 1e-5), got {tolerance}")
        if max_expression_chars < 1:
            raise ValueError(
                f"max_expression_chars must be >= 1 (default 256), got {max_expression_chars}"
            )
        self.format_reward = float(format_reward)
        self.correct_reward = float(correct_reward)
        self.tolerance = Fraction(tolerance)
        self.require_think = require_think
        self.max_expression_chars = max_expression_chars

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        correct, format_ok = [], []
        for prompt, completion, row in zip(prompts, completions, rows, strict=True):
            numbers, target = _read_row(row)
            ok, right = self._judge(prompt, completion, numbers, target)
            format_ok.append(float(ok))
            correct.append(float(right))
        correct_t = torch.tensor(correct, dtype=torch.float32)
        format_t = torch.tensor(format_ok, dtype=torch.float32)
        scores = torch.where(
            correct_t.bool(),
            torch.full_like(correct_t, self.correct_reward),
            format_t * self.format_reward,
        )
        return RewardOutput(scores=scores, info={"correct": correct_t, "format_ok": format_t})

    def _judge(
        self, prompt: str, completion: str, numbers: list[int], target: Fraction
    ) -> tuple[bool, bool]:
        """(format_ok, correct) for one completion."""
        if prompt.rstrip().endswith("<answer>"):  # the prompt pre-filled the opening tag
            completion = "<answer>" + completion
        answer = extract_answer(completion)
        if answer is None:
            return False, False
        if self.require_think and not _has_think(prompt, completion):
            return False, False
        try:
            value, literals = evaluate_expression(answer, max_chars=self.max_expression_chars)
        except ValueError:
            return False, False
        right = sorted(literals) == sorted(numbers) and abs(value - target) <= self.tolerance
        return True, right


def _has_think(prompt: str, completion: str) -> bool:
    answer_start = completion.rfind("<answer>", 0, completion.rfind("</answer>"))
    close = completion.rfind("</think>", 0, answer_start)
    if close < 0:
        return False
    return "<think>" in completion[:close] or prompt.rstrip().endswith("<think>")


def _read_row(row: Mapping[str, Any]) -> tuple[list[int], Fraction]:
    for field in ("numbers", "target"):
        if field not in row:
            raise ValueError(
                f"Countdown row is missing the {field!r} field (has {sorted(row)}); "
                "rows need 'numbers' (list of ints) and 'target' (int)"
            )
    try:
        numbers = [int(n) for n in row["numbers"]]
        target = Fraction(row["target"])
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"Countdown row has a malformed 'numbers' or 'target' field: {err} "
            f"(numbers={row['numbers']!r}, target={row['target']!r})"
        ) from None
    return numbers, target
