"""One policy-optimisation step (rollout -> experience -> clipped updates -> logs) as a component
that every RL module composes: ``PPOModule`` on task prompts, ``GenerativeRewardModule`` on
judge prompts. The module keeps the networks and the training counters; this keeps the
settings, the rollout collector, the optimizer step and the mini-batch shuffling.

The module must have: ``policy``, ``critic`` (None without GAE), ``ref_policy`` (None without a
KL, and under LoRA, where the reference is ``policy`` with its adapters off), ``tokenizer``, a
float ``kl_coef`` (an adaptive controller may move it), an int ``rollout_step`` and, distilling,
a ``teacher`` (:class:`~lit_rlhf.rollout.TokenScorer`); it uses manual optimisation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from typing import Any

import torch
from torch import Tensor

from lit_rlhf.algos import overlong_penalty, truncated_responses
from lit_rlhf.models.checkpoint_weights import check_checkpoint_weights
from lit_rlhf.models.loading import context_length
from lit_rlhf.models.lora import is_lora
from lit_rlhf.plan.flops import start_timer, update_perf
from lit_rlhf.training.completions import due_completions
from lit_rlhf.training.dynamic_sampling import DynamicSampler
from lit_rlhf.training.experience import build_experience, experience_stats
from lit_rlhf.training.frozen import FrozenModules, drop_frozen_weights, restore_frozen_weights
from lit_rlhf.training.optimization import OptimizerStep
from lit_rlhf.training.overlap import unused_queue_warning
from lit_rlhf.training.partial import make_overlap
from lit_rlhf.training.ppo_update import PPOUpdate
from lit_rlhf.training.protocols import policy_loss_terms
from lit_rlhf.training.reward_mask import nothing_to_update
from lit_rlhf.training.rollouts import RolloutCollector, rollout_stats
from lit_rlhf.training.settings import PPOSettings
from lit_rlhf.types import Experience, Rollout

# the module settings (hparams, dotted into a group) that decide which networks a checkpoint's
# weights belong to
_NETWORK_SETTINGS = (
    "model",
    "advantage.estimator",
    "critic.kind",
    "critic.model",
    "lora.rank",
    "lora.target_modules",
)


class PolicyStep:
    """Args:
    settings: the update's settings (the groups; their ``optim`` also gives the optimizer
        step: clipping, per-network clipping, skips of non-finite steps and the lr schedule,
        :meth:`OptimizerStep.from_settings`, checkpointed through :meth:`save`).
    collector: engine + reward (+ the trainer's reward-term callbacks).
    """

    def __init__(self, settings: PPOSettings, collector: RolloutCollector) -> None:
        self.settings = settings
        self.collector = collector
        rollout = settings.rollout
        k = rollout.max_staleness  # one-step-off: rollouts generated beside the update
        self.step_optimizer = OptimizerStep.from_settings(
            settings.optim,
            norm_key="ppo/grad_norm",
            lr_idle_batches=k,  # the first k batches only generate
        )
        self.shuffle = torch.Generator().manual_seed(settings.update.seed)
        self.frozen = FrozenModules("ref_policy", "teacher")
        self.logged_keys: set[str] = set()  # every step metric logged so far
        self.mismatch = resolve_mismatch(settings, collector.engine)
        self.sampler = (
            DynamicSampler(rollout.dynamic_sampling_max_rounds)
            if rollout.dynamic_sampling
            else None
        )
        self.norm_length = settings.norm_length(collector.engine)
        self.overlap = make_overlap(k, rollout.partial_rollouts)
        self._overlapping = False  # the engine's weight sync waits for the worker
        self.overlong_buffer = rollout.overlong_buffer
        self.overlong_factor = rollout.overlong_penalty_factor
        self.overlong_filter = rollout.overlong_filter
        self.samples_per_prompt = rollout.samples_per_prompt

    def check_data(self, module: Any) -> None:
        """``LightningModule.setup`` (before ``configure_model`` loads any network): the data's
        batch size against ``mini_batch_size``, and its longest prompt plus the engine's
        ``max_new_tokens`` against the model's context. ``update.global_mini_batch_size`` is
        divided by the world size here (the module's and this step's settings both)."""
        world = int(getattr(module.trainer, "world_size", 1) or 1)
        self.settings = module.settings = self.settings.per_process(world, log=True)
        data = getattr(module.trainer, "datamodule", None)
        batch_size = getattr(data, "batch_size", None)
        if isinstance(batch_size, int):
            self.settings.check_rollout_size(batch_size)
        if self.overlap is not None:
            self.overlap.check(module.trainer, self.collector.engine)
        longest = getattr(data, "longest_prompt", 0)
        new_tokens = getattr(self.collector.engine, "max_new_tokens", None)
        buffer = self.overlong_buffer
        if buffer is not None and isinstance(new_tokens, int) and buffer > new_tokens:
            raise ValueError(
                f"rollout.overlong_buffer={buffer} is longer than the engine's max_new_tokens="
                f"{new_tokens}: the soft overlong penalty would start before the first token. "
                "Fix: set rollout.overlong_buffer below max_new_tokens (DAPO: 4096 of 20480)."
            )
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
        """G sampled responses per prompt, scored by the reward and the reward-term callbacks
        (and DAPO's soft overlong penalty when ``overlong_buffer`` is set). The engine is asked
        for the sampled tokens' log-probs only if something reads them."""
        g = self.samples_per_prompt
        rollout = self.collector.collect(
            module.policy,
            module.tokenizer,
            batch,
            samples_per_prompt=g,
            log_probs=self.needs_sample_log_probs(module, len(batch["prompt"]) * g),
            trainer=module.trainer,
            module=module,
        )
        return self._penalized(rollout)

    @contextmanager
    def overlapped(self, module: Any, batch: dict[str, Any]) -> Iterator[Rollout | None]:
        """One-step-off (``max_staleness`` k > 0): ``batch`` is generated in the background
        while the body updates on the yielded rollout, the one generated k steps ago (None while
        the queue fills); then the engine serves the updated weights (:mod:`.overlap`; with
        ``partial_rollouts`` without waiting for the generations in flight, :mod:`.partial`)."""
        assert self.overlap is not None
        g = self.samples_per_prompt
        collector, tokenizer = self.collector, module.tokenizer

        def generate(model: Any) -> Any:
            return collector.generate(model, tokenizer, batch, samples_per_prompt=g)

        def score(out: Any) -> Rollout:
            rollout = collector.scored(
                tokenizer, batch, out, samples_per_prompt=g, trainer=module.trainer, module=module
            )
            return self._penalized(rollout)

        self._overlapping = True
        try:
            with self.overlap.step(
                module.policy, collector.engine, module.rollout_step, generate, score
            ) as ready:
                yield ready
        finally:
            self._overlapping = False
        stats = {k: v.float() for k, v in self.overlap.last_stats.items()}
        module.log_dict(stats, on_step=True, batch_size=len(batch["prompt"]) * g)

    def _penalized(self, rollout: Rollout) -> Rollout:
        """DAPO's soft overlong penalty added to the scores (``overlong_buffer`` set)."""
        buffer = self.overlong_buffer
        if buffer is not None:
            penalty = overlong_penalty(
                rollout.response_mask.sum(1), max_length=self._max_new_tokens(), buffer=buffer,
                factor=self.overlong_factor,
            ).to(rollout.scores)  # fmt: skip
            rollout.scores = rollout.scores + penalty
            rollout.term_stats["rollout/overlong_penalty"] = penalty.mean()
        return rollout

    def filled(self, module: Any, rollout: Rollout, target: int) -> Rollout | None:
        """With ``dynamic_sampling``: the update's rollout of exactly ``target`` groups whose
        rewards differ once the buffer (and every rank's) holds that many, else None (logged:
        the share of informative groups of this round). Without it: ``rollout`` itself."""
        if self.sampler is None:
            return rollout
        pad_id = getattr(getattr(module, "tokenizer", None), "pad_token_id", None) or 0
        out = self.sampler.add(rollout, target, pad_id)
        if out is None:
            stats = {k: v.float() for k, v in self.sampler.last_stats.items()}
            module.log_dict(stats, on_step=True, batch_size=len(rollout))
        return out

    def needs_sample_log_probs(self, module: Any, n: int) -> bool:
        """Whether the engine's log-probs are read: by the mismatch correction, with several
        updates per rollout (the ratio's denominator) or a KL penalty in the reward (computed
        before the update), unless they are recomputed anyway. With one update and the KL in
        the loss, the update fills ``experience.old_log_probs`` from its own forward (read by
        ``rollout/kl``, the KL controller)."""
        if self.mismatch != "none":
            return True
        if self.settings.recompute:
            return False  # build_experience computes them with the training forward
        kl_in_reward = module.kl_coef > 0 and self.settings.kl_in_reward
        return kl_in_reward or not self.settings.single_update(n)

    def prepare(self, module: Any, rollout: Rollout) -> Experience:
        """Old log-probs, reference log-probs, values and advantages for the whole rollout;
        with ``overlong_filter`` the truncated responses are left out of the loss, and so are
        multi-turn episodes a token budget cut (unless ``budget_penalty`` scores them); with
        partial rollouts, samples staler than ``max_staleness`` leave the update."""
        ref_policy, reference_mode = self.reference(module)
        stale = self.overlap.left_out(rollout, module.rollout_step) if self.overlap else None
        experience = build_experience(
            rollout,
            policy=module.policy,
            settings=self.settings,
            temperature=self.collector.engine.temperature,
            kl_coef=module.kl_coef,
            critic=module.critic,
            ref_policy=ref_policy,
            use_current_as_old=self.settings.single_update(len(rollout)),
            reference_mode=reference_mode,
            left_out=stale,
            teacher=getattr(module, "teacher", None) if self.settings.distill.enabled else None,
        )
        if self.overlong_filter:
            experience.loss_mask = ~self.truncated(module, rollout)
        multiturn = getattr(self.collector, "multiturn", None)
        if rollout.cut is not None and multiturn and multiturn.budget_penalty is None:
            kept = ~rollout.cut
            loss_mask = experience.loss_mask
            experience.loss_mask = kept if loss_mask is None else loss_mask & kept
        return experience

    @staticmethod
    def reference(module: Any) -> tuple[Any, Callable[[], AbstractContextManager[Any]]]:
        """The KL's reference network and the context its forward runs in: the separate frozen
        copy; under LoRA (with ``kl_coef`` > 0) the policy itself with its adapters switched
        off; else None."""
        if module.ref_policy is not None:
            return module.ref_policy, nullcontext
        if module.kl_coef > 0 and is_lora(module.policy):
            return module.policy, module.policy.disable_adapter
        return None, nullcontext

    def truncated(self, module: Any, rollout: Rollout) -> Tensor:
        """[B] bool: responses the engine's ``max_new_tokens`` cut (no end-of-sequence token)."""
        mask = rollout.response_mask
        lengths = mask.sum(1)
        cap = getattr(self.collector.engine, "max_new_tokens", None)
        if not isinstance(cap, int):
            return mask[:, -1]  # an engine without a cap: ran to the last column
        last = rollout.response_ids.gather(1, (lengths - 1).clamp(min=0)[:, None]).squeeze(1)
        eos = getattr(getattr(module, "tokenizer", None), "eos_token_id", None)
        eos_ids = torch.as_tensor(-1 if eos is None else eos, device=last.device).reshape(-1)
        ended = (lengths < cap) | torch.isin(last, eos_ids)
        return truncated_responses(mask, ended)

    def _max_new_tokens(self) -> int:
        cap = getattr(self.collector.engine, "max_new_tokens", None)
        if not isinstance(cap, int):
            raise ValueError(
                "rollout.overlong_buffer penalises lengths near the engine's max_new_tokens, but "
                f"the engine {type(self.collector.engine).__name__} has none. Fix: set "
                "rollout.overlong_buffer: null, or use an engine with max_new_tokens."
            )
        return cap

    def optimize(self, module: Any, experience: Experience) -> dict[str, Tensor]:
        """``ppo_epochs`` passes of clipped updates over mini-batches of the experience; the
        engine serves the new weights after every optimizer step. No step at all when no sample
        is left (:func:`~lit_rlhf.training.reward_mask.nothing_to_update`)."""
        if (skipped := nothing_to_update(experience, module.rollout_step)) is not None:
            return skipped
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
            mismatch=self.mismatch,
            norm_length=self.norm_length,
        )
        start = start_timer(module.device)
        stats = update.run(
            module,
            module.optimizers(),
            self.step_optimizer,
            generator=self.shuffle,
            after_step=lambda: None if self._overlapping else engine.sync_weights(module.policy),
        )
        update_settings = self.settings.update
        passes, peak = update_settings.ppo_epochs, update_settings.device_peak_flops
        return stats | update_perf(module, experience.rollout, passes, start, peak)

    def log(
        self, module: Any, experience: Experience, update_stats: dict[str, Tensor]
    ) -> dict[str, Any]:
        """Log the step's statistics; returns what callbacks read (``reward``, ``kl``,
        ``num_sequences``; ``completions`` for :class:`CompletionTable`)."""
        n, kept = len(experience), experience.kept  # the KL is measured on the kept samples
        stats = {**rollout_stats(experience.rollout), **experience_stats(experience)}
        if self.sampler is not None:
            stats.update(self.sampler.last_stats)
        stats["rollout/truncated"] = self.truncated(module, experience.rollout).float().mean()
        if experience.loss_mask is not None:
            stats["rollout/overlong_filtered"] = (~experience.loss_mask).float().mean()
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
        sequences = torch.tensor(n if kept is None else int(kept.sum()))
        kl = stats.get("rollout/kl", torch.tensor(0.0))
        out = {"reward": stats["reward/mean"].detach(), "kl": kl, "num_sequences": sequences}
        return due_completions(out, self.settings.rollout.log_completions, module, experience)

    def save(self, module: Any, checkpoint: dict[str, Any]) -> None:
        """``on_save_checkpoint``: the counters (rollouts, skipped optimizer steps, the lr
        schedule's), the KL coefficient, the shuffling state and a stateful reward's
        ``state_dict()`` go into the checkpoint; the frozen reference and, under LoRA, the
        policy's frozen base (the starting model, reloaded on every start) do not."""
        checkpoint["lit_rlhf"] = {
            "rollout_step": module.rollout_step,
            "kl_coef": module.kl_coef,
            "shuffle_rng": self.shuffle.get_state(),
            "optimizer_step": self.step_optimizer.state_dict(),
        }
        if self.sampler is not None:  # the groups gathered since the last update
            checkpoint["lit_rlhf"]["dynamic_sampling"] = self.sampler.state_dict()
        if self.overlap is not None:  # generated ahead, not yet trained on
            checkpoint["lit_rlhf"]["overlap"] = self.overlap.state_dict()
        reward_state = getattr(self.collector.reward, "state_dict", None)
        if callable(reward_state):  # a stateful reward (e.g. ScalarRMReward's running mean)
            checkpoint["lit_rlhf"]["reward"] = reward_state()
        self.frozen.drop(checkpoint)
        policy: Any = getattr(module, "policy", None)
        if is_lora(policy):  # the adapters only
            drop_frozen_weights(checkpoint, "policy", policy)

    def load(self, module: Any, checkpoint: dict[str, Any]) -> None:
        """``on_load_checkpoint``: the reverse of :meth:`save` (the reference's and the LoRA
        base's weights are put back into the state dict, so strict loading finds every key). A
        checkpoint of other networks (another ``model``) is refused with both models named."""
        self.frozen.restore(module, checkpoint)
        policy: Any = getattr(module, "policy", None)
        if is_lora(policy):
            restore_frozen_weights(checkpoint, "policy", policy)
        check_checkpoint_weights(module, checkpoint, settings=_NETWORK_SETTINGS)
        state = checkpoint.get("lit_rlhf", {})
        module.rollout_step = state.get("rollout_step", 0)
        module.kl_coef = state.get("kl_coef", module.kl_coef)
        if "shuffle_rng" in state:
            self.shuffle.set_state(state["shuffle_rng"])
        self.step_optimizer.load_state_dict(state.get("optimizer_step", {}))
        if self.sampler is not None and "dynamic_sampling" in state:
            self.sampler.load_state_dict(state["dynamic_sampling"])
        if self.overlap is not None:
            self.overlap.load_state_dict(state.get("overlap", {}))
        else:
            unused_queue_warning(state.get("overlap", {}))
        restore = getattr(self.collector.reward, "load_state_dict", None)
        if "reward" in state and callable(restore):
            restore(state["reward"])

    def close(self) -> None:
        """Release what the generation engine holds outside PyTorch (a vLLM instance); engines
        without such resources have no ``close``."""
        if self.overlap is not None:
            self.overlap.close()
        close = getattr(self.collector.engine, "close", None)
        if callable(close):
            close()


def resolve_mismatch(settings: PPOSettings, engine: Any) -> str:
    """``mismatch.correction`` for this engine: ``auto`` is ``tis`` for an engine whose
    log-probs come from its own kernels (``separate_numerics``, e.g. vLLM) or with
    ``rollout.max_staleness`` > 0 (samples from older weights), when the trainer's old log-probs
    exist (one update per rollout, or ``update.recompute_old_log_probs``), else ``none``."""
    chosen = settings.mismatch.correction
    if chosen != "auto":
        return chosen
    # one-step-off samples come from older weights: the decoupled objective's weight is TIS's
    stale = settings.rollout.max_staleness > 0
    separate = bool(getattr(engine, "separate_numerics", False)) or stale
    return "tis" if separate and settings.trainer_old_log_probs else "none"
