"""Procedural Countdown tasks: 3-4 numbers and a target reachable by + - * / using each once.

The task follows TinyZero (Pan et al. 2025; as used by arXiv 2602.03635). TinyZero samples a random
target and keeps tasks its solver can reach; here the target is built forward from the numbers
by a random expression tree, so every task is solvable by construction and ships its solution.
Intermediate results stay positive integers <= ``max_target`` and divisions are exact, so the
solution also passes a stricter integer-only checker.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

_OPERATORS = "+-*/"
_MAX_ATTEMPTS = 10_000  # per task; only a near-impossible configuration exhausts it


def generate_countdown(
    num_examples: int,
    *,
    seed: int,
    num_numbers: int | tuple[int, int] = (3, 4),
    min_value: int = 1,
    max_value: int = 99,
    max_target: int = 999,
    operators: str = _OPERATORS,
) -> list[dict[str, Any]]:
    """Generates ``num_examples`` solvable Countdown tasks, deterministically from ``seed``.

    Args:
        num_examples: how many tasks.
        seed: seeds ``random.Random``; the same arguments give the same tasks, and a shorter
            run is a prefix of a longer one.
        num_numbers: numbers per task, fixed or an inclusive ``(low, high)`` range.
        min_value, max_value: inclusive range of each number (>= 1).
        max_target: bound on the target and on every intermediate result.
        operators: the operators the solution may use, a subset of ``"+-*/"``.

    Returns:
        Rows ``{"query_id": "countdown-{seed}-{i}", "numbers": list[int], "target": int,
        "solution": str}``; ``solution`` uses each number exactly once and equals ``target``.
    """
    low, high = _validate(num_examples, num_numbers, min_value, max_value, max_target, operators)
    rng = random.Random(seed)
    rows = []
    for i in range(num_examples):
        for _ in range(_MAX_ATTEMPTS):
            numbers = [rng.randint(min_value, max_value) for _ in range(rng.randint(low, high))]
            built = _random_tree(rng, numbers, operators, max_target)
            if built is not None:
                break
        else:
            raise ValueError(
                f"could not build a task within {_MAX_ATTEMPTS} attempts with "
                f"operators={operators!r}, values in [{min_value}, {max_value}] and "
                f"max_target={max_target}; allow '+' or raise max_target"
            )
        target, solution = built
        rows.append(
            {
                "query_id": f"countdown-{seed}-{i}",
                "numbers": numbers,
                "target": target,
                "solution": solution,
            }
        )
    return rows


def countdown_question(row: Mapping[str, Any], template: str | None = None) -> str:
    """The user prompt for a Countdown row (TinyZero's wording, lightly edited).

    ``template``: a ``str.format`` template over ``{numbers}`` (comma-separated) and ``{target}``
    that replaces the default wording.
    """
    numbers = ", ".join(str(int(n)) for n in row["numbers"])
    if template is not None:
        return template.format(numbers=numbers, target=int(row["target"]))
    return (
        f"Using the numbers [{numbers}], create an equation that equals {int(row['target'])}. "
        "You can use basic arithmetic operations (+, -, *, /) and each number must be used "
        "exactly once. Show your work in <think> </think> tags. And return the final answer in "
        "<answer> </answer> tags, for example <answer> (1 + 2) / 3 </answer>."
    )


def _random_tree(
    rng: random.Random, numbers: list[int], operators: str, max_target: int
) -> tuple[int, str] | None:
    """Combines random pairs until one value is left: (value, expression), or None if stuck."""
    pool = [(n, str(n)) for n in numbers]
    while len(pool) > 1:
        step = _random_step(rng, pool, operators, max_target)
        if step is None:
            return None
        i, j, value, expr = step
        pool = [item for k, item in enumerate(pool) if k not in (i, j)]
        pool.append((value, expr))
    value, expr = pool[0]
    if not 1 <= value <= max_target:
        return None
    return value, _strip_outer_parens(expr)


def _random_step(
    rng: random.Random, pool: list[tuple[int, str]], operators: str, max_target: int
) -> tuple[int, int, int, str] | None:
    """A random valid (i, j, a op b, expression): operator first, so each is equally likely."""
    ops = list(dict.fromkeys(operators))
    rng.shuffle(ops)
    pairs = [(i, j) for i in range(len(pool)) for j in range(len(pool)) if i != j]
    for op in ops:
        rng.shuffle(pairs)
        for i, j in pairs:
            value = _apply(op, pool[i][0], pool[j][0])
            if value is not None and 1 <= value <= max_target:
                return i, j, value, f"({pool[i][1]} {op} {pool[j][1]})"
    return None


def _apply(op: str, a: int, b: int) -> int | None:
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    return a // b if a % b == 0 else None  # exact division only


def _strip_outer_parens(expr: str) -> str:
    # Every combined expression is "(left op right)", so the outermost pair always matches.
    return expr[1:-1] if expr.startswith("(") else expr


def _validate(
    num_examples: int,
    num_numbers: int | tuple[int, int],
    min_value: int,
    max_value: int,
    max_target: int,
    operators: str,
) -> tuple[int, int]:
    if num_examples < 0:
        raise ValueError(f"num_examples must be >= 0, got {num_examples}")
    if isinstance(num_numbers, int) and not isinstance(num_numbers, bool):
        low = high = num_numbers
    elif isinstance(num_numbers, (tuple, list)) and len(num_numbers) == 2:
        low, high = (int(n) for n in num_numbers)
    else:
        raise ValueError(f"num_numbers must be an int or a (low, high) pair, got {num_numbers!r}")
    if not 2 <= low <= high:
        raise ValueError(
            f"num_numbers must satisfy 2 <= low <= high (e.g. (3, 4)), got {num_numbers!r}"
        )
    if not 1 <= min_value <= max_value:
        raise ValueError(
            "min_value and max_value must satisfy 1 <= min_value <= max_value (e.g. 1 and 99), "
            f"got {min_value} and {max_value}"
        )
    if max_target < 1:
        raise ValueError(f"max_target must be >= 1 (e.g. 999), got {max_target}")
    if not operators or any(op not in _OPERATORS for op in operators):
        raise ValueError(
            f"operators must be a non-empty string of characters from {_OPERATORS!r}, "
            f"got {operators!r}"
        )
    return low, high
