"""Sampling a judge N times per prompt, shared by the judge-data builders in ``scripts/data/``
(``build_reflectrm_data.py``, ``seed_consistrm_memory.py``; they put this folder on
``sys.path``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

INPUTS = ("input_ids", "attention_mask")


def sampled_texts(data: Any, model: Any, engine: Any, n: int) -> Iterator[tuple[Any, list[Any]]]:
    """Per batch of ``data``'s train loader: the batch and, per row, ``n`` sampled completions
    (decoded, special tokens dropped), generated on the model's device without gradients."""
    import torch

    device = next(model.parameters()).device
    for batch in data.train_dataloader():
        ids, mask = (
            batch[k].to(device).repeat_interleave(n, 0) for k in ("input_ids", "attention_mask")
        )
        with torch.no_grad():
            out = engine.generate(model, ids, mask, data.tokenizer, greedy=False, log_probs=False)
        texts = data.tokenizer.batch_decode(out.response_ids, skip_special_tokens=True)
        yield batch, [texts[b * n : (b + 1) * n] for b in range(len(batch["row"]))]
