"""``PPOModule``'s own settings, checked when the module is built (before any model loads):
the ranges of the module-level settings and the multi-turn loop's (the update's are checked by
:class:`~lit_rlhf.training.PPOSettings`)."""

from __future__ import annotations

import math
from typing import Any

from lit_rlhf.envs import Environment
from lit_rlhf.training.multiturn import MultiTurnRollout, MultiTurnSettings
from lit_rlhf.training.settings import module_setting_rules, refuse_out_of_range


def multiturn_rollout(environment: Environment | None, hparams: Any) -> MultiTurnRollout | None:
    """The multi-turn loop over ``environment`` (validated), or None (single-turn)."""
    settings = MultiTurnSettings(
        max_turns=hparams.max_turns,
        max_turn_tokens=hparams.max_turn_tokens,
        max_episode_tokens=hparams.max_episode_tokens,
        env_step_timeout=hparams.env_step_timeout,
        budget_penalty=hparams.budget_penalty,
    )
    settings.check()
    if environment is None:
        return None
    clashes = [name for name in ("dynamic_sampling", "overlong_filter") if hparams[name]]
    clashes += ["overlong_buffer"] if hparams.overlong_buffer is not None else []
    clashes += ["max_staleness > 0"] if hparams.get("max_staleness", 0) > 0 else []
    if clashes:
        raise ValueError(
            f"environment (multi-turn rollouts) does not combine with {', '.join(clashes)} yet. "
            "Fix: unset those settings, or leave environment unset."
        )
    return MultiTurnRollout(environment, settings)


def check_module_settings(hparams: Any) -> None:
    """The module's own settings (the update's are checked by ``PPOSettings``)."""
    threshold = hparams.pass_threshold
    rules = [
        *module_setting_rules(hparams),
        ("pass_threshold", math.isfinite(threshold), "finite"),
        ("val_samples", hparams.val_samples >= 1, ">= 1 (1: greedy / one sample only)"),
    ]
    refuse_out_of_range(rules, hparams)
