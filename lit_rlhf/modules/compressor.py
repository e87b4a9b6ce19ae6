"""Train a context compressor against a frozen decoder (the "size-fidelity paradox", arXiv
2602.09789; ICAE's architecture, arXiv 2307.06945): the compressor turns a context into ``k``
memory vectors, the frozen decoder reads them as a soft prompt and reconstructs the context
(autoencoding, after a learnable marker) and predicts the text that follows (continuation).

Data: the shared :class:`~lit_rlhf.data.PromptDataModule` with a
:class:`~lit_rlhf.data.TextChunks` source (``input_ids`` = the context, left-padded;
``continuation_ids`` right-padded). Optimisation: the shared
:class:`~lit_rlhf.training.OptimizerStep` (micro-batches, clipping, DDP / DeepSpeed). The frozen
decoder is rebuilt from its source on every start and left out of checkpoints
(:class:`~lit_rlhf.training.FrozenModules`). Validation returns, per batch, what
:class:`~lit_rlhf.callbacks.CompressionDiagnostics` measures (memory, teacher-forced logits,
reconstructions); :meth:`reconstruct` serves its probes. Logged: ``train|val|test/ae_loss``,
``lm_loss`` (token means), ``loss`` (weighted), ``val|test/memory_gain`` (:meth:`memory_gain`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from lightning import Callback, LightningModule
from torch import Tensor

from lit_rlhf.data.prompts import pad_ids
from lit_rlhf.models.checkpoint_weights import check_checkpoint_weights
from lit_rlhf.models.compressor import (
    MemoryCompressor,
    autoencoding_targets,
    check_shared_vocabulary,
    decoder_prefix,
    generate_from_prefix,
    target_loss,
    teacher_forced_logits,
)
from lit_rlhf.models.loading import load_causal_lm
from lit_rlhf.models.lora import lora_wrap
from lit_rlhf.models.partitioned import gathered
from lit_rlhf.modules.compressor_setup import (
    check_compressor_settings,
    check_data_context,
    memory_tokens,
)
from lit_rlhf.plan.check import check_memory
from lit_rlhf.settings import (
    Dtype,
    LoRASettings,
    OptimSettings,
    PrecisionSettings,
    refuse_flat_arguments,
    take_groups,
)
from lit_rlhf.strategies import is_deepspeed, transformers_zero3_context
from lit_rlhf.training import (
    FrozenModules,
    OptimizerStep,
    begin_configure_model,
    freeze,
)
from lit_rlhf.training.model_hooks import module_callbacks
from lit_rlhf.training.precision import check_trainable_precision
from lit_rlhf.training.sharding import shard_networks

AE, LM = 0, 1  # the markers' rows: autoencoding, continuation


_OPTIM = OptimSettings(lr=1e-4, micro_batch_size=8)  # the compressor's defaults for the group


@refuse_flat_arguments
class CompressorDecoderModule(LightningModule):
    """Args:
    compressor: the compressor LM: hub id, local folder or ``builtin:<name>``.
    decoder: the frozen decoder LM (same tokenizer as the compressor: one vocabulary).
    tokenizer: a tokenizer object; the CLI links the DataModule's.
    compressor_layers: keep only the compressor's first this many layers (embeddings, final
        norm and vocabulary kept: a smaller compressor that shares the decoder's vocabulary and
        part of its priors); None: the whole model.
    num_memory_tokens: ``k``; or None and ``compression_rate`` with ``context_tokens``.
    compression_rate: context tokens per memory token (``k = ceil(context_tokens / rate)``).
    context_tokens: the data's context length, for ``compression_rate``.
    ae_weight, lm_weight: the autoencoding and continuation losses' weights (>= 0, not both 0);
        each loss is a token mean over the batch.
    lora: LoRA adapters on the compressor, the base frozen (ICAE: dropout 0.05); the memory
        embeddings, projection and markers always train
        (:class:`~lit_rlhf.settings.LoRASettings`; ``quantize`` is refused here).
    optim: AdamW, clipping, contexts per forward/backward (``micro_batch_size``; null: the
        whole batch; one optimizer step per batch) and the lr schedule
        (:class:`~lit_rlhf.settings.OptimSettings`; lr 1e-4).
    precision: the compressor's weights' ``dtype`` (it trains: 16-bit only under DeepSpeed's
        bf16 optimizer, else float32 with ``trainer.precision: bf16-mixed``; refused at setup)
        (:class:`~lit_rlhf.settings.PrecisionSettings`; no activation checkpointing and no
        frozen reference here: the frozen decoder's dtype is ``decoder_dtype``).
    max_new_tokens: reconstruction length limit at evaluation (None: the context length + 8).
    reconstruct_on_validation: generate reconstructions in validation (the fidelity metrics).
    decoder_dtype: the frozen decoder's weights (it may be 16-bit).
    """

    def __init__(
        self,
        compressor: str = "builtin:tiny-llama",
        decoder: str = "builtin:tiny-llama",
        tokenizer: Any = None,
        compressor_layers: int | None = None,
        num_memory_tokens: int | None = 4,
        compression_rate: float | None = None,
        context_tokens: int | None = None,
        ae_weight: float = 1.0,
        lm_weight: float = 0.0,
        lora: LoRASettings = LoRASettings(),
        optim: OptimSettings = _OPTIM,
        precision: PrecisionSettings = PrecisionSettings(),
        max_new_tokens: int | None = None,
        reconstruct_on_validation: bool = True,
        decoder_dtype: Dtype = "float32",
    ) -> None:
        super().__init__()
        self.save_hyperparameters(ignore=["tokenizer"])
        g = take_groups(self)  # each an instance or a dict (hparams), validated
        self.lora, self.optim, self.precision = g["lora"], g["optim"], g["precision"]
        check_compressor_settings(self.hparams, self.lora, self.precision)
        self.k = num_memory_tokens or memory_tokens(compression_rate, context_tokens)  # type: ignore[arg-type]
        self.automatic_optimization = False
        self.step_optimizer = OptimizerStep.from_settings(self.optim)
        self.frozen = FrozenModules("decoder")
        self.tokenizer = tokenizer
        self.compressor: MemoryCompressor | None = None
        self.decoder: Any = None

    @property
    def hp(self) -> Any:
        return self.hparams

    def setup(self, stage: str) -> None:
        if stage == "fit":  # the strategy is known and no weights are loaded yet
            check_trainable_precision(self.trainer, {"precision.dtype": self.precision.dtype})
            check_memory(self)  # the memory plan on CUDA (precision.memory_check)
        data = getattr(self.trainer, "datamodule", None)
        sources = {name: getattr(data, f"{name}_source", None) for name in ("train", "val", "test")}
        check_data_context(self.hp.context_tokens, self.k, self.hp.compression_rate, sources)

    def configure_model(self) -> None:
        strategy, to_build = begin_configure_model(
            self, self.compressor is not None, self.hp.decoder
        )
        if not to_build:
            return
        with transformers_zero3_context(strategy):
            decoder = freeze(load_causal_lm(self.hp.decoder, dtype=self.hp.decoder_dtype))
            dtype = self.precision.dtype
            lm = load_causal_lm(
                self.hp.compressor, dtype=dtype, num_layers=self.hp.compressor_layers
            )
        check_shared_vocabulary(
            self.tokenizer, [(self.hp.compressor, lm), (self.hp.decoder, decoder)]
        )
        self.decoder = decoder
        self.compressor = MemoryCompressor(
            lora_wrap(lm, self.lora),
            num_memory_tokens=self.k,
            decoder_width=int(decoder.config.hidden_size),
            marker_scale=_embedding_std(decoder),
            memory_scale=_embedding_std(lm),
        ).to(getattr(torch, dtype))
        shard_networks(strategy, self.compressor)  # FSDP2; the frozen decoder stays whole

    def configure_optimizers(self) -> Any:
        assert self.compressor is not None
        params = [p for p in self.compressor.parameters() if p.requires_grad]
        return self.step_optimizer.adamw(params)

    # ------------------------------------------------------------------ forward
    def compress(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Contexts [B, L] -> memory [B, k, d] in the decoder's dtype."""
        return self._compress(input_ids, attention_mask)[0]

    def _compress(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """(memory [B, k, d], markers [2, d]) in the decoder's dtype."""
        assert self.compressor is not None, "call configure_model() first"
        memory, markers = self.compressor(input_ids, attention_mask)
        return memory.to(self.decoder.dtype), markers.to(self.decoder.dtype)

    def losses(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        """Summed token losses and token counts of both tasks; the teacher-forced
        autoencoding logits and targets; the memory and the markers."""
        memory, markers = self._compress(batch["input_ids"], batch["attention_mask"])
        out: dict[str, Tensor] = {"memory": memory, "markers": markers}
        if self.hp.ae_weight > 0:
            pad, eos = int(self.tokenizer.pad_token_id), int(self.tokenizer.eos_token_id)
            ids, mask = autoencoding_targets(
                batch["input_ids"], batch["attention_mask"], pad_id=pad, eos_id=eos
            )
            logits = teacher_forced_logits(
                self.decoder, decoder_prefix(memory, markers[AE]), ids, mask
            )
            out["ae_sum"], out["ae_count"] = target_loss(logits, ids, mask)
            out.update(ae_logits=logits, ae_ids=ids, ae_mask=mask)
        if self.hp.lm_weight > 0:
            ids, mask = batch["continuation_ids"], batch["continuation_mask"]
            logits = teacher_forced_logits(
                self.decoder, decoder_prefix(memory, markers[LM]), ids, mask
            )
            out["lm_sum"], out["lm_count"] = target_loss(logits, ids, mask)
        return out

    # ----------------------------------------------------------------- training
    def training_step(self, batch: dict[str, Any], batch_idx: int) -> Tensor:
        rows = batch["input_ids"].shape[0]
        size = self.optim.micro_batch_size or rows  # null: the whole batch at once
        micro = [_slice(batch, i, i + size) for i in range(0, rows, size)]
        totals = self._token_totals(batch)
        parts: list[dict[str, Tensor]] = []

        def loss_fn(part: dict[str, Any]) -> Tensor:
            out = self.losses(part)
            loss = self._weighted(out, totals)  # non-finite: OptimizerStep skips the step
            parts.append({k: v.detach() for k, v in out.items() if k.endswith(("_sum", "_count"))})
            return loss

        stats = self.step_optimizer(self, self.optimizers(), micro, loss_fn)
        logged = {**self._mean_losses(parts, "train"), **stats}
        loss = logged.pop("train/loss")
        self.log_dict(logged, batch_size=rows, prog_bar=False)
        self.log("train/loss", loss, batch_size=rows, prog_bar=True)
        return loss

    def _token_totals(self, batch: dict[str, Any]) -> dict[str, Tensor]:
        totals = {"ae": batch["attention_mask"].sum() + batch["attention_mask"].shape[0]}
        if self.hp.lm_weight > 0:
            if "continuation_ids" not in batch or batch["continuation_ids"].shape[1] == 0:
                raise ValueError(
                    "lm_weight > 0 needs continuations, and no row of the batch has one. "
                    "Fix: give the TextChunks source continuation_tokens > 0, or set lm_weight: 0."
                )
            totals["lm"] = batch["continuation_mask"].sum().clamp(min=1)
        return totals

    def _weighted(self, out: dict[str, Tensor], totals: dict[str, Tensor]) -> Tensor:
        loss = out["memory"].new_zeros((), dtype=torch.float32)
        if "ae_sum" in out:
            loss = loss + self.hp.ae_weight * out["ae_sum"] / totals["ae"]
        if "lm_sum" in out:
            loss = loss + self.hp.lm_weight * out["lm_sum"] / totals["lm"]
        return loss

    def _mean_losses(self, parts: Sequence[dict[str, Tensor]], stage: str) -> dict[str, Tensor]:
        logged: dict[str, Tensor] = {}
        total = torch.zeros(())
        for task, weight in (("ae", self.hp.ae_weight), ("lm", self.hp.lm_weight)):
            if weight > 0:
                count = sum(float(p[f"{task}_count"]) for p in parts)
                mean = sum(p[f"{task}_sum"].cpu() for p in parts) / max(count, 1.0)
                logged[f"{stage}/{task}_loss"] = torch.as_tensor(mean)
                total = total + weight * torch.as_tensor(mean)
        logged[f"{stage}/loss"] = total
        return logged

    # --------------------------------------------------------------- evaluation
    def validation_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, "val")

    def test_step(self, batch: dict[str, Any], batch_idx: int) -> dict[str, Any]:
        return self._evaluate(batch, "test")

    def _evaluate(self, batch: dict[str, Any], stage: str) -> dict[str, Any]:
        out = self.losses(batch)
        parts = [{k: v for k, v in out.items() if k.endswith(("_sum", "_count"))}]
        rows = batch["input_ids"].shape[0]
        logged = self._mean_losses(parts, stage)
        if "ae_sum" in out and rows > 1:
            logged[f"{stage}/memory_gain"] = self.memory_gain(out)
        # on the module's device: NCCL cannot reduce CPU tensors
        logged = {k: v.to(self.device) for k, v in logged.items()}
        self.log_dict(logged, batch_size=rows, sync_dist=True)
        return self._evaluate_outputs(batch, out)

    def memory_gain(self, out: dict[str, Tensor]) -> Tensor:
        """Autoencoding loss per token with another context's memory (the batch rolled by one)
        minus with the context's own: how much context-specific information the memory
        carries (0: the decoder reconstructs a generic text from any memory)."""
        rolled = decoder_prefix(out["memory"].roll(1, dims=0), out["markers"][AE])
        logits = teacher_forced_logits(self.decoder, rolled, out["ae_ids"], out["ae_mask"])
        other, count = target_loss(logits, out["ae_ids"], out["ae_mask"])
        return ((other - out["ae_sum"]) / count.clamp(min=1)).detach()

    def _evaluate_outputs(self, batch: dict[str, Any], out: dict[str, Tensor]) -> dict[str, Any]:
        """What :class:`~lit_rlhf.callbacks.CompressionDiagnostics` reads (module docstring)."""
        result: dict[str, Any] = {"memory": out["memory"].detach()}
        if "ae_logits" in out:
            result.update(logits=out["ae_logits"].detach(), logits_mask=out["ae_mask"])
        if self.hp.reconstruct_on_validation:
            result["references"] = self.tokenizer.batch_decode(
                [
                    ids[mask].tolist()
                    for ids, mask in zip(batch["input_ids"], batch["attention_mask"], strict=True)
                ]
            )
            prefix = decoder_prefix(out["memory"], out["markers"][AE])
            result["reconstructions"] = self._generate(prefix, batch["attention_mask"])
        return result

    def _generate(self, prefix: Tensor, attention_mask: Tensor) -> list[str]:
        strategy: Any = self._trainer.strategy if self._trainer is not None else None
        # ZeRO-3: each decoder forward gathers weights from every rank, so all ranks decode alike
        lockstep = is_deepspeed(strategy) and strategy.zero_stage_3 and strategy.world_size > 1
        ids = generate_from_prefix(
            self.decoder,
            prefix,
            max_new_tokens=self.hp.max_new_tokens or int(attention_mask.sum(-1).max()) + 8,
            eos_token_id=int(self.tokenizer.eos_token_id),
            pad_token_id=int(self.tokenizer.pad_token_id),
            synced_gpus=lockstep,
        )
        return list(self.tokenizer.batch_decode(ids, skip_special_tokens=True))

    @torch.no_grad()
    def reconstruct(self, texts: Sequence[str], max_context_tokens: int = 512) -> list[str]:
        """Compress each text and decode it back (greedy), for probes and demos."""
        encoded = self.tokenizer(list(texts), add_special_tokens=False)["input_ids"]
        ids, mask = pad_ids(
            [x[:max_context_tokens] for x in encoded], int(self.tokenizer.pad_token_id), "left"
        )
        ids, mask = ids.to(self.device), mask.to(self.device)
        memory, markers = self._compress(ids, mask)
        return self._generate(decoder_prefix(memory, markers[AE]), mask)

    @torch.no_grad()
    def target_log_probs(
        self, contexts: Sequence[str], targets: Sequence[str], max_context_tokens: int = 512
    ) -> list[Tensor]:
        """Per context, the decoder's float32 log-probability of each token of ``targets[i]``
        (encoded without special tokens) read after the context's memory and the autoencoding
        marker, teacher-forced: how the reconstruction from memory scores a text, e.g. a fact's
        stem followed by the context's value or by a prior value (an overwrite margin)."""
        if len(contexts) != len(targets):
            raise ValueError(f"{len(contexts)} contexts but {len(targets)} targets")
        pad = int(self.tokenizer.pad_token_id)
        encoded = self.tokenizer(list(contexts), add_special_tokens=False)["input_ids"]
        ids, mask = pad_ids([x[:max_context_tokens] for x in encoded], pad, "left")
        memory, markers = self._compress(ids.to(self.device), mask.to(self.device))
        wanted = self.tokenizer(list(targets), add_special_tokens=False)["input_ids"]
        target_ids, target_mask = (t.to(self.device) for t in pad_ids(wanted, pad, "right"))
        prefix = decoder_prefix(memory, markers[AE])
        logits = teacher_forced_logits(self.decoder, prefix, target_ids, target_mask)
        logp = torch.log_softmax(logits.float(), dim=-1).gather(-1, target_ids[..., None])
        return [row[keep.bool()] for row, keep in zip(logp.squeeze(-1), target_mask, strict=True)]

    # -------------------------------------------------------------- checkpoints
    def configure_callbacks(self) -> list[Callback]:
        return module_callbacks()  # exact resumes, plain progress lines

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.frozen.drop(checkpoint)
        self.step_optimizer.save_to(checkpoint)  # skip counts, lr schedule counters

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        self.frozen.restore(self, checkpoint)
        # another compressor, decoder width, memory size or LoRA: an error naming both
        check_checkpoint_weights(self, checkpoint, settings=_NETWORK_SETTINGS)
        self.step_optimizer.load_from(checkpoint)


_NETWORK_SETTINGS = (
    "compressor",
    "compressor_layers",
    "decoder",
    "num_memory_tokens",
    "compression_rate",
    "context_tokens",
    "lora",
)


def _slice(batch: dict[str, Any], start: int, end: int) -> dict[str, Any]:
    return {k: v[start:end] for k, v in batch.items()}


def _embedding_std(model: Any) -> float:
    """The std of ``model``'s input embeddings (under ZeRO-3 gathered from every rank first)."""
    weight = model.get_input_embeddings().weight
    with gathered(weight):
        return float(weight.detach().float().std())
