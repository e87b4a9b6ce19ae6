"""A TRL user's first hour, as they would do it: a folder of their own outside the repository,
the ``lit-rlhf`` console script in subprocesses, no PYTHONPATH, output redirected (not a
terminal), and only what README.md and docs/data.md say.

- GRPO on their own JSONL prompts with their own ``def reward(completions, **kwargs)`` module,
  ``log_completions`` on: one plain progress line per step; each completions row's reward is the
  user's function of that row's completion, and each step's rows average to the logged
  ``reward/mean``.
- DPO on TRL's ``prompt/chosen/rejected`` string rows, no schema setting.
- kill -9 in the middle of a shipped config's run, resume from its ``last.ckpt``: the same log
  folder, every step logged once.
- a typo and a TRL name, each answered with the setting meant.
- W&B (offline) and MLflow (a local store) each receive the completions table.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "lit-rlhf"
COUNTDOWN = REPO / "configs" / "ppo" / "countdown_tiny.yaml"
RUN = Path("runs") / "countdown_tiny" / "version_0"  # the shipped config's CSV folder

pytestmark = pytest.mark.skipif(not SCRIPT.exists(), reason="the lit-rlhf script is not installed")

REWARDS = '''
def digits(completions, solution, **kwargs):
    """TRL's reward contract: the share of digits in each completion (a solution column rides
    along as a keyword argument)."""
    assert len(solution) == len(completions)
    return [sum(ch.isdigit() for ch in c) / max(len(c), 1) for c in completions]
'''


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", WANDB_SILENT="true")
    return env


def _lit_rlhf(folder: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [str(SCRIPT), *args], cwd=folder, env=_env(), capture_output=True, text=True,
        timeout=timeout, check=False,
    )  # fmt: skip


def _rows(path: Path) -> list[dict[str, str]]:
    with path.open(newline="") as file:
        return list(csv.DictReader(file))


def _user_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "my_project"
    folder.mkdir()
    assert REPO not in folder.resolve().parents
    return folder


def _grpo_args(*extra: str) -> list[str]:
    return [
        "fit", "--config", str(COUNTDOWN),
        "--data.init_args.train=lit_rlhf.data.FilePrompts",
        "--data.init_args.train.init_args.path=prompts.jsonl",
        "--data.init_args.val=null",
        "--model.init_args.reward=my_rewards.digits",
        "--model.init_args.eval.pass_metric=null",
        "--model.init_args.rollout.log_completions=1",
        *extra,
    ]  # fmt: skip


def _write_grpo_files(folder: Path) -> None:
    rows = [{"prompt": f"What is {a} + {a + 3}?", "solution": str(2 * a + 3)} for a in range(8)]
    (folder / "prompts.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "my_rewards.py").write_text(REWARDS)


def _completions(folder: Path) -> dict[int, list[dict]]:
    by_step: dict[int, list[dict]] = defaultdict(list)
    for line in (folder / RUN / "completions.jsonl").read_text().splitlines():
        row = json.loads(line)
        by_step[row["rollout_step"]].append(row)
    return by_step


def test_grpo_on_own_prompts_and_reward_logs_completions_and_plain_progress(tmp_path):
    folder = _user_folder(tmp_path)
    _write_grpo_files(folder)
    run = _lit_rlhf(folder, *_grpo_args("--trainer.max_steps=2"))
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    progress = [line for line in run.stdout.splitlines() if line.startswith("lit-rlhf: step ")]
    assert [p.split(" | ")[0] for p in progress] == ["lit-rlhf: step 1/2", "lit-rlhf: step 2/2"]
    assert all("reward" in p and "s/step" in p for p in progress), progress

    by_step = _completions(folder)
    assert sorted(by_step) == [1, 2] and all(len(rows) == 16 for rows in by_step.values())
    sys.path.insert(0, str(folder))
    try:
        from my_rewards import digits  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(folder))
    metrics = [r for r in _rows(folder / RUN / "metrics.csv") if r.get("reward/mean")]
    logged = {int(float(r["rollout/step"])): float(r["reward/mean"]) for r in metrics}
    tied = {int(float(r["rollout/step"])): float(r["reward/tied_groups"]) for r in metrics}
    for step, rows in by_step.items():
        groups: dict[str, list[float]] = {}
        for r in rows:  # a prompt's samples are its group
            groups.setdefault(r["prompt"], []).append(r["reward"])
        ties = [max(g) == min(g) for g in groups.values() if len(g) > 1]
        assert tied[step] == pytest.approx(sum(ties) / len(ties))
        expected = digits([r["completion"] for r in rows], [""] * len(rows))
        assert [r["reward"] for r in rows] == pytest.approx(expected, abs=1e-6)
        mean = torch.tensor([r["reward"] for r in rows]).mean().item()
        assert logged[step] == pytest.approx(mean, abs=1e-6)
        assert all(r["prompt"] and "What is" in r["prompt"] for r in rows)
    assert "completion (rollout step 1, reward" in run.stderr  # one sample on the console


def test_dpo_on_trl_preference_rows_without_a_schema(tmp_path):
    folder = _user_folder(tmp_path)
    rows = [
        {"prompt": f"What is {a} + 2?", "chosen": f"It is {a + 2}.", "rejected": f"It is {a}."}
        for a in range(16)
    ]
    (folder / "pairs.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    run = _lit_rlhf(
        folder, "fit", "--config", str(REPO / "configs" / "dpo" / "tiny.yaml"),
        "--data.init_args.train=lit_rlhf.data.PreferencePairs",
        "--data.init_args.train.init_args.path=pairs.jsonl",
        "--data.init_args.val=null", "--trainer.max_steps=2",
    )  # fmt: skip
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    progress = [line for line in run.stdout.splitlines() if line.startswith("lit-rlhf: step ")]
    assert len(progress) == 2 and all("loss" in p for p in progress), progress
    (metrics,) = (folder / "runs").glob("*/version_0/metrics.csv")
    assert len([r for r in _rows(metrics) if r.get("train/loss")]) == 2


KILLED = """
import os, signal
from pathlib import Path

from lit_rlhf.modules import PPOModule


class KilledOnce(PPOModule):
    \"\"\"PPO that kill -9s its own process once, right after step 4's checkpoint is written and
    before Lightning logs that batch's metrics row (module hooks run after the callbacks').\"\"\"

    def on_train_batch_end(self, outputs, batch, batch_idx):
        flag = Path("kill_once")
        if self.trainer.global_step == 4 and flag.exists():
            flag.unlink()
            os.kill(os.getpid(), signal.SIGKILL)
"""


def test_kill_9_and_resume_from_last_ckpt_into_the_same_log_folder(tmp_path):
    folder = _user_folder(tmp_path)
    (folder / "my_ppo.py").write_text(KILLED)
    (folder / "kill_once").touch()
    args = ["fit", "--config", str(COUNTDOWN), "--trainer.limit_train_batches=8",
            "--model.class_path=my_ppo.KilledOnce"]  # fmt: skip
    killed = _lit_rlhf(folder, *args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    last = folder / RUN / "checkpoints" / "last.ckpt"
    assert torch.load(last, weights_only=True, map_location="cpu")["global_step"] == 4
    before = [int(r["step"]) for r in _rows(folder / RUN / "metrics.csv") if r.get("reward/mean")]
    assert before == [0, 1, 2]  # batch 3's row was never written: the kill came first

    run = _lit_rlhf(folder, *args, f"--ckpt_path={last}")
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert [p.name for p in (folder / "runs" / "countdown_tiny").iterdir()] == ["version_0"]
    steps = [int(r["step"]) for r in _rows(folder / RUN / "metrics.csv") if r.get("reward/mean")]
    assert steps == list(range(8))  # each training step once, in order: row 3 from the checkpoint
    assert torch.load(last, weights_only=True, map_location="cpu")["global_step"] == 8


@pytest.mark.parametrize(
    ("argument", "answer"),
    [
        ("--model.init_args.rollout.samples_per_promt=2",
         "did you mean rollout.samples_per_prompt?"),
        ("--model.init_args.num_generations=2",
         "'num_generations' is TRL's name; lit-rlhf's is model.init_args.rollout.samples_per"),
    ],
)  # fmt: skip
def test_a_typo_and_a_trl_name_get_the_setting_meant(tmp_path, argument, answer):
    run = _lit_rlhf(_user_folder(tmp_path), "fit", "--config", str(COUNTDOWN), argument)
    assert run.returncode != 0
    assert answer in run.stderr.strip().splitlines()[-1], run.stderr[-1000:]


def test_wandb_and_mlflow_receive_the_completions_table(tmp_path):
    pytest.importorskip("wandb", reason="needs the [loggers] extra")
    pytest.importorskip("mlflow", reason="needs the [loggers] extra")
    from mlflow import MlflowClient

    folder = _user_folder(tmp_path)
    _write_grpo_files(folder)
    for fragment in ("wandb.yaml", "mlflow.yaml"):
        run = _lit_rlhf(
            folder, *_grpo_args("--trainer.max_steps=1"),
            "--config", str(REPO / "configs" / "trainer" / fragment),
        )  # fmt: skip
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]

    def own_rows(version: int) -> list[float]:  # the run's completions.jsonl (its CSV folder)
        lines = (folder / "runs" / "csv" / f"version_{version}" / "completions.jsonl").read_text()
        return [json.loads(line)["reward"] for line in lines.splitlines()]

    (table,) = (folder / "runs" / "wandb").glob("offline-run-*/files/media/table/completions_*")
    content = json.loads(table.read_text())
    assert len(content["data"]) == 16 and "reward" in content["columns"]
    rewards = [row[content["columns"].index("reward")] for row in content["data"]]
    assert rewards == pytest.approx(own_rows(0))  # the W&B run's own samples

    client = MlflowClient(f"sqlite:///{folder / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lit-rlhf")
    assert experiment is not None
    (mlflow_run,) = client.search_runs([experiment.experiment_id])
    (artifact,) = client.list_artifacts(mlflow_run.info.run_id, "completions")
    local = client.download_artifacts(mlflow_run.info.run_id, artifact.path, str(tmp_path))
    mlflow_table = json.loads(Path(local).read_text())
    columns = mlflow_table["columns"]
    assert len(mlflow_table["data"]) == 16
    mlflow_rewards = [row[columns.index("reward")] for row in mlflow_table["data"]]
    assert mlflow_rewards == pytest.approx(own_rows(1))  # the MLflow run's own samples
