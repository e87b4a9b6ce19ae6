"""A generative reward model (an LLM judge that writes a critique and a verdict on a pair of
responses), trained with GRPO over judge prompts: RFT against gold labels, or ConsistRM without
labels (arXiv 2604.07484).

The update is the shared core's (``lit_rlhf.training.PolicyStep``: rollout -> experience ->
clipped GRPO updates), fed by the same ``PromptDataModule`` with a pair source
(``PreferencePairs``, ``SyntheticPairs``). ``mode: rft`` scores verdicts against the rows' gold
labels (``VerdictReward(mode="gold")``); ``mode: consistrm`` scores the format only and takes its
answer signal from the ConsistRM reward-term callbacks (``ConsistencyAnswerReward``,
``CritiqueConsistencyReward``), which must be in ``trainer.callbacks``; ``mode: reflectrm``
(arXiv 2604.07506) trains response preference and analysis preference in one run on the mixed
records of ``scripts/build_reflectrm_data.py`` (the gold reward, each row's ``subject`` saying
which verdict sentence it expects).

Validation / test / predict judge each pair by ``inference``: ``single`` (one greedy judgment),
``majority`` (of ``eval_samples`` sampled ones) or ``reflective`` (ReflectRM's two-stage
inference, :mod:`lit_rlhf.modules.judge_inference`), and log accuracy, positional consistency
(use a source with ``swap: both``), format-valid rate, tie rate and per-subset accuracy.
``predict_step`` returns the verdicts.
"""

from __future__ import annotations

from typing import Any, Literal

import torch
from lightning import Callback, LightningModule
from lightning.pytorch.utilities import rank_zero_warn

from lit_rlhf.algos.judge import JUDGE_TAGS, JudgeFormat
from lit_rlhf.data.judge_templates import judge_template
from lit_rlhf.data.prompts import render_chat_prompt
from lit_rlhf.metrics import JudgeMetrics
from lit_rlhf.models import load_tokenizer
from lit_rlhf.models.loading import Dtype
from lit_rlhf.models.lora import LoRASettings, check_quantize_supported
from lit_rlhf.modules.judge_inference import Decision, Inference, JudgeInference
from lit_rlhf.rewards.base import RewardFunction
from lit_rlhf.rewards.verdict import VerdictReward, gold_label
from lit_rlhf.rollout.base import GenerationEngine
from lit_rlhf.rollout.hf import HFGenerationEngine
from lit_rlhf.training import (
    EpochEndLoaderReset,
    GlobalRNGState,
    LRScheduleSettings,
    PolicyStep,
    PPOSettings,
    RewardTerm,
    RolloutCollector,
    build_policy_networks,
    check_trainable_precision,
)
from lit_rlhf.training.settings import module_setting_rules, refuse_out_of_range


class GenerativeRewardModule(LightningModule):
    """Args:
    mode: ``rft`` (gold labels), ``consistrm`` (label-free; needs the consistency callbacks) or
        ``reflectrm`` (gold labels on ReflectRM's mixed response / analysis preference records).
    model: the judge: hub id, local folder, or ``builtin:<name>``.
    reward: overrides the default ``VerdictReward`` (gold for rft, format-only for consistrm).
    engine: generation engine (HF generate by default, the decode loop or vLLM).
    tokenizer: a tokenizer object; the CLI links the DataModule's.
    samples_per_prompt: K rollouts per judge prompt (the GRPO group).
    ppo_epochs, mini_batch_size, micro_batch_size, clip_low, clip_high, dual_clip, loss_agg,
        scale_by_std: the GRPO update (see ``PPOModule``; ``mini_batch_size`` counts sequences,
        prompts x ``samples_per_prompt``, per rank).
    micro_batch_tokens: packed micro-batches of at most this many real tokens instead of
        ``micro_batch_size`` sequences (see ``PPOModule``; null: padded micro-batches).
    recompute_old_log_probs: recompute the rollout's log-probs with the trainer's forward pass
        instead of the engine's (verl always does; set it with vLLM when a rollout gets more
        than one optimizer step, since vLLM's numerics differ from the trainer's).
    mismatch_correction, mismatch_cap, mismatch_low, mismatch_high: the correction for the
        engine's log-probs against the trainer's (see ``PPOModule``; ``auto``: truncated
        importance sampling with vLLM when the trainer's old log-probs exist).
    kl_coef, kl_estimator: KL to the frozen starting judge, in the loss (0: no reference).
    lr, weight_decay, max_grad_norm, dtype, gradient_checkpointing: optimisation (a 16-bit
        ``dtype`` trains only under DeepSpeed's bf16 optimizer; otherwise float32 with
        ``trainer.precision: bf16-mixed``: refused at setup, before any load).
    reference_dtype: the frozen reference's dtype (None: ``dtype``); it may be 16-bit.
    lora_rank, lora_alpha, lora_target_modules, lora_dropout: 0 = train every weight; > 0 =
        peft LoRA adapters (the ``[lora]`` extra; arXiv 2106.09685) of this rank on
        ``lora_target_modules`` (``all-linear``: every linear layer but the head), scaled by
        ``lora_alpha / lora_rank``, with ``lora_dropout`` in [0, 1). The base is frozen and is the
        KL's reference (the adapters switched off: no second model is loaded); checkpoints hold
        the adapters only; vLLM serves the merged weights.
    quantize: ``4bit`` loads the frozen base in NF4 with bf16 compute (QLoRA, arXiv
        2305.14314; bitsandbytes on a CUDA GPU; needs ``lora_rank`` > 0); refused at setup on
        a machine without CUDA or bitsandbytes. None: the base in ``dtype``.
    lr_warmup_steps, lr_warmup_ratio, lr_schedule, min_lr_ratio, lr_interval, lr_total_steps: the
        lr schedule (warmup, then constant / linear / cosine; once per rollout batch or per
        optimizer step; see ``PPOModule``).
    eval_samples: judge outputs per pair at validation / test / predict.
    inference: ``single`` (needs ``eval_samples: 1``), ``majority`` or ``reflective`` (N >= 2);
        default: ``single`` for one sample, else ``majority``.
    critique_template: the analysis-preference template of reflective inference.
    tags, subject: the judge output format (the reward and the evaluation parse it).
    response_prefix: the assistant pre-fill the data module adds (its ``response_prefix``); it is
        put back before each output when parsing.
    response_suffix: a fixed ending put after each output when parsing, for a judge that
        generates only the verdict word (with ``max_new_tokens: 1`` on the engine; see
        ``configs/grm/rft_smollm2.yaml``).
    seed: seeds the mini-batch shuffling.
    max_consecutive_skips: non-finite optimizer steps are skipped (``fault/skipped_steps``); this
        many in a row stop the run (see ``PPOModule``).
    """

    def __init__(
        self,
        mode: Literal["rft", "consistrm", "reflectrm"] = "rft",
        model: str = "builtin:tiny-llama",
        reward: RewardFunction | None = None,
        engine: GenerationEngine | None = None,
        tokenizer: Any = None,
        samples_per_prompt: int = 8,
        ppo_epochs: int = 1,
        mini_batch_size: int | None = None,
        micro_batch_size: int = 8,
        micro_batch_tokens: int | None = None,
        clip_low: float = 0.2,
        clip_high: float = 0.2,
        dual_clip: float | None = None,
        loss_agg: Literal["token_mean", "seq_mean_token_mean", "seq_mean_token_sum"] = "token_mean",
        scale_by_std: bool = True,
        recompute_old_log_probs: bool = False,
        kl_coef: float = 0.0,
        kl_estimator: Literal["k1", "k2", "k3"] = "k3",
        lr: float = 1e-6,
        weight_decay: float = 0.0,
        max_grad_norm: float | None = 1.0,
        lr_warmup_steps: int = 0,
        lr_warmup_ratio: float = 0.0,
        lr_schedule: Literal["constant", "linear", "cosine"] = "constant",
        min_lr_ratio: float = 0.0,
        lr_interval: Literal["batch", "optimizer_step"] = "batch",
        lr_total_steps: int | None = None,
        dtype: Dtype = "float32",
        reference_dtype: Dtype | None = None,
        gradient_checkpointing: bool = False,
        eval_samples: int = 1,
        inference: Inference | None = None,
        critique_template: str = "reflectrm-critique-v1",
        tags: tuple[str, ...] = JUDGE_TAGS,
        subject: str = "Response",
        response_prefix: str = "",
        response_suffix: str = "",
        seed: int = 0,
        max_consecutive_skips: int = 5,
        mismatch_correction: Literal["auto", "none", "tis", "mask"] = "auto",
        mismatch_cap: float = 2.0,
        mismatch_low: float = 0.5,
        mismatch_high: float = 2.0,
        lora_rank: int = 0,
        lora_alpha: int = 16,
        lora_target_modules: str | list[str] = "all-linear",
        lora_dropout: float = 0.0,
        quantize: Literal[None, "4bit"] = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["reward", "engine", "tokenizer"])
        self._init_core(reward, engine)
        self.tokenizer = tokenizer
        self.kl_coef = float(kl_coef)
        self._init_state()

    def _init_core(self, reward: RewardFunction | None, engine: GenerationEngine | None) -> None:
        """Validated settings (before any model loads), the judge's format and inference, and
        the shared core's rollout and GRPO update."""
        hp = self.hp
        _check_settings(hp)
        self.settings = PPOSettings.from_hparams({**hp, "advantage": "grpo"})
        self.lr_settings = LRScheduleSettings.from_hparams(hp)  # validates
        self.lora = LoRASettings.from_hparams(hp)
        self.lora.check()  # quantize needs adapters
        self.judge_format = JudgeFormat(
            tuple(hp.tags), hp.subject, hp.response_prefix, hp.response_suffix
        )
        self.automatic_optimization = False
        self.engine: GenerationEngine = engine or HFGenerationEngine()
        self.rollouts = RolloutCollector(self.engine, self._judge_reward(reward, hp.mode))
        self.inference = JudgeInference(
            self.engine,
            self.judge_format,
            mode=hp.inference or ("single" if hp.eval_samples == 1 else "majority"),
            samples=hp.eval_samples,
            critique_template=hp.critique_template,
            seed=hp.seed,
        )
        self.critiques_seen = 0
        self.rl = PolicyStep(
            self.settings,
            self.rollouts,
            max_grad_norm=hp.max_grad_norm,
            seed=hp.seed,
            max_consecutive_skips=hp.max_consecutive_skips,
            lr_schedule=self.lr_settings,
        )

    def _init_state(self) -> None:
        """Networks (built in ``configure_model``), counters and evaluation metrics."""
        self.rollout_step = 0
        self.policy: Any = None
        self.critic: Any = None
        self.ref_policy: Any = None
        self.val_metrics, self.test_metrics = JudgeMetrics(), JudgeMetrics()

    def _judge_reward(self, reward: RewardFunction | None, mode: str) -> RewardFunction:
        """The given reward (a ``VerdictReward`` must read outputs as the evaluation does), or
        the default ``VerdictReward``: gold labels for rft, the format alone for consistrm."""
        fmt = self.judge_format
        if reward is None:
            return VerdictReward(
                mode="format" if mode == "consistrm" else "gold",
                tags=fmt.tags,
                subject=fmt.subject,
                prefix=fmt.prefix,
                suffix=fmt.suffix,
            )
        if isinstance(reward, VerdictReward) and reward.format != fmt:
            raise ValueError(
                f"the reward reads judge outputs as {reward.format}, but the module evaluates "
                f"them as {fmt}. Fix: give the module the same tags, subject, "
                "response_prefix and response_suffix as the reward (tags/subject/prefix/suffix)."
            )
        return reward

    @property
    def hp(self) -> Any:
        """``self.hparams`` with attribute access typed loosely (it is an AttributeDict)."""
        return self.hparams

    def setup(self, stage: str) -> None:
        if stage == "fit":  # the data against the update and the context, before models load
            check_trainable_precision(self.trainer, {"dtype": self.hp.dtype})
            check_quantize_supported(self.lora.quantize)  # before the 4-bit base loads
            self._require_reward_terms()
            self.rl.check_data(self)

    def configure_model(self) -> None:
        strategy = self._trainer.strategy if self._trainer is not None else None
        self.rl.step_optimizer.configure(strategy)
        if self.policy is not None:
            return
        hp = self.hp
        if self.tokenizer is None:
            self.tokenizer = load_tokenizer(hp.model)
        nets = build_policy_networks(
            hp.model,
            strategy=strategy,
            dtype=hp.dtype,
            reference_dtype=hp.reference_dtype,
            reference=self.kl_coef > 0,
            gradient_checkpointing=hp.gradient_checkpointing,
            lora=self.lora,
        )
        self.policy, self.ref_policy = nets.policy, nets.ref_policy

    def export_network(self) -> tuple[Any, Any]:
        """What ``lit-rlhf export`` writes: the judge's policy (the reference is not
        exported) and the tokenizer."""
        return self.policy, self.tokenizer

    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return torch.optim.AdamW(params, lr=self.hp.lr, weight_decay=self.hp.weight_decay)

    def _require_reward_terms(self) -> None:
        terms = [c for c in self.trainer.callbacks if isinstance(c, RewardTerm)]  # type: ignore[attr-defined]
        if self.hp.mode == "consistrm" and not terms:
            raise ValueError(
                "mode='consistrm' takes its answer reward from reward-term callbacks, and the "
                "trainer has none: the judge would learn the format only. Fix: add "
                "lit_rlhf.callbacks.ConsistencyAnswerReward (and CritiqueConsistencyReward) to "
                "trainer.callbacks, or use mode='rft' with gold labels."
            )

    # ------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        rollout = self.rl.collect(self, batch)  # K judge outputs per pair, scored (+ terms)
        self.critiques_seen += sum(row.get("subject") == "Critique" for row in batch["row"])
        experience = self.rl.prepare(self, rollout)  # group-normalised advantages
        update_stats = self.rl.optimize(self, experience)  # clipped GRPO updates
        self.rollout_step += 1
        return self.rl.log(self, experience, update_stats)

    # ------------------------------------------------- validation / test / predict
    def judge(self, batch: dict[str, Any]) -> list[Decision]:
        """Per pair of the batch, the judgment by ``inference`` (verdict and votes)."""
        dm = getattr(self._trainer, "datamodule", None) if self._trainer is not None else None
        system, use_chat = (
            getattr(dm, "system_prompt", None),
            getattr(dm, "use_chat_template", True),
        )
        template_kwargs, suffix = (  # e.g. Qwen3's thinking switch, as the data renders it
            getattr(dm, "chat_template_kwargs", None),
            getattr(dm, "question_suffix", ""),
        )

        def render(question: str, prefix: str) -> str:
            return render_chat_prompt(
                self.tokenizer, question, system_prompt=system, use_chat_template=use_chat,
                response_prefix=prefix, chat_template_kwargs=template_kwargs,
                question_suffix=suffix,
            )  # fmt: skip

        chat = bool(use_chat and getattr(self.tokenizer, "chat_template", None))
        return self.inference.decide(self.policy, self.tokenizer, batch, render, chat_rendered=chat)

    def _evaluate(self, batch: dict[str, Any], metrics: JudgeMetrics) -> None:
        rows = batch["row"]
        decisions = self.judge(batch)
        metrics.update(
            [d.votes for d in decisions],
            [gold_label(row, i) for i, row in enumerate(rows)],
            [str(row.get("family_id", row["query_id"])) for row in rows],
            [str(row.get("subset") or "") for row in rows],
            verdicts=[d.verdict for d in decisions],
        )

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, self.val_metrics)

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate(batch, self.test_metrics)

    def on_train_epoch_end(self) -> None:
        if self.hp.mode == "reflectrm" and self.critiques_seen == 0:
            rank_zero_warn(
                "mode='reflectrm' trained an epoch without a reflection (analysis-preference) "
                "row: this is plain RFT. Fix: train on the records of "
                "scripts/build_reflectrm_data.py (rows with task: reflection)."
            )

    def on_validation_epoch_end(self) -> None:
        self._log_metrics("val", self.val_metrics)

    def on_test_epoch_end(self) -> None:
        self._log_metrics("test", self.test_metrics)

    def _log_metrics(self, stage: str, metrics: JudgeMetrics) -> None:
        values = metrics.compute()
        self.log_dict({f"{stage}/{k}": v for k, v in values.items()}, prog_bar=False)
        self.log(f"{stage}/acc", values["accuracy"], prog_bar=True, logger=False)
        metrics.reset()

    def predict_step(self, batch: dict[str, Any], batch_idx: int) -> list[dict[str, Any]]:
        return [
            {"query_id": q, "votes": d.votes, "verdict": d.verdict, "anchor": d.anchor,
             "winners": d.winners}
            for q, d in zip(batch["query_id"], self.judge(batch), strict=True)
        ]  # fmt: skip

    def close(self) -> None:
        """Release the generation engine's resources (``lit-rlhf`` calls it after the run)."""
        self.rl.close()

    # ------------------------------------------------------------ checkpoint
    def configure_callbacks(self) -> list[Callback]:
        # exact resumes: the global generators, and a fresh loader after an epoch-end checkpoint
        return [GlobalRNGState(), EpochEndLoaderReset()]

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.rl.save(self, checkpoint)
        checkpoint["lit_rlhf"]["critiques_seen"] = self.critiques_seen

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.rl.load(self, checkpoint)
        # reflectrm's end-of-epoch check counts the run's critiques, before the resume too
        self.critiques_seen = checkpoint.get("lit_rlhf", {}).get("critiques_seen", 0)


def _check_settings(hp: Any) -> None:
    """The module's own settings (the update's are checked by ``PPOSettings``)."""
    if hp.mode not in ("rft", "consistrm", "reflectrm"):
        raise ValueError(f"mode must be 'rft', 'consistrm' or 'reflectrm', got {hp.mode!r}")
    if judge_template(hp.critique_template).subject != "Critique":
        raise ValueError(
            f"critique_template {hp.critique_template!r} compares responses. Fix: use a "
            "critique template, e.g. reflectrm-critique-v1."
        )
    rules = [*module_setting_rules(hp), ("eval_samples", hp.eval_samples >= 1, ">= 1")]
    refuse_out_of_range(rules, hp)
