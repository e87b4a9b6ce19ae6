"""Pure tensor math of RL fine-tuning: masking, advantages (GAE, GRPO, RLOO, REINFORCE++), KL,
on-policy distillation's per-token reward, PPO and GSPO losses, DAPO's dynamic-sampling filter
and overlong penalty, the importance weights that correct for the rollout engine's numerics (TIS
and its masked variant), entropy, trust-region entropy and the exploration baselines it is
compared with; reading a generative judge's verdict, ConsistRM's label-free consistency rewards,
ReflectRM's reflective vote, modular gradient surgery (PCGrad per parameter group), the offline
preference losses (DPO, IPO, SimPO), and the warmup + constant / linear / cosine schedule of loss
coefficients and learning rates.

Depends on torch and the standard library only (no Lightning, no transformers), so it can be
reused or tested anywhere.
Mask convention: bool, True = the token counts.
"""

from lit_rlhf.algos.advantages import (
    gae,
    group_advantages,
    reinforce_pp_advantages,
    rloo_advantages,
    token_level_rewards,
)
from lit_rlhf.algos.consistency import answer_rewards, critique_bonus, pseudo_label, update_memory
from lit_rlhf.algos.dapo import informative_groups, overlong_penalty, truncated_responses
from lit_rlhf.algos.distill import distill_advantages
from lit_rlhf.algos.entropy import entropy_and_top1, entropy_from_logits, token_log_probs
from lit_rlhf.algos.exploration import forking_token_mask, kl_cov_penalty, kl_cov_selection
from lit_rlhf.algos.gradient_surgery import (
    SurgeryStats,
    group_parameters,
    project_conflicting,
    projected_task_gradients,
    surgery,
)
from lit_rlhf.algos.judge import (
    JUDGE_TAGS,
    JudgeFormat,
    analysis_text,
    critique_text,
    judge_format_ok,
    judge_verdict,
    parse_verdict,
)
from lit_rlhf.algos.kl import AdaptiveKLController, KLEstimator, kl_penalty
from lit_rlhf.algos.masking import masked_mean, masked_sum, masked_var, masked_whiten
from lit_rlhf.algos.mismatch import (
    ImportanceLevel,
    importance_log_ratios,
    importance_weights,
    masked_importance_weights,
    mismatch_stats,
    sequence_mean_weights,
    truncated_importance_weights,
)
from lit_rlhf.algos.ppo_losses import (
    AggregationMode,
    PolicyLossStats,
    ValueLossStats,
    aggregate_loss,
    clipped_policy_loss,
    clipped_value_loss,
    explained_variance,
    gspo_policy_loss,
)
from lit_rlhf.algos.preference import PreferenceRewards, dpo_loss, ipo_loss, simpo_loss
from lit_rlhf.algos.reflection import confidence, reflective_vote, select_anchor
from lit_rlhf.algos.schedules import CoefficientSchedule, ScheduleKind
from lit_rlhf.algos.trust_region import TrustRegionMode, trust_region_entropy, trust_region_mass

__all__ = [
    "JUDGE_TAGS",
    "AdaptiveKLController",
    "AggregationMode",
    "CoefficientSchedule",
    "ImportanceLevel",
    "JudgeFormat",
    "KLEstimator",
    "PolicyLossStats",
    "PreferenceRewards",
    "ScheduleKind",
    "SurgeryStats",
    "TrustRegionMode",
    "ValueLossStats",
    "aggregate_loss",
    "analysis_text",
    "answer_rewards",
    "clipped_policy_loss",
    "clipped_value_loss",
    "confidence",
    "critique_bonus",
    "critique_text",
    "distill_advantages",
    "dpo_loss",
    "entropy_and_top1",
    "entropy_from_logits",
    "explained_variance",
    "forking_token_mask",
    "gae",
    "group_advantages",
    "group_parameters",
    "gspo_policy_loss",
    "importance_log_ratios",
    "importance_weights",
    "informative_groups",
    "ipo_loss",
    "judge_format_ok",
    "judge_verdict",
    "kl_cov_penalty",
    "kl_cov_selection",
    "kl_penalty",
    "masked_importance_weights",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "mismatch_stats",
    "overlong_penalty",
    "parse_verdict",
    "project_conflicting",
    "projected_task_gradients",
    "pseudo_label",
    "reflective_vote",
    "reinforce_pp_advantages",
    "rloo_advantages",
    "select_anchor",
    "sequence_mean_weights",
    "simpo_loss",
    "surgery",
    "token_level_rewards",
    "token_log_probs",
    "truncated_importance_weights",
    "truncated_responses",
    "trust_region_entropy",
    "trust_region_mass",
    "update_memory",
]
