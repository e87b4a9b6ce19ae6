"""A non-finite loss on ONE rank skips the optimizer step on BOTH (2 CPU processes): under DDP
by OptimizerStep's collective decision, under DeepSpeed ZeRO-2 by DeepSpeed's own overflow
check inside its step (read back through ``engine.was_step_applied()``); the weights stay
identical across ranks and the run goes on (``pytest -m distributed``). SIGTERM to one rank of a
``lit-rlhf fit`` DDP run stops both with one resumable checkpoint."""

from __future__ import annotations

import os
import signal
import sys
import time
from pathlib import Path

import pytest
import torch

from lit_rlhf.training.faults import SKIPPED_STEPS_KEY
from tests.distributed.launch import (
    fit_and_sigterm,
    interrupted_step,
    resume_one_more_step,
    run_python,
)

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("mode", ["ddp", "zero2"])
def test_one_ranks_nan_skips_the_step_on_both_ranks(mode: str, tmp_path: Path) -> None:
    out = tmp_path / mode
    run_python("-m", "tests.distributed.run_nan_skip", mode, str(out), timeout=240)
    ranks = [torch.load(p) for p in sorted(tmp_path.glob(f"{mode}.rank*.pt"))]
    assert len(ranks) == 2
    for records in ranks:
        assert [r[SKIPPED_STEPS_KEY] for r in records] == [0.0, 1.0, 1.0]
        for name, value in records[1]["weights"].items():  # step 1 left the weights as they were
            torch.testing.assert_close(value, records[0]["weights"][name], rtol=0, atol=0)
        assert all(bool(torch.isfinite(v).all()) for v in records[2]["weights"].values())
    for step in range(3):  # both ranks hold the same weights after every step
        for name, value in ranks[0][step]["weights"].items():
            torch.testing.assert_close(value, ranks[1][step]["weights"][name], rtol=0, atol=0)
    changed = [
        not torch.equal(v, ranks[0][1]["weights"][k]) for k, v in ranks[0][2]["weights"].items()
    ]
    assert any(changed)  # step 2 trained on


def _children(pid: int) -> list[int]:
    """The PIDs of ``pid``'s direct children (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:  # the process ended while we looked
            continue
        if int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_sigterm_to_one_rank_stops_both_with_one_checkpoint(tmp_path: Path) -> None:
    """``lit-rlhf fit`` on 2 DDP processes; SIGTERM reaches only rank 0 (the launcher's process).
    The ranks agree at the end of the batch, save one interrupted.ckpt, both exit with 143, and
    the checkpoint resumes on 2 processes."""
    args = [sys.executable, "-m", "lit_rlhf.cli", "fit",
            "--config", "configs/ppo/countdown_tiny.yaml", "--config", "configs/trainer/ddp.yaml",
            f"--trainer.default_root_dir={tmp_path}",
            f"--trainer.logger.init_args.save_dir={tmp_path}",
            "--trainer.limit_train_batches=8", "--trainer.limit_val_batches=0",
            "--trainer.logger.init_args.flush_logs_every_n_steps=1"]  # fmt: skip
    ranks: list[int] = []

    def find_ranks(pid: int) -> None:
        ranks.extend(_children(pid))
        assert ranks, "rank 1 was not started as a child of the launcher"

    output = fit_and_sigterm(args, tmp_path, timeout=180, before_signal=find_ranks)
    for pid in ranks:  # rank 1 stopped too (it got no signal: it followed the agreement)
        for _ in range(100):
            if not Path(f"/proc/{pid}").exists() or "Z" in _state(pid):
                break
            time.sleep(0.1)
        else:
            os.kill(pid, signal.SIGKILL)
            pytest.fail(f"rank process {pid} was still running 10 s after rank 0 exited")
    path, step = interrupted_step(tmp_path)
    assert 1 <= step < 8 and "saved a resumable checkpoint" in output
    resume_one_more_step(args, path, step, timeout=240)


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
