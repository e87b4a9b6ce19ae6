"""Environments as users write them, trained through the ``lit-rlhf`` CLI from a folder outside
the repository, with only the user module's folder on ``PYTHONPATH``; and misbehaving
environment code that the run survives, each fault counted by kind.

Every run is one PPO step of ``configs/ppo/guess_number_tiny.yaml`` (the warm-started
``builtin:tiny-llama-agent``, which ends its turns) with ``--model.init_args.environment``
naming the user's class: docs/agents.md's example verbatim, an unannotated class, a subclass of
``Environment``, a typed class without postponed annotations. Each asserts that the user's
``reset`` and ``step`` ran (a marker file the class writes) and that some episode took more
than one turn (``env/turns`` > 1). The faults (``SystemExit`` in ``step`` and in ``reset``, a
None return, a NaN reward) share one run whose episodes take them in turn; the slow twin runs
each kind alone."""

from __future__ import annotations

import csv
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = ROOT / "configs" / "ppo" / "guess_number_tiny.yaml"
LIT_RLHF = Path(sys.executable).parent / "lit-rlhf"

# appended to the user's module: records each call in $MARKER, leaves the class as written
# (functools.wraps keeps the names, annotations and signatures)
RECORDER = """

import functools as _functools
import os as _os


def _recorded(cls):
    for _name in ("reset", "step"):
        _method = getattr(cls, _name)

        @_functools.wraps(_method)
        def _call(self, *args, _method=_method, _name=_name):
            with open(_os.environ["MARKER"], "a") as _file:
                _file.write(_name + "\\n")
            return _method(self, *args)

        setattr(cls, _name, _call)
"""

UNANNOTATED = """
from lit_rlhf.envs import StepResult


class MyEnv:
    def reset(self, row):
        self.turns = 0

    def step(self, turn):
        self.turns += 1
        return StepResult("go on", reward=0.5, done=self.turns >= 3)
"""

SUBCLASS = """
from lit_rlhf.envs import Environment, StepResult


class MyEnv(Environment):
    def reset(self, row):
        self.turns = 0

    def step(self, turn):
        self.turns += 1
        return StepResult("go on", done=self.turns >= 3)
"""

# no `from __future__ import annotations`: the annotations are evaluated types
TYPED = """
from collections.abc import Mapping
from typing import Any

from lit_rlhf.envs import StepResult


class MyEnv:
    def reset(self, row: Mapping[str, Any]) -> None:
        self.turns: int = 0

    def step(self, turn: str) -> StepResult:
        self.turns += 1
        return StepResult("go on", done=self.turns >= 3)
"""

FAULTY = """
import math

from lit_rlhf.envs import StepResult

KINDS = ("step_exit", "reset_exit", "none", "nan")


class MyEnv:
    resets = 0  # on the class: every episode steps its own copy of the prototype

    def reset(self, row):
        self.turns = 0
        self.how = HOW or KINDS[MyEnv.resets % len(KINDS)]  # HOW None: each kind in turn
        MyEnv.resets += 1
        if self.how == "reset_exit":
            raise SystemExit(2)  # argparse inside environment code

    def step(self, turn):
        self.turns += 1
        if self.turns > 1:
            return StepResult("bye", done=True)
        if self.how == "step_exit":
            raise SystemExit(2)
        if self.how == "none":
            return None
        if self.how == "nan":
            return StepResult("go on", reward=math.nan)
        return StepResult("go on")
"""
FAULTS = [("step_exit", "base_exception"), ("reset_exit", "reset"), ("none", "bad_return"),
          ("nan", "nonfinite_reward")]  # fmt: skip


def docs_example() -> str:
    """docs/agents.md's first Python block, verbatim."""
    text = (ROOT / "docs" / "agents.md").read_text()
    block = re.search(r"```python\n(.*?)```", text, re.S)
    assert block is not None
    return block.group(1)


def train(tmp_path: Path, source: str, *extra: str) -> tuple[list[str], dict[str, float]]:
    """``lit-rlhf fit`` in ``tmp_path`` on ``user_envs.MyEnv`` (``source`` + the recorder):
    the calls the class recorded and the first logged step's metrics."""
    assert ROOT not in tmp_path.parents
    (tmp_path / "user_envs.py").write_text(source + RECORDER + "\n_recorded(MyEnv)\n")
    marker = tmp_path / "calls.txt"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(PYTHONPATH=str(tmp_path), MARKER=str(marker), OMP_NUM_THREADS="1")
    cmd = [
        str(LIT_RLHF), "fit", "--config", str(CONFIG),
        "--model.init_args.environment=user_envs.MyEnv",
        "--trainer.max_steps=1", "--trainer.limit_val_batches=0",
        "--trainer.enable_progress_bar=false", "--trainer.enable_model_summary=false",
        f"--trainer.default_root_dir={tmp_path}", f"--trainer.logger.init_args.save_dir={tmp_path}",
        *extra,
    ]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    rows = list(csv.DictReader(next(tmp_path.rglob("metrics.csv")).open()))
    step = next(row for row in rows if row.get("env/turns"))
    metrics = {k: float(v) for k, v in step.items() if v and k.startswith("env/")}
    return (marker.read_text().split() if marker.exists() else []), metrics


@pytest.mark.parametrize(
    "source",
    [docs_example(), UNANNOTATED, SUBCLASS, TYPED],
    ids=["docs_example", "unannotated", "subclass", "typed_no_future"],
)
def test_a_user_environment_trains_through_the_cli_from_outside(tmp_path, source):
    calls, metrics = train(tmp_path, source)
    assert "reset" in calls and "step" in calls
    assert metrics["env/turns"] > 1.0  # some episode took more than one turn
    assert metrics["env/faults/exception"] == 0 == metrics["env/faults/bad_return"]


def test_a_class_without_step_is_refused_naming_it(tmp_path):
    (tmp_path / "user_envs.py").write_text(
        "class MyEnv:\n    def reset(self, row):\n        pass\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(tmp_path)
    cmd = [str(LIT_RLHF), "fit", "--config", str(CONFIG),
           "--model.init_args.environment=user_envs.MyEnv"]  # fmt: skip
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("error: model.init_args.environment: environment user_envs.MyEnv")
    assert "has no method step(turn)" in last and "Fix: add step(turn) to MyEnv" in last


@pytest.fixture(scope="module")
def every_fault(tmp_path_factory) -> tuple[list[str], dict[str, float]]:
    """One run whose episodes take the four faults in turn (16 episodes: 4 of each)."""
    return train(tmp_path_factory.mktemp("faults"), "HOW = None\n" + FAULTY)


@pytest.mark.parametrize(("how", "kind"), FAULTS)
def test_the_run_finishes_and_counts_each_environment_fault(every_fault, how, kind):
    calls, metrics = every_fault
    assert metrics[f"env/faults/{kind}"] >= 1
    if kind == "reset":  # every fourth episode's reset fails
        assert metrics["env/faults/reset"] == calls.count("reset") / 4
    assert metrics["env/faults"] == sum(metrics[f"env/faults/{k}"] for _, k in FAULTS)


@pytest.mark.slow
@pytest.mark.parametrize(("how", "kind"), FAULTS)
def test_a_run_of_one_fault_kind_finishes_and_counts_it(tmp_path, how, kind):
    """The slow twin of the above: one run per kind, every episode taking that fault."""
    calls, metrics = train(tmp_path, f"HOW = {how!r}\n" + FAULTY)
    assert metrics[f"env/faults/{kind}"] >= 1
    assert metrics["env/faults"] == metrics[f"env/faults/{kind}"]
    assert "reset" in calls
    if kind == "reset":  # a failed reset: that environment is never stepped
        assert "step" not in calls and metrics["env/turns"] == 1.0
    else:
        assert "step" in calls
