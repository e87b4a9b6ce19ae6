"""How long the ``lit-rlhf`` command takes before it does anything: ``lit-rlhf --help``,
``lit-rlhf fit --help`` and a refused config (a misspelt setting), each against ``python -c
"import lightning"`` on the same machine, in rounds that interleave the commands (target: each
at most 1 s above ``import lightning``; exit 1 otherwise).

    python -m scripts.bench cli_startup [--rounds 5] [--tree PATH]

``--tree PATH``: measure another checkout as well (e.g. a ``git worktree`` of an older commit,
put first on PYTHONPATH), side by side in the same rounds: the before/after of docs/cli_startup.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from scripts.bench.runner import ROOT, Report, int_args, order

SMOKE = {"rounds": 1, "commands": "import lightning,lit-rlhf --help"}
TARGET_S = 1.0
CONFIG = "configs/ppo/countdown_tiny.yaml"
COMMANDS = {
    "import lightning": ["-c", "import lightning"],
    "lit-rlhf --help": ["-m", "lit_rlhf.cli", "--help"],
    "lit-rlhf fit --help": ["-m", "lit_rlhf.cli", "fit", "--help"],
    "config error (typo)": ["-m", "lit_rlhf.cli", "fit", "--config", CONFIG,
                            "--model.init_args.rollout.samples_per_promt=2"],
}  # fmt: skip


def add_args(parser: argparse.ArgumentParser) -> None:
    int_args(parser, rounds=5)
    parser.add_argument("--tree", type=Path, help="another checkout, measured beside this one")
    parser.add_argument(
        "--commands", default=",".join(COMMANDS), help="which commands, comma-separated"
    )


def _seconds(args: list[str], tree: Path) -> float:
    env = {**os.environ, "PYTHONPATH": str(tree), "HF_HUB_OFFLINE": "1"}
    start = time.perf_counter()
    done = subprocess.run([sys.executable, *args], cwd=tree, env=env, capture_output=True)
    seconds = time.perf_counter() - start
    expected_error = "samples_per_promt" in " ".join(args)
    if (done.returncode != 0) != expected_error:
        raise SystemExit(f"{args} in {tree}: exit {done.returncode}\n{done.stderr[-2000:]!r}")
    return seconds


def run(opts: argparse.Namespace, report: Report) -> None:
    trees = {"this checkout": ROOT} | ({"--tree": opts.tree.resolve()} if opts.tree else {})
    chosen = [c for c in COMMANDS if c in opts.commands.split(",")]
    if "import lightning" not in chosen:
        raise SystemExit("--commands must include 'import lightning' (the baseline)")
    arms = [(tree, command) for tree in trees for command in chosen]
    times: dict[tuple[str, str], list[float]] = {arm: [] for arm in arms}
    for r in range(opts.rounds):
        for tree, command in order(arms, r):
            times[(tree, command)].append(_seconds(COMMANDS[command], trees[tree]))
    report.say(f"CLI start-up, median of {opts.rounds} rounds (commands interleaved), seconds", "")
    rows = []
    for tree in trees:
        base = statistics.median(times[(tree, "import lightning")])
        for command in chosen:
            median = statistics.median(times[(tree, command)])
            above = median - base
            rows.append([tree, command, f"{median:.2f}", f"{above:+.2f}",
                         f"{min(times[(tree, command)]):.2f}"])  # fmt: skip
            verdict = tree == "this checkout" and command != "import lightning" and not opts.smoke
            if verdict and above > TARGET_S:  # (a smoke run checks that it runs, no verdict)
                report.ok = False
    report.table(["tree", "command", "median s", "vs import lightning", "min s"], rows)
    report.data = {f"{t} | {c}": v for (t, c), v in times.items()}
