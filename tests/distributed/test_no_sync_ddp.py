"""DDP gradient accumulation without an all-reduce per micro-batch (``pytest -m distributed``):
counted with a DDP communication hook on 2 CPU processes, only the last micro-batch of an
optimizer step communicates, and both ranks end with the same weights."""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed


def test_no_sync_until_the_last_micro_batch(tmp_path):
    out = tmp_path / "no_sync.json"
    run_python("-m", "tests.distributed.run_no_sync", str(out))
    for rank in (0, 1):
        summary = json.loads(out.with_suffix(f".rank{rank}.json").read_text())
        assert summary["steps"] == 1
        *first, last = summary["per_backward"]
        assert len(first) == 3, summary  # 16 samples in micro-batches of 4
        assert first == [0, 0, 0] and last > 0, summary
    weights = [torch.load(out.with_suffix(f".rank{r}.pt")) for r in (0, 1)]
    for name, value in weights[0].items():
        torch.testing.assert_close(weights[1][name], value, atol=0, rtol=0)
