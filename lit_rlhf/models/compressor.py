"""The memory-token compressor and the decoder side of a compressor-decoder (the "size-fidelity
paradox", arXiv 2602.09789; the architecture is ICAE's, arXiv 2307.06945).

A compressor LM reads a context followed by ``k`` learnable memory-token embeddings; its final
hidden states at those ``k`` positions are the memory, projected to the decoder's width when the
two differ. A frozen decoder LM reads the memory as a soft prompt (``inputs_embeds``), then a
learnable task marker, then the target text: the context itself (autoencoding) or the text that
follows it (continuation). Shapes: B batch, L context tokens, k memory tokens, T target tokens,
d_c / d decoder widths, V vocabulary.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn


class MemoryCompressor(nn.Module):
    """A causal LM plus ``k`` memory-token embeddings and the projection to the decoder.

    Args:
        lm: the compressor LM (any Hugging Face causal LM, optionally wrapped by peft).
        num_memory_tokens: ``k``.
        decoder_width: the decoder's hidden size (a linear projection when it differs from the
            compressor's, else the identity).
        num_markers: learnable decoder-side task markers (autoencoding, continuation).
        marker_scale: the markers' initial standard deviation (the decoder's embedding std).
        memory_scale: the memory embeddings' initial standard deviation; None: the std of
            ``lm``'s input embeddings (pass it under ZeRO-3, where that weight is a partition).
    """

    def __init__(
        self,
        lm: Any,
        *,
        num_memory_tokens: int,
        decoder_width: int,
        num_markers: int = 2,
        marker_scale: float = 0.02,
        memory_scale: float | None = None,
    ) -> None:
        super().__init__()
        if num_memory_tokens < 1:
            raise ValueError(f"num_memory_tokens must be >= 1, got {num_memory_tokens}")
        self.lm = lm
        width = int(lm.config.hidden_size)
        scale = memory_scale
        if scale is None:
            scale = float(lm.get_input_embeddings().weight.detach().float().std())
        generator = torch.Generator().manual_seed(0)
        self.memory = nn.Parameter(
            torch.randn(num_memory_tokens, width, generator=generator) * scale
        )
        self.projection: nn.Module = (
            nn.Linear(width, decoder_width) if width != decoder_width else nn.Identity()
        )
        markers = torch.randn(num_markers, decoder_width, generator=generator) * marker_scale
        self.markers = nn.Parameter(markers)

    @property
    def num_memory_tokens(self) -> int:
        return int(self.memory.shape[0])

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> tuple[Tensor, Tensor]:
        """``input_ids`` / ``attention_mask`` [B, L] (left- or right-padded; mask True = token)
        -> (memory [B, k, d] in the projection's dtype, a copy of the markers [num_markers, d]).

        The markers come out of ``forward`` because DeepSpeed ZeRO-3 makes a parameter whole only
        inside its own module's forward (and again for its backward): read as
        ``compressor.markers`` from outside, it is this rank's partition."""
        embed = self.lm.get_input_embeddings()
        tokens = embed(input_ids)
        batch, k = input_ids.shape[0], self.num_memory_tokens
        memory = self.memory.to(tokens.dtype).unsqueeze(0).expand(batch, -1, -1)
        mask = torch.cat([attention_mask.bool(), attention_mask.new_ones(batch, k).bool()], dim=1)
        # positions count real tokens only, so padding does not shift the memory's positions
        positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
        out = self.lm(
            inputs_embeds=torch.cat([tokens, memory], dim=1),
            attention_mask=mask.long(),
            position_ids=positions,
            output_hidden_states=True,
            logits_to_keep=1,  # the memory is a hidden state: skip the vocabulary projection
        )
        hidden = out.hidden_states[-1][:, -k:]
        weight = next(self.projection.parameters(), None)
        memory = self.projection(hidden.to(weight.dtype if weight is not None else hidden.dtype))
        return memory, self.markers.clone()


def right_padded(
    input_ids: Tensor, attention_mask: Tensor, *, pad_id: int
) -> tuple[Tensor, Tensor]:
    """Move each row's tokens to the left (right padding): ``[B, L]`` -> ``[B, L]`` ids, mask."""
    mask = attention_mask.bool()
    lengths = mask.sum(-1)
    out = torch.full_like(input_ids, pad_id)
    new_mask = torch.arange(input_ids.shape[1], device=input_ids.device) < lengths[:, None]
    out[new_mask] = input_ids[mask]
    return out, new_mask


def autoencoding_targets(
    input_ids: Tensor, attention_mask: Tensor, *, pad_id: int, eos_id: int
) -> tuple[Tensor, Tensor]:
    """The contexts [B, L], right-padded and each followed by EOS (so that generation learns
    where to stop): ids and mask [B, L + 1]."""
    ids, mask = right_padded(input_ids, attention_mask, pad_id=pad_id)
    ids = torch.cat([ids, ids.new_full((ids.shape[0], 1), pad_id)], dim=1)
    mask = torch.cat([mask, mask.new_zeros(mask.shape[0], 1)], dim=1)
    rows, lengths = torch.arange(ids.shape[0]), mask.sum(-1)
    ids[rows, lengths] = eos_id
    mask[rows, lengths] = True
    return ids, mask


def decoder_prefix(memory: Tensor, marker: Tensor) -> Tensor:
    """The decoder's soft prompt: memory [B, k, d] then the task marker [d] -> [B, k + 1, d]."""
    batch = memory.shape[0]
    return torch.cat([memory, marker.to(memory.dtype).expand(batch, 1, -1)], dim=1)


def teacher_forced_logits(
    decoder: Any, prefix: Tensor, target_ids: Tensor, target_mask: Tensor
) -> Tensor:
    """Logits [B, T, V] of the decoder predicting each right-padded target token [B, T] after
    the soft prompt ``prefix`` [B, P, d] (position ``P - 1 + t`` predicts target ``t``)."""
    embeds = decoder.get_input_embeddings()(target_ids).to(prefix.dtype)
    batch, length = prefix.shape[0], prefix.shape[1]
    mask = torch.cat([target_mask.new_ones(batch, length).bool(), target_mask.bool()], dim=1)
    out = decoder(inputs_embeds=torch.cat([prefix, embeds], dim=1), attention_mask=mask.long())
    return out.logits[:, length - 1 : length - 1 + target_ids.shape[1]]


def target_loss(logits: Tensor, target_ids: Tensor, target_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(summed cross-entropy over the counted target tokens, their number) in float32."""
    losses = nn.functional.cross_entropy(
        logits.float().flatten(0, 1), target_ids.flatten(), reduction="none"
    ).view_as(target_ids)
    mask = target_mask.bool()
    return losses[mask].sum(), mask.sum()


@torch.no_grad()
def generate_from_prefix(
    decoder: Any,
    prefix: Tensor,
    *,
    max_new_tokens: int,
    eos_token_id: int,
    pad_token_id: int,
    synced_gpus: bool = False,
) -> list[list[int]]:
    """Greedy generation after the soft prompt [B, P, d]; per row the tokens before EOS.
    ``synced_gpus``: every rank decodes until all ranks are done (needed under ZeRO-3, where
    each forward gathers the weights from every rank)."""
    batch = prefix.shape[0]
    out = decoder.generate(
        inputs_embeds=prefix,
        attention_mask=torch.ones(batch, prefix.shape[1], dtype=torch.long, device=prefix.device),
        max_new_tokens=max_new_tokens,
        do_sample=False,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        synced_gpus=synced_gpus,
    )
    rows: list[list[int]] = []
    for ids in out.tolist():
        rows.append(ids[: ids.index(eos_token_id)] if eos_token_id in ids else ids)
    return rows


def check_shared_vocabulary(tokenizer: Any, models: Sequence[tuple[str, Any]]) -> None:
    """Refuse a tokenizer with more tokens than a (name, model) embeds, or without EOS / pad.
    Reads the full embedding shape also of a ZeRO-3 partition (``ds_shape``)."""
    size = len(tokenizer)
    for name, model in models:
        weight = model.get_input_embeddings().weight
        rows = int(getattr(weight, "ds_shape", weight.shape)[0])
        if rows < size:
            raise ValueError(
                f"the tokenizer has {size} tokens but {name} embeds only {rows}: the compressor "
                "and the decoder must share one vocabulary. Fix: use the decoder's tokenizer "
                "(data.tokenizer) and a compressor of the same family."
            )
    if tokenizer.eos_token_id is None or tokenizer.pad_token_id is None:
        raise ValueError(
            "the tokenizer needs an EOS token (reconstructions end with it) and a pad token. "
            "Fix: use a tokenizer that defines both."
        )
