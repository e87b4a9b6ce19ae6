"""Teacher-forced likelihoods of labelled tokens: a batch of ``input_ids``, ``attention_mask``
and ``labels`` (the token ids to score, ``ignore_index`` elsewhere: prompt, context, padding),
as :class:`~lit_rlhf.data.SFTDataModule` makes them. Shared by supervised fine-tuning (the
token-mean NLL) and DPO (each response's summed log-probability)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch.nn.functional as F
from torch import Tensor

IGNORE_INDEX = -100  # torch's cross-entropy ignore_index: the label of an unscored token


def response_token_nll(
    model: Any, batch: Mapping[str, Tensor], *, ignore_index: int = IGNORE_INDEX
) -> tuple[Tensor, Tensor, Tensor]:
    """Per predicted position ``[b, T-1]``: the negative log-likelihood of the next token (0 where
    it is not trained), whether it is trained, and whether the argmax predicts it."""
    logits = model(
        input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False
    ).logits[:, :-1]
    targets = batch["labels"][:, 1:]
    trained = targets != ignore_index
    nll = F.cross_entropy(
        logits.float().transpose(1, 2), targets, ignore_index=ignore_index, reduction="none"
    )
    hits = (logits.argmax(-1) == targets) & trained
    return nll, trained, hits


def response_log_probs(
    model: Any, batch: Mapping[str, Tensor], *, ignore_index: int = IGNORE_INDEX
) -> tuple[Tensor, Tensor]:
    """Per row ``[b]``: ``log p(response | prompt)``, the log-probs of its labelled tokens summed
    (float32), and how many tokens that is."""
    nll, trained, _ = response_token_nll(model, batch, ignore_index=ignore_index)
    return -nll.sum(-1), trained.sum(-1)
