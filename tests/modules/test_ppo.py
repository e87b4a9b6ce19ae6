import dataclasses

import lightning as L
import pytest
import torch

from lit_rlhf.models import load_tokenizer
from lit_rlhf.modules import PPOModule
from lit_rlhf.rollout import DecodeLoopEngine, HFGenerationEngine
from lit_rlhf.training import PPOUpdate
from tests.helpers import ConstantReward, merge_groups, prompt_loader, quiet_trainer

PROMPTS = [f"Using the numbers [{i}, {i + 3}]" for i in range(16)]


class DigitsReward:
    def __call__(self, prompts, completions, rows):
        from lit_rlhf.types import RewardOutput

        scores = [
            sum(c.isdigit() for c in x) / max(1, len(x.replace(" ", ""))) for x in completions
        ]
        return RewardOutput(torch.tensor(scores))


def make_module(tiny_model_dir, **kwargs):
    defaults = dict(
        reward=DigitsReward(),
        model=tiny_model_dir,
        tokenizer=load_tokenizer(tiny_model_dir),
        engine=HFGenerationEngine(max_new_tokens=8),
        optim={"lr": 1e-3, "micro_batch_size": 4},
    )
    settings = merge_groups(defaults, kwargs)
    advantage = settings.get("advantage")
    if isinstance(advantage, dict) and advantage.get("estimator") == "gae":  # a critic to train
        settings = merge_groups({"critic": {"lr": 1e-3}}, settings)
    return PPOModule(**settings)


trainer = quiet_trainer


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(advantage={"estimator": "grpo"}),
        dict(advantage={"estimator": "rloo"}, kl={"coef": 0.05, "placement": "loss"}),
        dict(
            advantage={"estimator": "gae"},
            critic={"kind": "separate"},
            kl={"coef": 0.05, "placement": "reward"},
        ),
        dict(
            advantage={"estimator": "gae"},
            critic={"kind": "value_head"},
            update={"ppo_epochs": 2, "mini_batch_size": 4},
        ),
        dict(
            advantage={"estimator": "grpo"},
            engine=DecodeLoopEngine(max_new_tokens=8),
            kl={"coef": 0.05},
        ),
    ],
    ids=["grpo", "rloo-kl-loss", "gae-critic-kl-reward", "gae-value-head", "decode-loop-engine"],
)
def test_every_trainable_parameter_changes(tiny_model_dir, tmp_path, kwargs):
    module = make_module(tiny_model_dir, **kwargs)
    module.configure_model()
    before = {n: p.detach().clone() for n, p in module.named_parameters() if p.requires_grad}
    trainer(tmp_path, limit_train_batches=2).fit(
        module, prompt_loader(module.tokenizer, PROMPTS, 4)
    )
    unchanged = [
        n for n, p in module.named_parameters() if n in before and torch.equal(p, before[n])
    ]
    assert not unchanged, unchanged
    if module.ref_policy is not None:  # the reference stays frozen
        assert not any(p.requires_grad for p in module.ref_policy.parameters())
    assert module.rollout_step == 2


def _gradients(module, experience, micro):
    optim = dataclasses.replace(module.optim, micro_batch_size=micro)
    settings = dataclasses.replace(module.settings, optim=optim)
    module.zero_grad()
    update = PPOUpdate(
        module.policy, settings, experience, temperature=1.0, kl_coef=0.0, critic=module.critic
    )
    for mb in update.micro_batches(torch.arange(len(experience))):
        update.loss(mb).backward()
    return {n: p.grad.clone() for n, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("loss_agg", ["token_mean", "seq_mean_token_mean"])
def test_micro_batch_accumulation_equals_one_pass(tiny_model_dir, loss_agg):
    # two PPO epochs: the rollout carries the engine's log-probs, which use_current_as_old=False
    # reads
    module = make_module(
        tiny_model_dir,
        advantage={"estimator": "gae"},
        loss={"loss_agg": loss_agg},
        update={"ppo_epochs": 2},
    )
    module.configure_model()
    module.trainer = L.Trainer(logger=False, enable_progress_bar=False)
    module.manual_backward = lambda loss: loss.backward()
    batch = next(iter(prompt_loader(module.tokenizer, PROMPTS[:4], 4)))
    torch.manual_seed(0)
    experience = module.prepare_update(module.collect_rollout(batch))
    full = _gradients(module, experience, micro=16)
    accumulated = _gradients(module, experience, micro=3)
    assert full.keys() == accumulated.keys()
    for name in full:
        torch.testing.assert_close(accumulated[name], full[name], atol=1e-6, rtol=1e-4)


def test_an_infinite_reward_is_a_clear_error(tiny_model_dir, tmp_path):
    module = make_module(tiny_model_dir, reward=ConstantReward(float("inf")))
    with pytest.raises(ValueError, match="returned inf at position 0; scores must be finite"):
        trainer(tmp_path, limit_train_batches=1).fit(
            module, prompt_loader(module.tokenizer, PROMPTS[:2], 2)
        )


def test_grpo_needs_several_samples(tiny_model_dir):
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        make_module(tiny_model_dir, rollout={"samples_per_prompt": 1})


def test_resume_continues_counters(tiny_model_dir, tmp_path):
    loader = prompt_loader(load_tokenizer(tiny_model_dir), PROMPTS, 4)
    first = make_module(tiny_model_dir, update={"ppo_epochs": 2}, kl={"coef": 0.1})
    t1 = trainer(tmp_path, limit_train_batches=2)
    t1.fit(first, loader)
    first.kl_coef = 0.37  # as if an adaptive controller had moved it
    ckpt = tmp_path / "a.ckpt"
    t1.save_checkpoint(ckpt)
    resumed = make_module(tiny_model_dir, update={"ppo_epochs": 2}, kl={"coef": 0.1})
    t2 = trainer(tmp_path, limit_train_batches=2, max_epochs=2)
    t2.fit(resumed, loader, ckpt_path=ckpt)
    saved = torch.load(ckpt, weights_only=False)["state_dict"]
    assert any(k.startswith("policy.") for k in saved)
    assert not any(k.startswith("ref_policy.") for k in saved)  # the frozen copy is not saved
    assert t1.global_step == 4  # 2 rollouts x 2 optimizer steps (ppo_epochs=2)
    assert t2.global_step == 8  # the second epoch continues the count
    assert resumed.rollout_step == 4
    assert resumed.kl_coef == pytest.approx(0.37)
    # the reference is the starting model again, the policy the trained one
    fresh = make_module(tiny_model_dir, kl={"coef": 0.1})
    fresh.configure_model()
    for name, value in fresh.ref_policy.state_dict().items():
        assert torch.equal(resumed.ref_policy.state_dict()[name], value), name
    pairs = zip(resumed.policy.parameters(), fresh.policy.parameters(), strict=True)
    assert not all(torch.equal(p, q) for p, q in pairs)
