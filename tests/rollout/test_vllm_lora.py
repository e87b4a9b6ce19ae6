"""vLLM serves a LoRA policy merged: after optimizer steps on the adapters only, the synced
engine's greedy tokens equal the HF engine's on the peft model.

Runs in the vLLM venv: ``make test-vllm`` (``pytest -m vllm``, VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""

from __future__ import annotations

import os

import pytest
import torch

from lit_rlhf.models import TinyModelSpec, load_causal_lm, load_tokenizer, write_tiny_model
from lit_rlhf.models.lora import lora_wrap
from lit_rlhf.rollout import HFGenerationEngine, VLLMGenerationEngine
from lit_rlhf.settings import LoRASettings

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm")
pytest.importorskip("peft")
pytestmark = pytest.mark.vllm

MAX_NEW = 10
PROMPTS = ["hello there", "Using the numbers [1, 2]", "The quick brown fox", "What is 15 + 27?"]


def test_a_lora_update_is_served_merged(tmp_path):
    spec = TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    write_tiny_model(tmp_path, spec)  # head size 32: vLLM's minimum
    tokenizer = load_tokenizer(str(tmp_path))
    policy = lora_wrap(load_causal_lm(str(tmp_path)), LoRASettings(rank=8, alpha=16))
    batch = tokenizer(PROMPTS, return_tensors="pt", padding=True)
    engine = VLLMGenerationEngine(
        max_new_tokens=MAX_NEW, enforce_eager=True, kv_cache_memory_bytes=64 << 20,
        max_model_len=256, push_bucket_bytes=1 << 20,  # blocks of ~580 KiB: several calls
    )  # fmt: skip
    hf = HFGenerationEngine(max_new_tokens=MAX_NEW)
    try:
        before = engine.generate(
            policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True
        )
        trainable = [p for p in policy.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(trainable, lr=5.0)
        for _ in range(3):  # B starts at zero: the second step moves A as well
            loss = policy(**batch, labels=batch.input_ids).loss
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
            engine.sync_weights(policy)
        ref = hf.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
        out = engine.generate(policy, batch.input_ids, batch.attention_mask, tokenizer, greedy=True)
        lora_b = [p for n, p in policy.named_parameters() if "lora_B" in n]
        assert all(p.abs().sum() > 0 for p in lora_b)  # the merged weights differ from the base
        assert before.response_ids.shape[0] == len(PROMPTS)
        assert torch.equal(out.response_ids, ref.response_ids)
        # only the blocks with adapters changed: the 9 tensors of each of the 2 decoder blocks,
        # found against the served weights' copy in host memory
        assert (engine.last_sync_tensors, engine.last_sync_buckets) == (18, 2)
        assert {t.device.type for t in engine.snapshot.tensors.values()} == {"cpu"}
    finally:
        engine.close()
