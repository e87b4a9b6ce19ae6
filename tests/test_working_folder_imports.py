"""A user's own module beside their config imports by its class path through the ``lit-rlhf``
console script, run from the user's folder outside the repository with no PYTHONPATH; a module
in that folder named like an installed package does not shadow it; a module that is nowhere is
refused naming where it was looked for."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPT = Path(sys.executable).parent / "lit-rlhf"


def _fit(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return subprocess.run(
        [str(SCRIPT), "fit", "--config", str(REPO / "configs/ppo/countdown_tiny.yaml"),
         "--trainer.fast_dev_run=true", f"--trainer.default_root_dir={folder}",
         f"--trainer.logger.init_args.save_dir={folder}", *args],
        cwd=folder, env=env, capture_output=True, text=True, timeout=300, check=False,
    )  # fmt: skip


@pytest.mark.skipif(not SCRIPT.exists(), reason="the lit-rlhf console script is not installed")
def test_an_own_reward_module_in_the_working_folder_imports_and_shadows_nothing(tmp_path):
    (tmp_path / "my_rewards.py").write_text(
        "def correctness(completions, **kwargs):\n"
        "    return [float('=' in c) for c in completions]\n"
    )
    # a module named like a dependency: found only if the folder came first on the path
    (tmp_path / "datasets.py").write_text("raise ImportError('the folder shadowed datasets')\n")
    run = _fit(
        tmp_path,
        "--model.init_args.reward=my_rewards.correctness",
        "--model.init_args.eval.pass_metric=null",
    )
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert "shadowed" not in run.stdout + run.stderr

    missing = _fit(tmp_path, "--model.init_args.reward=not_here.correctness")
    assert missing.returncode != 0
    last = missing.stderr.strip().splitlines()[-1]
    assert "No module named 'not_here'" in last and f"working folder {tmp_path}" in last
