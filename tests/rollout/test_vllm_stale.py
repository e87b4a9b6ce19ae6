"""One-step-off training with the vLLM engine: batch t + 1 is sampled in the worker thread by
vLLM serving the weights from before update t, while that update runs; the engine is synced once
per step, after the worker is done, and serves the trained policy at the end.

Runs in the vLLM venv: ``make test-vllm`` (``pytest -m vllm``, VLLM_ENABLE_V1_MULTIPROCESSING=0).
"""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch

from lit_rlhf.models import TinyModelSpec, load_tokenizer, write_tiny_model
from lit_rlhf.models.lora import served_parameters
from lit_rlhf.modules import PPOModule
from lit_rlhf.rewards import DigitFractionReward
from lit_rlhf.rollout import HFGenerationEngine, VLLMGenerationEngine
from tests.helpers import prompt_loader, quiet_trainer
from tests.modules.test_ppo_off_policy import LoggedMetrics, _fingerprint, _record_updates

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
pytest.importorskip("vllm")
pytestmark = pytest.mark.vllm

PROMPTS = [f"Using the numbers [{i}, {i + 3}], make {2 * i + 3}" for i in range(16)]


def _served(tensors) -> tuple[float, float]:
    flat = torch.cat([t.detach().double().flatten() for t in tensors])
    return float(flat.sum()), float(flat.square().sum())


class SpyVLLM(VLLMGenerationEngine):
    """Records per generate call: the thread, the time span and the weights vLLM serves (those
    of the last push, fingerprinted as it ends)."""

    calls: list
    served: tuple[float, float] | None = None

    def _push(self, model):
        super()._push(model)
        self.served = _served(t for _, t in served_parameters(model))

    def generate(self, model, input_ids, attention_mask, tokenizer, **kwargs):
        start = time.perf_counter()
        out = super().generate(model, input_ids, attention_mask, tokenizer, **kwargs)
        self.calls.append(
            dict(thread=threading.current_thread(), start=start, end=time.perf_counter(),
                 served=self.served)
        )  # fmt: skip
        return out


def test_vllm_one_step_off_samples_with_the_weights_before_the_update(tmp_path):
    spec = TinyModelSpec(hidden_size=128, num_heads=4, num_kv_heads=2, intermediate_size=256)
    write_tiny_model(tmp_path / "model", spec)  # head size 32: vLLM's minimum
    model_dir = str(tmp_path / "model")
    engine = SpyVLLM(
        max_new_tokens=16, enforce_eager=True, kv_cache_memory_bytes=64 << 20, max_model_len=256
    )
    engine.calls = []
    module = PPOModule(
        reward=DigitFractionReward(),
        model=model_dir,
        tokenizer=load_tokenizer(model_dir),
        engine=engine,
        rollout={"max_staleness": 1},
        update={"recompute_old_log_probs": True, "mini_batch_size": 8},
        optim={"micro_batch_size": 8, "lr": 1e-3},
    )
    updates, logged = _record_updates(module), LoggedMetrics()
    torch.manual_seed(0)
    loader = prompt_loader(module.tokenizer, PROMPTS, 4)
    try:
        run = quiet_trainer(tmp_path, limit_train_batches=4, callbacks=[logged])
        run.fit(module, loader)
        gens = engine.calls
        assert len(gens) == 4 and len(updates) == 3 and run.global_step == 6  # 2 steps each
        for t, update in enumerate(updates):
            nxt = gens[t + 1]  # batch t + 1: served the weights before update t, beside it
            assert nxt["served"] == update["weights"]
            assert nxt["thread"] is not threading.main_thread()
            assert nxt["start"] < update["end"] and nxt["end"] > update["start"]
        assert logged.steps[-1]["rollout/staleness"] == 1.0
        assert module.rl.mismatch == "tis"
        # after the run vLLM serves the trained weights (synced once the worker was done)
        assert engine.served == _fingerprint(module.policy)
        batch = module.tokenizer(PROMPTS[:4], return_tensors="pt", padding=True)
        hf = HFGenerationEngine(max_new_tokens=16)
        ref = hf.generate(module.policy, batch.input_ids, batch.attention_mask, module.tokenizer,
                          greedy=True)  # fmt: skip
        out = engine.generate(module.policy, batch.input_ids, batch.attention_mask,
                              module.tokenizer, greedy=True)  # fmt: skip
        assert torch.equal(out.response_ids, ref.response_ids)
    finally:
        engine.close()
