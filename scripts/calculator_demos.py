"""Demonstrations for the calculator example's supervised warm start: scripted episodes on
Countdown tasks that the RL runs never see, as SFT chat rows.

    python scripts/calculator_demos.py            # rewrites the two shipped files below

Writes ``lit_rlhf/data/samples/countdown_calculator_demos.jsonl`` (the calculator arm: on every
other task, check ``a + b`` with the calculator, read the ``<result>``, answer the sum when it is
the target and the difference otherwise, every observation the real ``CountdownCalculatorEnv``'s
answer; on the others, the answer at once) and ``countdown_notool_demos.jsonl`` (the no-tool
arm: the same tasks, the answer at once). Half and half (``--tool-share``) leaves the choice of
calling the tool to RL: a warm start on tool episodes only makes every episode call it before
RL starts, so RL could not show whether the tool pays. The
prompts (system prompt, question template, task ranges) are read from the two PPO configs, so a
demonstration looks exactly like an RL episode's start; only the task seed differs (``--seed``,
default 2; the RL configs train on seed 0 and validate on seed 1). The environment's turns use
the role the multi-turn loop renders them with for the configs' tokenizer.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

from lit_rlhf.data import CountdownPrompts
from lit_rlhf.envs import CountdownCalculatorEnv
from lit_rlhf.envs.demos import countdown_answer, countdown_calculator_turns, scripted_messages
from lit_rlhf.models import load_tokenizer
from lit_rlhf.training.multiturn import observation_role

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = {
    "calculator": ROOT / "configs/ppo/countdown_calculator_smollm2.yaml",
    "notool": ROOT / "configs/ppo/countdown_notool_smollm2.yaml",
}
SAMPLES = ROOT / "lit_rlhf/data/samples"


def demo_file(arm: str) -> Path:
    """The shipped demonstrations of ``arm`` (``calculator`` or ``notool``)."""
    return SAMPLES / f"countdown_{arm}_demos.jsonl"


def demo_rows(
    arm: str, num_examples: int, seed: int, tool_share: float = 0.5
) -> list[dict[str, Any]]:
    """``num_examples`` chat rows for ``arm`` on Countdown tasks of ``seed``, with the system
    prompt and question wording of the arm's PPO config; for ``calculator``, the tasks at
    indices where ``floor((i + 1) * tool_share)`` steps up (every other one for 0.5) show the
    calculator, the others answer at once."""
    data = yaml.safe_load(CONFIGS[arm].read_text())["data"]["init_args"]
    task = dict(data["train"]["init_args"], num_examples=num_examples, seed=seed)
    tasks = CountdownPrompts(**task).load()
    system = data.get("system_prompt")
    if arm == "notool":
        return [
            {"messages": [
                *([{"role": "system", "content": system}] if system else []),
                {"role": "user", "content": row["question"]},
                {"role": "assistant", "content": countdown_answer(row["numbers"], row["target"])},
            ]}
            for row in tasks
        ]  # fmt: skip
    role = observation_role(load_tokenizer(data["tokenizer"]))
    env = CountdownCalculatorEnv()
    rows = []
    for i, row in enumerate(tasks):
        uses_tool = math.floor((i + 1) * tool_share) > math.floor(i * tool_share)
        turns = (
            countdown_calculator_turns(row["numbers"], row["target"])
            if uses_tool
            else [countdown_answer(row["numbers"], row["target"])]
        )
        rows.append(scripted_messages(env, row, turns, question=row["question"],
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
