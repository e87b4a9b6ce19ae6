"""Scoring (query, response) pairs with a scalar reward model (a sequence-classification model
with one output): the text it reads and the batched forward. Shared by
:class:`~lit_rlhf.modules.RewardModelModule` (training) and
:class:`~lit_rlhf.rewards.ScalarRMReward` (PPO rewards)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor


def conversation_text(tokenizer: Any, query: str, response: str, *, chat_template: bool) -> str:
    """The text a reward model scores: (query, response) through the tokenizer's chat template
    when asked and available, else ``query + "\\n\\n" + response``."""
    if chat_template and getattr(tokenizer, "chat_template", None):
        messages = [{"role": "user", "content": query}, {"role": "assistant", "content": response}]
        return str(tokenizer.apply_chat_template(messages, tokenize=False))
    return f"{query}\n\n{response}"


def score_texts(
    model: Any, tokenizer: Any, texts: Sequence[str], *, max_length: int, device: torch.device
) -> Tensor:
    """``[N]`` float rewards of ``texts`` in one forward (the caller picks grad or no_grad).
    Sequences longer than ``max_length`` tokens lose their start, so the response is kept."""
    side, tokenizer.truncation_side = tokenizer.truncation_side, "left"
    try:
        enc = tokenizer(
            list(texts),
            return_tensors="pt",
            padding=True,
            truncation=True,
            max_length=max_length,
            add_special_tokens=False,
        ).to(device)
    finally:
        tokenizer.truncation_side = side
    return model(**enc).logits[:, 0].float()
