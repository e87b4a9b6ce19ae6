"""Generation with Hugging Face ``generate`` (the default engine; works on any device/strategy)."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from transformers import GenerationConfig, LogitsProcessor, LogitsProcessorList

from lit_rlhf.rollout.base import (
    call_budget,
    check_sampling_args,
    eval_mode,
    ranks_in_lockstep,
)
from lit_rlhf.types import GenerationOutput


class _RecordLogProbs(LogitsProcessor):
    """Records log pi(a_t | s_t) of each sampled token under the tempered, untruncated
    distribution (the one PPO's ratio uses), holding one [B, V] row of log-probs at a time.

    At step t it sees the raw logits for step t and the tokens chosen up to step t-1, so it gathers
    the previous step's choice from the previous step's log-probs; ``finish`` gathers the last.
    """

    def __init__(self, temperature: float, prompt_len: int) -> None:
        self.temperature = temperature
        self.prompt_len = prompt_len
        self.prev: Tensor | None = None
        self.chosen: list[Tensor] = []

    def _gather_prev(self, input_ids: Tensor) -> None:
        if self.prev is not None:
            token = input_ids[:, -1:]
            self.chosen.append(self.prev.gather(-1, token).squeeze(-1))

    def __call__(self, input_ids: Tensor, scores: Tensor) -> Tensor:
        self._gather_prev(input_ids)
        self.prev = torch.log_softmax(scores.float() / self.temperature, dim=-1)
        return scores

    def finish(self, sequences: Tensor) -> Tensor:
        if sequences.shape[1] > self.prompt_len + len(self.chosen):
            self._gather_prev(sequences)
        return torch.stack(self.chosen, dim=1) if self.chosen else sequences.new_zeros((0, 0))


class HFGenerationEngine:
    """Samples with ``model.generate`` and returns response ids, mask and per-token log-probs.

    Args:
        max_new_tokens: response length cap R.
        temperature: sampling temperature (> 0); the PPO module uses the same value.
        top_p: nucleus sampling mass; 1.0 disables it.
        top_k: top-k sampling; 0 disables it.
        use_cache: KV cache during decoding.
        synced_gpus: keep ranks in lock-step (needed under ZeRO-3 with several ranks);
            ``None`` turns it on when a process group with more than one rank is initialised.

    Log-probs are of the tempered distribution before top-k/top-p truncation, matching what the
    PPO update recomputes from ``logits / temperature``.
    """

    def __init__(
        self,
        max_new_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = 0,
        use_cache: bool = True,
        synced_gpus: bool | None = None,
    ) -> None:
        check_sampling_args(max_new_tokens, temperature, top_p, top_k)
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p
        self.top_k = top_k
        self.use_cache = use_cache
        self.synced_gpus = synced_gpus

    def _config(self, tokenizer: Any, greedy: bool, max_new_tokens: int) -> GenerationConfig:
        # A fresh config: a checkpoint's generation_config (repetition penalty, its own sampling
        # defaults) must not silently change the sampling distribution.
        return GenerationConfig(
            max_new_tokens=max_new_tokens,
            do_sample=not greedy,
            temperature=None if greedy else self.temperature,
            top_p=None if greedy or self.top_p >= 1.0 else self.top_p,
            top_k=None if greedy or self.top_k <= 0 else self.top_k,
            pad_token_id=tokenizer.pad_token_id,
            eos_token_id=tokenizer.eos_token_id,
            use_cache=self.use_cache,
        )

    @torch.no_grad()
    def generate(
        self,
        model: nn.Module,
        input_ids: Tensor,
        attention_mask: Tensor,
        tokenizer: Any,
        *,
        greedy: bool = False,
        log_probs: bool = True,
        max_new_tokens: int | None = None,
    ) -> GenerationOutput:
        prompt_len = input_ids.shape[1]
        budget = call_budget(self.max_new_tokens, max_new_tokens)
        recorder = _RecordLogProbs(1.0 if greedy else self.temperature, prompt_len)
        with eval_mode(model):
            sequences = model.generate(  # type: ignore[operator]
                input_ids=input_ids,
                attention_mask=attention_mask.long(),
                generation_config=self._config(tokenizer, greedy, budget),
                logits_processor=LogitsProcessorList([recorder] if log_probs else []),
                synced_gpus=ranks_in_lockstep(self.synced_gpus),
            )
        response_ids = sequences[:, prompt_len:]
        mask = response_mask_from_eos(response_ids, tokenizer.eos_token_id)
        chosen = recorder.finish(sequences)[:, : response_ids.shape[1]] if log_probs else None
        return finish_output(response_ids, mask, chosen, tokenizer.pad_token_id)

    def sync_weights(self, model: nn.Module) -> None:
        """Nothing to do: generation runs on the training weights themselves."""


def finish_output(
    response_ids: Tensor, response_mask: Tensor, log_probs: Tensor | None, pad_id: int
) -> GenerationOutput:
    """The engines' common ending: pad after EOS, zero the log-probs there (if computed)."""
    return GenerationOutput(
        response_ids.masked_fill(~response_mask, pad_id),
        response_mask,
        None if log_probs is None else log_probs.masked_fill(~response_mask, 0.0),
    )


def response_mask_from_eos(response_ids: Tensor, eos_token_id: int | list[int] | None) -> Tensor:
    """[B, R] bool: True up to and including the first EOS (all True if none)."""
    if eos_token_id is None:
        return torch.ones_like(response_ids, dtype=torch.bool)
    eos_ids = torch.as_tensor(eos_token_id, device=response_ids.device).reshape(-1)
    is_eos = torch.isin(response_ids, eos_ids)
    # tokens strictly after the first EOS have a positive count of earlier EOS tokens
    after_eos = (is_eos.long().cumsum(dim=1) - is_eos.long()) > 0
    return ~after_eos
