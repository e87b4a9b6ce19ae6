"""FSDP2 (lit_rlhf.strategies.FSDP2Strategy: Lightning's ModelParallelStrategy, data-parallel
size = world size) on 2 CPU processes with gloo (``pytest -m distributed``; about 45 s on 2
cores). Each run is a subprocess (tests/distributed/run_ppo.py, or the CLI).

PPO with a separate critic and a frozen reference, 2 rollouts x 2 PPO epochs = 4 optimizer
steps: the 2-process weights must match a single process that sees the same rollouts (run_ppo.py
explains why they are the same), measured max |difference| 4.1e-6 while training moved every
weight tensor by at least 3.7e-3; ``ATOL`` = 1e-5 as for DeepSpeed (test_ppo_distributed.py).
The generative reward model (GRPO, same rollouts, one rollout x 2 epochs): 7.2e-6 (DDP gives the
same gap to one process, 9.2e-6 after 2 rollouts: AdamW's first steps magnify float summation
order in near-zero gradients; FSDP2 and DDP agree within 1.3e-6), moved by at least 2e-3.
The optimizer step under FSDP2 clips DTensor gradients (Lightning's clip_gradients and, with
``optim.clip_per_network``, torch's clip_grad_norm_ per network): run_ppo.py
``--clip-per-network`` matched one process within 4.1e-6 too.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.distributed.launch import fit_with_fragment, run_python
from tests.distributed.test_ppo_distributed import ATOL, assert_weights_close, run_ppo

pytestmark = pytest.mark.distributed


def test_fsdp2_two_processes_shard_the_policy_and_match_one(tiny_model_dir, tmp_path):
    single = run_ppo(tmp_path, "single", "plain", 1)
    run = run_ppo(tmp_path, "fsdp2", "fsdp2", 2)
    assert run["strategy"] == "FSDP2Strategy" and run["world_size"] == 2
    # every policy parameter is a DTensor, each rank holding half of its elements
    assert run["policy_all_dtensors"] and not single["policy_all_dtensors"]
    assert run["policy_elements"] == single["policy_elements"]
    assert run["policy_local_elements"] * 2 == run["policy_elements"]
    start, end = single["weights"]("init"), single["weights"]("epoch0")
    assert all(float((end[k] - start[k]).abs().max()) > 100 * ATOL for k in start)
    assert_weights_close(run["weights"]("epoch0"), end)
    # both ranks gather the same full weights
    assert_weights_close(run["weights"]("epoch0", 1), run["weights"]("epoch0"), atol=0.0)
    # the pre-clip norm of the sharded (DTensor) gradients = the single process's
    assert run["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-4)


def test_fsdp2_generative_reward_model_matches_one_process(tiny_model_dir, tmp_path):
    single = run_grm(tmp_path, "single", "plain", 1)
    run = run_grm(tmp_path, "fsdp2", "fsdp2", 2)
    assert run["policy_all_dtensors"] and run["policy_local_elements"] * 2 == run["policy_elements"]
    start, end = single["weights"]("init"), single["weights"]("epoch0")
    assert all(float((end[k] - start[k]).abs().max()) > 100 * ATOL for k in start)
    assert_weights_close(run["weights"]("epoch0"), end)
    assert run["grad_norms"] == pytest.approx(single["grad_norms"], rel=1e-4)


def run_grm(tmp: Path, name: str, kind: str, devices: int) -> dict[str, Any]:
    """One rollout of the generative reward model (GRPO, 2 epochs: 2 optimizer steps)."""
    out = tmp / f"grm_{name}.json"
    run_python(
        "-m", "tests.distributed.run_ppo", kind, str(devices), "1", str(out), "--module", "grm"
    )
    summary = json.loads(out.read_text())
    summary["weights"] = lambda tag, rank=0: torch.load(f"{out}.{tag}.rank{rank}.pt")
    return summary


def test_cpu_fsdp2_fragment_runs_on_two_processes(tiny_model_dir, tmp_path):
    # the tiny Countdown config with HF generate on the sharded policy (every rank decodes in
    # lock-step: synced_gpus), one training and one validation batch
    output = fit_with_fragment("cpu_fsdp2", tmp_path)
    assert "MEMBER: 2/2" in output and "`max_steps=1` reached" in output


@pytest.mark.slow
def test_fsdp2_checkpoint_resumes_like_one_uninterrupted_process(tiny_model_dir, tmp_path):
    # about 35 s: two 2-process runs and a single process over 2 epochs, clip_per_network on
    clip = "--clip-per-network"
    single = run_ppo(tmp_path, "single", "plain", 1, "--epochs", "2", clip)
    ckpt = tmp_path / "epoch0.ckpt"
    first = run_ppo(tmp_path, "first", "fsdp2", 2, clip, "--save-checkpoint", str(ckpt))
    assert sorted(p.name for p in ckpt.glob("*.distcp")) == ["__0_0.distcp", "__1_0.distcp"]
    resumed = run_ppo(tmp_path, "resumed", "fsdp2", 2, "--epochs", "2", clip, "--resume", str(ckpt))
    # the folder has no frozen reference (rebuilt from its source); weights come back exactly
    assert_weights_close(resumed["weights"]("init"), first["weights"]("epoch0"), atol=0.0)
    assert_weights_close(first["weights"]("epoch0"), single["weights"]("epoch0"))
    assert (resumed["global_step"], resumed["rollout_step"]) == (8, 4)
    # and AdamW's state: the second epoch ends where the uninterrupted run's does
    assert_weights_close(resumed["weights"]("epoch1"), single["weights"]("epoch1"))


@pytest.mark.slow
@pytest.mark.parametrize(
    "config",
    ["configs/sft/tiny.yaml", "configs/dpo/tiny.yaml", "configs/rm/bt_tiny.yaml",
     "configs/compressor/tiny.yaml", "configs/grm/rft_tiny.yaml",
     # LoRA (the peft-wrapped model its own unit: peft's generate bypasses the wrapper) and
     # TRE (the exploration callbacks read the policy's logits, not its parameters)
     "configs/ppo/countdown_lora_tiny.yaml", "configs/ppo/countdown_tre_tiny.yaml",
     "configs/ppo/multidomain_tiny.yaml"],  # MGS on gradient shards
)  # fmt: skip
def test_other_modules_run_under_the_cpu_fsdp2_fragment(config, tiny_model_dir, tmp_path):
    # about 15 s each: one training and one validation batch on 2 processes (runs only; the
    # weights are compared with one process for PPO and GRM above)
    output = fit_with_fragment("cpu_fsdp2", tmp_path, config=config)
    assert "MEMBER: 2/2" in output and "`max_steps=1` reached" in output
