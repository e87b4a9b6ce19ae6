"""The vLLM engine under DDP on 2 CPU processes: each rank runs its own colocated vLLM instance,
pushes every optimizer step into it, and after training serves exactly the trained (and, by DDP,
identical) policy; the run ends without errors from vLLM's or torch.distributed's shutdown.

Runs in the vLLM venv (``make test-vllm``); about 30 s on 2 cores.
"""

from __future__ import annotations

import json
import os

import pytest

from tests.distributed.launch import run_python

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

LOGPROB_TOL = 1e-4  # fp32 on both sides, as in test_vllm_engine.py


def test_ddp_ranks_each_serve_the_trained_policy(tmp_path):
    out = tmp_path / "result"
    output = run_python(
        "-m", "tests.rollout.run_vllm_ddp", str(out), f"--trainer.default_root_dir={tmp_path}"
    )
    assert "Traceback" not in output, output[-3000:]
    ranks = [json.loads((tmp_path / f"result.rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(ranks):
        assert (result["rank"], result["world_size"]) == (rank, 2)
        assert result["rollout_step"] == 1
        assert result["last_sync_tensors"] == result["n_params"]  # the step was pushed
        assert result["tokens_equal"]
        assert result["max_log_prob_diff"] < LOGPROB_TOL
    # DDP kept the replicas identical, so both vLLM instances serve the same weights
    assert ranks[0]["weights_sum"] == ranks[1]["weights_sum"]
