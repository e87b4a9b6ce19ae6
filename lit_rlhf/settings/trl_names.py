"""TRL's ``GRPOConfig`` names and the lit-rlhf ``PPOModule`` settings they map to: the one place
the mapping lives. The CLI answers a TRL name given as a module setting with its lit-rlhf
setting (:mod:`lit_rlhf.cli.suggest`); docs/algorithms.md's table "From TRL's GRPOConfig to
lit-rlhf" is checked against it (``tests/settings/test_trl_names.py``)."""

from __future__ import annotations

# TRL name -> (lit-rlhf setting under model.init_args, what else to know)
TRL_NAMES: dict[str, tuple[str, str]] = {
    "num_generations": ("rollout.samples_per_prompt", ""),
    "beta": ("kl.coef", "with kl.placement: loss and kl.estimator: k3, as TRL computes it"),
    "epsilon": ("loss.clip_low", ""),
    "epsilon_high": ("loss.clip_high", ""),
    "num_iterations": ("update.ppo_epochs", ""),
    "loss_type": (
        "loss.loss_agg",
        "grpo: seq_mean_token_mean, dapo: token_mean, dr_grpo: seq_mean_token_sum_norm",
    ),
    "scale_rewards": ("advantage.scale_by_std", "true: per group, false: none"),
    "mask_truncated_completions": ("rollout.overlong_filter", ""),
    "use_bias_correction_kl": ("kl.ratio_correction", ""),
    "importance_sampling_level": ("loss.policy_loss", "sequence: gspo"),
    "vllm_importance_sampling_correction": ("mismatch.correction", "false: none"),
    "vllm_importance_sampling_mode": ("mismatch.correction", "with mismatch.level"),
    "vllm_importance_sampling_clip_max": ("mismatch.cap", "mismatch.high for the mask modes"),
    "vllm_importance_sampling_clip_min": ("mismatch.floor", "mismatch.low for the mask modes"),
    "vllm_importance_sampling_cap": ("mismatch.cap", "mismatch.high for the mask modes"),
    "temperature": ("engine.init_args.temperature", "a setting of the engine"),
    "top_p": ("engine.init_args.top_p", "a setting of the engine"),
    "top_k": ("engine.init_args.top_k", "a setting of the engine"),
    "max_completion_length": ("engine.init_args.max_new_tokens", "a setting of the engine"),
    "learning_rate": ("optim.lr", ""),
}


def trl_pointer(name: str) -> str | None:
    """The fix for a TRL name given as a lit-rlhf setting (None: not a TRL name)."""
    if name not in TRL_NAMES:
        return None
    target, note = TRL_NAMES[name]
    extra = f" ({note})" if note else ""
    return (
        f"{name!r} is TRL's name; lit-rlhf's is model.init_args.{target}{extra}: docs/"
        "algorithms.md maps TRL's GRPOConfig."
    )
