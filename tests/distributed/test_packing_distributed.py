"""Packed micro-batches on 2 CPU processes (``pytest -m distributed``): ranks whose token-budget
plans differ in length run the same number of micro-batches (the shorter plan padded with
zero-weight repeats), the step completes under DDP and ZeRO-3, and DDP's ranks end with the same
weights."""

from __future__ import annotations

import json

import pytest
import torch

from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed


@pytest.mark.parametrize("mode", ["ddp", "zero3"])
def test_packed_ranks_run_equal_micro_batch_counts(mode, tmp_path):
    out = tmp_path / f"packing_{mode}.json"
    run_python("-m", "tests.distributed.run_packing", mode, str(out))
    summaries = [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in (0, 1)]
    assert [s["steps"] for s in summaries] == [1, 1]
    assert summaries[0]["micro_batches"] == summaries[1]["micro_batches"], summaries
    planned = [s["micro_batches"] - s["padding"] for s in summaries]
    # rank 0 (short prompts) plans fewer micro-batches and pads up to rank 1's count
    assert planned[0] < planned[1] and summaries[1]["padding"] == 0, summaries
    if mode == "ddp":
        weights = [torch.load(out.with_suffix(f".rank{r}.pt")) for r in (0, 1)]
        for name, value in weights[0].items():
            torch.testing.assert_close(weights[1][name], value, atol=0, rtol=0)
