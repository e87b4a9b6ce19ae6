"""The logger fragments (configs/trainer/wandb.yaml, mlflow.yaml) on the tiny PPO config, with no
network: W&B offline, MLflow in a local SQLite store. Each gets every metric the CSV logger gets,
and the run's hyperparameters."""

from __future__ import annotations

import csv
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rlhf.cli import cli_main

CONFIGS = Path(__file__).parents[2] / "configs"


def _fit_with(fragment: str, tmp_path: Path, *, process: bool = False) -> list[dict]:
    """Two rollout steps of countdown_tiny composed with ``fragment``, run in ``tmp_path`` (the
    fragments' stores are relative paths), in this process or (``process``) as a ``lit-rlhf``
    process of its own; returns the CSV logger's rows."""
    args = [
        "fit",
        "--config", str(CONFIGS / "ppo" / "countdown_tiny.yaml"),
        "--config", str(CONFIGS / "trainer" / fragment),
        "--trainer.limit_train_batches=2",
        "--trainer.limit_val_batches=1",
        "--trainer.enable_checkpointing=false",
    ]  # fmt: skip
    if process:
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "WANDB_SILENT": "true"}
        done = subprocess.run(
            [sys.executable, "-m", "lit_rlhf.cli", *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-3000:]
    else:
        cwd = os.getcwd()
        os.chdir(tmp_path)
        try:
            assert cli_main(args).trainer.state.finished
        finally:
            os.chdir(cwd)
    (metrics_csv,) = (tmp_path / "runs" / "csv").glob("version_*/metrics.csv")
    with metrics_csv.open() as handle:
        return list(csv.DictReader(handle))


def _csv_series(rows: list[dict], key: str) -> list[float]:
    return [float(row[key]) for row in rows if row.get(key)]


def test_mlflow_fragment_logs_every_metric_and_the_hyperparameters(tmp_path):
    pytest.importorskip("mlflow", reason="needs the [loggers] extra")
    pytest.importorskip("sqlalchemy", reason="MLflow's SQLite store needs the [loggers] extra")
    from mlflow import MlflowClient

    rows = _fit_with("mlflow.yaml", tmp_path)
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("lit-rlhf")
    assert experiment is not None
    (run,) = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "reward/mean")
    assert [m.value for m in sorted(history, key=lambda m: m.step)] == pytest.approx(
        _csv_series(rows, "reward/mean")
    )
    assert len(history) == 2  # one value per rollout step
    # MLflow keys allow no '@': Lightning's logger writes val/pass@1 as val/pass1
    logged = {key.replace("@", "") for row in rows for key, value in row.items() if value}
    assert logged - {"step"} <= set(run.data.metrics)
    assert run.data.params["rollout/samples_per_prompt"] == "4"
    assert run.data.params["model"] == "builtin:tiny-llama"


def test_wandb_fragment_writes_an_offline_run_with_every_metric(tmp_path):
    pytest.importorskip("wandb", reason="needs the [loggers] extra")
    # its own process: W&B flushes and closes the run when the process ends, as `lit-rlhf` does
    rows = _fit_with("wandb.yaml", tmp_path, process=True)
    (run_dir,) = (tmp_path / "runs" / "wandb").glob("offline-run-*")
    (records,) = run_dir.glob("run-*.wandb")
    data = records.read_bytes()  # W&B's record log (protobuf): keys are stored as plain strings
    logged = {key for row in rows for key, value in row.items() if value} - {"step", "epoch"}
    assert {"reward/mean", "train/lr", "rollout/response_length"} <= logged
    missing = [key for key in logged if key.encode() not in data]
    assert not missing, f"metrics missing from the W&B run: {missing}"
    assert b"samples_per_prompt" in data  # the hyperparameters went into the run's config
