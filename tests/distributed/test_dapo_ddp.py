"""DAPO's dynamic sampling on 2 DDP ranks (``pytest -m distributed``): each rank's every update
holds exactly its batch's groups (2 prompts x 4 samples), none with equal rewards, and both ranks
take the same optimizer steps (they update together, when both buffers are full)."""

from __future__ import annotations

import json

import pytest

from tests.distributed.launch import run_python

pytestmark = pytest.mark.distributed


def test_dynamic_sampling_fills_every_rank_and_keeps_them_in_step(tmp_path):
    out = tmp_path / "dapo.json"
    run_python("-m", "tests.distributed.run_dapo", str(out))
    ranks = [json.loads(out.with_suffix(f".rank{r}.json").read_text()) for r in (0, 1)]
    assert ranks[0]["global_step"] == ranks[1]["global_step"] > 0
    assert len(ranks[0]["updates"]) == len(ranks[1]["updates"]) == ranks[0]["global_step"]
    for rank in ranks:
        for update in rank["updates"]:
            assert update == {"samples": 8, "groups": 2, "differ": [True, True]}
