"""MATH / GSM8K reward: the last ``\\boxed{}`` of the completion, checked by math-verify.

Source: the TRE paper's MATH setup (arXiv 2602.03635; answer in the last ``\\boxed{}``,
reward 1/0 by equivalence) using math-verify (``math_verify.parse`` / ``math_verify.verify``).

math-verify bounds its time with ``signal.alarm``, which only works in the main thread; off
the main thread both timeouts are switched off (math-verify's own advice), so the caller bounds
the time there. ``max_answer_chars`` caps what reaches the parser in either case.
"""

from __future__ import annotations

import math
import re
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from lit_rlhf.rewards.base import check_batch_lengths
from lit_rlhf.types import RewardOutput

# a number written out: sign, digits (thousands commas allowed), a decimal part, or one fraction
_LITERAL_NUMBER = re.compile(r"[-+]?(\d{1,3}(,\d{3})+|\d+)(\.\d+)?(\s*/\s*\d+)?")


def extract_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (braces matched, nested allowed), or None.

    Also reads the brace-less form ``\\boxed 5`` (up to the next space or ``$``). Escaped braces
    ``\\{ \\}`` do not count. An unclosed last ``\\boxed{`` (a truncated response) gives None.
    """
    start = text.rfind("\\boxed")
    if start < 0:
        return None
    i = start + len("\\boxed")
    if i < len(text) and text[i] == " ":
        rest = text[i:].lstrip(" ")
        if not rest.startswith("{"):
            token = rest.split("$", 1)[0].split(maxsplit=1)
            return token[0] if token else None
        i = len(text) - len(rest)
    if i >= len(text) or text[i] != "{":
        return None
    depth = 0
    j = i
    while j < len(text):
        char = text[j]
        if char == "\\":
            j += 2  # skip the escaped character, e.g. \{ or \}
            continue
        if char == "{":
            depth += 1
        elif char == "}":
            depth -= 1
            if depth == 0:
                return text[i + 1 : j]
        j += 1
    return None


def reference_answer(row: Mapping[str, Any], field: str = "answer") -> str:
    """The row's reference answer; for GSM8K-style text, what follows the last ``####``."""
    if field not in row:
        raise ValueError(
            f"math row is missing the reference answer field {field!r} (has {sorted(row)}); "
            "set answer_field to the column holding the answer"
        )
    text = str(row[field])
    if "####" in text:
        text = text.rsplit("####", 1)[1]
    return text.strip()


def _as_latex(answer: str) -> str:
    # math-verify reads LaTeX only inside an environment ($..$, \boxed{}); a bare "1/2" parses,
    # a bare "\frac12" or "x^{2}+1" does not. Answers that carry their own environment pass as is.
    if "$" in answer or "\\boxed" in answer or "\\(" in answer or "\\[" in answer:
        return answer
    return f"${answer}$"


def parse(text: str, **kwargs: Any) -> list[Any]:
    """math-verify's ``parse``, imported at the first answer scored (its LaTeX parser costs
    0.3 s of start-up otherwise)."""
    from math_verify import parse as math_verify_parse

    return list(math_verify_parse(text, **kwargs))


def verify(gold: list[Any], predicted: list[Any], **kwargs: Any) -> bool:
    """math-verify's ``verify``, imported at first use."""
    from math_verify import verify as math_verify_verify

    return bool(math_verify_verify(gold, predicted, **kwargs))


def __getattr__(name: str) -> Any:
    if name == "TimeoutException":  # math-verify's timeout (a BaseException), on first use
        from math_verify.errors import TimeoutException

        return TimeoutException
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class MathReward:
    """Equivalence reward for boxed math answers (math-verify).

    Per completion: ``correct_reward`` if the last ``\\boxed{}`` is equivalent to the row's
    reference answer, ``format_reward`` if a boxed answer was found but is wrong or unparsable,
    else 0. An exception inside math-verify scores that sample as wrong, not the batch.

    Args:
        answer_field: row key of the reference answer (GSM8K ``"... #### 72"`` is understood).
        correct_reward: score for an equivalent answer.
        format_reward: score for a boxed but wrong answer.
        timeout_seconds: math-verify's per-parse and per-comparison limit (main thread only).
        max_answer_chars: longer boxed answers are not parsed and score as wrong.
        literal_answers: the boxed answer must be a number written out (an optional sign,
            digits with optional thousands commas, a decimal part, or one ``a/b`` fraction);
            anything else, e.g. ``77 * 50``, scores as wrong even where math-verify finds it
            equal to the reference. For tasks whose answer is the computation itself (two-digit
            products): math-verify evaluates a boxed expression, so without this a policy can
            box the question's expression and be scored correct.

    Info: ``correct`` and ``has_boxed`` (a non-empty ``\\boxed{}`` was found), [B] float 1/0.
    """

    def __init__(
        self,
        answer_field: str = "answer",
        correct_reward: float = 1.0,
        format_reward: float = 0.0,
        timeout_seconds: int = 5,
        max_answer_chars: int = 1000,
        literal_answers: bool = False,
    ) -> None:
        if not answer_field:
            raise ValueError("answer_field must name the row key of the reference answer")
        for name, value in (("format_reward", format_reward), ("correct_reward", correct_reward)):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, got {value}")
        if timeout_seconds < 1:
            raise ValueError(f"timeout_seconds must be >= 1 (default 5), got {timeout_seconds}")
        if max_answer_chars < 1:
            raise ValueError(
                f"max_answer_chars must be >= 1 (default 1000), got {max_answer_chars}"
            )
        self.answer_field = answer_field
        self.correct_reward = float(correct_reward)
        self.format_reward = float(format_reward)
        self.timeout_seconds = timeout_seconds
        self.max_answer_chars = max_answer_chars
        self.literal_answers = literal_answers

    def __call__(
        self,
        prompts: Sequence[str],
        completions: Sequence[str],
        rows: Sequence[Mapping[str, Any]],
    ) -> RewardOutput:
        check_batch_lengths(prompts, completions, rows)
        on_main = threading.current_thread() is threading.main_thread()
        timeout = self.timeout_seconds if on_main else None
        gold_cache: dict[str, list[Any]] = {}  # the G samples of a prompt share one reference
        correct, has_boxed = [], []
        for completion, row in zip(completions, rows, strict=True):
            gold = reference_answer(row, self.answer_field)
            boxed = extract_boxed(completion)
            has_boxed.append(float(bool(boxed)))
            correct.append(
                float(bool(boxed) and self._equivalent(gold, boxed, gold_cache, timeout))
            )
        correct_t = torch.tensor(correct, dtype=torch.float32)
        boxed_t = torch.tensor(has_boxed, dtype=torch.float32)
        scores = torch.where(
            correct_t.bool(),
            torch.full_like(correct_t, self.correct_reward),
            boxed_t * self.format_reward,
        )
        return RewardOutput(scores=scores, info={"correct": correct_t, "has_boxed": boxed_t})

    def _equivalent(
        self, gold: str, boxed: str | None, cache: dict[str, list[Any]], timeout: int | None
    ) -> bool:
        if boxed is None or len(boxed) > self.max_answer_chars:
            return False
        if self.literal_answers and not _LITERAL_NUMBER.fullmatch(boxed.strip()):
            return False
        from math_verify.errors import TimeoutException

        try:
            if gold not in cache:
                cache[gold] = parse(_as_latex(gold), parsing_timeout=timeout)
            predicted = parse(f"\\boxed{{{boxed}}}", parsing_timeout=timeout)
            if not cache[gold] or not predicted:
                return False
            return bool(verify(cache[gold], predicted, timeout_seconds=timeout))
        except (Exception, TimeoutException):
            return False
