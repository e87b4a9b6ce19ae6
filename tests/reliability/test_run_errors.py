"""Errors a user meets at run time, from the outside: ``lit-rlhf fit`` in a subprocess, run from a
folder outside the repository with the user's reward module in it (on ``PYTHONPATH``, nothing
else). A reward that breaks its contract and a reward whose info lacks ``eval.pass_metric``
each end the run at the first training rollout (the reward ran once, validation is off) with
exit code 1 and one stderr line that names the setting and the fix; with ``LIT_RLHF_DEBUG=1``
the traceback is printed instead. In-process, the other known kinds (an environment or engine
breaking its contract, a malformed data row) are one line too, and an error of an unknown kind
keeps its traceback."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from lit_rlhf.cli.errors import one_line_errors
from lit_rlhf.data import FilePrompts, PromptDataModule
from lit_rlhf.envs import check_environment
from lit_rlhf.models import load_tokenizer
from lit_rlhf.rewards.adapt import RewardReturnError, as_scores
from lit_rlhf.training import RolloutCollector
from lit_rlhf.types import GenerationOutput
from tests.helpers import prompt_loader

ROOT = Path(__file__).resolve().parents[2]
TINY = str(ROOT / "configs" / "ppo" / "countdown_tiny.yaml")  # eval.pass_metric: correct

USER_REWARDS = """
from pathlib import Path

CALLS = Path(__file__).with_name("calls.txt")


def _called():
    with CALLS.open("a") as f:
        f.write("x")


def returns_text(prompts, completions, **kwargs):
    _called()
    return ["great answer"] * len(completions)


def no_correct_info(prompts, completions, **kwargs):
    _called()
    return [float(len(c) % 2) for c in completions]


def one_parameter(text):
    return [0.0]
"""


def lit_rlhf_fit(folder: Path, reward: str, debug: bool = False) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LIT_RLHF_DEBUG")}
    env.update(PYTHONPATH=str(folder), HF_HUB_OFFLINE="1")
    if debug:
        env["LIT_RLHF_DEBUG"] = "1"
    script = Path(sys.executable).with_name("lit-rlhf")  # the console script of this venv
    command = [str(script)] if script.exists() else [sys.executable, "-m", "lit_rlhf.cli"]
    command += ["fit", "--config", TINY]
    command += [
        f"--model.init_args.reward=user_rewards.{reward}",
        "--trainer.limit_val_batches=0",  # so only a training rollout can refuse it
        f"--trainer.default_root_dir={folder / 'run'}",
        "--trainer.logger=false",
        "--trainer.enable_checkpointing=false",
    ]
    return subprocess.run(command, cwd=folder, env=env, capture_output=True, text=True, timeout=300)


@pytest.fixture
def user_folder(tmp_path: Path) -> Path:
    assert ROOT not in tmp_path.parents
    (tmp_path / "user_rewards.py").write_text(USER_REWARDS)
    return tmp_path


@pytest.mark.parametrize(
    ("reward", "setting", "cause"),
    [
        ("returns_text", "model.init_args.reward", "reward 'returns_text' returned str"),
        ("no_correct_info", "model.init_args.eval.pass_metric", "eval.pass_metric='correct'"),
    ],
    ids=["reward-contract", "pass-metric"],
)
def test_a_known_error_ends_the_run_at_the_first_rollout_in_one_line(
    user_folder: Path, reward: str, setting: str, cause: str
) -> None:
    result = lit_rlhf_fit(user_folder, reward)
    assert result.returncode == 1, result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("lit-rlhf: error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert errors[0].startswith(f"lit-rlhf: error: {setting}: {cause}")
    assert "Fix: " in errors[0] and "LIT_RLHF_DEBUG=1" in errors[0]
    assert "Traceback" not in result.stderr
    assert (user_folder / "calls.txt").read_text() == "x"  # the first rollout's scoring only


def test_with_lit_rlhf_debug_the_cli_prints_the_traceback(user_folder: Path) -> None:
    # refused while the CLI builds the module (no model loads): the traceback, then the cause
    result = lit_rlhf_fit(user_folder, "one_parameter", debug=True)
    assert result.returncode == 1
    assert "Traceback (most recent call last)" in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("lit_rlhf.rewards.adapt.RewardSignatureError: reward 'one_parameter'")
    assert "lit-rlhf: error:" not in result.stderr


def test_with_lit_rlhf_debug_a_wrapped_error_propagates(monkeypatch, capsys) -> None:
    def fail() -> None:
        try:
            as_scores(["great answer"], 1, "returns_text")
        except RewardReturnError as err:  # as Lightning re-raises it: wrapped, with its cause
            raise RuntimeError("the fit loop stopped") from err

    with pytest.raises(SystemExit) as ended, one_line_errors():
        fail()
    assert ended.value.code == 1 and "Traceback" not in capsys.readouterr().err
    monkeypatch.setenv("LIT_RLHF_DEBUG", "1")
    with pytest.raises(RuntimeError) as raised, one_line_errors():
        fail()
    assert isinstance(raised.value.__cause__, RewardReturnError)
    assert capsys.readouterr().err == ""


def test_an_unknown_error_keeps_its_traceback() -> None:
    with pytest.raises(KeyError, match="a bug of the user's reward"), one_line_errors():
        raise KeyError("a bug of the user's reward")


class WrongBatchEngine:
    """An engine whose ``generate`` returns one response fewer than it was given prompts."""

    temperature, max_new_tokens = 1.0, 4

    def generate(self, model, input_ids, attention_mask, tokenizer, **kwargs):
        ids = torch.zeros(len(input_ids) - 1, 4, dtype=torch.long)
        return GenerationOutput(ids, torch.ones_like(ids, dtype=torch.bool), None)

    def sync_weights(self, model):
        pass


def _environment_without_step() -> None:
    class NoStep:
        def reset(self, row):
            pass

    check_environment(NoStep())


def _engine_with_a_wrong_batch() -> None:
    tokenizer = load_tokenizer("builtin:tiny-llama")
    collector = RolloutCollector(WrongBatchEngine(), lambda p, c: [0.0] * len(c))
    batch = next(iter(prompt_loader(tokenizer, ["a", "b"], 2)))
    collector.generate(None, tokenizer, batch, samples_per_prompt=2)  # type: ignore[arg-type]


def _data_row_without_the_question(folder: Path) -> None:
    rows = folder / "prompts.jsonl"
    rows.write_text('{"question": "1 + 1?", "answer": "2"}\n{"problem": "2 + 2?", "answer": 4}\n')
    data = PromptDataModule("builtin:tiny-llama", train=FilePrompts(str(rows)))
    data.setup("fit")


@pytest.mark.parametrize(
    ("fail", "start"),
    [
        (_environment_without_step, "model.init_args.environment: environment "),
        (_engine_with_a_wrong_batch, "model.init_args.engine: WrongBatchEngine.generate returned"),
        (_data_row_without_the_question, "data.init_args.train: "),
    ],
    ids=["environment", "engine", "data"],
)
def test_environment_engine_and_data_errors_are_one_line(
    fail, start: str, tmp_path: Path, capsys
) -> None:
    with pytest.raises(SystemExit) as ended, one_line_errors():
        fail(tmp_path) if fail is _data_row_without_the_question else fail()
    err = capsys.readouterr().err  # (datasets may draw progress bars on it)
    lines = [line for line in err.splitlines() if line.startswith("lit-rlhf: error:")]
    assert ended.value.code == 1 and len(lines) == 1 and "Traceback" not in err
    assert lines[0].startswith(f"lit-rlhf: error: {start}") and "Fix: " in lines[0]
