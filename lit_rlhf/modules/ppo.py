"""PPO / GRPO / RLOO for causal LMs inside Lightning's own ``Trainer.fit`` loop.

One ``training_step`` = one rollout batch: collect G samples per prompt -> score -> advantages ->
``ppo_epochs`` x mini-batches of clipped updates (manual optimisation, micro-batch accumulation)
-> log. ``trainer.global_step`` therefore counts optimizer steps; ``rollout/step`` counts rollouts.

References: PPO (arXiv 1707.06347), PPO for LMs (Ziegler et al., arXiv 1909.08593), GRPO
(arXiv 2402.03300), RLOO (arXiv 2402.14740); on-policy distillation (``distill``: GKD, arXiv
2306.13649, and Thinking Machines' recipe, :mod:`lit_rlhf.algos.distill`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning import Callback, LightningModule
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lit_rlhf.envs import Environment, EnvironmentLike
from lit_rlhf.errors import SettingError
from lit_rlhf.metrics import GroupedMean
from lit_rlhf.modules.ppo_setup import (
    build_networks,
    check_fit_setup,
    check_unread,
    multiturn_rollout,
)
from lit_rlhf.rewards.base import RewardFunction
from lit_rlhf.rewards.combine import combined_reward
from lit_rlhf.rewards.guarded import failed_samples
from lit_rlhf.rollout.base import GenerationEngine, GenerationEngineLike
from lit_rlhf.rollout.hf import HFGenerationEngine
from lit_rlhf.settings import (
    AdvantageSettings,
    CriticSettings,
    DistillSettings,
    EnvironmentSettings,
    EvalSettings,
    KLSettings,
    LoRASettings,
    MismatchSettings,
    OptimSettings,
    PolicyLossSettings,
    PrecisionSettings,
    RolloutSettings,
    UpdateSettings,
    refuse_flat_arguments,
    take_groups,
)
from lit_rlhf.training import (
    PolicyStep,
    PPOSettings,
    RolloutCollector,
)
from lit_rlhf.training.model_hooks import module_callbacks
from lit_rlhf.training.teacher import FrozenTeacher, served_teacher
from lit_rlhf.types import Experience, Rollout

_OPTIM = OptimSettings(lr=1e-6, micro_batch_size=8)  # PPOModule's defaults for the group


@refuse_flat_arguments
class PPOModule(LightningModule):
    """Policy optimisation with a learned critic (``advantage.estimator: gae``), critic-free group
    baselines (``grpo``, ``rloo``) or REINFORCE++'s batch-normalised returns (``reinforce_pp``,
    ``reinforce_pp_baseline``); PPO's token ratio or GSPO's sequence ratio (``loss.policy_loss``).

    Args:
        reward: the reward: a :class:`RewardFunction` by class path, a plain function or
            TRL-style reward by import path (``my_rewards.brevity``), or a list of them (see
            :mod:`lit_rlhf.rewards.adapt` for calling conventions and return values).
        model: policy to train: hub id, local folder, or ``builtin:<name>``.
        engine: generation engine; default :class:`HFGenerationEngine` with its defaults.
        tokenizer: a tokenizer object; the CLI links the DataModule's. ``None`` loads ``model``'s.
        environment: multi-turn tool / environment rollouts: an
            :class:`~lit_rlhf.envs.Environment` by class path, i.e. any class with ``reset``
            and ``step`` methods (checked by shape, :class:`~lit_rlhf.envs.EnvironmentLike`;
            None: one response per sample, the single-turn path; the ``env`` group is refused
            then). See docs/agents.md.
        reward_weights: with a list ``reward``: one weight per reward (default all 1.0); the
            parts are summed into one :class:`~lit_rlhf.rewards.WeightedRewards`, each logged as
            ``reward/<name>``.
        reward_fallback: the score of a sample that no reward scored (None); such samples are
            logged as the fraction ``reward/unscored``.
        optim: AdamW, clipping (``clip_per_network``: policy and critic apart, as verl), the
            micro-batches of the update, non-finite skips and the lr schedule, stepped once per
            rollout batch by default (:class:`~lit_rlhf.settings.OptimSettings`; lr 1e-6).
        precision: the trained networks' dtype, the frozen reference's and activation
            checkpointing (:class:`~lit_rlhf.settings.PrecisionSettings`).
        lora: LoRA / QLoRA adapters on the policy; the base is then the KL's reference
            (:class:`~lit_rlhf.settings.LoRASettings`).
        update: epochs, mini-batches, token-budget micro-batches, recomputed old log-probs and
            the shuffling seed (:class:`~lit_rlhf.settings.UpdateSettings`).
        rollout: G samples per prompt, one-step-off staleness, DAPO's dynamic sampling and
            overlong handling (:class:`~lit_rlhf.settings.RolloutSettings`).
        advantage: the estimator and its constants (:class:`~lit_rlhf.settings.AdvantageSettings`).
        loss: the clipped policy objective and its aggregation
            (:class:`~lit_rlhf.settings.PolicyLossSettings`).
        mismatch: the correction for the engine's log-probs against the trainer's
            (:class:`~lit_rlhf.settings.MismatchSettings`).
        kl: the KL to a frozen reference (:class:`~lit_rlhf.settings.KLSettings`); its ``coef``
            seeds the plain attribute ``kl_coef``, which the AdaptiveKL callback rewrites.
        critic: GAE's learned critic (:class:`~lit_rlhf.settings.CriticSettings`; refused with
            another estimator).
        env: multi-turn episode limits, with ``environment``
            (:class:`~lit_rlhf.settings.EnvironmentSettings`).
        eval: validation / test pass@1 and pass@k (:class:`~lit_rlhf.settings.EvalSettings`).
        distill: on-policy distillation from a frozen teacher, the per-token reverse KL as the
            reward (:class:`~lit_rlhf.settings.DistillSettings`); a teacher object that scores
            tokens may be set on the attribute ``teacher`` before the fit instead of loading one.

    The groups validate themselves, and their combinations are validated into a
    :class:`~lit_rlhf.training.PPOSettings`, when the module is built (before any model loads).
    """

    def __init__(
        self,
        # the list first: jsonargparse can then write a list of rewards back into config.yaml
        reward: list[RewardFunction | Callable[..., Any]] | RewardFunction | Callable[..., Any],
        model: str = "builtin:tiny-llama",
        engine: GenerationEngineLike | None = None,
        tokenizer: Any = None,
        environment: EnvironmentLike | None = None,
        reward_weights: list[float] | None = None,
        reward_fallback: float = 0.0,
        optim: OptimSettings = _OPTIM,
        precision: PrecisionSettings = PrecisionSettings(),
        lora: LoRASettings = LoRASettings(),
        update: UpdateSettings = UpdateSettings(),
        rollout: RolloutSettings = RolloutSettings(),
        advantage: AdvantageSettings = AdvantageSettings(),
        loss: PolicyLossSettings = PolicyLossSettings(),
        mismatch: MismatchSettings = MismatchSettings(),
        kl: KLSettings = KLSettings(),
        critic: CriticSettings = CriticSettings(),
        env: EnvironmentSettings = EnvironmentSettings(),
        eval: EvalSettings = EvalSettings(),
        distill: DistillSettings = DistillSettings(),
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["reward", "engine", "tokenizer", "environment"])
        g = take_groups(self)  # each an instance or a dict (hparams), validated
        self.optim, self.precision, self.lora = g["optim"], g["precision"], g["lora"]
        self.env, self.eval_settings = g["env"], g["eval"]
        self.settings = PPOSettings.of(g)  # validates the combinations
        self.kl_coef = float(self.settings.kl.coef)  # a plain attribute: AdaptiveKL rewrites it
        check_unread(self, environment)
        self._init_core(combined_reward(reward, reward_weights), engine, environment)
        self.tokenizer = tokenizer
        self._init_state()

    def _init_core(
        self,
        reward: RewardFunction | Callable[..., Any],
        engine: GenerationEngine | None,
        environment: Environment | None = None,
    ) -> None:
        """The shared core's rollout and update."""
        self.automatic_optimization = False
        self.engine: GenerationEngine = engine or HFGenerationEngine()
        self.rollouts = RolloutCollector(
            self.engine,
            reward,
            fallback=self.hp.reward_fallback,
            multiturn=multiturn_rollout(environment, self.env, self.settings.rollout),
        )
        self.rl = PolicyStep(self.settings, self.rollouts)

    def _init_state(self) -> None:
        """Networks (built in ``configure_model``), counters and evaluation metrics."""
        self.rollout_step = 0
        self._pass_metric_checked = False  # eval.pass_metric on the first training rollout
        self.policy: Any = None
        self.critic: Any = None
        self.ref_policy: Any = None
        # distill.teacher, a TokenScorer: served (built here; None otherwise) or frozen (loaded
        # in configure_model)
        self.teacher: Any = served_teacher(self.settings.distill, self.engine.temperature)
        self.val_reward, self.val_pass = MeanMetric(), MeanMetric()
        self.test_reward, self.test_pass = MeanMetric(), MeanMetric()
        self.task_reward = {"val": GroupedMean(), "test": GroupedMean()}  # multi-domain runs
        # eval.samples > 1: pass@k and the sampled pass@1 per stage (ModuleDicts follow the device)
        self.pass_at_k = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})
        self.sampled_pass = nn.ModuleDict({"val": MeanMetric(), "test": MeanMetric()})

    @property
    def hp(self) -> Any:
        """``self.hparams`` with attribute access typed loosely (it is an AttributeDict)."""
        return self.hparams

    # ----------------------------------------------------------------- setup
    def setup(self, stage: str) -> None:
        if stage == "fit":  # the data against the update and the context, before models load
            check_fit_setup(self)
            self.rl.check_data(self)

    def configure_model(self) -> None:
        strategy = self._trainer.strategy if self._trainer is not None else None
        # under DeepSpeed, clipping is DeepSpeed's own (Lightning's clip_gradients is a no-op)
        self.rl.step_optimizer.configure(strategy)
        if self.policy is not None:
            return
        critic = self.settings.critic_network
        nets = build_networks(
            self, strategy, critic=critic, critic_model=self.settings.critic.model
        )
        self.policy, self.critic, self.ref_policy = nets.policy, nets.critic, nets.ref_policy
        if nets.teacher is not None:
            self.teacher = FrozenTeacher(nets.teacher, self.settings.packed)

    def export_network(self) -> tuple[Any, Any]:
        """What ``lit-rlhf export`` writes: the policy (the critic / value head and the
        reference are not exported) and the tokenizer."""
        return self.policy, self.tokenizer

    def configure_optimizers(self) -> Any:
        policy = [p for p in self.policy.parameters() if p.requires_grad]
        groups: list[dict[str, Any]] = [{"params": policy, "name": "policy"}]  # optim.lr
        if self.critic is not None:  # the names key clip_per_network's logged norms
            critic = list(self.critic.parameters())
            groups.append({"params": critic, "lr": self.settings.critic.lr, "name": "critic"})
        return self.rl.step_optimizer.adamw(groups)

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
        self._check_pass_metric(rollout)
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
        """Reward and pass@1 of one response per prompt (greedy unless ``eval.greedy`` is off)."""
        greedy, k = self.eval_settings.greedy, self.eval_settings.samples
        rollout = self.rollouts.collect(
            self.policy, self.tokenizer, batch, samples_per_prompt=1, greedy=greedy, log_probs=False
        )
        reward.update(rollout.scores)
        self.task_reward[stage].update(rollout.scores.to(self.device), rollout.tasks)
        passed.update(self._passed(rollout).to(self.device))
        self.log(f"{stage}/reward", reward, on_epoch=True, batch_size=len(rollout))
        self.log(f"{stage}/pass@1", passed, on_epoch=True, prog_bar=True, batch_size=len(rollout))
        if k > 1:
            self._evaluate_sampled(batch, stage, k)

    def _evaluate_sampled(self, batch: dict[str, Any], stage: str, k: int) -> None:
        """pass@k and the sampled pass@1 of ``eval.samples`` (k) engine samples per prompt."""
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

    def _check_pass_metric(self, rollout: Rollout) -> None:
        """``eval.pass_metric`` against the first training rollout with a scored sample, not
        only at the first validation (possibly hours later)."""
        failed = failed_samples(rollout.reward_info, len(rollout))
        if self._pass_metric_checked or bool(failed.all()):
            return
        self._passed(rollout)
        self._pass_metric_checked = True

    def _passed(self, rollout: Rollout) -> Tensor:
        """[B] 1.0 where ``eval.pass_metric`` (or the score) reaches ``eval.pass_threshold``."""
        key, threshold = self.eval_settings.pass_metric, self.eval_settings.pass_threshold
        if key is None:
            return (rollout.scores >= threshold).float()
        if key not in rollout.reward_info:
            raise SettingError(
                f"eval.pass_metric={key!r} is not in the reward's info (it has "
                f"{sorted(rollout.reward_info)}). Fix: set model.init_args.eval.pass_metric to "
                "one of those, or to null to compare the score itself with eval.pass_threshold",
                setting="model.init_args.eval.pass_metric",
            )
        return (rollout.reward_info[key].float() >= threshold).float()

    def close(self) -> None:
        """Release the generation engine's resources (``lit-rlhf`` calls it after the run)."""
        self.rl.close()
        if hasattr(self.teacher, "close"):
            self.teacher.close()

    # ------------------------------------------------------------ checkpoint
    def configure_callbacks(self) -> list[Callback]:
        return module_callbacks()  # exact resumes, plain progress lines

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.rl.save(self, checkpoint)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.rl.load(self, checkpoint)


__all__ = ["PPOModule"]
