"""PPO / GRPO / RLOO for causal LMs inside Lightning's own ``Trainer.fit`` loop.

One ``training_step`` = one rollout batch: collect G samples per prompt -> score -> advantages ->
``ppo_epochs`` x mini-batches of clipped updates (manual optimisation, micro-batch accumulation)
-> log. ``trainer.global_step`` therefore counts optimizer steps; ``rollout/step`` counts rollouts.

References: PPO (arXiv 1707.06347), PPO for LMs (Ziegler et al., arXiv 1909.08593), GRPO
(arXiv 2402.03300), RLOO (arXiv 2402.14740).
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning import LightningModule
from torch import Tensor
from torchmetrics import MeanMetric

from lit_rlhf.algos import explained_variance, kl_penalty
from lit_rlhf.models import CriticModel, ValueHead, load_causal_lm, load_tokenizer
from lit_rlhf.models.forward import forward_response
from lit_rlhf.models.loading import Dtype
from lit_rlhf.modules.policy_forward import critic_values, minibatches
from lit_rlhf.modules.ppo_update import PPOUpdate, compute_advantages
from lit_rlhf.rewards.base import RewardFunction
from lit_rlhf.rollout.base import GenerationEngine
from lit_rlhf.rollout.hf import HFGenerationEngine
from lit_rlhf.strategies import (
    deepspeed_grad_norm,
    is_deepspeed,
    set_deepspeed_gradient_clipping,
    transformers_zero3_context,
)
from lit_rlhf.types import Rollout

_REF_PREFIX = "ref_policy."  # state-dict keys of the frozen reference (left out of checkpoints)


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
        seed: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["reward", "engine", "tokenizer"])
        if samples_per_prompt < 1 or ppo_epochs < 1 or micro_batch_size < 1:
            raise ValueError("samples_per_prompt, ppo_epochs and micro_batch_size must be >= 1")
        if advantage != "gae" and samples_per_prompt < 2:
            raise ValueError(
                f"advantage={advantage!r} compares samples of the same prompt: set "
                "samples_per_prompt >= 2, or use advantage='gae' with a critic"
            )
        if not callable(reward):
            raise TypeError(f"reward must be a RewardFunction (callable), got {type(reward)}")
        self.automatic_optimization = False
        self.reward_fn = reward
        self.engine: GenerationEngine = engine or HFGenerationEngine()
        self.tokenizer = tokenizer
        self.kl_coef = float(kl_coef)  # a plain attribute: the AdaptiveKL callback rewrites it
        self.rollout_step = 0
        self.policy: Any = None
        self.critic: Any = None
        self.ref_policy: Any = None
        self._shuffle = torch.Generator().manual_seed(seed)
        self.val_reward = MeanMetric()
        self.val_pass = MeanMetric()

    @property
    def hp(self) -> Any:
        """``self.hparams`` with attribute access typed loosely (it is an AttributeDict)."""
        return self.hparams

    # ----------------------------------------------------------------- setup
    def configure_model(self) -> None:
        hp = self.hp
        strategy = self._trainer.strategy if self._trainer is not None else None
        # under DeepSpeed, clipping is DeepSpeed's own (Lightning's clip_gradients is a no-op)
        set_deepspeed_gradient_clipping(strategy, hp.max_grad_norm)
        if self.policy is not None:
            return
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(hp.model)
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
            self.ref_policy = load_causal_lm(hp.model, dtype=hp.dtype).eval().requires_grad_(False)

    def configure_optimizers(self) -> Any:
        hp = self.hp
        groups = [{"params": [p for p in self.policy.parameters() if p.requires_grad], "lr": hp.lr}]
        if self.critic is not None:
            groups.append({"params": list(self.critic.parameters()), "lr": hp.critic_lr})
        return torch.optim.AdamW(groups, weight_decay=hp.weight_decay)

    # ------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor]:
        rollout = self.collect_rollout(batch, greedy=False)
        self.score(rollout)
        self.prepare_update(rollout)
        update_stats = self.optimize(rollout)
        self.rollout_step += 1
        return self.log_step(rollout, update_stats)

    @torch.no_grad()
    def collect_rollout(
        self, batch: dict[str, Any], *, greedy: bool, for_update: bool = True
    ) -> Rollout:
        """Sample G responses per prompt (G = 1 when greedy). The engine is asked for the
        sampled tokens' log-probs only if the update needs them (see ``needs_sample_log_probs``)."""
        g = 1 if greedy else self.hp.samples_per_prompt
        prompt_ids = batch["input_ids"].repeat_interleave(g, dim=0)
        prompt_mask = batch["attention_mask"].bool().repeat_interleave(g, dim=0)
        need = for_update and self.needs_sample_log_probs(len(prompt_ids))
        out = self.engine.generate(
            self.policy, prompt_ids, prompt_mask, self.tokenizer, greedy=greedy, log_probs=need
        )
        expand = [i for i in range(len(batch["prompt"])) for _ in range(g)]
        return Rollout(
            prompt_ids=prompt_ids,
            prompt_mask=prompt_mask,
            response_ids=out.response_ids,
            response_mask=out.response_mask,
            sample_log_probs=out.log_probs,
            group_ids=torch.tensor(expand, device=prompt_ids.device),
            query_ids=[batch["query_id"][i] for i in expand],
            tasks=[batch["task"][i] for i in expand],
            rows=[batch["row"][i] for i in expand],
            prompts=[batch["prompt"][i] for i in expand],
            responses=self.tokenizer.batch_decode(out.response_ids, skip_special_tokens=True),
        )

    def score(self, rollout: Rollout) -> dict[str, Tensor]:
        """Fill ``rollout.scores`` from the injected reward; returns its per-sample info."""
        result = self.reward_fn(rollout.prompts, rollout.responses, rollout.rows)
        scores = torch.as_tensor(result.scores, dtype=torch.float32, device=self.device)
        if scores.shape != (len(rollout),) or not torch.isfinite(scores).all():
            raise ValueError(
                f"{type(self.reward_fn).__name__} returned scores of shape {tuple(scores.shape)} "
                f"(finite: {bool(torch.isfinite(scores).all())}); expected {len(rollout)} finite "
                "floats, one per completion"
            )
        rollout.scores = scores
        self._reward_info = {k: torch.as_tensor(v).float() for k, v in result.info.items()}
        return self._reward_info

    def single_update(self, n: int) -> bool:
        """Whether a rollout of ``n`` samples gets exactly one optimizer step: the rollout policy
        *is* the current policy then, so its log-probs are the current ones, detached (exact
        ratio 1, no extra forward pass)."""
        hp = self.hp
        size = hp.mini_batch_size or n
        return hp.ppo_epochs == 1 and size >= n and not hp.recompute_old_log_probs

    def needs_sample_log_probs(self, n: int) -> bool:
        """Whether the engine's log-probs are read: with several updates per rollout (the ratio's
        denominator) or a KL penalty in the reward (computed before the update), unless they are
        recomputed anyway. With one update and the KL in the loss, the update fills
        ``rollout.old_log_probs`` from its own forward (read by ``rollout/kl``, the KL
        controller)."""
        if self.hp.recompute_old_log_probs:
            return False  # prepare_update computes them with the training forward
        kl_in_reward = self.kl_coef > 0 and self.hp.kl_in == "reward"
        return kl_in_reward or not self.single_update(n)

    @torch.no_grad()
    def prepare_update(self, rollout: Rollout) -> None:
        """Old log-probs, reference log-probs, values and advantages for the whole rollout."""
        hp = self.hp
        ids, mask, r = rollout.input_ids, rollout.attention_mask, rollout.response_ids.shape[1]
        rollout.old_log_probs = rollout.sample_log_probs
        needs_hidden = self.critic is not None and hp.critic == "value_head"
        if hp.recompute_old_log_probs or needs_hidden:
            fwd = forward_response(
                self.policy,
                ids,
                mask,
                rollout.response_ids,
                temperature=self.engine.temperature,
                with_hidden=needs_hidden,
            )
            if hp.recompute_old_log_probs:
                rollout.old_log_probs = fwd.log_probs
            if needs_hidden:
                rollout.values = self.critic(fwd.hidden).float()
        if self.critic is not None and not needs_hidden:
            rollout.values = critic_values(self.critic, ids, mask, r)
        if self.ref_policy is not None:
            rollout.ref_log_probs = forward_response(
                self.ref_policy,
                ids,
                mask,
                rollout.response_ids,
                temperature=self.engine.temperature,
            ).log_probs
        compute_advantages(rollout, **self._advantage_settings())

    def _advantage_settings(self) -> dict[str, Any]:
        hp = self.hp
        return dict(
            advantage=hp.advantage,
            gamma=hp.gamma,
            lam=hp.lam,
            scale_by_std=hp.scale_by_std,
            whiten=hp.whiten_advantages,
            kl_coef=self.kl_coef if hp.kl_in == "reward" else 0.0,
            kl_estimator=hp.kl_estimator,
        )

    def optimize(self, rollout: Rollout) -> dict[str, Tensor]:
        """``ppo_epochs`` passes of clipped updates over mini-batches of the rollout."""
        hp = self.hp
        n = len(rollout)
        size = hp.mini_batch_size or n
        opt: Any = self.optimizers()
        update = PPOUpdate(self, rollout, use_current_as_old=self.single_update(n))
        for _ in range(hp.ppo_epochs):
            for idx in minibatches(n, size, generator=self._shuffle):
                opt.zero_grad()
                update.run_minibatch(idx)
                update.add(self.clip_and_step(opt))
                self.engine.sync_weights(self.policy)
        return update.means()

    def clip_and_step(self, opt: Any) -> dict[str, Tensor]:
        """Clip the gradient norm, take the optimizer step; return the norm before clipping."""
        strategy = self.trainer.strategy
        if is_deepspeed(strategy):
            # DeepSpeed clips inside its step (configure_model set the norm); under ZeRO the
            # gradients are not in param.grad, so the norm is the one DeepSpeed computed
            opt.step()
            norm = deepspeed_grad_norm(strategy)
            return {} if norm is None else {"ppo/grad_norm": norm}
        stats = self.clip_and_norm(opt)
        opt.step()
        return stats

    def clip_and_norm(self, opt: Any) -> dict[str, Tensor]:
        """Clip the gradient norm through Lightning (strategy-aware); return the norm before."""
        grads = [p.grad for p in self.parameters() if p.grad is not None]
        stats = {"ppo/grad_norm": torch.nn.utils.get_total_norm(grads)} if grads else {}
        if self.hp.max_grad_norm is not None:
            self.clip_gradients(
                opt, gradient_clip_val=self.hp.max_grad_norm, gradient_clip_algorithm="norm"
            )
        return stats

    def log_step(self, rollout: Rollout, update_stats: dict[str, Tensor]) -> dict[str, Tensor]:
        assert rollout.scores is not None
        lengths = rollout.response_mask.sum(1).float()
        stats: dict[str, Tensor] = {
            "reward/mean": rollout.scores.mean(),
            "reward/std": rollout.scores.std()
            if len(rollout) > 1
            else rollout.scores.new_zeros(()),
            "rollout/response_length": lengths.mean(),
            "rollout/truncated": rollout.response_mask[:, -1].float().mean(),
            "rollout/step": torch.tensor(float(self.rollout_step)),
            "ppo/kl_coef": torch.tensor(self.kl_coef),
        }
        stats.update({f"reward/{k}": v.mean() for k, v in self._reward_info.items()})
        if rollout.ref_log_probs is not None and rollout.old_log_probs is not None:
            kl = kl_penalty(rollout.old_log_probs, rollout.ref_log_probs, estimator="k1")
            stats["rollout/kl"] = (kl * rollout.response_mask).sum(1).mean()  # per-sequence KL
        if rollout.values is not None and rollout.returns is not None:
            stats["ppo/explained_variance"] = explained_variance(
                rollout.values, rollout.returns, rollout.response_mask
            )
        stats.update(update_stats)
        self.log_dict(
            {k: v.float() for k, v in stats.items()},
            on_step=True,
            on_epoch=False,
            batch_size=len(rollout),
        )
        self.log(
            "reward", stats["reward/mean"], prog_bar=True, logger=False, batch_size=len(rollout)
        )
        if "rollout/kl" in stats:
            self.log(
                "kl", stats["rollout/kl"], prog_bar=True, logger=False, batch_size=len(rollout)
            )
        return {
            "reward": stats["reward/mean"].detach(),
            "kl": stats.get("rollout/kl", torch.tensor(0.0)),
        }

    # ----------------------------------------------------------- validation
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        rollout = self.collect_rollout(batch, greedy=self.hp.val_greedy, for_update=False)
        info = self.score(rollout)
        assert rollout.scores is not None
        passed = info.get("correct", (rollout.scores >= 1.0).float())
        self.val_reward.update(rollout.scores)
        self.val_pass.update(passed.to(self.device))
        self.log("val/reward", self.val_reward, on_epoch=True, batch_size=len(rollout))
        self.log("val/pass@1", self.val_pass, on_epoch=True, prog_bar=True, batch_size=len(rollout))

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self.validation_step(batch, batch_idx)

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
        # the frozen reference is the starting model, loaded again from `model` on every start:
        # saving it would add one more copy of the weights to every checkpoint. (DeepSpeed
        # checkpoints are written by DeepSpeed from the engine and still contain it.)
        weights = checkpoint.get("state_dict")
        if weights is not None:
            for key in [k for k in weights if k.startswith(_REF_PREFIX)]:
                del weights[key]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        state = checkpoint.get("lit_rlhf", {})
        weights = checkpoint.get("state_dict")
        # put the reference back (built by configure_model, which Lightning runs before this hook
        # on resume and in load_from_checkpoint) so that strict loading finds every key
        if weights is not None and self.ref_policy is not None:
            weights.update({_REF_PREFIX + k: v for k, v in self.ref_policy.state_dict().items()})
        self.rollout_step = state.get("rollout_step", 0)
        self.kl_coef = state.get("kl_coef", self.kl_coef)
        if "shuffle_rng" in state:
            self._shuffle.set_state(state["shuffle_rng"])


__all__ = ["PPOModule"]
