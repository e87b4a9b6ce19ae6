"""Procedural arithmetic questions (``a OP b``) with the value as the reference answer: the task
where a calculator tool pays, since a small model computes two-digit products badly itself
(docs/agents.md, "Calculator vs no tool")."""

from __future__ import annotations

import random
from typing import Any

from lit_rlhf.lazy import MYPY, Table, lazy_module

if MYPY:  # the type checker's view (see lit_rlhf.lazy)
    import datasets
else:
    datasets = lazy_module("datasets")  # loaded when data loads: a fast CLI start


_OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class ArithmeticPrompts:
    """``num_examples`` questions ``a OP b`` with ``a`` in ``[min_a, max_a]``, ``b`` in
    ``[min_b, max_b]`` and ``OP`` drawn from ``operators`` (a subset of ``"+-*"``), seeded.

    Rows: ``query_id`` (``arithmetic-{seed}-{i}``), ``task="arithmetic"``, ``question`` (the
    ``question_template``, ``str.format`` over ``{expression}``), ``expression`` (``"37 * 24"``)
    and ``answer`` (the value as text, for :class:`~lit_rlhf.rewards.MathReward`).
    """

    def __init__(
        self,
        num_examples: int = 1000,
        seed: int = 0,
        min_a: int = 11,
        max_a: int = 99,
        min_b: int = 11,
        max_b: int = 99,
        operators: str = "*",
        question_template: str = "Compute {expression}. Put the value in \\boxed{{}}.",
    ) -> None:
        if num_examples < 1:
            raise ValueError(f"num_examples must be >= 1, got {num_examples}")
        if not (min_a <= max_a and min_b <= max_b):
            raise ValueError(
                f"empty operand range: a in [{min_a}, {max_a}], b in [{min_b}, {max_b}]. "
                "Fix: set each min_* <= its max_*."
            )
        if not operators or any(op not in _OPS for op in operators):
            raise ValueError(f"operators must be a non-empty subset of '+-*', got {operators!r}")
        try:
            question_template.format(expression="1 * 2")
        except (KeyError, IndexError, ValueError) as err:
            raise ValueError(
                f"question_template {question_template!r} is not a valid template ({err}); it "
                "may use only {expression}; write literal braces as {{ }}"
            ) from None
        self.num_examples, self.seed = num_examples, seed
        self.ranges = (min_a, max_a, min_b, max_b)
        self.operators, self.question_template = operators, question_template

    def rows(self) -> list[dict[str, Any]]:
        rng = random.Random(f"arithmetic-{self.seed}")
        min_a, max_a, min_b, max_b = self.ranges
        out = []
        for i in range(self.num_examples):
            a, b = rng.randint(min_a, max_a), rng.randint(min_b, max_b)
            op = rng.choice(self.operators)
            expression = f"{a} {op} {b}"
            out.append({
                "query_id": f"arithmetic-{self.seed}-{i}",
                "task": "arithmetic",
                "question": self.question_template.format(expression=expression),
                "expression": expression,
                "answer": str(_OPS[op](a, b)),
            })  # fmt: skip
        return out

    def load(self) -> Table:
        return datasets.Dataset.from_list(self.rows())
