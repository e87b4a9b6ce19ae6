"""Synthetic preference pairs whose better response is verifiable, offline and seeded: a correct
answer against a wrong one, for testing and debugging generative reward models (a judge that
learns anything should beat chance on them; one that learned the answer beats it by far).

- ``arithmetic``: "What is 17 + 25?"; the correct response ``"17 + 25 = 42. The answer is 42."``
  against the same sentence with a result off by 1 to 3.
- ``copy``: "Repeat the word tiger."; the word against another word. Checking it needs no
  knowledge, only a comparison of the response with the query: the task a 135M-parameter judge
  can learn on CPU in minutes (``configs/grm/rft_smollm2.yaml``).
- ``countdown``: a :mod:`lit_rlhf.data.countdown` task; the hidden solution against an
  expression that uses the same numbers once each and misses the target. Both responses claim
  to reach the target, in the ``<think>``/``<answer>`` format the task asks for.

``distractor="length"`` pads the WRONG response with verbose filler: a stylistic cue that a
length-biased judge falls for (length bias in reward models: Singhal et al., arXiv 2310.03716).
"""

from __future__ import annotations

import random
from typing import Any, Literal

from lit_rlhf.data.countdown import countdown_question, generate_countdown
from lit_rlhf.data.judge_templates import PreferencePair, SwapMode, check_pair_options, judge_rows
from lit_rlhf.lazy import MYPY, Table, lazy_module

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


_OFFSETS = (-3, -2, -1, 1, 2, 3)  # how far a wrong arithmetic result is from the right one
_WORD_LIST = (
    "apple river candle tiger orange pencil garden window silver rocket monkey piano castle "
    "forest bottle yellow dragon basket mirror winter summer pocket ladder hammer jacket "
    "button carpet circle doctor engine farmer guitar island kitten lemon marble needle "
    "parrot rabbit saddle tunnel velvet walnut zebra anchor bridge cotton desert feather "
    "harbor kettle meadow planet shadow violin"
)
_WORDS = _WORD_LIST.split()  # the copy task's vocabulary
_VERBOSE_OPENING = (
    "Let me think about this very carefully, step by step, so that the final answer is exactly "
    "right. First, I restate the problem in my own words and identify what it asks for. Then I "
    "work through the calculation slowly, double-checking every intermediate value as I go. "
)
_VERBOSE_CLOSING = " I verified this result a second time, and I am fully confident in it."


class SyntheticPairs:
    """Seeded pairs of a correct and a wrong response (module docstring); a pair source.

    The correct response is response 1 or 2 by a seeded coin, so labels are balanced; ``subset``
    is ``task_kind``, with ``"+length"`` when the distractor is on. The same arguments give the
    same pairs; another ``seed`` gives other ones.

    Args:
        num_examples: how many pairs (before ``swap``).
        seed: seeds the tasks, the wrong answers and the placement.
        task_kind: ``arithmetic``, ``copy`` or ``countdown``.
        distractor: ``none``, or ``length`` (the wrong response is the longer one).
        template: the judge template (short by default, for tiny CPU models).
        swap: order-swap augmentation, as in :class:`~lit_rlhf.data.PreferencePairs`.
        max_value: the largest operand (arithmetic) or Countdown number.
        task: every row's ``task``.
    """

    def __init__(
        self,
        num_examples: int = 256,
        seed: int = 0,
        task_kind: Literal["arithmetic", "copy", "countdown"] = "arithmetic",
        distractor: Literal["none", "length"] = "none",
        template: str = "consistrm-v1-short",
        swap: SwapMode = "none",
        max_value: int = 50,
        task: str = "judge",
    ) -> None:
        check_pair_options(template, swap, num_examples)
        if task_kind not in ("arithmetic", "copy", "countdown"):
            raise ValueError(
                f"task_kind must be 'arithmetic', 'copy' or 'countdown', got {task_kind!r}"
            )
        if distractor not in ("none", "length"):
            raise ValueError(f"distractor must be 'none' or 'length', got {distractor!r}")
        if max_value < 1:
            raise ValueError(f"max_value must be >= 1, got {max_value}")
        self.num_examples, self.seed, self.max_value = num_examples, seed, max_value
        self.task_kind, self.distractor = task_kind, distractor
        self.template, self.swap, self.task = template, swap, task

    def load(self) -> Table:
        rows = judge_rows(
            self.pairs(), template=self.template, swap=self.swap, seed=self.seed, task=self.task
        )
        return datasets.Dataset.from_list(rows)

    def pairs(self) -> list[PreferencePair]:
        """The pairs in their canonical order, before ``swap``."""
        # a string seed keeps this stream apart from generate_countdown's Random(seed)
        rng = random.Random(f"synthetic-pairs/{self.seed}")
        if self.task_kind == "countdown":
            tasks = generate_countdown(self.num_examples, seed=self.seed, max_value=self.max_value)
            texts = [_countdown_texts(rng, row) for row in tasks]
        elif self.task_kind == "copy":
            texts = [_copy_texts(rng) for _ in range(self.num_examples)]
        else:
            texts = [_arithmetic_texts(rng, self.max_value) for _ in range(self.num_examples)]
        subset = self.task_kind + ("+length" if self.distractor == "length" else "")
        pairs = []
        for i, (prompt, correct, wrong) in enumerate(texts):
            if self.distractor == "length":
                wrong = _pad(wrong)
            correct_first = rng.random() < 0.5
            first, second = (correct, wrong) if correct_first else (wrong, correct)
            pair_id = f"synthetic-{subset}-{self.seed}-{i}"
            label = -1 if correct_first else 1
            pairs.append(PreferencePair(pair_id, prompt, first, second, label, subset))
        return pairs


def _arithmetic_texts(rng: random.Random, max_value: int) -> tuple[str, str, str]:
    """(question, correct response, wrong response) for a random a op b."""
    a, b, op = rng.randint(1, max_value), rng.randint(1, max_value), rng.choice("+-*")
    value = _apply(op, a, b)
    wrong = value + rng.choice(_OFFSETS)
    expr = f"{a} {op} {b}"
    return (
        f"What is {expr}?",
        f"{expr} = {value}. The answer is {value}.",
        f"{expr} = {wrong}. The answer is {wrong}.",
    )


def _copy_texts(rng: random.Random) -> tuple[str, str, str]:
    """(question, the word, another word)."""
    word, other = rng.sample(_WORDS, 2)
    return f"Repeat the word {word}.", word, other


def _countdown_texts(rng: random.Random, task: dict[str, Any]) -> tuple[str, str, str]:
    """(question, the solution, an expression missing the target), both claiming the target."""
    target = int(task["target"])
    missed = _missed_expression(rng, [int(n) for n in task["numbers"]], target)
    correct, wrong = (
        f"<think>{expr} = {target}</think>\n<answer>{expr}</answer>"
        for expr in (task["solution"], missed)
    )
    return countdown_question(task), correct, wrong


def _missed_expression(rng: random.Random, numbers: list[int], target: int) -> str:
    """A left-to-right expression over ``numbers`` (each once, + - *) whose value is not
    ``target``. After a random try, the all-plus chain and the chain starting with a minus
    differ by 2 * order[1] > 0, so one of them always misses."""
    order = rng.sample(numbers, len(numbers))
    plus = ["+"] * (len(order) - 1)
    for ops in ([rng.choice("+-*") for _ in plus], plus, ["-", *plus[1:]]):
        value, expr = order[0], str(order[0])
        for op, n in zip(ops, order[1:], strict=True):
            value, expr = _apply(op, value, n), f"({expr} {op} {n})"
        if value != target:
            return expr[1:-1] if expr.startswith("(") else expr
    raise AssertionError("unreachable: the last two chains differ")


def _apply(op: str, a: int, b: int) -> int:
    return a + b if op == "+" else a - b if op == "-" else a * b


def _pad(response: str) -> str:
    """The response with verbose filler, inside ``<think>`` when it has one."""
    if response.startswith("<think>"):
        return response.replace("<think>", "<think>" + _VERBOSE_OPENING, 1).replace(
            "</think>", "." + _VERBOSE_CLOSING + "</think>", 1
        )
    return _VERBOSE_OPENING + response + _VERBOSE_CLOSING
