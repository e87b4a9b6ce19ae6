"""PPO / GRPO / RLOO for causal LMs inside Lightning's own ``Trainer.fit`` loop.

One ``training_step`` = one rollout batch: collect G samples per prompt -> score -> advantages ->
``ppo_epochs`` x mini-batches of clipped updates (manual optimisation, micro-batch accumulation)
-> log. ``trainer.global_step`` therefore counts optimizer steps; ``rollout/step`` counts rollouts.

References: PPO (arXiv 1707.06347), PPO for LMs (Ziegler et al., arXiv 1909.08593), GRPO
(arXiv 2402.03300), RLOO (arXiv 2402.14740).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

import torch
from lightning import Callback, LightningModule
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lit_rlhf.envs import Environment
from lit_rlhf.metrics import GroupedMean
from lit_rlhf.models import load_tokenizer
from lit_rlhf.models.loading import Dtype
from lit_rlhf.models.lora import LoRASettings, check_quantize_supported
from lit_rlhf.modules.ppo_setup import check_module_settings, multiturn_rollout
from lit_rlhf.rewards.base import RewardFunction
from lit_rlhf.rewards.combine import combined_reward
from lit_rlhf.rollout.base import GenerationEngine
from lit_rlhf.rollout.hf import HFGenerationEngine
from lit_rlhf.training import (
    EpochEndLoaderReset,
    GlobalRNGState,
    LRScheduleSettings,
    PolicyStep,
    PPOSettings,
    RolloutCollector,
    build_policy_networks,
    check_trainable_precision,
)
from lit_rlhf.types import Experience, Rollout


class PPOModule(LightningModule):
    """Policy optimisation with a learned critic (``advantage="gae"``), critic-free group
    baselines (``"grpo"``, ``"rloo"``) or REINFORCE++'s batch-normalised returns
    (``"reinforce_pp"``, ``"reinforce_pp_baseline"``); PPO's token ratio or GSPO's sequence
    ratio (``policy_loss``).

    Args:
        model: policy to train: hub id, local folder, or ``builtin:<name>``.
        reward: the reward: a :class:`RewardFunction` by class path, a plain function or
            TRL-style reward by import path (``my_rewards.brevity``), or a list of them (see
            :mod:`lit_rlhf.rewards.adapt` for calling conventions and return values).
        reward_weights: with a list ``reward``: one weight per reward (default all 1.0); the
            parts are summed into one :class:`~lit_rlhf.rewards.WeightedRewards`, each logged as
            ``reward/<name>``.
        reward_fallback: the score of a sample that no reward scored (None); such samples are
            logged as the fraction ``reward/unscored``.
        engine: generation engine; default :class:`HFGenerationEngine` with its defaults.
        tokenizer: a tokenizer object; the CLI links the DataModule's. ``None`` loads ``model``'s.
        samples_per_prompt: G, responses sampled per prompt.
        advantage: ``gae`` (critic), ``grpo`` (group-normalised), ``rloo`` (leave-one-out),
            ``reinforce_pp`` (REINFORCE++, arXiv 2501.03262: the KL to the reference per token
            in the reward with ``kl_in: reward``, returns whitened over the batch) or
            ``reinforce_pp_baseline`` (the group mean subtracted first).
        scale_by_std: GRPO divides by the group std (False: mean-centring only, Dr. GRPO).
        advantage_eps: added to GRPO's group std (TRL uses 1e-4).
        policy_loss: ``ppo`` (token ratios) or ``gspo`` (one length-normalised ratio per
            sequence, clipped per sequence, arXiv 2507.18071; needs ``loss_agg:
            seq_mean_token_mean``; the paper clips at 3e-4 / 4e-4).
        whiten_advantages: whiten GAE advantages over the rollout.
        gamma, lam: GAE discount and trace parameters.
        critic: ``separate`` network or ``value_head`` on the policy trunk (GAE only).
        critic_model: where the separate critic starts from (default: ``model``).
        ppo_epochs: passes over each rollout.
        mini_batch_size: sequences per optimizer step (default: the whole rollout).
        micro_batch_size: sequences per forward/backward (gradient accumulation inside a
            mini-batch; the result equals one pass over the mini-batch).
        micro_batch_tokens: when set, micro-batches are cut by this budget of real (prompt +
            response) tokens instead of ``micro_batch_size`` (then unused), keeping each prompt
            group together, and run as packed padding-free forwards with chunked log-probs; the
            experience's old / reference / critic forwards are chunked the same way
            (docs/algorithms.md, "Packing and token budgets").
        clip_low, clip_high: ratio clip range [1 - clip_low, 1 + clip_high].
        dual_clip: dual-clip constant c > 1 for negative advantages (None: off).
        value_clip: critic value clip (None: off). vf_coef: weight of the value loss.
        loss_agg: how per-token losses become one number: ``token_mean`` (DAPO),
            ``seq_mean_token_mean`` (GRPO), ``seq_mean_token_sum``, or ``seq_mean_token_sum_norm``
            (Dr. GRPO as published: token sums over (sequences x ``loss_norm_length``)).
        loss_norm_length: that constant (None: the engine's ``max_new_tokens``).
        kl_coef: weight of the KL to a frozen reference (0 = no reference model is loaded).
        kl_estimator: k1, k2 or k3. kl_in: ``loss`` (GRPO style) or ``reward`` (InstructGPT style).
        kl_ratio_correction: multiply the KL-in-loss estimate by ``pi / pi_old`` (unbiased under
            off-policy samples; TRL's ``use_bias_correction_kl``).
        lr, critic_lr, weight_decay, max_grad_norm: AdamW and clipping settings (one optimizer,
            two param groups, so DeepSpeed accepts it; under DeepSpeed, ``max_grad_norm`` becomes
            its ``gradient_clipping``).
        clip_per_network: clip the policy's and the critic's gradient norms separately, each to
            ``max_grad_norm``, as verl does with its two optimizers (the TRE authors' recipe,
            arXiv 2602.03635); default: their joint norm. Each network's norm before clipping is
            logged as ``ppo/grad_norm/policy`` and ``ppo/grad_norm/critic``. Refused under
            DeepSpeed (it clips the global norm inside its step), FSDP and float16 loss scaling.
        lr_warmup_steps, lr_warmup_ratio, lr_schedule, min_lr_ratio, lr_interval, lr_total_steps:
            the lr schedule shared by every module (:mod:`lit_rlhf.training.lr_schedule`): a
            linear warmup over ``lr_warmup_steps`` or the fraction ``lr_warmup_ratio`` of all
            scheduled steps (not both), then ``constant``, ``linear`` or ``cosine`` down to
            ``min_lr_ratio`` x lr (of each param group); stepped once per rollout batch (``batch``,
            as verl) or per optimizer step; ``lr_total_steps`` null: derived from the trainer.
            Logged as ``train/lr``.
        dtype: weight dtype of the trained networks (policy, critic). A 16-bit dtype trains
            only under DeepSpeed's bf16 optimizer (float32 master weights); otherwise use
            float32 with ``trainer.precision: bf16-mixed`` (refused at setup, before any load).
        reference_dtype: the frozen reference's dtype (None: ``dtype``); it may be 16-bit.
        recompute_old_log_probs: recompute rollout log-probs with a forward pass instead of
            trusting the engine's (use with engines whose numerics differ, e.g. vLLM).
        mismatch_correction: correct the gradient for the engine's log-probs ``mu`` against the
            trainer's ``pi_old``: ``tis`` weights each token by ``min(pi_old / mu,
            mismatch_cap)``, ``mask`` drops tokens whose ratio leaves [``mismatch_low``,
            ``mismatch_high``], ``none``; ``auto``: ``tis`` with an engine of its own numerics
            (vLLM) when the trainer's old log-probs exist, else ``none``. Logged as
            ``rollout/mismatch_*`` whenever both log-probs exist.
        overlong_filter: leave responses cut at ``max_new_tokens`` out of the loss (DAPO).
        overlong_buffer, overlong_penalty_factor: DAPO's soft overlong punishment: 0 up to
            ``max_new_tokens - overlong_buffer`` tokens, then down to ``-factor`` at the cap
            (None: off).
        dynamic_sampling: DAPO's dynamic sampling: keep only groups whose rewards differ and
            draw further prompt batches (one per ``training_step``, no update in between) until
            the update holds one batch's number of groups; logged as
            ``rollout/informative_groups`` and ``rollout/dynamic_sampling_rounds``.
        dynamic_sampling_max_rounds: batches drawn in a row without filling that stop the run.
        gradient_checkpointing: trade compute for activation memory.
        lora_rank, lora_alpha, lora_target_modules, lora_dropout: 0 = train every weight; > 0 =
            peft LoRA adapters (the ``[lora]`` extra; arXiv 2106.09685) of this rank on
            ``lora_target_modules`` (``all-linear``: every linear layer but the head), scaled
            by ``lora_alpha / lora_rank``, with ``lora_dropout`` in [0, 1). The base is frozen
            and is the KL's reference (the adapters switched off: no second model is loaded);
            checkpoints hold the adapters only (and a critic); vLLM serves the merged weights.
        quantize: ``4bit`` loads the frozen base in NF4 with bf16 compute (QLoRA, arXiv
            2305.14314; bitsandbytes on a CUDA GPU; needs ``lora_rank`` > 0); refused at setup on
            a machine without CUDA or bitsandbytes. None: the base in ``dtype``.
        val_greedy: greedy decoding for validation pass@1 (else sampled with the engine).
        val_samples: k > 1 also samples k responses per prompt with the engine at validation /
            test and logs ``<stage>/pass@<k>`` (share of prompts with at least one passing
            sample; with n = k samples Chen et al.'s unbiased estimator, arXiv 2107.03374, is
            exactly this) and ``<stage>/sampled_pass@1`` (share of passing samples); 1: off.
        pass_metric: the reward-info key that decides whether a validation / test sample passes
            (pass@1), e.g. ``correct``; ``None`` uses the score itself.
        pass_threshold: a sample passes when that value is >= this threshold.
        environment: multi-turn tool / environment rollouts: an
            :class:`~lit_rlhf.envs.Environment` by class path (None: one response per sample,
            the single-turn path). See docs/agents.md and :mod:`lit_rlhf.training.multiturn`.
        max_turns, max_turn_tokens, max_episode_tokens: with ``environment``: agent turns per
            episode; tokens per agent turn (None: the engine's ``max_new_tokens``); response
            tokens of a whole episode, agent and environment (None: no limit).
        env_step_timeout: seconds an environment step may take before it is answered with an
            error observation and counted as a fault (``env/faults``).
        budget_penalty: the score of an episode a token budget cut; None: such episodes are
            left out of the loss (their score still enters the group baseline).
        max_staleness: 0: on-policy (each batch is generated, then trained on). k >= 1:
            one-step-off training (:mod:`lit_rlhf.training.overlap`): batch t + k is generated
            in a background thread while the update on batch t runs; the objective is AReaL's
            decoupled PPO (clip against the proximal policy, times ``mismatch_correction``'s
            weight ``pi_prox / mu``); the first k steps only generate. docs/agents.md.
        seed: seeds the mini-batch shuffling.
        max_consecutive_skips: an optimizer step whose loss or gradient is not finite is skipped
            (on every rank; logged as ``fault/skipped_steps``); this many in a row stop the run
            with a FloatingPointError (1: stop at the first).

    The update settings are validated into a :class:`~lit_rlhf.training.PPOSettings`, the lr
    schedule's into a :class:`~lit_rlhf.training.LRScheduleSettings`, when the module is built
    (before any model loads).
    """

    def __init__(
        self,
        # the list first: jsonargparse can then write a list of rewards back into config.yaml
        reward: list[RewardFunction | Callable[..., Any]] | RewardFunction | Callable[..., Any],
        model: str = "builtin:tiny-llama",
        engine: GenerationEngine | None = None,
        tokenizer: Any = None,
        samples_per_prompt: int = 4,
        advantage: Literal["gae", "grpo", "rloo", "reinforce_pp", "reinforce_pp_baseline"] = "grpo",
        scale_by_std: bool = True,
        whiten_advantages: bool = True,
        gamma: float = 1.0,
        lam: float = 1.0,
        critic: Literal["separate", "value_head"] = "separate",
        critic_model: str | None = None,
        ppo_epochs: int = 1,
        mini_batch_size: int | None = None,
        micro_batch_size: int = 8,
        micro_batch_tokens: int | None = None,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = None,
        value_clip: float | None = 0.2,
        vf_coef: float = 0.5,
        loss_agg: Literal[
            "token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"
        ] = "token_mean",
        kl_coef: float = 0.0,
        kl_estimator: Literal["k1", "k2", "k3"] = "k3",
        kl_in: Literal["loss", "reward"] = "loss",
        lr: float = 1e-6,
        critic_lr: float = 1e-5,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        clip_per_network: bool = False,
        lr_warmup_steps: int = 0,
        lr_warmup_ratio: float = 0.0,
        lr_schedule: Literal["constant", "linear", "cosine"] = "constant",
        min_lr_ratio: float = 0.0,
        lr_interval: Literal["batch", "optimizer_step"] = "batch",
        lr_total_steps: int | None = None,
        dtype: Dtype = "float32",
        reference_dtype: Dtype | None = None,
        recompute_old_log_probs: bool = False,
        gradient_checkpointing: bool = False,
        val_greedy: bool = True,
        val_samples: int = 1,
        pass_metric: str | None = None,
        pass_threshold: float = 1.0,
        seed: int = 0,
        max_consecutive_skips: int = 5,
        reward_weights: list[float] | None = None,
        reward_fallback: float = 0.0,
        policy_loss: Literal["ppo", "gspo"] = "ppo",
        advantage_eps: float = 1e-6,
        loss_norm_length: int | None = None,
        kl_ratio_correction: bool = False,
        mismatch_correction: Literal["auto", "none", "tis", "mask"] = "auto",
        mismatch_cap: float = 2.0,
        mismatch_low: float = 0.5,
        mismatch_high: float = 2.0,
        overlong_filter: bool = False,
        overlong_buffer: int | None = None,
        overlong_penalty_factor: float = 1.0,
        dynamic_sampling: bool = False,
        dynamic_sampling_max_rounds: int = 10,
        lora_rank: int = 0,
        lora_alpha: int = 16,
        lora_target_modules: str | list[str] = "all-linear",
        lora_dropout: float = 0.0,
        quantize: Literal[None, "4bit"] = None,
        environment: Environment | None = None,
        max_turns: int = 2,
        max_turn_tokens: int | None = None,
        max_episode_tokens: int | None = None,
        env_step_timeout: float = 5.0,
        budget_penalty: float | None = None,
        max_staleness: int = 0,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["reward", "engine", "tokenizer", "environment"])
        reward = combined_reward(reward, reward_weights)
        self._init_core(reward, engine, environment)
        self.tokenizer = tokenizer
        self.kl_coef = float(kl_coef)  # a plain attribute: the AdaptiveKL callback rewrites it
        self._init_state()

    def _init_core(
        self,
        reward: RewardFunction | Callable[..., Any],
        engine: GenerationEngine | None,
        environment: Environment | None = None,
    ) -> None:
        """Validated settings (before any model loads) and the shared core's rollout and update."""
        hp = self.hp
        self.settings = PPOSettings.from_hparams(hp)  # validates
        self.lr_settings = LRScheduleSettings.from_hparams(hp)  # validates
        self.lora = LoRASettings.from_hparams(hp)
        self.lora.check()  # quantize needs adapters
        check_module_settings(hp)
        self.automatic_optimization = False
        self.engine: GenerationEngine = engine or HFGenerationEngine()
        self.rollouts = RolloutCollector(
            self.engine,
            reward,
            fallback=hp.reward_fallback,
            multiturn=multiturn_rollout(environment, hp),
        )
        self.rl = PolicyStep(
            self.settings,
            self.rollouts,
            max_grad_norm=hp.max_grad_norm,
            seed=hp.seed,
            max_consecutive_skips=hp.max_consecutive_skips,
            lr_schedule=self.lr_settings,
            clip_grad_per_group=hp.clip_per_network,
        )

    def _init_state(self) -> None:
        """Networks (built in ``configure_model``), counters and evaluation metrics."""
        self.rollout_step = 0
        self.policy: Any = None
        self.critic: Any = None
        self.ref_policy: Any = None
        self.val_reward, self.val_pass = MeanMetric(), MeanMetric()
        self.test_reward, self.test_pass = MeanMetric(), MeanMetric()
        self.task_reward = {"val": GroupedMean(), "test": GroupedMean()}  # multi-domain runs
        # val_samples > 1: pass@k and the sampled pass@1 per stage (ModuleDicts follow the device)
        self.pass_at_k = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})
        self.sampled_pass = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})

    @property
    def hp(self) -> Any:
        """``self.hparams`` with attribute access typed loosely (it is an AttributeDict)."""
        return self.hparams

    # ----------------------------------------------------------------- setup
    def setup(self, stage: str) -> None:
        if stage == "fit":  # the data against the update and the context, before models load
            check_trainable_precision(self.trainer, {"dtype": self.hp.dtype})
            check_quantize_supported(self.lora.quantize)  # before the 4-bit base loads
            self.rl.check_data(self)

    def configure_model(self) -> None:
        hp = self.hp
        strategy = self._trainer.strategy if self._trainer is not None else None
        # under DeepSpeed, clipping is DeepSpeed's own (Lightning's clip_gradients is a no-op)
        self.rl.step_optimizer.configure(strategy)
        if self.policy is not None:
            return
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(hp.model)
        nets = build_policy_networks(
            hp.model,
            strategy=strategy,
            dtype=hp.dtype,
            reference_dtype=hp.reference_dtype,
            critic=hp.critic if hp.advantage == "gae" else None,
            critic_model=hp.critic_model,
            reference=self.kl_coef > 0,
            gradient_checkpointing=hp.gradient_checkpointing,
            lora=self.lora,
        )
        self.policy, self.critic, self.ref_policy = nets.policy, nets.critic, nets.ref_policy

    def export_network(self) -> tuple[Any, Any]:
        """What ``lit-rlhf export`` writes: the policy (the critic / value head and the
        reference are not exported) and the tokenizer."""
        return self.policy, self.tokenizer

    def configure_optimizers(self) -> Any:
        hp = self.hp
        policy = [p for p in self.policy.parameters() if p.requires_grad]
        groups = [{"params": policy, "lr": hp.lr, "name": "policy"}]
        if self.critic is not None:  # the names key clip_per_network's logged norms
            groups.append(
                {"params": list(self.critic.parameters()), "lr": hp.critic_lr, "name": "critic"}
            )
        return torch.optim.AdamW(groups, weight_decay=hp.weight_decay)

    # ------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Tensor] | None:
        if self.rl.overlap is not None:  # max_staleness > 0: this batch generates meanwhile
            with self.rl.overlapped(self, batch) as ready:
                out = None if ready is None else self.update(ready, len(batch["prompt"]))
            return out
        rollout = self.collect_rollout(batch)  # sample G responses per prompt, score them
        return self.update(rollout, len(batch["prompt"]))

    def update(self, rollout: Rollout, prompts: int) -> dict[str, Tensor] | None:
        """Update on a scored rollout of ``prompts`` prompts (or buffer it: dynamic sampling)."""
        filled = self.rl.filled(self, rollout, prompts)  # dynamic sampling
        if filled is None:
            return None  # not enough groups whose rewards differ yet: draw the next batch
        rollout = filled
        experience = self.prepare_update(rollout)  # old / reference log-probs, values, advantages
        update_stats = self.optimize(experience)  # ppo_epochs x mini-batches of clipped updates
        self.rollout_step += 1
        return self.log_step(experience, update_stats)

    def collect_rollout(self, batch: dict[str, Any]) -> Rollout:
        """G sampled responses per prompt, scored by the reward and the reward-term callbacks."""
        return self.rl.collect(self, batch)

    def prepare_update(self, rollout: Rollout) -> Experience:
        """Old log-probs, reference log-probs, values and advantages for the whole rollout."""
        return self.rl.prepare(self, rollout)

    def optimize(self, experience: Experience) -> dict[str, Tensor]:
        """``ppo_epochs`` passes of clipped updates over mini-batches of the experience."""
        return self.rl.optimize(self, experience)

    def log_step(self, experience: Experience, update_stats: dict[str, Tensor]) -> dict[str, Any]:
        """Log the step; returns ``reward``, ``kl`` and ``num_sequences`` for callbacks."""
        return self.rl.log(self, experience, update_stats)

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
        self.task_reward[stage].update(rollout.scores.to(self.device), rollout.tasks)
        passed.update(self._passed(rollout).to(self.device))
        self.log(f"{stage}/reward", reward, on_epoch=True, batch_size=len(rollout))
        self.log(f"{stage}/pass@1", passed, on_epoch=True, prog_bar=True, batch_size=len(rollout))
        if self.hp.val_samples > 1:
            self._evaluate_sampled(batch, stage)

    def _evaluate_sampled(self, batch: dict[str, Any], stage: str) -> None:
        """pass@k and the sampled pass@1 of ``val_samples`` engine samples per prompt."""
        k = self.hp.val_samples
        rollout = self.rollouts.collect(
            self.policy, self.tokenizer, batch, samples_per_prompt=k, log_probs=False
        )
        passed = self._passed(rollout).to(self.device).view(-1, k)  # [prompts, k]
        at_k: MeanMetric = self.pass_at_k[stage]  # type: ignore[assignment]
        sampled: MeanMetric = self.sampled_pass[stage]  # type: ignore[assignment]
        at_k.update(passed.amax(dim=-1))
        sampled.update(passed.mean(dim=-1))
        self.log(f"{stage}/pass@{k}", at_k, on_epoch=True, batch_size=passed.shape[0])
        self.log(f"{stage}/sampled_pass@1", sampled, on_epoch=True, batch_size=passed.shape[0])

    def on_validation_epoch_end(self) -> None:
        self._log_task_rewards("val")

    def on_test_epoch_end(self) -> None:
        self._log_task_rewards("test")

    def _log_task_rewards(self, stage: str) -> None:
        """``<stage>/reward/<task>`` when the prompts hold more than one task (every rank)."""
        per_task = self.task_reward[stage].compute()
        if len(per_task) > 1:
            self.log_dict({f"{stage}/reward/{task}": value for task, value in per_task.items()})
        self.task_reward[stage].reset()

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
        """Release the generation engine's resources (``lit-rlhf`` calls it after the run)."""
        self.rl.close()

    # ------------------------------------------------------------ checkpoint
    def configure_callbacks(self) -> list[Callback]:
        # exact resumes: the global generators, and a fresh loader after an epoch-end checkpoint
        return [GlobalRNGState(), EpochEndLoaderReset()]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.rl.save(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.rl.load(self, checkpoint)


__all__ = ["PPOModule"]
