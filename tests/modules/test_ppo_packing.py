"""Packing (``micro_batch_tokens``): the same losses, gradients and experience as the padded path.

The padded path cuts micro-batches of ``micro_batch_size`` rows and runs padded forwards; the
packed path cuts token-budget micro-batches of whole groups and runs padding-free forwards with
chunked log-probs. Accumulated over a mini-batch both must give the same loss and gradients.
"""

from __future__ import annotations

from functools import partial
from types import SimpleNamespace

import lightning as L
import pytest
import torch

from lit_rlhf.callbacks import ForkingTokens, KLCov
from lit_rlhf.training import PPOUpdate, build_experience
from lit_rlhf.training import ppo_update as ppo_update_module
from lit_rlhf.training.protocols import loss_terms_read_logits, policy_loss_terms
from lit_rlhf.types import Rollout
from tests.helpers import prompt_loader, replace_groups
from tests.modules.test_ppo import PROMPTS, make_module

TOL = 1e-5
BUDGET = 40  # tokens: prompts here are ~10-14 tokens, responses 1..8


def _ragged(rollout: Rollout) -> Rollout:
    """The rollout with responses cut to lengths 1..R (a long tail of lengths, fixed seed)."""
    gen = torch.Generator().manual_seed(3)
    r = rollout.response_mask.shape[1]
    lengths = torch.randint(1, r + 1, (len(rollout),), generator=gen)
    mask = torch.arange(r)[None] < lengths[:, None]
    return Rollout(**{**rollout.__dict__, "response_mask": mask & rollout.response_mask.bool()})


def _setup(tiny_model_dir, **kwargs):
    torch.manual_seed(0)
    module = make_module(tiny_model_dir, **kwargs)
    module.configure_model()
    module.trainer = L.Trainer(logger=False, enable_progress_bar=False)
    batch = next(iter(prompt_loader(module.tokenizer, PROMPTS[:4], 4)))
    rollout = _ragged(module.collect_rollout(batch))
    return module, rollout, module.prepare_update(rollout)


def _update(module, experience, settings, trainer=None, **kw):
    terms = {} if trainer is None else {"loss_terms": partial(policy_loss_terms, trainer, module)}
    update = PPOUpdate(
        module.policy, settings, experience, temperature=1.0, kl_coef=module.kl_coef,
        critic=module.critic, **terms, **kw,
    )  # fmt: skip
    update.read_logits = loss_terms_read_logits(trainer)
    return update


def _loss_and_grads(module, update, index, **micro_kw):
    module.zero_grad()
    micro = update.micro_batches(index, **micro_kw)
    total = torch.zeros(())
    for mb in micro:
        loss = update.loss(mb)
        loss.backward()
        total = total + loss.detach()
    nets = [module.policy] + ([module.critic] if module.critic is not None else [])
    grads = {
        f"{i}.{n}": p.grad.clone()
        for i, net in enumerate(nets)
        for n, p in net.named_parameters()
        if p.grad is not None
    }
    return total, grads, micro


def _compare(module, experience, trainer=None, budget=BUDGET, padded_size=3, **kw):
    settings = replace_groups(module.settings, optim={"micro_batch_size": padded_size})
    packed_settings = replace_groups(settings, update={"micro_batch_tokens": budget})
    index = torch.arange(len(experience))
    loss_a, grads_a, _ = _loss_and_grads(
        module, _update(module, experience, settings, trainer, **kw), index
    )
    loss_b, grads_b, micro = _loss_and_grads(
        module, _update(module, experience, packed_settings, trainer, **kw), index
    )
    assert torch.allclose(loss_a, loss_b, atol=TOL), (loss_a, loss_b)
    assert grads_a.keys() == grads_b.keys() and grads_a
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=TOL), name
    return micro


CONFIGS = {
    "grpo-token_mean": {},
    "grpo-seq_mean": {"loss": {"loss_agg": "seq_mean_token_mean"}},
    "grpo-kl_in_loss": {"kl": {"coef": 0.1, "estimator": "k3"}},
    "gspo": {"loss": {"policy_loss": "gspo", "loss_agg": "seq_mean_token_mean"}},
    "ppo-value_head": {"advantage": {"estimator": "gae"}, "critic": {"kind": "value_head"}},
    "ppo-separate_critic": {"advantage": {"estimator": "gae"}, "critic": {"kind": "separate"}},
    # LoRA: the chunked head is the peft model's output embedding; the reference = adapters off
    "grpo-lora-kl": {"lora": {"rank": 4, "alpha": 8}, "kl": {"coef": 0.1}},
}


@pytest.mark.parametrize("kwargs", list(CONFIGS.values()), ids=list(CONFIGS))
def test_packed_loss_and_gradients_equal_the_padded_ones(tiny_model_dir, kwargs):
    module, _, experience = _setup(tiny_model_dir, **kwargs)
    micro = _compare(module, experience)
    assert len(micro) > 1  # the budget really splits the mini-batch


def test_packed_experience_equals_the_padded_one(tiny_model_dir):
    module, rollout, _ = _setup(
        tiny_model_dir,
        kl={"coef": 0.1},
        advantage={"estimator": "gae"},
        update={"recompute_old_log_probs": True},
    )
    settings = module.settings
    kw = dict(
        policy=module.policy, temperature=0.7, kl_coef=0.1, critic=module.critic,
        ref_policy=module.ref_policy,
    )  # fmt: skip
    padded = build_experience(rollout, settings=settings, **kw)
    packed = build_experience(
        rollout, settings=replace_groups(settings, update={"micro_batch_tokens": BUDGET}), **kw
    )
    mask = rollout.response_mask
    for name in ("old_log_probs", "ref_log_probs", "advantages"):
        a, b = getattr(padded, name), getattr(packed, name)
        assert torch.allclose(a * mask, b * mask, atol=TOL), name
    assert padded.critic is not None and packed.critic is not None
    assert torch.allclose(padded.critic.values * mask, packed.critic.values * mask, atol=TOL)


class _Recorder:
    """A loss-term callback that records what it is given and adds nothing."""

    def __init__(self) -> None:
        self.seen: list[tuple[tuple[int, ...], ...]] = []

    def policy_loss_term(self, trainer, pl_module, ctx):
        entropy, _ = ctx.full_vocab_stats()
        shapes = (ctx.logits.shape, ctx.log_probs.shape, ctx.mask.shape, entropy.shape)
        self.seen.append(tuple(tuple(s) for s in shapes))
        return torch.zeros_like(ctx.per_token_loss), {}


def test_loss_terms_see_per_sequence_shapes_and_logits_when_they_may_read_them(tiny_model_dir):
    module, _, experience = _setup(tiny_model_dir)
    recorder = _Recorder()
    trainer = SimpleNamespace(callbacks=[recorder])
    micro = _compare(module, experience, trainer=trainer)
    packed_seen = recorder.seen[-len(micro) :]
    vocab = module.policy.config.vocab_size
    for mb, (logits, log_probs, mask, entropy) in zip(micro, packed_seen, strict=True):
        b = len(mb.rows)
        assert logits[0] == b and logits[2] == vocab and log_probs[0] == b
        assert log_probs == mask == entropy == logits[:2]


@pytest.mark.parametrize(
    "callback",
    [ForkingTokens(top_fraction=0.3), KLCov(top_fraction=0.2)],
    ids=["forking_tokens", "kl_cov"],
)
def test_token_ranking_callbacks_rank_the_same_tokens_packed(tiny_model_dir, callback):
    """ForkingTokens / KL-Cov rank the micro-batch's tokens in the [b, R] layout, as unpacked;
    with the same rows in one micro-batch the packed loss equals the padded one, and no [b, R, V]
    logits are built for them (``reads_logits = False``)."""
    module, _, experience = _setup(tiny_model_dir)
    trainer = SimpleNamespace(callbacks=[callback])
    assert not loss_terms_read_logits(trainer)
    micro = _compare(module, experience, trainer=trainer, budget=10_000, padded_size=16)
    assert len(micro) == 1


def test_mgs_micro_batches_stay_single_task_and_within_budget(tiny_model_dir):
    module, rollout, experience = _setup(tiny_model_dir)
    tasks = ["math" if g % 2 else "code" for g in rollout.group_ids.tolist()]
    experience.rollout.tasks = tasks
    settings = replace_groups(module.settings, update={"micro_batch_tokens": BUDGET})
    update = _update(module, experience, settings)
    micro = update.micro_batches(torch.arange(len(experience)), by_task=True)
    tokens = rollout.prompt_mask.sum(1) + rollout.response_mask.sum(1)
    seen = torch.cat([mb.rows for mb in micro])
    assert sorted(seen.tolist()) == list(range(len(experience)))
    for mb in micro:
        assert {tasks[i] for i in mb.rows.tolist()} == {mb.task}
        assert int(tokens[mb.rows].sum()) <= BUDGET or len(mb.rows) == 1


def test_padding_micro_batches_even_out_the_count_with_zero_weight(tiny_model_dir, monkeypatch):
    """Under DDP / ZeRO-3 a rank with fewer micro-batches runs zero-weight repeats of one row
    (the count is agreed with an all-reduce MAX, here faked as 'two more')."""
    module, _, experience = _setup(tiny_model_dir)
    settings = replace_groups(module.settings, update={"micro_batch_tokens": BUDGET})
    plain = _update(module, experience, settings)
    index = torch.arange(len(experience))
    loss_a, grads_a, micro_a = _loss_and_grads(module, plain, index)
    monkeypatch.setattr(ppo_update_module, "agree_max", lambda n, device="cpu": n + 2)
    padded = _update(module, experience, settings)
    loss_b, grads_b, micro_b = _loss_and_grads(module, padded, index)
    assert len(micro_b) == len(micro_a) + 2 and all(mb.padding for mb in micro_b[-2:])
    assert torch.allclose(loss_a, loss_b, atol=TOL)
    for name in grads_a:
        assert torch.allclose(grads_a[name], grads_b[name], atol=TOL), name
    assert {k: len(v) for k, v in plain.stats.items()} == {
        k: len(v) for k, v in padded.stats.items()
    }
