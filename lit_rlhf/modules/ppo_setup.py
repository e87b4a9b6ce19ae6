"""What ``PPOModule`` and ``GenerativeRewardModule`` share around the core: the multi-turn loop,
the refusal of settings a module would not read, the checks at ``setup`` and the networks (the
update's settings are checked by :class:`~lit_rlhf.training.PPOSettings`)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from lit_rlhf.envs import Environment
from lit_rlhf.models import load_tokenizer
from lit_rlhf.models.lora import check_quantize_supported
from lit_rlhf.plan.check import check_memory
from lit_rlhf.settings import EnvironmentSettings, RolloutSettings, SettingsGroup
from lit_rlhf.training import PolicyNetworks, build_policy_networks, check_trainable_precision
from lit_rlhf.training.multiturn import MultiTurnRollout
from lit_rlhf.training.teacher import check_teacher_tokenizer


def multiturn_rollout(
    environment: Environment | None, env: EnvironmentSettings, rollout: RolloutSettings
) -> MultiTurnRollout | None:
    """The multi-turn loop over ``environment`` with the ``env`` limits, or None
    (single-turn)."""
    if environment is None:
        return None
    clashes = [
        name
        for name, on in (
            ("rollout.dynamic_sampling", rollout.dynamic_sampling),
            ("rollout.overlong_filter", rollout.overlong_filter),
            ("rollout.overlong_buffer", rollout.overlong_buffer is not None),
            ("rollout.max_staleness > 0", rollout.max_staleness > 0),
        )
        if on
    ]
    if clashes:
        raise ValueError(
            f"environment (multi-turn rollouts) does not combine with {', '.join(clashes)} yet. "
            "Fix: unset those settings, or leave environment unset."
        )
    return MultiTurnRollout(environment, env)


def refuse_set_fields(
    module: str, group: SettingsGroup, fields: Iterable[str], why: str, fix: str
) -> None:
    """Refuse a non-default value of any of ``fields`` of ``group``: ``module`` does not read
    them (``why``), so they would do nothing."""
    default = type(group)()
    for name in fields:
        if getattr(group, name) != getattr(default, name):
            raise ValueError(
                f"{group.GROUP}.{name}: {module} does not read it ({why}), so it would do "
                f"nothing. Fix: {fix}"
            )


def check_unread(module: Any, environment: Environment | None) -> None:
    """PPOModule: the ``critic`` group without GAE, the ``env`` group without an environment
    and ``precision.reference_dtype`` without a reference are refused."""
    settings = module.settings
    if settings.critic_network is None:
        refuse_set_fields(
            "PPOModule", settings.critic, ("kind", "model", "lr", "vf_coef", "value_clip"),
            "there is no critic: advantage.estimator is not gae",
            "remove the critic settings, or set advantage.estimator: gae.",
        )  # fmt: skip
    if environment is None:
        refuse_set_fields(
            "PPOModule", module.env,
            ("max_turns", "max_turn_tokens", "max_episode_tokens", "step_timeout",
             "budget_penalty"),
            "there is no environment: rollouts are single-turn",
            "remove the env settings, or set model.init_args.environment.",
        )  # fmt: skip
    module.lora.check_reference_dtype(module.precision.reference_dtype, separate=False)
    frozen = module.kl_coef > 0 or settings.distill.enabled  # a reference or a teacher
    module.precision.refuse_unread("PPOModule", reference=frozen, checkpointing=True)


def check_fit_setup(module: Any) -> None:
    """``setup("fit")``, before any network loads: trainable weights are not stepped in 16
    bits without float32 masters, QLoRA's 4-bit base has what it needs, and the memory plan
    fits the GPU."""
    check_trainable_precision(module.trainer, {"precision.dtype": module.precision.dtype})
    check_quantize_supported(module.lora.quantize)
    check_memory(module)  # the memory plan on CUDA (precision.memory_check)


def build_networks(
    module: Any, strategy: Any, *, critic: str | None = None, critic_model: str | None = None
) -> PolicyNetworks:
    """The module's policy (LoRA-wrapped), ``critic``, frozen reference (with a KL) and
    distillation teacher (unless the module's ``teacher`` is set already; its tokenizer is
    checked against the student's either way), and its tokenizer when none was given."""
    model = module.hparams.model
    if module.tokenizer is None:
        module.tokenizer = load_tokenizer(model)
    teacher = module.settings.distill.teacher
    if teacher is not None:
        check_teacher_tokenizer(
            module.tokenizer, load_tokenizer(teacher), student=model, teacher=teacher
        )
    return build_policy_networks(
        model,
        strategy=strategy,
        precision=module.precision,
        critic=critic,
        critic_model=critic_model,
        reference=module.kl_coef > 0,
        lora=module.lora,
        teacher=teacher if getattr(module, "teacher", None) is None else None,
    )
