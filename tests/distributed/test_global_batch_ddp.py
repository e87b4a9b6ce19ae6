"""Global batch sizes on 2 CPU processes (``pytest -m distributed``; about 40 s on 2 cores).

``lit-rlhf fit`` of the tiny Countdown config with ``data.init_args.global_batch_size`` 4 and
``update.global_mini_batch_size`` 2 (prompts, 4 samples each), once on one process and once
composed with ``configs/trainer/ddp.yaml`` (2 processes): each of the 2 processes takes 2 prompts
per rollout, half the single process's 4, and steps on mini-batches of 1 prompt x 4 samples, so
both runs take the same optimizer steps (2 rollouts x 2 mini-batches = 4).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed

GLOBAL = ["--data.init_args.batch_size=null", "--data.init_args.global_batch_size=4",
          "--model.init_args.update.global_mini_batch_size=2"]  # fmt: skip


def fit(tmp: Path, *extra: str) -> tuple[list[dict], str]:
    out = tmp / "seen"
    output = run_python(
        "-m", "lit_rlhf.cli", "fit", "--config", "configs/ppo/countdown_tiny.yaml", *extra,
        *GLOBAL, "--trainer.limit_train_batches=2", "--trainer.limit_val_batches=0",
        "--trainer.num_sanity_val_steps=0", "--trainer.logger=false",
        "--trainer.enable_checkpointing=false", f"--trainer.default_root_dir={tmp}",
        "--trainer.callbacks+=tests.distributed.batch_probe.BatchSizes",
        f"--trainer.callbacks.path={out}",
    )  # fmt: skip
    seen = [json.loads(p.read_text()) for p in sorted(tmp.glob("seen.rank*.json"))]
    return seen, output


def test_two_processes_halve_the_batch_and_keep_the_steps(tmp_path: Path) -> None:
    (one,), _ = fit(tmp_path / "one")
    two, output = fit(tmp_path / "two", "--config", "configs/trainer/ddp.yaml")
    assert one["world_size"] == 1 and [r["world_size"] for r in two] == [2, 2]
    assert one["batches"] == [4, 4] and one["data_batch_size"] == 4
    for rank in two:
        assert rank["batches"] == [2, 2] and rank["data_batch_size"] == 2
        assert rank["mini_batch_size"] == 4 and rank["global_mini_batch_size"] is None
    assert one["mini_batch_size"] == 8  # 2 prompts x 4 samples on the one process
    assert one["global_step"] == 4
    assert [r["global_step"] for r in two] == [4, 4]
    assert "data.init_args.global_batch_size=4: 2 per process x 2 processes" in output


def test_two_processes_refuse_a_global_batch_they_cannot_split(tmp_path: Path) -> None:
    output = run_python(
        "-m", "lit_rlhf.cli", "fit", "--config", "configs/ppo/countdown_tiny.yaml",
        "--config", "configs/trainer/ddp.yaml", "--data.init_args.batch_size=null",
        "--data.init_args.global_batch_size=3", "--trainer.fast_dev_run=true",
        f"--trainer.default_root_dir={tmp_path}", expect_failure=True,
    )  # fmt: skip
    assert "data.init_args.global_batch_size=3 rows across all processes cannot be split" in output
    assert "over 2 processes" in output and "Fix: run on a process count that divides 3" in output
