"""``python -m lit_rlhf.measure``: a preset's update on synthetic rollouts and random weights,
run as a user runs it (a subprocess writing its JSON), on CPU at tiny shapes."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest

from lit_rlhf.measure.update import compose, measured_config, shapes
from lit_rlhf.plan.architectures import architecture
from lit_rlhf.plan.flops import step_flops

ROOT = Path(__file__).resolve().parents[2]


def test_measure_writes_the_json_with_mfu_from_a_given_peak(tmp_path: Path) -> None:
    peak = 1e12
    fragment = tmp_path / "peak.yaml"
    fragment.write_text(f"model:\n  init_args:\n    update: {{device_peak_flops: {peak}}}\n")
    out = tmp_path / "m.json"
    args = ["--config", "configs/ppo/countdown_tiny.yaml", "--config", str(fragment)]
    run = subprocess.run(
        [sys.executable, "-m", "lit_rlhf.measure", *args, "--out", str(out),
         "--max-prompt", "32", "--max-response", "8"],
        cwd=ROOT, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    record = json.loads(out.read_text())
    s = record["shapes"]
    assert s["model"] == "builtin:tiny-llama" and s["module"] == "lit_rlhf.modules.PPOModule"
    # two micro-batches of 8 sequences: 4 prompts x 4 samples, lengths capped
    assert (s["sequences"], s["micro_batch_size"], s["prompt_len"], s["response_len"]) == (
        16, 8, 32, 8,
    )  # fmt: skip
    assert [c["phase"] for c in record["calls"]] == ["prepare", "optimize"] * 2
    measured = record["measured"]
    assert measured["updates_timed"] == 1 and measured["update_s"] > 0
    assert measured["update_peak_bytes"] is None  # CPU: no CUDA allocator statistics
    tokens, responses = 16 * 40, 16 * 8  # every synthetic response runs to full length
    flops = step_flops(
        architecture("builtin:tiny-llama"), tokens=tokens, seq_len=40, trainable=True,
        logit_tokens=responses,
    )  # fmt: skip
    assert measured["tokens_per_s"] == pytest.approx(tokens / record["calls"][-1]["seconds"],
                                                     rel=0.05)  # fmt: skip
    assert measured["mfu"] / measured["tokens_per_s"] == pytest.approx(
        flops / tokens / peak, rel=1e-5
    )
    plan = record["predicted"]
    assert plan["update_bytes"] > 0 and plan["plan"]["world"] == 1  # this one device
    assert plan["update_bytes"] <= plan["plan"]["peaks"]["update"]
    assert any("vLLM" in line for line in record["unmeasured"])
    assert "error" not in record and record["device_peak_flops"] == peak


def test_a_gpu_preset_is_measured_at_its_own_shapes() -> None:
    opts = argparse.Namespace(sequences=None, max_prompt=256, max_response=None, layers=4)
    config = measured_config(compose(["configs/ppo/countdown_tre.yaml"]), opts)
    s = shapes(config, opts.layers)
    assert s["model"] == "Qwen/Qwen2.5-1.5B-Instruct" and s["layers"] == 4
    assert (s["micro_batch_size"], s["sequences"]) == (16, 32)  # two micro-batches, 4 groups
    assert (s["prompt_len"], s["response_len"]) == (256, 512)  # the prompt capped
    assert s["gradient_checkpointing"] and s["critic"] == "separate" and not s["reference"]
    assert s["trainer_precision"] == "bf16-mixed"
    assert config["trainer"]["devices"] == 1
    update = config["model"]["init_args"]["update"]
    assert update["mini_batch_size"] == 32  # one optimizer step per rollout


def test_random_weights_build_a_hub_architecture_without_a_download() -> None:
    import torch
    from transformers import AutoConfig, AutoModel, AutoModelForCausalLM

    from lit_rlhf.measure.synthetic import random_weights

    saved = AutoModelForCausalLM.from_pretrained
    with random_weights(torch.device("meta"), 2):  # meta: shapes only, nothing allocated
        policy = AutoModelForCausalLM.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct",
                                                      dtype=torch.bfloat16)  # fmt: skip
        trunk = AutoModel.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct", dtype=torch.float32)
        config = AutoConfig.from_pretrained("Qwen/Qwen2.5-1.5B-Instruct")
    assert type(policy).__name__ == "Qwen2ForCausalLM" and type(trunk).__name__ == "Qwen2Model"
    assert policy.config.num_hidden_layers == 2 and policy.config.hidden_size == 1536
    assert policy.lm_head.weight.shape == (151936, 1536)
    assert policy.lm_head.weight.dtype == torch.bfloat16 and policy.lm_head.weight.is_meta
    assert next(trunk.parameters()).dtype == torch.float32
    assert config.num_hidden_layers == 2
    assert AutoModelForCausalLM.from_pretrained == saved  # restored on exit
