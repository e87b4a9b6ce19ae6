"""The vLLM engine under DDP, DeepSpeed ZeRO-3 and FSDP2 with tensor parallelism 2 on 2 CPU
processes: each rank runs its own colocated vLLM instance (under TP 2 both ranks are one engine),
pushes every optimizer step into it (under ZeRO-3 and FSDP2 in buckets, each gathered once by
both ranks), and after training serves exactly the trained (and identical) policy, each rank its
own prompts' samples; the run ends without errors from vLLM's or torch.distributed's shutdown.

Runs in the vLLM venv (``make test-vllm``); about 45 s (DDP) and 35 s (ZeRO-3) on 2 cores.
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


@pytest.mark.parametrize(
    "extra",
    [
        pytest.param([], id="ddp"),
        # ZeRO-3: every push gathers bucket by bucket on both ranks; 6 MiB buckets (the
        # embedding is 2 MiB, a decoder block 2.5 MiB) make it 3 calls of 2 blocks each
        pytest.param(
            ["--config", "configs/trainer/cpu_deepspeed_zero3.yaml",
             "--model.init_args.engine.init_args.push_bucket_bytes=6291456"],
            id="zero3",
        ),
        # FSDP2 with both ranks as one tensor-parallel vLLM engine (external launcher): each
        # rank holds half of vLLM's weights, generates the union of both ranks' prompts and
        # keeps its own; the push gathers the DTensor shards bucket by bucket
        pytest.param(
            ["--config", "configs/trainer/cpu_fsdp2.yaml",
             "--model.init_args.engine.init_args.tensor_parallel_size=2"],
            id="fsdp2-tp2",
        ),
    ],
)  # fmt: skip
def test_ranks_each_serve_the_trained_policy(tmp_path, extra):
    if extra:
        pytest.importorskip("deepspeed")
    out = tmp_path / "result"
    output = run_python(
        "-m", "tests.rollout.run_vllm_ddp", str(out), f"--trainer.default_root_dir={tmp_path}",
        *extra, timeout=600,
    )  # fmt: skip
    assert "Traceback" not in output, output[-3000:]
    ranks = [json.loads((tmp_path / f"result.rank{r}.json").read_text()) for r in (0, 1)]
    for rank, result in enumerate(ranks):
        assert (result["rank"], result["world_size"]) == (rank, 2)
        zero3, tp2 = "zero3" in str(extra), "fsdp2" in str(extra)
        assert (result["partitioned"], result["sharded"]) == (zero3, tp2)
        assert result["tensor_parallel_size"] == (2 if tp2 else 1)
        assert result["responses"] == result["prompts"] == (3 if rank == 0 else 1)
        assert result["rollout_step"] == 1
        assert result["last_sync_tensors"] == result["n_params"]  # the step was pushed
        assert result["last_sync_buckets"] == (3 if zero3 else 1)
        assert result["tokens_equal"]
        assert result["max_log_prob_diff"] < LOGPROB_TOL
    # the replicas are identical (DDP) / gathered whole (ZeRO-3): both serve the same weights
    assert ranks[0]["weights_sum"] == ranks[1]["weights_sum"]
