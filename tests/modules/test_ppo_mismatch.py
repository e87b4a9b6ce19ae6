"""The rollout/training mismatch correction: with the engine's log-probs deliberately perturbed,
the TIS-corrected gradient equals the importance-weighted policy gradient computed here by hand,
the masked variant weights by the ratio inside its band and drops exactly the tokens outside it,
and the mismatch is logged."""

import dataclasses

import lightning as L
import pytest
import torch

from lit_rlhf.models.forward import forward_response
from lit_rlhf.settings import MismatchSettings, UpdateSettings
from lit_rlhf.training import PPOSettings, PPOUpdate
from lit_rlhf.training.policy_step import resolve_mismatch
from tests.helpers import prompt_loader, replace_groups
from tests.modules.test_ppo import PROMPTS, make_module


def _perturbed_experience(tiny_model_dir, noise=0.4, **groups):
    module = make_module(tiny_model_dir, **{"mismatch": {"correction": "tis"}, **groups})
    module.configure_model()
    module.trainer = L.Trainer(logger=False, enable_progress_bar=False)
    batch = next(iter(prompt_loader(module.tokenizer, PROMPTS[:4], 4)))
    torch.manual_seed(0)
    rollout = module.collect_rollout(batch)
    assert rollout.sample_log_probs is not None  # the correction asks the engine for them
    gen = torch.Generator().manual_seed(1)
    rollout.sample_log_probs = rollout.sample_log_probs + noise * torch.randn(
        rollout.sample_log_probs.shape, generator=gen
    )
    return module, module.prepare_update(rollout)


def _grads(module, experience, correction, kl_coef=0.0, **groups):
    update = PPOUpdate(
        module.policy, replace_groups(module.settings, **groups), experience, temperature=1.0,
        kl_coef=kl_coef,
        use_current_as_old=True, mismatch=correction,
    )  # fmt: skip
    module.zero_grad()
    for mb in update.micro_batches(torch.arange(len(experience))):
        update.loss(mb).backward()
    grads = {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}
    return grads, update.means()


def _weighted_reference(module, experience, weight_fn):
    """sum_t -A_t w_t grad log pi(y_t) / (counted tokens): the policy gradient at ratio 1 with
    each token weighted by w_t, from a forward pass of the policy."""
    ro = experience.rollout
    module.zero_grad()
    fwd = forward_response(module.policy, ro.input_ids, ro.attention_mask, ro.response_ids,
                           temperature=1.0)  # fmt: skip
    mask = ro.response_mask
    w = weight_fn(fwd.log_probs.detach(), ro.sample_log_probs)
    ratio = torch.exp(fwd.log_probs - fwd.log_probs.detach())
    loss = (-(experience.advantages * w * ratio))[mask].sum() / mask.sum()
    loss.backward()
    return {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}


def test_tis_gradient_equals_the_importance_weighted_gradient(tiny_model_dir):
    module, exp = _perturbed_experience(tiny_model_dir)
    ours, stats = _grads(module, exp, "tis", optim={"micro_batch_size": 3})
    ref = _weighted_reference(module, exp, lambda old, eng: torch.exp(old - eng).clamp(max=2.0))
    plain, _ = _grads(module, exp, "none")
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], atol=1e-6, rtol=1e-4)
    assert any(not torch.allclose(ours[n], plain[n]) for n in ref)  # the weights mattered
    assert 0 < float(stats["rollout/mismatch_capped_fraction"]) < 1
    assert float(stats["rollout/mismatch_abs_log_ratio"]) > 0.2
    assert float(stats["rollout/mismatch_ratio_max"]) > 2.0


def test_masked_correction_weights_by_the_ratio_inside_the_band(tiny_model_dir):
    module, exp = _perturbed_experience(tiny_model_dir)
    ours, stats = _grads(module, exp, "mask", mismatch={"low": 0.7, "high": 1.4})

    def band(old, eng):
        ratio = torch.exp(old - eng)
        return torch.where((ratio >= 0.7) & (ratio <= 1.4), ratio, torch.zeros_like(ratio))

    ref = _weighted_reference(module, exp, band)
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], atol=1e-6, rtol=1e-4)
    assert 0 < float(stats["rollout/mismatch_masked_fraction"]) < 1


def _row_mean(x, mask):
    return (x * mask).sum(1) / mask.sum(1).clamp(min=1)


@pytest.mark.parametrize(
    "correction,groups,weight",
    [
        ("tis", {"cap": 1.5, "floor": 0.5}, lambda r: r.clamp(min=0.5, max=1.5)),
        ("mask", {"low": 0.4, "high": 2.5},
         lambda r: torch.where((r >= 0.4) & (r <= 2.5), r, torch.zeros_like(r))),
    ],
    ids=["sequence_truncate", "sequence_mask"],
)  # fmt: skip
def test_sequence_level_weights_each_sequence_by_its_product_ratio(
    tiny_model_dir, correction, groups, weight
):
    module, exp = _perturbed_experience(tiny_model_dir, noise=0.15)
    mismatch = {"level": "sequence", **groups}
    ours, stats = _grads(module, exp, correction, mismatch=mismatch)
    mask = exp.rollout.response_mask

    def per_sequence(old, eng):
        ratio = torch.exp(((old - eng) * mask).sum(1, keepdim=True))  # prod_t pi_old / mu
        return weight(ratio).expand_as(old)

    ref = _weighted_reference(module, exp, per_sequence)
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], atol=1e-6, rtol=1e-4)
    token, _ = _grads(module, exp, correction, mismatch={"level": "token", **groups})
    assert any(not torch.allclose(token[n], ref[n], atol=1e-6, rtol=1e-4) for n in ref)
    outside = stats.get("rollout/mismatch_masked_fraction", stats.get(
        "rollout/mismatch_capped_fraction"))  # fmt: skip
    assert 0 < float(outside) < 1  # some sequences in the band, some out


def test_gspo_sequence_weighting_is_trls_form(tiny_model_dir):
    """``loss.gspo_weighting: sequence`` with TIS and ``kl.ratio_correction``: each sequence's
    GSPO term is weighted by its mean TIS weight and the k3 estimate multiplied by the sequence
    ratio (TRL 1.16, importance_sampling_level='sequence'), written here from that formula."""
    gspo = {"policy_loss": "gspo", "loss_agg": "seq_mean_token_mean", "clip_low": 3e-4,
            "clip_high": 4e-4}  # fmt: skip
    kl = {"coef": 0.1, "ratio_correction": True}
    module, exp = _perturbed_experience(tiny_model_dir, loss=gspo, kl=kl)
    gen = torch.Generator().manual_seed(2)
    ref_lp = exp.ref_log_probs + 0.3 * torch.randn(exp.ref_log_probs.shape, generator=gen)
    exp = dataclasses.replace(exp, ref_log_probs=ref_lp)  # a reference that differs
    ours, _ = _grads(module, exp, "tis", kl_coef=0.1, loss={"gspo_weighting": "sequence"})

    ro = exp.rollout
    module.zero_grad()
    lp = forward_response(module.policy, ro.input_ids, ro.attention_mask, ro.response_ids,
                          temperature=1.0).log_probs  # fmt: skip
    mask = ro.response_mask
    seq_ratio = torch.exp(_row_mean(lp - lp.detach(), mask))[:, None]  # value 1, GSPO's gradient
    tis = torch.exp(lp.detach() - ro.sample_log_probs).clamp(max=2.0)
    adv = _row_mean(exp.advantages, mask)[:, None]
    policy = -adv * seq_ratio * _row_mean(tis, mask)[:, None]
    k3 = torch.exp(ref_lp - lp) - (ref_lp - lp) - 1
    loss = (_row_mean(policy.expand_as(lp), mask) + 0.1 * _row_mean(k3 * seq_ratio, mask)).mean()
    loss.backward()
    ref = {n: p.grad.clone() for n, p in module.policy.named_parameters() if p.grad is not None}
    for name in ref:
        torch.testing.assert_close(ours[name], ref[name], atol=1e-6, rtol=1e-4)
    per_token, _ = _grads(module, exp, "tis", kl_coef=0.1)  # GSPO-token, lit-rlhf's default
    assert any(not torch.allclose(per_token[n], ref[n], atol=1e-6, rtol=1e-4) for n in ref)


def test_the_mismatch_is_logged_in_a_training_step(tiny_model_dir, tmp_path):
    from tests.modules.test_ppo import trainer

    module = make_module(tiny_model_dir, mismatch={"correction": "tis"})
    run = trainer(tmp_path, limit_train_batches=1)
    run.fit(module, prompt_loader(module.tokenizer, PROMPTS[:4], 4))
    logged = run.logged_metrics
    for key in ("abs_log_ratio", "kl", "ratio_max", "ratio_min", "capped_fraction"):
        assert f"rollout/mismatch_{key}" in logged, key
    # the HF engine's log-probs and the trainer's come from the same weights: a small gap
    assert float(logged["rollout/mismatch_abs_log_ratio"]) < 1e-3


class _Engine:
    temperature, max_new_tokens = 1.0, 8

    def __init__(self, separate: bool) -> None:
        if separate:
            self.separate_numerics = True


@pytest.mark.parametrize(
    "settings,separate,expected",
    [
        ({}, True, "tis"),  # vLLM-like engine, one update per rollout
        ({}, False, "none"),  # the HF engines: same forward as the trainer
        ({"update": UpdateSettings(ppo_epochs=2)}, True, "none"),  # no trainer old log-probs
        ({"update": UpdateSettings(ppo_epochs=2, recompute_old_log_probs=True)}, True, "tis"),
        ({"mismatch": MismatchSettings(correction="mask")}, False, "mask"),  # an explicit choice
    ],
)
def test_auto_turns_tis_on_for_engines_with_their_own_numerics(settings, separate, expected):
    assert resolve_mismatch(PPOSettings(**settings), _Engine(separate)) == expected


def test_an_explicit_correction_without_trainer_log_probs_is_refused():
    with pytest.raises(ValueError, match=r"Fix: set update\.recompute_old_log_probs: true"):
        PPOSettings(
            mismatch=MismatchSettings(correction="tis"), update=UpdateSettings(ppo_epochs=2)
        )
