"""LoRA for the RL modules (PPOModule, GenerativeRewardModule): checkpoints hold the adapters
only, the KL's reference is the base model (the adapters switched off, no second model), an
interrupted run resumes exactly, the merged weights an engine serves, and QLoRA's refusal on a
machine without CUDA / bitsandbytes."""

from __future__ import annotations

import lightning as L
import pytest
import torch

from lit_rlhf.data import CountdownPrompts, PromptDataModule
from lit_rlhf.models import load_causal_lm
from lit_rlhf.models.lora import (
    check_quantize_supported,
    lora_wrap,
    merged_copy,
    served_parameters,
)
from lit_rlhf.modules import GenerativeRewardModule, PPOModule
from lit_rlhf.rewards import DigitFractionReward
from lit_rlhf.rollout import HFGenerationEngine
from lit_rlhf.settings import LoRASettings
from tests.helpers import merge_groups, quiet_trainer
from tests.modules.test_grm import ScriptedJudgeEngine
from tests.modules.test_grm import data as judge_data

LORA = {"lora": {"rank": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}}


def ppo(model_dir, **kwargs):
    settings = dict(
        reward=DigitFractionReward(),
        model=model_dir,
        engine=HFGenerationEngine(max_new_tokens=6),
        rollout={"samples_per_prompt": 2},
        optim={"lr": 1e-2},
        kl={"coef": 0.1},
        **LORA,
    )
    return PPOModule(**merge_groups(settings, kwargs))


def countdown(model_dir):
    return PromptDataModule(
        tokenizer=model_dir,
        train=CountdownPrompts(num_examples=8, seed=0),
        batch_size=2,
        use_chat_template=False,
    )


class SaveAt(L.Callback):
    def __init__(self, path, step):
        self.path, self.step = path, step

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        if trainer.global_step == self.step:
            trainer.save_checkpoint(self.path)


def fit(model_dir, root, *, callbacks=(), ckpt_path=None, **kwargs):
    torch.manual_seed(0)
    data = countdown(model_dir)
    module = ppo(model_dir, tokenizer=data.tokenizer, **kwargs)
    trainer = quiet_trainer(root, max_epochs=1, callbacks=list(callbacks))
    trainer.fit(module, datamodule=data, ckpt_path=ckpt_path)
    return trainer, module


def adapters(module):
    return {n: p.detach().clone() for n, p in module.policy.named_parameters() if p.requires_grad}


def test_ppo_checkpoint_holds_the_adapters_and_the_reference_is_the_base(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "lora.ckpt"
    trainer, module = fit(tiny_model_dir, tmp_path, callbacks=[SaveAt(ckpt, 4)])
    assert trainer.global_step == 4 and module.ref_policy is None  # no second model loaded
    saved = torch.load(ckpt, weights_only=False)["state_dict"]
    assert saved and all(".lora_" in key for key in saved), sorted(saved)[:4]
    assert set(saved) == {f"policy.{n}" for n in adapters(module)}
    assert "rollout/kl" in trainer.callback_metrics  # the KL to the reference was computed
    # several updates later the adapters moved the policy, and the reference is still the base
    base = load_causal_lm(tiny_model_dir).eval()
    ids = torch.randint(3, 100, (2, 7))
    policy, context = module.rl.reference(module)
    assert policy is module.policy
    module.policy.eval()
    with torch.no_grad(), context():
        reference = module.policy(input_ids=ids).logits
    with torch.no_grad():
        trained = module.policy(input_ids=ids).logits
        torch.testing.assert_close(reference, base(input_ids=ids).logits)
    assert not torch.allclose(trained, reference)


def test_ppo_lora_resumes_exactly(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "mid.ckpt"
    _, straight = fit(tiny_model_dir, tmp_path / "a", callbacks=[SaveAt(ckpt, 2)])
    trainer, resumed = fit(tiny_model_dir, tmp_path / "b", ckpt_path=ckpt)
    assert trainer.global_step == 4 and resumed.rollout_step == 4
    want, got = adapters(straight), adapters(resumed)
    assert want.keys() == got.keys() and want
    for name, value in want.items():
        torch.testing.assert_close(got[name], value, rtol=0, atol=0, msg=name)
    # strict loading of the adapter-only checkpoint outside fit as well
    loaded = PPOModule.load_from_checkpoint(ckpt, reward=DigitFractionReward())
    assert set(adapters(loaded)) == set(want)


def test_a_value_head_is_saved_with_the_adapters(tiny_model_dir, tmp_path):
    ckpt = tmp_path / "gae.ckpt"
    fit(tiny_model_dir, tmp_path, callbacks=[SaveAt(ckpt, 1)], advantage={"estimator": "gae"},
        critic={"kind": "value_head"}, rollout={"samples_per_prompt": 1})  # fmt: skip
    saved = torch.load(ckpt, weights_only=False)["state_dict"]
    critic = {k for k in saved if k.startswith("critic.")}
    assert critic and all(".lora_" in k for k in saved.keys() - critic)


def lora_judge():
    return GenerativeRewardModule(
        model="builtin:tiny-llama", engine=ScriptedJudgeEngine(), rollout={"samples_per_prompt": 4},
        optim={"lr": 1e-2}, kl={"coef": 0.05}, **LORA,
    )  # fmt: skip


def test_the_judge_checkpoint_holds_the_adapters_only(tmp_path):
    module = lora_judge()
    trainer = quiet_trainer(tmp_path, limit_train_batches=2, limit_val_batches=0)
    trainer.fit(module, datamodule=judge_data())
    assert module.rollout_step == 2 and module.ref_policy is None
    ckpt = tmp_path / "judge.ckpt"
    trainer.save_checkpoint(ckpt)
    saved = torch.load(ckpt, weights_only=False)["state_dict"]
    assert saved and all(".lora_" in key for key in saved)
    lora_b = [p for n, p in module.policy.named_parameters() if "lora_B" in n]
    assert any(p.abs().sum() > 0 for p in lora_b)  # the adapters trained (B starts at zero)
    # the resume path puts the base back: strict loading passes
    resumed = lora_judge()
    again = quiet_trainer(tmp_path, limit_train_batches=2, limit_val_batches=0, max_epochs=2)
    again.fit(resumed, datamodule=judge_data(), ckpt_path=ckpt)
    assert resumed.rollout_step == 4


def test_the_served_weights_are_the_merged_model(tiny_model_dir):
    wrapped = lora_wrap(load_causal_lm(tiny_model_dir), LoRASettings(rank=4, alpha=8))
    with torch.no_grad():  # B starts at zero: give the adapters a non-zero delta
        for name, param in wrapped.named_parameters():
            if "lora_B" in name:
                param.normal_(std=0.1)
    merged = dict(merged_copy(wrapped).named_parameters())
    served = dict(served_parameters(wrapped))
    assert served.keys() == merged.keys()
    for name, value in merged.items():
        torch.testing.assert_close(served[name], value, msg=name)
    plain = load_causal_lm(tiny_model_dir)
    assert [n for n, _ in served_parameters(plain)] == [n for n, _ in plain.named_parameters()]


def test_quantize_needs_adapters_and_is_refused_without_cuda(tmp_path):
    with pytest.raises(ValueError, match=r"lora.quantize='4bit'.*Fix: set lora.rank > 0"):
        PPOModule(reward=DigitFractionReward(), model="no/such-model", lora={"quantize": "4bit"})
    with pytest.raises(ValueError, match="quantize='4bit'"):
        GenerativeRewardModule(model="no/such-model", lora={"quantize": "4bit"})
    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without CUDA")
    with pytest.raises(RuntimeError, match=r"needs a CUDA GPU.*Fix:.*quantize: null"):
        check_quantize_supported("4bit")
    # refused at setup, before the (missing) model would load
    module = PPOModule(
        reward=DigitFractionReward(), model="no/such-model",
        lora={**LORA["lora"], "quantize": "4bit"},
    )  # fmt: skip
    with pytest.raises(RuntimeError, match="needs a CUDA GPU"):
        quiet_trainer(tmp_path).fit(module, datamodule=countdown("builtin:tiny-llama"))


def test_reference_dtype_under_lora_is_refused():
    """Under LoRA the reference is the policy with its adapters off: a reference dtype would
    change nothing, so it is refused when the module is built (before any model loads)."""
    with pytest.raises(ValueError, match=r"reference_dtype='bfloat16' with lora.rank > 0"):
        PPOModule(
            reward=DigitFractionReward(), model="no/such-model", kl={"coef": 0.1},
            precision={"reference_dtype": "bfloat16"}, **LORA,
        )  # fmt: skip
    with pytest.raises(ValueError, match=r"reference_dtype='bfloat16' with lora.rank > 0"):
        GenerativeRewardModule(
            model="no/such-model", precision={"reference_dtype": "bfloat16"}, **LORA
        )
    # without LoRA a separate reference is loaded (with a KL), which may take the dtype
    PPOModule(
        reward=DigitFractionReward(),
        model="no/such-model",
        kl={"coef": 0.1},
        precision={"reference_dtype": "bfloat16"},
    )
    with pytest.raises(ValueError, match="PPOModule has no frozen reference"):  # no KL: none
        PPOModule(
            reward=DigitFractionReward(),
            model="no/such-model",
            precision={"reference_dtype": "bfloat16"},
        )
