"""The settings of a PPO-family update, as one typed, frozen, validated record.

Modules take the settings groups of :mod:`lit_rlhf.settings` (``update``, ``rollout``,
``advantage``, ``loss``, ``mismatch``, ``kl``, ``critic``, ``optim``, ``distill``) and hand them
to the core as one :class:`PPOSettings`. Each group checks its own fields when it is built; this
record checks the combinations across groups, so a bad combination fails when the module is
built, before any model loads, with a message that names the dotted keys and the fix.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

from lightning.pytorch.utilities import rank_zero_info

from lit_rlhf.settings import (
    AdvantageSettings,
    CriticSettings,
    DistillSettings,
    KLSettings,
    MismatchSettings,
    OptimSettings,
    PolicyLossSettings,
    RolloutSettings,
    UpdateSettings,
)
from lit_rlhf.settings.policy import LossAggregation


@dataclass(frozen=True)
class PPOSettings:
    """The groups the rollout, the advantage estimation and the clipped update read (see each
    group's class for the meaning of its fields; the defaults are the groups' own). ``optim`` is
    the optimisation step's group (its ``micro_batch_size`` cuts the padded micro-batches)."""

    update: UpdateSettings = field(default_factory=UpdateSettings)
    rollout: RolloutSettings = field(default_factory=RolloutSettings)
    advantage: AdvantageSettings = field(default_factory=AdvantageSettings)
    loss: PolicyLossSettings = field(default_factory=PolicyLossSettings)
    mismatch: MismatchSettings = field(default_factory=MismatchSettings)
    kl: KLSettings = field(default_factory=KLSettings)
    critic: CriticSettings = field(default_factory=CriticSettings)
    optim: OptimSettings = field(default_factory=OptimSettings)
    distill: DistillSettings = field(default_factory=DistillSettings)

    def __post_init__(self) -> None:
        self._check_combinations()

    @classmethod
    def of(cls, groups: Mapping[str, Any]) -> PPOSettings:
        """The record from a module's groups by argument name (:func:`take_groups`); groups it
        does not hold (``precision``, ``env``, ...) are left out, absent ones take defaults."""
        names = {f.name for f in fields(cls)}
        return cls(**{name: group for name, group in groups.items() if name in names})

    def _check_combinations(self) -> None:
        correction = self.mismatch.correction
        if correction in ("tis", "mask") and not self.trainer_old_log_probs:
            raise ValueError(
                f"mismatch.correction={correction!r} compares the engine's log-probs with the "
                "trainer's, but with several updates per rollout the trainer's old log-probs are "
                "not computed. Fix: set update.recompute_old_log_probs: true (or one update per "
                "rollout: update.ppo_epochs 1, update.mini_batch_size null)."
            )
        self._check_staleness()
        g = self.rollout.samples_per_prompt
        if self.advantage.per_group and g < 2 and not self.distill.pure:
            raise ValueError(
                f"advantage.estimator={self.advantage.estimator!r} compares samples of the same "
                f"prompt, and rollout.samples_per_prompt={g} gives one. Fix: set "
                "rollout.samples_per_prompt >= 2, or advantage.estimator: gae with a critic."
            )

    def _check_staleness(self) -> None:
        staleness = self.rollout.max_staleness
        if staleness == 0:
            return
        problem = fix = ""
        if not self.trainer_old_log_probs:
            problem = (
                "clips against the proximal policy (the weights before the update), whose "
                "log-probs the trainer computes only with one update per rollout or "
                "update.recompute_old_log_probs"
            )
            fix = (
                "set update.recompute_old_log_probs: true (or update.ppo_epochs 1, "
                "update.mini_batch_size null)"
            )
        elif self.mismatch.correction == "none":
            problem = (
                "samples from older weights, and mismatch.correction='none' would drop the "
                "importance weight pi_prox / mu that corrects for them (the update would be "
                "silently off-policy)"
            )
            fix = "set mismatch.correction: tis (or auto, or mask)"
        elif self.rollout.dynamic_sampling:
            problem = "does not combine with rollout.dynamic_sampling yet"
            fix = "set rollout.dynamic_sampling: false, or rollout.max_staleness: 0"
        if problem:
            raise ValueError(
                f"rollout.max_staleness={staleness} (decoupled PPO, arXiv 2505.24298) "
                f"{problem}. Fix: {fix}."
            )

    def per_process(self, world_size: int, log: bool = False) -> PPOSettings:
        """The record with ``update.global_mini_batch_size`` resolved into this process's
        ``update.mini_batch_size`` among ``world_size`` processes (``setup``; ``log``: one line
        on rank 0 saying so)."""
        g, total = self.rollout.samples_per_prompt, self.update.global_mini_batch_size
        update = self.update.per_process(world_size, g)
        if update is self.update:
            return self
        if log and total is not None:
            rank_zero_info(
                f"update.global_mini_batch_size={total} prompts: {update.mini_batch_size} "
                f"sequences ({total // world_size} prompts x {g} samples) per optimizer step on "
                f"each of {world_size} process{'es' if world_size > 1 else ''}"
            )
        return replace(self, update=update)

    def check_rollout_size(self, prompts_per_batch: int) -> None:
        """Refuse an ``update.mini_batch_size`` that does not divide the rollout of one batch of
        ``prompts_per_batch`` prompts (each epoch would end with a smaller optimizer step)."""
        g = self.rollout.samples_per_prompt
        n, size = prompts_per_batch * g, self.update.mini_batch_size
        if size is None or n % size == 0:
            return
        divisors = [d for d in range(1, n + 1) if n % d == 0 and d < n]
        raise ValueError(
            f"update.mini_batch_size={size} does not divide the rollout of {prompts_per_batch} "
            f"prompts x rollout.samples_per_prompt={g} = {n} sequences: every PPO epoch would "
            f"end with a step on {n % size if size < n else n}. Fix: set "
            f"model.init_args.update.mini_batch_size to a divisor of {n} (e.g. "
            f"{divisors[-1] if divisors else n}), or null for one step per rollout, or change "
            "data.init_args.batch_size (per process; global sizes: update.global_mini_batch_size "
            "and data.init_args.global_batch_size, both in prompts)."
        )

    @property
    def recompute(self) -> bool:
        """Whether the rollout's log-probs are recomputed with a trainer forward
        (``update.recompute_old_log_probs``)."""
        return self.update.recompute_old_log_probs

    @property
    def trainer_old_log_probs(self) -> bool:
        """Whether the update's old log-probs come from the trainer's own forward (recomputed,
        or the current policy's when every rollout gets exactly one update)."""
        one_update = self.update.ppo_epochs == 1 and self.update.whole_rollout
        return self.recompute or one_update

    def update_size(self, n: int) -> int:
        """Sequences per optimizer step for a rollout of ``n`` sequences."""
        return self.update.mini_batch_size or n

    def single_update(self, n: int) -> bool:
        """Whether a rollout of ``n`` sequences gets exactly one optimizer step: the rollout
        policy *is* the current policy then, so its log-probs are the current ones, detached
        (exact ratio 1, no extra forward pass)."""
        return self.update.ppo_epochs == 1 and self.update_size(n) >= n and not self.recompute

    @property
    def kl_in_reward(self) -> bool:
        """Whether the KL enters the reward (``kl.placement: reward``) rather than the loss."""
        return self.kl.placement == "reward"

    @property
    def value_head(self) -> bool:
        """Whether a GAE critic is a value head on the policy's hidden states."""
        return self.critic_network == "value_head"

    @property
    def critic_network(self) -> str | None:
        """The critic to build: ``critic.kind`` with GAE, else None (no critic)."""
        return self.critic.kind if self.advantage.estimator == "gae" else None

    @property
    def aggregation(self) -> LossAggregation:
        """How per-token losses become one number (``loss.loss_agg``)."""
        return self.loss.loss_agg

    def norm_length(self, engine: object) -> int | None:
        """The constant of ``loss.loss_agg: seq_mean_token_sum_norm``: ``loss.loss_norm_length``,
        else the engine's ``max_new_tokens``; None for the other aggregations."""
        if self.aggregation != "seq_mean_token_sum_norm":
            return None
        length = self.loss.loss_norm_length or getattr(engine, "max_new_tokens", None)
        if not isinstance(length, int):
            raise ValueError(
                "loss.loss_agg='seq_mean_token_sum_norm' divides by the maximum response length, "
                f"but the engine {type(engine).__name__} has no max_new_tokens. Fix: set "
                "model.init_args.loss.loss_norm_length."
            )
        return length

    @property
    def packed(self) -> int | None:
        """The token budget of packed micro-batches (``update.micro_batch_tokens``); None:
        padded micro-batches of ``optim.micro_batch_size`` sequences."""
        return self.update.micro_batch_tokens
