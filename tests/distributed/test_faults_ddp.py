"""A non-finite loss on ONE rank skips the optimizer step on BOTH (2 CPU processes): under DDP
by OptimizerStep's collective decision, under DeepSpeed ZeRO-2 by DeepSpeed's own overflow
check inside its step (read back through ``engine.was_step_applied()``); the weights stay
identical across ranks and the run goes on (``pytest -m distributed``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lit_rlhf.training.faults import SKIPPED_STEPS_KEY
from tests.distributed.launch import run_python

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
