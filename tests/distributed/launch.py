"""Run a Python command line from the repository root in a subprocess.

Multi-process runs must not start inside pytest: Lightning's ddp launcher (DDP and DeepSpeed)
re-runs the current command line once per extra process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


def run_python(*args: str, timeout: float = 300, expect_failure: bool = False) -> str:
    """``python ARGS`` from the repository root; returns stdout + stderr, fails the test with the
    tail of both on a non-zero exit (``expect_failure``: on a zero exit)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    output = proc.stdout + proc.stderr
    if expect_failure:
        if proc.returncode == 0:
            pytest.fail(
                f"`python {' '.join(args)}` succeeded; a failure was expected:\n{output[-3000:]}"
            )
        return output
    if proc.returncode != 0:
        pytest.fail(f"`python {' '.join(args)}` exited with {proc.returncode}:\n{output[-6000:]}")
    return output


def fit_with_fragment(
    fragment: str, root: Path, *overrides: str, config: str = "configs/ppo/countdown_tiny.yaml"
) -> str:
    """``lit-rlhf fit`` of a tiny config (default: Countdown) composed with
    ``configs/trainer/<fragment>``, one training and one validation batch (fast_dev_run)."""
    return run_python(
        "-m",
        "lit_rlhf.cli",
        "fit",
        "--config",
        config,
        "--config",
        f"configs/trainer/{fragment}.yaml",
        "--trainer.fast_dev_run=true",
        f"--trainer.default_root_dir={root}",
        *overrides,
    )


def step_checkpoint_fit(fragment: str, root: Path) -> list[str]:
    """``python`` arguments of ``lit-rlhf fit`` of the tiny Countdown config composed with
    ``configs/trainer/<fragment>``, logging under ``root``, no validation, a checkpoint after
    every optimizer step in ``root/ckpt`` (``epoch=0-step=N.ckpt``); add ``max_steps``."""
    return [
        "-m", "lit_rlhf.cli", "fit",
        "--config", "configs/ppo/countdown_tiny.yaml",
        "--config", f"configs/trainer/{fragment}.yaml",
        f"--trainer.default_root_dir={root}",
        f"--trainer.logger.init_args.save_dir={root}",
        "--trainer.limit_val_batches=0",
        "--trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint",
        f"--trainer.callbacks.dirpath={root / 'ckpt'}",
        "--trainer.callbacks.every_n_train_steps=1",
        "--trainer.callbacks.save_top_k=-1",
    ]  # fmt: skip


def fit_and_sigterm(
    args: list[str], root: Path, *, timeout: float, before_signal: Any = None
) -> str:
    """Start ``args`` (a ``lit-rlhf fit`` logging a CSV under ``root``), send it SIGTERM once a
    training step is logged (after ``before_signal(pid)``), assert the exit code 143; returns
    its output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.Popen(
        args, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    deadline = time.monotonic() + timeout
    while not list(root.glob("**/metrics.csv")) and proc.poll() is None:  # a step logged
        assert time.monotonic() < deadline, f"no training step within {timeout:.0f} s"
        time.sleep(0.2)
    if before_signal is not None:
        before_signal(proc.pid)
    proc.send_signal(signal.SIGTERM)
    output = proc.communicate(timeout=timeout)[0].decode()
    assert proc.returncode == 128 + signal.SIGTERM, output[-3000:]
    return output


def interrupted_step(root: Path) -> tuple[Path, int]:
    """The one ``interrupted.ckpt`` under ``root`` and the optimizer step it was saved at."""
    (path,) = root.glob("**/checkpoints/interrupted.ckpt")
    return path, int(torch.load(path, weights_only=True)["global_step"])


def resume_one_more_step(args: list[str], path: Path, step: int, *, timeout: float) -> str:
    """Run ``args`` from checkpoint ``path`` (saved at ``step``) for one more step; asserts a
    clean exit and returns the output."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    resumed = subprocess.run(
        [*args, f"--trainer.max_steps={step + 1}", f"--ckpt_path={path}"],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout, check=False,
    )  # fmt: skip
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-3000:]
    return resumed.stdout + resumed.stderr
