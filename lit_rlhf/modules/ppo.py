"""PPO / GRPO / RLOO for causal LMs inside Lightning's own ``Trainer.fit`` loop.

One ``training_step`` = one rollout batch: collect G samples per prompt -> score -> advantages ->
``ppo_epochs`` x mini-batches of clipped updates (manual optimisation, micro-batch accumulation)
-> log. ``trainer.global_step`` therefore counts optimizer steps; ``rollout/step`` counts rollouts.

References: PPO (arXiv 1707.06347), PPO for LMs (Ziegler et al., arXiv 1909.08593), GRPO
(arXiv 2402.03300), RLOO (arXiv 2402.14740).
"""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import torch
from lightning import LightningModule
from torch import Tensor
from torchmetrics import MeanMetric

from lit_rlhf.algos import explained_variance, kl_penalty
from lit_rlhf.models import CriticModel, ValueHead, load_causal_lm, load_tokenizer
from lit_rlhf.models.loading import Dtype
from lit_rlhf.rewards.base import RewardFunction
from lit_rlhf.rollout.base import GenerationEngine
from lit_rlhf.rollout.hf import HFGenerationEngine
from lit_rlhf.strategies import transformers_zero3_context
from lit_rlhf.training import (
    FrozenModules,
    OptimizerStep,
    PPOSettings,
    PPOUpdate,
    RolloutCollector,
    build_experience,
    freeze,
    minibatches,
    policy_loss_terms,
)
from lit_rlhf.types import Experience, Rollout


class PPOModule(LightningModule):
    """Policy optimisation with a learned critic (``advantage="gae"``) or critic-free group
    baselines (``"grpo"``, ``"rloo"``).

    Args:
        model: policy to train: hub id, local folder, or ``builtin:<name>``.
        reward: the reward function (any :class:`RewardFunction`, injected by class path).
        engine: generation engine; default :class:`HFGenerationEngine` with its defaults.
        tokenizer: a tokenizer object; the CLI links the DataModule's. ``None`` loads ``model``'s.
        samples_per_prompt: G, responses sampled per prompt.
        advantage: ``gae`` (critic), ``grpo`` (group-normalised), ``rloo`` (leave-one-out).
        scale_by_std: GRPO divides by the group std (False: mean-centring only, Dr. GRPO).
        whiten_advantages: whiten GAE advantages over the rollout.
        gamma, lam: GAE discount and trace parameters.
        critic: ``separate`` network or ``value_head`` on the policy trunk (GAE only).
        critic_model: where the separate critic starts from (default: ``model``).
        ppo_epochs: passes over each rollout.
        mini_batch_size: sequences per optimizer step (default: the whole rollout).
        micro_batch_size: sequences per forward/backward (gradient accumulation inside a
            mini-batch; the result equals one pass over the mini-batch).
        clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high].
        dual_clip: dual-clip constant c > 1 for negative advantages (None: off).
        value_clip: critic value clip (None: off). vf_coef: weight of the value loss.
        loss_agg: how per-token losses become one number.
        kl_coef: weight of the KL to a frozen reference (0 = no reference model is loaded).
        kl_estimator: k1, k2 or k3. kl_in: ``loss`` (GRPO style) or ``reward`` (InstructGPT style).
        lr, critic_lr, weight_decay, max_grad_norm: AdamW and clipping settings (one optimizer,
            two param groups, so DeepSpeed accepts it; under DeepSpeed, ``max_grad_norm`` becomes
            its ``gradient_clipping``).
        dtype: weight dtype of the networks.
        recompute_old_log_probs: recompute rollout log-probs with a forward pass instead of
            trusting the engine's (use with engines whose numerics differ, e.g. vLLM).
        gradient_checkpointing: trade compute for activation memory.
        val_greedy: greedy decoding for validation pass@1 (else sampled with the engine).
        pass_metric: the reward-info key that decides whether a validation / test sample passes
            (pass@1), e.g. ``correct``; ``None`` uses the score itself.
        pass_threshold: a sample passes when that value is >= this threshold.
        seed: seeds the mini-batch shuffling.

    The update settings are validated into a :class:`~lit_rlhf.training.PPOSettings` when the
    module is built (before any model loads).
    """

    def __init__(
        self,
        reward: RewardFunction,
        model: str = "builtin:tiny-llama",
        engine: GenerationEngine | None = None,
        tokenizer: Any = None,
        samples_per_prompt: int = 4,
        advantage: Literal["gae", "grpo", "rloo"] = "grpo",
        scale_by_std: bool = True,
        whiten_advantages: bool = True,
        gamma: float = 1.0,
        lam: float = 1.0,
        critic: Literal["separate", "value_head"] = "separate",
        critic_model: str | None = None,
        ppo_epochs: int = 1,
        mini_batch_size: int | None = None,
        micro_batch_size: int = 8,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = None,
        value_clip: float | None = 0.2,
        vf_coef: float = 0.5,
        loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = "token_mean",
        kl_coef: float = 0.0,
        kl_estimator: Literal["k1", "k2", "k3"] = "k3",
        kl_in: Literal["loss", "reward"] = "loss",
        lr: float = 1e-6,
        critic_lr: float = 1e-5,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        dtype: Dtype = "float32",
        recompute_old_log_probs: bool = False,
        gradient_checkpointing: bool = False,
        val_greedy: bool = True,
        pass_metric: str | None = None,
        pass_threshold: float = 1.0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["reward", "engine", "tokenizer"])
        self.settings = PPOSettings.from_hparams(self.hparams)  # validates
        _check_module_settings(self.hparams)
        self.automatic_optimization = False
        self.engine: GenerationEngine = engine or HFGenerationEngine()
        self.rollouts = RolloutCollector(self.engine, reward)
        self.reward_fn = reward
        self.step_optimizer = OptimizerStep(max_grad_norm=max_grad_norm, norm_key="ppo/grad_norm")
        self.frozen = FrozenModules("ref_policy")
        self.tokenizer = tokenizer
        self.kl_coef = float(kl_coef)  # a plain attribute: the AdaptiveKL callback rewrites it
        self.rollout_step = 0
        self.policy: Any = None
        self.critic: Any = None
        self.ref_policy: Any = None
        self._shuffle = torch.Generator().manual_seed(seed)
        self.val_reward, self.val_pass = MeanMetric(), MeanMetric()
        self.test_reward, self.test_pass = MeanMetric(), MeanMetric()

    @property
    def hp(self) -> Any:
        """``self.hparams`` with attribute access typed loosely (it is an AttributeDict)."""
        return self.hparams

    # ----------------------------------------------------------------- setup
    def configure_model(self) -> None:
        strategy = self._trainer.strategy if self._trainer is not None else None
        # under DeepSpeed, clipping is DeepSpeed's own (Lightning's clip_gradients is a no-op)
        self.step_optimizer.configure(strategy)
        if self.policy is not None:
            return
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(self.hp.model)
        with transformers_zero3_context(strategy):  # ZeRO-3: load into partitioned parameters
            self._build_networks()

    def _build_networks(self) -> None:
        hp = self.hp
        self.policy = load_causal_lm(hp.model, dtype=hp.dtype)
        if hp.gradient_checkpointing:
            self.policy.gradient_checkpointing_enable()
        if hp.advantage == "gae":
            if hp.critic == "value_head":
                self.critic = ValueHead(self.policy.config.hidden_size)
            else:
                self.critic = CriticModel.from_pretrained(
                    hp.critic_model or hp.model, dtype=hp.dtype
                )
        if self.kl_coef > 0:
            self.ref_policy = freeze(load_causal_lm(hp.model, dtype=hp.dtype))

    def configure_optimizers(self) -> Any:
        hp = self.hp
        groups = [{"params": [p for p in self.policy.parameters() if p.requires_grad], "lr": hp.lr}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()), "lr": hp.critic_lr})
        return torch.optim.AdamW(groups, weight_decay=hp.weight_decay)

    # ------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor]:
        rollout = self.collect_rollout(batch)  # sample G responses per prompt, score them
        experience = self.prepare_update(rollout)  # old / reference log-probs, values, advantages
        update_stats = self.optimize(experience)  # ppo_epochs x mini-batches of clipped updates
        self.rollout_step += 1
        return self.log_step(experience, update_stats)

    def collect_rollout(self, batch: dict[str, Any]) -> Rollout:
        """G sampled responses per prompt, scored by the reward and the reward-term callbacks.
        The engine is asked for the sampled tokens' log-probs only if something reads them
        (see ``needs_sample_log_probs``)."""
        g = self.settings.samples_per_prompt
        return self.rollouts.collect(
            self.policy,
            self.tokenizer,
            batch,
            samples_per_prompt=g,
            log_probs=self.needs_sample_log_probs(len(batch["prompt"]) * g),
            trainer=self.trainer,
            module=self,
        )

    def needs_sample_log_probs(self, n: int) -> bool:
        """Whether the engine's log-probs are read: with several updates per rollout (the ratio's
        denominator) or a KL penalty in the reward (computed before the update), unless they are
        recomputed anyway. With one update and the KL in the loss, the update fills
        ``experience.old_log_probs`` from its own forward (read by ``rollout/kl``, the KL
        controller)."""
        if self.settings.recompute_old_log_probs:
            return False  # prepare_update computes them with the training forward
        kl_in_reward = self.kl_coef > 0 and self.settings.kl_in == "reward"
        return kl_in_reward or not self.settings.single_update(n)

    def prepare_update(self, rollout: Rollout) -> Experience:
        """Old log-probs, reference log-probs, values and advantages for the whole rollout."""
        return build_experience(
            rollout,
            policy=self.policy,
            settings=self.settings,
            temperature=self.engine.temperature,
            kl_coef=self.kl_coef,
            critic=self.critic,
            ref_policy=self.ref_policy,
            use_current_as_old=self.settings.single_update(len(rollout)),
        )

    def optimize(self, experience: Experience) -> dict[str, Tensor]:
        """``ppo_epochs`` passes of clipped updates over mini-batches of the experience; the
        engine serves the new weights after every optimizer step."""
        n, settings = len(experience), self.settings
        opt: Any = self.optimizers()
        update = PPOUpdate(
            self.policy,
            settings,
            experience,
            temperature=self.engine.temperature,
            kl_coef=self.kl_coef,
            critic=self.critic,
            loss_terms=partial(policy_loss_terms, self.trainer, self),
            use_current_as_old=settings.single_update(n),
            step=self.rollout_step,
        )
        for _ in range(settings.ppo_epochs):
            for idx in minibatches(n, settings.update_size(n), generator=self._shuffle):
                update.add(self.step_optimizer(self, opt, update.micro_batches(idx), update.loss))
                self.engine.sync_weights(self.policy)
        return update.means()

    def log_step(
        self, experience: Experience, update_stats: dict[str, Tensor]
    ) -> dict[str, Tensor]:
        """Log the rollout's and the update's statistics; returns what callbacks read
        (``reward``, and ``kl`` with ``num_sequences`` for the adaptive KL controller)."""
        rollout, n = experience.rollout, len(experience)
        stats = {**_rollout_stats(rollout), **self._kl_stats(experience), **update_stats}
        stats["rollout/step"] = torch.tensor(float(self.rollout_step))
        stats["ppo/kl_coef"] = torch.tensor(self.kl_coef)
        self.log_dict({k: v.float() for k, v in stats.items()}, on_step=True, batch_size=n)
        self.log("reward", stats["reward/mean"], prog_bar=True, logger=False, batch_size=n)
        if "rollout/kl" in stats:
            self.log("kl", stats["rollout/kl"], prog_bar=True, logger=False, batch_size=n)
        return {
            "reward": stats["reward/mean"].detach(),
            "kl": stats.get("rollout/kl", torch.tensor(0.0)),
            "num_sequences": torch.tensor(n),
        }

    def _kl_stats(self, experience: Experience) -> dict[str, Tensor]:
        stats: dict[str, Tensor] = {}
        mask = experience.rollout.response_mask
        if experience.ref_log_probs is not None:
            kl = kl_penalty(experience.old_log_probs, experience.ref_log_probs, estimator="k1")
            stats["rollout/kl"] = (kl * mask).sum(1).mean()  # per-sequence KL
        if experience.critic is not None:
            targets = experience.critic
            stats["ppo/explained_variance"] = explained_variance(
                targets.values, targets.returns, mask
            )
        return stats

    # ----------------------------------------------------- validation / test
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "val", self.val_reward, self.val_pass)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, "test", self.test_reward, self.test_pass)

    def _evaluate(self, batch: dict[str, Any], stage: str, reward: Any, passed: Any) -> None:
        """Reward and pass@1 of one response per prompt (greedy unless ``val_greedy`` is off)."""
        greedy = self.hp.val_greedy
        rollout = self.rollouts.collect(
            self.policy, self.tokenizer, batch, samples_per_prompt=1, greedy=greedy, log_probs=False
        )
        reward.update(rollout.scores)
        passed.update(self._passed(rollout).to(self.device))
        self.log(f"{stage}/reward", reward, on_epoch=True, batch_size=len(rollout))
        self.log(f"{stage}/pass@1", passed, on_epoch=True, prog_bar=True, batch_size=len(rollout))

    def _passed(self, rollout: Rollout) -> Tensor:
        """[B] 1.0 where the ``pass_metric`` (or the score) reaches ``pass_threshold``."""
        key, threshold = self.hp.pass_metric, self.hp.pass_threshold
        if key is None:
            return (rollout.scores >= threshold).float()
        if key not in rollout.reward_info:
            raise KeyError(
                f"pass_metric={key!r} is not in the reward's info (it has "
                f"{sorted(rollout.reward_info)}). Fix: set model.init_args.pass_metric to one of "
                "those, or to null to compare the score itself with pass_threshold."
            )
        return (rollout.reward_info[key].float() >= threshold).float()

    def close(self) -> None:
        """Release what the generation engine holds outside PyTorch (a vLLM instance). Called by
        ``lit-rlhf`` when the run is over; engines without such resources have no ``close``."""
        close = getattr(self.engine, "close", None)
        if callable(close):
            close()

    # ------------------------------------------------------------ checkpoint
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        checkpoint["lit_rlhf"] = {
            "rollout_step": self.rollout_step,
            "kl_coef": self.kl_coef,
            "shuffle_rng": self._shuffle.get_state(),
        }
        self.frozen.drop(checkpoint)  # the reference is the starting model, reloaded on start

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.frozen.restore(self, checkpoint)
        state = checkpoint.get("lit_rlhf", {})
        self.rollout_step = state.get("rollout_step", 0)
        self.kl_coef = state.get("kl_coef", self.kl_coef)
        if "shuffle_rng" in state:
            self._shuffle.set_state(state["shuffle_rng"])


def _rollout_stats(rollout: Rollout) -> dict[str, Tensor]:
    """Reward (and each part of its info, and the reward terms' diagnostics) and lengths."""
    scores, mask = rollout.scores, rollout.response_mask
    stats = {
        "reward/mean": scores.mean(),
        "reward/std": scores.std() if len(rollout) > 1 else scores.new_zeros(()),
        "rollout/response_length": mask.sum(1).float().mean(),
        "rollout/truncated": mask[:, -1].float().mean(),
    }
    stats.update({f"reward/{k}": v.mean() for k, v in rollout.reward_info.items()})
    stats.update(rollout.term_stats)
    return stats


def _check_module_settings(hparams: Any) -> None:
    """The module's own settings (the update's are checked by ``PPOSettings``)."""
    rules = [
        ("lr", hparams.lr > 0, "> 0"),
        ("critic_lr", hparams.critic_lr > 0, "> 0"),
        ("weight_decay", hparams.weight_decay >= 0, ">= 0"),
        ("kl_coef", hparams.kl_coef >= 0, ">= 0 (0 = no KL term and no reference model)"),
    ]
    for name, ok, wanted in rules:
        if not ok:
            raise ValueError(f"{name}={hparams[name]!r} must be {wanted}")


__all__ = ["PPOModule"]
