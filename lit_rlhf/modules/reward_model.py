"""A scalar reward model: a sequence-classification head on a causal LM, trained on preference
pairs with the Bradley-Terry loss, ``-log sigmoid(r_chosen - r_rejected - margin)`` (Ouyang et
al. 2022; the margin as in Llama 2, Touvron et al. 2023).

It reads the same pair rows as :class:`~lit_rlhf.modules.GenerativeRewardModule` (``query``,
``response_1``, ``response_2``, ``label``: -1 = response 1 better, +1 = response 2 better) from
the shared :class:`~lit_rlhf.data.PromptDataModule`, steps through the shared
:class:`~lit_rlhf.training.OptimizerStep` (gradient hooks, clipping, DeepSpeed), and writes a
folder that ``transformers`` loads back (``export_dir``), which
:class:`~lit_rlhf.rewards.ScalarRMReward` scores PPO rollouts with.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from lightning import LightningModule
from torch import Tensor
from torchmetrics import MeanMetric
from torchmetrics.classification import BinaryAccuracy

from lit_rlhf.data import pair_labels
from lit_rlhf.models.loading import load_reward_model
from lit_rlhf.models.scoring import conversation_text, score_texts
from lit_rlhf.settings import OptimSettings, PrecisionSettings, refuse_flat_arguments, take_groups
from lit_rlhf.strategies import transformers_zero3_context
from lit_rlhf.training import (
    OptimizerStep,
    begin_configure_model,
)
from lit_rlhf.training.model_hooks import ExportedModelHooks
from lit_rlhf.training.sharding import shard_networks


def _check_settings(margin: float, max_length: int) -> None:
    """Refuse, before any model loads, a module setting out of its range (the groups check
    their own fields)."""
    if not 0 <= margin < math.inf:
        raise ValueError(
            f"margin={margin!r} must be >= 0 and finite (0: plain Bradley-Terry). Fix: set "
            "model.init_args.margin in that range."
        )
    if max_length < 2:
        raise ValueError(
            f"max_length={max_length} must be >= 2. Fix: set model.init_args.max_length in that "
            "range."
        )


def chosen_and_rejected(rows: Sequence[Mapping[str, Any]]) -> tuple[list[int], list[int]]:
    """Per row, the index (1 or 2) of the chosen and of the rejected response; a clear error
    for a row without a -1 / +1 label (:func:`lit_rlhf.data.pair_labels.chosen_and_rejected`)."""
    return pair_labels.chosen_and_rejected(
        rows, user="a reward model (it trains on labelled pairs only)"
    )


_OPTIM = OptimSettings(lr=1e-5, micro_batch_size=8)  # RewardModelModule's defaults for the group


@refuse_flat_arguments
class RewardModelModule(ExportedModelHooks, LightningModule):
    """Args:
    model: the base: hub id, local folder, or ``builtin:<name>`` (a causal LM gets a new score
        head; a saved reward model continues).
    tokenizer: a tokenizer object; the CLI links the DataModule's.
    optim: AdamW, clipping, pairs per forward/backward (``micro_batch_size``, gradient
        accumulation within a batch; null: the whole batch; one optimizer step per batch) and
        the lr schedule (:class:`~lit_rlhf.settings.OptimSettings`; lr 1e-5).
    precision: the weights' dtype and activation checkpointing
        (:class:`~lit_rlhf.settings.PrecisionSettings`; no frozen reference here:
        ``reference_dtype`` is refused).
    margin: subtracted from ``r_chosen - r_rejected`` inside the loss (0: plain Bradley-Terry).
    max_length: tokens per sequence (longer ones are cut from the left, keeping the response).
    chat_template: render (query, response) with the tokenizer's chat template.
    export_dir: where the trained model and tokenizer are saved at the end of ``fit``
        (``save_pretrained``; None, or a ``fast_dev_run``: not saved); under DeepSpeed ZeRO-3
        the partitions are gathered first.
    """

    def __init__(
        self,
        model: str = "builtin:tiny-llama",
        tokenizer: Any = None,
        optim: OptimSettings = _OPTIM,
        precision: PrecisionSettings = PrecisionSettings(),
        margin: float = 0.0,
        max_length: int = 1024,
        chat_template: bool = True,
        export_dir: str | None = None,
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer"])
        g = take_groups(self)  # each an instance or a dict (hparams), validated
        self.optim, self.precision = g["optim"], g["precision"]
        self.precision.refuse_unread("RewardModelModule", reference=False, checkpointing=True)
        _check_settings(margin, max_length)
        self.automatic_optimization = False
        self.step_optimizer = OptimizerStep.from_settings(self.optim)
        self.tokenizer = tokenizer
        self.model: Any = None
        self.val_accuracy, self.val_loss = BinaryAccuracy(), MeanMetric()
        self.test_accuracy = BinaryAccuracy()

    def configure_model(self) -> None:
        strategy, to_build = begin_configure_model(self, self.model is not None, self.hp.model)
        if not to_build:
            return
        with transformers_zero3_context(strategy):  # ZeRO-3: load into the partitions
            self.model = load_reward_model(
                self.hp.model, pad_token_id=self.tokenizer.pad_token_id, dtype=self.precision.dtype
            )
        if self.precision.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        shard_networks(strategy, self.model)  # FSDP2: each decoder block, then the whole

    def export_network(self) -> tuple[Any, Any]:
        """What ``lit-rlhf export`` writes: the sequence-classification reward model (its
        score head included) and the tokenizer."""
        return self.model, self.tokenizer

    def configure_optimizers(self) -> Any:
        params = [p for p in self.model.parameters() if p.requires_grad]
        return self.step_optimizer.adamw(params)

    # ----------------------------------------------------------------- scoring
    def score(self, queries: Sequence[str], responses: Sequence[str]) -> Tensor:
        """``[N]`` rewards of (query, response) pairs, with the gradient when enabled."""
        texts = [
            conversation_text(self.tokenizer, q, r, chat_template=self.hp.chat_template)
            for q, r in zip(queries, responses, strict=True)
        ]
        return score_texts(
            self.model, self.tokenizer, texts, max_length=self.hp.max_length, device=self.device
        )

    def pair_rewards(self, rows: Sequence[Mapping[str, Any]]) -> tuple[Tensor, Tensor]:
        """(r_chosen, r_rejected) for labelled pair rows, in one forward."""
        chosen, rejected = chosen_and_rejected(rows)
        queries = [str(row["query"]) for row in rows] * 2
        responses = [str(row[f"response_{i}"]) for row, i in zip(rows, chosen, strict=True)]
        responses += [str(row[f"response_{i}"]) for row, i in zip(rows, rejected, strict=True)]
        rewards = self.score(queries, responses)
        return rewards[: len(rows)], rewards[len(rows) :]

    def bradley_terry(self, r_chosen: Tensor, r_rejected: Tensor) -> Tensor:
        """Per pair, ``-log sigmoid(r_chosen - r_rejected - margin)``."""
        return -F.logsigmoid(r_chosen - r_rejected - self.hp.margin)

    # ---------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        rows = batch["row"]
        size = self.optim.micro_batch_size or len(rows)  # null: the whole batch at once
        micro = [rows[i : i + size] for i in range(0, len(rows), size)]
        gaps: list[Tensor] = []
        losses: list[Tensor] = []

        def loss_fn(part: Sequence[Mapping[str, Any]]) -> Tensor:
            r_chosen, r_rejected = self.pair_rewards(part)
            per_pair = self.bradley_terry(r_chosen, r_rejected)
            gaps.append((r_chosen - r_rejected).detach())
            losses.append(per_pair.detach())
            return per_pair.sum() / len(rows)  # non-finite: OptimizerStep skips the step

        stats = self.step_optimizer(self, self.optimizers(), micro, loss_fn)
        gap, loss = torch.cat(gaps), torch.cat(losses).mean()  # loss: the one optimised
        logged = {
            "train/loss": loss,
            "train/accuracy": (gap > 0).float().mean(),
            "train/reward_gap": gap.mean(),
            **stats,
        }
        self.log_dict(logged, batch_size=len(rows), prog_bar=False)
        bar = {"loss": loss, "acc": logged["train/accuracy"]}
        self.log_dict(bar, batch_size=len(rows), prog_bar=True, logger=False)  # the bar only
        return loss

    # ------------------------------------------------------- validation / test
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        r_chosen, r_rejected = self.pair_rewards(batch["row"])
        right = (r_chosen > r_rejected).long()  # a tie counts as wrong
        self.val_accuracy.update(right, torch.ones_like(right))
        self.val_loss.update(self.bradley_terry(r_chosen, r_rejected))
        self.log("val/accuracy", self.val_accuracy, batch_size=len(r_chosen))
        self.log("val/loss", self.val_loss, batch_size=len(r_chosen))

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> None:
        r_chosen, r_rejected = self.pair_rewards(batch["row"])
        right = (r_chosen > r_rejected).long()
        self.test_accuracy.update(right, torch.ones_like(right))
        self.log("test/accuracy", self.test_accuracy, batch_size=len(r_chosen))
