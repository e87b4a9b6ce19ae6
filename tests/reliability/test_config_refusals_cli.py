"""A setting refused by its own class while ``lit-rlhf`` builds the run (a settings group's range,
a combination across groups) ends the command with that one line and exit code 1, as a user sees
it from a folder outside the repository; ``LIT_RLHF_DEBUG=1`` brings the traceback back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "ppo" / "countdown_tiny.yaml"
LIT_RLHF = [sys.executable, "-m", "lit_rlhf.cli"]


def _run(tmp_path: Path, *options: str, debug: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LIT_RLHF_DEBUG")}
    env |= {"HF_HUB_OFFLINE": "1"} | ({"LIT_RLHF_DEBUG": "1"} if debug else {})
    command = [*LIT_RLHF, "fit", "--config", str(CONFIG), "--trainer.fast_dev_run=true", *options]
    return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip


@pytest.mark.parametrize(
    ("options", "named"),
    [
        (["--model.init_args.optim.lr=-1"], "Fix: set model.init_args.optim.lr in that range"),
        (["--model.init_args.mismatch.correction=tis", "--model.init_args.update.ppo_epochs=2"],
         "Fix: set update.recompute_old_log_probs: true"),
    ],
    ids=["group-range", "across-groups"],
)  # fmt: skip
def test_a_refused_setting_is_one_line(tmp_path: Path, options: list[str], named: str) -> None:
    done = _run(tmp_path, *options)
    assert done.returncode == 1, done.stderr[-2000:]
    errors = [line for line in done.stderr.splitlines() if line.startswith("lit-rlhf: error:")]
    assert len(errors) == 1 and named in errors[0], done.stderr[-2000:]
    assert "Traceback" not in done.stderr


def test_debug_keeps_the_traceback(tmp_path: Path) -> None:
    done = _run(tmp_path, "--model.init_args.optim.lr=-1", debug=True)
    assert done.returncode != 0
    assert "Traceback" in done.stderr and "optim.lr=-1.0 must be > 0" in done.stderr
