"""One policy-optimisation step (rollout -> experience -> clipped updates -> logs) as a component
that every RL module composes: ``PPOModule`` on task prompts, ``GenerativeRewardModule`` on
judge prompts. The module keeps the networks and the training counters; this keeps the
settings, the rollout collector, the optimizer step and the mini-batch shuffling.

The module must have: ``policy``, ``critic`` (None without GAE), ``ref_policy`` (None without a
KL), ``tokenizer``, a float ``kl_coef`` (an adaptive controller may move it) and an int
``rollout_step``; it uses manual optimisation with one optimizer.
"""

from __future__ import annotations

from functools import partial
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.models.checkpoint_weights import check_checkpoint_weights
from lit_rlhf.models.loading import context_length
from lit_rlhf.training.experience import build_experience, experience_stats
from lit_rlhf.training.frozen import FrozenModules
from lit_rlhf.training.lr_schedule import LRScheduleSettings
from lit_rlhf.training.optimization import OptimizerStep
from lit_rlhf.training.ppo_update import PPOUpdate
from lit_rlhf.training.protocols import policy_loss_terms
from lit_rlhf.training.rollouts import RolloutCollector, rollout_stats
from lit_rlhf.training.settings import PPOSettings
from lit_rlhf.types import Experience, Rollout

# the module settings that decide which networks a checkpoint's weights belong to
_NETWORK_SETTINGS = ("model", "advantage", "critic", "critic_model")


class PolicyStep:
    """Args:
    settings: the update's settings.
    collector: engine + reward (+ the trainer's reward-term callbacks).
    max_grad_norm: gradient clipping (None: off).
    clip_grad_per_group: clip each param group (network) to ``max_grad_norm`` on its own
        (:class:`OptimizerStep`); default: the joint norm.
    seed: seeds the mini-batch shuffling (checkpointed through ``state_dict``).
    max_consecutive_skips: non-finite optimizer steps in a row that stop the run
        (:class:`OptimizerStep`; its skip counters are checkpointed).
    lr_schedule: the learning-rate schedule (None: constant); once per rollout batch or per
        optimizer step (``lr_interval``), checkpointed with the optimizer step's counters.
    """

    def __init__(
        self,
        settings: PPOSettings,
        collector: RolloutCollector,
        *,
        max_grad_norm: float | None,
        seed: int = 0,
        max_consecutive_skips: int = 5,
        lr_schedule: LRScheduleSettings | None = None,
        clip_grad_per_group: bool = False,
    ) -> None:
        self.settings = settings
        self.collector = collector
        self.step_optimizer = OptimizerStep(
            max_grad_norm=max_grad_norm,
            norm_key="ppo/grad_norm",
            max_consecutive_skips=max_consecutive_skips,
            lr_schedule=lr_schedule,
            clip_grad_per_group=clip_grad_per_group,
        )
        self.shuffle = torch.Generator().manual_seed(seed)
        self.frozen = FrozenModules("ref_policy")
        self.logged_keys: set[str] = set()  # every step metric logged so far

    def check_data(self, module: Any) -> None:
        """``LightningModule.setup`` (before ``configure_model`` loads any network): the data's
        batch size against ``mini_batch_size``, and its longest prompt plus the engine's
        ``max_new_tokens`` against the model's context."""
        data = getattr(module.trainer, "datamodule", None)
        batch_size = getattr(data, "batch_size", None)
        if isinstance(batch_size, int):
            self.settings.check_rollout_size(batch_size)
        longest = getattr(data, "longest_prompt", 0)
        new_tokens = getattr(self.collector.engine, "max_new_tokens", None)
        if not (isinstance(longest, int) and longest > 0 and isinstance(new_tokens, int)):
            return
        context = context_length(module.hparams.model)
        if context is not None and longest + new_tokens > context:
            raise ValueError(
                f"the longest prompt has {longest} tokens and the engine generates up to "
                f"max_new_tokens={new_tokens}: {longest + new_tokens} positions, more than the "
                f"{context} of {module.hparams.model!r} (max_position_embeddings). Fix: lower "
                "data.init_args.max_prompt_length (longer prompts are dropped) or the engine's "
                "max_new_tokens."
            )

    def collect(self, module: Any, batch: dict[str, Any]) -> Rollout:
        """G sampled responses per prompt, scored by the reward and the reward-term callbacks.
        The engine is asked for the sampled tokens' log-probs only if something reads them."""
        g = self.settings.samples_per_prompt
        return self.collector.collect(
            module.policy,
            module.tokenizer,
            batch,
            samples_per_prompt=g,
            log_probs=self.needs_sample_log_probs(module, len(batch["prompt"]) * g),
            trainer=module.trainer,
            module=module,
        )

    def needs_sample_log_probs(self, module: Any, n: int) -> bool:
        """Whether the engine's log-probs are read: with several updates per rollout (the ratio's
        denominator) or a KL penalty in the reward (computed before the update), unless they are
        recomputed anyway. With one update and the KL in the loss, the update fills
        ``experience.old_log_probs`` from its own forward (read by ``rollout/kl``, the KL
        controller)."""
        if self.settings.recompute_old_log_probs:
            return False  # build_experience computes them with the training forward
        kl_in_reward = module.kl_coef > 0 and self.settings.kl_in == "reward"
        return kl_in_reward or not self.settings.single_update(n)

    def prepare(self, module: Any, rollout: Rollout) -> Experience:
        """Old log-probs, reference log-probs, values and advantages for the whole rollout."""
        return build_experience(
            rollout,
            policy=module.policy,
            settings=self.settings,
            temperature=self.collector.engine.temperature,
            kl_coef=module.kl_coef,
            critic=module.critic,
            ref_policy=module.ref_policy,
            use_current_as_old=self.settings.single_update(len(rollout)),
        )

    def optimize(self, module: Any, experience: Experience) -> dict[str, Tensor]:
        """``ppo_epochs`` passes of clipped updates over mini-batches of the experience; the
        engine serves the new weights after every optimizer step."""
        engine = self.collector.engine
        update = PPOUpdate(
            module.policy,
            self.settings,
            experience,
            temperature=engine.temperature,
            kl_coef=module.kl_coef,
            critic=module.critic,
            loss_terms=partial(policy_loss_terms, module.trainer, module),
            use_current_as_old=self.settings.single_update(len(experience)),
            step=module.rollout_step,
        )
        return update.run(
            module,
            module.optimizers(),
            self.step_optimizer,
            generator=self.shuffle,
            after_step=lambda: engine.sync_weights(module.policy),
        )

    def log(
        self, module: Any, experience: Experience, update_stats: dict[str, Tensor]
    ) -> dict[str, Any]:
        """Log the rollout's and the update's statistics through ``module.log``; returns what
        callbacks read (``reward``, and ``kl`` with ``num_sequences`` for the adaptive KL)."""
        n = len(experience)
        stats = {**rollout_stats(experience.rollout), **experience_stats(experience)}
        stats.update(update_stats)
        stats["rollout/step"] = torch.tensor(float(module.rollout_step))
        stats["ppo/kl_coef"] = torch.tensor(float(module.kl_coef))
        # Lightning re-logs a step metric's last value at later steps that do not log it; a key
        # logged before and absent now (a domain missing from this batch) is logged as NaN
        for key in self.logged_keys - stats.keys():
            stats[key] = torch.tensor(float("nan"))
        self.logged_keys |= stats.keys()
        module.log_dict({k: v.float() for k, v in stats.items()}, on_step=True, batch_size=n)
        module.log("reward", stats["reward/mean"], prog_bar=True, logger=False, batch_size=n)
        if "rollout/kl" in stats:
            module.log("kl", stats["rollout/kl"], prog_bar=True, logger=False, batch_size=n)
        return {
            "reward": stats["reward/mean"].detach(),
            "kl": stats.get("rollout/kl", torch.tensor(0.0)),
            "num_sequences": torch.tensor(n),
        }

    def save(self, module: Any, checkpoint: dict[str, Any]) -> None:
        """``on_save_checkpoint``: the counters (rollouts, skipped optimizer steps, the lr
        schedule's), the KL coefficient, the shuffling state and a stateful reward's
        ``state_dict()`` go into the checkpoint; the frozen reference (the starting model,
        reloaded on every start) does not."""
        checkpoint["lit_rlhf"] = {
            "rollout_step": module.rollout_step,
            "kl_coef": module.kl_coef,
            "shuffle_rng": self.shuffle.get_state(),
            "optimizer_step": self.step_optimizer.state_dict(),
        }
        reward_state = getattr(self.collector.reward, "state_dict", None)
        if callable(reward_state):  # a stateful reward (e.g. ScalarRMReward's running mean)
            checkpoint["lit_rlhf"]["reward"] = reward_state()
        self.frozen.drop(checkpoint)

    def load(self, module: Any, checkpoint: dict[str, Any]) -> None:
        """``on_load_checkpoint``: the reverse of :meth:`save` (the reference's weights are put
        back into the state dict, so strict loading finds every key). A checkpoint of other
        networks (another ``model``) is refused with both models named."""
        self.frozen.restore(module, checkpoint)
        check_checkpoint_weights(module, checkpoint, settings=_NETWORK_SETTINGS)
        state = checkpoint.get("lit_rlhf", {})
        module.rollout_step = state.get("rollout_step", 0)
        module.kl_coef = state.get("kl_coef", module.kl_coef)
        if "shuffle_rng" in state:
            self.shuffle.set_state(state["shuffle_rng"])
        self.step_optimizer.load_state_dict(state.get("optimizer_step", {}))
        restore = getattr(self.collector.reward, "load_state_dict", None)
        if "reward" in state and callable(restore):
            restore(state["reward"])

    def close(self) -> None:
        """Release what the generation engine holds outside PyTorch (a vLLM instance); engines
        without such resources have no ``close``."""
        close = getattr(self.collector.engine, "close", None)
        if callable(close):
            close()
