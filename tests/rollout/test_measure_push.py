"""``python -m lit_rlhf.measure.push`` as a user runs it (a subprocess, in the vLLM venv), at the
smallest size: one timed push per path on ``builtin:small-llama``; both paths push every weight
and vLLM then serves the trained policy.

Runs in the vLLM venv (``make test-vllm``); about 20 s on 2 cores.
"""

from __future__ import annotations

import json

import pytest

from tests.distributed.launch import run_python

pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm


def test_the_push_measurement_runs_both_paths_side_by_side(tmp_path):
    out = tmp_path / "push.json"
    run_python(
        "-m", "lit_rlhf.measure.push", "--model", "builtin:small-llama", "--pushes", "1",
        "--bucket-bytes", str(4 << 20), "--out", str(out),
    )  # fmt: skip
    record = json.loads(out.read_text())
    (ref,), (bucketed,) = record["runs"]["reference"], record["runs"]["bucketed"]
    assert ref["tensors"] == bucketed["tensors"] == 38  # AdamW moved every weight
    assert ref["bytes"] == bucketed["bytes"] == 4 * record["parameters"]  # float32
    # 4 MiB buckets: the 2 MiB embedding and the 2.5 MiB blocks alone, the last with the norm
    assert (ref["calls"], bucketed["calls"]) == (1, 5)
    medians = record["median_s"]
    assert record["ratio_reference_over_bucketed"] == medians["reference"] / medians["bucketed"]
    assert record["max_served_log_prob_gap"] < 1e-4  # fp32 on both sides
