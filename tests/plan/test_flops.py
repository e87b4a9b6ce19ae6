"""Step FLOPs, the device peak table and the ``perf/mfu`` an RL update logs."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import PPOModule
from lit_rlhf.plan.flops import device_peak_flops, matmul_weights, step_flops
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.settings import UpdateSettings
from tests.helpers import ConstantReward, prompt_loader, quiet_trainer

# 2 layers, hidden 64, 4 heads of 16, 2 KV heads, MLP 96, vocabulary 300, untied
SHAPE = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             intermediate_size=96, vocab_size=300, tie_word_embeddings=False)  # fmt: skip


def test_step_flops_by_hand() -> None:
    config = LlamaConfig(**SHAPE)
    # per layer: q and o 64x64 each, k and v 64x32 each, gate / up / down 64x96 each
    per_layer = 2 * 64 * 64 + 2 * 64 * 32 + 3 * 64 * 96
    assert matmul_weights(config) == 2 * per_layer + 64 * 300
    assert matmul_weights(config, lm_head=False) == 2 * per_layer
    forward = 2 * 2 * per_layer * 10 + 2 * 64 * 300 * 4 + 4 * 2 * 4 * 16 * 7 * 10
    assert step_flops(config, tokens=10, seq_len=7, trainable=False, logit_tokens=4) == forward
    assert step_flops(config, tokens=10, seq_len=7, trainable=True, logit_tokens=4) == 3 * forward
    trunk = 2 * 2 * per_layer * 10 + 4 * 2 * 4 * 16 * 7 * 10
    assert step_flops(config, tokens=10, seq_len=7, trainable=False, lm_head=False) == trunk


def test_matmul_weights_are_the_parameters_less_embedding_and_norms() -> None:
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    params = sum(p.numel() for p in model.parameters())
    norms = (2 * SHAPE["num_hidden_layers"] + 1) * SHAPE["hidden_size"]
    embedding = SHAPE["vocab_size"] * SHAPE["hidden_size"]
    assert matmul_weights(model.config) == params - embedding - norms


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 989e12),
        ("NVIDIA H100 PCIe", 756e12),
        ("NVIDIA H200", 989e12),
        ("NVIDIA A100-SXM4-80GB", 312e12),
        ("NVIDIA A100 80GB PCIe", 312e12),
        ("NVIDIA L40S", 362e12),
        ("NVIDIA L4", 121e12),
        ("NVIDIA A10G", None),  # not the A10: unlisted
        ("NVIDIA GeForce RTX 4090", None),
        (None, None),  # a CPU
    ],
)
def test_device_peak_table(name: str | None, peak: float | None) -> None:
    assert device_peak_flops(name) == peak
    assert device_peak_flops(name, 5e12) == 5e12  # the setting wins


def test_device_peak_setting_is_validated() -> None:
    with pytest.raises(ValueError, match=r"device_peak_flops.*Fix"):
        UpdateSettings(device_peak_flops=-1.0)


def _run(tmp_path, tiny_model_dir, update: dict) -> tuple[PPOModule, dict, list]:
    seen: list = []
    module = PPOModule(
        reward=ConstantReward(1.0),
        model=tiny_model_dir,
        tokenizer=load_tokenizer(tiny_model_dir),
        engine=HFGenerationEngine(max_new_tokens=6),
        optim={"lr": 1e-3, "micro_batch_size": 4},
        advantage={"estimator": "gae"},
        critic={"kind": "separate", "lr": 1e-3},
        update=update,
    )
    log_step = module.log_step

    def recording(experience, stats):  # the rollout the update trained on
        seen.append(experience.rollout)
        return log_step(experience, stats)

    module.log_step = recording  # type: ignore[method-assign]
    prompts = [f"Using the numbers [{i}, {i + 3}]" for i in range(4)]
    quiet_trainer(tmp_path, limit_train_batches=1).fit(
        module, prompt_loader(module.tokenizer, prompts, 4)
    )
    return module, dict(module.trainer.callback_metrics), seen


def test_mfu_is_logged_with_a_given_peak_and_equals_the_formula(tmp_path, tiny_model_dir) -> None:
    peak = 1e9
    update = {"ppo_epochs": 2, "mini_batch_size": 4, "device_peak_flops": peak}
    module, metrics, seen = _run(tmp_path, tiny_model_dir, update)
    (rollout,) = seen
    tokens, responses = int(rollout.attention_mask.sum()), int(rollout.response_mask.sum())
    seq_len = tokens // len(rollout)
    flops = step_flops(
        module.policy.config, tokens=tokens, seq_len=seq_len, trainable=True, logit_tokens=responses
    ) + step_flops(
        module.critic.trunk.config, tokens=tokens, seq_len=seq_len, trainable=True, lm_head=False
    )
    rate, mfu = float(metrics["perf/tokens_per_s"]), float(metrics["perf/mfu"])
    assert rate > 0 and mfu > 0
    # tokens/s = 2 passes * tokens / t and MFU = 2 passes * flops / t / peak: their ratio is
    # the FLOPs per token over the peak, whatever t was
    assert mfu / rate == pytest.approx(flops / tokens / peak, rel=1e-5)


def test_no_mfu_on_a_cpu_without_a_peak(tmp_path, tiny_model_dir) -> None:
    _, metrics, _ = _run(tmp_path, tiny_model_dir, {})
    assert "perf/mfu" not in metrics and float(metrics["perf/tokens_per_s"]) > 0
    assert torch.isfinite(metrics["perf/tokens_per_s"])
