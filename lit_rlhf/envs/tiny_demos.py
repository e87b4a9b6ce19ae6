"""The demonstrations ``builtin:tiny-llama-agent`` is warm-started on
(``lit_rlhf/data/samples/tiny_agent_demos.jsonl``, :mod:`lit_rlhf.models.warm_start`): scripted
episodes on the prompts of the two tiny multi-turn configs, every observation the real
environment's. Rewrite the file with::

    python -c "from lit_rlhf.envs.tiny_demos import write; write()"

Countdown calculator (``configs/ppo/countdown_calculator_tiny.yaml``'s prompts): three of four
episodes check ``a + b`` with the calculator, then answer; the others answer at once. Guess the
number (``configs/ppo/guess_number_tiny.yaml``'s): a random guess, then one on the side the
answer points to. Tasks of seed 2 (the configs train on seed 0 and validate on seed 1).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from lit_rlhf.data import CountdownPrompts
from lit_rlhf.envs.calculator import CountdownCalculatorEnv
from lit_rlhf.envs.demos import countdown_answer, countdown_calculator_turns, scripted_messages
from lit_rlhf.envs.guess_number import GuessNumberEnv, GuessNumberPrompts
from lit_rlhf.models.warm_start import DEMOS

# the tiny configs' prompt sources (tests/models/test_warm_start.py holds them to the configs)
SYSTEM_PROMPT = "You solve arithmetic puzzles. You may use a calculator."
COUNTDOWN: dict[str, Any] = {
    "num_numbers": 2, "min_value": 1, "max_value": 10, "max_target": 20, "operators": "+-",
    "question_template": (
        "Combine the numbers with + or - to reach the target. To check a sum write "
        "<tool>calculator: 3 + 4</tool> and wait for the result; then give the final "
        "<answer>3 + 4</answer>. Numbers {numbers}, target {target}."
    ),
}  # fmt: skip
GUESS: dict[str, Any] = {"max_value": 10}
ROLE = "tool"  # the tiny tokenizer's role for environment turns (multiturn.observation_role)


def countdown_rows(num_examples: int = 64, seed: int = 2) -> list[dict[str, Any]]:
    rows = []
    tasks = CountdownPrompts(num_examples=num_examples, seed=seed, **COUNTDOWN).load()
    for i, row in enumerate(tasks):
        numbers, target = row["numbers"], row["target"]
        turns = countdown_calculator_turns(numbers, target) if i % 4 else [
            countdown_answer(numbers, target)
        ]  # fmt: skip
        rows.append(scripted_messages(CountdownCalculatorEnv(), row, turns,
                                      question=row["question"], observation_role=ROLE,
                                      system_prompt=SYSTEM_PROMPT))  # fmt: skip
    return rows


def guess_rows(num_examples: int = 64, seed: int = 2) -> list[dict[str, Any]]:
    top, rng, rows = GUESS["max_value"], random.Random(1000 + seed), []  # not the prompts' rng
    for row in GuessNumberPrompts(num_examples=num_examples, seed=seed, **GUESS).load():
        first, target = rng.randint(1, top), int(row["target"])
        turns = [f"<guess>{first}</guess>"]
        if first != target:
            low, high = (first + 1, top) if first < target else (1, first - 1)
            turns.append(f"<guess>{rng.randint(low, high)}</guess>")
        rows.append(scripted_messages(GuessNumberEnv(max_guesses=2), row, turns,
                                      question=row["question"], observation_role=ROLE))  # fmt: skip
    return rows


def rows() -> list[dict[str, Any]]:
    """The shipped file's rows: 64 Countdown calculator episodes, then 64 guessing episodes."""
    return countdown_rows() + guess_rows()


def write(path: Path = DEMOS) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows()))
