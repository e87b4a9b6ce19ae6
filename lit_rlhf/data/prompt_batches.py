"""Prompt rendering and batch assembly: a question as a model's prompt (chat template, system
prompt, response prefix), rendered prompts tokenized into a left-padded batch, data rows collated
into the batch dict of :class:`~lit_rlhf.data.prompts.PromptDataModule`, and the padding they
share (also used by the SFT data module and the modules and rewards that write prompts of their
own). Re-exported by :mod:`lit_rlhf.data.prompts`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import torch
from torch import Tensor


def render_chat_prompt(
    tokenizer: Any,
    question: str,
    *,
    system_prompt: str | None = None,
    use_chat_template: bool = True,
    response_prefix: str = "",
    chat_template_kwargs: dict[str, Any] | None = None,
    question_suffix: str = "",
) -> str:
    """One question as a model's prompt: through the tokenizer's chat template (assistant turn
    opened, ``chat_template_kwargs`` passed on, e.g. Qwen3's ``enable_thinking``) when asked and
    the tokenizer has one, else the raw question after ``system_prompt`` and a blank line; then
    ``response_prefix``. ``question_suffix`` is appended to the question first (e.g. Qwen3's
    ``" /no_think"``). Shared by :class:`~lit_rlhf.data.prompts.PromptDataModule` and the modules
    and rewards that write prompts of their own (a judge's reflection prompts, a judge scoring a
    policy)."""
    question += question_suffix
    if not (use_chat_template and getattr(tokenizer, "chat_template", None)):
        text = f"{system_prompt}\n\n{question}" if system_prompt else question
        return text + response_prefix
    messages = [{"role": "system", "content": system_prompt}] if system_prompt else []
    messages.append({"role": "user", "content": question})
    rendered = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, **(chat_template_kwargs or {})
    )
    return str(rendered) + response_prefix


def tokenize_prompts(
    tokenizer: Any, prompts: Sequence[str], *, chat_rendered: bool, device: Any = None
) -> tuple[Tensor, Tensor]:
    """Rendered prompts as a left-padded ``(input_ids, attention_mask)`` batch, tokenized as
    :class:`~lit_rlhf.data.prompts.PromptDataModule` does: a chat-rendered prompt
    (``chat_rendered``) carries its own special tokens, a raw one gets the tokenizer's usual
    ones."""
    ids = tokenizer(list(prompts), add_special_tokens=not chat_rendered)["input_ids"]
    rows = [{"input_ids": x, "prompt": "", "query_id": "", "task": ""} for x in ids]
    batch = collate_prompts(rows, pad_token_id=tokenizer.pad_token_id)
    return batch["input_ids"].to(device), batch["attention_mask"].to(device)


def collate_prompts(rows: Sequence[dict[str, Any]], *, pad_token_id: int) -> dict[str, Any]:
    """Left-pad tokenized rows into a batch, and right-pad their ``continuation_ids`` if they
    have some (format in the docstring of :mod:`lit_rlhf.data.prompts`)."""
    input_ids, attention_mask = pad_ids([row["input_ids"] for row in rows], pad_token_id, "left")
    batch: dict[str, Any] = {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "prompt": [row["prompt"] for row in rows],
        "query_id": [row["query_id"] for row in rows],
        "task": [row["task"] for row in rows],
        "row": [{k: v for k, v in row.items() if k != "input_ids"} for row in rows],
    }
    if "continuation_ids" in rows[0]:  # None on a mixture's rows from other sources
        continuations = [row["continuation_ids"] or [] for row in rows]
        batch["continuation_ids"], batch["continuation_mask"] = pad_ids(
            continuations, pad_token_id, "right"
        )
    return batch


def pad_ids(
    sequences: Sequence[Sequence[int]], pad_token_id: int, side: Literal["left", "right"]
) -> tuple[Tensor, Tensor]:
    """Token id lists as a padded ``[b, max length]`` long tensor and its bool mask (True on
    real tokens), padded on ``side``."""
    length = max((len(ids) for ids in sequences), default=0)
    ids = torch.full((len(sequences), length), pad_token_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), length), dtype=torch.bool)
    for i, seq in enumerate(sequences):
        span = slice(length - len(seq), length) if side == "left" else slice(0, len(seq))
        ids[i, span] = torch.tensor(seq, dtype=torch.long)
        mask[i, span] = True
    return ids, mask
