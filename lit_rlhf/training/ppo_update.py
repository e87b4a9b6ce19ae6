"""The clipped policy (+ value) loss of one micro-batch of an :class:`Experience`.

:class:`PPOUpdate` holds the networks, the settings and the experience, and gives
:class:`~lit_rlhf.training.OptimizerStep` what it needs: the micro-batches of a mini-batch and
the loss of each. Token-mean aggregation divides every micro-batch's summed loss by the token
count of its whole mini-batch, so accumulating micro-batches gives exactly the gradient of one
pass. References: PPO (arXiv 1707.06347), dual clip (arXiv 1912.09729), GRPO's KL in the loss
(arXiv 2402.03300).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from functools import partial
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from lit_rlhf.algos import (
    aggregate_loss,
    clipped_policy_loss,
    clipped_value_loss,
    gspo_policy_loss,
    importance_weights,
    kl_penalty,
    masked_mean,
    mismatch_stats,
    sequence_mean_weights,
)
from lit_rlhf.models.chunked import pack_rows, packed_response_forward
from lit_rlhf.models.forward import forward_response
from lit_rlhf.strategies import is_deepspeed
from lit_rlhf.training.batching import critic_values, minibatches, trim_columns
from lit_rlhf.training.faults import SKIPPED_STEPS_KEY
from lit_rlhf.training.lr_schedule import LR_KEY
from lit_rlhf.training.optimization import OptimizerStep
from lit_rlhf.training.packing import (
    agree_max,
    group_minibatches,
    packed_critic_values,
    plan_token_budget,
    row_tokens,
)
from lit_rlhf.training.protocols import (
    PolicyLossContext,
    gradient_task_labels,
    loss_terms_read_logits,
    task_gradient_hook,
)
from lit_rlhf.training.settings import PPOSettings
from lit_rlhf.types import Experience

LossTerms = Callable[[PolicyLossContext], tuple[Tensor, dict[str, Tensor]]]


class MicroBatch(NamedTuple):
    rows: Tensor  # [b] long, rows of the experience
    num_tokens: Tensor  # response tokens in the whole mini-batch (token-mean denominator)
    num_seqs: int  # sequences in the whole mini-batch
    task: str = ""  # the rows' task when micro-batches are split by task, else ""
    # a zero-weight repeat of a row, run only so that every rank runs as many forward passes
    # (packing under DDP / ZeRO-3); it records no diagnostics
    padding: bool = False


def _task_of(micro: MicroBatch) -> str:
    return micro.task


def no_loss_terms(ctx: PolicyLossContext) -> tuple[Tensor, dict[str, Tensor]]:
    return torch.zeros_like(ctx.per_token_loss), {}


class _Forward(NamedTuple):
    """The current policy's (and critic's) outputs for one micro-batch, [b, R] layout."""

    log_probs: Tensor  # [b, R] fp32
    logits: Tensor  # [b, R, V] tempered logits ([b, R, 0] when packed and no callback reads them)
    full_vocab: tuple[Tensor, Tensor] | None  # packed: (entropy, top-1) [b, R] from the chunks
    values: Tensor | None  # [b, R] critic values (when a critic is trained)


class PPOUpdate:
    """Losses for mini-batches of one experience.

    Args:
        policy: the policy network being trained. critic: the critic (GAE only), a separate
            network or a value head over the policy's hidden states (``critic.kind``).
        settings: the update's :class:`PPOSettings`.
        experience: the prepared rollout.
        temperature: the sampling temperature (log-probs are taken under the same distribution).
        kl_coef: the current KL coefficient (an adaptive controller may move it between steps).
        loss_terms: the loss-term protocol bound to the trainer and module, e.g.
            ``functools.partial(policy_loss_terms, trainer, module)``.
        use_current_as_old: the current policy's detached log-probs are the old ones (valid when
            the experience gets exactly one update, before which the weights did not change).
        step: the rollout step this update belongs to.
        mismatch: the correction for the engine's log-probs (``mismatch.correction`` resolved
            for the engine): ``tis`` weights the policy loss by the ratio ``pi_old / mu``
            truncated to ``[mismatch.floor, mismatch.cap]``, ``mask`` by the ratio inside
            ``[mismatch.low, mismatch.high]`` and 0 outside, per token or per sequence
            (``mismatch.level``); ``none`` leaves it; whenever the rollout holds the engine's
            log-probs the mismatch is logged (``rollout/mismatch_*``).
        norm_length: the constant of ``loss.loss_agg: seq_mean_token_sum_norm`` (
            ``loss.loss_norm_length``, else the engine's ``max_new_tokens``).
    """

    def __init__(
        self,
        policy: nn.Module,
        settings: PPOSettings,
        experience: Experience,
        *,
        temperature: float,
        kl_coef: float,
        critic: nn.Module | None = None,
        loss_terms: LossTerms = no_loss_terms,
        use_current_as_old: bool = False,
        step: int = 0,
        mismatch: str = "none",
        norm_length: int | None = None,
    ) -> None:
        self.policy, self.critic, self.settings = policy, critic, settings
        self.mismatch, self.norm_length = mismatch, norm_length
        # GSPO's per-token factors taken per sequence (TRL's form; refused without GSPO)
        self.gspo_per_sequence = settings.loss.gspo_weighting == "sequence"
        self.experience = experience
        self.temperature, self.kl_coef = temperature, kl_coef
        self.loss_terms = loss_terms
        self.use_current_as_old = use_current_as_old
        self.step = step
        self.stats: dict[str, list[Tensor]] = defaultdict(list)
        # the per-task split's labels (the rollout's, or a null control's permutation of them)
        self.task_labels: list[str] | None = None
        # packing: build full logits for a loss-term callback that reads them; agree on the
        # LM-head chunk count across ranks (ZeRO-3 gathers weights inside every call)
        self.read_logits = False
        self.zero3 = False
        self._quiet = False  # a padding micro-batch records nothing

    def run(
        self,
        module: Any,
        optimizer: Any,
        step: OptimizerStep,
        *,
        generator: torch.Generator,
        after_step: Callable[[], None] = lambda: None,
    ) -> dict[str, Tensor]:
        """``update.ppo_epochs`` passes over shuffled mini-batches of the experience, one
        ``step`` (an :class:`OptimizerStep`) each, then ``after_step`` (e.g. the engine's weight
        sync); returns the mean of every recorded diagnostic. Each step is told its place among
        the update's steps (the lr schedule's ``lr_interval: batch`` counts the update once)."""
        n, size = len(self.experience), self.settings.update_size(len(self.experience))
        hook = task_gradient_hook(getattr(module, "_trainer", None))
        by_task = hook is not None
        rollout = self.experience.rollout
        self.task_labels = (
            gradient_task_labels(hook, module.trainer, rollout.tasks, rollout.group_ids.tolist())
            if by_task
            else None
        )
        self.read_logits = loss_terms_read_logits(getattr(module, "_trainer", None))
        strategy = getattr(getattr(module, "_trainer", None), "strategy", None)
        self.zero3 = is_deepspeed(strategy) and bool(getattr(strategy, "zero_stage_3", False))
        epochs = self.settings.update.ppo_epochs
        steps = epochs * math.ceil(n / size)
        done = 0
        for _ in range(epochs):
            for index in self._minibatches(n, size, generator):
                micro = self.micro_batches(index, by_task=by_task)
                where = (done, steps)
                self.add(
                    step(module, optimizer, micro, self.loss, task_of=_task_of, step_in_batch=where)
                )
                done += 1
                after_step()
        return self.means()

    def _minibatches(self, n: int, size: int, generator: torch.Generator) -> list[Tensor]:
        """Shuffled mini-batches: of rows (padded path), of whole prompt groups (packing)."""
        if self.settings.packed is None:
            return list(minibatches(n, size, generator=generator))
        return group_minibatches(self.experience.rollout.group_ids.cpu(), size, generator=generator)

    def micro_batches(self, index: Tensor, *, by_task: bool = False) -> list[MicroBatch]:
        """The micro-batches of the mini-batch ``index`` [b] (rows of the experience); with
        ``by_task`` each holds rows of one task (the rollout's ``tasks``) for a per-task
        gradient callback (MGS). The token-mean denominator stays the whole mini-batch's.
        With ``micro_batch_tokens`` they are token-budget plans of whole groups
        (:func:`~lit_rlhf.training.packing.plan_token_budget`), equal in number on every rank."""
        mask, kept = self.experience.counted[index], self.experience.kept
        n_tokens = mask.sum().clamp(min=1)
        n_seqs = len(index) if kept is None else max(1, int(kept[index].sum()))  # failed rewards
        if not by_task:
            parts = [("", index)]
        else:
            tasks = self.task_labels or self.experience.rollout.tasks
            groups: dict[str, list[int]] = {}
            for row in index.tolist():
                groups.setdefault(tasks[row], []).append(row)
            parts = [(t, torch.tensor(groups[t], dtype=index.dtype)) for t in sorted(groups)]
        out = [
            MicroBatch(micro, n_tokens, n_seqs, task)
            for task, rows in parts
            for micro in self._split(rows)
        ]
        if self.settings.packed is None:
            return out
        extra = agree_max(len(out), n_tokens.device) - len(out)
        return out + [out[0]._replace(rows=out[0].rows[:1], padding=True)] * extra

    def _split(self, rows: Tensor) -> list[Tensor]:
        budget = self.settings.packed
        if budget is None:
            return list(rows.split(self.settings.optim.micro_batch_size or len(rows)))
        ro = self.experience.rollout
        return plan_token_budget(rows, row_tokens(ro)[rows], ro.group_ids.cpu()[rows], budget)

    def loss(self, mb: MicroBatch) -> Tensor:
        """The micro-batch's share of the mini-batch loss (policy + KL + callback terms +
        value); a padding micro-batch's is 0 (its forward and backward still run)."""
        if mb.padding:
            self._quiet = True
            try:
                return self.loss(mb._replace(padding=False)) * 0.0
            finally:
                self._quiet = False
        exp, s, micro = self.experience, self.settings, mb.rows
        ro = exp.rollout
        pcols, rcols = trim_columns(ro.prompt_mask[micro], ro.response_mask[micro])
        mask = exp.counted[micro][:, rcols]
        fwd = self._forward(micro, pcols, rcols)
        adv = exp.advantages[micro][:, rcols]
        old = self._old_log_probs(fwd.log_probs, micro, rcols, ro.response_mask[micro][:, rcols])
        pg = self._policy_loss(fwd.log_probs, old, adv, mask, micro, rcols)
        kl = self._kl_loss(fwd.log_probs, old, micro, rcols, mask)
        per_token = pg if kl is None else pg + kl
        ctx = PolicyLossContext(fwd.logits, fwd.log_probs, old, adv, mask, pg)
        if fwd.full_vocab is not None:
            ctx._full_vocab = fwd.full_vocab
        extra, extra_stats = self.loss_terms(ctx)
        agg = partial(aggregate_loss, mode=s.aggregation, norm_length=self.norm_length)
        loss = agg(per_token + extra, mask, num_tokens=mb.num_tokens, num_seqs=mb.num_seqs)
        self._record("ppo/policy_loss", agg(pg, mask))
        if fwd.values is not None:
            loss = loss + self._value_loss(fwd.values, micro, rcols, mask, mb)
        self._record("ppo/entropy", ctx.full_vocab_means()["entropy"])
        self.add(extra_stats)
        return loss

    def _forward(self, micro: Tensor, pcols: slice, rcols: slice) -> _Forward:
        """The policy's (and critic's) forward over the micro-batch's trimmed columns: padded,
        or packed with chunked log-probs when ``micro_batch_tokens`` is set."""
        ro = self.experience.rollout
        p_ids, p_mask = ro.prompt_ids[micro][:, pcols], ro.prompt_mask[micro][:, pcols]
        r_ids, r_mask = ro.response_ids[micro][:, rcols], ro.response_mask[micro][:, rcols]
        value_head = self.critic is not None and self.settings.value_head
        separate = None if value_head else self.critic
        if self.settings.packed is None:
            ids, attn = torch.cat([p_ids, r_ids], dim=1), torch.cat([p_mask, r_mask], dim=1)
            fwd = forward_response(
                self.policy, ids, attn, r_ids, temperature=self.temperature, with_hidden=value_head
            )
            values = (
                None if separate is None else critic_values(separate, ids, attn, r_ids.shape[1])
            )
            logits, log_probs, full_vocab, hidden = fwd.logits, fwd.log_probs, None, fwd.hidden
        else:
            packed = pack_rows(p_ids, p_mask, r_ids, r_mask)
            device = packed.input_ids.device
            pk = packed_response_forward(
                self.policy, packed, temperature=self.temperature, with_hidden=value_head,
                full_logits=self.read_logits,
                num_chunks=(lambda k: agree_max(k, device)) if self.zero3 else (lambda k: k),
            )  # fmt: skip
            log_probs, full_vocab, hidden = pk.log_probs, (pk.entropy, pk.top1), pk.hidden
            logits = pk.logits if pk.logits is not None else log_probs.new_empty((*r_ids.shape, 0))
            values = (
                None
                if separate is None
                else packed_critic_values(separate, p_ids, p_mask, r_ids, r_mask)
            )
        if value_head and self.critic is not None and hidden is not None:
            values = self.critic(hidden).float()
        return _Forward(log_probs, logits, full_vocab, values)

    def _policy_loss(
        self, log_probs: Tensor, old: Tensor, adv: Tensor, mask: Tensor, micro: Tensor,
        rcols: slice,
    ) -> Tensor:  # fmt: skip
        """The clipped surrogate per token (PPO's token ratio or GSPO's sequence ratio), weighted
        by the mismatch correction's importance weights."""
        mismatch, loss = self.settings.mismatch, self.settings.loss
        surrogate = gspo_policy_loss if loss.policy_loss == "gspo" else clipped_policy_loss
        pg, stats = surrogate(
            log_probs, old, adv, mask,
            clip_low=loss.clip_low, clip_high=loss.clip_high, dual_clip=loss.dual_clip,
        )  # fmt: skip
        self.add({f"ppo/{k}": v for k, v in stats._asdict().items()})
        engine = self.experience.rollout.sample_log_probs
        if engine is None or not (self.use_current_as_old or self.settings.recompute):
            return pg  # no second source of log-probs to compare with
        engine = engine[micro][:, rcols]
        stats_mm = mismatch_stats(old, engine, mask)
        if self.mismatch in ("tis", "mask"):
            weights, weight_stats = importance_weights(
                old, engine, mask, correction=self.mismatch, level=mismatch.level,
                cap=mismatch.cap, floor=mismatch.floor, low=mismatch.low, high=mismatch.high,
            )  # fmt: skip
            stats_mm.update(weight_stats)
            if self.gspo_per_sequence:  # TRL's form: the sequence's mean weight
                weights = sequence_mean_weights(weights, mask)
            pg = pg * weights.to(pg.dtype)
        self.add({f"rollout/mismatch_{k}": v for k, v in stats_mm.items()})
        return pg

    def _old_log_probs(self, current: Tensor, micro: Tensor, rcols: slice, mask: Tensor) -> Tensor:
        exp = self.experience
        if not self.use_current_as_old:
            return exp.old_log_probs[micro][:, rcols]
        old = current.detach()
        if exp.old_from_update:
            exp.old_log_probs[micro, rcols] = old.float().masked_fill(~mask, 0.0)
        return old

    def _kl_loss(
        self, log_probs: Tensor, old: Tensor, micro: Tensor, rcols: slice, mask: Tensor
    ) -> Tensor | None:
        """The weighted per-token KL term, or None when the KL is not in the loss. With
        ``kl.ratio_correction`` the estimate is multiplied by the ratio ``pi / pi_old``, which
        makes the k3 estimate unbiased for samples drawn from ``pi_old`` (DeepSeek-V3.2, arXiv
        2512.02556; TRL's ``use_bias_correction_kl``): per token, or with GSPO and
        ``loss.gspo_weighting: sequence`` the sequence ratio (TRL's form)."""
        ref = self.experience.ref_log_probs
        if not (self.kl_coef > 0 and not self.settings.kl_in_reward and ref is not None):
            return None
        estimator = self.settings.kl.estimator
        kl = kl_penalty(log_probs, ref[micro][:, rcols], estimator=estimator)
        if self.settings.kl.ratio_correction:
            log_ratio = log_probs - old.detach()
            if self.gspo_per_sequence:  # TRL's form: the sequence ratio of GSPO
                log_ratio = masked_mean(log_ratio, mask, dim=-1)[:, None]
            kl = kl * torch.exp(log_ratio)
        self._record("ppo/kl_loss", masked_mean(kl, mask))
        return self.kl_coef * kl

    def _value_loss(
        self, values: Tensor, micro: Tensor, rcols: slice, mask: Tensor, mb: MicroBatch
    ) -> Tensor:
        critic, targets = self.settings.critic, self.experience.critic
        mode = self.settings.aggregation
        if targets is None:
            raise ValueError("a critic is being trained but the experience has no value targets")
        v_loss, v_stats = clipped_value_loss(
            values,
            targets.values[micro][:, rcols],
            targets.returns[micro][:, rcols],
            mask,
            clip=critic.value_clip,
        )
        self._record(
            "ppo/value_loss",
            aggregate_loss(v_loss, mask, mode=mode, norm_length=self.norm_length),
        )
        self.add({f"critic/{k}": v for k, v in v_stats._asdict().items()})
        return critic.vf_coef * aggregate_loss(
            v_loss, mask, mode=mode, num_tokens=mb.num_tokens, num_seqs=mb.num_seqs,
            norm_length=self.norm_length,
        )  # fmt: skip

    def _record(self, key: str, value: Tensor) -> None:
        if not self._quiet:
            self.stats[key].append(value.detach().float())

    def add(self, stats: dict[str, Any]) -> None:
        """Record scalar diagnostics (averaged by :meth:`means`)."""
        for key, value in stats.items():
            self._record(key, value)

    def means(self) -> dict[str, Tensor]:
        """Each diagnostic's mean over the update; a cumulative count and the lr their latest
        value; the mismatch's extreme ratios their extremes."""
        out = {}
        for k, v in self.stats.items():
            if k in (SKIPPED_STEPS_KEY, LR_KEY):
                out[k] = v[-1]
            elif k.startswith("rollout/mismatch_ratio_"):
                stacked = torch.stack(v)
                out[k] = stacked.max() if k.endswith("_max") else stacked.min()
            else:
                out[k] = torch.stack(v).mean()
        return out
