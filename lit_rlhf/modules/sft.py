"""Supervised fine-tuning of a causal LM: the next-token cross-entropy on the response tokens only
(the SFT stage of Ouyang et al. 2022, arXiv 2203.02155), e.g. the supervised warm start of a
judge before its RL stage (ConsistRM / ReflectRM).

It reads :class:`~lit_rlhf.data.SFTDataModule` batches (``input_ids``, ``attention_mask`` and
``labels``, -100 on prompt, context and padding tokens), steps through the shared
:class:`~lit_rlhf.training.OptimizerStep` (micro-batch accumulation, gradient hooks, clipping,
the lr schedule, DeepSpeed), and writes a folder that ``transformers`` and every module's
``model:`` setting load back (``export_dir``).

The loss of a batch is the token mean: the summed negative log-likelihood of all its response
tokens divided by their number, however the batch is split into micro-batches (each micro-batch
adds its own sum over the batch's count), so a long response weighs in proportion to its tokens.
Under DDP each rank divides by its own count and the gradients are averaged.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from lightning import LightningModule
from torch import Tensor
from torchmetrics import MeanMetric

from lit_rlhf.data.sft import IGNORE  # the label of an untrained token (torch's ignore_index)
from lit_rlhf.models.likelihood import response_token_nll  # per-token NLL of the labelled tokens
from lit_rlhf.settings import OptimSettings, PrecisionSettings, refuse_flat_arguments, take_groups
from lit_rlhf.training import (
    ExportedModelHooks,
    OptimizerStep,
    begin_configure_model,
    build_policy_networks,
)


def micro_batches(batch: Mapping[str, Tensor], size: int | None) -> list[dict[str, Tensor]]:
    """The batch's rows in chunks of ``size`` (None: one chunk), each trimmed to its longest
    row (right padding)."""
    rows = batch["input_ids"].shape[0]
    size = size or rows
    chunks = []
    for start in range(0, rows, size):
        part = {k: v[start : start + size] for k, v in batch.items()}
        width = int(part["attention_mask"].sum(1).max())
        chunks.append({k: v[:, :width] for k, v in part.items()})
    return chunks


_OPTIM = OptimSettings(lr=1e-5, micro_batch_size=None)  # SFTModule's defaults for the group


@refuse_flat_arguments
class SFTModule(ExportedModelHooks, LightningModule):
    """Args:
    model: the causal LM to fine-tune: hub id, local folder, or ``builtin:<name>``.
    tokenizer: a tokenizer object; the CLI links the DataModule's (it is also the one
        exported).
    optim: AdamW, clipping, micro-batches (null: the whole batch at once; one optimizer step
        per batch) and the lr schedule (:class:`~lit_rlhf.settings.OptimSettings`; lr 1e-5).
    precision: the weights' dtype and activation checkpointing
        (:class:`~lit_rlhf.settings.PrecisionSettings`; no frozen reference here, so
        ``reference_dtype`` is refused).
    export_dir: where the trained model and tokenizer are saved at the end of ``fit``
        (``save_pretrained``; None, or a ``fast_dev_run``: not saved), loadable as ``model:``
        by every module; under DeepSpeed ZeRO-3 the partitions are gathered first.
    """

    def __init__(
        self,
        model: str = "builtin:tiny-llama",
        tokenizer: Any = None,
        optim: OptimSettings = _OPTIM,
        precision: PrecisionSettings = PrecisionSettings(),
        export_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer"])
        g = take_groups(self)  # each an instance or a dict (hparams), validated
        self.optim, self.precision = g["optim"], g["precision"]
        self.precision.refuse_unread("SFTModule", reference=False, checkpointing=True)
        self.automatic_optimization = False
        self.step_optimizer = OptimizerStep.from_settings(self.optim)
        self.tokenizer = tokenizer
        self.model: Any = None
        self.val_loss, self.val_accuracy = MeanMetric(), MeanMetric()

    def configure_model(self) -> None:
        strategy, to_build = begin_configure_model(self, self.model is not None, self.hp.model)
        if not to_build:
            return
        self.model = build_policy_networks(  # ZeRO-3: loaded into the partitions
            self.hp.model,
            strategy=strategy,
            precision=self.precision,
        ).policy

    def export_network(self) -> tuple[Any, Any]:
        """What ``lit-rlhf export`` writes: the fine-tuned causal LM, and the tokenizer."""
        return self.model, self.tokenizer

    def configure_optimizers(self) -> Any:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return self.step_optimizer.adamw(params)

    # ---------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        tokens = int((batch["labels"][:, 1:] != IGNORE).sum())  # every row has one (the data)
        sums: list[Tensor] = []
        hits: list[Tensor] = []

        def loss_fn(part: dict[str, Tensor]) -> Tensor:
            nll, _, hit = response_token_nll(self.model, part)
            sums.append(nll.sum().detach())
            hits.append(hit.sum())
            return nll.sum() / tokens  # the micro-batches add up to the batch's token mean

        micro = micro_batches(batch, self.optim.micro_batch_size)
        stats = self.step_optimizer(self, self.optimizers(), micro, loss_fn)
        loss = torch.stack(sums).sum() / tokens
        logged: dict[str, Tensor | float] = {
            "train/loss": loss,
            "train/token_accuracy": torch.stack(hits).sum().float() / tokens,
            "train/response_tokens": float(tokens),
            **stats,
        }
        self.log_dict(logged, batch_size=batch["input_ids"].shape[0], prog_bar=False)
        bar = {"loss": loss, "acc": logged["train/token_accuracy"]}
        self.log_dict(bar, batch_size=batch["input_ids"].shape[0], prog_bar=True, logger=False)
        return loss

    # ------------------------------------------------------------- validation
    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        nll, trained, hits = response_token_nll(self.model, batch)
        self.val_loss.update(nll[trained])  # per token: the mean over all validation tokens
        self.val_accuracy.update(hits[trained].float())
        size = batch["input_ids"].shape[0]
        self.log("val/loss", self.val_loss, batch_size=size)
        self.log("val/token_accuracy", self.val_accuracy, batch_size=size)
