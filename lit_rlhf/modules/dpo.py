"""Offline preference optimisation of a causal LM on labelled pairs, with no generation and no
reward model: sigmoid DPO (Rafailov et al. 2023, arXiv 2305.18290), IPO (Azar et al. 2023,
arXiv 2310.12036) and the reference-free SimPO (Meng et al. 2024, arXiv 2405.14734), chosen by
one ``loss.kind`` switch; the losses are the pure functions of :mod:`lit_rlhf.algos.preference`.

It reads the same pair rows as :class:`~lit_rlhf.modules.RewardModelModule` (``query``,
``response_1``, ``response_2``, ``label``: -1 = response 1 better, +1 = response 2 better) from
the shared :class:`~lit_rlhf.data.PromptDataModule`; a tie or an unlabelled row is refused.
Each (query, response) is encoded as :class:`~lit_rlhf.data.SFTDataModule` encodes a
prompt/response row (the query through the chat template with the assistant turn opened, then
the response's tokens and EOS), and ``log pi(y | x)`` is the sum of the log-probs of those
response tokens, EOS included. IPO and SimPO use it averaged over the response's tokens.

The reference is the starting model, frozen (``reference_model``; default ``model``, in
``precision.reference_dtype``); under LoRA it is the same network with its adapters switched
off, so no second copy is loaded; SimPO loads none. The DPO paper's reference is the SFT
model: pass the SFT-trained model as ``model`` (the default reference follows it).

One optimizer step per batch through the shared :class:`~lit_rlhf.training.OptimizerStep`:
micro-batches of ``optim.micro_batch_size`` pairs, each adding its summed pair losses over the
batch's pair count, so the accumulated gradient is that of the batch mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, cast

import torch
from lightning import Callback, LightningModule
from torch import Tensor, nn
from torchmetrics import MeanMetric

from lit_rlhf.algos import PreferenceRewards, dpo_loss, ipo_loss, simpo_loss
from lit_rlhf.data.pair_labels import chosen_and_rejected
from lit_rlhf.data.sft import LongPromptError, SFTEncoder, collate_sft
from lit_rlhf.models import load_causal_lm
from lit_rlhf.models.checkpoint_weights import check_checkpoint_weights
from lit_rlhf.models.likelihood import response_log_probs
from lit_rlhf.models.lora import is_lora, merged_copy
from lit_rlhf.plan.check import check_memory
from lit_rlhf.settings import (
    LoRASettings,
    OptimSettings,
    PrecisionSettings,
    PreferenceLossSettings,
    refuse_flat_arguments,
    take_groups,
)
from lit_rlhf.strategies import is_deepspeed, transformers_zero3_context
from lit_rlhf.training import (
    FrozenModules,
    OptimizerStep,
    begin_configure_model,
    build_policy_networks,
    check_trainable_precision,
    export_pretrained,
    freeze,
)
from lit_rlhf.training.frozen import drop_frozen_weights, restore_frozen_weights
from lit_rlhf.training.model_hooks import module_callbacks

PAIR_STATS = (
    "loss",
    "reward_accuracy",
    "reward_margin",
    "chosen_reward",
    "rejected_reward",
    "logps_chosen",
    "logps_rejected",
)  # logged as <stage>/<name>, each the mean over the stage's pairs
_USER = "DPO (it trains on labelled pairs only)"


class PairLogps(NamedTuple):
    """Sequence log-probs of the two responses of ``b`` pairs."""

    chosen: Tensor  # [b] log pi(y_w | x): the response tokens' log-probs summed
    rejected: Tensor  # [b] log pi(y_l | x)
    chosen_tokens: Tensor  # [b] |y_w| in tokens (EOS included)
    rejected_tokens: Tensor  # [b] |y_l|

    @classmethod
    def split(cls, sums: Tensor, counts: Tensor) -> PairLogps:
        """From ``[2b]`` per-sequence sums and counts, chosen responses first."""
        b = sums.shape[0] // 2
        return cls(sums[:b], sums[b:], counts[:b], counts[b:])

    def averaged(self) -> tuple[Tensor, Tensor]:
        """``log pi(y) / |y|`` of the chosen and of the rejected responses ``[b]``."""
        return self.chosen / self.chosen_tokens, self.rejected / self.rejected_tokens


def pair_stats(losses: Tensor, rewards: PreferenceRewards, policy: PairLogps) -> dict[str, Tensor]:
    """The per-pair values ``[b]`` behind :data:`PAIR_STATS`, detached."""
    margin = rewards.chosen - rewards.rejected
    values = (
        losses.detach(),
        (margin > 0).float(),  # a tie counts as wrong
        margin,
        rewards.chosen,
        rewards.rejected,
        policy.chosen.detach(),
        policy.rejected.detach(),
    )
    return dict(zip(PAIR_STATS, values, strict=True))


_OPTIM = OptimSettings(lr=1e-6, micro_batch_size=8)  # DPOModule's defaults for the group


@refuse_flat_arguments
class DPOModule(LightningModule):
    """Args:
    model: the causal LM to train (hub id, local folder, ``builtin:<name>``), ideally after SFT.
    tokenizer: a tokenizer object; the CLI links the DataModule's.
    loss: the preference loss (sigmoid DPO / cDPO, IPO, reference-free SimPO) and its constants
        ``beta``, ``label_smoothing``, ``simpo_gamma``
        (:class:`~lit_rlhf.settings.PreferenceLossSettings`).
    reference_model: the frozen reference (None: ``model``; under LoRA: ``model`` with the
        adapters off). Refused with ``loss.kind: simpo``, which has none.
    optim: AdamW, clipping, pairs per forward/backward (``micro_batch_size``; null: the whole
        batch; one optimizer step per batch) and the lr schedule
        (:class:`~lit_rlhf.settings.OptimSettings`; lr 1e-6).
    precision: the trained weights' dtype, the frozen reference's ``reference_dtype`` (it may
        be 16-bit) and activation checkpointing (:class:`~lit_rlhf.settings.PrecisionSettings`).
    lora: LoRA adapters, the base frozen and serving as the reference
        (:class:`~lit_rlhf.settings.LoRASettings`; ``quantize`` is refused here).
    max_length: tokens per (query, response) sequence; a longer one loses its tail.
    chat_template: render the query with the tokenizer's chat template (when it has one).
    export_dir: where the trained model and tokenizer are saved at the end of ``fit``
        (``save_pretrained``; None, or a ``fast_dev_run``: not saved); LoRA adapters are merged
        into a copy first.
    """

    def __init__(
        self,
        model: str = "builtin:tiny-llama",
        tokenizer: Any = None,
        loss: PreferenceLossSettings = PreferenceLossSettings(),
        reference_model: str | None = None,
        optim: OptimSettings = _OPTIM,
        precision: PrecisionSettings = PrecisionSettings(),
        lora: LoRASettings = LoRASettings(),
        max_length: int = 1024,
        chat_template: bool = True,
        export_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer"])
        g = take_groups(self)  # each an instance or a dict (hparams), validated
        self.loss, self.optim = g["loss"], g["optim"]
        self.precision, self.lora = g["precision"], g["lora"]
        check_dpo_settings(self, reference_model, max_length)
        self.automatic_optimization = False
        self.step_optimizer = OptimizerStep.from_settings(self.optim)
        self.tokenizer = tokenizer
        self.encoder: SFTEncoder | None = None
        self.model: Any = None
        self.ref_model: Any = None  # a separate frozen reference (none under LoRA / SimPO)
        self.frozen = FrozenModules("ref_model")  # rebuilt on every start, never checkpointed
        self.eval_metrics = nn.ModuleDict(
            {f"{stage}_{name}": MeanMetric() for stage in ("val", "test") for name in PAIR_STATS}
        )

    @property
    def hp(self) -> Any:
        return self.hparams

    def setup(self, stage: str) -> None:
        if stage != "fit":  # the strategy is known and no weights are loaded yet
            return
        check_trainable_precision(self.trainer, {"precision.dtype": self.precision.dtype})
        check_memory(self)  # the memory plan on CUDA (precision.memory_check)
        strategy = self.trainer.strategy
        zero3 = is_deepspeed(strategy) and getattr(strategy, "zero_stage_3", False)
        if zero3 and self.lora.enabled and self.hp.export_dir is not None:
            raise ValueError(
                "export_dir with lora.rank > 0 under DeepSpeed ZeRO-3: the adapters are merged "
                "into a copy of the base weights, which ZeRO-3 holds in partitions. Fix: ZeRO-2, "
                "or export_dir: null (the checkpoint keeps the adapters)."
            )

    def configure_model(self) -> None:
        strategy, to_build = begin_configure_model(self, self.model is not None, self.hp.model)
        if not to_build:
            return
        self.encoder = SFTEncoder(
            self.tokenizer, max_length=self.hp.max_length, chat_template=self.hp.chat_template
        )
        reference_model = self.hp.reference_model
        networks = build_policy_networks(  # ZeRO-3: loaded into the partitions; LoRA: wrapped
            self.hp.model,
            strategy=strategy,
            precision=self.precision,
            reference=not self.loss.reference_free and reference_model is None,
            lora=self.lora,
        )
        self.model, self.ref_model = networks.policy, networks.ref_policy
        if not self.loss.reference_free and reference_model is not None:
            with transformers_zero3_context(strategy):  # a separate reference, LoRA or not
                dtype = self.precision.reference_dtype or self.precision.dtype
                self.ref_model = freeze(load_causal_lm(reference_model, dtype=dtype))

    def export_network(self) -> tuple[Any, Any]:
        """What ``lit-rlhf export`` writes: the trained model (a peft model with
        ``lora.rank > 0``; the reference is not exported) and the tokenizer."""
        return self.model, self.tokenizer

    def configure_optimizers(self) -> Any:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return self.step_optimizer.adamw(params)

    # --------------------------------------------------------------- the loss
    def encode_pairs(self, rows: Sequence[Mapping[str, Any]]) -> dict[str, Tensor]:
        """The ``2b`` (query, response) sequences of ``b`` labelled pair rows, the chosen
        responses first, as one right-padded batch (``input_ids``, ``attention_mask``,
        ``labels``: the response tokens, -100 elsewhere) on the module's device."""
        assert self.encoder is not None, "call configure_model() first"
        chosen, rejected = chosen_and_rejected(rows, user=_USER)
        encoded = [
            self._encode(row, pick, i)
            for side in (chosen, rejected)
            for i, (row, pick) in enumerate(zip(rows, side, strict=True))
        ]
        batch = collate_sft(encoded, pad_token_id=int(self.tokenizer.pad_token_id))
        return {k: v.to(self.device) for k, v in batch.items()}

    def _encode(self, row: Mapping[str, Any], pick: int, i: int) -> dict[str, list[int]]:
        assert self.encoder is not None
        where = f"pair row {i} (query {row.get('query_id', '?')!r}), response_{pick}"
        pair = {"prompt": row.get("query"), "response": row.get(f"response_{pick}")}
        try:
            return self.encoder.encode(pair, where)
        except LongPromptError:
            raise ValueError(
                f"{where}: the query leaves no response token within max_length="
                f"{self.hp.max_length} tokens. Fix: raise model.init_args.max_length, or shorten "
                "or remove the row."
            ) from None

    @torch.no_grad()
    def reference_log_probs(self, batch: Mapping[str, Tensor]) -> PairLogps | None:
        """The frozen reference's :class:`PairLogps` (None for SimPO, which has none)."""
        if self.loss.reference_free:
            return None
        if self.ref_model is not None:
            return PairLogps.split(*response_log_probs(self.ref_model, batch))
        with self.model.disable_adapter():  # LoRA (peft): the base model is the reference
            return PairLogps.split(*response_log_probs(self.model, batch))

    def preference_loss(
        self, policy: PairLogps, reference: PairLogps | None
    ) -> tuple[Tensor, PreferenceRewards]:
        """Per-pair losses ``[b]`` and implicit rewards of the configured ``loss.kind``."""
        loss = self.loss
        beta = loss.beta  # DPO's KL strength, IPO's tau, SimPO's reward scale
        if reference is None:  # SimPO: reference-free
            return simpo_loss(*policy.averaged(), beta=beta, gamma=loss.simpo_gamma)
        if loss.kind == "ipo":  # token-averaged log-probs (ipo_loss's docstring says why)
            return ipo_loss(*policy.averaged(), *reference.averaged(), beta=beta)
        return dpo_loss(
            policy.chosen, policy.rejected, reference.chosen, reference.rejected,
            beta=beta, label_smoothing=loss.label_smoothing,
        )  # fmt: skip

    def pair_losses(self, rows: Sequence[Mapping[str, Any]]) -> tuple[Tensor, dict[str, Tensor]]:
        """Per-pair losses ``[b]`` (gradient flowing into the policy) and the detached per-pair
        values of :data:`PAIR_STATS` for labelled pair rows."""
        batch = self.encode_pairs(rows)
        policy = PairLogps.split(*response_log_probs(self.model, batch))
        losses, rewards = self.preference_loss(policy, self.reference_log_probs(batch))
        return losses, pair_stats(losses, rewards, policy)

    def micro_batches(self, rows: Sequence[Mapping[str, Any]]) -> list[Sequence[Any]]:
        size = self.optim.micro_batch_size or len(rows)  # null: the whole batch at once
        return [rows[i : i + size] for i in range(0, len(rows), size)]

    # ---------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        rows = batch["row"]
        parts: list[dict[str, Tensor]] = []

        def loss_fn(part: Sequence[Mapping[str, Any]]) -> Tensor:
            losses, stats = self.pair_losses(part)
            parts.append(stats)
            return losses.sum() / len(rows)  # non-finite: OptimizerStep skips the step

        stats = self.step_optimizer(self, self.optimizers(), self.micro_batches(rows), loss_fn)
        logged = {f"train/{k}": torch.cat([p[k] for p in parts]).mean() for k in PAIR_STATS}
        self.log_dict({**logged, **stats}, batch_size=len(rows), prog_bar=False)
        bar = {"loss": logged["train/loss"], "acc": logged["train/reward_accuracy"]}
        self.log_dict(bar, batch_size=len(rows), prog_bar=True, logger=False)  # the bar only
        return logged["train/loss"]

    # ------------------------------------------------------- validation / test
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate("val", batch["row"])

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        self._evaluate("test", batch["row"])

    def _evaluate(self, stage: str, rows: Sequence[Mapping[str, Any]]) -> None:
        metrics = {
            name: cast(MeanMetric, self.eval_metrics[f"{stage}_{name}"]) for name in PAIR_STATS
        }
        for part in self.micro_batches(rows):
            _, stats = self.pair_losses(part)
            for name, metric in metrics.items():
                metric.update(stats[name])
        for name, metric in metrics.items():
            self.log(f"{stage}/{name}", metric, batch_size=len(rows))

    # ------------------------------------------------------------- checkpoint
    def configure_callbacks(self) -> list[Callback]:
        return module_callbacks()  # exact resumes, plain progress lines

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.step_optimizer.save_to(checkpoint)  # skip counts, lr schedule counters
        self.frozen.drop(checkpoint)
        if is_lora(self.model):  # the adapters only: the base is rebuilt from `model`
            drop_frozen_weights(checkpoint, "model", self.model)

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.frozen.restore(self, checkpoint)
        if is_lora(self.model):
            restore_frozen_weights(checkpoint, "model", self.model)
        check_checkpoint_weights(self, checkpoint, settings=_NETWORK_SETTINGS)
        self.step_optimizer.load_from(checkpoint)

    def on_fit_end(self) -> None:
        if self.hp.export_dir is not None and not getattr(self.trainer, "fast_dev_run", False):
            export_pretrained(self.trainer, merged_copy(self.model), self.tokenizer,
                              self.hp.export_dir)  # fmt: skip


_NETWORK_SETTINGS = ("model", "reference_model", "lora")


def check_dpo_settings(module: DPOModule, reference_model: str | None, max_length: int) -> None:
    """Refuse, before any model loads, a setting across groups that would silently change
    nothing, or one of the module's own out of range (each group checks its own fields)."""
    module.precision.refuse_unread("DPOModule", reference=True, checkpointing=True)
    module.lora.refuse_unread("DPOModule")
    reference_dtype = module.precision.reference_dtype
    module.lora.check_reference_dtype(reference_dtype, separate=reference_model is not None)
    reference = {"reference_model": reference_model, "precision.reference_dtype": reference_dtype}
    given = [k for k, v in reference.items() if v is not None]
    if given and module.loss.reference_free:
        raise ValueError(
            f"loss.kind='simpo' is reference-free: no reference model is loaded, so {given} "
            "would change nothing. Fix: remove them, or set model.init_args.loss.kind to sigmoid "
            "or ipo."
        )
    if max_length < 2:
        raise ValueError(
            f"max_length={max_length} must be >= 2 (a query token and a response token). Fix: "
            "set model.init_args.max_length in that range."
        )
