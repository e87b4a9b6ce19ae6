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
records of ``scripts/data/build_reflectrm_data.py`` (the gold reward, each row's ``subject`` saying
which verdict sentence it expects).

Validation / test / predict judge each pair by ``inference``: ``single`` (one greedy judgment),
``majority`` (of ``eval_samples`` sampled ones) or ``reflective`` (ReflectRM's two-stage
inference, :mod:`lit_rlhf.modules.judge_inference`), and log accuracy, positional consistency
(use a source with ``swap: both``), format-valid rate, tie rate and per-subset accuracy.
``predict_step`` returns the verdicts.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import torch
from lightning import Callback, LightningModule
from lightning.pytorch.utilities import rank_zero_warn

from lit_rlhf.algos.judge import JudgeFormat
from lit_rlhf.data.judge_templates import judge_template
from lit_rlhf.data.prompts import render_chat_prompt
from lit_rlhf.metrics import JudgeMetrics
from lit_rlhf.modules.judge_inference import Decision, JudgeInference, Renderer
from lit_rlhf.modules.ppo_setup import build_networks, check_fit_setup, refuse_set_fields
from lit_rlhf.rewards.base import RewardFunction
from lit_rlhf.rewards.verdict import VerdictReward, gold_label
from lit_rlhf.rollout.base import GenerationEngine, GenerationEngineLike
from lit_rlhf.rollout.hf import HFGenerationEngine
from lit_rlhf.settings import (
    AdvantageSettings,
    JudgeSettings,
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
    RewardTerm,
    RolloutCollector,
)
from lit_rlhf.training.model_hooks import module_callbacks

_OPTIM = OptimSettings(lr=1e-6, micro_batch_size=8)  # GenerativeRewardModule's defaults
_ROLLOUT = RolloutSettings(samples_per_prompt=8)


@refuse_flat_arguments
class GenerativeRewardModule(LightningModule):
    """Args:
    mode: ``rft`` (gold labels), ``consistrm`` (label-free; needs the consistency callbacks) or
        ``reflectrm`` (gold labels on ReflectRM's mixed response / analysis preference records).
    model: the judge: hub id, local folder, or ``builtin:<name>``.
    reward: overrides the default ``VerdictReward`` (gold for rft, format-only for consistrm).
    engine: generation engine (HF generate by default, the decode loop or vLLM).
    tokenizer: a tokenizer object; the CLI links the DataModule's.
    optim: AdamW, clipping, micro-batches, non-finite skips and the lr schedule
        (:class:`~lit_rlhf.settings.OptimSettings`; lr 1e-6; one network, so
        ``clip_per_network`` is refused).
    precision: the judge's dtype, the frozen reference's and activation checkpointing
        (:class:`~lit_rlhf.settings.PrecisionSettings`).
    lora: LoRA / QLoRA adapters; the base is then the KL's reference
        (:class:`~lit_rlhf.settings.LoRASettings`).
    update: epochs, mini-batches (sequences, prompts x ``rollout.samples_per_prompt``, per rank),
        token-budget micro-batches, recomputed old log-probs (verl always recomputes; set it with
        vLLM when a rollout gets more than one optimizer step) and the shuffling seed, which also
        orders reflective inference's analyses (:class:`~lit_rlhf.settings.UpdateSettings`).
    rollout: K judge outputs per prompt (the GRPO group; 8) and DAPO's overlong handling
        (:class:`~lit_rlhf.settings.RolloutSettings`; ``dynamic_sampling`` and
        ``max_staleness`` are refused).
    advantage: GRPO's group normalisation (:class:`~lit_rlhf.settings.AdvantageSettings`;
        ``estimator`` grpo only, so ``whiten``, ``gamma`` and ``lam`` are refused).
    loss: the clipped policy objective (:class:`~lit_rlhf.settings.PolicyLossSettings`).
    mismatch: the correction for the engine's log-probs against the trainer's
        (:class:`~lit_rlhf.settings.MismatchSettings`).
    kl: the KL to the frozen starting judge (:class:`~lit_rlhf.settings.KLSettings`); its
        ``coef`` seeds the plain attribute ``kl_coef``, which the AdaptiveKL callback rewrites.
    judge: the output format (tags, subject, the pre-fill and suffix the parser puts back) and
        the evaluation-time inference (:class:`~lit_rlhf.settings.judge.JudgeSettings`).
    """

    def __init__(
        self,
        mode: Literal["rft", "consistrm", "reflectrm"] = "rft",
        model: str = "builtin:tiny-llama",
        reward: RewardFunction | None = None,
        engine: GenerationEngineLike | None = None,
        tokenizer: Any = None,
        optim: OptimSettings = _OPTIM,
        precision: PrecisionSettings = PrecisionSettings(),
        lora: LoRASettings = LoRASettings(),
        update: UpdateSettings = UpdateSettings(),
        rollout: RolloutSettings = _ROLLOUT,
        advantage: AdvantageSettings = AdvantageSettings(),
        loss: PolicyLossSettings = PolicyLossSettings(),
        mismatch: MismatchSettings = MismatchSettings(),
        kl: KLSettings = KLSettings(),
        judge: JudgeSettings = JudgeSettings(),
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["reward", "engine", "tokenizer"])
        g = take_groups(self)  # each an instance or a dict (hparams), validated
        self.optim, self.precision, self.lora = g["optim"], g["precision"], g["lora"]
        self.judge_settings = g["judge"]
        self.settings = PPOSettings.of(g)  # validates the combinations
        self.kl_coef = float(self.settings.kl.coef)  # a plain attribute: AdaptiveKL rewrites it
        _check_settings(self)
        self._init_core(reward, engine)
        self.tokenizer = tokenizer
        self._init_state()

    def _init_core(self, reward: RewardFunction | None, engine: GenerationEngine | None) -> None:
        """The judge's format and inference, and the shared core's rollout and GRPO update."""
        judge = self.judge_settings
        self.judge_format = JudgeFormat(
            judge.tags, judge.subject, judge.response_prefix, judge.response_suffix
        )
        self.automatic_optimization = False
        self.engine: GenerationEngine = engine or HFGenerationEngine()
        self.rollouts = RolloutCollector(self.engine, self._judge_reward(reward, self.hp.mode))
        self.inference = JudgeInference(
            self.engine,
            self.judge_format,
            mode=judge.mode,
            samples=judge.eval_samples,
            critique_template=judge.critique_template,
            seed=self.settings.update.seed,
        )
        self.critiques_seen = 0
        self.rl = PolicyStep(self.settings, self.rollouts)

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
                "response_prefix and response_suffix as the reward (model.init_args.judge)."
            )
        return reward

    @property
    def hp(self) -> Any:
        """``self.hparams`` with attribute access typed loosely (it is an AttributeDict)."""
        return self.hparams

    def setup(self, stage: str) -> None:
        if stage == "fit":  # the data against the update and the context, before models load
            check_fit_setup(self)
            self._require_reward_terms()
            self.rl.check_data(self)

    def configure_model(self) -> None:
        strategy = self._trainer.strategy if self._trainer is not None else None
        self.rl.step_optimizer.configure(strategy)
        if self.policy is not None:
            return
        nets = build_networks(self, strategy)
        self.policy, self.ref_policy = nets.policy, nets.ref_policy

    def export_network(self) -> tuple[Any, Any]:
        """What ``lit-rlhf export`` writes: the judge's policy (the reference is not
        exported) and the tokenizer."""
        return self.policy, self.tokenizer

    def configure_optimizers(self) -> Any:
        params = [p for p in self.policy.parameters() if p.requires_grad]
        return self.rl.step_optimizer.adamw(params)

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
        render = self._renderer()
        return self.inference.decide(
            self.policy, self.tokenizer, batch, render.fn, chat_rendered=render.chat
        )

    @torch.no_grad()
    def compare_analyses(
        self, questions: Sequence[tuple[Mapping[str, Any], tuple[str, str]]]
    ) -> list[tuple[int | None, str]]:
        """ReflectRM's stage 2 alone, e.g. on planted analyses: for each ``(row, (analysis 1,
        analysis 2))`` (``row``: ``query``, ``response_1``, ``response_2``) the judge's greedy
        reply and verdict (-1: analysis 1 is better, +1: analysis 2, None: unreadable), through
        reflective inference's prompts, rendering and parsing. Needs the networks built
        (``configure_model``)."""
        device = next(self.policy.parameters()).device
        return self.inference.compare(
            self.policy, self.tokenizer, questions, self._renderer(), device=device
        )

    def _renderer(self) -> Renderer:
        """Questions rendered as the data module renders prompts (chat template, system prompt,
        pre-fill); the defaults without a trainer."""
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

        return Renderer(render, bool(use_chat and getattr(self.tokenizer, "chat_template", None)))

    def _evaluate(self, batch: dict[str, Any], metrics: JudgeMetrics) -> list[dict[str, Any]]:
        """Judge the batch, update ``metrics``; per row the record a callback may keep
        (``query_id``, ``family``, gold ``label``, ``verdict``, ``votes``, ``right``)."""
        rows = batch["row"]
        decisions = self.judge(batch)
        labels = [gold_label(row, i) for i, row in enumerate(rows)]
        families = [str(row.get("family_id", row["query_id"])) for row in rows]
        metrics.update(
            [d.votes for d in decisions],
            labels,
            families,
            [str(row.get("subset") or "") for row in rows],
            verdicts=[d.verdict for d in decisions],
        )
        return [
            {"query_id": str(q), "family": f, "label": y, "verdict": d.verdict,
             "votes": list(d.votes), "right": d.verdict == y}
            for q, f, y, d in zip(batch["query_id"], families, labels, decisions, strict=True)
        ]  # fmt: skip

    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        """``{"judgments": [...]}``: per row of the batch its judgment (:meth:`_evaluate`), what
        a callback's ``on_validation_batch_end`` receives as ``outputs``."""
        return {"judgments": self._evaluate(batch, self.val_metrics)}

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        return {"judgments": self._evaluate(batch, self.test_metrics)}

    def on_train_epoch_end(self) -> None:
        if self.hp.mode == "reflectrm" and self.critiques_seen == 0:
            rank_zero_warn(
                "mode='reflectrm' trained an epoch without a reflection (analysis-preference) "
                "row: this is plain RFT. Fix: train on the records of "
                "scripts/data/build_reflectrm_data.py (rows with task: reflection)."
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
        return module_callbacks()  # exact resumes, plain progress lines

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.rl.save(self, checkpoint)
        checkpoint["lit_rlhf"]["critiques_seen"] = self.critiques_seen

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.rl.load(self, checkpoint)
        # reflectrm's end-of-epoch check counts the run's critiques, before the resume too
        self.critiques_seen = checkpoint.get("lit_rlhf", {}).get("critiques_seen", 0)


def _check_settings(module: GenerativeRewardModule) -> None:
    """The module's own settings, and the group fields it would not read."""
    mode = module.hp.mode
    if mode not in ("rft", "consistrm", "reflectrm"):
        raise ValueError(f"mode must be 'rft', 'consistrm' or 'reflectrm', got {mode!r}")
    template = module.judge_settings.critique_template
    if judge_template(template).subject != "Critique":
        raise ValueError(
            f"judge.critique_template {template!r} compares responses. Fix: use a critique "
            "template, e.g. reflectrm-critique-v1."
        )
    name, s = "GenerativeRewardModule", module.settings
    if s.advantage.estimator != "grpo":
        raise ValueError(
            f"advantage.estimator={s.advantage.estimator!r}: GenerativeRewardModule trains with "
            "GRPO's group baseline (it has no critic). Fix: leave advantage.estimator: grpo."
        )
    refuse_set_fields(name, s.advantage, ("whiten", "gamma", "lam"), "they are GAE's",
                      "remove them.")  # fmt: skip
    refuse_set_fields(
        name, s.rollout, ("dynamic_sampling", "dynamic_sampling_max_rounds", "max_staleness"),
        "its training step neither resamples groups nor generates ahead",
        "remove them (PPOModule has both).",
    )  # fmt: skip
    refuse_set_fields(name, module.optim, ("clip_per_network",), "it trains one network",
                      "leave optim.clip_per_network false.")  # fmt: skip
    module.lora.check_reference_dtype(module.precision.reference_dtype, separate=False)
    module.precision.refuse_unread(name, reference=module.kl_coef > 0, checkpointing=True)
