"""The RL modules' groups (PPO, GRPO, RLOO, GSPO, DAPO, REINFORCE++ in ``PPOModule``; the judge's
RL in ``GenerativeRewardModule``): the update schedule, the rollout, the advantage, the policy
loss, the engine-mismatch correction, the KL to a reference and the critic. Checks across groups
live in :class:`lit_rlhf.training.PPOSettings`, which holds these groups for the core."""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import ClassVar, Literal

from lit_rlhf.settings.base import Rule, SettingsGroup, is_int, non_negative
from lit_rlhf.settings.batch import split_over_processes

Advantage = Literal["gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"]
PolicyLoss = Literal["ppo", "gspo"]
MismatchCorrection = Literal["auto", "none", "tis", "mask"]
MismatchLevel = Literal["token", "sequence"]
GSPOWeighting = Literal["token", "sequence"]
CriticKind = Literal["separate", "value_head"]
LossAggregation = Literal[
    "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"
]
Estimator = Literal["k1", "k2", "k3"]
KLPlacement = Literal["loss", "reward"]


def _optional_at_least(value: int | None, low: int) -> bool:
    return value is None or (is_int(value) and value >= low)


@dataclass(frozen=True)
class UpdateSettings(SettingsGroup):
    """The update schedule over one rollout (``model.init_args.update``).

    Args:
        ppo_epochs: passes over each rollout.
        mini_batch_size: sequences per optimizer step on each process (null: the whole rollout,
            one step).
        global_mini_batch_size: prompts per optimizer step across all processes (verl's
            ``ppo_mini_batch_size``): each process steps on ``global_mini_batch_size /
            world_size`` prompts x ``rollout.samples_per_prompt`` sequences, worked out at
            ``setup`` (a world size that does not divide it is refused). Prompts, not sequences,
            so that a prompt's samples are never split between processes or mini-batches.
            Exclusive with ``mini_batch_size``.
        micro_batch_tokens: when set, micro-batches are cut by this budget of real (prompt +
            response) tokens instead of ``optim.micro_batch_size``, keeping each prompt group
            together, and run as packed padding-free forwards (docs/algorithms.md, "Packing").
        recompute_old_log_probs: recompute the rollout's log-probs with a trainer forward pass
            instead of trusting the engine's (engines with their own numerics, e.g. vLLM).
        seed: seeds the mini-batch shuffling.
        device_peak_flops: the device's peak FLOP/s that ``perf/mfu`` divides by (null: the
            bf16 dense peak of a GPU listed in ``lit_rlhf.plan.flops.DEVICE_PEAK_FLOPS``; on a
            CPU or an unlisted GPU no MFU is logged). ``perf/tokens_per_s`` is logged always.
    """

    GROUP = "update"

    ppo_epochs: int = 1
    mini_batch_size: int | None = None
    global_mini_batch_size: int | None = None
    micro_batch_tokens: int | None = None
    recompute_old_log_probs: bool = False
    seed: int = 0
    device_peak_flops: float | None = None

    def rules(self) -> list[Rule]:
        return [
            ("ppo_epochs", is_int(self.ppo_epochs) and self.ppo_epochs >= 1, ">= 1"),
            ("mini_batch_size", _optional_at_least(self.mini_batch_size, 1),
             ">= 1, or null for the whole rollout"),
            ("global_mini_batch_size", _optional_at_least(self.global_mini_batch_size, 1),
             ">= 1 prompt across all processes, or null"),
            ("micro_batch_tokens", _optional_at_least(self.micro_batch_tokens, 1),
             ">= 1 token (prompt + response tokens per packed micro-batch), or null (padded "
             "micro-batches of optim.micro_batch_size sequences)"),
            ("seed", is_int(self.seed) and self.seed >= 0, "an integer >= 0"),
            ("device_peak_flops", self.device_peak_flops is None
             or 0 < self.device_peak_flops < math.inf,
             "> 0 and finite FLOP/s (e.g. 989e12 for an H100 SXM's bf16), or null"),
        ]  # fmt: skip

    def check(self) -> None:
        if self.mini_batch_size is not None and self.global_mini_batch_size is not None:
            raise ValueError(
                f"update.mini_batch_size={self.mini_batch_size} (sequences per process) and "
                f"update.global_mini_batch_size={self.global_mini_batch_size} (prompts across "
                "all processes) both set the optimizer step. Fix: keep one of them (set the "
                "other to null)."
            )

    @property
    def whole_rollout(self) -> bool:
        """Whether each PPO epoch takes one optimizer step on the whole rollout."""
        return self.mini_batch_size is None and self.global_mini_batch_size is None

    def per_process(self, world_size: int, samples_per_prompt: int) -> UpdateSettings:
        """The group with ``global_mini_batch_size`` turned into this process's
        ``mini_batch_size`` (sequences) among ``world_size`` processes; itself when unset."""
        total = self.global_mini_batch_size
        if total is None:
            return self
        key = self.key("global_mini_batch_size")
        prompts = split_over_processes(total, world_size, key, "prompts")
        return replace(
            self, mini_batch_size=prompts * samples_per_prompt, global_mini_batch_size=None
        )


@dataclass(frozen=True)
class RolloutSettings(SettingsGroup):
    """What is sampled for one update (``model.init_args.rollout``).

    Args:
        samples_per_prompt: G, responses sampled per prompt.
        max_staleness: 0: on-policy. k >= 1: one-step-off training: batch t + k is generated in
            a background thread while the update on batch t runs (AReaL's decoupled PPO, arXiv
            2505.24298; docs/agents.md); the first k steps only generate.
        partial_rollouts: with ``max_staleness`` k >= 1 and an engine that keeps its requests
            across a weight push (``supports_partial_rollouts``): the engine is given the new
            weights after every update without waiting for the generations in flight, which
            finish with tokens of two or more weight versions (each token tagged with the version
            that sampled it); a sample whose oldest token is more than k updates old is left out
            of the update (``rollout/stale_dropped``).
        dynamic_sampling: DAPO's dynamic sampling: keep only groups whose rewards differ and draw
            further prompt batches until the update holds one batch's number of groups.
        dynamic_sampling_max_rounds: batches drawn in a row without filling that stop the run.
        overlong_filter: leave responses cut at ``max_new_tokens`` out of the loss (DAPO).
        overlong_buffer: DAPO's soft overlong punishment: 0 up to ``max_new_tokens -
            overlong_buffer`` tokens, then down to ``-overlong_penalty_factor`` at the cap (null:
            off).
        overlong_penalty_factor: the punishment at the cap.
        log_completions: every this many rollout steps, each sample's prompt, completion, reward
            and reward parts (and environment turns) as a table: ``completions.jsonl`` beside the
            metrics, a table to W&B / MLflow loggers, one sample on the console
            (:class:`~lit_rlhf.training.completions.CompletionTable`); 0: off.
    """

    GROUP = "rollout"

    samples_per_prompt: int = 4
    max_staleness: int = 0
    partial_rollouts: bool = False
    dynamic_sampling: bool = False
    dynamic_sampling_max_rounds: int = 10
    overlong_filter: bool = False
    overlong_buffer: int | None = None
    overlong_penalty_factor: float = 1.0
    log_completions: int = 0

    def rules(self) -> list[Rule]:
        return [
            ("samples_per_prompt", is_int(self.samples_per_prompt) and self.samples_per_prompt >= 1,
             ">= 1"),
            ("max_staleness", is_int(self.max_staleness) and self.max_staleness >= 0,
             ">= 0 (0: on-policy; k: each update trains on a batch sampled k updates before)"),
            ("dynamic_sampling_max_rounds", self.dynamic_sampling_max_rounds >= 1,
             ">= 1 (prompt batches drawn in a row for one update)"),
            ("overlong_buffer", _optional_at_least(self.overlong_buffer, 1),
             ">= 1 token, or null (no soft overlong penalty)"),
            ("overlong_penalty_factor", non_negative(self.overlong_penalty_factor),
             ">= 0 and finite"),
            ("log_completions", is_int(self.log_completions) and self.log_completions >= 0,
             ">= 0 rollout steps (0: off)"),
        ]  # fmt: skip

    def check(self) -> None:
        if self.partial_rollouts and self.max_staleness < 1:
            raise ValueError(
                "rollout.partial_rollouts generates beside the update and pushes new weights "
                "into requests in flight, which needs rollout.max_staleness >= 1 (got "
                f"{self.max_staleness}). Fix: set rollout.max_staleness: 1 (or more), or "
                "rollout.partial_rollouts: false."
            )
        if self.dynamic_sampling and self.samples_per_prompt < 2:
            raise ValueError(
                "rollout.dynamic_sampling keeps groups whose rewards differ, and a group of "
                "rollout.samples_per_prompt=1 never differs. Fix: samples_per_prompt >= 2."
            )


@dataclass(frozen=True)
class AdvantageSettings(SettingsGroup):
    """How rewards become advantages (``model.init_args.advantage``).

    Args:
        estimator: ``gae`` (learned critic), ``grpo`` (group-normalised), ``rloo``
            (leave-one-out), ``reinforce_pp`` (REINFORCE++, arXiv 2501.03262: returns whitened
            over the batch) or ``reinforce_pp_baseline`` (the group mean subtracted first).
        scale_by_std: GRPO divides by the group std (false: mean-centring only, Dr. GRPO).
        eps: added to GRPO's group std (TRL uses 1e-4).
        whiten: whiten GAE advantages over the rollout.
        gamma: GAE's discount.
        lam: GAE's trace parameter.
    """

    GROUP = "advantage"
    FLAT_NAMES: ClassVar[dict[str, str]] = {
        "estimator": "advantage",
        "eps": "advantage_eps",
        "whiten": "whiten_advantages",
    }

    estimator: Advantage = "grpo"
    scale_by_std: bool = True
    eps: float = 1e-6
    whiten: bool = True
    gamma: float = 1.0
    lam: float = 1.0

    def rules(self) -> list[Rule]:
        return [
            ("eps", non_negative(self.eps), ">= 0 and finite"),
            ("gamma", 0 <= self.gamma <= 1, "in [0, 1]"),
            ("lam", 0 <= self.lam <= 1, "in [0, 1]"),
        ]

    @property
    def per_group(self) -> bool:
        """Whether the estimator compares samples of the same prompt (needs G >= 2)."""
        return self.estimator not in ("gae", "reinforce_pp")


@dataclass(frozen=True)
class PolicyLossSettings(SettingsGroup):
    """The clipped policy objective (``model.init_args.loss``).

    Args:
        policy_loss: ``ppo`` (token ratios) or ``gspo`` (one length-normalised ratio per
            sequence, clipped per sequence, arXiv 2507.18071; needs ``loss_agg:
            seq_mean_token_mean``; the paper clips at 3e-4 / 4e-4).
        clip_low: the ratio's lower bound is 1 - clip_low.
        clip_high: the ratio's upper bound is 1 + clip_high (DAPO's clip-higher: above clip_low).
        dual_clip: dual-clip constant c > 1 for negative advantages (null: off).
        loss_agg: per-token losses to one number: ``token_mean`` (DAPO),
            ``seq_mean_token_mean`` (GRPO), ``seq_mean_token_sum``, or ``seq_mean_token_sum_norm``
            (Dr. GRPO: token sums over sequences x ``loss_norm_length``).
        loss_norm_length: that constant (null: the engine's ``max_new_tokens``).
        gspo_weighting: how GSPO applies the factors that vary per token: ``token`` (GSPO-token,
            sec. 4.3: each token's term is weighted by its own ``mismatch`` weight and, with
            ``kl.ratio_correction``, its KL estimate by its own ratio ``pi / pi_old``) or
            ``sequence`` (TRL 1.16 with ``importance_sampling_level: sequence``: each sequence's
            term by the mean of its tokens' mismatch weights, the KL estimate by the sequence
            ratio ``exp(mean_t log(pi / pi_old))``). Needs ``policy_loss: gspo``.
    """

    GROUP = "loss"

    policy_loss: PolicyLoss = "ppo"
    clip_low: float = 0.2
    clip_high: float = 0.2
    dual_clip: float | None = None
    loss_agg: LossAggregation = "token_mean"
    loss_norm_length: int | None = None
    gspo_weighting: GSPOWeighting = "token"

    def rules(self) -> list[Rule]:
        return [
            ("clip_low", 0 < self.clip_low < 1, "in (0, 1): the ratio's lower bound 1 - clip_low"),
            ("clip_high", 0 < self.clip_high < math.inf, "> 0 and finite"),
            ("dual_clip", self.dual_clip is None or self.dual_clip > 1,
             "> 1 (it caps the loss of negative advantages at dual_clip x |A|), or null"),
            ("loss_norm_length", _optional_at_least(self.loss_norm_length, 1),
             ">= 1 (the constant of seq_mean_token_sum_norm), or null for max_new_tokens"),
        ]  # fmt: skip

    def check(self) -> None:
        if self.policy_loss == "gspo" and self.loss_agg != "seq_mean_token_mean":
            raise ValueError(
                f"loss.policy_loss='gspo' optimises one ratio per sequence, averaged over "
                f"sequences (arXiv 2507.18071 eq. 5), but loss.loss_agg={self.loss_agg!r} weighs "
                "sequences by their length. Fix: set loss.loss_agg: seq_mean_token_mean."
            )
        if self.gspo_weighting != "token" and self.policy_loss != "gspo":
            raise ValueError(
                f"loss.gspo_weighting={self.gspo_weighting!r} sets how GSPO's sequence ratio "
                f"meets per-token weights, and loss.policy_loss={self.policy_loss!r} has no "
                "sequence ratio. Fix: set loss.policy_loss: gspo, or leave loss.gspo_weighting "
                "at token."
            )


@dataclass(frozen=True)
class MismatchSettings(SettingsGroup):
    """The correction for the engine's log-probs ``mu`` against the trainer's ``pi_old``
    (``model.init_args.mismatch``); logged as ``rollout/mismatch_*`` whenever both exist.

    Args:
        correction: ``tis`` weights the loss by the ratio ``pi_old / mu`` truncated to
            [``floor``, ``cap``]; ``mask`` keeps the ratio as the weight inside [``low``,
            ``high``] and gives 0 outside (those tokens leave the loss); ``none``; ``auto``:
            ``tis`` with an engine of its own numerics (vLLM) when the trainer's old log-probs
            exist, else ``none``.
        level: ``token`` (one ratio per token) or ``sequence`` (one ratio per sequence, the
            product of its tokens' ratios, truncated or masked as a whole and weighting every
            token). With ``correction`` these are TRL 1.16's ``vllm_importance_sampling_mode``
            ``token_truncate`` / ``sequence_truncate`` (tis) and ``token_mask`` /
            ``sequence_mask`` (mask).
        cap: TIS's upper bound on the weight (TRL's ``vllm_importance_sampling_clip_max``).
        floor: TIS's lower bound on the weight (0: none; TRL's
            ``vllm_importance_sampling_clip_min`` in the truncate modes).
        low: the mask's lower bound (TRL's ``vllm_importance_sampling_clip_min`` in the mask
            modes; 0 for TRL's default None).
        high: the mask's upper bound (TRL's ``vllm_importance_sampling_clip_max``).
    """

    GROUP = "mismatch"
    FLAT_NAMES: ClassVar[dict[str, str]] = {
        "correction": "mismatch_correction",
        "cap": "mismatch_cap",
        "low": "mismatch_low",
        "high": "mismatch_high",
    }

    correction: MismatchCorrection = "auto"
    level: MismatchLevel = "token"
    cap: float = 2.0
    floor: float = 0.0
    low: float = 0.5
    high: float = 2.0

    def rules(self) -> list[Rule]:
        return [
            ("cap", 1 <= self.cap < math.inf,
             ">= 1 and finite (a cap below 1 would shrink every on-policy token's weight)"),
            ("floor", 0 <= self.floor < 1,
             "in [0, 1) (a floor of 1 or more would raise every on-policy token's weight)"),
            ("low", 0 <= self.low < 1, "in [0, 1)"),
            ("high", 1 < self.high < math.inf, "> 1 and finite"),
        ]  # fmt: skip


@dataclass(frozen=True)
class KLSettings(SettingsGroup):
    """The KL to a frozen reference (``model.init_args.kl``).

    Args:
        coef: its weight (0: no KL term and no reference model is loaded). The module keeps the
            value as the attribute ``kl_coef``, seeded from here, because the AdaptiveKL callback
            rewrites it during training.
        estimator: ``k1``, ``k2`` or ``k3`` (Schulman's estimators).
        placement: ``loss`` (GRPO style) or ``reward`` (InstructGPT style, per token).
        ratio_correction: multiply the in-loss estimate by ``pi / pi_old`` (unbiased under
            off-policy samples; TRL's ``use_bias_correction_kl``).
    """

    GROUP = "kl"
    FLAT_NAMES: ClassVar[dict[str, str]] = {
        "coef": "kl_coef",
        "estimator": "kl_estimator",
        "placement": "kl_in",
        "ratio_correction": "kl_ratio_correction",
    }

    coef: float = 0.0
    estimator: Estimator = "k3"
    placement: KLPlacement = "loss"
    ratio_correction: bool = False

    def rules(self) -> list[Rule]:
        return [
            ("coef", non_negative(self.coef),
             ">= 0 and finite (0 = no KL term and no reference model; a negative coefficient "
             "would reward drifting away from the reference)"),
        ]  # fmt: skip


@dataclass(frozen=True)
class CriticSettings(SettingsGroup):
    """The learned critic of GAE (``model.init_args.critic``).

    Args:
        kind: ``separate`` network or ``value_head`` on the policy trunk.
        model: where the separate critic starts from (null: the policy's ``model``).
        lr: the critic's learning rate (its own AdamW param group).
        vf_coef: weight of the value loss.
        value_clip: clip range of the value update around the rollout's values (null: off).
    """

    GROUP = "critic"
    FLAT_NAMES: ClassVar[dict[str, str]] = {
        "kind": "critic",
        "model": "critic_model",
        "lr": "critic_lr",
    }

    kind: CriticKind = "separate"
    model: str | None = None
    lr: float = 1e-5
    vf_coef: float = 0.5
    value_clip: float | None = 0.2

    def rules(self) -> list[Rule]:
        return [
            ("lr", 0 < self.lr < math.inf, "> 0 and finite"),
            ("vf_coef", non_negative(self.vf_coef), ">= 0 and finite"),
            ("value_clip", self.value_clip is None or self.value_clip > 0, "> 0, or null"),
        ]
