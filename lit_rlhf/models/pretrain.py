"""Give a small causal LM a language: next-token training on plain texts, saved as a Hugging Face
folder. The compressor-decoder experiments need a decoder that already models the text (a random
frozen decoder cannot be steered into reconstructing anything) and compressors with priors of
their own; on a machine without a model hub the random ``builtin:`` networks get them here, in
seconds to a minute on CPU. Real runs use pretrained hub models instead.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from lit_rlhf.models.loading import resolve


def pretrain_on_texts(
    model: str,
    texts: Sequence[str],
    out_dir: str | Path,
    *,
    steps: int = 300,
    seq_len: int = 64,
    batch_size: int = 16,
    lr: float = 3e-3,
    copy_fraction: float = 0.0,
    seed: int = 0,
    device: str = "cpu",
) -> Path:
    """Train ``model`` (hub id, folder or ``builtin:``) on random ``seq_len``-token windows of
    the tokenized ``texts`` (each ending with EOS) with AdamW for ``steps`` steps; save model and
    tokenizer to ``out_dir`` and return it. Deterministic given ``seed`` on one CPU thread.

    ``copy_fraction`` of the rows are a half-length window written twice: the model learns to
    copy what it has seen (induction), which a decoder reading a compressed context relies on
    and which a large pretrained LM has but a small one trained briefly does not. ``device``:
    where to train (``"cuda"``: bf16 autocast); the saved weights are float32 either way."""
    if steps < 1 or seq_len < 4 or batch_size < 1 or not lr > 0 or not 0 <= copy_fraction <= 1:
        raise ValueError(
            f"need steps >= 1, seq_len >= 4, batch_size >= 1, lr > 0, 0 <= copy_fraction <= 1; "
            f"got {steps}, {seq_len}, {batch_size}, {lr}, {copy_fraction}"
        )
    tokenizer = AutoTokenizer.from_pretrained(resolve(model))
    stream: list[int] = []
    for text in texts:
        stream += tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    if len(stream) <= seq_len:
        raise ValueError(
            f"the texts hold {len(stream)} tokens, fewer than one window of seq_len={seq_len} + 1. "
            "Fix: give more text or lower seq_len."
        )
    torch.manual_seed(seed)
    network = AutoModelForCausalLM.from_pretrained(resolve(model), dtype=torch.float32)
    torch.nn.Module.to(network, torch.device(device)).train()  # transformers types .to oddly
    optimizer = torch.optim.AdamW(network.parameters(), lr=lr)
    tokens, rng = torch.tensor(stream), random.Random(seed)
    autocast = torch.autocast("cuda", torch.bfloat16, enabled=device.startswith("cuda"))
    for _ in range(steps):
        rows = [_row(tokens, seq_len, rng, copy_fraction) for _ in range(batch_size)]
        batch = torch.stack(rows).to(device)
        with autocast:
            loss = network(input_ids=batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(network.parameters(), 1.0)
        optimizer.step()
    out = Path(out_dir)
    network.cpu().save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def _row(
    tokens: torch.Tensor, seq_len: int, rng: random.Random, copy_fraction: float
) -> torch.Tensor:
    if rng.random() < copy_fraction:
        half = seq_len // 2
        start = rng.randrange(len(tokens) - half)
        return tokens[start : start + half].repeat(2)[:seq_len]
    start = rng.randrange(len(tokens) - seq_len)
    return tokens[start : start + seq_len]
