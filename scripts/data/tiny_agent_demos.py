"""Demonstrations for ``builtin:tiny-llama-agent`` (``lit_rlhf/models/warm_start.py``): scripted
episodes of the two tiny multi-turn configs' tasks, as SFT chat rows in the role the multi-turn
loop renders the tiny tokenizer's environment turns with.

    python scripts/data/tiny_agent_demos.py  # rewrites lit_rlhf/data/samples/tiny_agent_demos.jsonl

- Countdown calculator (the prompts of ``configs/ppo/countdown_calculator_tiny.yaml``): three of
  four episodes check ``a + b`` with the calculator and answer the sum or the difference after
  the ``<result>``, the others answer at once (``lit_rlhf.envs.demos``).
- Guess the number (the prompts of ``configs/ppo/guess_number_tiny.yaml``): a random first
  guess, then, after ``higher`` / ``lower``, a random guess on the side the answer points to.

Every observation is the real environment's answer. The tasks use seed 2 (the RL configs train
on seed 0 and validate on seed 1).
"""

from __future__ import annotations

import argparse
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from lit_rlhf.data import CountdownPrompts
from lit_rlhf.envs import CountdownCalculatorEnv, GuessNumberEnv, GuessNumberPrompts
from lit_rlhf.envs.demos import countdown_answer, countdown_calculator_turns, scripted_messages
from lit_rlhf.models import load_tokenizer
from lit_rlhf.models.warm_start import DEMOS
from lit_rlhf.training.multiturn import observation_role

ROOT = Path(__file__).resolve().parents[2]
COUNTDOWN = ROOT / "configs/ppo/countdown_calculator_tiny.yaml"
GUESS = ROOT / "configs/ppo/guess_number_tiny.yaml"
# the configs' builtin:tiny-llama-agent is built from this file; the warm start changes weights
# only, so the role is read from tiny-llama's tokenizer, the same one
TOKENIZER = "builtin:tiny-llama"


def _data(config: Path) -> dict[str, Any]:
    return yaml.safe_load(config.read_text())["data"]["init_args"]


def countdown_rows(num_examples: int, seed: int) -> list[dict[str, Any]]:
    data = _data(COUNTDOWN)
    args = dict(data["train"]["init_args"], num_examples=num_examples, seed=seed)
    role = observation_role(load_tokenizer(TOKENIZER))
    rows = []
    for i, row in enumerate(CountdownPrompts(**args).load()):
        numbers, target = row["numbers"], row["target"]
        turns = countdown_calculator_turns(numbers, target) if i % 4 else [
            countdown_answer(numbers, target)
        ]  # fmt: skip
        env, question = CountdownCalculatorEnv(), row["question"]
        rows.append(scripted_messages(env, row, turns, question=question,
                                      system_prompt=data.get("system_prompt"),
                                      observation_role=role))  # fmt: skip
    return rows


def guess_rows(num_examples: int, seed: int) -> list[dict[str, Any]]:
    data = _data(GUESS)
    args = dict(data["train"]["init_args"], num_examples=num_examples, seed=seed)
    top = int(args["max_value"])
    role = observation_role(load_tokenizer(TOKENIZER))
    rng = random.Random(1000 + seed)  # not the prompts' own Random(seed): other draws
    rows = []
    for row in GuessNumberPrompts(**args).load():
        first = rng.randint(1, top)
        target = int(row["target"])
        turns = [f"<guess>{first}</guess>"]
        if first != target:
            low, high = (first + 1, top) if first < target else (1, first - 1)
            turns.append(f"<guess>{rng.randint(low, high)}</guess>")
        rows.append(scripted_messages(GuessNumberEnv(max_guesses=2), row, turns,
                                      question=row["question"], observation_role=role))  # fmt: skip
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-examples", type=int, default=64, help="per task")
    parser.add_argument("--seed", type=int, default=2, help="task seed (RL uses 0 and 1)")
    parser.add_argument("--out", type=Path, default=DEMOS)
    opts = parser.parse_args(argv)
    if opts.seed in (0, 1):
        parser.error("--seed 0 and 1 are the RL configs' train and val tasks; pick another")
    rows = countdown_rows(opts.num_examples, opts.seed) + guess_rows(opts.num_examples, opts.seed)
    opts.out.write_text("".join(json.dumps(row) + "\n" for row in rows))
    print(f"{opts.out}: {len(rows)} rows")


if __name__ == "__main__":
    main()
