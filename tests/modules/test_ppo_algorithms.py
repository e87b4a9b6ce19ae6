"""GSPO, REINFORCE++, DAPO's overlong shaping and the TRL-compatible settings inside PPOModule:
each trains, each setting reaches the loss, and combinations that would silently change the
method are refused when the module is built."""

import lightning as L
import pytest
import torch

from lit_rlhf.algos import aggregate_loss
from lit_rlhf.training import PPOUpdate
from lit_rlhf.types import Rollout
from tests.helpers import prompt_loader, replace_groups
from tests.modules.test_ppo import PROMPTS, make_module, trainer


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(
            loss={
                "policy_loss": "gspo",
                "loss_agg": "seq_mean_token_mean",
                "clip_low": 3e-4,
                "clip_high": 4e-4,
            },
            update={"ppo_epochs": 2, "mini_batch_size": 8},
        ),
        dict(
            advantage={"estimator": "reinforce_pp"},
            rollout={"samples_per_prompt": 1},
            kl={"coef": 0.05, "placement": "reward"},
        ),
        dict(
            advantage={"estimator": "reinforce_pp_baseline"},
            kl={"coef": 0.05, "placement": "reward"},
        ),
        dict(
            rollout={"overlong_filter": True, "overlong_buffer": 4},
            loss={"loss_agg": "seq_mean_token_sum_norm"},
        ),
        dict(kl={"coef": 0.1, "ratio_correction": True}, advantage={"eps": 1e-4}),
    ],
    ids=["gspo", "reinforce_pp", "reinforce_pp_baseline", "dapo-overlong-dr-grpo", "trl-kl"],
)
def test_each_algorithm_trains(tiny_model_dir, tmp_path, kwargs):
    module = make_module(tiny_model_dir, **kwargs)
    module.configure_model()
    before = {n: p.detach().clone() for n, p in module.policy.named_parameters()}
    run = trainer(tmp_path, limit_train_batches=2)
    run.fit(module, prompt_loader(module.tokenizer, PROMPTS, 4))
    assert module.rollout_step == 2
    changed = [n for n, p in module.policy.named_parameters() if not torch.equal(p, before[n])]
    if kwargs.get("rollout", {}).get("overlong_filter"):
        # the tiny model rarely ends within 8 tokens: the filter must then leave those out
        assert "rollout/overlong_filtered" in run.logged_metrics
        assert "rollout/overlong_penalty" in run.logged_metrics
        return
    assert changed


def test_gspo_with_a_length_weighted_aggregation_is_refused(tiny_model_dir):
    with pytest.raises(ValueError, match=r"Fix: set loss\.loss_agg: seq_mean_token_mean"):
        make_module(tiny_model_dir, loss={"policy_loss": "gspo"})


def test_reinforce_pp_needs_no_group_but_its_baseline_variant_does(tiny_model_dir):
    make_module(
        tiny_model_dir, advantage={"estimator": "reinforce_pp"}, rollout={"samples_per_prompt": 1}
    )
    with pytest.raises(ValueError, match="samples_per_prompt >= 2"):
        make_module(
            tiny_model_dir,
            advantage={"estimator": "reinforce_pp_baseline"},
            rollout={"samples_per_prompt": 1},
        )


def _experience(tiny_model_dir, **kwargs):
    module = make_module(tiny_model_dir, **kwargs)
    module.configure_model()
    module.trainer = L.Trainer(logger=False, enable_progress_bar=False)
    batch = next(iter(prompt_loader(module.tokenizer, PROMPTS[:4], 4)))
    torch.manual_seed(0)
    return module, module.prepare_update(module.collect_rollout(batch))


def _loss(module, experience, rows, settings=None, **kw):
    update = PPOUpdate(
        module.policy, settings or module.settings, experience, temperature=1.0,
        kl_coef=module.kl_coef, use_current_as_old=True, **kw,
    )  # fmt: skip
    return update.loss(update.micro_batches(torch.tensor(rows))[0])


def test_overlong_filter_leaves_truncated_responses_out_of_the_loss(tiny_model_dir):
    module, exp = _experience(tiny_model_dir)
    keep = torch.zeros(len(exp), dtype=torch.bool)
    keep[[1, 5]] = True
    exp.loss_mask = keep
    masked = _loss(module, exp, list(range(len(exp))))
    exp.loss_mask = None
    alone = _loss(module, exp, [1, 5])  # the same two rows as their own mini-batch
    torch.testing.assert_close(masked, alone, atol=1e-6, rtol=1e-5)


def test_truncated_means_cut_at_max_new_tokens_without_an_end(tiny_model_dir):
    module, exp = _experience(tiny_model_dir)
    ro: Rollout = exp.rollout
    eos, pad = module.tokenizer.eos_token_id, module.tokenizer.pad_token_id
    cap = module.rl.collector.engine.max_new_tokens  # 8
    ids = torch.full((3, cap), 7)
    ids[1, 7] = eos  # ended exactly at the cap
    ids[2, 3] = eos  # ended early
    ids[2, 4:] = pad
    mask = torch.ones(3, cap, dtype=torch.bool)
    mask[2, 4:] = False
    fake = Rollout(**{**ro.__dict__, "response_ids": ids, "response_mask": mask})
    assert module.rl.truncated(module, fake).tolist() == [True, False, False]


def test_dr_grpo_normaliser_is_the_engine_cap(tiny_model_dir):
    module = make_module(tiny_model_dir, loss={"loss_agg": "seq_mean_token_sum_norm"})
    assert module.rl.norm_length == 8  # max_new_tokens of make_module's engine
    module = make_module(
        tiny_model_dir, loss={"loss_agg": "seq_mean_token_sum_norm", "loss_norm_length": 32}
    )
    assert module.rl.norm_length == 32
    per_token = torch.tensor([[1.0, 2.0, 0.0], [3.0, 0.0, 0.0]])
    mask = per_token > 0
    # sum over every token / (sequences x the constant), as Dr. GRPO publishes it
    got = aggregate_loss(per_token, mask, mode="seq_mean_token_sum_norm", norm_length=32)
    assert float(got) == pytest.approx(6.0 / (2 * 32))


def test_advantage_eps_reaches_grpo(tiny_model_dir):
    _, exp = _experience(tiny_model_dir, advantage={"eps": 10.0})
    _, ref = _experience(tiny_model_dir, advantage={"eps": 0.0})
    scores, groups = exp.rollout.scores, exp.rollout.group_ids
    for g in groups.unique():
        rows = groups == g
        s = scores[rows]
        std = s.std()
        expected = (s - s.mean()) / (std + 10.0) if std > 0 else torch.zeros_like(s)
        torch.testing.assert_close(exp.advantages[rows, 0], expected, atol=1e-6, rtol=1e-5)
    assert not torch.allclose(exp.advantages, ref.advantages)


def test_kl_ratio_correction_adds_the_ratio_gradient(tiny_model_dir):
    """d/dtheta [r * k3] at r = 1 is grad k3 + k3 * grad log pi: the corrected gradient is the
    plain one plus kl_coef * sum(k3 * grad log pi) / tokens."""
    from lit_rlhf.algos import kl_penalty
    from lit_rlhf.models.forward import forward_response

    module, exp = _experience(tiny_model_dir, kl={"coef": 0.5})
    rows = list(range(len(exp)))

    def grads(ratio_correction):
        settings = replace_groups(module.settings, kl={"ratio_correction": ratio_correction})
        module.zero_grad()
        _loss(module, exp, rows, settings).backward()
        return {n: p.grad.clone() for n, p in module.policy.named_parameters()}

    plain = grads(False)
    corrected = grads(True)
    ro = exp.rollout
    module.zero_grad()
    fwd = forward_response(module.policy, ro.input_ids, ro.attention_mask, ro.response_ids,
                           temperature=1.0)  # fmt: skip
    k3 = kl_penalty(fwd.log_probs.detach(), exp.ref_log_probs, estimator="k3")
    mask = ro.response_mask
    (0.5 * (k3 * fwd.log_probs)[mask].sum() / mask.sum()).backward()
    for name, p in module.policy.named_parameters():
        torch.testing.assert_close(corrected[name], plain[name] + p.grad, atol=1e-6, rtol=1e-4)
