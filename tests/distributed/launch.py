"""Run a Python command line from the repository root in a subprocess.

Multi-process runs must not start inside pytest: Lightning's ddp launcher (DDP and DeepSpeed)
re-runs the current command line once per extra process.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

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
