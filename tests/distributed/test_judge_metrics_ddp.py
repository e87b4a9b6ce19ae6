"""Judge metrics under torch.distributed: a subset seen by one rank only must not leave the other
waiting (each rank syncs the same metrics) and the values are the global ones."""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from lit_rlhf.metrics import JudgeMetrics
from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed

# rank 0 judges two "easy" pairs (one right); rank 1 one "hard" pair (right) and one "easy" (wrong)
BATCHES = {
    0: ([[-1], [1]], [-1, -1], ["f0", "f1"], ["easy", "easy"]),
    1: ([[1], [-1]], [1, 1], ["f2", "f3"], ["hard", "easy"]),
}


def _worker(rank: int, init_file: str, out_dir: str) -> None:
    dist.init_process_group(
        "gloo",
        init_method=f"file://{init_file}",
        rank=rank,
        world_size=2,
        timeout=datetime.timedelta(seconds=60),
    )
    try:
        metrics = JudgeMetrics()
        metrics.update(*BATCHES[rank])
        values = {k: float(v) for k, v in metrics.compute().items()}
        torch.save(values, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_subsets_seen_by_one_rank_sync_on_both(tmp_path: Path) -> None:
    # spawned from a subprocess: the workers re-import this module by name from the repo root
    run_python("-m", "tests.distributed.test_judge_metrics_ddp", str(tmp_path), timeout=120)
    results = [torch.load(tmp_path / f"rank{r}.pt") for r in (0, 1)]
    torch.testing.assert_close(results[0], results[1], equal_nan=True)  # the same on both ranks
    # easy: right, wrong (rank 0), wrong (rank 1) -> 1/3; hard: 1/1; all four: 2/4
    assert results[0]["accuracy/easy"] == pytest.approx(1 / 3)
    assert results[0]["accuracy/hard"] == pytest.approx(1.0)
    assert results[0]["accuracy"] == pytest.approx(0.5)


if __name__ == "__main__":
    out = sys.argv[1]
    mp.spawn(_worker, args=(str(Path(out) / "init"), out), nprocs=2, join=True)
