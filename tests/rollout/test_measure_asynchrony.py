"""``python -m lit_rlhf.measure.asynchrony`` as a user runs it (a subprocess, in the vLLM venv),
at the smallest size: one server, one round of three training batches per arm (synchronous,
one-step-off, partial rollouts), each arm its own ``lit-rlhf fit`` process.

Runs in the vLLM venv (``make test-vllm``); about 2 min on 2 busy cores (the server's start and
three training processes), hence also marked slow (``-m "vllm and not slow"`` leaves it out).
"""

from __future__ import annotations

import json
import math

import pytest

from tests.distributed.launch import run_python

pytest.importorskip("vllm")
pytestmark = [pytest.mark.vllm, pytest.mark.slow]

PARTS = ("step_s", "generate_s", "update_s", "wait_s", "sync_s", "overlap")


def test_the_asynchrony_measurement_runs_three_arms_side_by_side(tmp_path):
    out = tmp_path / "asynchrony.json"
    printed = run_python(
        "-m", "lit_rlhf.measure.asynchrony", "--steps", "3", "--rounds", "1", "--out", str(out),
        timeout=600,
    )  # fmt: skip
    record = json.loads(out.read_text())
    assert set(record["arms"]) == {"sync", "one_step_off", "partial"}
    assert record["counted_batches"] == [2]  # batch 0 fills the queue, batch 1 is the first update
    assert record["cpu"]["model_name"] in printed and "sync/arm" in printed
    for arm, result in record["arms"].items():
        (run,) = result["runs"]
        assert len(run["batches"]) == 3, arm
        medians = result["median"]
        assert all(math.isfinite(medians[k]) and medians[k] >= 0 for k in PARTS), (arm, medians)
        assert medians["step_s"] > 0 and medians["generate_s"] > 0 and medians["update_s"] > 0
        assert math.isfinite(result["hidden_share"]) and result["hidden_share"] <= 1.0
        assert result["step_ratio_sync_over_arm"] > 0
    assert record["arms"]["sync"]["step_ratio_sync_over_arm"] == 1.0
    assert record["arms"]["sync"]["hidden_share"] == 0.0  # nothing runs beside its generation
    partial = record["arms"]["partial"]["median"]
    for key in ("rollout/staleness_mean", "rollout/staleness_max", "rollout/stale_token_frac",
                "rollout/mixed_version_frac", "rollout/stale_dropped"):  # fmt: skip
        assert math.isfinite(partial[key]), key
    assert partial["rollout/staleness_max"] <= 1  # the bound of max_staleness: 1
    assert partial["rollout/stale_dropped"] == 0
    assert "rollout/staleness_mean" not in record["arms"]["one_step_off"]["median"]
