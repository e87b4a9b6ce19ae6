"""Demonstrations for the calculator examples' supervised warm start: scripted episodes on
tasks that the RL runs never see, as SFT chat rows.

    python scripts/data/calculator_demos.py            # rewrites the four shipped files below

Two tasks, two arms each (``lit_rlhf/data/samples/``):

- Countdown (``countdown_calculator_demos.jsonl``): check ``a + b`` with the calculator, read the
  ``<result>``, answer the sum when it is the target and the difference otherwise;
  ``countdown_notool_demos.jsonl``: the same tasks, the ``<answer>`` at once.
- Arithmetic (``arithmetic_calculator_demos.jsonl``): call the calculator on the product, box its
  result; ``arithmetic_notool_demos.jsonl``: the same tasks, the value boxed at once.

A calculator arm's file calls the tool on every other task and answers at once on the others
(``--tool-share``, default 0.5): a warm start on tool episodes only would make every episode call
the tool before RL starts, so RL could not show whether calling it pays. Every observation is the
real ``CountdownCalculatorEnv``'s answer, rendered in the role the multi-turn loop uses for the
configs' tokenizer. The prompts (system prompt, question template, task ranges) are read from the
arms' PPO configs, so a demonstration starts exactly like an RL episode; only the task seed
differs (``--seed``, default 2; the RL configs train on seed 0 and validate on seed 1).
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from lit_rlhf.data import ArithmeticPrompts, CountdownPrompts
from lit_rlhf.envs import CountdownCalculatorEnv
from lit_rlhf.envs.demos import (
    arithmetic_answer,
    arithmetic_calculator_turns,
    countdown_answer,
    countdown_calculator_turns,
    scripted_messages,
)
from lit_rlhf.models import load_tokenizer
from lit_rlhf.training.multiturn import observation_role

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "calculator": ROOT / "configs/ppo/countdown_calculator_smollm2.yaml",
    "notool": ROOT / "configs/ppo/countdown_notool_smollm2.yaml",
    "arithmetic_calculator": ROOT / "configs/ppo/arithmetic_calculator_smollm2.yaml",
    "arithmetic_notool": ROOT / "configs/ppo/arithmetic_notool_smollm2.yaml",
}
SAMPLES = ROOT / "lit_rlhf/data/samples"


def demo_file(arm: str) -> Path:
    """The shipped demonstrations of ``arm`` (a key of :data:`CONFIGS`)."""
    prefix = "" if arm.startswith("arithmetic") else "countdown_"
    return SAMPLES / f"{prefix}{arm}_demos.jsonl"


def _turns(row: dict[str, Any], uses_tool: bool) -> list[str]:
    if row["task"] == "arithmetic":
        if uses_tool:
            return arithmetic_calculator_turns(row["expression"], row["answer"])
        return [arithmetic_answer(row["answer"])]
    if uses_tool:
        return countdown_calculator_turns(row["numbers"], row["target"])
    return [countdown_answer(row["numbers"], row["target"])]


def demo_rows(
    arm: str, num_examples: int, seed: int, tool_share: float = 0.5
) -> list[dict[str, Any]]:
    """``num_examples`` chat rows for ``arm`` on tasks of ``seed`` (the arm's PPO config's task
    source with that seed), with the config's system prompt and question wording; for a
    calculator arm, the tasks at indices where ``floor((i + 1) * tool_share)`` steps up (every
    other one for 0.5) call the calculator, the others answer at once."""
    data = yaml.safe_load(CONFIGS[arm].read_text())["data"]["init_args"]
    source = {
        "lit_rlhf.data.CountdownPrompts": CountdownPrompts,
        "lit_rlhf.data.ArithmeticPrompts": ArithmeticPrompts,
    }[data["train"]["class_path"]]
    tasks = source(**dict(data["train"]["init_args"], num_examples=num_examples, seed=seed)).load()
    system, share = data.get("system_prompt"), tool_share if "calculator" in arm else 0.0
    role = observation_role(load_tokenizer(data["tokenizer"]))
    env = CountdownCalculatorEnv()
    rows = []
    for i, row in enumerate(tasks):
        uses_tool = math.floor((i + 1) * share) > math.floor(i * share)
        rows.append(scripted_messages(env, row, _turns(row, uses_tool), question=row["question"],
                                      system_prompt=system, observation_role=role))  # fmt: skip
    return rows


def write_rows(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--num-examples", type=int, default=128)
    parser.add_argument("--seed", type=int, default=2, help="task seed (RL uses 0 and 1)")
    parser.add_argument("--out", type=Path, default=SAMPLES)
    parser.add_argument(
        "--tool-share",
        type=float,
        default=0.5,
        help="share of the calculator arm's demonstrations that call the tool",
    )
    opts = parser.parse_args(argv)
    if not 0.0 <= opts.tool_share <= 1.0:
        parser.error(f"--tool-share must be in [0, 1], got {opts.tool_share}")
    if opts.seed in (0, 1):
        parser.error("--seed 0 and 1 are the RL configs' train and val tasks; pick another")
    for arm in CONFIGS:
        rows = demo_rows(arm, opts.num_examples, opts.seed, opts.tool_share)
        path = opts.out / demo_file(arm).name
        write_rows(path, rows)
        print(f"{path}: {len(rows)} rows")


if __name__ == "__main__":
    main()
