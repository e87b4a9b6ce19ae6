"""The PPO update phase: advantages for a rollout, and mini-batch / micro-batch loss + backward.

Token-mean aggregation divides every micro-batch's summed loss by the token count of its whole
mini-batch, so accumulating micro-batches gives exactly the gradient of one pass.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.algos import (
    aggregate_loss,
    clipped_policy_loss,
    clipped_value_loss,
    gae,
    group_advantages,
    kl_penalty,
    masked_mean,
    masked_whiten,
    rloo_advantages,
    token_level_rewards,
)
from lit_rlhf.callbacks.loss_terms import PolicyLossContext, policy_loss_terms
from lit_rlhf.models.forward import forward_response
from lit_rlhf.modules.policy_forward import critic_values, trim_columns
from lit_rlhf.strategies import start_micro_batch
from lit_rlhf.types import Rollout


def compute_advantages(
    rollout: Rollout,
    *,
    advantage: str,
    gamma: float,
    lam: float,
    scale_by_std: bool,
    whiten: bool,
    kl_coef: float,
    kl_estimator: Any,
) -> None:
    """Fill ``rollout.advantages`` (and ``returns`` for GAE). ``kl_coef`` > 0 here means KL in the
    reward: per token for GAE, summed per sequence for the group baselines."""
    assert rollout.scores is not None
    mask = rollout.response_mask
    kl = None
    if kl_coef > 0 and rollout.ref_log_probs is not None:
        if rollout.old_log_probs is None:
            raise RuntimeError(
                "a KL penalty in the reward needs the rollout's log-probs before the update, but "
                "the engine returned none. Fix: call generate(..., log_probs=True)."
            )
        kl = kl_penalty(rollout.old_log_probs, rollout.ref_log_probs, estimator=kl_estimator)
        kl = kl.masked_fill(~mask, 0.0)
    if advantage == "gae":
        assert rollout.values is not None, "GAE needs critic values"
        rewards = token_level_rewards(rollout.scores, mask)
        if kl is not None:
            rewards = rewards - kl_coef * kl
        adv, rollout.returns = gae(rewards, rollout.values, mask, gamma=gamma, lam=lam)
        rollout.advantages = masked_whiten(adv, mask) if whiten else adv
        return
    scores = rollout.scores if kl is None else rollout.scores - kl_coef * kl.sum(1)
    if advantage == "grpo":
        seq_adv = group_advantages(scores, rollout.group_ids, scale_by_std=scale_by_std)
    else:
        seq_adv = rloo_advantages(scores, rollout.group_ids)
    rollout.advantages = seq_adv[:, None] * mask


class PPOUpdate:
    """Runs mini-batches of one rollout through a :class:`PPOModule`'s networks.

    ``use_current_as_old``: treat the current policy's detached log-probs as the rollout's (valid
    when the rollout gets exactly one update, before which the weights did not change). If the
    rollout came without log-probs, they are filled into ``rollout.old_log_probs`` from each
    micro-batch's forward, so the rollout ends up with them as if the engine had returned them.
    """

    def __init__(self, module: Any, rollout: Rollout, *, use_current_as_old: bool) -> None:
        self.module = module
        self.hp = module.hparams
        self.rollout = rollout
        self.use_current_as_old = use_current_as_old
        self.stats: dict[str, list[Tensor]] = defaultdict(list)
        self.fill_old = use_current_as_old and rollout.old_log_probs is None
        if self.fill_old:
            rollout.old_log_probs = torch.zeros_like(rollout.response_mask, dtype=torch.float32)
        elif rollout.old_log_probs is None:
            raise ValueError(
                "several updates per rollout need the rollout's log-probs, but the engine returned "
                "none. Fix: call generate(..., log_probs=True) or set recompute_old_log_probs."
            )

    def run_minibatch(self, idx: Tensor) -> None:
        mask = self.rollout.response_mask[idx]
        n_tokens = mask.sum().clamp(min=1)
        micros = idx.split(self.hp.micro_batch_size)
        for i, micro in enumerate(micros):
            # under DeepSpeed, micro-batches bypass the engine's forward (no-op elsewhere)
            start_micro_batch(self.module.trainer.strategy, last=i == len(micros) - 1)
            self.module.manual_backward(self.micro_loss(micro, n_tokens, len(idx)))

    def micro_loss(self, micro: Tensor, n_tokens: Tensor, n_seqs: int) -> Tensor:
        ro, hp, module = self.rollout, self.hp, self.module
        pcols, rcols = trim_columns(ro.prompt_mask[micro], ro.response_mask[micro])
        r_ids = ro.response_ids[micro][:, rcols]
        mask = ro.response_mask[micro][:, rcols]
        ids = torch.cat([ro.prompt_ids[micro][:, pcols], r_ids], dim=1)
        attn = torch.cat([ro.prompt_mask[micro][:, pcols], mask], dim=1)
        value_head = module.critic is not None and hp.critic == "value_head"
        fwd = forward_response(
            module.policy,
            ids,
            attn,
            r_ids,
            temperature=module.engine.temperature,
            with_hidden=value_head,
        )
        assert ro.advantages is not None and ro.old_log_probs is not None
        adv = ro.advantages[micro][:, rcols]
        old = (
            fwd.log_probs.detach() if self.use_current_as_old else ro.old_log_probs[micro][:, rcols]
        )
        if self.fill_old:
            ro.old_log_probs[micro, rcols] = old.float().masked_fill(~mask, 0.0)
        pg, pg_stats = clipped_policy_loss(
            fwd.log_probs,
            old,
            adv,
            mask,
            clip_low=hp.clip_low,
            clip_high=hp.clip_high,
            dual_clip=hp.dual_clip,
        )
        per_token = pg
        if module.kl_coef > 0 and hp.kl_in == "loss" and ro.ref_log_probs is not None:
            kl = kl_penalty(
                fwd.log_probs, ro.ref_log_probs[micro][:, rcols], estimator=hp.kl_estimator
            )
            per_token = per_token + module.kl_coef * kl
            self._record("ppo/kl_loss", masked_mean(kl, mask))
        ctx = PolicyLossContext(fwd.logits, fwd.log_probs, old, adv, mask, pg)
        extra, extra_stats = policy_loss_terms(module.trainer, module, ctx)
        loss = aggregate_loss(
            per_token + extra, mask, mode=hp.loss_agg, num_tokens=n_tokens, num_seqs=n_seqs
        )
        self._record("ppo/policy_loss", aggregate_loss(pg, mask, mode=hp.loss_agg))
        if module.critic is not None:
            loss = loss + self._value_loss(fwd, ids, attn, micro, rcols, mask, n_tokens, n_seqs)
        self._check_finite(loss)
        self._record("ppo/entropy", ctx.full_vocab_means()["entropy"])
        for key, value in pg_stats._asdict().items():
            self._record(f"ppo/{key}", value)
        for key, value in extra_stats.items():
            self._record(key, value)
        return loss

    def _value_loss(
        self,
        fwd: Any,
        ids: Tensor,
        attn: Tensor,
        micro: Tensor,
        rcols: slice,
        mask: Tensor,
        n_tokens: Tensor,
        n_seqs: int,
    ) -> Tensor:
        ro, hp, module = self.rollout, self.hp, self.module
        if hp.critic == "value_head":
            values = module.critic(fwd.hidden).float()
        else:
            values = critic_values(module.critic, ids, attn, mask.shape[1])
        assert ro.values is not None and ro.returns is not None
        v_loss, v_stats = clipped_value_loss(
            values,
            ro.values[micro][:, rcols],
            ro.returns[micro][:, rcols],
            mask,
            clip=hp.value_clip,
        )
        self._record("ppo/value_loss", aggregate_loss(v_loss, mask, mode=hp.loss_agg))
        for key, value in v_stats._asdict().items():
            self._record(f"critic/{key}", value)
        return hp.vf_coef * aggregate_loss(
            v_loss, mask, mode=hp.loss_agg, num_tokens=n_tokens, num_seqs=n_seqs
        )

    def _check_finite(self, loss: Tensor) -> None:
        if not torch.isfinite(loss):
            last = {k: float(v[-1]) for k, v in self.stats.items() if v}
            raise FloatingPointError(
                f"non-finite PPO loss ({float(loss)}) at rollout step {self.module.rollout_step}; "
                f"latest components: {last}. The optimizer step for this mini-batch was not "
                "taken. Likely fixes: lower the learning rate, check the reward for inf/NaN, "
                "use fp32 or bf16-mixed."
            )

    def _record(self, key: str, value: Tensor) -> None:
        self.stats[key].append(value.detach().float())

    def add(self, stats: dict[str, Tensor]) -> None:
        for key, value in stats.items():
            self._record(key, value)

    def means(self) -> dict[str, Tensor]:
        return {k: torch.stack(v).mean() for k, v in self.stats.items()}
